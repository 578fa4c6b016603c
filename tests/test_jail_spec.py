"""One jail spec, two renderings (sandbox/jail_spec.py): nsjail's command line and the forkserver
zygote's request are rendered from the same ``JailSpec``, and must say the same thing setting by
setting (backstop, rlimits, scratch tmpfs, cgroup files), for any limits. The request's keys are
the zygote's (sandbox/zygote.py ``REQUEST``), and a request with a key missing or unknown is
refused before the zygote forks, with a one-line error naming the key."""

from __future__ import annotations

import functools
import math
import string
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox import SandboxLimits
from sandbox import zygote
from sandbox.base import JAIL_CPU_MS_PER_SEC, ceil_s
from sandbox.forkserver import run_request, run_result
from sandbox.jail_spec import CGROUP_HEADROOM_MB, JailSpec
from sandbox.nsjail import NsjailSandbox
from sandbox.policy_reader import PER_RUN_RLIMITS, cgroup_files
from tests.conftest_sandbox import PROJECT_ROOT, new_forkserver_sandbox

UID = 1900000007
ARGV = ["/usr/bin/python3", "-I", "-S", "judge_harness.pyc"]
# nsjail's units for its per-run rlimit options (its config.proto), stated here apart from
# sandbox/jail_spec.py so that a wrong unit there shows as a disagreement.
NSJAIL_UNIT = {"as": 1 << 20, "cpu": 1, "fsize": 1 << 20, "nproc": 1}

# nsjail's cgroup arguments as sandbox/cgroups.py makes them (paths made up): v1 with the
# memory+swap cap and the CPU cap, v1 bare, and v2.
CGROUP_TEMPLATES = {
    "v1": ["--cgroup_mem_mount", "/sys/fs/cgroup/memory", "--cgroup_mem_parent", "m/sb",
           "--cgroup_mem_max", "{MEM}", "--cgroup_pids_mount", "/sys/fs/cgroup/pids",
           "--cgroup_pids_parent", "p/sb", "--cgroup_pids_max", "{PIDS}",
           "--cgroup_mem_memsw_max", "{MEM}",
           "--cgroup_cpu_mount", "/sys/fs/cgroup/cpu", "--cgroup_cpu_parent", "c/sb",
           "--cgroup_cpu_ms_per_sec", str(JAIL_CPU_MS_PER_SEC)],
    "v1-bare": ["--cgroup_mem_mount", "/sys/fs/cgroup/memory", "--cgroup_mem_parent", "m/sb",
                "--cgroup_mem_max", "{MEM}", "--cgroup_pids_mount", "/sys/fs/cgroup/pids",
                "--cgroup_pids_parent", "p/sb", "--cgroup_pids_max", "{PIDS}"],
    "v2": ["--use_cgroupv2", "--cgroupv2_mount", "/sys/fs/cgroup/x/sb", "--cgroup_mem_max",
           "{MEM}", "--cgroup_mem_swap_max", "0", "--cgroup_pids_max", "{PIDS}"],
}

limits = st.builds(
    SandboxLimits,
    wall_s=st.floats(min_value=0.001, max_value=3600, allow_nan=False),
    cpu_s=st.floats(min_value=0.001, max_value=3600, allow_nan=False),
    memory_mb=st.integers(1, 1 << 16),
    max_procs=st.integers(1, 4096),
    file_size_mb=st.integers(1, 1 << 14),
    scratch_mb=st.integers(1, 1 << 14),
    scratch_files=st.integers(1, 1 << 20),
)


@functools.cache
def cold_sandbox() -> NsjailSandbox:
    """A sandbox whose command lines are rendered (none is run: no self-test)."""
    return NsjailSandbox(cgroup="off", uids="single")


def options(cmd: list[str]) -> dict[str, str]:
    """nsjail's ``--opt value`` pairs before ``--`` (``-m`` kept for the /tmp mount only)."""
    cmd = cmd[:cmd.index("--")]
    out = {}
    for i, a in enumerate(cmd):
        if a == "-m" and cmd[i + 1].startswith("none:/tmp:tmpfs:"):
            out["-m /tmp"] = cmd[i + 1].removeprefix("none:/tmp:tmpfs:")
        elif a.startswith("--") and i + 1 < len(cmd) and not cmd[i + 1].startswith("-"):
            out[a] = cmd[i + 1]
    return out


def nsjail_writes(args: list[str]) -> dict[str, str]:
    """The cgroup files nsjail writes for a jail, from its (rendered) cgroup arguments."""
    o = options(args + ["--"])
    if "--use_cgroupv2" in args:
        return {"memory.max": o["--cgroup_mem_max"], "memory.swap.max": o["--cgroup_mem_swap_max"],
                "pids.max": o["--cgroup_pids_max"]}
    out = {"memory.limit_in_bytes": o["--cgroup_mem_max"], "pids.max": o["--cgroup_pids_max"]}
    if "--cgroup_mem_memsw_max" in o:
        out["memory.memsw.limit_in_bytes"] = o["--cgroup_mem_memsw_max"]
    if "--cgroup_cpu_ms_per_sec" in o:
        out["cpu.cfs_quota_us"] = str(int(o["--cgroup_cpu_ms_per_sec"]) * 1000)
        out["cpu.cfs_period_us"] = "1000000"
    return out


def zygote_writes(templates: list[str], request: dict) -> dict[str, str]:
    """The cgroup files the zygote writes for a run of ``request`` (sandbox/zygote.py start)."""
    out = {}
    for controller in cgroup_files(templates).values():
        out.update({f: t.format(**request["cgroup"]) for f, t in controller["files"].items()})
    return out


@settings(max_examples=300, deadline=None)
@given(lim=limits, exec_argv=st.booleans())
def test_nsjails_command_line_and_the_zygotes_request_agree(lim, exec_argv):
    cmd = cold_sandbox()._command(list(ARGV), lim, [], UID)
    req = run_request(UID, ARGV, [], lim, exec_argv=exec_argv)
    zygote.check_request(req)  # the zygote would read it
    opts = options(cmd)
    # The backstop: whole seconds past the caller's deadline. nsjail's adds ceil_s(idle_s) (a
    # pre-started jail's wait; 1 s for a jail started for its run, JailSpec.nsjail_time_limit).
    assert req["backstop_s"] >= lim.wall_s + 1
    assert int(opts["--time_limit"]) == req["backstop_s"] + ceil_s(0.0)
    # The per-run rlimits, in the kernel's units, from their SandboxLimits fields.
    nsjail_rlimits = {o.removeprefix("--rlimit_"): int(v) * NSJAIL_UNIT[o.removeprefix("--rlimit_")]
                      for o, v in opts.items() if o.startswith("--rlimit_")}
    assert nsjail_rlimits == req["rlimits"] == {
        "as": lim.memory_mb << 20, "cpu": math.ceil(lim.cpu_s), "fsize": lim.file_size_mb << 20,
        "nproc": lim.max_procs}
    assert tuple(req["rlimits"]) == PER_RUN_RLIMITS == tuple(zygote.RUN_RLIMITS)
    # The scratch tmpfs: the same mount data on both sides.
    assert opts["-m /tmp"] == req["scratch"] == (
        f"size={lim.scratch_mb << 20},nr_inodes={lim.scratch_files}")
    # The cgroup files each side writes, under each kind of cgroup arguments.
    spec = JailSpec.of(lim)
    for templates in CGROUP_TEMPLATES.values():
        assert nsjail_writes(spec.nsjail_cgroup_args(templates)) == zygote_writes(templates, req)
    assert req["cgroup"]["mem"] == (lim.memory_mb + lim.scratch_mb + CGROUP_HEADROOM_MB) << 20
    # What is not a limit.
    assert req["uid"] == UID and req["entry"] == ARGV[-1] and req["files"] == []
    assert req["argv"] == (ARGV if exec_argv else None)


@settings(max_examples=50, deadline=None)
@given(lim=limits, idle_s=st.floats(min_value=0, max_value=600, allow_nan=False))
def test_a_pre_started_jails_time_limit_covers_its_wait(lim, idle_s):
    cmd = cold_sandbox()._command(list(ARGV), lim, [], UID, idle_s=idle_s)
    backstop = run_request(UID, ARGV, [], lim, exec_argv=True)["backstop_s"]
    assert int(options(cmd)["--time_limit"]) == backstop + ceil_s(idle_s) >= backstop + idle_s


def test_the_cgroup_values_are_the_templates_fields():
    """Every field of the zygote's cgroup file templates is a value of the request, and none
    is left unused."""
    fields = {name for templates in CGROUP_TEMPLATES.values()
              for c in cgroup_files(templates).values() for t in c["files"].values()
              for _, name, _, _ in string.Formatter().parse(t) if name}
    assert fields == set(zygote.REQUEST["cgroup"]) == set(JailSpec.of(SandboxLimits()).cgroup_values())


def test_a_spec_nsjail_cannot_say_is_refused():
    spec = JailSpec.of(SandboxLimits())
    with pytest.raises(ValueError, match=r"^JailSpec.rlimit_as=1048577 is not a whole number"):
        JailSpec(**{**spec.__dict__, "rlimit_as": (1 << 20) + 1})
    with pytest.raises(ValueError, match=r"^JailSpec.cgroup_pids must be a positive integer"):
        JailSpec(**{**spec.__dict__, "cgroup_pids": 0})


def _bad_requests():
    """(how the request is spoiled, the key the zygote must name)."""
    out = []
    for key, keys in zygote.REQUEST.items():
        out.append((("del", key), f"missing key {key!r}"))
        for sub in keys:
            out.append((("del", key, sub), f"missing key {key + '.' + sub!r}"))
        if keys:
            out.append((("add", key, "bogus"), f"unknown key {key + '.bogus'!r}"))
    out.append((("add", "bogus"), "unknown key 'bogus'"))
    return out


def _spoil(req: dict, how: tuple) -> dict:
    op, *path = how
    target = req
    for p in path[:-1]:
        target = target[p]
    if op == "del":
        del target[path[-1]]
    else:
        target[path[-1]] = 1
    return req


@pytest.mark.parametrize("how, error", _bad_requests(), ids=lambda v: "-".join(map(str, v))
                         if isinstance(v, tuple) else None)
def test_the_zygote_refuses_a_missing_or_unknown_key(how, error):
    req = _spoil(run_request(UID, ARGV, [], SandboxLimits(), exec_argv=False), how)
    with pytest.raises(ValueError) as e:
        zygote.check_request(req)
    assert str(e.value) == error


def test_the_zygote_refuses_a_request_that_is_not_a_dict_where_one_is_due():
    req = run_request(UID, ARGV, [], SandboxLimits(), exec_argv=False)
    with pytest.raises(ValueError, match=r"^rlimits is not a dict but a int$"):
        zygote.check_request({**req, "rlimits": 3})
    with pytest.raises(ValueError, match=r"^the request is not a dict but a list$"):
        zygote.check_request([req])


def test_the_zygote_still_stands_alone():
    """The zygote runs as ``python3 -I -S sandbox/zygote.py`` with nothing of the project
    importable: its request check is its own."""
    code = (f"import sys; sys.path.insert(0, {str(PROJECT_ROOT / 'sandbox')!r}); import zygote\n"
            "try:\n    zygote.check_request({'uid': 1})\nexcept ValueError as e:\n    print(e)\n"
            "print(sorted(m for m in sys.modules if m in ('sandbox', 'dataclasses', 'json')))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.splitlines() == ["missing key 'entry'", "[]"]


@pytest.fixture(scope="module")
def forked():
    """A forkserver sandbox of this module's own (real nsjail, a real zygote)."""
    sb = new_forkserver_sandbox()
    yield sb
    sb.close()


@pytest.mark.parametrize("how, error", [(("del", "backstop_s"), "missing key 'backstop_s'"),
                                        (("del", "rlimits", "as"), "missing key 'rlimits.as'"),
                                        (("add", "cgroup", "bogus"), "unknown key 'cgroup.bogus'"),
                                        (("add", "bogus"), "unknown key 'bogus'")])
def test_a_bad_request_is_refused_before_the_fork_and_said_to_the_caller(forked, how, error):
    """The refusal reaches the caller as every zygote error does (the run's spawn error, its
    RunResult's detail, one line); no jail is forked for it and the zygote serves on."""
    sb = forked
    good = sb.run_forked([sb.python, "-I", "-S", "-c", "print(6 * 7)"])
    assert good.status == "ok" and good.stdout == b"42\n", good
    zpid = sb.forkserver.zygote_pid()
    lim = SandboxLimits(wall_s=5)
    uid = sb.uid_pool.acquire(10) if sb.uid_pool else 65534
    try:
        req = _spoil(run_request(uid, [sb.python, "-I", "-S", "-c", "print(1)"], [], lim,
                                 exec_argv=True), how)
        out = sb.forkserver.run(req, stdin=b"", wall_s=5, output_bytes=1 << 20)
    finally:
        if sb.uid_pool:
            sb.uid_pool.release(uid)
    assert out.spawn_error == f"forkserver: bad request: {error}", out
    assert out.returncode is None and not out.stdout  # nothing ran
    res = run_result(out, lim, sb._signal_status)
    assert res.status == "error" and res.detail == f"forkserver: bad request: {error}"
    assert sb.forkserver.zygote_pid() == zpid
    again = sb.run_forked([sb.python, "-I", "-S", "-c", "print(6 * 7)"])
    assert again.status == "ok" and again.stdout == b"42\n", again
