"""The verification service: math answers scored symbolically, code run in a sandbox.

Nothing in this package imports torch: it deploys on CPU-only pods.
"""

from verifier.items import Item, Limits, Outcome, Result, Status, VerifierError

__all__ = ["Item", "Limits", "Outcome", "Result", "Status", "VerifierError"]
