"""The one small interface every sandbox backend implements, and the process plumbing they share.

A backend runs ``argv`` with some bytes on stdin, a few read-only input files in its private
scratch directory, and limits; it returns a :class:`RunResult` (exit status, signal, bounded
stdout/stderr, wall and CPU time, peak memory and a coarse status). Nothing here knows about
test cases or verdicts: that is ``verifier/code_score.py`` and the in-sandbox harness.

Every process started here has a wall deadline enforced from the outside (the caller never
hangs), captured output is bounded while it is read (a flood is cut off, never buffered), and
the process and everything it started are killed and reaped before ``run`` returns.
"""

from __future__ import annotations

import errno
import math
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, runtime_checkable

__all__ = [
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


class SandboxUnavailable(Exception):
    """The sandbox cannot run programs here; the message says why (from the self-test)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. Defaults suit one sample of a competitive-programming problem.

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


@runtime_checkable
class Sandbox(Protocol):
    """A place to run untrusted programs. Implementations: nsjail (default), docker,
    unsafe-none (development only, no isolation)."""

    name: str
    python: str
    """Path of a Python 3 interpreter *inside* the sandbox (the judge's harness runs on it)."""
    isolated: bool
    """True when programs cannot see the host or each other (False only for unsafe-none)."""

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


# ---------------------------------------------------------------------------------------------
# Running a local process with a deadline and bounded, streamed output.


@dataclass
class ProcessOutcome:
    returncode: int | None
    wall_s: float
    cpu_s: float
    maxrss_kb: int
    stdout: bytes
    stderr: bytes
    log: bytes
    timed_out: bool = False
    output_exceeded: bool = False
    stopped: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    hook_error: str = ""
    spawn_error: str = ""
    extra: dict = field(default_factory=dict)


_READ = 65536


def append_capped(buf: bytearray, data: bytes, limit: int) -> bool:
    """Append ``data`` to ``buf`` without letting it grow past ``limit`` bytes (the output cap:
    never buffer more than that); True when something had to be cut off."""
    room = limit - len(buf)
    buf += data[:room]
    return len(data) > room


def run_process(
    argv: list[str],
    *,
    stdin: bytes,
    wall_s: float,
    output_bytes: int,
    on_stdout: StdoutHook | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    log_fd_arg: bool = False,
    preexec_fn: Callable[[], None] | None = None,
    stop_signal: int = signal.SIGKILL,
    log_bytes: int = 256 * 1024,
) -> ProcessOutcome:
    """Run ``argv`` in a new session, feed ``stdin``, read stdout/stderr (each capped at
    ``output_bytes``; stdout streamed to ``on_stdout`` when given) until the process exits or
    ``wall_s`` passes. Then the process is stopped with ``stop_signal`` (then SIGKILL to its
    process group after a grace period) and reaped with ``wait4`` for its resource usage.

    With ``log_fd_arg`` a pipe is passed to the child and the literal ``{LOG_FD}`` in ``argv``
    is replaced by its descriptor number (nsjail's ``--log_fd``); its content comes back in
    ``ProcessOutcome.log`` (capped)."""
    start = time.monotonic()
    deadline = start + wall_s
    log_r = log_w = -1
    pass_fds: tuple[int, ...] = ()
    if log_fd_arg:
        log_r, log_w = os.pipe2(os.O_CLOEXEC)
        pass_fds = (log_w,)
        argv = [a.replace("{LOG_FD}", str(log_w)) for a in argv]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            pass_fds=pass_fds,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            preexec_fn=preexec_fn,
        )
    except OSError as e:
        if log_r >= 0:
            os.close(log_r)
        return ProcessOutcome(
            None, 0.0, 0.0, 0, b"", b"", b"", spawn_error=f"cannot start {argv[0]!r}: {e}"
        )
    finally:
        if log_w >= 0:
            os.close(log_w)

    out = bytearray()
    err = bytearray()
    log = bytearray()
    outcome = ProcessOutcome(None, 0.0, 0.0, 0, b"", b"", b"")
    fds: dict[int, str] = {}
    assert proc.stdin and proc.stdout and proc.stderr
    in_fd = proc.stdin.fileno()
    os.set_blocking(in_fd, False)
    for f, tag in ((proc.stdout.fileno(), "out"), (proc.stderr.fileno(), "err")):
        os.set_blocking(f, False)
        fds[f] = tag
    if log_r >= 0:
        os.set_blocking(log_r, False)
        fds[log_r] = "log"
    poller = select.poll()
    for f in fds:
        poller.register(f, select.POLLIN | select.POLLHUP | select.POLLERR)
    # A pidfd tells us when the process itself has exited: descendants that escaped it (only
    # possible without a PID namespace) must not keep the run alive by holding the pipes open.
    try:
        pidfd = os.pidfd_open(proc.pid)
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):
        pidfd = -1
    exited = False
    view = memoryview(stdin)
    pos = 0
    if len(view):
        poller.register(in_fd, select.POLLOUT | select.POLLERR)
    else:
        proc.stdin.close()
        in_fd = -1
    streamed = 0
    stop_reason = ""
    try:
        while fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if not exited:
                    outcome.timed_out = True
                    stop_reason = "timeout"
                break
            try:
                events = poller.poll(min(remaining, 1.0) * 1000)
            except InterruptedError:  # pragma: no cover (PEP 475 retries)
                continue
            for f, ev in events:
                if f == pidfd:
                    poller.unregister(pidfd)
                    exited = True
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    deadline = min(deadline, time.monotonic() + 0.5)
                    continue
                if f == in_fd:
                    if ev & select.POLLERR:
                        poller.unregister(in_fd)
                        proc.stdin.close()
                        in_fd = -1
                        continue
                    try:
                        pos += os.write(in_fd, view[pos : pos + _READ])
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        pos = len(view)
                    if pos >= len(view):
                        poller.unregister(in_fd)
                        proc.stdin.close()
                        in_fd = -1
                    continue
                tag = fds.get(f)
                if tag is None:
                    continue
                try:
                    chunk = os.read(f, _READ)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    poller.unregister(f)
                    del fds[f]
                    continue
                if tag == "out":
                    if on_stdout is not None:
                        streamed += len(chunk)
                        if streamed > output_bytes:
                            outcome.output_exceeded = True
                            outcome.stdout_truncated = True
                            stop_reason = "output"
                            break
                        try:
                            keep_going = on_stdout(chunk)
                        except Exception as e:  # a bug in the hook must not leak the process
                            outcome.hook_error = f"{type(e).__name__}: {e}"
                            keep_going = False
                        if keep_going is False:
                            outcome.stopped = True
                            stop_reason = "stopped"
                            break
                    elif append_capped(out, chunk, output_bytes):
                        outcome.output_exceeded = True
                        outcome.stdout_truncated = True
                        stop_reason = "output"
                        break
                elif tag == "err":
                    if append_capped(err, chunk, output_bytes):
                        outcome.output_exceeded = True
                        outcome.stderr_truncated = True
                        stop_reason = "output"
                        break
                else:
                    log += chunk[: max(0, log_bytes - len(log))]
            if stop_reason:
                break
    finally:
        if stop_reason or not _exited(proc):
            _stop(proc, stop_signal if stop_reason else signal.SIGKILL)
        rc, cpu, rss = _reap(proc)
        # The process is gone; drain what is left in the pipes without blocking.
        for f, tag in list(fds.items()):
            if tag == "log":
                try:
                    while len(log) < log_bytes:
                        chunk = os.read(f, _READ)
                        if not chunk:
                            break
                        log += chunk
                except OSError:
                    pass
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        if log_r >= 0:
            os.close(log_r)
        if pidfd >= 0:
            os.close(pidfd)
    outcome.returncode = rc
    outcome.cpu_s = cpu
    outcome.maxrss_kb = rss
    outcome.wall_s = time.monotonic() - start
    outcome.stdout = bytes(out)
    outcome.stderr = bytes(err)
    outcome.log = bytes(log)
    return outcome


def _stop(proc: subprocess.Popen, sig: int) -> None:
    """Ask the process to stop with ``sig`` (nsjail turns SIGTERM into SIGKILL of the whole jail
    and then cleans up its cgroups); SIGKILL its process group if it has not exited after a
    grace period."""
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        return
    grace = time.monotonic() + (2.0 if sig != signal.SIGKILL else 0.0)
    while time.monotonic() < grace:
        if _exited(proc):
            return
        time.sleep(0.002)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _exited(proc: subprocess.Popen) -> bool:
    try:
        r = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return r is not None


def _reap(proc: subprocess.Popen) -> tuple[int | None, float, int]:
    """wait4 the child (for its rusage: CPU of it and its reaped descendants, max RSS of the
    largest). Never blocks for long: the caller has already killed it when needed."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            return proc.returncode, 0.0, 0
        if pid:
            rc = os.waitstatus_to_exitcode(status)
            proc.returncode = rc
            return rc, ru.ru_utime + ru.ru_stime, ru.ru_maxrss
        if time.monotonic() > deadline:  # pragma: no cover (unkillable process)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            threading.Thread(target=proc.wait, daemon=True).start()
            return None, 0.0, 0
        time.sleep(0.001)


def ceil_s(x: float) -> int:
    return max(1, int(math.ceil(x)))


def is_enoent(e: OSError) -> bool:
    return e.errno == errno.ENOENT
