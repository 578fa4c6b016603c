"""Process control inside the jail: killing every process of a test, starting children under
their limits, the audit hook that denies in-process hooks, running the program's module as
``__main__`` and watching one test's processes until they finish or run out of time.

Part of the judge's harness (generated into ``harness.py`` by ``python -m
verifier.harness.build``). Standard library only.
"""

import _signal as signal  # the C module: `signal` would import enum (2.5 ms)
import builtins
import fcntl
import os
import resource
import select
import sys
import time

from .framing import ERR_TAIL

SIGPENDING_MAX = 256  # signals queued at once in a whole jail
PID1 = os.getpid() == 1
# This file, for starting fresh program processes (``--program``). Absolute: the program may
# change the working directory of its own process, never the harness's.
HARNESS_PATH = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""


def kill_all(pids=()):
    """Kill every process of the test. As PID 1 of the namespace: all of them (daemons that
    called setsid included), repeatedly until none is left. Otherwise (unsafe backend): the
    process groups of the children we started."""
    if PID1:
        for _ in range(1000):
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                while True:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
            except ChildProcessError:
                return
            time.sleep(0.0005)
        return
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _limits_in_child(cfg, cpu_s):
    mem = int(cfg["memory_mb"]) * 1024 * 1024
    try:
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    except (ValueError, OSError):
        pass
    cpu = max(1, int(cpu_s + 0.999))
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        new_hard = cpu + 1 if hard == resource.RLIM_INFINITY else min(hard, cpu + 1)
        resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, new_hard), new_hard))
    except (ValueError, OSError):
        pass


def spawn(fd_map, body):
    """Fork a child whose descriptors are exactly ``fd_map`` (target fd -> source fd, None for
    /dev/null), all others closed, default signal handling (``prepare_process``; SIGINT raises
    KeyboardInterrupt), then run ``body()``; the child never returns into the harness."""
    pid = os.fork()
    if pid:
        if not PID1:
            try:
                os.setpgid(pid, pid)
            except OSError:
                pass
        return pid
    try:
        if not PID1:
            os.setpgid(0, 0)
        devnull = os.open("/dev/null", os.O_RDWR) if None in fd_map.values() else -1
        top = max(fd_map) + 1 if fd_map else 3
        # Move sources out of the way first so that dup2 cannot clobber one with another.
        moved = {}
        for target, src in fd_map.items():
            # Above every target, so that no dup2 below can clobber a source not yet used.
            moved[target] = fcntl.fcntl(devnull if src is None else src, fcntl.F_DUPFD, top)
        for target, src in moved.items():
            os.dup2(src, target)
        os.closerange(top, 1 << 16)
        # Every other signal is as prepare_process() left it in the harness: at its default,
        # SIGPIPE ignored (as in any Python program).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        body()
    except:  # noqa: E722 - bare: the program may have rebound BaseException in our globals
        pass
    os._exit(70)


# Audit events a judged program may not raise. A tracing or profiling hook would let it run code
# inside the harness's own frames (between its exception and the "raised" marker, or rewriting
# the harness's locals); ctypes (or its C module alone: a function pointer made from memmove's
# address writes anywhere) would let it rewrite any memory of its process. Audit hooks cannot be
# removed from Python code, and these events are the only ways to install either.
DENIED_EVENTS = frozenset(("sys.settrace", "sys.setprofile"))
DENIED_MODULES = frozenset(("ctypes", "_ctypes", "_testcapi", "_testinternalcapi"))


def deny_in_process_hooks():
    """Install, in a process about to run program code, the audit hook that refuses tracing,
    profiling and ctypes. Tracing raises RuntimeError; ctypes raises ImportError, as if it were
    not installed, so libraries that use it optionally (numpy) import without it."""
    denied, modules = DENIED_EVENTS, DENIED_MODULES

    def audit(event, args):
        if event in denied:
            raise RuntimeError(f"{event} is not available to programs in the judge's sandbox")
        if (event == "import" and args and args[0] in modules) or event[:7] == "ctypes.":
            what = args[0] if event == "import" else event
            raise ImportError(f"{what} is not available to programs in the judge's sandbox")

    sys.addaudithook(audit)


def program_settings(digits):
    """The judging profile's interpreter settings for a process about to run program code:
    ``digits`` is ``sys.set_int_max_str_digits`` (None: Python's default)."""
    if digits:
        sys.set_int_max_str_digits(int(digits))


def run_main_program(code, st, prefix_code=None, exit_ok=False):
    """Body of the child of one stdin/stdout test: run the program as ``__main__`` and write
    on fd ``st`` what ended it: nothing (ran to the end, or SystemExit with status 0), ``X``
    (SystemExit with another status), ``M`` (MemoryError) or ``E`` (any other exception).
    ``prefix_code`` (the judging profile's preamble) runs first in the same namespace;
    ``exit_ok``: a SystemExit of any status ends the program cleanly (LiveCodeBench's judge
    swallows it and compares the output).

    The marker is written by the first instruction after the exception reaches this frame,
    before any code of the program's can run again (its exception's ``__str__``, its hooks),
    with references bound before the program started: the program may replace ``os.write``,
    ``os._exit``, builtins or this module's globals, but not these locals, and it cannot install
    a tracing hook that would reach them (``deny_in_process_hooks``)."""
    write, exit_now, exc_info, kind = os.write, os._exit, sys.exc_info, type
    # The interpreter's own traceback printer (C): what an uncaught exception prints in a fresh
    # interpreter. traceback.print_exc would first import traceback (linecache, tokenize, re,
    # ...): 8-10 ms of CPU in every crashing test's process.
    show_exception = sys.__excepthook__
    SysExit, MemErr, Int = SystemExit, MemoryError, int
    deny_in_process_hooks()
    rc = 0
    g = program_globals("__main__")
    try:
        if prefix_code is not None:
            exec(prefix_code, g)
        exec(code, g)
    except:  # noqa: E722 - bare: no name lookup that the program could have rebound
        exc = exc_info()[1]
        cls = kind(exc)
        if cls is SysExit:
            c = exc.code  # the exact class: a plain member, no property of the program's
            rc = 0 if c is None else (c & 0xFF if kind(c) is Int else 1)
            if exit_ok:
                rc = 0
            marker = b"X" if rc else b""
        elif cls is MemErr:
            rc, marker = 1, b"M"
        else:
            rc, marker = 1, b"E"
        if marker:
            try:
                write(st, marker)
            except:  # noqa: E722 - the marker pipe is gone: never report a clean exit
                exit_now(1)
        if cls is SysExit:
            if kind(exc.code) is not Int and exc.code is not None:
                try:
                    sys.stderr.write(str(exc.code) + "\n")
                except:  # noqa: E722
                    pass
        elif cls is not MemErr:
            try:
                show_exception(cls, exc, exc_info()[2])
            except:  # noqa: E722
                pass
    finish_like_interpreter(rc)


def finish_like_interpreter(rc):
    """What the interpreter does at exit: join non-daemon threads, run atexit hooks, flush."""
    th = sys.modules.get("threading")  # only if the program used it
    if th is not None:
        try:
            th._shutdown()
        except BaseException:
            pass
    # Hooks exist only if the program imported atexit (registering one needs the module), so
    # it is not imported here: that would run the import machinery in every test's process,
    # 0.3 ms of CPU and 100 copy-on-write faults of a fork of the harness (issue 29).
    ae = sys.modules.get("atexit")
    if ae is not None:
        try:
            ae._run_exitfuncs()
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(rc)


def program_globals(name):
    return {
        "__name__": name,
        "__builtins__": builtins,
        "__file__": "solution.py",
        "__doc__": None,
        "__package__": None,
    }


class Watch:
    """Supervise one child: read its stdout (capped), stderr (tail) and marker pipe until it
    exits or the deadline passes."""

    def __init__(self, pid, out_fd, err_fd, st_fd, out_cap):
        self.pid = pid
        self.out_cap = out_cap
        self.out = bytearray()
        self.err = bytearray()
        self.st = bytearray()
        self.fds = {}
        for fd, kind in ((out_fd, "out"), (err_fd, "err"), (st_fd, "st")):
            if fd is not None:
                os.set_blocking(fd, False)
                self.fds[fd] = kind
        self.status = None
        self.over_cap = False
        self.wait_status = None
        self.killed_by_us = False
        self.cpu = 0.0
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def _read(self, fd):
        """Read once from ``fd``: True (read or EOF), None (nothing to read now), False (the
        stdout cap was exceeded)."""
        kind = self.fds[fd]
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return None
        except OSError:
            chunk = b""
        if not chunk:
            del self.fds[fd]
            os.close(fd)
            return True
        if kind == "out":
            room = self.out_cap - len(self.out)
            self.out += chunk[:room]
            if len(chunk) > room:
                self.over_cap = True
                return False
        elif kind == "err":
            self.err += chunk
            if len(self.err) > 2 * ERR_TAIL:
                del self.err[:-ERR_TAIL]
        else:
            if len(self.st) < 64:
                self.st += chunk[: 64 - len(self.st)]
        return True

    def reap(self, block):
        if self.wait_status is not None:
            return True
        try:
            pid, status, ru = os.wait4(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self.wait_status = 0
            return True
        if pid == 0:
            return False
        self.wait_status = status
        self.cpu = ru.ru_utime + ru.ru_stime
        return True

    def run(self, deadline, others=()):
        """Returns "exited", "timeout" or "output_limit". ``others``: extra fds to watch; when
        one becomes readable, returns ("fd", fd)."""
        poller = select.poll()
        for fd in self.fds:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        watch_exit = self.wait_status is None
        if self.pidfd is not None and watch_exit:
            poller.register(self.pidfd, select.POLLIN)
        for fd in others:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            timeout_ms = (
                remaining * 1000
                if (self.pidfd is not None or not watch_exit)
                else min(remaining * 1000, 5)
            )
            events = poller.poll(timeout_ms)
            for fd, _ev in events:
                if fd in others:
                    return ("fd", fd)
                if fd == self.pidfd:
                    poller.unregister(fd)
                    self.reap(True)
                    return "exited"
                if fd in self.fds:
                    if self._read(fd) is False:
                        return "output_limit"
                    if fd not in self.fds:
                        poller.unregister(fd)
            if watch_exit and self.pidfd is None and self.reap(False):
                return "exited"

    def drain(self):
        """After the process tree is dead: read what is left (every writer is gone, so this
        reaches EOF at once)."""
        for fd in list(self.fds):
            try:
                # Stop at EOF, at the cap, or when nothing is there (a writer escaped the kill:
                # possible only without a PID namespace).
                while fd in self.fds and self._read(fd):
                    pass
            except OSError:
                pass
        for fd in list(self.fds):
            os.close(fd)
            del self.fds[fd]
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def kill(self):
        self.killed_by_us = True
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def describe(self, cfg, cpu_limit, how):
        """Summarise the end of the child: status, exit code, signal, markers."""
        st = bytes(self.st)
        rec = {
            "time": None,
            "exit": None,
            "signal": None,
            "raised": any(c in st for c in (b"E", b"M", b"X")),
        }
        ws = self.wait_status
        if ws is not None and os.WIFEXITED(ws):
            rec["exit"] = os.WEXITSTATUS(ws)
        elif ws is not None and os.WIFSIGNALED(ws):
            rec["signal"] = os.WTERMSIG(ws)
        sig = rec["signal"]
        if how == "timeout":
            status = "timeout"
        elif how == "output_limit" or self.over_cap:
            status = "output_limit"
        elif b"M" in st:
            status = "memory"
        # (0.85: the CPU time rusage reports at an RLIMIT_CPU kill runs ~10% short on a loaded
        # host; sandbox/nsjail.py's CPU_LIMIT_SEEN.)
        elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and self.cpu >= 0.85 * cpu_limit):
            status = "timeout"
        elif sig == signal.SIGKILL and not self.killed_by_us and cfg["oom_is_memory"]:
            status = "memory"  # the cgroup OOM killer: nothing else sends SIGKILL unasked
        elif sig is not None:
            status = "signal"
        else:
            status = "exited"
        rec["status"] = status
        return rec
