"""Jails running at once are as separate as nsjail's (the third red team's jail findings, issue
45), each under the forkserver's jails and under nsjail's alike: one sample cannot move onto a
neighbour's CPU, resume a neighbour's stopped process, or read across jails through a shared
session or process group; and the harness's own processes look the same from outside in both.
Real nsjail and a real zygote."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict

import pytest

from tests.conftest_sandbox import (  # noqa: F401
    POOL,
    forkserver_sandbox,
    nsjail_sandbox,
    respond,
)
from verifier.scoring.code_score import score_code
from verifier.items import Limits, Outcome, Status

ONE = {"inputs": ["5\n"], "outputs": ["25\n"]}
KINDS = ["forkserver", "nsjail"]


def judge(sb, code: str, gt=ONE, **limits) -> Outcome:
    limits.setdefault("test_timeout_s", 3)
    return score_code(respond(code), gt, Limits(**limits), sb)


def judged_at_once(sb, *codes_and_limits: tuple[str, dict], stagger_s: float = 0.3
                   ) -> list[Outcome]:
    """Judge each (code, limits) in a thread of its own, ``stagger_s`` apart, in one sandbox:
    samples running at once, as a server with two code slots runs them."""
    out: list[Outcome | None] = [None] * len(codes_and_limits)

    def run(i: int, code: str, limits: dict) -> None:
        out[i] = judge(sb, code, **limits)

    threads = [threading.Thread(target=run, args=(i, c, lim))
               for i, (c, lim) in enumerate(codes_and_limits)]
    for t in threads:
        t.start()
        time.sleep(stagger_s)
    for t in threads:
        t.join()
    assert all(o is not None for o in out), out
    return out  # type: ignore[return-value]


# The affinity attacker: it tries to move onto every CPU (a placed neighbour's among them) and
# prints the square only when it is refused and stays where it was put.
MOVE_CPU = r"""
import os
mine = os.sched_getaffinity(0)
try:
    os.sched_setaffinity(0, range(64))
    print("moved to", sorted(os.sched_getaffinity(0)))
except PermissionError:
    print(25 if os.sched_getaffinity(0) == mine else "changed")
"""

# A CPU-share detector beside it: how much CPU it got over ~1.5 s of wall time.
CPU_SHARE = r"""
import time
w0, c0 = time.monotonic(), time.process_time()
while time.monotonic() - w0 < 1.5:
    pass
print(25 if time.process_time() - c0 > 0 else 0)
"""


@pytest.mark.parametrize("kind", KINDS)
def test_a_program_cannot_move_onto_another_jails_cpu(kind, request):
    """Finding: a program that moved itself onto a placed neighbour's CPU and spun there took
    half of that neighbour's CPU, and the pinned neighbour could not leave. The policy now
    refuses sched_setaffinity (EPERM) in every jail, so the placement holds; the attacker runs
    beside a CPU-bound neighbour, which is judged right."""
    sb = request.getfixturevalue(f"{kind}_sandbox")
    attacker, neighbour = judged_at_once(sb, (MOVE_CPU, {}), (CPU_SHARE, {}))
    assert attacker.status is Status.CORRECT, attacker
    assert neighbour.status is Status.CORRECT, neighbour


# The victim stops itself: only a SIGCONT from outside its jail can let it print its answer
# before its test's deadline. The attacker sends SIGCONT to its own process group for 4 s.
STOPPED_VICTIM = r"""
import os, signal
os.kill(os.getpid(), signal.SIGSTOP)
print(25)
"""
SIGCONT_ATTACKER = r"""
import os, signal, time
end = time.monotonic() + 4
while time.monotonic() < end:
    os.kill(0, signal.SIGCONT)
    time.sleep(0.005)
print(25)
"""


@pytest.mark.parametrize("kind", KINDS)
def test_a_sample_cannot_resume_another_samples_stopped_process(kind, request):
    """Finding: forked jails shared the zygote's session and process group, so one sample's
    kill(0, SIGCONT) resumed another running sample's stopped process (SIGCONT needs only a
    shared session) and flipped its verdict. Every jail is its own session now (nsjail's
    setsid, and the zygote's PID 1 calls it): the victim stays stopped until its deadline."""
    sb = request.getfixturevalue(f"{kind}_sandbox")
    victim, attacker = judged_at_once(sb, (STOPPED_VICTIM, {"test_timeout_s": 3}),
                                      (SIGCONT_ATTACKER, {"test_timeout_s": 10}), stagger_s=0.5)
    assert attacker.status is Status.CORRECT, attacker  # it ran, sending SIGCONT meanwhile
    assert victim.status is Status.TIMEOUT, victim


SESSION = r"""
import os
sid, pgid = os.getsid(0), os.getpgid(0)
print(25 if sid > 0 and pgid > 0 else f"session {sid} group {pgid}")
"""


@pytest.mark.parametrize("kind", KINDS)
def test_a_programs_session_and_group_are_its_jails(kind, request):
    """A program's session and process group are its jail's (their leader is in its PID
    namespace, so it can name them: 0 would mean a session led from outside the jail, shared
    with the verifier's other jails), and getpriority of its process group reads only them."""
    sb = request.getfixturevalue(f"{kind}_sandbox")
    out = judge(sb, SESSION)
    assert out.status is Status.CORRECT, out


def _jail_processes() -> dict[int, tuple[int, int, bool]]:
    """pid -> (parent pid, real uid, dumpable) of every process running as a sandbox pool uid
    that descends from this test process (another verifier on the host, a trainer's or a
    second test run's, leases uids from the same pool: its jails are not this test's):
    dumpable when its /proc/PID/status belongs to its own uid, as the kernel makes it (an
    undumpable process's /proc/PID files are root's; the directory itself is not)."""
    parents, found = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            parents[int(d)] = int(fields["PPid"])
            uid = int(fields["Uid"].split()[0])
            if uid not in POOL or fields.get("State", "").strip()[:1] in ("Z", "X"):
                continue  # an exiting process's /proc files are root's: not its dumpability
            found[int(d)] = (int(fields["PPid"]), uid,
                             os.stat(f"/proc/{d}/status").st_uid == uid)
        except (OSError, KeyError, ValueError):
            continue
    return {pid: v for pid, v in found.items() if _descends_from(pid, os.getpid(), parents)}


def _descends_from(pid: int, root: int, parents: dict[int, int]) -> bool:
    seen = set()
    while pid not in seen and pid > 1:
        if pid == root:
            return True
        seen.add(pid)
        pid = parents.get(pid, 0)
    return False


SLEEPER = "import time\ntime.sleep(2.5)\nprint(25)"


def _harness_dumpability(sb) -> set[tuple[str, bool]]:
    """While a sleeping program is judged: (role, dumpable) of each process of its jail seen
    from the host, role "pid1" (the harness) or "test" (a test's process, its child)."""
    before = set(_jail_processes())
    done = threading.Event()
    out: list[Outcome] = []

    def run() -> None:
        out.append(judge(sb, SLEEPER, test_timeout_s=10))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    snapshots: dict[tuple[str, int], Counter[bool]] = defaultdict(Counter)
    while not done.wait(0.05):
        procs = {p: v for p, v in _jail_processes().items() if p not in before}
        # Once a test runs, its jail's set-up is over (during it the PID 1 changes its uid,
        # which makes it undumpable for a while, under nsjail as here): each snapshot of a
        # PID 1 with a test below it.
        for pid, (ppid, _uid, dumpable) in procs.items():
            if ppid in procs:
                snapshots[("test", pid)][dumpable] += 1
                snapshots[("pid1", ppid)][procs[ppid][2]] += 1
    assert out and out[0].status is Status.CORRECT, out
    # Each process as it stays for most of the 2.5 s sleep: a snapshot between a test's fork and
    # its exec (its credentials being set) is a moment, not what the process is (a loaded
    # machine's scheduler decides which moments a 50 ms poll catches).
    return {(role, counts.most_common(1)[0][0]) for (role, _pid), counts in snapshots.items()}


def test_the_harness_processes_are_as_dumpable_as_nsjails(forkserver_sandbox, nsjail_sandbox):
    """The harness is exec'd under nsjail (exec makes a process dumpable again), never under
    the forkserver: its PID 1 and the processes it forks for tests must still look the same
    from outside (whose their /proc entries are)."""
    forked = _harness_dumpability(forkserver_sandbox)
    cold = _harness_dumpability(nsjail_sandbox)
    assert {role for role, _ in cold} == {"pid1", "test"}, cold
    assert forked == cold
