"""Code scoring throughput: sandboxed ``verifier serve --workers 2`` vs the naive unsandboxed way.

Baseline (naive, unsandboxed, the way many reward functions do it): one plain ``python3``
process per test case, 2 at a time, each test's stdout compared by the judge.
Candidate: a real ``verifier serve --workers 2`` (nsjail sandbox: namespaces, rlimits, a
read-only root), all samples streamed by one client over gRPC.
Same few hundred LiveCodeBench-style stdin/stdout samples with 5 tests each (a quarter of them
wrong). Prints samples/s for each and the ratio (goal >= 1.0: isolation costs less than the
harness saves).

    .venv/bin/python benchmarks/bench_code.py [--n 300]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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


def make_samples(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        program, gen, ref = TASKS[i % len(TASKS)]
        inputs = [gen(rng) for _ in range(5)]
        outputs = [ref(x) for x in inputs]
        if rng.random() < 0.25:
            program = rng.choice(WRONG)
        program = f"# sample {i}\n{program}"  # unique programs
        samples.append({
            "id": f"c{i}", "domain": "code",
            "response": f"<think>plan</think>\n{FENCE}python\n{program}{FENCE}\n",
            "ground_truth": {"inputs": inputs, "outputs": outputs},
            "program": program,
        })
    return samples


def _lines(s: str) -> list[str]:
    out = [x.strip() for x in s.strip().split("\n")]
    return out


def baseline(samples: list[dict], parallel: int = 2) -> tuple[float, int]:
    """Samples/s of the naive way: a fresh python3 per test, ``parallel`` at a time, no
    isolation. Returns (rate, number judged correct)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-code-"))

    def run_sample(s: dict) -> bool:
        path = tmp / f"{s['id']}.py"
        path.write_text(s["program"])
        for x, y in zip(s["ground_truth"]["inputs"], s["ground_truth"]["outputs"]):
            try:
                p = subprocess.run([sys.executable, "-S", str(path)], input=x, capture_output=True,
                                   text=True, timeout=6)
            except subprocess.TimeoutExpired:
                return False
            if p.returncode != 0 or _lines(p.stdout) != _lines(y):
                return False
        return True

    # Tests of one sample run one after another (a failure stops the sample, as in the
    # verifier); two samples run at a time, so two python3 processes are alive at once.
    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as ex:
        verdicts = list(ex.map(run_sample, samples))
    return len(samples) / (time.perf_counter() - start), sum(verdicts)


def candidate(samples: list[dict], workers: int) -> tuple[float, dict]:
    from common import stream_rate

    items = [{k: v for k, v in s.items() if k != "program"} for s in samples]
    return stream_rate(items, workers, warmup=items[:10])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300, help="samples (5 tests each; default 300)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    samples = make_samples(args.n)
    base, base_correct = baseline(samples)
    cand, counts = candidate(samples, args.workers)
    print(f"samples: {args.n} x 5 tests; naive judged {base_correct} correct; "
          f"verifier verdicts: {counts}")
    print(f"baseline  (unsandboxed, python3 per test, 2 at a time): {base:7.1f} samples/s")
    print(f"candidate (verifier serve --workers {args.workers}, nsjail):   {cand:7.1f} samples/s")
    print(f"ratio candidate / baseline = {cand / base:.2f}  (goal >= 1.0)")


if __name__ == "__main__":
    main()
