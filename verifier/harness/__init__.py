"""Files that run INSIDE the sandbox. ``harness.py`` is shipped into each sandbox as a file (it
is not imported there as part of this package); the judge imports it only for its pure helpers
(``encode``/``decode``, framing constants)."""

from importlib import resources


def harness_source() -> bytes:
    """The bytes of harness.py, as shipped into the sandbox."""
    return resources.files(__name__).joinpath("harness.py").read_bytes()
