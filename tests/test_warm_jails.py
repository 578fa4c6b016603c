"""Pre-started jails (sandbox/warm.py): each sample still gets a fresh jail of its own.

A jail started before its sample arrives must be exactly what a cold start gives: nothing of an
earlier sample (scratch files, processes, signals, environment, working directory) reaches it,
it runs with the same limits, a jail that died or waited too long is never used, and closing
the sandbox leaves no process behind. Real nsjail jails throughout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from sandbox import SandboxLimits, create_sandbox
from sandbox.warm import WarmJails
from tests.conftest_sandbox import (  # noqa: F401 (fixtures)
    SUM_GT,
    SUM_OK,
    WARM_SANDBOXES,
    assert_no_leftovers,
    nsjail_sandbox,
    respond,
    sandbox_pids,
)
from verifier.scoring.code_score import score_code
from verifier.items import Limits, Status
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

# One command for every sample (so they share a key, as a judge's harness does); the sample's
# own code comes on stdin, as the judge's payload does.
RUN_STDIN = "import sys; exec(sys.stdin.read())"

PROBE = r"""
import os, signal, sys
mark = sys.argv[-1] if len(sys.argv) > 1 else ""
seen_files = sorted(os.listdir("/tmp"))
# Every pid this jail can signal (its own namespace): only itself (PID 1) when fresh.
alive = []
for pid in range(2, 400):
    try:
        os.kill(pid, 0)
        alive.append(pid)
    except ProcessLookupError:
        pass
    except PermissionError:
        alive.append(pid)
print(repr({"pid": os.getpid(), "files": seen_files, "alive": alive, "cwd": os.getcwd(),
            "env": sorted(k for k in os.environ if k.startswith("LEFT_")), "uid": os.getuid()}))
# Leave traces for the next sample: a file, an environment variable in a child, a process.
open("/tmp/left-by-earlier-sample", "w").write("x")
os.environ["LEFT_BY_EARLIER"] = "1"
os.chdir("/tmp")
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import time
    time.sleep(60)
    os._exit(0)
sys.stdout.flush()
"""


@pytest.fixture
def warm_sb():
    sb = create_sandbox("nsjail", warm=2)
    WARM_SANDBOXES.append(sb)
    yield sb
    WARM_SANDBOXES.remove(sb)
    sb.close()


def _run(sb, code: str, **limits):
    return sb.run([sb.python, "-I", "-S", "-c", RUN_STDIN], stdin=code.encode(),
                  limits=SandboxLimits(wall_s=20, cpu_s=10, **limits))


def _wait_ready(sb, n: int = 1, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while sb.warm_jails.ready_count() < n:
        assert time.monotonic() < deadline, "no pre-started jail became ready"
        time.sleep(0.02)


def test_a_pre_started_jail_sees_nothing_of_the_samples_before_it(warm_sb) -> None:
    baseline = sandbox_pids()
    results = []
    for i in range(6):
        if i >= 2:  # the second ask warms the command
            _wait_ready(warm_sb)
        r = _run(warm_sb, PROBE)
        assert r.status == "ok", r
        results.append(eval(r.stdout.decode().strip().splitlines()[-1]))
    assert warm_sb.warm_jails.hits >= 3, (warm_sb.warm_jails.hits, warm_sb.warm_jails.misses)
    for seen in results:
        assert seen["pid"] == 1  # a PID namespace of its own
        assert seen["alive"] == []  # no earlier sample's process, nothing to signal
        assert seen["files"] == []  # a fresh scratch tmpfs
        assert seen["env"] == [] and seen["cwd"] == "/tmp" and seen["uid"] == 65534
    # Each sample's sleeping daemon died with its jail (PID 1 exited).
    assert_no_leftovers(baseline, timeout=10)


def test_a_pre_started_jail_keeps_every_limit_of_its_sample(warm_sb) -> None:
    # Same command and limits twice warm them; later runs take a jail that waited. Its limits
    # are the sample's own (memory here), and the wall deadline counts from the hand-over: a
    # jail that waited 2.5 s still gives a 1 s program its whole 3 s.
    lim = SandboxLimits(wall_s=3, cpu_s=10, memory_mb=128)

    def run(code: str):
        return warm_sb.run([warm_sb.python, "-I", "-S", "-c", RUN_STDIN], stdin=code.encode(),
                           limits=lim)

    run("pass")
    run("pass")
    _wait_ready(warm_sb)
    hits = warm_sb.warm_jails.hits
    r = run("b = bytearray(400 << 20)\nprint('alive')")
    assert warm_sb.warm_jails.hits == hits + 1
    assert r.status in ("memory", "signal") or b"MemoryError" in r.stderr, r
    assert b"alive" not in r.stdout
    _wait_ready(warm_sb)
    time.sleep(2.5)
    hits = warm_sb.warm_jails.hits
    r = run("import time\nt = time.monotonic() + 1.0\nwhile time.monotonic() < t: pass\n"
            "print('done')")
    assert warm_sb.warm_jails.hits == hits + 1
    assert r.status == "ok" and r.stdout.strip() == b"done", r
    _wait_ready(warm_sb)
    r = run("while True: pass")  # and the deadline is still enforced
    assert r.status == "timeout", r


def test_a_jail_killed_while_waiting_costs_only_itself(warm_sb) -> None:
    _run(warm_sb, "print(1)")
    _run(warm_sb, "print(1)")
    _wait_ready(warm_sb, 2)
    killed = warm_sb.waiting_jail_pids()
    for pid in killed:
        os.kill(pid, signal.SIGKILL)  # the jail (its PID 1 gets PDEATHSIG) dies while waiting
    deadline = time.monotonic() + 10
    while not all(_dead(p) for p in killed):  # (a kill is not instant: wait for the kernel)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    hits = warm_sb.warm_jails.hits
    r = _run(warm_sb, "print(6 * 7)")
    assert r.status == "ok" and r.stdout == b"42\n", r
    assert warm_sb.warm_jails.hits == hits  # the dead ones were not handed out
    for _ in range(3):
        r = _run(warm_sb, "print(6 * 7)")
        assert r.status == "ok" and r.stdout == b"42\n", r


def test_a_jail_that_waited_too_long_is_destroyed_not_used(warm_sb) -> None:
    warm_sb.warm_jails.max_idle_s = 1.0
    _run(warm_sb, "print(1)")
    _run(warm_sb, "print(1)")
    _wait_ready(warm_sb, 2)
    old = warm_sb.waiting_jail_pids()
    time.sleep(1.2)
    hits = warm_sb.warm_jails.hits
    r = _run(warm_sb, "print(2)")
    assert r.status == "ok" and r.stdout == b"2\n", r
    assert warm_sb.warm_jails.hits == hits  # the stale ones were not handed out
    deadline = time.monotonic() + 15
    while any(_exists(p) for p in old):  # ... and they are destroyed, not left waiting
        assert time.monotonic() < deadline, old
        time.sleep(0.05)


def test_closing_the_sandbox_destroys_the_waiting_jails() -> None:
    sb = create_sandbox("nsjail", warm=2)
    baseline = sandbox_pids()
    _run(sb, "print(1)")
    _run(sb, "print(1)")
    _wait_ready(sb, 2)
    waiting = sb.waiting_jail_pids()
    assert len(waiting) == 2
    sb.close()
    assert not any(_exists(p) for p in waiting)
    assert_no_leftovers(baseline, timeout=10)
    assert _run(sb, "print(1)").status == "error"  # closed: nothing new starts


def test_a_command_asked_for_once_gets_no_jails(warm_sb) -> None:
    # One-off commands (the self-test, compiling the harness) must not leave jails waiting.
    r = warm_sb.run([warm_sb.python, "-I", "-S", "-c", "print('once')"],
                    limits=SandboxLimits(wall_s=20, cpu_s=10))
    assert r.status == "ok"
    time.sleep(0.5)
    assert warm_sb.warm_jails.ready_count() == 0


def test_the_pool_keeps_a_bounded_number_of_commands() -> None:
    # WarmJails with real processes (sleep) standing in for jails: the least recently asked
    # key is dropped with its processes, and at most per_key wait per key.
    procs: list[subprocess.Popen] = []

    def start(key):
        p = subprocess.Popen(["sleep", "60"])
        procs.append(p)
        return p

    def discard(p):
        p.kill()
        p.wait()

    pool = WarmJails(start, lambda p: p.poll() is None, discard, per_key=2, max_keys=2)
    try:
        for key in ("a", "a", "b", "b"):
            assert pool.take(key) is None
        deadline = time.monotonic() + 10
        while pool.ready_count() < 4:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert pool.take("c") is None and pool.take("c") is None  # "a" is dropped
        deadline = time.monotonic() + 10
        while sum(p.poll() is None for p in procs) > 4 + 0:
            assert time.monotonic() < deadline, [p.poll() for p in procs]
            time.sleep(0.01)
        got = pool.take("b")
        assert got is not None and got.handle.poll() is None
        got.handle.kill()
        got.handle.wait()
    finally:
        pool.close()
    assert all(p.poll() is not None for p in procs)


def _dead(pid: int) -> bool:
    """Exited: gone, or a zombie nobody has reaped yet."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2:].split()[0] in (b"Z", b"X")


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_code_items_are_judged_right_through_pre_started_jails(nsjail_sandbox) -> None:
    hits = nsjail_sandbox.warm_jails.hits
    for _ in range(4):
        o = score_code(respond(SUM_OK), SUM_GT, Limits(), nsjail_sandbox)
        assert o.status is Status.CORRECT, o
        o = score_code(respond("print(0)"), SUM_GT, Limits(), nsjail_sandbox)
        assert o.status is Status.INCORRECT, o
    assert nsjail_sandbox.warm_jails.hits > hits


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
