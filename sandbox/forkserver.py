"""The forkserver (issue 29): runs jails forked from a warm zygote (sandbox/zygote.py) instead of
starting nsjail and a fresh interpreter for each, with the same jail: nsjail's namespaces,
mounts, uid, cgroups, rlimits, capabilities and nsjail's own seccomp filter.

``NsjailSandbox(forkserver=True)`` uses it for the judge's harness runs (the harness is loaded
once in the zygote; each run's PID 1 calls its ``main()``), and nsjail for everything else. What
samples share, and why it is safe, is sandbox/README.md's "The forkserver".

The verifier's side of a run (``Forkserver.run``): the run's stdin, stdout and stderr pipes and
a report socket go to the zygote in one request packet; the zygote's child builds the jail and
reports its PID 1's pid with a pidfd; this side feeds stdin, reads the output (capped, streamed
to the hook) until the report of the jail's end, or the deadline, a cap or the hook stops it:
then the jail is killed through the pidfd (killing a PID namespace's init kills all of it).
"""

from __future__ import annotations

import hashlib
import marshal
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import cgroups
from .base import CLOSED, RunResult, SandboxLimits, StdoutHook
from .jail_spec import CGROUP_HEADROOM_MB, JailSpec
from .policy_reader import (
    cgroup_files,
    policy_environment,
    policy_mounts,
    policy_rlimits,
    policy_scalars,
)
# EXIT_GRACE_S: after the jail's end is reported, how long its pipes may still deliver (the same
# grace process.drive_process gives a process that exited).
from .process import (
    EXIT_GRACE_S,
    OutputSink,
    ProcessOutcome,
    StdinFeeder,
    output_stop,
    read_chunk,
)

ZYGOTE = Path(__file__).with_name("zygote.py")
JAILSYS_SOURCE = Path(__file__).with_name("jailsys.c")
JAILSYS_ENV = "MAGIC_SANDBOX_JAILSYS"
"""Names a prebuilt system-call module (sandbox/jailsys.c compiled for the jails' interpreter);
unset, the forkserver compiles it at start (:func:`build_jailsys`)."""
PID_WAIT_S = 5.0
"""After its deadline, how long a run may still take to report its jail's pid (the jail's set-up
is ours, and quick: this bounds a zygote that stopped answering)."""
END_WAIT_S = 10.0
"""After the jail is killed, how long its report of the end may take."""
ZYGOTE_REAP_S = 3.0
"""When the verifier closes its channel, how long the zygote waits for the jails it kills to
end, removing their cgroups, before it exits."""

PLACEMENT_VIEW = ("affinity", "cpu_count")
"""What a program sees of its jail's CPU placement (tests/jail_probe.py's keys): one CPU in
a forked jail, every CPU of the service's in nsjail's. The one way the two jails differ to a
program; it cannot change it (sandbox/README.md "Placement")."""


@dataclass(frozen=True)
class PreloadedEntry:
    """What the forkserver serves: runs of ``[python, "-I", "-S", NAME]`` with NAME one of
    ``names`` among the run's files (the judge's harness, as bytecode or source: the verifier's
    own names), which the zygote runs from ``source``, loaded once. The run's own file is still
    bound at /tmp/NAME (the harness's ``--program`` processes exec it). Only the verifier gives
    both, from the same harness; a jail's output never becomes the zygote's code."""

    names: tuple[str, ...]
    source: bytes

    def serves(self, argv: list[str], files: Mapping[str, bytes], python: str) -> bool:
        return (len(argv) == 4 and argv[:3] == [python, "-I", "-S"] and argv[3] in self.names
                and argv[3] in files)


def zygote_config(policy: str | os.PathLike, extra_ro: list[tuple[str, str]], *,
                  files_dir: str, harness: str, seccomp: bytes, cgroup_args: list[str],
                  jailsys: str) -> dict:
    """The zygote's configuration (sandbox/zygote.py), all of it from the policy file, the
    sandbox's own read-only directories (``extra_ro``: the interpreter's prefix, the packages),
    its staged input files and harness source, nsjail's seccomp filter and nsjail's cgroup
    arguments (empty: no cgroups), and its system-call module (:func:`build_jailsys`)."""
    mounts = policy_mounts(policy)
    rlimits = dict(policy_rlimits(policy))
    # The policy's rlimit_stack_type SOFT: nsjail sets both limits to its own soft one.
    rlimits["stack"] = resource.getrlimit(resource.RLIMIT_STACK)[0]
    scalars = policy_scalars(policy)
    return {
        "ro": [(src, dst) for src, dst, _rw, mandatory in mounts
               if not dst.startswith("/dev/") and (mandatory or os.path.lexists(src))] + extra_ro,
        "devices": [(dst, rw) for _src, dst, rw, _m in mounts if dst.startswith("/dev/")],
        "files": files_dir,
        "harness": harness,
        "seccomp": seccomp.hex(),  # inline: no file to leave behind
        "cgroups": cgroup_files(cgroup_args) if cgroup_args else {},
        "env": policy_environment(policy),
        "rlimits": rlimits,
        "hostname": scalars.get("hostname", "sandbox"),
        "cwd": scalars.get("cwd", "/tmp"),
        "jailsys": jailsys,
        "reap_s": ZYGOTE_REAP_S,
    }


def run_request(uid: int, argv: list[str], staged: list[tuple[str, str]], lim: SandboxLimits,
                *, exec_argv: bool, cgroup_headroom_mb: int = CGROUP_HEADROOM_MB) -> dict:
    """The zygote's request for one run, rendered from the same :class:`JailSpec` as nsjail's
    command line (``--time_limit``, ``--rlimit_as/cpu/fsize/nproc``, the scratch tmpfs, the
    cgroup limits)."""
    return JailSpec.of(lim, cgroup_headroom_mb=cgroup_headroom_mb).zygote_request(
        uid, argv, staged, exec_argv=exec_argv)


def run_result(out: ProcessOutcome, lim: SandboxLimits,
               signal_status: Callable[[int, float, SandboxLimits], tuple[str, str]]
               ) -> RunResult:
    """A forked run's RunResult, by nsjail's rules (``signal_status``: what a death by a signal
    nobody outside sent means)."""
    res = RunResult(status="ok", stdout=out.stdout, stderr=out.stderr, wall_s=out.wall_s,
                    cpu_s=out.cpu_s,
                    peak_memory_mb=round(out.maxrss_kb / 1024, 1) if out.maxrss_kb else None,
                    stdout_truncated=out.stdout_truncated,
                    stderr_truncated=out.stderr_truncated)
    stop = output_stop(out.hook_error, out.stopped, out.output_exceeded, lim.output_bytes)
    if out.cancelled:
        res.status, res.detail = "error", CLOSED
    elif out.spawn_error:
        res.status, res.detail = "error", out.spawn_error
    elif stop is not None:
        res.status, res.detail = stop
    elif out.timed_out:
        res.status, res.detail = "timeout", f"wall time over {lim.wall_s:g} s"
    elif out.returncode is None:
        res.status, res.detail = "error", "forkserver: the jail's status is unknown"
    elif out.returncode >= 0:
        res.exit_code = out.returncode
    else:
        res.signal = -out.returncode
        res.status, res.detail = signal_status(res.signal, out.cpu_s, lim)
    return res


_JAILSYS_BUILT: dict[tuple[str, str], tuple[str, bytes]] = {}
"""(interpreter, source digest) -> (extension suffix, the built module's bytes)."""
_JAILSYS_LOCK = threading.Lock()


def build_jailsys(python: str, out_dir: str) -> str:
    """The zygote's system-call module (sandbox/jailsys.c) for the jails' interpreter
    ``python``, written into ``out_dir`` (the sandbox's files directory, swept with it, also
    after a SIGKILL: a 60-minute soak found a directory of its own left by every killed
    replica). Returns its path. Compiled once per process and interpreter (about 0.3 s; later
    calls write the same bytes), with the system's C compiler (``$CC``, else ``cc`` or ``gcc``)
    against that interpreter's own headers; or, when ``$MAGIC_SANDBOX_JAILSYS`` names one, a
    prebuilt module (the verifier image has no compiler). Raises OSError naming what is missing (no
    compiler, no Python.h: the zygote has no other way to make its system calls; ctypes is not
    one, sandbox/README.md "The forkserver")."""
    prebuilt = os.environ.get(JAILSYS_ENV, "").strip()
    key = (python, prebuilt or hashlib.sha256(JAILSYS_SOURCE.read_bytes()).hexdigest())
    with _JAILSYS_LOCK:
        if key not in _JAILSYS_BUILT:
            _JAILSYS_BUILT[key] = (_read_prebuilt_jailsys(prebuilt) if prebuilt
                                   else _compile_jailsys(python, out_dir))
        suffix, data = _JAILSYS_BUILT[key]
    out = os.path.join(out_dir, "_jailsys" + suffix)
    with open(out + ".part", "wb") as f:
        f.write(data)
    os.replace(out + ".part", out)  # a zygote restarting now loads a whole file
    return out


def _read_prebuilt_jailsys(path: str) -> tuple[str, bytes]:
    """The module ``$MAGIC_SANDBOX_JAILSYS`` names (built from this checkout's jailsys.c for the
    jails' interpreter, as the verifier image's build stage does): its file-name suffix and
    bytes. A name that is not a ``_jailsys*.so`` or a file that cannot be read is refused."""
    name = os.path.basename(path)
    if not (name.startswith("_jailsys") and name.endswith(".so")):
        raise OSError(f"${JAILSYS_ENV}={path}: not a _jailsys*.so module (sandbox/jailsys.c "
                      f"built as a CPython extension)")
    try:
        with open(path, "rb") as f:
            return name[len("_jailsys"):], f.read()
    except OSError as e:
        raise OSError(f"${JAILSYS_ENV}={path}: cannot read it: {e.strerror or e}") from e


def _compile_jailsys(python: str, out_dir: str) -> tuple[str, bytes]:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise OSError("no C compiler (cc or gcc; apt install gcc) to build the forkserver's "
                      "system-call module sandbox/jailsys.c")
    try:
        probe = subprocess.run(
            [python, "-I", "-S", "-c", "import sysconfig; "
             "print(sysconfig.get_paths()['include']); "
             "print(sysconfig.get_config_var('EXT_SUFFIX'))"],
            capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as e:
        raise OSError(f"{python} did not say where its headers are in 30 s") from e
    if probe.returncode != 0:
        raise OSError(f"cannot ask {python} for its headers: {probe.stderr.strip()[-300:]}")
    include, suffix = probe.stdout.split()
    if not os.path.isfile(os.path.join(include, "Python.h")):
        raise OSError(f"no Python.h in {include}: the forkserver builds sandbox/jailsys.c "
                      f"against {python}'s headers (install its -dev package)")
    tmp = os.path.join(out_dir, f".jailsys-build-{os.getpid()}{suffix}")
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f"-I{include}",
           str(JAILSYS_SOURCE), "-o", tmp]
    try:
        comp = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if comp.returncode != 0:
            raise OSError(f"building sandbox/jailsys.c failed ({' '.join(cmd)}): "
                          f"{(comp.stderr or comp.stdout).strip()[-800:]}")
        with open(tmp, "rb") as f:
            return suffix, f.read()
    except subprocess.TimeoutExpired as e:
        raise OSError(f"building sandbox/jailsys.c took over 120 s ({' '.join(cmd)})") from e
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


class ZygoteGone(Exception):
    """The zygote is not there (it died or never started); the message says why."""


class Forkserver:
    """One zygote, started on first use and again after it dies; ``run`` from any thread.

    ``config``: the zygote's configuration (sandbox/zygote.py: ``root`` is filled in here);
    ``python``: the jails' interpreter, which runs the zygote; ``env``: the policy's
    environment, the zygote's own and its jails'."""

    def __init__(self, python: str, config: dict, env: Mapping[str, str]) -> None:
        self.python, self.config, self.env = python, dict(config), dict(env)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._root: str | None = None
        self._pidfds: set[int] = set()  # the jails running now (for close)
        self.closed = False
        self.started = 0

    # -- the zygote --------------------------------------------------------------------------

    def _zygote(self) -> socket.socket:
        """The live zygote's socket, starting one when there is none (under the lock)."""
        if self._proc is not None and self._proc.poll() is None and self._sock is not None:
            return self._sock
        self._stop_zygote()
        # The cgroups of the jails of a zygote that was killed (it removes its own otherwise).
        for controller in self.config.get("cgroups", {}).values():
            cgroups.sweep_stale(controller["parent"])
        # The zygote's root is mounted, in its own mount namespace, on an empty directory in
        # the sandbox's files directory: swept with it when the verifier is gone.
        self._root = os.path.join(self.config["files"], f".zygote-root-{self.started}")
        os.makedirs(self._root, mode=0o755, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cfg = dict(self.config, root=self._root)
        try:
            self._proc = subprocess.Popen(
                [self.python, "-I", "-S", str(ZYGOTE), str(theirs.fileno()),
                 marshal.dumps(cfg).hex()],
                pass_fds=(theirs.fileno(),), env=self.env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            ours.close()
            raise ZygoteGone(f"cannot start the zygote: {e}") from e
        finally:
            theirs.close()
        self._sock = ours
        self.started += 1
        return ours

    def _zygote_error(self) -> str:
        proc = self._proc
        if proc is None or proc.poll() is None:
            return "the zygote did not answer"
        err = b""
        try:
            assert proc.stderr
            os.set_blocking(proc.stderr.fileno(), False)
            err = proc.stderr.read() or b""
        except (OSError, ValueError):
            pass
        return (f"the zygote exited ({proc.returncode}): "
                f"{err[-600:].decode(errors='replace').strip()}")

    def _stop_zygote(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the zygote exits when its socket closes
            self._sock = None
        if self._proc is not None:
            try:
                # Longer than the zygote's own wait for its killed jails (ZYGOTE_REAP_S): it
                # removes their cgroups before it exits, unless it must be killed.
                self._proc.wait(timeout=ZYGOTE_REAP_S + 2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._proc.stderr:
                self._proc.stderr.close()
            self._proc = None
            # What a killed zygote (or one whose jails took longer than it waits) left: the
            # cgroups of jails now gone. A jail still exiting keeps its own (the next zygote's
            # start sweeps it). A CI run found two left after a close.
            for controller in self.config.get("cgroups", {}).values():
                cgroups.sweep_stale(controller["parent"])
        if self._root is not None:
            try:
                os.rmdir(self._root)  # its mounts were in the zygote's own namespace
            except OSError:
                pass
            self._root = None

    def close(self) -> None:
        """Kill every running jail, stop the zygote, refuse later runs (each returns at once,
        cancelled). Idempotent."""
        with self._lock:
            self.closed = True
            for pidfd in list(self._pidfds):
                _kill(pidfd)
            self._stop_zygote()

    def zygote_pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    # -- one run -----------------------------------------------------------------------------

    def run(self, request: dict, *, stdin: bytes, wall_s: float, output_bytes: int,
            on_stdout: StdoutHook | None = None) -> ProcessOutcome:
        """One jail: ``request`` is the zygote's (uid, limits, cgroup values, files, argv or
        none for the harness). Never raises: a failure is the outcome's ``spawn_error``."""
        start = time.monotonic()
        out = ProcessOutcome(None, 0.0, 0.0, 0, b"", b"", b"")
        if self.closed:
            out.cancelled, out.spawn_error = True, CLOSED
            return out
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            try:
                with self._lock:
                    if self.closed:
                        out.cancelled, out.spawn_error = True, CLOSED
                        return out
                    for attempt in (0, 1):  # a zygote found dead is replaced once
                        sock = self._zygote()
                        try:
                            socket.send_fds(sock, [marshal.dumps(request)],
                                            [in_r, out_w, err_w, theirs.fileno()])
                            break
                        except OSError as e:
                            why = self._zygote_error()
                            self._stop_zygote()
                            if attempt:
                                raise ZygoteGone(f"{e}; {why}") from e
            except ZygoteGone as e:
                out.spawn_error = f"forkserver: {e}"
                return out
            finally:
                for fd in (in_r, out_w, err_w):
                    os.close(fd)
                theirs.close()
            in_r = out_w = err_w = -1
            _Drive(self, mine, in_w, out_r, err_r, stdin, start + wall_s, output_bytes,
                   on_stdout, out).pump()
            in_w = out_r = err_r = -1  # closed by the drive
        finally:
            for fd in (in_w, out_r, err_r):
                if fd >= 0:
                    os.close(fd)
            mine.close()
        # Stopped by close(): killed (or its end not even reported); one that ended by itself
        # before keeps its result (as process.drive_process decides for nsjail's runs).
        if self.closed and (out.returncode is None or out.returncode < 0):
            out.cancelled = True
        out.wall_s = time.monotonic() - start
        return out

    def _track(self, pidfd: int) -> bool:
        with self._lock:
            if self.closed:
                return False
            self._pidfds.add(pidfd)
            return True

    def _untrack(self, pidfd: int) -> None:
        with self._lock:
            self._pidfds.discard(pidfd)


def _kill(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass  # already gone


class _Drive:
    """The verifier's side of one running jail (see the module's docstring).

    It shares stdin feeding and pipe reading with nsjail's loop (process.StdinFeeder,
    process.read_chunk); the loops themselves stay two because they end differently: this one
    kills through the jail's pidfd and waits for the zygote's report of the end (END_WAIT_S), its
    exit grace may pass the deadline, and it closes each pipe at its end; ``process._Run`` ends
    when its pipes close, kills nsjail's process group after SIGTERM's grace, reads nsjail's log
    pipe too, and never lets its grace pass the deadline."""

    def __init__(self, server: Forkserver, report: socket.socket, in_w: int, out_r: int,
                 err_r: int, stdin: bytes, deadline: float, output_bytes: int,
                 on_stdout: StdoutHook | None, out: ProcessOutcome) -> None:
        self.server, self.report, self.out = server, report, out
        self.deadline = deadline
        self.sink = OutputSink(output_bytes, on_stdout)
        self.fds = {out_r: "out", err_r: "err"}
        self.in_w = in_w
        self.stdin = stdin
        self.feeder: StdinFeeder | None = None
        self.pidfd = -1
        self.status: dict | None = None
        self.killed = False

    def pump(self) -> None:
        try:
            self._loop()
        finally:
            if self.pidfd >= 0:
                self.server._untrack(self.pidfd)
                os.close(self.pidfd)
            if self.in_w >= 0:
                os.close(self.in_w)
            for fd in self.fds:
                os.close(fd)
            self.sink.fill(self.out)
            st = self.status or {}
            if "status" in st:
                self.out.returncode = os.waitstatus_to_exitcode(st["status"])
                self.out.cpu_s, self.out.maxrss_kb = float(st["cpu"]), int(st["maxrss_kb"])
            elif not self.out.spawn_error:
                self.out.spawn_error = "forkserver: the jail's end was not reported"

    def _loop(self) -> None:
        """Until the jail's end is reported and its pipes are drained (``EXIT_GRACE_S`` at
        most), or, once killed, until its end is reported (``END_WAIT_S`` at most)."""
        poller = select.poll()
        poller.register(self.report, select.POLLIN)
        for fd in self.fds:
            os.set_blocking(fd, False)
            poller.register(fd, select.POLLIN)
        if self.stdin:
            in_w = self.in_w
            self.feeder = StdinFeeder(in_w, self.stdin, poller, lambda: os.close(in_w))
        else:
            os.close(self.in_w)
            self.in_w = -1
        end_by = self.deadline
        while True:
            now = time.monotonic()
            if self.status is not None:
                if not self.fds or now >= end_by:
                    return
            elif self.killed:
                if now >= end_by:
                    return  # its end never came: the outcome says so
            elif now >= self.deadline:
                self.out.timed_out = True
                self._stop()
                end_by = now + (END_WAIT_S if self.pidfd >= 0 else PID_WAIT_S)
                continue
            for fd, ev in poller.poll(max(0.0, min(end_by - now, 1.0)) * 1000):
                if fd == self.report.fileno():
                    if not self._report(poller):
                        if self.status is None and not self.out.spawn_error:
                            self.out.spawn_error = (
                                f"forkserver: no report of the jail ({self.server._zygote_error()})")
                        return
                    if self.status is not None:
                        end_by = time.monotonic() + EXIT_GRACE_S
                elif fd == self.in_w:
                    self._feed(poller, ev)
                elif fd in self.fds:
                    self._read(fd, poller)
                    if not self.killed and self.sink.stop_reason():
                        self._stop()  # a cap or the hook
                        if self.status is None:
                            end_by = time.monotonic() + END_WAIT_S

    def _stop(self) -> None:
        self.killed = True
        if self.pidfd >= 0:
            _kill(self.pidfd)

    def _report(self, poller) -> bool:
        """One report message; False at the end of the socket."""
        try:
            msg, fds, _flags, _addr = socket.recv_fds(self.report, 1 << 16, 1)
        except OSError:
            return False
        if not msg:
            poller.unregister(self.report)
            return False
        rep = marshal.loads(msg)  # the zygote's (see Config): both ends are trusted
        if "pid" in rep and fds:
            self.pidfd = fds[0]
            if not self.server._track(self.pidfd):  # closed meanwhile
                self.out.cancelled = True
                self.killed = True
            if self.killed:
                _kill(self.pidfd)
        elif "status" in rep:
            self.status = rep
            poller.unregister(self.report)
        elif "error" in rep:
            self.out.spawn_error = f"forkserver: {rep['error']}"
            self.status = {}
            poller.unregister(self.report)
        for extra in fds[1:]:
            os.close(extra)
        return True

    def _feed(self, poller, ev: int) -> None:
        assert self.feeder is not None
        if self.feeder.on_ready(ev):
            self.in_w = -1

    def _read(self, fd: int, poller) -> None:
        chunk = read_chunk(fd)
        if chunk is None:
            return
        if not chunk:
            poller.unregister(fd)
            del self.fds[fd]
            os.close(fd)
            return
        if self.fds[fd] == "out":
            self.sink.stdout(chunk)
        else:
            self.sink.stderr(chunk)
