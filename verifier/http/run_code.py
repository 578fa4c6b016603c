"""SandboxFusion's ``POST /run_code`` for ``language: python``: one program run once in the
verifier's sandbox, answered in SandboxFusion's schema.

The schema and the status rules are SandboxFusion's, as its public source describes them
(bytedance/SandboxFusion at commit 469de0845cb7d665bc68044d541aa3aa28c5b30a):

- ``sandbox/server/sandbox_api.py``: the request ``RunCodeRequest`` (``code``, ``language``,
  ``compile_timeout`` 10, ``run_timeout`` 10, ``memory_limit_MB`` -1, ``stdin`` None, ``files``
  {path: base64 text or None}, ``fetch_files`` []), the answer ``RunCodeResponse`` (``status``,
  ``message``, ``compile_result``, ``run_result``, ``executor_pod_name``, ``files``), its
  ``RunStatus`` (Success, Failed, SandboxError) and ``parse_run_status``: SandboxError when a
  command could not be run, Failed on a time limit or a non-zero return code, else Success;
- ``sandbox/runners/types.py``: ``CommandRunResult`` (``status``, ``execution_time``,
  ``return_code``, ``stdout``, ``stderr``) and ``CommandRunStatus`` (Finished, Error,
  TimeLimitExceeded);
- ``sandbox/runners/major.py`` (``run_python``) and ``sandbox/runners/base.py``
  (``run_command_bare``): the program is a ``.py`` file run with ``python`` in a fresh
  directory that also holds the request's files, stdin written and closed, ``run_timeout``
  seconds of wall clock; a process killed by a signal has the negative return code asyncio
  reports.

What is ours: the rules below are written here from that description (no code of theirs). The
program runs in this verifier's sandbox (nsjail by default) under the same per-item bounds as
code items (``--max-timeout-s``, ``--max-memory-mb``), one jail per request: a bootstrap
(``BOOTSTRAP``, run with ``-I -S``) reads the program and the files from the front of stdin,
writes them into the jail's scratch directory (its working directory) and replaces itself with
``python <program>`` reading the rest of stdin, so the program sees SandboxFusion's layout.
Nothing of a request is written on the host. Runs take the code items' jail slots
(``Scorer.submit_run``: ``--code-concurrency`` bounds both together); a replica out of file
descriptors fails the request (503), never the run (verifier/service/descriptors.py).

Differences, by design: only ``python`` (every other language is refused with 400, naming
it); ``fetch_files`` must be empty (the jail's files are gone when it ends); output is cut at
``OUTPUT_BYTES`` per stream (the run then stops, status Failed) and undecodable bytes become
U+FFFD; a memory or output limit reads as a process killed by SIGKILL (return code -9) with the
reason in ``message``.
"""

from __future__ import annotations

import base64
import binascii
import logging
import marshal
import math
from collections.abc import Callable
from concurrent import futures as cf
from dataclasses import dataclass, field
from typing import Any

from sandbox import RunResult, Sandbox, SandboxLimits
from verifier.service.descriptors import run_jail
from verifier.items import VerifierError

log = logging.getLogger(__name__)

LANGUAGE = "python"
DEFAULT_TIMEOUT_S = 10.0
"""SandboxFusion's default ``run_timeout`` (and ``compile_timeout``), seconds."""
DEFAULT_MEMORY_MB = 1024
"""The memory limit of a request that sets none (``memory_limit_MB`` <= 0, SandboxFusion's
"no limit"): the code items' default program limit."""
MIN_MEMORY_MB = 32
"""The smallest memory limit accepted: below it the interpreter itself cannot start (see
verifier/scoring/code_score.py MIN_MEMORY_MB)."""
OUTPUT_BYTES = 8 * 1024 * 1024
"""Captured stdout and stderr, each; more stops the run (status Failed)."""
MAX_FILES_BYTES = 32 * 1024 * 1024
"""The decoded ``files`` of one request, all together (they live in the jail's scratch tmpfs)."""
SCRATCH_MB = 64
"""The jail's scratch directory besides the request's files, MiB."""
MAX_PATH_CHARS = 1024
KILLED_RETURN_CODE = -9
"""The return code reported for a process the sandbox killed for memory or output."""

# Runs inside the jail (``python -I -S -c BOOTSTRAP``): stdin starts with an 8-byte big-endian
# length and a marshal of {"files": [(path, bytes)], "main": path, "python": exe, "path": str};
# the program's own stdin follows. It reads exactly its header with os.read (no buffering past
# it), writes the files relative to its working directory (the jail's scratch), and execs the
# interpreter on the program, which inherits the rest of stdin.
BOOTSTRAP = """\
import marshal, os, sys
def _read(n):
    b = bytearray()
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            sys.stderr.write("run_code bootstrap: the request ended early\\n")
            os._exit(125)
        b += c
    return bytes(b)
spec = marshal.loads(_read(int.from_bytes(_read(8), "big")))
for name, data in spec["files"]:
    d = os.path.dirname(name)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(name, "wb") as f:
        f.write(data)
env = dict(os.environ)
if spec["path"]:
    env["PYTHONPATH"] = spec["path"]
main = os.path.abspath(spec["main"])
os.execve(spec["python"], [spec["python"], main], env)
"""


@dataclass
class RunRequest:
    """One validated ``/run_code`` request."""

    code: str
    stdin: bytes = b""
    run_timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    files: list[tuple[str, bytes]] = field(default_factory=list)


def _bad(message: str) -> VerifierError:
    return VerifierError(message, "invalid_argument")


def _number(body: dict, key: str, default: float) -> float:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(f"'{key}' must be a number of seconds, got {v!r}"[:200])
    return float(v)


def _file_path(name: Any) -> str:
    """A file's path relative to the program's directory: no absolute paths, no '.' or '..'
    parts, no NUL (the file is written inside the jail, but a path must mean what it says)."""
    if not isinstance(name, str) or not name or len(name) > MAX_PATH_CHARS or "\0" in name:
        raise _bad(f"file path {name!r} is not a relative path"[:200])
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise _bad(f"file path {name!r} must be relative, without '.' or '..' parts"[:200])
    return name


def parse_run_code(body: Any, max_timeout_s: float, max_memory_mb: int) -> RunRequest:
    """The request, validated; VerifierError("invalid_argument") names the first problem.
    ``max_timeout_s`` and ``max_memory_mb`` are the server's per-item maximums."""
    if not isinstance(body, dict):
        raise _bad(f"the request must be a JSON object, got {type(body).__name__}")
    language = body.get("language")
    if language != LANGUAGE:
        raise _bad(f"language {language!r} is not supported: this verifier runs only "
                   f"{LANGUAGE!r} programs"[:300])
    code = body.get("code")
    if not isinstance(code, str):
        raise _bad(f"'code' must be a string, got {type(code).__name__}")
    stdin = body.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise _bad(f"'stdin' must be a string or null, got {type(stdin).__name__}")
    _number(body, "compile_timeout", DEFAULT_TIMEOUT_S)  # no compile step for python
    run_timeout = _number(body, "run_timeout", DEFAULT_TIMEOUT_S)
    if not 0 < run_timeout <= max_timeout_s:
        raise _bad(f"'run_timeout' must be > 0 and at most this server's maximum of "
                   f"{max_timeout_s:g} s, got {run_timeout:g}")
    memory = body.get("memory_limit_MB", -1)
    if memory is None:
        memory = -1
    if isinstance(memory, bool) or not isinstance(memory, int):
        raise _bad(f"'memory_limit_MB' must be an integer, got {memory!r}"[:200])
    if memory <= 0:
        memory = min(DEFAULT_MEMORY_MB, max_memory_mb)
    elif not MIN_MEMORY_MB <= memory <= max_memory_mb:
        raise _bad(f"'memory_limit_MB' must be between {MIN_MEMORY_MB} and this server's "
                   f"maximum of {max_memory_mb}, got {memory}")
    fetch = body.get("fetch_files") or []
    if not isinstance(fetch, list) or fetch:
        raise _bad("'fetch_files' is not supported (the jail's files are gone when the "
                   "program ends); send an empty list")
    files_obj = body.get("files") or {}
    if not isinstance(files_obj, dict):
        raise _bad(f"'files' must be an object of path: base64 content, got "
                   f"{type(files_obj).__name__}")
    files: list[tuple[str, bytes]] = []
    total = 0
    for name, content in files_obj.items():
        path = _file_path(name)
        if content is None:  # SandboxFusion skips these
            continue
        if not isinstance(content, str):
            raise _bad(f"files[{name!r}] must be base64 text, got {type(content).__name__}"[:200])
        try:
            data = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError) as e:
            raise _bad(f"files[{name!r}] is not valid base64: {e}"[:200]) from None
        total += len(data)
        if total > MAX_FILES_BYTES:
            raise VerifierError(f"'files' hold more than {MAX_FILES_BYTES >> 20} MiB",
                                "payload_too_large")
        files.append((path, data))
    return RunRequest(code=code, stdin=(stdin or "").encode("utf-8", "surrogatepass"),
                      run_timeout_s=run_timeout, memory_mb=memory, files=files)


def _main_name(files: list[tuple[str, bytes]]) -> str:
    taken = {name for name, _ in files}
    name, n = "main.py", 0
    while name in taken:
        n += 1
        name = f"main_{n}.py"
    return name


def run_program(sandbox: Sandbox, req: RunRequest) -> RunResult:
    """Run ``req`` once in ``sandbox`` (blocking). Raises only VerifierError("unavailable"),
    when the replica is out of descriptors."""
    main = _main_name(req.files)
    spec = {"files": [*req.files, (main, req.code.encode("utf-8", "surrogatepass"))],
            "main": main, "python": sandbox.python,
            "path": sandbox.packages_path or ""}
    header = marshal.dumps(spec, 4)
    files_mb = sum(len(d) for _, d in req.files) >> 20
    limits = SandboxLimits(wall_s=req.run_timeout_s, cpu_s=req.run_timeout_s,
                           memory_mb=req.memory_mb, output_bytes=OUTPUT_BYTES,
                           scratch_mb=SCRATCH_MB + files_mb + 1)
    stdin = len(header).to_bytes(8, "big") + header + req.stdin
    try:
        # A jail that cannot start for want of descriptors is tried again, then the request's
        # 503 (verifier/service/descriptors.py): the replica's state, never the run's SandboxError.
        return run_jail(lambda: sandbox.run([sandbox.python, "-I", "-S", "-c", BOOTSTRAP],
                                            stdin=stdin, limits=limits))
    except VerifierError:
        raise
    except Exception as e:  # noqa: BLE001 - a sandbox bug is this run's SandboxError
        log.exception("run_code: the sandbox failed")
        return RunResult("error", detail=f"sandbox {sandbox.name} failed: {type(e).__name__}: {e}")


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def run_code_response(run: RunResult) -> dict[str, Any]:
    """SandboxFusion's ``RunCodeResponse`` for one run (module docstring)."""
    result: dict[str, Any] = {"status": "Finished", "execution_time": round(run.wall_s, 6),
                              "return_code": None, "stdout": _text(run.stdout),
                              "stderr": _text(run.stderr)}
    message = ""
    if run.status == "error" or run.status == "stopped":
        status, message = "SandboxError", run.detail or "the sandbox failed"
        result.update(status="Error", stderr=message)
    elif run.status == "timeout":
        status, result["status"], message = "Failed", "TimeLimitExceeded", run.detail
    elif run.status == "ok" and run.exit_code is not None:
        result["return_code"] = run.exit_code
        status = "Success" if run.exit_code == 0 else "Failed"
    elif run.status == "signal" and run.signal:
        result["return_code"] = -run.signal
        status, message = "Failed", run.detail
    else:  # memory, output_limit: the sandbox killed it
        result["return_code"] = KILLED_RETURN_CODE
        status, message = "Failed", run.detail or run.status
    return {"status": status, "message": message, "compile_result": None,
            "run_result": result, "executor_pod_name": None, "files": {}}


class CodeRunner:
    """Runs ``/run_code`` requests, each in one jail of ``sandbox``, through ``submit``
    (``Scorer.submit_run``): in the replica's one set of jail slots, beside the code items, so
    ``--code-concurrency`` bounds every jail the replica runs; its queue bound refuses a run
    with VerifierError("resource_exhausted") (429). With no sandbox every run is a SandboxError
    naming ``sandbox_problem`` (never an unsandboxed run)."""

    def __init__(self, sandbox: Sandbox | None, sandbox_problem: str | None,
                 submit: Callable[..., cf.Future]):
        self.sandbox = sandbox
        self.sandbox_problem = sandbox_problem
        self._submit = submit

    def submit(self, req: RunRequest) -> cf.Future:
        """A future of the RunResult (it fails with VerifierError("unavailable") when the
        replica is out of descriptors: ``run_program``)."""
        if self.sandbox is None:
            fut: cf.Future = cf.Future()
            fut.set_result(RunResult("error", detail=f"no sandbox: {self.sandbox_problem}"))
            return fut
        return self._submit(run_program, self.sandbox, req)
