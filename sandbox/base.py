"""The one small interface every sandbox backend implements, and the helpers they share (the
process plumbing is sandbox/process.py; reading the policy file, sandbox/policy_reader.py).

A backend runs ``argv`` with some bytes on stdin, a few read-only input files in its private
scratch directory, and limits; it returns a :class:`RunResult` (exit status, signal, bounded
stdout/stderr, wall and CPU time, peak memory and a coarse status). Nothing here knows about
test cases or verdicts: that is ``verifier/scoring/code_score.py`` and the in-sandbox harness.

Every process started here has a wall deadline enforced from the outside (the caller never
hangs), captured output is bounded while it is read (a flood is cut off, never buffered), and
the process and everything it started are killed and reaped before ``run`` returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "CLOSED",
    "JailCapacity",
    "JailStarts",
    "MemoryAccounting",
    "RunResult",
    "Sandbox",
    "SandboxLimits",
    "SandboxUnavailable",
    "StdoutHook",
    "check_file_name",
]

RunStatus = Literal["ok", "timeout", "memory", "output_limit", "signal", "stopped", "error"]

StdoutHook = Callable[[bytes], bool]
"""Called with each chunk of the program's stdout as it arrives; return False to stop the run
(the process tree is killed and the result's status is "stopped"). While a hook is given the
stdout is *streamed* to it and not kept in ``RunResult.stdout``; ``output_bytes`` still caps the
total streamed."""

JAIL_CPU_MS_PER_SEC = 1000
"""CPU a jail may use, milliseconds per second of wall time, all its processes together (cgroup
cpu controller, where the host has one): one core. A single-threaded program (every judged
program) never needs more; a fork bomb's 32 spinning processes then share that one core, and
the verifier's own threads (health checks, gRPC, math workers) keep the others."""


CLOSED = "cancelled: the sandbox was closed"
"""``RunResult.detail`` of a run that ``close()`` killed, or that was asked for after it."""


class SandboxUnavailable(Exception):
    """The sandbox cannot run programs here; the message says why (from the self-test)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. Defaults suit one sample of a competitive-programming problem.

    The only source of every per-run limit: each backend puts them on its own command line or
    container config (nsjail: ``--time_limit``, ``--rlimit_as/cpu/fsize/nproc``, the scratch
    tmpfs, the cgroup limits), never in the policy file, which states only the fixed rlimits
    (``policy_reader.policy_rlimits``).

    - ``wall_s``: wall-clock deadline of the whole run (enforced by the caller, and by the
      backend as a backstop).
    - ``cpu_s``: CPU seconds per process (RLIMIT_CPU).
    - ``memory_mb``: address space per process (RLIMIT_AS) and, where cgroups are usable, the
      memory of the whole sandbox (plus ``scratch_mb``, whose tmpfs pages count as memory).
    - ``max_procs``: processes/threads in the sandbox (cgroup pids.max, else RLIMIT_NPROC).
    - ``file_size_mb``: largest file a process may write (RLIMIT_FSIZE).
    - ``scratch_mb``: size of the private writable scratch directory (tmpfs at /tmp).
    - ``scratch_files``: files and directories the scratch may hold (its inodes): each costs
      kernel memory that the size cap does not count (767,000 empty files in 64 MiB took
      about 1.3 GB).
    - ``output_bytes``: stdout and stderr are each cut off (and the run stopped with status
      "output_limit") beyond this many bytes.
    """

    wall_s: float = 10.0
    cpu_s: float = 10.0
    memory_mb: int = 1024
    max_procs: int = 32
    file_size_mb: int = 16
    scratch_mb: int = 64
    scratch_files: int = 4096
    output_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 or v != v:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {v!r}")
        for name in (
            "memory_mb", "max_procs", "file_size_mb", "scratch_mb", "scratch_files", "output_bytes"
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive integer, got {v!r}")

    def replace(self, **changes) -> SandboxLimits:
        return replace(self, **changes)


@dataclass
class RunResult:
    """What one run produced.

    ``status``: "ok" (the process exited by itself, any exit code), "timeout" (wall or CPU
    limit), "memory" (killed by the memory limit), "output_limit", "signal" (killed by a
    signal), "stopped" (the stdout hook asked to stop), "error" (the sandbox itself failed:
    ``detail`` says why; nothing of the program ran or its result is unknown).
    """

    status: RunStatus
    exit_code: int | None = None
    signal: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_memory_mb: float | None = None
    detail: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False


MemoryAccounting = Literal["jail", "process"]
"""How a sandbox bounds a program's memory (``Sandbox.memory_accounting``). "jail": the whole
jail's memory (a cgroup or a container's limit), so a SIGKILL that nobody outside sent is that
limit's OOM kill, and the judge may call it "memory"; "process": each process's address space
only (RLIMIT_AS), so a SIGKILL is just a signal (the judge must not guess "memory")."""


@dataclass(frozen=True)
class JailCapacity:
    """How many jails a sandbox can run at once (``Sandbox.capacity``)."""

    jails: int | None = None
    """Jails at once, its pre-started ones included; None: no bound of its own."""
    waiting: int = 0
    """How many of ``jails`` its pre-started jails may hold while they wait for their samples."""
    waiting_note: str = ""
    """Those waiting jails in words, for messages ("2 pre-started jails for each of ...")."""
    bound: str = ""
    """What bounds ``jails``, and how to raise it, for messages."""

    def shortfall(self, runs: int) -> str | None:
        """Why ``runs`` jails at once, besides the waiting ones, do not fit ("3 exceeds the
        ..."); None when they do."""
        if self.jails is None or runs + self.waiting <= self.jails:
            return None
        plus = f" plus {self.waiting_note}" if self.waiting else ""
        return f"{runs}{plus} exceeds {self.bound}"


@dataclass(frozen=True)
class JailStarts:
    """How a sandbox starts its jails (``Sandbox.starts``; chosen by ``sandbox.plan_jails``):
    the judge's harness forked from a zygote (``forkserver``, sandbox/forkserver.py), or
    ``warm_per_key`` jails pre-started per jail command (sandbox/warm.py), else each jail when
    its run arrives (both zero: a cold start per run)."""

    forkserver: bool = False
    warm_per_key: int = 0


@runtime_checkable
class Sandbox(Protocol):
    """A place to run untrusted programs. Implementations: nsjail (default), docker,
    unsafe-none (development only, no isolation)."""

    name: str
    python: str
    """Path of a Python 3 interpreter *inside* the sandbox (the judge's harness runs on it)."""
    isolated: bool
    """True when programs cannot see the host or each other (False only for unsafe-none)."""
    packages_path: str | None
    """Where the extra importable packages (numpy) are inside the sandbox; None: none there."""

    @property
    def memory_accounting(self) -> MemoryAccounting:
        """What bounds a program's memory here (valid once the self-test has run)."""
        ...

    @property
    def capacity(self) -> JailCapacity:
        """How many jails it can run at once."""
        ...

    @property
    def starts(self) -> JailStarts:
        """How it starts its jails (what ``create_sandbox`` chose for it)."""
        ...

    def run(
        self,
        argv: list[str],
        *,
        stdin: bytes = b"",
        files: Mapping[str, bytes] = {},
        limits: SandboxLimits | None = None,
        on_stdout: StdoutHook | None = None,
    ) -> RunResult: ...

    def self_test(self) -> None:
        """Raise SandboxUnavailable with the reason if programs cannot be run safely."""
        ...

    def describe(self) -> str:
        """One line: what this sandbox enforces here (for the start-up log)."""
        ...

    def close(self) -> None:
        """Kill (SIGKILL) every run of this sandbox still in progress and refuse later ones:
        each such ``run`` returns at once with status "error" and detail CLOSED. Idempotent,
        callable from any thread; for a server that is stopping."""
        ...


_SAFE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/")


def check_file_name(name: str) -> str:
    """Validate the name of an input file: relative, no '..', a conservative character set
    (no ':' or ',' which would break mount specifications). Returns it normalised."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ValueError(f"bad sandbox file name {name!r}")
    if name.startswith("/") or not set(name) <= _SAFE_NAME_CHARS:
        raise ValueError(f"bad sandbox file name {name!r}")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"bad sandbox file name {name!r}")
    return name


def ceil_s(x: float) -> int:
    return max(1, int(math.ceil(x)))
