"""The host's cgroups, as the nsjail backend uses them: which hierarchy (v2, v1) and which
controllers (memory, pids, cpu) this process can hand to its jails, the nsjail arguments
that put every jail under them, and the choice among them (``choose``: a ``CgroupSetup``).

Each ``*_args`` function prepares the host side (a ``magic-rlvr-sandbox`` cgroup inside this
process's own, so that jails are charged there instead of escaping to the root; empty cgroups
of killed nsjail processes swept) and returns the arguments, with ``{MEM}`` and ``{PIDS}``
standing for the per-run limits, or None when the host does not offer that hierarchy or its
controllers; an OSError says what the host refused. Whether a jail actually starts and is
bounded under them is checked by running one (``choose``'s ``check``: the nsjail backend
runs ``PROBE_PROGRAM`` under the arguments filled with ``PROBE_MEM_BYTES`` and
``PROBE_PIDS``, and ``judge_probe`` reads what it printed).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from .base import JAIL_CPU_MS_PER_SEC, SandboxUnavailable

log = logging.getLogger(__name__)

CGROUP_DIR_NAME = "magic-rlvr-sandbox"

PREFERENCES: tuple[str, ...] = ("auto", "v2", "v1", "off")
"""What a backend may ask for: the first that works of v2 then v1 ("auto"), one of them, or none."""
_ORDER = {"auto": ("v2", "v1"), "v2": ("v2",), "v1": ("v1",), "off": ()}

PROBE_MEM_BYTES = 48 << 20
"""The memory cap of the jail that checks a cgroup setup: its 200 MB allocation must be killed."""
PROBE_PIDS = 8
PROBE_PROGRAM = "print('up', flush=True); b = bytearray(200 << 20); print('alive')"


@dataclass(frozen=True)
class CgroupSetup:
    """The cgroup limits a backend puts its jails under, as ``choose`` found them.

    ``mode``: "v2", "v1" or "off" (rlimits only; "probe" while a setup is being checked);
    ``args``: the nsjail arguments, ``{MEM}`` and ``{PIDS}`` standing for the per-run limits;
    ``note``: why the mode is "off", or what is missing (the CPU cap), for ``describe()``;
    ``cpu_cap``: the jails' CPU cap (JAIL_CPU_MS_PER_SEC) is in force."""

    mode: str = "off"
    args: tuple[str, ...] = ()
    note: str = "not probed yet"
    cpu_cap: bool = False


def probe_args(args: list[str]) -> list[str]:
    """Cgroup arguments with the checking jail's tiny limits (PROBE_MEM_BYTES, PROBE_PIDS)."""
    return [a.replace("{MEM}", str(PROBE_MEM_BYTES)).replace("{PIDS}", str(PROBE_PIDS))
            for a in args]


CgroupCheck = Callable[[list[str]], tuple[bool, str]]
"""Runs a jail under these cgroup arguments (placeholders unfilled): (bounded, why not)."""


def choose(preference: str, check: CgroupCheck) -> CgroupSetup:
    """The first cgroup mode by ``preference`` whose arguments a jail starts and is bounded
    under (``check``), with the CPU cap where the host's cpu controller takes it; else rlimits
    only, refused (SandboxUnavailable) when v1 or v2 was asked for."""
    notes = []
    for mode in _ORDER[preference]:
        try:
            args = v2_args() if mode == "v2" else v1_args()
        except OSError as e:
            notes.append(f"{mode}: {e}")
            continue
        if args is None:
            notes.append(f"{mode}: not available")
            continue
        ok, why = check(args)
        if ok:
            return _with_cpu_cap(CgroupSetup(mode, tuple(args), ""), check)
        notes.append(f"{mode}: {why}")
    note = "; ".join(notes) or "disabled"
    if preference not in ("auto", "off"):
        raise SandboxUnavailable(f"cgroup {preference} requested but unusable: {note}")
    if preference == "auto":
        log.warning(
            "sandbox: no usable cgroup (%s); falling back to rlimits only: total memory of a "
            "jail is bounded by max_procs x memory_mb, not memory_mb",
            note,
        )
    return CgroupSetup("off", (), note)


def _with_cpu_cap(setup: CgroupSetup, check: CgroupCheck) -> CgroupSetup:
    """``setup`` with the CPU cap (JAIL_CPU_MS_PER_SEC) when the host's cpu controller takes
    it; without one the jails keep their memory and pids limits and the cap is reported
    missing (``cpu_cap``, ``note``), never a reason to fail."""
    try:
        extra = cpu_v1_args() if setup.mode == "v1" else None
    except OSError as e:
        return replace(setup, note=f"no CPU cap: {e}")
    if extra is None:
        return replace(setup, note="no CPU cap: no cpu controller to use")
    args = [*setup.args, *extra]
    ok, why = check(args)
    if ok:
        return replace(setup, args=tuple(args), cpu_cap=True)
    return replace(setup, note=f"no CPU cap: {why}")


def judge_probe(stdout: bytes, errors: str) -> tuple[bool, str]:
    """Whether the jail that ran ``PROBE_PROGRAM`` under a setup was bounded by it: it must
    have started (``errors``: what nsjail said when it did not), and its allocation must have
    been killed."""
    if b"up" not in stdout:
        return False, f"jail does not start with cgroup limits ({errors})"
    if b"alive" in stdout:
        return False, "memory limit does not bite"
    return True, ""


def v1_args() -> list[str] | None:
    """The nsjail arguments of cgroup v1 memory+pids limits, None when v1 lacks either."""
    mem_mount, pids_mount = "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids"
    if not (os.path.isfile(f"{mem_mount}/memory.limit_in_bytes") or os.path.isdir(mem_mount)):
        return None
    if not os.path.isdir(pids_mount):
        return None
    mem_rel = _own_cgroup("memory")
    pids_rel = _own_cgroup("pids")
    if mem_rel is None or pids_rel is None:
        return None
    mem_parent = _mk_cgroup(mem_mount, mem_rel)
    pids_parent = _mk_cgroup(pids_mount, pids_rel)
    sweep_stale(os.path.join(mem_mount, mem_parent))
    sweep_stale(os.path.join(pids_mount, pids_parent))
    args = [
        "--cgroup_mem_mount",
        mem_mount,
        "--cgroup_mem_parent",
        mem_parent,
        "--cgroup_mem_max",
        "{MEM}",
        "--cgroup_pids_mount",
        pids_mount,
        "--cgroup_pids_parent",
        pids_parent,
        "--cgroup_pids_max",
        "{PIDS}",
    ]
    if os.path.exists(os.path.join(mem_mount, mem_parent, "memory.memsw.limit_in_bytes")):
        # No escape into swap: memory+swap capped at the same value.
        args += ["--cgroup_mem_memsw_max", "{MEM}"]
    return args


def v2_args() -> list[str] | None:
    """The nsjail arguments of cgroup v2 memory+pids limits in a delegated child of this
    process's cgroup, None when there is no v2 hierarchy or it lacks either controller."""
    root = "/sys/fs/cgroup"
    if not os.path.isfile(f"{root}/cgroup.controllers"):
        return None
    rel = _own_cgroup("")
    if rel is None:
        return None
    own = os.path.join(root, rel.lstrip("/"))
    controllers = open(os.path.join(own, "cgroup.controllers")).read().split()
    if "memory" not in controllers or "pids" not in controllers:
        return None
    # nsjail creates NSJAIL.<pid> under --cgroupv2_mount; give it a delegated child of our
    # own cgroup with the memory and pids controllers enabled. (Writing our own
    # subtree_control fails with EBUSY when this process sits in that cgroup: then cgroup
    # v2 is not usable without moving the server, and we say so.)
    d = os.path.join(own, CGROUP_DIR_NAME)
    os.makedirs(d, exist_ok=True)
    sub = open(os.path.join(own, "cgroup.subtree_control")).read().split()
    if "memory" not in sub or "pids" not in sub:
        with open(os.path.join(own, "cgroup.subtree_control"), "w") as f:
            f.write("+memory +pids")
    with open(os.path.join(d, "cgroup.subtree_control"), "w") as f:
        f.write("+memory +pids")
    sweep_stale(d)
    return [
        "--use_cgroupv2",
        "--cgroupv2_mount",
        d,
        "--cgroup_mem_max",
        "{MEM}",
        "--cgroup_mem_swap_max",
        "0",
        "--cgroup_pids_max",
        "{PIDS}",
    ]


def cpu_v1_args() -> list[str] | None:
    """The nsjail arguments of the jails' CPU cap (JAIL_CPU_MS_PER_SEC) under the cgroup v1
    cpu controller, None when there is none."""
    mount = "/sys/fs/cgroup/cpu"
    if not os.path.isfile(os.path.join(mount, "cpu.cfs_quota_us")):
        return None
    rel = _own_cgroup("cpu")
    if rel is None:
        return None
    parent = _mk_cgroup(mount, rel)
    sweep_stale(os.path.join(mount, parent))
    return ["--cgroup_cpu_mount", mount, "--cgroup_cpu_parent", parent,
            "--cgroup_cpu_ms_per_sec", str(JAIL_CPU_MS_PER_SEC)]


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path for ``controller`` ("" = the v2 unified hierarchy)."""
    try:
        for line in open("/proc/self/cgroup"):
            hid, ctrls, path = line.rstrip("\n").split(":", 2)
            names = ctrls.split(",") if ctrls else [""]
            if controller in names and (controller or hid == "0"):
                return path
    except OSError:
        return None
    return None


def _mk_cgroup(mount: str, own_rel: str) -> str:
    """Create ``<our cgroup>/magic-rlvr-sandbox`` and return it relative to ``mount``: jails
    are then charged inside our own cgroup instead of escaping to the root."""
    rel = os.path.join(own_rel.strip("/"), CGROUP_DIR_NAME).strip("/")
    os.makedirs(os.path.join(mount, rel), exist_ok=True)
    return rel


def sweep_stale(parent: str) -> None:
    """Remove empty NSJAIL.<pid> cgroups left behind by nsjail processes that were killed."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for n in names:
        if n.startswith("NSJAIL."):
            pid = n.split(".", 1)[1]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                try:
                    os.rmdir(os.path.join(parent, n))
                except OSError:
                    pass
