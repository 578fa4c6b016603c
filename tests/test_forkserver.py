"""The forkserver (sandbox/forkserver.py, sandbox/zygote.py; issue 29): its jails are nsjail's,
and what the samples forked from one zygote share carries nothing from one sample to the next
and gives no way into the zygote. Real nsjail and a real zygote; every attack of
tests/test_code_score_attacks.py also runs on a forkserver sandbox (``after_attack``)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import pytest

from tests.conftest_sandbox import (  # noqa: F401
    PROJECT_ROOT,
    SUM_GT,
    SUM_OK,
    forkserver_sandbox,
    new_forkserver_sandbox,
    nsjail_sandbox,
    respond,
)
from sandbox import SandboxLimits, create_sandbox
from sandbox.forkserver import PLACEMENT_VIEW, PreloadedEntry
from sandbox.policy_reader import POLICY_FILE, cgroup_files, policy_mounts
from verifier.scoring.code_score import score_code
from verifier.harness import harness_source
from verifier.scoring.harness_files import HARNESS_FILE, HARNESS_PYC
from verifier.config import ScoringConfig
from verifier.items import Item, Limits, Status
from verifier.scoring.scorer import Scorer, use_forkserver

ONE = {"inputs": ["5\n"], "outputs": ["25\n"]}


def judge(sb, code: str, gt=ONE, **limits):
    limits.setdefault("test_timeout_s", 3)
    return score_code(respond(code), gt, Limits(**limits), sb)


PROBE_FILES = {"in.txt": b"5\n", "in.bin": bytes(range(256))}
STRICTER = os.ST_NOSUID | os.ST_NODEV
"""The mount flags a forked jail may have where nsjail's has not (sandbox/README.md)."""


def test_the_zygotes_jail_is_nsjails(forkserver_sandbox):
    """tests/jail_probe.py run exec'd in a zygote's jail and in nsjail's sees the same:
    ids, PID, session and process group (and setsid/setpgid's answers), hostname, cwd,
    environment, umask, root and /dev, every rlimit, descriptors, blocked signals,
    no_new_privs, dumpability, each mount's flags (and the scratch's size and inodes), the
    input files' modes, writable paths and the errno of 29 syscalls (the policy's seccomp filter
    and the missing capabilities). Two differences, both in sandbox/README.md: the CPU
    placement (PLACEMENT_VIEW: one CPU of nsjail's in the forked jail, and neither can change
    it), and mount flags that are stricter in the forked jail (nosuid and nodev where nsjail's
    have neither, never one flag fewer)."""
    sb = forkserver_sandbox
    argv = [sb.python, "-I", "-S", "-c", (PROJECT_ROOT / "tests/jail_probe.py").read_text()]
    lim = SandboxLimits(wall_s=20, cpu_s=10)
    cold = sb.run(argv, files=PROBE_FILES, limits=lim)
    forked = sb.run_forked(argv, files=PROBE_FILES, limits=lim)
    assert (cold.status, cold.exit_code) == ("ok", 0), cold
    assert (forked.status, forked.exit_code) == ("ok", 0), forked
    want, got = json.loads(cold.stdout), json.loads(forked.stdout)
    assert want["syscalls"]["ptrace"] == "Operation not permitted"  # the probe works
    assert want["session"] == [1, 1, 1], want["session"]  # the jail's own session (setsid)
    assert want["sched_setaffinity"] == "Operation not permitted", want
    assert want["files"]["/tmp/in.bin"][3] == 256, want["files"]  # the input files are there
    placed = {k: got.pop(k) for k in PLACEMENT_VIEW}
    every = {k: want.pop(k) for k in PLACEMENT_VIEW}
    assert len(placed["affinity"]) == 1 and set(placed["affinity"]) <= set(every["affinity"])
    assert placed["cpu_count"] == 1 and every["cpu_count"] == len(every["affinity"])
    forked_mounts, nsjail_mounts = got.pop("mounts"), want.pop("mounts")
    assert forked_mounts.keys() == nsjail_mounts.keys()
    for path, flags in nsjail_mounts.items():
        mine = forked_mounts[path]
        if isinstance(flags, list):  # /tmp: [flags, block size, blocks, inodes]
            assert mine[1:] == flags[1:], (path, mine, flags)
            mine, flags = mine[0], flags[0]
        assert mine & flags == flags, f"{path}: forked {mine:#x} lacks a flag of nsjail's {flags:#x}"
        assert mine & ~STRICTER == flags & ~STRICTER, (path, mine, flags)
    assert got == want


INTROSPECT = r"""
import os, sys, zlib
def d(x):
    return format(zlib.crc32(repr(x).encode()), "08x")
fds = []
for fd in range(256):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
import __main__
main_names = sorted(k for k in vars(__main__) if not k.startswith("__"))
print("m=" + d(sorted(m for m in sys.modules if m != "zlib")),
      "a=" + d((sys.argv, sys.orig_argv, sys.executable, sys.path, tuple(sys.flags))),
      "e=" + d((sorted(os.environ.items()), os.getcwd(), os.getpid(), os.getppid(), os.umask(0))),
      "f=" + d(fds), "g=" + d(main_names))
"""


def _seen(sb) -> str:
    o = judge(sb, INTROSPECT)
    m = re.search(r"got '(m=\w+ a=\w+ e=\w+ f=\w+ g=\w+)", o.detail)
    assert o.status is Status.INCORRECT and m, o
    return m.group(1)


def test_a_program_sees_a_fresh_harness_process(forkserver_sandbox, nsjail_sandbox):
    """A program judged in a forked jail sees what it sees in a fresh nsjail jail: the same
    modules (none of the zygote's: no ctypes, json or socket imported ahead of it), argv and
    interpreter flags, environment, cwd and PIDs, descriptors, and ``__main__`` (the harness,
    not the zygote)."""
    assert _seen(forkserver_sandbox) == _seen(nsjail_sandbox)
    o = judge(forkserver_sandbox, "import sys\nprint(25 if 'ctypes' in sys.modules else 0)")
    assert o.status is Status.INCORRECT, o
    o = judge(forkserver_sandbox, "import ctypes\nprint(25)")
    assert o.status is Status.RUNTIME_ERROR and "ImportError" in o.detail, o


# A program that looks for what the zygote left in its memory: ctypes's types among every
# class (object.__subclasses__(), recursively), ctypes or _jailsys modules among every object
# the garbage collector tracks and in every frame's globals up the stack; a _jailsys it finds
# must refuse every call. It prints the square only when it finds nothing usable.
ZYGOTE_PROBE = r"""
import gc, sys
found = []
seen, stack = set(), [object]
while stack:
    c = stack.pop()
    if id(c) in seen:
        continue
    seen.add(id(c))
    if "ctypes" in (getattr(c, "__module__", "") or ""):
        found.append("type " + c.__module__ + "." + c.__name__)
    try:
        stack.extend(type.__subclasses__(c))
    except TypeError:
        pass
calls = (("unshare", (0,)), ("set_pdeathsig", (0,)), ("set_dumpable", (True,)),
         ("drop_capabilities", ()), ("set_no_new_privs", ()), ("umount2", ("/tmp", 2)),
         ("setns", (0, 0)))
def look(o, where):
    name = getattr(o, "__name__", "")
    if type(o) is not type(sys) or name not in ("ctypes", "_ctypes", "_jailsys"):
        return
    if name != "_jailsys":
        found.append(where + " module " + name)
        return
    for fn, args in calls:
        try:
            getattr(o, fn)(*args)
            found.append(where + " _jailsys." + fn + " ran")
        except PermissionError:
            pass
for o in gc.get_objects():
    look(o, "gc")
try:
    f = sys._getframe()
except Exception:
    f = None
while f is not None:
    for v in list(f.f_globals.values()) + list(f.f_locals.values()):
        look(v, "frame")
    f = f.f_back
if found:
    raise SystemExit("found: " + ", ".join(sorted(set(found))[:6]))
print(int(input()) ** 2)
"""


def test_a_program_finds_nothing_of_the_zygotes_machinery(forkserver_sandbox, nsjail_sandbox):
    """The weakness of the first forkserver (a program reached the zygote's ctypes through
    stack frames or ``object.__subclasses__()``, and read and wrote its process's memory) is
    gone: the zygote never loads ctypes, and the one module of its own that makes system
    calls, _jailsys, is sealed in every jail (each call raises PermissionError). The same probe
    passes in a fresh nsjail jail."""
    for sb in (nsjail_sandbox, forkserver_sandbox):
        o = judge(sb, ZYGOTE_PROBE)
        assert o.status is Status.CORRECT, (sb.describe(), o)


def test_jailsys_refuses_every_call_once_sealed_and_in_its_forks(tmp_path):
    """sandbox/jailsys.c on its own (no root): before seal() a harmless call works; after it,
    every call refuses, in the process and in a child forked after; is_sealed says so."""
    import subprocess
    import sys

    from sandbox.forkserver import build_jailsys

    path = build_jailsys(sys.executable, str(tmp_path))
    assert os.listdir(tmp_path) == [os.path.basename(path)]  # the build leaves nothing else
    code = f"""
import os, sys
sys.path.insert(0, {str(PROJECT_ROOT / "sandbox")!r})
import zygote
js = zygote.load_jailsys({path!r})
js.set_dumpable(True)  # allowed to anyone, before the seal
assert not js.is_sealed()
js.seal()
refused = 0
for fn, args in (("set_dumpable", (True,)), ("unshare", (0,)), ("set_pdeathsig", (9,)),
                 ("mount", (None, "/x", None, 0, None)), ("umount2", ("/x", 0)),
                 ("pivot_root", ("/a", "/b")), ("drop_capabilities", ()),
                 ("set_no_new_privs", ()), ("seccomp_load", (bytes(8),)), ("setns", (0, 0))):
    try:
        getattr(js, fn)(*args)
    except PermissionError:
        refused += 1
pid = os.fork()
if pid == 0:
    try:
        js.set_dumpable(True)
        os._exit(1)
    except PermissionError:
        os._exit(0)
_, status = os.waitpid(pid, 0)
print(refused, js.is_sealed(), os.waitstatus_to_exitcode(status))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["10", "True", "0"], out.stderr[-2000:]


def test_a_prebuilt_jailsys_named_by_the_environment_is_used(tmp_path, monkeypatch):
    """$MAGIC_SANDBOX_JAILSYS names a prebuilt module (for a machine without a compiler): it is
    used as it is (no compiler is run: $CC is one that cannot exist), a forkserver sandbox
    judges with it, and a name that is not a module, or one that is not there, is refused by
    name."""
    import shutil

    from sandbox.forkserver import JAILSYS_ENV, build_jailsys
    from sandbox.nsjail import default_python

    python = default_python()  # the jails' interpreter, which the module is built for
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    prebuilt = tmp_path / "_jailsys.so"
    shutil.copy(build_jailsys(python, str(tmp_path / "a")), prebuilt)
    monkeypatch.setenv(JAILSYS_ENV, str(prebuilt))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    out = build_jailsys(python, str(tmp_path / "b"))
    assert os.path.basename(out) == "_jailsys.so"
    assert open(out, "rb").read() == prebuilt.read_bytes()
    sb = new_forkserver_sandbox()
    try:
        assert judge(sb, SUM_OK, SUM_GT).status is Status.CORRECT
    finally:
        sb.close()
    for bad, why in ((tmp_path / "jailsys.txt", "not a _jailsys"),
                     (tmp_path / "gone" / "_jailsys.so", "cannot read it")):
        monkeypatch.setenv(JAILSYS_ENV, str(bad))
        with pytest.raises(OSError, match=f"{JAILSYS_ENV}=.*{why}"):
            build_jailsys(python, str(tmp_path / "b"))


def test_the_service_forks_its_jails_by_default_as_root():
    """``--forkserver auto`` (the default) is on for nsjail run as root, unless pre-started
    jails are asked for; "on" that cannot be is refused, naming why; a real Scorer at the
    default settings judges through a zygote."""
    assert ScoringConfig().forkserver == "auto"
    assert use_forkserver(ScoringConfig()) is (os.geteuid() == 0)
    assert not use_forkserver(ScoringConfig(warm_jails=2))
    assert not use_forkserver(ScoringConfig(sandbox="docker"))
    assert not use_forkserver(ScoringConfig(forkserver="off"))
    with pytest.raises(ValueError, match="--sandbox nsjail"):
        use_forkserver(ScoringConfig(forkserver="on", sandbox="docker"))
    with pytest.raises(ValueError, match="--warm-jails"):
        use_forkserver(ScoringConfig(forkserver="on", warm_jails=1))
    scorer = Scorer(ScoringConfig(workers=1))
    try:
        assert scorer.sandbox.forkserver is not None and scorer.warm_per_key == 0
        assert "forked from a zygote" in scorer.sandbox.describe()
        item = Item(id="s", domain="code", response=respond(SUM_OK), ground_truth=SUM_GT)
        [res] = scorer.score([item])
        assert res.status is Status.CORRECT, res
        assert scorer.sandbox.forkserver.zygote_pid() is not None
    finally:
        scorer.close()


def test_a_sample_sees_nothing_of_the_one_before(forkserver_sandbox):
    """Sample 1 leaves a file in its scratch, a process that called setsid, and an environment
    variable; sample 2 (the next fork of the same zygote) finds none of them."""
    sb = forkserver_sandbox
    leave = ("import os\nopen('/tmp/left-behind', 'w').write('x')\n"
             "os.environ['LEFT'] = '1'\n"
             "if os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(30)\n"
             "print(int(input()) ** 2)")
    assert judge(sb, leave).status is Status.CORRECT
    look = ("import os\n"
            "seen = os.path.exists('/tmp/left-behind') or 'LEFT' in os.environ\n"
            "try:\n    os.kill(-1, 0)\n    seen = True\nexcept ProcessLookupError:\n    pass\n"
            "print(int(input()) ** 2 if not seen else 0)")
    assert judge(sb, look).status is Status.CORRECT


def test_a_sample_cannot_reach_the_zygote(forkserver_sandbox):
    """The zygote (root, outside the jail's PID namespace) cannot be signalled, traced or seen
    from a sample, even by its host pid, and lives on."""
    sb = forkserver_sandbox
    assert judge(sb, SUM_OK, SUM_GT).status is Status.CORRECT  # the zygote is up
    zpid = sb.forkserver.zygote_pid()
    assert zpid
    code = (f"import os, signal\nhit = 0\n"
            f"for sig in (signal.SIGKILL, signal.SIGSTOP, 0):\n"
            f"    try:\n        os.kill({zpid}, sig)\n        hit += 1\n"
            f"    except OSError:\n        pass\n"
            f"hit += os.path.exists('/proc/{zpid}')\n"
            f"print(int(input()) ** 2 if hit == 0 else 0)")
    assert judge(sb, code).status is Status.CORRECT
    assert sb.forkserver.zygote_pid() == zpid


def test_a_dead_zygote_is_replaced(forkserver_sandbox):
    """A zygote killed from outside costs nothing: the next sample starts a new one and is
    judged right."""
    sb = forkserver_sandbox
    assert judge(sb, SUM_OK, SUM_GT).status is Status.CORRECT
    started, zpid = sb.forkserver.started, sb.forkserver.zygote_pid()
    os.kill(zpid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while sb.forkserver.zygote_pid() == zpid and time.monotonic() < deadline:
        time.sleep(0.01)
    o = judge(sb, SUM_OK, SUM_GT)
    assert o.status is Status.CORRECT, o
    assert sb.forkserver.started == started + 1


def test_a_crashing_jail_costs_only_itself(forkserver_sandbox):
    """A program that segfaults, and one that tries to kill its jail's PID 1 (the harness;
    the kernel drops signals to a namespace's init that it has no handler for), leave the
    zygote serving the next sample right."""
    sb = forkserver_sandbox
    o = judge(sb, "import faulthandler\nfaulthandler._sigsegv()")
    assert o.status is Status.RUNTIME_ERROR and "signal 11" in o.detail.lower() or \
        "sigsegv" in o.detail.lower(), o
    o = judge(sb, "import os, signal\nos.kill(1, signal.SIGKILL)\nprint(int(input()) ** 2)")
    assert o.status is Status.CORRECT, o
    assert judge(sb, SUM_OK, SUM_GT).status is Status.CORRECT


def test_close_cancels_forked_runs_promptly():
    """close() during a forked run kills its jail: the run returns at once, cancelled, and the
    zygote is gone."""
    sb = new_forkserver_sandbox()
    try:
        assert judge(sb, SUM_OK, SUM_GT).status is Status.CORRECT
        zpid = sb.forkserver.zygote_pid()
        got = {}
        t = threading.Thread(target=lambda: got.update(o=judge(
            sb, "import time\ntime.sleep(60)", test_timeout_s=60)))
        t.start()
        time.sleep(1.0)
        t0 = time.monotonic()
        sb.close()
        t.join(15)
        assert not t.is_alive() and time.monotonic() - t0 < 10
        assert got["o"].status is Status.SANDBOX_ERROR, got
        assert not os.path.exists(f"/proc/{zpid}") or \
            open(f"/proc/{zpid}/stat").read().split()[2] == "Z"
    finally:
        sb.close()


def test_no_cgroup_is_left(forkserver_sandbox):
    """Every run's cgroups (NSJAIL.<pid> under the sandbox's parents) are removed after it."""
    sb = forkserver_sandbox
    parents = [c["parent"] for c in cgroup_files(sb._cgroup_args).values()]
    assert parents or sb.cgroup_mode == "off"

    def jail_cgroups() -> set[str]:
        return {f"{p}/{n}" for p in parents for n in os.listdir(p) if n.startswith("NSJAIL.")}

    def dead(names: set[str]) -> set[str]:
        """Those whose process is gone (another verifier's running jails have live pids)."""
        return {n for n in names if not os.path.exists(f"/proc/{n.rsplit('.', 1)[1]}")}

    # Every jail cgroup there before, live or not: one of an earlier test's jails that was
    # still ending (a live pid then) is not this run's when it ends during it. (A CI run
    # counted two such as this run's when only the dead ones were noted before.)
    before = jail_cgroups()
    for _ in range(5):
        assert judge(sb, SUM_OK, SUM_GT).status is Status.CORRECT
    deadline = time.monotonic() + 5
    while (left := dead(jail_cgroups() - before)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left


def test_a_closed_forkserver_leaves_no_cgroup_of_its_killed_jails(forkserver_sandbox):
    """Closing the sandbox while a jail runs: the zygote kills it and removes its cgroups
    before it exits (or, killed itself, the sandbox sweeps them): none is left."""
    sb = forkserver_sandbox
    parents = [c["parent"] for c in cgroup_files(sb._cgroup_args).values()]
    before = {f"{p}/{n}" for p in parents for n in os.listdir(p) if n.startswith("NSJAIL.")}
    t = threading.Thread(target=judge, args=(sb, "import time\ntime.sleep(60)"),
                         kwargs={"test_timeout_s": 60})
    t.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(
            n.startswith("NSJAIL.") and f"{p}/{n}" not in before
            for p in parents for n in os.listdir(p)):
        time.sleep(0.05)
    time.sleep(0.5)
    sb.close()
    t.join(15)
    assert not t.is_alive()
    left = {f"{p}/{n}" for p in parents for n in os.listdir(p) if n.startswith("NSJAIL.")}
    # Only those whose jail is gone: another verifier's running jails on this machine (a test
    # suite beside this one) have live pids and are not ours.
    assert not {n for n in left - before if not os.path.exists(f"/proc/{n.rsplit('.', 1)[1]}")}


def test_the_policy_is_read_as_data():
    """The zygote's mounts come from the policy file; a mount it cannot make is refused by
    name, not skipped."""
    mounts = policy_mounts(POLICY_FILE)
    assert ("/usr", "/usr", False, True) in mounts and ("/dev/null", "/dev/null", True, True) in mounts
    bad = PROJECT_ROOT / "tests" / ".policy-with-tmpfs.cfg"
    bad.write_text('mount { dst: "/x" fstype: "tmpfs" rw: true }\n')
    try:
        with pytest.raises(ValueError, match="bind mounts only"):
            policy_mounts(bad)
    finally:
        bad.unlink()


def test_forkserver_and_warm_jails_are_exclusive():
    with pytest.raises(ValueError, match="warm=0"):
        create_sandbox("nsjail", self_test=False, warm=1,
                       forkserver=PreloadedEntry((HARNESS_PYC,), b""))


KILLED_VERIFIER = r"""
import sys, threading, time
sys.path.insert(0, sys.argv[1])
from sandbox import create_sandbox
from sandbox.forkserver import PreloadedEntry
from verifier.scoring.code_score import score_code
from verifier.harness import harness_source
from verifier.scoring.harness_files import HARNESS_FILE, HARNESS_PYC
from verifier.items import Limits
sb = create_sandbox("nsjail", forkserver=PreloadedEntry((HARNESS_PYC, HARNESS_FILE), harness_source()))
code = "```python\nimport time\ntime.sleep(120)\n```"
threading.Thread(target=lambda: score_code(code, {"inputs": ["1\n"], "outputs": ["1\n"]},
                                           Limits(test_timeout_s=120), sb), daemon=True).start()
time.sleep(1.5)
print(sb.forkserver.zygote_pid(), flush=True)
time.sleep(600)
"""


def test_a_killed_verifier_leaves_no_jail():
    """SIGKILL the verifier while a forked jail runs (a program sleeping 120 s): the zygote
    sees its socket close, kills its jails' parents, whose jails die with them, and exits.
    Nothing of a sandbox uid is left, nothing waits for the jail's own deadline."""
    import subprocess
    import sys

    from tests.conftest_sandbox import assert_no_leftovers, sandbox_pids

    baseline = sandbox_pids()
    proc = subprocess.Popen([sys.executable, "-c", KILLED_VERIFIER, str(PROJECT_ROOT)],
                            stdout=subprocess.PIPE, text=True)
    try:
        zpid = int(proc.stdout.readline())
        assert sandbox_pids() - baseline, "the jail is not running"
        proc.kill()
        proc.wait()
        assert_no_leftovers(baseline, timeout=8)
        deadline = time.monotonic() + 8
        while os.path.exists(f"/proc/{zpid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{zpid}")
    finally:
        proc.kill()
        proc.wait()



def test_a_reaped_jails_uid_is_handed_out_again_without_a_proc_scan(monkeypatch):
    """A forked jail's end is reported after the zygote reaped its PID 1, which the kernel
    reaps only after every other process of its PID namespace: then no process of its uid is
    left, even of a program that left a daemon behind, and the pool hands the uid out again
    without scanning /proc for it (a scan is 2 ms of the judge's CPU). With a pool of one uid,
    every run after the first reuses it at once."""
    from sandbox import uidpool
    from sandbox.nsjail import NsjailSandbox

    uid = 1_900_600_000 + (os.getpid() % 100_000) * 8
    scans = []
    real_scan = uidpool.uids_in_use
    monkeypatch.setattr(uidpool, "uids_in_use", lambda lo, hi: scans.append((lo, hi)) or
                        real_scan(lo, hi))
    sb = NsjailSandbox(uids=f"{uid}:1", forkserver=PreloadedEntry((HARNESS_PYC, HARNESS_FILE),
                                                             harness_source()))
    try:
        sb.self_test()
        daemon = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
                  "print(int(input()) ** 2)")
        assert judge(sb, daemon).status is Status.CORRECT
        first = len(scans)  # the first lease of the uid is verified by a scan
        for _ in range(3):
            assert judge(sb, daemon).status is Status.CORRECT
            assert not real_scan(uid, uid)  # nothing of it left once its run returned
        assert len(scans) == first, scans
    finally:
        sb.close()


def _direct_run(sb, request_changes: dict, wall_s: float, argv: list[str]):
    """One run sent to the zygote as the sandbox would send it, but with ``request_changes``
    applied and the verifier's own deadline at ``wall_s``."""
    from sandbox import forkserver as forkserver_mod

    uid = sb.uid_pool.acquire(10)
    try:
        request = forkserver_mod.run_request(uid, argv, [], SandboxLimits(wall_s=1, cpu_s=30),
                                             exec_argv=True, cgroup_headroom_mb=256)
        request.update(request_changes)
        for k in [k for k, v in request_changes.items() if v is None]:
            del request[k]
        return sb.forkserver.run(request, stdin=b"", wall_s=wall_s, output_bytes=1 << 20)
    finally:
        sb.uid_pool.release(uid)


@pytest.fixture()
def own_forkserver_sandbox():
    """A forkserver sandbox of this test's own (the module's is closed by an earlier test)."""
    sb = new_forkserver_sandbox()
    yield sb
    sb.close()


def test_the_zygotes_backstop_kills_a_jail_the_verifier_does_not(own_forkserver_sandbox):
    """nsjail's --time_limit: a jail still running a second past its run's deadline is killed
    by the zygote itself, whatever the verifier does (here it would wait 60 s)."""
    sb = own_forkserver_sandbox
    assert judge(sb, SUM_OK, SUM_GT).status is Status.CORRECT  # the zygote is up
    start = time.monotonic()
    out = _direct_run(sb, {"backstop_s": 1}, 60,
                      [sb.python, "-I", "-S", "-c", "import time\ntime.sleep(50)"])
    assert out.returncode == -signal.SIGKILL, out
    assert time.monotonic() - start < 20
    assert judge(sb, SUM_OK, SUM_GT).status is Status.CORRECT


def test_a_bad_request_costs_only_itself(own_forkserver_sandbox):
    """A request the zygote cannot read (no backstop) is refused with a reason on its report
    socket; the zygote serves the next run."""
    sb = own_forkserver_sandbox
    assert judge(sb, SUM_OK, SUM_GT).status is Status.CORRECT
    zpid = sb.forkserver.zygote_pid()
    out = _direct_run(sb, {"backstop_s": None}, 10, [sb.python, "-I", "-S", "-c", "pass"])
    assert out.spawn_error and "bad request" in out.spawn_error, out
    assert judge(sb, SUM_OK, SUM_GT).status is Status.CORRECT
    assert sb.forkserver.zygote_pid() == zpid


WARM_PROBE = r"""
import marshal, resource, sys
code, source = marshal.loads(bytes.fromhex(sys.argv[1]))
warm = type(lambda: 0)(code, {"compile": compile, "WARM_UP_SOURCE": source})
if sys.argv[2] == "warm":
    warm()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
compile("a, b = map(int, input().split())\nprint(a * b)\n", "solution.py", "exec")
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_the_zygote_builds_the_compilers_lazy_state_for_every_run():
    """A process's first ``compile()`` builds the AST node types (1.3 ms of a run's PID 1, where
    each page it writes is a copy-on-write fault). The zygote's warm_interpreter() builds them
    once, so a run compiles its program without that work. Run in a fresh interpreter whose
    only compile is the measured one (the function comes marshalled, not compiled there)."""
    import marshal
    import subprocess
    import sys

    from sandbox import zygote

    arg = marshal.dumps((zygote.warm_interpreter.__code__, zygote.WARM_UP_SOURCE)).hex()

    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-I", "-S", "-c", WARM_PROBE, arg, mode],
                             capture_output=True, text=True, timeout=60, check=True)
        return int(out.stdout)

    cold, warm = faults("cold"), faults("warm")
    assert cold >= 20, f"a cold first compile took only {cold} page faults: nothing to warm"
    assert warm <= 5, f"after warm_interpreter() a compile still took {warm} page faults"


SIGNALS_PROBE = r"""
import signal
for name in ("SIGTERM", "SIGCHLD", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGINT", "SIGPIPE"):
    h = signal.getsignal(getattr(signal, name))
    print(name, "KeyboardInterrupt" if h is signal.default_int_handler else int(h))
"""
FRESH_DISPOSITIONS = "".join(f"{name} 0\n" for name in (
    "SIGTERM", "SIGCHLD", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM"))
FRESH_DISPOSITIONS += "SIGINT KeyboardInterrupt\nSIGPIPE 1\n"


@pytest.mark.parametrize("kind", ["forkserver", "nsjail"])
def test_a_program_starts_with_a_fresh_interpreters_signal_dispositions(kind):
    """Whatever the verifier ignored when it started the zygote (or nsjail), a program finds
    every signal at its default as a fresh interpreter does, SIGINT raising KeyboardInterrupt and
    SIGPIPE ignored: the harness sets them once per process (prepare_process, in the zygote for
    all its runs), and each test's process inherits them."""
    ignored = (signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
    old = {s: signal.signal(s, signal.SIG_IGN) for s in ignored}
    try:
        if kind == "forkserver":
            sb = new_forkserver_sandbox()
        else:
            sb = create_sandbox("nsjail", warm=0)
        try:
            gt = {"inputs": ["", ""], "outputs": [FRESH_DISPOSITIONS] * 2}
            out = judge(sb, SIGNALS_PROBE, gt)
        finally:
            sb.close()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    assert out.status is Status.CORRECT, out


AFFINITY_PROBE = r"""
import os, time
print(sorted(os.sched_getaffinity(0)))
time.sleep(1.5)  # the other jail starts meanwhile, even on a loaded machine
try:
    os.sched_setaffinity(0, range(64))  # a program cannot undo its placement
    print(sorted(os.sched_getaffinity(0)))
except PermissionError:
    print("refused", sorted(os.sched_getaffinity(0)))
"""


def _affinities_of_jails_at_once(sb, n: int) -> list[tuple[list[int], str]]:
    """Run ``n`` jails of AFFINITY_PROBE at once: each one's (affinity, what widening did)."""
    assert judge(sb, SUM_OK, SUM_GT).status is Status.CORRECT  # the zygote is up
    seen: list[str] = []

    def run() -> None:
        argv = [sb.python, "-I", "-S", "-c", AFFINITY_PROBE]
        r = _direct_run(sb, {"backstop_s": 10}, 20, argv)
        seen.append(r.stdout.decode())

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == n and all(len(out.splitlines()) == 2 for out in seen), seen
    return [(json.loads(out.splitlines()[0]), out.splitlines()[1]) for out in seen]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to place jails on")
def test_jails_running_at_once_are_placed_on_different_cpus(own_forkserver_sandbox):
    """The zygote runs each jail on a CPU no other running jail has (Zygote.place): a jail's
    processes hand over to each other on one CPU, and two jails at once do not share one while
    another idles. A program cannot undo it (the policy refuses sched_setaffinity)."""
    got = _affinities_of_jails_at_once(own_forkserver_sandbox, 2)
    cpus = [c for c, _ in got]
    assert all(len(c) == 1 for c in cpus), got
    assert cpus[0] != cpus[1], f"two jails at once were both placed on CPU {cpus[0]}"
    assert all(after == f"refused {c}" for c, after in got), got


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell placed jails")
def test_jails_beyond_the_cpus_are_not_placed(own_forkserver_sandbox):
    """With more jails at once than CPUs (``--code-concurrency`` above the cores), each CPU
    holds one placed jail and the others run anywhere: two pinned to one CPU would share it
    while another idled, and the scheduler balances the unplaced ones."""
    every = sorted(os.sched_getaffinity(0))
    got = _affinities_of_jails_at_once(own_forkserver_sandbox, len(every) + 1)
    placed = [c[0] for c, _ in got if len(c) == 1]
    assert sorted(placed) == every, got
    assert [c for c, _ in got if len(c) != 1] == [every], got
