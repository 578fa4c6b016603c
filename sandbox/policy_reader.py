"""Reading the sandbox policy (sandbox/policy/nsjail.cfg) as data, for everything that does not
hand it to nsjail whole: the docker and unsafe-none backends (its environment and fixed
rlimits) and the forkserver's zygote, which does nsjail's work itself (its mounts, hostname and
working directory, and two things only nsjail knows: the seccomp filter it compiles from the
file, and the cgroup files its cgroup arguments make it write).

Each reader takes the few line shapes the file uses and refuses what it cannot read the same
way every backend would (a line it skipped would be a limit one backend holds and another not).
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "PER_RUN_RLIMITS",
    "POLICY_FILE",
    "cgroup_files",
    "nsjail_seccomp_filter",
    "policy_environment",
    "policy_mounts",
    "policy_rlimits",
    "policy_scalars",
]

POLICY_FILE = Path(__file__).with_name("policy") / "nsjail.cfg"
"""THE sandbox policy (sandbox/README.md). nsjail loads it with ``--config``; the docker backend
reads its fixed rlimits (``policy_rlimits``), so both backends hold the same ones."""

PER_RUN_RLIMITS = ("as", "cpu", "fsize", "nproc")
"""The rlimits that come from :class:`~sandbox.base.SandboxLimits`, per run: on nsjail's command
line (``--rlimit_as/cpu/fsize/nproc``, sandbox/jail_spec.py) and docker's ulimits/cgroups. The
policy file must not state them (nor ``time_limit``): a value there never took effect, the
command line overrides it."""

# The fixed rlimits the policy file may state, and the unit nsjail reads each in (its
# config.proto): the kernel's limit is value x unit. Docker's ulimit of the same name takes the
# kernel's unit (bytes or a count).
_POLICY_RLIMIT_UNITS = {
    "core": 1 << 20,  # MiB
    "nofile": 1,
    "memlock": 1 << 10,  # KiB
    "msgqueue": 1,  # bytes
    "rtprio": 1,
    "stack": 1 << 20,  # MiB
}
_RLIMIT_LINE = re.compile(r"^[ \t]*rlimit_([a-z]+)(_type)?[ \t]*:[ \t]*(\w+)[ \t]*(?:#.*)?$",
                          re.MULTILINE)
_ENVAR_LINE = re.compile(r'^[ \t]*envar[ \t]*:[ \t]*"([A-Za-z_][A-Za-z0-9_]*)=([^"]*)"[ \t]*(?:#.*)?$',
                         re.MULTILINE)
_MOUNT_LINE = re.compile(r'^[ \t]*mount[ \t]*\{(.*)\}[ \t]*(?:#.*)?$', re.MULTILINE)
_FIELD = re.compile(r'(\w+)[ \t]*:[ \t]*("[^"]*"|\w+)')
_SCALAR = re.compile(r'^[ \t]*(hostname|cwd)[ \t]*:[ \t]*"([^"]*)"', re.MULTILINE)
_NSJAIL_CGROUP_FLAGS = {  # nsjail's cgroup arguments (sandbox/cgroups.py) -> what it writes
    "memory": ("--cgroup_mem_mount", "--cgroup_mem_parent",
               {"memory.limit_in_bytes": "{mem}"}),
    "pids": ("--cgroup_pids_mount", "--cgroup_pids_parent", {"pids.max": "{pids}"}),
    "cpu": ("--cgroup_cpu_mount", "--cgroup_cpu_parent",
            {"cpu.cfs_quota_us": "{cpu_quota_us}", "cpu.cfs_period_us": "1000000"}),
}


def policy_rlimits(path: str | os.PathLike = POLICY_FILE) -> dict[str, int]:
    """The fixed rlimits of the policy file, ``{name: kernel value}`` (bytes or a count), named
    as RLIMIT_<NAME> and docker's ulimits are (``nofile``, ``core``, ``memlock``, ...). Lines
    ``rlimit_X_type: ...`` are nsjail's own business and skipped. Raises ValueError on a per-run
    rlimit (``PER_RUN_RLIMITS``) or one whose unit is not known here: a limit stated in the file
    must mean the same thing for every backend."""
    found: dict[str, int] = {}
    for name, is_type, value in _RLIMIT_LINE.findall(Path(path).read_text()):
        if name in PER_RUN_RLIMITS:
            raise ValueError(
                f"{path}: rlimit_{name} is per run (SandboxLimits, on the command line); "
                "the policy file must not state it"
            )
        if name not in _POLICY_RLIMIT_UNITS:
            raise ValueError(f"{path}: rlimit_{name} has no known unit in "
                             "sandbox/policy_reader.py")
        if not is_type:
            found[name] = int(value) * _POLICY_RLIMIT_UNITS[name]
    return found


def policy_environment(path: str | os.PathLike = POLICY_FILE) -> dict[str, str]:
    """The environment the policy file gives a sandboxed program (its ``envar: "K=V"`` lines;
    nsjail passes nothing of the host's, ``keep_env: false``): the docker and unsafe-none
    backends start their programs with the same one."""
    return dict(_ENVAR_LINE.findall(Path(path).read_text()))


def policy_mounts(path: str | os.PathLike) -> list[tuple[str, str, bool, bool]]:
    """The policy file's ``mount { ... }`` lines as (src, dst, rw, mandatory): bind mounts
    only (the zygote makes nothing else; any other kind is refused, naming the line)."""
    found = []
    for body in _MOUNT_LINE.findall(Path(path).read_text()):
        f = {k: v.strip('"') for k, v in _FIELD.findall(body)}
        if f.get("is_bind") != "true" or "src" not in f or "dst" not in f:
            raise ValueError(f"{path}: the forkserver makes bind mounts only: mount {{{body}}}")
        found.append((f["src"], f["dst"], f.get("rw") == "true", f.get("mandatory") != "false"))
    return found


def policy_scalars(path: str | os.PathLike) -> dict[str, str]:
    """The policy file's ``hostname`` and ``cwd``."""
    return dict(_SCALAR.findall(Path(path).read_text()))


def cgroup_files(nsjail_args: list[str]) -> dict[str, dict]:
    """What nsjail's cgroup arguments (sandbox/cgroups.py) make it write for a jail, as the
    zygote's ``cgroups``: ``{controller: {"parent": dir, "files": {name: template}}}`` with
    ``{mem}``, ``{pids}`` and ``{cpu_quota_us}`` for the run's values (the zygote request's
    ``cgroup``, sandbox/jail_spec.py)."""
    arg = {nsjail_args[i]: nsjail_args[i + 1] if i + 1 < len(nsjail_args) else ""
           for i in range(len(nsjail_args)) if nsjail_args[i].startswith("--")}
    if "--use_cgroupv2" in arg:
        files = {"memory.max": "{mem}", "memory.swap.max": arg.get("--cgroup_mem_swap_max", "0"),
                 "pids.max": "{pids}"}
        return {"v2": {"parent": arg["--cgroupv2_mount"], "files": files}}
    out = {}
    for controller, (mount_flag, parent_flag, files) in _NSJAIL_CGROUP_FLAGS.items():
        if mount_flag in arg:
            files = dict(files)
            if controller == "memory" and "--cgroup_mem_memsw_max" in arg:
                files["memory.memsw.limit_in_bytes"] = "{mem}"  # after the limit: never below it
            out[controller] = {"parent": os.path.join(arg[mount_flag], arg[parent_flag]),
                               "files": files}
    return out


_PTRACE_SEIZE, _PTRACE_INTERRUPT, _PTRACE_DETACH = 0x4206, 0x4207, 17
_PTRACE_SECCOMP_GET_FILTER = 0x420C
_WALL = 0x40000000


def nsjail_seccomp_filter(jail_argv: list[str], env: Mapping[str, str]) -> bytes:
    """The classic BPF program that nsjail compiled from the policy file's ``seccomp_string``s,
    read out of a jail it started running ``/bin/sleep`` (``jail_argv``: nsjail's whole command
    line) with ``PTRACE_SECCOMP_GET_FILTER``. Root only; raises OSError when it cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    jail = subprocess.Popen(jail_argv, env=dict(env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while True:  # the jail's process: nsjail's child, once it runs sleep
            try:
                kids = Path(f"/proc/{jail.pid}/task/{jail.pid}/children").read_text().split()
                if kids and os.readlink(f"/proc/{kids[0]}/exe").endswith("/sleep"):
                    pid = int(kids[0])
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or jail.poll() is not None:
                raise OSError("nsjail did not start the jail to read its seccomp filter from")
            time.sleep(0.005)

        def call(req: int, addr: int, data) -> int:
            r = libc.ptrace(req, pid, ctypes.c_void_p(addr), data)
            if r < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"ptrace {req:#x}: {os.strerror(err)}")
            return r

        call(_PTRACE_SEIZE, 0, None)
        call(_PTRACE_INTERRUPT, 0, None)
        os.waitpid(pid, _WALL)
        n = call(_PTRACE_SECCOMP_GET_FILTER, 0, None)
        try:
            call(_PTRACE_SECCOMP_GET_FILTER, 1, None)
            raise OSError("more than one seccomp filter in nsjail's jail")
        except OSError as e:
            if e.errno != 2:  # ENOENT: there is no second one
                raise
        buf = ctypes.create_string_buffer(8 * n)
        if call(_PTRACE_SECCOMP_GET_FILTER, 0, buf) != n:
            raise OSError("PTRACE_SECCOMP_GET_FILTER returned a different length")
        call(_PTRACE_DETACH, 0, None)
        return buf.raw
    finally:
        jail.kill()
        jail.wait()
