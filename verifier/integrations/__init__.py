"""The verifier as a reward function for other RL trainers.

- ``verifier.integrations.trl``: ``VerifierReward``, a reward function for TRL's
  ``GRPOTrainer`` (and its other online trainers that take ``reward_funcs``).
- ``verifier.integrations.verl``: ``compute_score`` / ``compute_score_batch``, custom reward
  functions for verl's reward managers (``custom_reward_function.path`` / ``name``).

Both score through ``verifier.client.VerifierClient`` (fleet addresses, failover, retries and
deadlines), reuse one client per process and address, and never turn a response the verifier
could not judge (INVALID_INPUT, SANDBOX_ERROR, INTERNAL_ERROR) into a reward of 0. Neither
imports TRL, verl or torch: the verifier package stays installable without them.
"""
