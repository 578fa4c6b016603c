"""Running one local process with a deadline and bounded, streamed output (what every backend's
``run`` does underneath: nsjail and unsafe-none start their jail or program with it).

``run_process`` in named steps: start the process (``start_process``; a pre-started jail
stops here and waits, sandbox/warm.py), then ``drive_process``: watch its pipes and its pidfd
(``_Run.__init__``), pump stdin in and stdout/stderr/log out until it exits, the deadline passes
or a cap or the stdout hook stops it (``_Run.pump``), then stop it, reap it for its resource
usage and drain what is left (``_Run.finish``). The caller never hangs: every wait is bounded by
the wall deadline, and the process group is killed before this returns.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .base import StdoutHook

__all__ = [
    "OutputSink",
    "ProcessOutcome",
    "RunningProcesses",
    "StartedProcess",
    "append_capped",
    "discard_process",
    "drive_process",
    "output_stop",
    "run_process",
    "start_process",
]

_READ = 65536
EXIT_GRACE_S = 0.5
"""After the process itself exits, how long its pipes may still deliver what it wrote (a
descendant that escaped it may hold them open; it must not keep the run alive)."""
STOP_GRACE_S = 2.0
"""How long a process asked to stop with a signal other than SIGKILL gets before its process
group is killed (nsjail turns SIGTERM into killing the jail and cleaning its cgroups)."""
REAP_LIMIT_S = 10.0
"""The longest ``wait4`` polling for an already killed process before giving up on it."""


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
    cancelled: bool = False  # killed by RunningProcesses.close()
    extra: dict = field(default_factory=dict)


class RunningProcesses:
    """The processes a sandbox object has running (``run_process(..., running=)``), so that
    ``close()`` can stop them all from another thread and refuse new ones.

    ``stop_signal``: what ``close()`` sends first. SIGKILL (default) kills each process group
    at once. nsjail passes SIGTERM: nsjail then kills its jail and removes the jail's cgroups
    itself, which a SIGKILLed nsjail cannot do (its ``NSJAIL.<pid>`` cgroups stayed behind
    when a draining server closed its sandbox with a sample running); a process still there
    after ``STOP_GRACE_S`` has its group SIGKILLed."""

    def __init__(self, stop_signal: int = signal.SIGKILL) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self.closed = False
        self.stop_signal = stop_signal
        self._stopped: set[subprocess.Popen] = set()  # signalled by close() while alive

    def add(self, proc: subprocess.Popen) -> bool:
        """Track a started process; once closed, kill it at once instead (False)."""
        with self._lock:
            if self.closed:
                _kill_group(proc)
                return False
            self._procs.add(proc)
            return True

    def stopped_by_close(self, proc: subprocess.Popen) -> bool:
        """Whether ``close()`` sent ``stop_signal`` to this process while it ran (nsjail then
        exits with a status of its own, not by a signal)."""
        with self._lock:
            return proc in self._stopped

    def discard(self, proc: subprocess.Popen) -> None:
        """Stop tracking a process. Called BEFORE it is reaped: while it is tracked its pid
        (and process group id) cannot be reused, so ``close()`` never kills a stranger."""
        with self._lock:
            self._procs.discard(proc)

    def close(self) -> None:
        """Stop every tracked process (each ``run_process`` then returns promptly,
        ``cancelled``) and kill any process added later: ``stop_signal``, then SIGKILL of the
        group of each one still tracked and alive after ``STOP_GRACE_S``.

        Signals go only to processes still tracked, under the lock: a process leaves the set
        before it is reaped, so its pid cannot have been reused by a stranger."""
        with self._lock:
            self.closed = True
            if self.stop_signal == signal.SIGKILL:
                for proc in self._procs:
                    _kill_group(proc)
                return
            for proc in self._procs:
                if _exited(proc):
                    continue  # ended by itself: it keeps its result
                try:
                    os.kill(proc.pid, self.stop_signal)
                    self._stopped.add(proc)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_GRACE_S
        while True:
            with self._lock:
                left = [p for p in self._procs if not _exited(p)]
                if not left or time.monotonic() >= deadline:
                    for proc in left:
                        _kill_group(proc)
                    return
            time.sleep(0.002)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # started with start_new_session: pgid == pid
    except (ProcessLookupError, PermissionError):
        pass


def append_capped(buf: bytearray, data: bytes, limit: int) -> bool:
    """Append ``data`` to ``buf`` without letting it grow past ``limit`` bytes (the output cap:
    never buffer more than that); True when something had to be cut off."""
    room = limit - len(buf)
    buf += data[:room]
    return len(data) > room


class OutputSink:
    """Where a run's output goes, the same for every backend (nsjail and unsafe-none through
    ``run_process``, docker through its attach stream): stdout kept or streamed to the hook,
    stderr kept, each capped at ``output_bytes``, and why the run must stop (a cap, the hook
    returning False, the hook raising). ``stdout``/``stderr`` return True when the run must
    stop; the reason is in the flags, which ``outcome()`` copies into a ProcessOutcome."""

    def __init__(self, output_bytes: int, on_stdout: StdoutHook | None = None) -> None:
        self.output_bytes = output_bytes
        self.on_stdout = on_stdout
        self.out = bytearray()
        self.err = bytearray()
        self.streamed = 0
        self.output_exceeded = self.stopped = False
        self.stdout_truncated = self.stderr_truncated = False
        self.hook_error = ""

    def stdout(self, chunk: bytes) -> bool:
        if self.on_stdout is None:
            if append_capped(self.out, chunk, self.output_bytes):
                return self._over_cap(stderr=False)
            return False
        self.streamed += len(chunk)
        if self.streamed > self.output_bytes:
            return self._over_cap(stderr=False)
        try:
            keep_going = self.on_stdout(chunk)
        except Exception as e:  # a bug in the hook must not leak the process
            self.hook_error = f"{type(e).__name__}: {e}"
            keep_going = False
        if keep_going is False:
            self.stopped = True
            return True
        return False

    def stderr(self, chunk: bytes) -> bool:
        if append_capped(self.err, chunk, self.output_bytes):
            return self._over_cap(stderr=True)
        return False

    def _over_cap(self, stderr: bool) -> bool:
        self.output_exceeded = True
        if stderr:
            self.stderr_truncated = True
        else:
            self.stdout_truncated = True
        return True

    def stop_reason(self) -> tuple[str, str] | None:
        """(RunResult status, detail) when the output stopped the run, else None."""
        return output_stop(self.hook_error, self.stopped, self.output_exceeded,
                           self.output_bytes)

    def fill(self, outcome: ProcessOutcome) -> None:
        outcome.stdout, outcome.stderr = bytes(self.out), bytes(self.err)
        outcome.output_exceeded, outcome.stopped = self.output_exceeded, self.stopped
        outcome.stdout_truncated = self.stdout_truncated
        outcome.stderr_truncated = self.stderr_truncated
        outcome.hook_error = self.hook_error


def output_stop(hook_error: str, stopped: bool, output_exceeded: bool,
                output_bytes: int) -> tuple[str, str] | None:
    """The (RunResult status, detail) of a run its output stopped, the same in every backend:
    a hook that raised, a hook that said stop, a cap; None when the output did not stop it."""
    if hook_error:
        return "error", f"stdout hook failed: {hook_error}"
    if stopped:
        return "stopped", "stopped by the caller"
    if output_exceeded:
        return "output_limit", f"output over {output_bytes} bytes"
    return None


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
    running: RunningProcesses | None = None,
) -> ProcessOutcome:
    """Run ``argv`` in a new session, feed ``stdin``, read stdout/stderr (each capped at
    ``output_bytes``; stdout streamed to ``on_stdout`` when given) until the process exits or
    ``wall_s`` passes. Then the process is stopped with ``stop_signal`` (then SIGKILL to its
    process group after a grace period) and reaped with ``wait4`` for its resource usage.

    With ``log_fd_arg`` a pipe is passed to the child and the literal ``{LOG_FD}`` in ``argv``
    is replaced by its descriptor number (nsjail's ``--log_fd``); its content comes back in
    ``ProcessOutcome.log`` (capped).

    ``running``: the process is tracked there while it runs, so that ``running.close()`` from
    another thread kills it (the outcome is then ``cancelled``)."""
    started = start_process(argv, env=env, cwd=cwd, log_fd_arg=log_fd_arg,
                            preexec_fn=preexec_fn, running=running)
    if isinstance(started, ProcessOutcome):
        return started
    return drive_process(started, stdin=stdin, wall_s=wall_s, output_bytes=output_bytes,
                         on_stdout=on_stdout, stop_signal=stop_signal, log_bytes=log_bytes,
                         running=running)


@dataclass
class StartedProcess:
    """A process started by ``start_process`` that nothing has written to or read from yet
    (a pre-started jail waits like this for its sample: sandbox/warm.py)."""

    proc: subprocess.Popen
    log_r: int
    started_at: float  # time.monotonic() when it was started

    def alive(self) -> bool:
        return not _exited(self.proc)


def start_process(
    argv: list[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    log_fd_arg: bool = False,
    preexec_fn: Callable[[], None] | None = None,
    running: RunningProcesses | None = None,
) -> StartedProcess | ProcessOutcome:
    """The first half of ``run_process``: start ``argv`` (tracked in ``running`` from now on)
    and return it, or the failure to start it as an outcome."""
    started = _start(argv, env=env, cwd=cwd, log_fd_arg=log_fd_arg, preexec_fn=preexec_fn)
    if isinstance(started, ProcessOutcome):
        return started
    proc, log_r = started
    if running is not None:
        running.add(proc)  # closed already: killed at once, and the pump sees it exit
    return StartedProcess(proc, log_r, time.monotonic())


def drive_process(
    started: StartedProcess,
    *,
    stdin: bytes,
    wall_s: float,
    output_bytes: int,
    on_stdout: StdoutHook | None = None,
    stop_signal: int = signal.SIGKILL,
    log_bytes: int = 256 * 1024,
    running: RunningProcesses | None = None,
) -> ProcessOutcome:
    """The second half of ``run_process``: feed a started process ``stdin``, pump its output
    for at most ``wall_s`` seconds FROM NOW (a pre-started process's idle time before this call
    is not part of its run), stop it, reap it. ``outcome.wall_s`` is measured from now too."""
    start = time.monotonic()
    run = _Run(started.proc, started.log_r, stdin, deadline=start + wall_s,
               output_bytes=output_bytes, on_stdout=on_stdout, log_bytes=log_bytes,
               running=running)
    try:
        run.pump()
    finally:
        run.finish(stop_signal)
    out = run.outcome
    # Stopped by close(): SIGKILLed (or not even reaped), or sent its stop signal while it
    # ran; one that ended by itself before keeps its result.
    out.cancelled = (running is not None and running.closed
                     and (out.returncode is None or out.returncode < 0
                          or running.stopped_by_close(started.proc)))
    out.wall_s = time.monotonic() - start
    return out


def discard_process(started: StartedProcess, stop_signal: int,
                    running: RunningProcesses | None = None) -> None:
    """Stop a started process that will not be used (``stop_signal``, then SIGKILL of its
    group after the grace period), reap it and close its pipes."""
    run = _Run(started.proc, started.log_r, b"", deadline=time.monotonic(), output_bytes=0,
               on_stdout=None, log_bytes=0, running=running)
    run.stop_reason = "discarded"
    run.finish(stop_signal)


def _start(
    argv: list[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    log_fd_arg: bool,
    preexec_fn: Callable[[], None] | None,
) -> tuple[subprocess.Popen, int] | ProcessOutcome:
    """Start the process in its own session (so its whole group can be killed), with the log
    pipe when asked. Returns it and the log pipe's read end (-1 without), or the failure."""
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
    return proc, log_r


class StdinFeeder:
    """A run's stdin, written into its pipe (non-blocking) as poll says the pipe can take more,
    and the pipe closed once everything is written or the reader has gone. One of the two pump
    loops' shared parts: nsjail's processes (``_Run``) and the forkserver's jails
    (``forkserver._Drive``) feed stdin the same way; they differ in how they stop a run."""

    def __init__(self, fd: int, data: bytes, poller: select.poll,
                 close: Callable[[], None]) -> None:
        self.fd, self.view, self.pos = fd, memoryview(data), 0
        self.poller, self._close = poller, close
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLOUT | select.POLLERR)

    def on_ready(self, ev: int) -> bool:
        """Write what the pipe takes; True once the pipe is closed (all written, or the reading
        end gone: a program need not read its input)."""
        if not ev & select.POLLERR:
            try:
                self.pos += os.write(self.fd, self.view[self.pos : self.pos + _READ])
            except BlockingIOError:
                return False
            except OSError:  # BrokenPipeError among them
                self.pos = len(self.view)
            if self.pos < len(self.view):
                return False
        self.poller.unregister(self.fd)
        self._close()
        return True


def read_chunk(fd: int) -> bytes | None:
    """One chunk of a non-blocking pipe: None when nothing is there yet, b"" at its end (an
    error reading it counts as its end). The pump loops' other shared part."""
    try:
        return os.read(fd, _READ)
    except BlockingIOError:
        return None
    except OSError:
        return b""


class _Run:
    """One started process: its pipes, what was read from them, and why it was stopped."""

    def __init__(self, proc: subprocess.Popen, log_r: int, stdin: bytes, *, deadline: float,
                 output_bytes: int, on_stdout: StdoutHook | None, log_bytes: int,
                 running: RunningProcesses | None = None) -> None:
        self.proc = proc
        self.running = running
        self.log_r = log_r
        self.deadline = deadline
        self.sink = OutputSink(output_bytes, on_stdout)
        self.log_bytes = log_bytes
        self.log = bytearray()
        self.outcome = ProcessOutcome(None, 0.0, 0.0, 0, b"", b"", b"")
        self.stop_reason = ""
        self.exited = False
        self.fds: dict[int, str] = {}
        assert proc.stdin and proc.stdout and proc.stderr
        self.in_fd = proc.stdin.fileno()
        for f, tag in ((proc.stdout.fileno(), "out"), (proc.stderr.fileno(), "err")):
            os.set_blocking(f, False)
            self.fds[f] = tag
        if log_r >= 0:
            os.set_blocking(log_r, False)
            self.fds[log_r] = "log"
        self.poller = select.poll()
        for f in self.fds:
            self.poller.register(f, select.POLLIN | select.POLLHUP | select.POLLERR)
        # A pidfd tells us when the process itself has exited: descendants that escaped it
        # (only possible without a PID namespace) must not keep the run alive by holding the
        # pipes open.
        try:
            self.pidfd = os.pidfd_open(proc.pid)
            self.poller.register(self.pidfd, select.POLLIN)
        except (AttributeError, OSError):
            self.pidfd = -1
        self.feeder: StdinFeeder | None = None
        if stdin:
            self.feeder = StdinFeeder(self.in_fd, stdin, self.poller, proc.stdin.close)
        else:
            proc.stdin.close()
            self.in_fd = -1

    # -- the loop -------------------------------------------------------------------------
    def pump(self) -> None:
        """Move bytes until every output pipe is closed, the deadline passes (once the process
        has exited, ``EXIT_GRACE_S`` after that) or a reason to stop is found."""
        while self.fds:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                if not self.exited:
                    self.outcome.timed_out = True
                    self.stop_reason = "timeout"
                return
            try:
                events = self.poller.poll(min(remaining, 1.0) * 1000)
            except InterruptedError:  # pragma: no cover (PEP 475 retries)
                continue
            for f, ev in events:
                if f == self.pidfd:
                    self._process_exited()
                elif f == self.in_fd:
                    self._feed_stdin(ev)
                elif f in self.fds:
                    self._read(f)
                    if self.stop_reason:
                        return

    def _process_exited(self) -> None:
        self.poller.unregister(self.pidfd)
        self.exited = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.deadline = min(self.deadline, time.monotonic() + EXIT_GRACE_S)

    def _feed_stdin(self, ev: int) -> None:
        assert self.feeder is not None
        if self.feeder.on_ready(ev):
            self.in_fd = -1

    def _read(self, f: int) -> None:
        """Read one chunk of pipe ``f`` and keep it (capped), stream it, or stop the run."""
        chunk = read_chunk(f)
        if chunk is None:
            return
        if not chunk:
            self.poller.unregister(f)
            del self.fds[f]
            return
        tag = self.fds[f]
        if tag == "log":
            self.log += chunk[: max(0, self.log_bytes - len(self.log))]
        elif self.sink.stdout(chunk) if tag == "out" else self.sink.stderr(chunk):
            self.stop_reason = "output"

    # -- the end ----------------------------------------------------------------------------
    def finish(self, stop_signal: int) -> None:
        """Stop the process (if it has not exited), reap it, drain the log pipe and close
        every descriptor; fills the outcome."""
        proc = self.proc
        if self.stop_reason or not _exited(proc):
            _stop(proc, stop_signal if self.stop_reason else signal.SIGKILL)
        if self.running is not None:
            self.running.discard(proc)  # before the reap frees its pid
        rc, cpu, rss = _reap(proc)
        # The process is gone; drain what is left in the log pipe without blocking.
        for f, tag in list(self.fds.items()):
            if tag == "log":
                try:
                    while len(self.log) < self.log_bytes:
                        chunk = os.read(f, _READ)
                        if not chunk:
                            break
                        self.log += chunk
                except OSError:
                    pass
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        if self.log_r >= 0:
            os.close(self.log_r)
        if self.pidfd >= 0:
            os.close(self.pidfd)
        o = self.outcome
        o.returncode, o.cpu_s, o.maxrss_kb = rc, cpu, rss
        self.sink.fill(o)
        o.log = bytes(self.log)


def _stop(proc: subprocess.Popen, sig: int) -> None:
    """Ask the process to stop with ``sig`` (nsjail turns SIGTERM into SIGKILL of the whole jail
    and then cleans up its cgroups); SIGKILL its process group if it has not exited after a
    grace period."""
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        return
    grace = time.monotonic() + (STOP_GRACE_S if sig != signal.SIGKILL else 0.0)
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
    deadline = time.monotonic() + REAP_LIMIT_S
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
            # Why a thread: the process did not die within REAP_LIMIT_S of SIGKILL (stuck in
            # the kernel); someone must still wait for it so it does not stay a zombie.
            threading.Thread(target=proc.wait, daemon=True).start()
            return None, 0.0, 0
        time.sleep(0.001)
