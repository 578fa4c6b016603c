"""What the verifier reads of a sandbox (``Sandbox.memory_accounting``, ``packages_path``,
``capacity``, ``starts``), how ``create_sandbox`` chooses the way jails start
(``sandbox.plan_jails``), and the nsjail backend's cgroup choice and self-test checks
(sandbox/cgroups.py, sandbox/self_test.py), without starting a jail."""

from __future__ import annotations

import os

import pytest

from sandbox import (JailCapacity, JailRequest, JailStarts, RunResult, Sandbox, SandboxUnavailable,
                     PreloadedEntry, create_sandbox, plan_jails)
from sandbox import cgroups, self_test, warm

ENTRY = PreloadedEntry(("judge.pyc",), b"")
ROOT = os.geteuid() == 0


@pytest.mark.parametrize("kind", ["docker", "unsafe-none"])
def test_every_backend_says_what_the_verifier_reads(kind):
    sb = create_sandbox(kind, self_test=False)
    assert isinstance(sb, Sandbox)
    assert sb.memory_accounting == ("jail" if kind == "docker" else "process")
    assert sb.packages_path is None
    assert sb.capacity.shortfall(10_000) is None  # no bound of their own
    assert sb.starts == JailStarts()


def test_the_plan_picks_forkserver_pre_started_or_cold_jails():
    auto = JailRequest(at_once=3, forkserver="auto", entry=ENTRY)
    assert plan_jails("nsjail", auto) == (JailStarts(forkserver=True) if ROOT
                                          else JailStarts(warm_per_key=3))
    assert plan_jails("nsjail", JailRequest(at_once=3, forkserver="auto")) == \
        JailStarts(warm_per_key=3)  # nothing to serve: no forkserver
    assert plan_jails("nsjail", JailRequest(at_once=3, forkserver="off", warm=0)) == JailStarts()
    assert plan_jails("nsjail", JailRequest(at_once=3, forkserver="auto", warm=1,
                                            entry=ENTRY)) == JailStarts(warm_per_key=1)
    assert plan_jails("docker", auto) == JailStarts()
    with pytest.raises(ValueError, match="0 or more"):
        plan_jails("nsjail", JailRequest(warm=-1))
    with pytest.raises(ValueError, match="--sandbox nsjail"):
        plan_jails("docker", JailRequest(forkserver="on", entry=ENTRY))
    with pytest.raises(ValueError, match="--warm-jails"):
        plan_jails("nsjail", JailRequest(forkserver="on", warm=2, entry=ENTRY))
    with pytest.raises(ValueError, match="auto, on or off"):
        plan_jails("nsjail", JailRequest(forkserver="sometimes"))  # type: ignore[arg-type]


def test_create_sandbox_takes_the_request_or_the_options_not_both():
    sb = create_sandbox("nsjail", self_test=False, jails=JailRequest(at_once=2, warm=None))
    assert sb.starts == JailStarts(warm_per_key=2)
    assert sb.capacity.waiting == 2 * warm.MAX_KEYS or sb.capacity.jails is None  # single uid
    with pytest.raises(ValueError, match="not both"):
        create_sandbox("nsjail", self_test=False, jails=JailRequest(), warm=1)


def test_capacity_says_what_does_not_fit():
    cap = JailCapacity(jails=10, waiting=8, waiting_note="2 pre-started jails for each of 4",
                       bound="the pool's 10 uids")
    assert cap.shortfall(2) is None
    assert cap.shortfall(3) == "3 plus 2 pre-started jails for each of 4 exceeds the pool's 10 uids"
    assert JailCapacity(jails=2, bound="b").shortfall(3) == "3 exceeds b"


def test_cgroup_choice_by_preference(monkeypatch):
    monkeypatch.setattr(cgroups, "v2_args", lambda: None)
    monkeypatch.setattr(cgroups, "v1_args", lambda: ["--mem", "{MEM}"])
    monkeypatch.setattr(cgroups, "cpu_v1_args", lambda: ["--cpu"])
    checked = []

    def check(args):
        checked.append(args)
        return True, ""

    got = cgroups.choose("auto", check)
    assert (got.mode, got.args, got.cpu_cap, got.note) == ("v1", ("--mem", "{MEM}", "--cpu"),
                                                          True, "")
    assert checked == [["--mem", "{MEM}"], ["--mem", "{MEM}", "--cpu"]]
    # A CPU cap the jail does not start under is reported, never a reason to fail.
    got = cgroups.choose("v1", lambda a: (a[-1] != "--cpu", "no"))
    assert (got.mode, got.cpu_cap, got.note) == ("v1", False, "no CPU cap: no")
    # Nothing bounded: rlimits only, refused when v1 or v2 was asked for.
    assert cgroups.choose("auto", lambda a: (False, "bites not")).mode == "off"
    with pytest.raises(SandboxUnavailable, match="cgroup v1 requested but unusable"):
        cgroups.choose("v1", lambda a: (False, "bites not"))
    assert cgroups.choose("off", check) == cgroups.CgroupSetup("off", (), "disabled")
    assert cgroups.probe_args(["{MEM}", "{PIDS}"]) == [str(cgroups.PROBE_MEM_BYTES),
                                                       str(cgroups.PROBE_PIDS)]
    assert cgroups.judge_probe(b"up\n", "") == (True, "")
    assert cgroups.judge_probe(b"up\nalive\n", "")[1] == "memory limit does not bite"
    assert "does not start" in cgroups.judge_probe(b"", "[E] no")[1]


def test_self_test_report_names_each_problem():
    good = {"uid": 65534, "gid": 65534, "pid": 1, "etc": False, "proj": False,
            "root_rw": False, "tmp_rw": True, "net": False}
    self_test.check_report(RunResult("ok", exit_code=0, stdout=repr(good).encode()),
                           uid=65534, gid=65534)
    bad = dict(good, pid=7, net=True, root_rw=True)
    with pytest.raises(SandboxUnavailable, match="no PID namespace; the root is writable; "
                                                 "the network is reachable"):
        self_test.check_report(RunResult("ok", exit_code=0, stdout=repr(bad).encode()),
                               uid=65534, gid=65534)
    with pytest.raises(SandboxUnavailable, match="cannot start a jail"):
        self_test.check_report(RunResult("error", detail="x"), uid=65534, gid=65534)
    with pytest.raises(SandboxUnavailable, match="binary not found"):
        self_test.check_host(binary="/nonexistent", config="", python="", packages_dir=None,
                             host_ro=[], uid=65534)
