"""unsafe-none backend: NO ISOLATION. For development on machines without nsjail or Docker.

The program runs as the verifier's own user, sees the host's files and network, and a daemon it
starts with setsid can outlive the run. Only rlimits (CPU, address space, file size, processes)
and the wall deadline apply, and the scratch directory has no size cap. The factory logs a loud
warning; ``verifier serve`` allows it (``--sandbox unsafe-none``) on a loopback address only.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from collections.abc import Mapping

from . import scratch
from .base import (
    CLOSED,
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
from .policy_reader import policy_environment, policy_rlimits
from .process import RunningProcesses, output_stop, run_process

WORK_DIR_PREFIX = "magic-unsafe-"
"""A run's work directory: ``<tmp>/<prefix><pid>-<random>``, owned by its verifier process
(sandbox/scratch.py)."""
WARNING = (
    "UNSAFE SANDBOX: model-written programs run WITHOUT ISOLATION (host files, network, "
    "processes are all reachable). Development only; never expose this verifier."
)


class UnsafeSandbox:
    name = "unsafe-none"
    isolated = False
    packages_path: str | None = None  # whatever the host's interpreter imports
    memory_accounting: MemoryAccounting = "process"  # rlimits only: a SIGKILL is just a signal
    capacity = JailCapacity()
    starts = JailStarts()  # a process per run, started when the run arrives

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable
        self._running = RunningProcesses()
        scratch.sweep_dead(WORK_DIR_PREFIX)  # left by verifier processes that were killed

    def describe(self) -> str:
        return f"unsafe-none: NO ISOLATION, rlimits only; python {self.python}"

    def self_test(self) -> None:
        res = self.run(
            [self.python, "-I", "-S", "-c", "print('ok')"], limits=SandboxLimits(wall_s=20)
        )
        if res.status != "ok" or res.stdout.strip() != b"ok":
            raise SandboxUnavailable(
                f"cannot run {self.python}: {res.status} {res.detail} {res.stderr[-300:]!r}"
            )

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
        try:
            owned = scratch.OwnedDir(WORK_DIR_PREFIX)
        except OSError as e:
            return RunResult("error", detail=f"cannot create a work directory: {e}")
        work = owned.path
        try:
            for name, data in files.items():
                path = os.path.join(work, check_file_name(name))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            cpu = ceil_s(lim.cpu_s)
            mem = lim.memory_mb * 1024 * 1024
            fsize = lim.file_size_mb * 1024 * 1024

            # The policy file's fixed rlimits (core, nofile, ...), read here, before the fork.
            fixed = [(getattr(resource, f"RLIMIT_{name.upper()}"), v)
                     for name, v in policy_rlimits().items()]

            def limit() -> None:  # runs in the child between fork and exec
                resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
                resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
                for which, value in fixed:
                    resource.setrlimit(which, (value, value))

            out = run_process(
                list(argv),
                stdin=stdin,
                wall_s=lim.wall_s,
                output_bytes=lim.output_bytes,
                on_stdout=on_stdout,
                # The policy's environment, but HOME and TMPDIR: here the scratch is a host
                # directory, not the jail's /tmp.
                env={**policy_environment(), "HOME": work, "TMPDIR": work},
                cwd=work,
                preexec_fn=limit,
                running=self._running,
            )
        except (OSError, ValueError) as e:
            return RunResult("error", detail=str(e))
        finally:
            owned.remove()
        res = RunResult(
            status="ok",
            stdout=out.stdout,
            stderr=out.stderr,
            wall_s=out.wall_s,
            cpu_s=out.cpu_s,
            peak_memory_mb=round(out.maxrss_kb / 1024, 1) if out.maxrss_kb else None,
            stdout_truncated=out.stdout_truncated,
            stderr_truncated=out.stderr_truncated,
        )
        rc = out.returncode
        if out.spawn_error:
            res.status, res.detail = "error", out.spawn_error
        elif out.cancelled:
            res.status, res.detail = "error", CLOSED
        elif (stop := output_stop(out.hook_error, out.stopped, out.output_exceeded,
                                  lim.output_bytes)) is not None:
            res.status, res.detail = stop
        elif out.timed_out:
            res.status, res.detail = "timeout", f"wall time over {lim.wall_s:g} s"
        elif rc is not None and rc < 0:
            res.signal = -rc
            if -rc == signal.SIGXCPU:
                res.status, res.detail = "timeout", "CPU time limit"
            else:
                res.status, res.detail = "signal", f"killed by signal {-rc}"
        else:
            res.exit_code = rc
        return res

    def close(self) -> None:
        """Kill the runs still in progress and refuse later ones (see base.Sandbox.close)."""
        self._running.close()
