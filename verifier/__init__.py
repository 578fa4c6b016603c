"""The verification service: math answers scored symbolically, code run in a sandbox.

Nothing in this package imports torch or the trainer: it deploys on CPU-only pods. The layers
are ``sandbox <- verifier <- trainer`` (tests/test_layers.py enforces them).

The public surface: what code outside the verifier (the trainer, integrations) may import.

- ``verifier`` (this package): ``Item``, ``Limits``, ``Outcome``, ``Result``, ``Status``,
  ``VerifierError``
- ``verifier.client``: ``VerifierClient`` (sync), ``AsyncVerifierClient``, ``ClientConfig``
- ``verifier.client.config``: ``ClientConfig`` (also re-exported by ``verifier.client``)
- ``verifier.client.fleet``: many replicas behind one client (address parsing)
- ``verifier.items``: the item/result/status types and ``NOT_A_VERDICT``
- ``verifier.data.problems``: problem rows and the files they are read from
- ``verifier.data.ground_truth``: the code ground-truth format, parsed (pure; no sandbox)
- ``verifier.data.lcb``: LiveCodeBench's rows, prompts and release windows
- ``verifier.eval.evaluate``: the evaluation metrics and reports
- ``verifier.client.local``: starting a local verifier
- ``verifier.logs``: the shared logging set-up

Everything else (the scorers, the pools, the harness, the server, the CLI) is internal.
"""

from verifier.items import Item, Limits, Outcome, Result, Status, VerifierError

__all__ = ["Item", "Limits", "Outcome", "Result", "Status", "VerifierError"]
