"""The MAGIC update (Skywork-OR1 §3): its rules as small pure functions (``rules``), their
config (``config``), the adaptive entropy controller, the stage schedule, the online and
offline filters, and a one-screen reference step (``reference_step``, read it first)."""
