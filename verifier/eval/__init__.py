"""``verifier eval``: avg@k / pass@k reports over problems and generations, and
``--explain`` (where two judging profiles disagree)."""
