"""The harness as shipped into the jail: its bytecode, compiled once per sandbox by the
sandbox's own interpreter (compiling the source costs ~7 ms per run; loading bytecode ~0.1 ms),
or its source when that fails. The cache is per sandbox object and lives as long as it does.
"""

from __future__ import annotations

import threading
import weakref

from sandbox import Sandbox, SandboxLimits
from verifier.harness import harness_source

HARNESS_FILE = "judge_harness.py"
PYTHON_FLAGS = ("-I", "-S")  # isolated, no site (2 ms); the harness defines exit()/quit() itself

HARNESS_PYC = "judge_harness.pyc"
# Guards the two caches below; held only to read or write them, never while calling anything
# that takes it again (a plain Lock: re-entering it would block the thread forever).
_harness_lock = threading.Lock()
_harness_bytes: bytes | None = None
# Per sandbox object (weak: a sandbox that is gone takes its entry with it, so a new sandbox at
# the same address never sees it): the compiled harness, or None when compiling failed.
_pyc_cache: weakref.WeakKeyDictionary[Sandbox, bytes | None] = weakref.WeakKeyDictionary()
_NOT_CACHED = object()

_COMPILE_IN_SANDBOX = (
    "import marshal, sys\n"
    "from importlib._bootstrap_external import MAGIC_NUMBER\n"
    "code = compile(open('judge_harness.py', 'rb').read(), 'judge_harness.py', 'exec')\n"
    "sys.stdout.buffer.write(MAGIC_NUMBER + bytes(12) + marshal.dumps(code))\n"
)


def _harness() -> bytes:
    global _harness_bytes
    with _harness_lock:
        if _harness_bytes is None:
            _harness_bytes = harness_source()
        return _harness_bytes


def _files(pyc: bytes | None) -> tuple[dict[str, bytes], str]:
    return ({HARNESS_PYC: pyc}, HARNESS_PYC) if pyc else ({HARNESS_FILE: _harness()}, HARNESS_FILE)


def harness_files(sandbox: Sandbox) -> tuple[dict[str, bytes], str]:
    """The harness as bytecode compiled once by the sandbox's own interpreter (compiling the
    source costs ~7 ms per run; loading bytecode ~0.1 ms), or as source when that fails."""
    with _harness_lock:
        cached = _pyc_cache.get(sandbox, _NOT_CACHED)
    if cached is not _NOT_CACHED:
        return _files(cached)
    pyc = None
    try:
        r = sandbox.run(
            [sandbox.python, *PYTHON_FLAGS, "-c", _COMPILE_IN_SANDBOX],
            files={HARNESS_FILE: _harness()},
            limits=SandboxLimits(wall_s=30, cpu_s=20),
        )
        if r.status == "ok" and r.exit_code == 0 and len(r.stdout) > 16:
            pyc = r.stdout
    except Exception:
        pyc = None
    with _harness_lock:
        _pyc_cache[sandbox] = pyc
    return _files(pyc)
