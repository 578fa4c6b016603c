"""Every per-run setting of one jail, computed once from its ``SandboxLimits`` (:class:`JailSpec`),
and its two renderings: nsjail's command-line options (``nsjail_args``, ``nsjail_cgroup_args``;
``NsjailSandbox._command``) and the forkserver zygote's request (``zygote_request``;
``forkserver.run_request``). A jail forked from the zygote is nsjail's jail, so both must say
the same thing: tests/test_jail_spec.py renders both from random limits and compares them
setting by setting.

Units: the spec holds what the kernel enforces (bytes, seconds, counts). nsjail reads some of its
options in other units (``NSJAIL_RLIMIT_UNITS``); the zygote sets the kernel's values itself.
The request's keys are declared by the zygote, which reads it (sandbox/zygote.py ``REQUEST``)
and refuses one that does not match before it forks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .base import JAIL_CPU_MS_PER_SEC, SandboxLimits, ceil_s
from .policy_reader import PER_RUN_RLIMITS

__all__ = ["CGROUP_HEADROOM_MB", "NSJAIL_RLIMIT_UNITS", "JailSpec"]

CGROUP_HEADROOM_MB = 256
"""Memory a jail may use besides the program's own limit (the judge's harness and evaluator
processes; the scratch tmpfs, whose pages count as memory, is added separately)."""

NSJAIL_RLIMIT_UNITS = {"as": 1 << 20, "cpu": 1, "fsize": 1 << 20, "nproc": 1}
"""The unit nsjail reads each per-run ``--rlimit_X`` in (its config.proto: MiB, seconds, a
count): the kernel's limit is the option's value x unit."""


@dataclass(frozen=True)
class JailSpec:
    """The per-run settings of one jail, in the kernel's units.

    - ``backstop_s``: whole seconds after which the jail is killed whatever the caller does
      (nsjail's ``--time_limit``, the zygote's backstop); the precise deadline is the caller's.
    - ``rlimit_as``, ``rlimit_fsize`` (bytes), ``rlimit_cpu`` (seconds), ``rlimit_nproc``:
      the per-run rlimits (``policy_reader.PER_RUN_RLIMITS``), soft = hard.
    - ``scratch_bytes``, ``scratch_files``: size and inodes of the ``/tmp`` tmpfs.
    - ``cgroup_mem`` (bytes), ``cgroup_pids``, ``cgroup_cpu_quota_us`` (per second of wall
      time): the jail's cgroup limits, where cgroups are in force.
    """

    backstop_s: int
    rlimit_as: int
    rlimit_cpu: int
    rlimit_fsize: int
    rlimit_nproc: int
    scratch_bytes: int
    scratch_files: int
    cgroup_mem: int
    cgroup_pids: int
    cgroup_cpu_quota_us: int

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"JailSpec.{f.name} must be a positive integer, got {v!r}")
        # Why: nsjail takes these in MiB; a value that is not a whole number of them would
        # silently be a different limit on nsjail's side than on the zygote's.
        for name, unit in NSJAIL_RLIMIT_UNITS.items():
            v = getattr(self, f"rlimit_{name}")
            if v % unit:
                raise ValueError(f"JailSpec.rlimit_{name}={v} is not a whole number of "
                                 f"nsjail's unit ({unit})")

    @classmethod
    def of(cls, lim: SandboxLimits, *, cgroup_headroom_mb: int = CGROUP_HEADROOM_MB) -> JailSpec:
        """The jail of a run under ``lim`` (``cgroup_headroom_mb``: see CGROUP_HEADROOM_MB)."""
        return cls(
            # nsjail's --time_limit is whole seconds: one past the caller's precise deadline.
            backstop_s=ceil_s(lim.wall_s) + 1,
            rlimit_as=lim.memory_mb << 20,
            rlimit_cpu=ceil_s(lim.cpu_s),
            rlimit_fsize=lim.file_size_mb << 20,
            rlimit_nproc=lim.max_procs,
            scratch_bytes=lim.scratch_mb << 20,
            scratch_files=lim.scratch_files,
            # The scratch tmpfs's pages are charged to the jail's memory cgroup too.
            cgroup_mem=(lim.memory_mb + lim.scratch_mb + cgroup_headroom_mb) << 20,
            cgroup_pids=lim.max_procs,
            cgroup_cpu_quota_us=JAIL_CPU_MS_PER_SEC * 1000,
        )

    def rlimits(self) -> dict[str, int]:
        """The per-run rlimits, ``{name: kernel value}`` in ``PER_RUN_RLIMITS``' order."""
        return {name: getattr(self, f"rlimit_{name}") for name in PER_RUN_RLIMITS}

    @property
    def scratch_options(self) -> str:
        """The ``/tmp`` tmpfs's mount data (nsjail's ``-m none:/tmp:tmpfs:<this>``)."""
        return f"size={self.scratch_bytes},nr_inodes={self.scratch_files}"

    def cgroup_values(self) -> dict[str, int]:
        """The values of the zygote's cgroup file templates (``policy_reader.cgroup_files``)."""
        return {"mem": self.cgroup_mem, "pids": self.cgroup_pids,
                "cpu_quota_us": self.cgroup_cpu_quota_us}

    # -- nsjail ------------------------------------------------------------------------------

    def nsjail_time_limit(self, idle_s: float = 0.0) -> int:
        """nsjail's ``--time_limit``: the backstop, plus, for a pre-started jail, its wait for
        the sample (at most ``idle_s``). Why ``ceil_s``: it rounds 0 up to 1, so a jail started
        for its run gets one second more than the zygote's backstop; kept as it always was (a
        backstop only: the caller's deadline comes first either way)."""
        return self.backstop_s + ceil_s(idle_s)

    def nsjail_args(self, idle_s: float = 0.0) -> list[str]:
        """nsjail's per-run options: ``--time_limit``, ``--rlimit_as/cpu/fsize/nproc`` and the
        scratch tmpfs (cgroups apart: ``nsjail_cgroup_args``)."""
        args = ["--time_limit", str(self.nsjail_time_limit(idle_s))]
        for name, value in self.rlimits().items():
            args += [f"--rlimit_{name}", str(value // NSJAIL_RLIMIT_UNITS[name])]
        return args + ["-m", f"none:/tmp:tmpfs:{self.scratch_options}"]

    def nsjail_cgroup_args(self, templates: list[str]) -> list[str]:
        """nsjail's cgroup arguments (sandbox/cgroups.py) with this jail's ``{MEM}`` and
        ``{PIDS}``. (The CPU quota is fixed there: ``--cgroup_cpu_ms_per_sec``.)"""
        return [a.replace("{MEM}", str(self.cgroup_mem)).replace("{PIDS}", str(self.cgroup_pids))
                for a in templates]

    # -- the zygote --------------------------------------------------------------------------

    def zygote_request(self, uid: int, argv: list[str], staged: list[tuple[str, str]], *,
                       exec_argv: bool) -> dict:
        """The zygote's request for one run (its keys: sandbox/zygote.py ``REQUEST``): the
        outside ``uid``, the harness's file name (``argv[-1]``), ``argv`` itself when it is to
        be exec'd (``exec_argv``; else the zygote's loaded harness runs), the staged input
        files as (staged name, name in /tmp), and this spec."""
        return {
            "uid": uid,
            "entry": argv[-1],
            "argv": list(argv) if exec_argv else None,
            "files": staged,
            "backstop_s": self.backstop_s,
            "rlimits": self.rlimits(),
            "scratch": self.scratch_options,
            "cgroup": self.cgroup_values(),
        }
