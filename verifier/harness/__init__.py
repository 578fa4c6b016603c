"""Files that run INSIDE the sandbox: the judge's harness.

Its source is six modules with one job each: ``codec`` (the plain-data value codec),
``framing`` (messages and the authenticated record stream), ``control`` (process control in the
jail), ``lcb_runner`` (the lcb profile's LiveCodeBench semantics), ``checker`` (a ground truth's
checker program judging a sample's outputs, in a jail of its own) and ``runners`` (the three
test runners and ``main``). ``harness.py`` is generated from them
(``python -m verifier.harness.build``) and shipped into each sandbox as one file: it is not
imported there as part of this package. The judge imports ``codec`` and ``framing`` for their
pure helpers (``encode_message``/``decode_message``, the framing constants).
"""

from importlib import resources


def harness_source() -> bytes:
    """The bytes of harness.py, as shipped into the sandbox."""
    return resources.files(__name__).joinpath("harness.py").read_bytes()
