"""``trainer ablate``: the report's ablations as designs (``designs``), their
pre-registration, the runner, the statistics and the report."""
