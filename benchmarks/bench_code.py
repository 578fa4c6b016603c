"""Code scoring throughput: sandboxed ``verifier serve --workers 2`` vs the naive unsandboxed way.

Baseline (naive, unsandboxed, the way many reward functions do it): one plain ``python3``
process per test case, 2 at a time, each test's stdout compared by the judge.
Candidate: a real ``verifier serve --workers 2`` (nsjail sandbox: namespaces, rlimits, a
read-only root), all samples streamed by one client over gRPC.
Two workloads:

- ``simple`` (default): a few hundred stdin/stdout samples with 5 tests each, half of them wrong
  (goal >= 2.0);
- ``lcb``: LiveCodeBench-like samples with 10-30 tests each, some heavy (a quarter of a second of
  CPU per test), a few that time out (2 s test limit); it also reports the "bucket effect": the
  time a training step waits on its slowest sample, against the median sample.

``--subset correct|wrong`` keeps only the samples whose program is right, or wrong (the two
halves cost differently: a wrong sample stops at its first failing test). Besides the ratio it
prints samples per CPU-second of the whole machine (``/proc/stat``, kernel threads included:
meaningful on an otherwise idle machine) and per core.

Baseline and candidate alternate for ``--rounds`` rounds (the machine is shared); the ratios'
median is the result. The last candidate run prints the measured CPU breakdown per sample
(docs/verifier.md 3).

    .venv/bin/python benchmarks/bench_code.py [--n 200] [--workload simple|lcb] [--rounds 3]
        [--before DIR]   # DIR: `git archive REV | tar -x -C DIR`, served in every round too

``--profile lcb`` serves the samples under LiveCodeBench's judging rules (a sample's tests one
after another in one process, verifier/harness/lcb_runner.py) instead of the default profile's
process per test: the cost of that rule (docs/benchmarks.md, "Code throughput").

``--jail-cpu`` measures instead the CPU of one cold jail by stage, without a server (issue 29):
nsjail starting ``/bin/true`` (nsjail's own setup and the kernel's work for the namespaces,
mounts and cgroups), the same jail running ``python3 -I -S -c pass`` (plus the interpreter's
start), and a whole correct 5-test stdin/stdout sample (the harness's split: its start up to its
first record, its per-test work, the test processes, nsjail). The rusage of the reaped nsjail
process trees, median per jail, ``--rounds`` rounds of ``--n`` jails each:

    .venv/bin/python benchmarks/bench_code.py --jail-cpu [--n 40] [--rounds 3]

``--checker-cpu`` measures what a ground truth's checker (docs/contracts.md 1) costs, without a
server: the same 5-test "print a permutation of 1..n" samples judged in-process (nsjail, each
jail started cold and reaped by this process, so its CPU is counted) by the exact rule
(programs that print the expected answer), by a python checker program on those same
programs (every output is the expected one: no checker jail), by the same checker on programs
that print another right answer (one checker jail per sample), and by "tokens" on programs
that print the expected tokens on other lines. Samples per CPU-second (this process's CPU and
its reaped children's: the judge, nsjail, the jails; and the whole machine's, meaningful on an
otherwise idle machine), median of ``--rounds``:

    .venv/bin/python benchmarks/bench_code.py --checker-cpu [--n 40] [--rounds 3]

Measured (``--n 30 --rounds 3``, the project's loaded 2-core VM, cold nsjail jails): the exact
rule 31.6 samples per CPU-second; a checker program when every output is the expected one 31.5
(x1.00: no checker jail); the same checker judging another right answer 14.7 (x0.47: one more
jail per sample, about the cost of the program's own); "tokens" 32.1 (x1.02).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

FENCE = "```"

# (program, input generator, reference function mapping input text -> expected output text)
TASKS = [
    ("a, b = map(int, input().split())\nprint(a + b)\n",
     lambda r: f"{r.randint(-10**9, 10**9)} {r.randint(-10**9, 10**9)}\n",
     lambda s: f"{sum(map(int, s.split()))}\n"),
    ("n = int(input())\nxs = list(map(int, input().split()))\nprint(*sorted(xs))\n",
     lambda r: (lambda xs: f"{len(xs)}\n{' '.join(map(str, xs))}\n")([r.randint(0, 99) for _ in range(r.randint(1, 50))]),
     lambda s: " ".join(map(str, sorted(map(int, s.split("\n")[1].split())))) + "\n"),
    ("s = input().strip()\nprint(s[::-1])\n",
     lambda r: "".join(r.choice("abcxyz") for _ in range(r.randint(1, 40))) + "\n",
     lambda s: s.strip()[::-1] + "\n"),
    ("import sys\nn = int(sys.stdin.readline())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nprint(a)\n",
     lambda r: f"{r.randint(0, 300)}\n",
     lambda s: (lambda n: (lambda f: f"{f(n)}\n")(lambda k: _fib(k)))(int(s))),
    ("t = int(input())\nfor _ in range(t):\n    x = int(input())\n    print('YES' if x % 2 == 0 else 'NO')\n",
     lambda r: (lambda xs: f"{len(xs)}\n" + "".join(f"{x}\n" for x in xs))([r.randint(0, 1000) for _ in range(r.randint(1, 10))]),
     lambda s: "".join("YES\n" if int(x) % 2 == 0 else "NO\n" for x in s.split()[1:])),
]
WRONG = [
    "a, b = map(int, input().split())\nprint(a - b)\n",
    "print(input())\n",
    "import sys\nprint(len(sys.stdin.read()))\n",
]


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


HEAVY = ("n = int(input())\ns = 0\nfor i in range(n):\n    s = (s + i * i) % 1000003\nprint(s)\n",
         lambda r: f"{r.choice([10, 1000, 300000, 1500000])}\n",
         lambda s: f"{sum(i * i for i in range(int(s))) % 1000003}\n")
# HEAVY's program, except that one input never finishes (the test times out)
LOOPS = ("n = int(input())\nwhile n == 7:\n    pass\n"
         "s = 0\nfor i in range(n):\n    s = (s + i * i) % 1000003\nprint(s)\n")
LCB_TEST_TIMEOUT_S = 2.0


def make_samples(n: int, seed: int = 0, workload: str = "simple") -> list[dict]:
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        program, gen, ref = TASKS[i % len(TASKS)]
        n_tests = 5
        limits: dict = {}
        if workload == "lcb":
            n_tests = rng.randint(10, 30)
            limits = {"test_timeout_s": LCB_TEST_TIMEOUT_S}
            if rng.random() < 0.2:
                program, gen, ref = HEAVY
        inputs = [gen(rng) for _ in range(n_tests)]
        outputs = [ref(x) for x in inputs]
        if workload == "lcb" and rng.random() < 0.04:
            # a few never finish one of their tests
            program, inputs = LOOPS, [HEAVY[1](rng) for _ in range(n_tests)]
            inputs[rng.randrange(n_tests)] = "7\n"
            outputs = [HEAVY[2](x) for x in inputs]
        elif rng.random() < (0.5 if workload == "simple" else 0.3):
            program = rng.choice(WRONG)
        program = f"# sample {i}\n{program}"  # unique programs
        sample = {
            "id": f"c{i}", "domain": "code",
            "response": f"<think>plan</think>\n{FENCE}python\n{program}{FENCE}\n",
            "ground_truth": {"inputs": inputs, "outputs": outputs},
            "program": program,
        }
        if limits:
            sample["limits"] = limits
        samples.append(sample)
    return samples


def _lines(s: str) -> list[str]:
    out = [x.strip() for x in s.strip().split("\n")]
    return out


def naive_sample(s: dict, tmp: Path) -> bool:
    """Judge one sample the naive way: its program written to ``tmp``, a fresh ``python3 -S``
    per test, stopping at the first failure. True when every test passes."""
    path = tmp / f"{s['id']}.py"
    path.write_text(s["program"])
    timeout = s.get("limits", {}).get("test_timeout_s", 6)
    for x, y in zip(s["ground_truth"]["inputs"], s["ground_truth"]["outputs"]):
        try:
            p = subprocess.run([sys.executable, "-S", str(path)], input=x, capture_output=True,
                               text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        if p.returncode != 0 or _lines(p.stdout) != _lines(y):
            return False
    return True


def program_is_right(s: dict) -> bool:
    """Whether a sample of ``make_samples`` carries a right program (one of TASKS or HEAVY),
    not one of WRONG or LOOPS."""
    return s["program"].split("\n", 1)[1] in {t[0] for t in TASKS} | {HEAVY[0]}


def baseline(samples: list[dict], parallel: int = 2) -> tuple[float, int, float, float]:
    """Samples/s of the naive way: a fresh python3 per test, ``parallel`` at a time, no
    isolation. Returns (rate, number judged correct, slowest sample's seconds, the whole
    machine's busy CPU seconds per sample)."""
    from common import machine_cpu_s

    work = tempfile.TemporaryDirectory(prefix="bench-code-")
    tmp = Path(work.name)

    def run_sample(s: dict) -> tuple[bool, float]:
        t0 = time.perf_counter()
        return naive_sample(s, tmp), time.perf_counter() - t0

    # Tests of one sample run one after another (a failure stops the sample, as in the
    # verifier); two samples run at a time, so two python3 processes are alive at once.
    start, cpu0 = time.perf_counter(), machine_cpu_s()
    with ThreadPoolExecutor(parallel) as ex:
        out = list(ex.map(run_sample, samples))
    rate = len(samples) / (time.perf_counter() - start)
    cpu = (machine_cpu_s() - cpu0) / len(samples)
    work.cleanup()
    return rate, sum(ok for ok, _ in out), max(t for _, t in out), cpu


def jail_cpu(n: int, rounds: int) -> None:
    """Print the CPU (ms) of one cold nsjail jail by stage; see the module docstring."""
    import resource

    from sandbox.base import SandboxLimits
    from sandbox.nsjail import NsjailSandbox
    from verifier.scoring.code_score import score_code
    from verifier.items import Limits

    def children_cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    correct = [s for s in make_samples(50) if program_is_right(s)][:5]
    sb = NsjailSandbox(warm=0)
    sb.self_test()
    lim = SandboxLimits(wall_s=10, cpu_s=5)
    splits: list[dict] = []

    def sample(k: int) -> None:
        s = correct[k % len(correct)]
        costs: dict = {}
        out = score_code(s["response"], s["ground_truth"], Limits(), sb, costs=costs)
        assert out.status.name == "CORRECT", out
        splits.append(costs)

    stages = {
        "nsjail + /bin/true": lambda k: sb.run(["/bin/true"], limits=lim),
        "nsjail + python3 -I -S -c pass": lambda k: sb.run([sb.python, "-I", "-S", "-c", "pass"],
                                                           limits=lim),
        "a correct 5-test sample": sample,
    }
    try:
        sample(0)  # compiles the harness once (harness_files)
        splits.clear()
        per: dict[str, list[float]] = {name: [] for name in stages}
        for r in range(rounds):
            for name, fn in stages.items():
                xs = []
                for k in range(n):
                    before = children_cpu()
                    fn(k)
                    xs.append((children_cpu() - before) * 1000)
                per[name].append(median(xs))
            print(f"round {r + 1}: " + ", ".join(f"{name} {per[name][-1]:.2f} ms"
                                                 for name in stages), flush=True)
    finally:
        sb.close()
    print(f"CPU per cold jail, median of {rounds} rounds x {n} jails ({sb.describe()}):")
    for name in stages:
        print(f"  {name:34s} {median(per[name]):6.2f} ms  (rounds: "
              + ", ".join(f"{x:.2f}" for x in per[name]) + ")")
    print("  split of the sample (the harness's own CPU clocks; medians):")
    for key in ("jail_setup", "harness_start", "harness_tests", "tests"):
        print(f"    {key:14s} {median(c.get(key, 0.0) for c in splits) * 1000:6.2f} ms")


PERM_CHECKER = (
    "import sys\n"
    "n = int(open(sys.argv[1]).read())\n"
    "try:\n"
    "    got = sorted(int(t) for t in open(sys.argv[2]).read().split())\n"
    "except ValueError:\n"
    "    sys.exit(2)\n"
    "sys.exit(0 if got == list(range(1, n + 1)) else 1)\n")
PERM_PROGRAMS = {
    "expected": "n = int(input())\nprint(*range(1, n + 1))\n",
    "another": "n = int(input())\nprint(*range(n, 0, -1))\n",
    "lines": "n = int(input())\nprint(*range(1, n + 1), sep='\\n')\n",
}


def checker_cpu(n: int, rounds: int) -> None:
    """Print samples per CPU-second of the exact rule and of checkers; see the module
    docstring."""
    import resource

    from common import machine_cpu_s
    from sandbox.nsjail import NsjailSandbox
    from verifier.scoring.code_score import score_code
    from verifier.items import Limits

    def cpu() -> float:
        r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime

    rng = random.Random(0)
    inputs = [f"{rng.randint(1, 50)}\n" for _ in range(5)]
    tests = {"inputs": inputs, "outputs": [" ".join(map(str, range(1, int(x) + 1))) + "\n"
                                           for x in inputs]}
    program_checker = {"language": "python", "source": PERM_CHECKER}
    workloads = {  # name: (program, ground truth)
        "exact rule": ("expected", tests),
        "checker program, output = expected": ("expected", dict(tests, checker=program_checker)),
        "checker program, another right answer": ("another", dict(tests,
                                                                  checker=program_checker)),
        "tokens, expected tokens on other lines": ("lines", dict(tests, checker="tokens")),
    }
    sb = NsjailSandbox(warm=0)
    sb.self_test()
    rates: dict[str, list[float]] = {name: [] for name in workloads}
    machine: dict[str, list[float]] = {name: [] for name in workloads}
    try:
        for r in range(rounds):
            for name, (program, gt) in workloads.items():
                response = f"<think>plan</think>\n{FENCE}python\n{PERM_PROGRAMS[program]}{FENCE}\n"
                score_code(response, gt, Limits(), sb)  # warm: the harness's bytecode
                before, machine0 = cpu(), machine_cpu_s()
                for _ in range(n):
                    out = score_code(response, gt, Limits(), sb)
                    assert out.status.name == "CORRECT", (name, out)
                rates[name].append(n / (cpu() - before))
                machine[name].append(n / (machine_cpu_s() - machine0))
            print(f"round {r + 1}: " + ", ".join(f"{name} {rates[name][-1]:.1f}/CPU-s"
                                                 for name in workloads), flush=True)
    finally:
        sb.close()
    exact, exact_m = median(rates["exact rule"]), median(machine["exact rule"])
    print(f"samples per CPU-second, 5 tests each, median of {rounds} rounds x {n} samples, cold "
          f"jails ({sb.describe()}):")
    for name in workloads:
        print(f"  {name:42s} {median(rates[name]):6.1f} (x{median(rates[name]) / exact:.2f} of "
              f"the exact rule); whole machine {median(machine[name]):6.1f} "
              f"(x{median(machine[name]) / exact_m:.2f})")


def main() -> None:
    from common import print_breakdown, stream_run

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=None,
                    help="samples (default 200); with --jail-cpu: jails per stage and round "
                         "(default 40)")
    ap.add_argument("--workload", choices=("simple", "lcb"), default="simple")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--code-concurrency", type=int, default=0,
                    help="the server's --code-concurrency (default 0: --workers)")
    ap.add_argument("--forkserver", choices=("auto", "on", "off"), default="auto",
                    help="the server's --forkserver (default auto: as root, the harness's jails "
                         "forked from a zygote; off: nsjail's, pre-started)")
    ap.add_argument("--warm-jails", default="None",
                    help="the server's --warm-jails (default None: one per code slot; 0: off)")
    ap.add_argument("--subset", choices=("all", "correct", "wrong"), default="all",
                    help="judge only the samples whose program is right (correct) or wrong "
                         "(wrong); default all (simple: half wrong)")
    ap.add_argument("--profile", choices=("default", "lcb", "skywork"), default="default",
                    help="the server's --profile (default: default, a process per test; lcb and "
                         "skywork run a sample's tests one after another in one process, as "
                         "LiveCodeBench's judge does: what that judging rule costs)")
    ap.add_argument("--before", type=Path, default=None,
                    help="a checkout of the code before a change (git archive REV | tar -x -C "
                         "DIR): its server runs in every round too, with the same flags, for a "
                         "before/after ratio measured beside the same naive runs")
    ap.add_argument("--jail-cpu", action="store_true",
                    help="measure the CPU of one cold jail by stage instead (no server)")
    ap.add_argument("--checker-cpu", action="store_true",
                    help="measure what checkers cost against the exact rule instead (no server)")
    args = ap.parse_args()
    if args.jail_cpu:
        jail_cpu(args.n or 40, args.rounds)
        return
    if args.checker_cpu:
        checker_cpu(args.n or 40, args.rounds)
        return
    args.n = args.n or 200
    samples = make_samples(args.n, workload=args.workload)
    if args.subset != "all":
        samples = [s for s in samples if program_is_right(s) == (args.subset == "correct")]
    items = [{k: v for k, v in s.items() if k != "program"} for s in samples]
    warmup = [dict(it, id=f"w{it['id']}") for it in items[:10]]
    bases, cands, ratios, base_cpus, cand_cpus, befores, gains = [], [], [], [], [], [], []
    run = None
    server_args = ("--code-concurrency", str(args.code_concurrency), "--warm-jails",
                   args.warm_jails, "--profile", args.profile, "--forkserver", args.forkserver)
    for k in range(args.rounds):
        base, base_correct, base_slowest, base_cpu = baseline(samples)
        base_cpus.append(base_cpu)
        run = stream_run(items, args.workers, warmup, extra_args=server_args)
        if run.counts.get("CORRECT", 0) != base_correct or run.counts.get("SANDBOX_ERROR"):
            # A rate of wrong verdicts means nothing (a broken sandbox is fast).
            sys.exit(f"bench_code: the verifier's verdicts {run.counts} disagree with the naive "
                     f"run's ({base_correct} correct)")
        bases.append(base)
        cands.append(run.rate)
        cand_cpus.append(run.machine_cpu)
        ratios.append(run.rate / base)
        line = (f"round {k + 1}: baseline {base:6.1f}/s  candidate {run.rate:6.1f}/s  "
                f"ratio {ratios[-1]:.2f}")
        if args.before is not None:
            old = stream_run(items, args.workers, warmup, breakdown=False, root=args.before,
                             extra_args=server_args)
            if old.counts.get("CORRECT", 0) != base_correct:
                sys.exit(f"bench_code: the before build's verdicts {old.counts} disagree with "
                         f"the naive run's ({base_correct} correct)")
            befores.append(old.rate / base)
            gains.append(run.rate / old.rate)
            line += f"  (before: {old.rate:6.1f}/s, ratio {befores[-1]:.2f})"
        print(line, flush=True)
    assert run is not None
    tests = sum(len(s["ground_truth"]["inputs"]) for s in samples)
    print(f"samples: {len(samples)} ({args.workload}, {args.subset}: {tests} tests); naive judged {base_correct} "
          f"correct; verifier verdicts: {run.counts}")
    print(f"baseline  (unsandboxed, python3 per test, 2 at a time): {median(bases):7.1f} samples/s")
    print(f"candidate (verifier serve --workers {args.workers} --code-concurrency "
          f"{args.code_concurrency} --warm-jails {args.warm_jails} --profile {args.profile}"
          f" --forkserver {args.forkserver}, nsjail): {median(cands):7.1f} samples/s")
    print(f"ratio candidate / baseline, median of {args.rounds}: {median(ratios):.2f}  "
          f"(goal >= {2.0 if args.workload == 'simple' else 1.0})")
    if befores:
        print(f"before ({args.before}) / baseline, median of {args.rounds}: "
              f"{median(befores):.2f}; after / before: {median(gains):.2f}")
    cores = os.cpu_count() or 1
    # Per machine CPU-second: what a fleet is sized by (the whole machine's busy CPU over the
    # run, kernel threads included; an idle machine's figure only).
    print(f"samples per machine CPU-second: baseline {1 / median(base_cpus):.1f}, candidate "
          f"{1 / median(cand_cpus):.1f} (CPU ms per sample {median(base_cpus) * 1e3:.1f} and "
          f"{median(cand_cpus) * 1e3:.1f}); per core ({cores} cores): baseline "
          f"{median(bases) / cores:.1f}/s, candidate {median(cands) / cores:.1f}/s")
    lat = sorted(run.latencies)
    if args.workload == "lcb":
        # Bucket effect: a step that sends all these samples at once waits for the last one.
        print(f"bucket effect (last round, all samples sent at once): step {run.wall_s:.2f} s; "
              f"median sample done at {median(lat):.2f} s, slowest at {lat[-1]:.2f} s "
              f"(x{lat[-1] / median(lat):.1f}); naive slowest sample alone {base_slowest:.2f} s")
    print_breakdown(run, ["receive", "judge", "jail_setup", "harness_start", "harness_tests",
                          "tests", "encode"],
                    f"code, {args.workload} workload, last round (per sample)")


if __name__ == "__main__":
    main()
