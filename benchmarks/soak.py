"""Soak test: N minutes of mixed traffic through a fleet of real ``verifier serve`` replicas
under faults, checking every verdict and watching the replicas for leaks.

    .venv/bin/python benchmarks/soak.py [--minutes 60] [--kill-every-s 180] [--sample-s 5] \
        [--window-s 300] [--workers 1] [--streams 4] [--inflight 8] [--forkserver auto|on|off] \
        [--out soak.json]
    make soak                       # the defaults: 60 minutes

Fleet: three replicas, child processes on loopback ports (verifier.client.local.LocalVerifier),
``--workers 1`` each. One client (``VerifierClient`` given the three addresses) runs
``--streams`` logical streams from threads, each closed-loop (at most ``--inflight`` items
outstanding), so latency is the fleet's, not a client-side queue's.

- "victim": SIGKILLed (its main process, as the OOM killer does) every ``--kill-every-s`` and
  restarted on its port at once;
- "drained": sent SIGTERM once near the middle of the run (it drains), restarted on its port;
- "steady": never killed nor drained: RSS and fd growth are a linear fit over its samples after
  the first window. A third replica rather than the drained one's pre-drain samples, so that
  the fit spans the whole run.

Traffic: cycles of items, each with a unique id and a known verdict: math right and wrong
(bench_math's light forms and filler), code right and wrong, stdin/stdout and call-based, under
every profile; per cycle one attack (infinite loop, fork bomb, memory bomb, output flood: any
genuine verdict with reward 0), one math bomb (a zero verdict; ``BOMB_TIMEOUT_S`` is its
deadline) and one over-long response (``OVERLONG_EXPECT``). Every cycle has the same mix, so
windows compare. Traffic starts ``--warmup-s`` before the clock: the first window starts with
the pipeline full (warm-up results are checked, not windowed).

Sampled every ``--sample-s``: per replica, RSS, fds, threads and processes of the server's own
tree (jails excluded: nsjail processes, or the forkserver zygote's children; counted as
sandboxes); /dev/shm entries and bytes, scratch entries,
orphans (processes with this run's tag in their environment whose parent has not), the
client's outstanding items, latency, load average. Each role has its own TMPDIR, shared by its
incarnations as a pod's /tmp volume is across restarts (a new incarnation may sweep what a
killed one left); listings before and after each incarnation say which one made an entry.

Report (table; JSON with ``--out``): per window, throughput and p50/p99 latency; lost,
duplicated, wrong, unjudged items; growth; leftovers against a snapshot taken before the start.
Goals (PASS/FAIL/SKIP/INFO; exit 1 on any FAIL):

- nothing lost, duplicated, wrong or unjudged;
- throughput: last window / first window >= 0.95 (a faster last window is no regression),
  counted on undisturbed time only: results completed outside [fault, replica listening again
  + SETTLE_S], over those seconds. What a kill costs depends on where it falls, not on the
  run's age; this compares the fleet's capacity early and late. Raw items/s are printed too,
  and the host's load average: on a shared machine other jobs' CPU moves this ratio as well;
- RSS and fd growth of the steady replica < 1 %/hour (SKIP when the fit spans < --min-fit-s);
  the same fit per kind of process (server, forkserver, workers, other) for RSS and USS, and of
  the replica's PSS, are INFO lines that say which process grows;
- no leftover process, /dev/shm entry, cgroup, or scratch of an incarnation stopped with
  SIGTERM; scratch of SIGKILLed incarnations (not swept by their successors) is a goal of its
  own.

``--goals correctness`` makes the throughput, growth and SIGKILL-scratch goals INFO lines
(tests/test_soak.py: 30 s on a busy machine measures none of them). The run's scratch
directory is removed at the end, after it has been counted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import statistics
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_code import TASKS  # noqa: E402  (stdin/stdout tasks: program, inputs, reference)
from bench_math import FILLER, LIGHT  # noqa: E402

from verifier.client import ClientConfig, VerifierClient  # noqa: E402
from verifier.items import MAX_RESPONSE_CHARS, NOT_A_VERDICT, PROFILES, Status  # noqa: E402
from verifier.client.local import LocalVerifier  # noqa: E402

# -- expectations: the one place each is defined ---------------------------------------------
OVERLONG_CHARS = MAX_RESPONSE_CHARS + 10
OVERLONG_EXPECT = frozenset({"INVALID_INPUT", "RESPONSE_TOO_LONG"})
"""An over-long response: INVALID_INPUT before the server had RESPONSE_TOO_LONG, that status
after. Drop INVALID_INPUT here once every server in use has it."""
UNJUDGED = frozenset(s.value for s in NOT_A_VERDICT)
ZERO_VERDICT = frozenset(s.value for s in Status) - UNJUDGED - {"CORRECT"}
"""Attacks and math bombs: any genuine verdict but CORRECT (with reward 0)."""
CORRECT, INCORRECT = frozenset({"CORRECT"}), frozenset({"INCORRECT"})
BOMB_TIMEOUT_S = 3.0
SETTLE_S = ClientConfig().max_backoff_s
"""After a restarted replica listens, seconds until the client has surely probed it again."""
TAG_ENV = "SOAK_RUN_TAG"
FENCE = "```"
ONE = {"inputs": ["5\n"], "outputs": ["25\n"]}
ATTACKS = [  # (kind, program, limits)
    ("attack_loop", "while True:\n    pass\n", {"test_timeout_s": 1.5}),
    ("attack_fork", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
     "        pass\n", {"test_timeout_s": 1.5}),
    ("attack_memory", "x = []\nwhile True:\n    x.append(bytearray(64 << 20))\n",
     {"test_timeout_s": 20, "memory_mb": 256}),
    ("attack_flood", "import sys\nwhile True:\n    sys.stdout.write('25\\n' * 10000)\n",
     {"test_timeout_s": 1.5}),
]
BOMBS = ["9^{9^{9^{9}}}", "(10^8)!", "2^{123456789012345678901234567890}",
         "\\binom{10^{10^{10}}}{10^{10}}"]
CALL_RIGHT = ["def scale(xs, k):\n    return [x * k for x in xs]\n", "class Solution:\n"
              "    def scale(self, xs, k):\n        return tuple(x * k for x in xs)\n"]
CALL_WRONG = "def scale(xs, k):\n    return xs\n"
STDIN_WRONG = "import sys\nsys.stdin.read()\nprint('WRONG')\n"


def make_cycle(c: int, seed: int) -> list[tuple[dict, str, frozenset, float]]:
    """Cycle ``c``: (item, kind, accepted statuses, expected reward), shuffled. Ids are unique
    per (seed, c); every cycle has the same mix."""
    rng = random.Random(seed * 1_000_003 + c)
    out: list[tuple[dict, str, frozenset, float]] = []

    def add(suffix, kind, prof, expect, reward, **fields):
        out.append(({"id": f"c{c}-{suffix}", "profile": prof, **fields}, kind, expect, reward))

    def code(suffix, kind, prof, expect, reward, program, gt, **limits):
        resp = f"<think>plan</think>\n{FENCE}python\n# c{c}-{suffix}\n{program}{FENCE}\n"
        add(suffix, kind, prof, expect, reward, domain="code", response=resp, ground_truth=gt,
            limits=limits)

    for j in range(24):  # j % 2 and j % 3: each (profile, right/wrong) pair four times
        prof, right = PROFILES[j % 3], j % 2 == 0
        gold, _ = LIGHT[rng.randrange(len(LIGHT))](rng)
        think = FILLER * rng.randint(5, 40) + f" (item c{c}-m{j})"
        answer = gold if right else gold + "+1"
        add(f"m{j}", "math_right" if right else "math_wrong", prof, CORRECT if right else
            INCORRECT, 1.0 if right else 0.0, domain="math", ground_truth=gold,
            response=f"<think>{think}</think>\nTherefore the answer is $\\boxed{{{answer}}}$.")
    for prof in PROFILES:
        program, gen, ref = TASKS[rng.randrange(len(TASKS))]
        inputs = [gen(rng) for _ in range(5)]
        gt = {"inputs": inputs, "outputs": [ref(x) for x in inputs]}
        code(f"{prof}-sr", "code_stdin_right", prof, CORRECT, 1.0, program, gt)
        code(f"{prof}-sw", "code_stdin_wrong", prof, INCORRECT, 0.0, STDIN_WRONG, gt)
        k = rng.randint(2, 9)
        xss = [[rng.randint(1, 99) for _ in range(rng.randint(1, 8))] for _ in range(3)]
        gt = {"inputs": [f"{json.dumps(xs)}\n{k}" for xs in xss],
              "outputs": [json.dumps([x * k for x in xs]) for xs in xss], "fn_name": "scale"}
        code(f"{prof}-cr", "code_call_right", prof, CORRECT, 1.0, CALL_RIGHT[rng.randrange(2)], gt)
        code(f"{prof}-cw", "code_call_wrong", prof, INCORRECT, 0.0, CALL_WRONG, gt)
    kind, program, limits = ATTACKS[c % len(ATTACKS)]
    code("atk", kind, PROFILES[(c // len(ATTACKS)) % 3], ZERO_VERDICT, 0.0, program, ONE, **limits)
    add("bomb", "math_bomb", PROFILES[(c // len(BOMBS)) % 3], ZERO_VERDICT, 0.0, domain="math",
        ground_truth="1", limits={"timeout_s": BOMB_TIMEOUT_S},
        response=f"<think>c{c}</think>\nThe answer is $\\boxed{{{BOMBS[c % len(BOMBS)]}}}$.")
    tail = "</think>\nThe answer is $\\boxed{1}$."
    head = f"<think>c{c} " + FILLER * (OVERLONG_CHARS // len(FILLER) + 1)
    add("long", "overlong", PROFILES[c % 3], OVERLONG_EXPECT, 0.0, domain="math",
        ground_truth="1", response=head[:OVERLONG_CHARS - len(tail)] + tail)
    rng.shuffle(out)
    return out


# -- replicas ----------------------------------------------------------------------------------
_env_lock = threading.Lock()  # TMPDIR is set in os.environ around each start


class LogTally(deque):
    """A LocalVerifier's ``lines`` that also counts its WARNING and ERROR records."""

    def __init__(self, tally: Counter):
        super().__init__(maxlen=200)
        self.tally = tally

    def append(self, line: str) -> None:
        super().append(line)
        if '"WARNING"' in line or '"ERROR"' in line or '"CRITICAL"' in line:
            try:
                rec = json.loads(line)
                what = f" [{rec['status']}: {rec.get('detail')}]"[:120] if "status" in rec else ""
                self.tally[f"{rec['levelname']} {rec['message']}{what}"] += 1
            except (ValueError, KeyError, TypeError):
                self.tally[line[:200]] += 1


class Replica:
    """One role's ``verifier serve``, restarted on the same port. Its incarnations share one
    TMPDIR; listings before and after each incarnation say which one made what."""

    def __init__(self, role: str, serve_args: tuple[str, ...], scratch: Path):
        self.role, self.serve_args, self.tmp = role, serve_args, scratch / role
        self.tmp.mkdir()
        self.tmp.chmod(0o755)  # the jails' uid must reach the harness files under it
        self.port, self.busy = 0, False
        self.lv: LocalVerifier | None = None
        self.incarnations: list[dict] = []  # {"pid", "ended_by"}
        self.listings: list[list[set[str]]] = []  # per incarnation: TMPDIR before, after
        self.log_problems: Counter = Counter()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.listings.append([set(os.listdir(self.tmp)), set()])
        with _env_lock:
            old, os.environ["TMPDIR"] = os.environ.get("TMPDIR"), str(self.tmp)
            try:
                for attempt in range(5):  # the port may still be held for a moment
                    try:
                        self.lv = LocalVerifier(*self.serve_args, port=self.port)
                        break
                    except RuntimeError:
                        if attempt == 4:
                            raise
                        time.sleep(1.0)
            finally:
                os.environ.pop("TMPDIR") if old is None else os.environ.update(TMPDIR=old)
        assert self.lv is not None
        self.lv.lines = LogTally(self.log_problems)  # its reader thread appends to this now
        self.port = int(self.lv.address.rsplit(":", 1)[1])
        self.incarnations.append({"pid": self.lv.proc.pid, "ended_by": None})

    def end(self, how: str) -> int:
        """Stop the current incarnation: SIGKILL, SIGTERM (wait for its drain), or "stop"
        (LocalVerifier.stop: SIGTERM, SIGKILL after 60 s)."""
        assert self.lv is not None
        self.incarnations[-1]["ended_by"] = how
        if how == "stop":
            rc = self.lv.stop()
        else:
            self.lv.proc.send_signal(signal.Signals[how])
            rc = self.lv.proc.wait(timeout=300)
        self.listings[-1][1] = set(os.listdir(self.tmp))
        return rc

    def fault(self, how: str, events: list, t0: float) -> None:
        """``end(how)``, then a new incarnation on the same port; booked in ``events``."""
        t_fault = time.monotonic()
        rc = self.end(how)
        t_exit = time.monotonic()
        self.start()
        t_up = time.monotonic()
        events.append({"role": self.role, "signal": how, "t_s": t_fault - t0,
                       "exit_s": t_exit - t_fault, "exit_code": rc, "down_s": t_up - t_fault,
                       "t_up_s": t_up - t0})
        self.busy = False

    def scratch_left(self) -> tuple[list[str], list[str]]:
        """Entries of its TMPDIR now: (made by incarnations that were SIGKILLed, the rest)."""
        killed, clean = [], []
        for e in sorted(os.listdir(self.tmp)):
            by = [inc for inc, (a, b) in zip(self.incarnations, self.listings) if e in b - a]
            sigkilled = by and by[0]["ended_by"] == "SIGKILL"
            (killed if sigkilled else clean).append(f"{self.tmp}/{e}")
        return killed, clean

    def tree(self) -> dict:
        """The server's own processes (jails excluded: counted as sandboxes)."""
        pid = self.lv.proc.pid if self.lv and self.lv.proc.poll() is None else None
        root = _safe(lambda: psutil.Process(pid), None) if pid else None
        procs = [root] + _safe(lambda: root.children(recursive=True), []) if root else []
        if not procs:
            return {"alive": False}
        # A jail is an nsjail process, or (--forkserver) a child of the zygote: the zygote
        # forks one per run, and the jail's processes are its children. The zygote itself is
        # the server's own (long-lived: a leak there counts), its runs are not (their fds and
        # memory come and go with the load, and were counted as the server's before this).
        nsjails = [p for p in procs if _safe(p.name, "") == "nsjail"]
        zygotes = [p for p in procs
                   if any(a.endswith("zygote.py") for a in _safe(p.cmdline, []))]
        forked = [c for z in zygotes for c in _safe(lambda: z.children(), [])]  # noqa: B023
        jails = nsjails + forked
        jailed = {q.pid for j in jails for q in [j] + _safe(lambda: j.children(True), [])}
        own = [p for p in procs if p.pid not in jailed]

        def total(f) -> float:
            return sum(_safe(lambda: f(p), 0) for p in own)  # noqa: B023 - called at once

        # One smaps read per process gives its RSS, USS (pages only this process maps) and PSS
        # (shared pages split among their mappers): RSS counts a page the forkserver shares with
        # every worker once per worker, so a worker's RSS grows as it merely touches inherited
        # pages. USS and PSS are INFO beside the RSS goal.
        by_kind: dict[str, float] = defaultdict(float)
        uss_by_kind: dict[str, float] = defaultdict(float)
        n_by_kind: dict[str, int] = defaultdict(int)
        pss = 0.0
        for p in own:
            kind = _kind(p, root.pid)
            n_by_kind[kind] += 1
            mem = _safe(p.memory_full_info, None)
            if mem is not None:
                by_kind[kind] += mem.rss / 2**20
                uss_by_kind[kind] += mem.uss / 2**20
                pss += mem.pss / 2**20
        return {"alive": True, "rss_mb": sum(by_kind.values()), "pss_mb": pss,
                "fds": total(lambda p: p.num_fds()), "threads": total(lambda p: p.num_threads()),
                "procs": len(own), "sandboxes": len(jails),
                "rss_mb_by_kind": {k: by_kind.get(k, 0.0) for k in PROCESS_KINDS},
                "uss_mb_by_kind": {k: uss_by_kind.get(k, 0.0) for k in PROCESS_KINDS},
                "procs_by_kind": {k: n_by_kind.get(k, 0) for k in PROCESS_KINDS}}


PROCESS_KINDS = ("server", "forkserver", "workers", "other")
"""The replica's processes, by what they are: the server's own process (gRPC, scorer threads,
jail starter), multiprocessing's forkserver, the pool workers it forks (math and output
comparison; a worker killed at a deadline is replaced, so they are summed), and anything else
(multiprocessing's resource tracker)."""


def _kind(p, server_pid: int) -> str:
    if p.pid == server_pid:
        return "server"
    cmd = " ".join(_safe(p.cmdline, []))
    if "forkserver" in cmd:
        # The forkserver and the workers it forks share its command line: the forkserver is the
        # one whose parent is the server.
        return "forkserver" if _safe(p.ppid, 0) == server_pid else "workers"
    return "other"


def _safe(fn, default):
    """``fn()``, or ``default`` when the process is gone."""
    try:
        return fn()
    except psutil.Error:
        return default


def _cmd(pid: int) -> str:
    return _safe(lambda: " ".join(psutil.Process(pid).cmdline())[:100], "?")


# -- host state --------------------------------------------------------------------------------
def tagged() -> dict[int, int]:
    """pid -> ppid of the live processes whose environment carries this run's tag: the replicas
    and all they started outside a jail (a jail's processes cannot outlive its nsjail)."""
    out = {}
    for p in psutil.process_iter():
        if _safe(lambda: p.status() != psutil.STATUS_ZOMBIE and  # noqa: B023 - called at once
                 p.environ().get(TAG_ENV) == os.environ[TAG_ENV], False):
            out[p.pid] = _safe(p.ppid, 0)
    return out


def nsjail_cgroups() -> set[str]:
    found = set()
    for d, subdirs, _ in os.walk("/sys/fs/cgroup"):
        if os.path.basename(d) == "magic-rlvr-sandbox":
            found |= {os.path.join(d, s) for s in subdirs if s.startswith("NSJAIL.")}
            subdirs[:] = []
    return found


def shm_state() -> tuple[set[str], int]:
    names, size = set(), 0
    for e in os.scandir("/dev/shm"):
        try:
            size, _ = size + e.stat(follow_symlinks=False).st_size, names.add(e.name)
        except OSError:  # gone meanwhile
            pass
    return names, size


def _still_there(paths: list[str], wait_s: float = 3.0) -> list[str]:
    """Those of ``paths`` that still exist after up to ``wait_s``. Why: a jail of another
    verifier on the host (a trainer's, a test run's) that has just ended has its process gone
    while nsjail is still removing its cgroup; that moment is not a leak, and a leak stays."""
    deadline = time.monotonic() + wait_s
    left = [p for p in paths if os.path.exists(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if os.path.exists(p)]
    return left


def leftovers(before: dict, replicas: list[Replica]) -> dict:
    """What the run left on the host, against ``before``."""
    procs = tagged()
    cg = _still_there([path for path in sorted(nsjail_cgroups() - before["cgroups"])
                       if not os.path.exists(f"/proc/{path.rsplit('.', 1)[1]}")  # stale,
                       or int(path.rsplit(".", 1)[1]) in procs])  # or ours
    killed, clean = [], []
    for r in replicas:
        k, c = r.scratch_left()
        killed, clean = killed + k, clean + c
    return {"processes": {pid: _cmd(pid) for pid in procs},
            "shm": sorted(shm_state()[0] - before["shm"]), "cgroups": cg,
            "scratch_clean_stop": clean, "scratch_after_sigkill": killed}


# -- traffic -------------------------------------------------------------------------------------
class Ledger:
    """Every item sent, and what came back."""

    def __init__(self):
        self.lock = threading.Lock()
        self.outstanding: dict[str, tuple] = {}  # id -> (t_sent, kind, expect, reward, profile)
        self.answered: set[str] = set()
        self.results: list[tuple[float, float]] = []  # (t_done monotonic, latency s)
        self.by_kind: dict[str, Counter] = defaultdict(Counter)
        self.counts: Counter = Counter()
        self.examples: list[dict] = []

    def sent(self, item: dict, kind: str, expect: frozenset, reward: float) -> None:
        with self.lock:
            self.outstanding[item["id"]] = (time.monotonic(), kind, expect, reward, item["profile"])
            self.counts["sent"] += 1

    def answer(self, r) -> bool:
        """Book a result; False for one that answers nothing outstanding."""
        now, status = time.monotonic(), r.status.value
        with self.lock:
            rec = self.outstanding.pop(r.id, None)
            if rec is None:
                what = "duplicated" if r.id in self.answered else "unexpected"
                self.counts[what] += 1
                self.example(what, r.id, "", None, r)
                return False
            self.answered.add(r.id)
            t_sent, kind, expect, reward, prof = rec
            self.results.append((now, now - t_sent))
            self.by_kind[f"{kind}/{prof}"][status] += 1
            self.counts["answered"] += 1
            if status not in expect or abs(r.reward - reward) > 1e-9:
                what = "unjudged" if status in UNJUDGED else "wrong"
                self.counts[what] += 1
                self.example(what, r.id, f"{kind}/{prof}", sorted(expect), r)
            return True

    def example(self, what: str, item_id: str, kind: str, expect, r) -> None:
        if len(self.examples) < 30:
            self.examples.append({"what": what, "id": item_id, "kind": kind, "expected": expect,
                                  "status": r and r.status.value, "reward": r and r.reward,
                                  "detail": r and r.detail[:300],
                                  "elapsed_ms": r and round(r.elapsed_ms, 1)})


def run_stream(client: VerifierClient, ledger: Ledger, first_cycle: int, step: int, seed: int,
               inflight: int, stop: threading.Event, streams: list, errors: list) -> None:
    """One logical stream, closed loop: at most ``inflight`` items outstanding."""
    room = threading.Semaphore(inflight)

    def source():
        c = first_cycle
        while True:
            for item, kind, expect, reward in make_cycle(c, seed):
                while not room.acquire(timeout=0.2):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                ledger.sent(item, kind, expect, reward)
                yield item
            c += step

    stream = client.open_stream(source())
    streams.append(stream)
    try:
        for r in stream:
            if ledger.answer(r):
                room.release()
    except Exception as e:  # noqa: BLE001 - recorded; its unanswered items count as lost
        errors.append(f"stream from cycle {first_cycle}: {type(e).__name__}: {e}")


def sample(t: float, replicas: list[Replica], ledger: Ledger, streams: list, since: int,
           seen_orphans: dict) -> dict:
    s: dict = {"t_s": t, "loadavg_1m": os.getloadavg()[0]}
    for r in replicas:
        s[r.role] = r.tree()
    procs = tagged()  # orphans: re-parented, their parent neither tagged nor this process
    orph = {pid for pid, ppid in procs.items() if ppid not in procs and ppid != os.getpid()}
    for pid in orph:  # pid -> [first seen, last seen, command]
        seen_orphans.setdefault(pid, [t, t, _cmd(pid)])[1] = t
    names, s["shm_bytes"] = shm_state()
    s.update(orphans=len(orph), shm_entries=len(names),
             scratch_entries=sum(len(os.listdir(r.tmp)) for r in replicas))
    with ledger.lock:
        s["client_outstanding"] = len(ledger.outstanding)
        s["n_results"] = len(ledger.results)
        lat = [x for _, x in ledger.results[since:]]
    s["client_unanswered"] = sum(st.unanswered for st in streams)
    s["latency_p50_ms"] = (pct(lat, 0.5) or 0) * 1e3
    return s


# -- report --------------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def fit_growth(ts: list[float], ys: list[float]) -> dict:
    """Least-squares slope of ys over ts, per hour and as % of the mean per hour."""
    if len(ts) < 3 or ts[-1] <= ts[0]:
        return {"samples": len(ts), "span_s": 0.0, "pct_per_hour": None}
    slope, mean = statistics.linear_regression(ts, ys).slope * 3600, statistics.fmean(ys)
    return {"samples": len(ts), "span_s": ts[-1] - ts[0], "mean": mean, "per_hour": slope,
            "pct_per_hour": 100 * slope / mean if mean else None}


def windows(ledger: Ledger, t0: float, duration: float, window_s: float, faults: list,
            samples: list) -> list:
    """Per window: results, items/s, faults, p50/p99 latency, items/s over its undisturbed
    seconds (outside [fault, replica listening again + SETTLE_S]), and the host's mean load
    average (other jobs on the machine take CPU from the fleet too)."""
    hit = [(f["t_s"], f["t_up_s"] + SETTLE_S) for f in faults]
    done = [(td - t0, lt, not any(x <= td - t0 < y for x, y in hit)) for td, lt in ledger.results]
    out = []
    for k in range(int(duration / window_s + 0.999)):
        a, b = k * window_s, min((k + 1) * window_s, duration)
        quiet, cursor = 0.0, a
        for x, y in sorted((max(a, x), min(b, y)) for x, y in hit if x < b and y > a):
            quiet, cursor = quiet + max(0.0, x - cursor), max(cursor, y)
        quiet += max(0.0, b - cursor)
        lat = [lt for t, lt, _ in done if a <= t < b]
        calm = sum(1 for t, _, c in done if a <= t < b and c)
        p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
        load = [x["loadavg_1m"] for x in samples if a <= x["t_s"] < b]
        out.append({"start_s": a, "end_s": b, "results": len(lat),
                    "load": statistics.fmean(load) if load else None,
                    "items_per_s": len(lat) / (b - a),
                    "faults": sum(1 for f in faults if a <= f["t_s"] < b), "undisturbed_s": quiet,
                    "steady_items_per_s": calm / quiet if quiet >= 1 else None,
                    "p50_ms": p50 and p50 * 1e3, "p99_ms": p99 and p99 * 1e3})
    return out


def goals(rep: dict, args: argparse.Namespace) -> list[dict]:
    perf = "INFO" if args.goals == "correctness" else None
    c, left, g = rep["counts"], rep["leftovers"], []

    def goal(name, ok, value, target, mode=None):
        g.append({"goal": name, "result": mode or ("PASS" if ok else "FAIL"), "value": value,
                  "target": target})

    for what in ("lost", "duplicated", "wrong", "unjudged"):
        n = c[what] + (c["unexpected"] if what == "duplicated" else 0)
        goal(f"nothing {what}", n == 0, n, 0)
    first, last = (rep["windows"][i]["steady_items_per_s"] for i in (0, -1))
    ratio = last / first if first and last else None
    goal("throughput last/first window (undisturbed time)", ratio is not None and ratio >= 0.95,
         ratio, ">= 0.95", perf if ratio is not None else "SKIP")
    for key, fit in rep["growth"].items():
        v = fit["pct_per_hour"]
        goal(f"steady replica {key} growth %/hour", v is not None and v < 1.0, v, "< 1",
             "SKIP" if fit["span_s"] < args.min_fit_s or v is None else perf)
    n = sum(len(left[k]) for k in ("processes", "shm", "cgroups", "scratch_clean_stop"))
    goal("no leftover process, /dev/shm, cgroup, scratch of SIGTERMed replicas", n == 0, n, 0)
    n = len(left["scratch_after_sigkill"])
    goal("no scratch left by SIGKILLed replicas (unswept)", n == 0, n, 0, perf)
    return g


def print_report(rep: dict) -> None:
    cfg, fmt = rep["config"], lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    print(f"\nsoak: {cfg['minutes']:g} min, 3 replicas x {cfg['workers']} worker(s), "
          f"{cfg['streams']} streams x {cfg['inflight']} in flight, {os.cpu_count()} CPU cores")
    for f in rep["faults"]:
        print(f"  {f['signal']:7s} {f['role']:7s} at {f['t_s']:6.1f} s" + (
            f": exited after {f['exit_s']:.1f} s (rc {f['exit_code']}), listening again after "
            f"{f['down_s']:.1f} s" if "down_s" in f else ""))
    print(f"\n{'window s':>13} {'faults':>6} {'results':>8} {'items/s':>8} {'undist s':>8} "
          f"{'steady/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'load':>5}")
    for w in rep["windows"]:
        print(f"{w['start_s']:6.0f}-{w['end_s']:6.0f} {w['faults']:6d} {w['results']:8d} "
              f"{w['items_per_s']:8.1f} {w['undisturbed_s']:8.1f} "
              f"{fmt(w['steady_items_per_s'], '8.1f'):>8} {fmt(w['p50_ms'], '7.0f'):>7} "
              f"{fmt(w['p99_ms'], '7.0f'):>7} {fmt(w['load'], '5.1f'):>5}")
    kinds: dict[str, Counter] = defaultdict(Counter)
    for k, cnt in rep["by_kind"].items():
        kinds[k.split("/")[0]].update(cnt)
    print("\nverdicts by kind (all profiles):")
    for k in sorted(kinds):
        print(f"  {k:17s} " + ", ".join(f"{s} {n}" for s, n in kinds[k].most_common()))
    print(f"counts: {rep['counts']}")
    for e in rep["examples"][:10]:
        print(f"  {e['what']}: {e['id']} {e['kind']} expected {e['expected']} got {e['status']} "
              f"reward {e['reward']} in {e['elapsed_ms']} ms ({(e['detail'] or '')[:120]})")
    for err in rep["stream_errors"]:
        print(f"  stream error: {err}")
    for key, fit in rep["growth"].items():
        print(f"steady replica {key}: mean {fit.get('mean', 0):.1f}, "
              f"{fmt(fit['pct_per_hour'], '+.2f')} %/hour over {fit['span_s']:.0f} s "
              f"({fit['samples']} samples after the first window)")
    if "pss_growth" in rep:
        fit = rep["pss_growth"]
        print(f"steady replica pss_mb (INFO): mean {fit.get('mean', 0):.1f}, "
              f"{fmt(fit.get('per_hour'), '+.1f')} MB/hour ({fmt(fit['pct_per_hour'], '+.2f')} %/hour)")
    for label, key in (("rss", "rss_growth_by_kind"), ("uss", "uss_growth_by_kind")):
        for kind, fit in rep.get(key, {}).items():
            print(f"  {label} of {kind:10s}: mean {fit.get('mean', 0):7.1f} MB, "
                  f"{fmt(fit.get('per_hour'), '+.1f')} MB/hour "
                  f"({fmt(fit['pct_per_hour'], '+.2f')} %/hour of its own)")
    longest = max((o["seen_s"] for o in rep["orphans"]), default=0)
    print(f"orphans of killed replicas: {len(rep['orphans'])}, longest seen {longest:.0f} s")
    for key, v in rep["leftovers"].items():
        print(f"leftover {key}: {len(v)}" + (f" {list(v)[:3]}" if v else ""))
    for role, probs in rep["log_problems"].items():
        for msg, n in list(probs.items())[:5]:
            print(f"  {role} logged {n} x {msg[:160]}")
    print()
    for g in rep["goals"]:
        v = g["value"]
        print(f"{g['result']:4s}  {g['goal']}: {round(v, 3) if isinstance(v, float) else v} "
              f"(goal {g['target']})")


# -- main ----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Soak test of a verifier fleet under faults.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = ap.add_argument
    add("--minutes", type=float, default=60.0, help="length of the run, minutes")
    add("--kill-every-s", type=float, default=180.0, help="seconds between SIGKILLs of the victim")
    add("--sample-s", type=float, default=5.0, help="seconds between samples")
    add("--window-s", type=float, default=None,
        help="report window, seconds (None: min(300, run length / 6))")
    add("--warmup-s", type=float, default=20.0,
        help="seconds of traffic before the clock starts (checked, not windowed)")
    add("--workers", type=int, default=1, help="--workers of each replica")
    add("--grace-s", type=float, default=None,
        help="--grace-s of each replica: its drain on SIGTERM, seconds (None: the server's)")
    add("--forkserver", choices=["auto", "on", "off"], default="auto",
        help="the replicas' --forkserver (default auto: as root, the harness's jails forked "
             "from a zygote; off: nsjail's, pre-started)")
    add("--streams", type=int, default=4, help="concurrent client streams (threads)")
    add("--inflight", type=int, default=8, help="items outstanding per stream")
    add("--seed", type=int, default=0, help="seed of the generated items")
    add("--drain-timeout-s", type=float, default=180.0,
        help="seconds to wait for outstanding items after the run (then: lost)")
    add("--settle-s", type=float, default=15.0,
        help="seconds to wait for leftovers to go away after the replicas stop")
    add("--min-fit-s", type=float, default=600.0,
        help="shortest fit span, seconds, for the growth goals to be judged")
    add("--goals", choices=["all", "correctness"], default="all",
        help="'correctness': throughput, growth and SIGKILL-scratch goals are INFO")
    add("--out", type=Path, default=None, help="write the report as JSON here")
    args = ap.parse_args(argv)
    logging.getLogger("verifier.client").setLevel(logging.ERROR)  # failovers are expected here
    os.environ[TAG_ENV] = tag = uuid.uuid4().hex[:12]  # inherited by what the replicas start
    scratch = Path(f"/tmp/soak-{tag}")
    scratch.mkdir()
    scratch.chmod(0o755)  # the jails' uid must traverse it
    try:
        return soak(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def soak(args: argparse.Namespace, scratch: Path) -> int:
    duration = args.minutes * 60
    window_s = args.window_s or min(300.0, duration / 6)
    before = {"shm": shm_state()[0], "cgroups": nsjail_cgroups()}
    serve_args = ("--workers", str(args.workers)) + (
        ("--grace-s", str(args.grace_s)) if args.grace_s is not None else ()) + (
        ("--forkserver", args.forkserver))
    replicas = [Replica(role, serve_args, scratch) for role in ("victim", "drained", "steady")]
    ledger, stop, streams, errors = Ledger(), threading.Event(), [], []
    faults: list[dict] = []
    samples: list[dict] = []
    seen_orphans: dict[int, list] = {}
    kills = [k * args.kill_every_s for k in range(1, int(duration / args.kill_every_s) + 1)]
    drain_at = duration / 2
    if any(abs(k - drain_at) < min(10.0, args.kill_every_s / 4) for k in kills):
        drain_at += args.kill_every_s / 2  # not at the moment of a kill
    plan = sorted([(t, 0, "SIGKILL") for t in kills if t < duration - 1] +
                  [(drain_at, 1, "SIGTERM")] * (drain_at < duration - 1))
    try:
        for r in replicas:
            r.start()
        client = VerifierClient(",".join(r.address for r in replicas))
        client.wait_ready(timeout_s=60, all_replicas=True)
        t0 = time.monotonic() + args.warmup_s  # the clock starts with the pipeline full
        threads = [threading.Thread(target=run_stream, daemon=True, args=(
            client, ledger, s, args.streams, args.seed, args.inflight, stop, streams, errors))
            for s in range(args.streams)]
        for t in threads:
            t.start()
        fault_threads, next_sample = [], 0.0
        while (now := time.monotonic() - t0) < duration:
            while plan and plan[0][0] <= now:
                _, i, how = plan.pop(0)
                if replicas[i].busy:  # still restarting from its previous fault
                    faults.append({"role": replicas[i].role, "signal": "skipped", "t_s": now})
                    continue
                replicas[i].busy = True
                fault_threads.append(threading.Thread(target=replicas[i].fault,
                                                      args=(how, faults, t0)))
                fault_threads[-1].start()
            if now >= next_sample:
                next_sample += args.sample_s
                since = samples[-1]["n_results"] if samples else 0
                samples.append(sample(now, replicas, ledger, streams, since, seen_orphans))
            time.sleep(0.1)
        stop.set()
        end = time.monotonic() + args.drain_timeout_s
        for t in threads:
            t.join(timeout=max(0.0, end - time.monotonic()))
        for st in streams:
            st.close()
        for t in fault_threads:
            t.join()
        stats = client.replica_stats()
        client.close()
    finally:
        stop.set()
        stoppers = [threading.Thread(target=r.end, args=("stop",)) for r in replicas if r.lv]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
    deadline = time.monotonic() + args.settle_s
    while True:
        left = leftovers(before, replicas)
        if time.monotonic() > deadline or not any(
                left[k] for k in ("processes", "shm", "cgroups", "scratch_clean_stop")):
            break
        time.sleep(0.5)
    ledger.counts["lost"] = len(ledger.outstanding)
    for item_id, rec in list(ledger.outstanding.items())[:10]:
        ledger.example("lost", item_id, f"{rec[1]}/{rec[4]}", sorted(rec[2]), None)
    fit = [s for s in samples if s["t_s"] >= window_s and s["steady"]["alive"]]
    rep = {
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   "window_s": window_s, "replicas": 3, "run_tag": os.environ[TAG_ENV]},
        "replicas": {r.role: {"address": r.address, "incarnations": r.incarnations}
                     for r in replicas},
        "client_replica_stats": stats,
        "faults": faults,
        "counts": {**{k: 0 for k in ("lost", "duplicated", "wrong", "unjudged", "unexpected")},
                   **ledger.counts},
        "by_kind": {k: dict(v) for k, v in sorted(ledger.by_kind.items())},
        "examples": ledger.examples,
        "stream_errors": errors,
        "windows": windows(ledger, t0, duration, window_s, [f for f in faults if "t_up_s" in f],
                           samples),
        "growth": {k: fit_growth([s["t_s"] for s in fit], [s["steady"][k] for s in fit])
                   for k in ("rss_mb", "fds")},
        # Which process grows: the same fit per kind of process (INFO, not a goal).
        **{f"{m}_growth_by_kind": {
            k: fit_growth([s["t_s"] for s in fit], [s["steady"][f"{m}_mb_by_kind"][k] for s in fit])
            for k in PROCESS_KINDS} for m in ("rss", "uss")},
        "pss_growth": fit_growth([s["t_s"] for s in fit], [s["steady"]["pss_mb"] for s in fit]),
        "orphans": [{"pid": pid, "first_s": a, "seen_s": b - a, "cmd": cmd}
                    for pid, (a, b, cmd) in sorted(seen_orphans.items())],
        "leftovers": left,
        "log_problems": {r.role: dict(r.log_problems.most_common()) for r in replicas},
        "samples": samples,
    }
    rep["goals"] = goals(rep, args)
    print_report(rep)
    if args.out:
        args.out.write_text(json.dumps(rep, indent=1, default=str))
        print(f"report written to {args.out}")
    return 1 if any(g["result"] == "FAIL" for g in rep["goals"]) else 0


if __name__ == "__main__":
    sys.exit(main())
