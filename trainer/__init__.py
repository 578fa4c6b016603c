"""MAGIC trainer (Skywork-OR1, arXiv 2505.22312): algorithm, rollout, training loop, CLI.

Deliberately empty: importing ``trainer`` must stay cheap (no torch), because the package also
hosts the ``trainer`` command line. Import what you need from the submodules, e.g.
``from trainer.magic.rules import group_advantages, policy_loss``.
"""
