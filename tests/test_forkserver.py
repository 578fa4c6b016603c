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
    nsjail_sandbox,
    respond,
)
from sandbox import SandboxLimits, create_sandbox
from sandbox.forkserver import WarmEntry, cgroup_files, policy_mounts
from sandbox.base import POLICY_FILE
from verifier.code_score import score_code
from verifier.harness import harness_source
from verifier.harness_files import HARNESS_FILE, HARNESS_PYC
from verifier.items import Limits, Status

ONE = {"inputs": ["5\n"], "outputs": ["25\n"]}


def judge(sb, code: str, gt=ONE, **limits):
    limits.setdefault("test_timeout_s", 3)
    return score_code(respond(code), gt, Limits(**limits), sb)


def test_the_zygotes_jail_is_nsjails(forkserver_sandbox):
    """benchmarks/jail_probe.py run exec'd in a zygote's jail and in nsjail's sees the same:
    ids, PID, hostname, cwd, environment, umask, root and /dev, every rlimit, descriptors,
    blocked signals, no_new_privs, dumpability, writable paths and the errno of 29 syscalls
    (the policy's seccomp filter and the missing capabilities)."""
    sb = forkserver_sandbox
    argv = [sb.python, "-I", "-S", "-c", (PROJECT_ROOT / "benchmarks/jail_probe.py").read_text()]
    lim = SandboxLimits(wall_s=20, cpu_s=10)
    cold, forked = sb.run(argv, limits=lim), sb.run_forked(argv, limits=lim)
    assert (cold.status, cold.exit_code) == ("ok", 0), cold
    assert (forked.status, forked.exit_code) == ("ok", 0), forked
    want, got = json.loads(cold.stdout), json.loads(forked.stdout)
    assert want["syscalls"]["ptrace"] == "Operation not permitted"  # the probe works
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
    sb = create_sandbox("nsjail", forkserver=WarmEntry((HARNESS_PYC, HARNESS_FILE),
                                                       harness_source()))
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

    def dead_jail_cgroups() -> set[str]:
        """NSJAIL.<pid> cgroups whose process is gone (another verifier's running jails on
        this machine have live pids)."""
        return {f"{p}/{n}" for p in parents for n in os.listdir(p)
                if n.startswith("NSJAIL.") and not os.path.exists(f"/proc/{n.split('.')[1]}")}

    before = dead_jail_cgroups()
    for _ in range(5):
        assert judge(sb, SUM_OK, SUM_GT).status is Status.CORRECT
    deadline = time.monotonic() + 5
    while (left := dead_jail_cgroups() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left


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
                       forkserver=WarmEntry((HARNESS_PYC,), b""))


KILLED_VERIFIER = r"""
import sys, threading, time
sys.path.insert(0, sys.argv[1])
from sandbox import create_sandbox
from sandbox.forkserver import WarmEntry
from verifier.code_score import score_code
from verifier.harness import harness_source
from verifier.harness_files import HARNESS_FILE, HARNESS_PYC
from verifier.items import Limits
sb = create_sandbox("nsjail", forkserver=WarmEntry((HARNESS_PYC, HARNESS_FILE), harness_source()))
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

