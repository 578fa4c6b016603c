"""Math scoring throughput: ``verifier serve --workers 2`` over gRPC vs 2x a plain loop.

Baseline: the way public trainers score math, a single-process loop calling math-verify
(``verify(parse(gold), parse(answer))``) on each item; doubled, as if it scaled perfectly to the
2 cores. Candidate: a real ``verifier serve --workers 2`` process, all items streamed by one
client. Same few thousand unique, realistic items (chain-of-thought text, a boxed answer in one
of many forms, half of them wrong). Prints items/s for each and the ratio (goal >= 0.8).

    .venv/bin/python benchmarks/bench_math.py [--n 3000]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

FORMS = [
    lambda r: (str(r.randint(0, 999)), None),
    lambda r: (f"\\frac{{{r.randint(1, 99)}}}{{{r.randint(2, 99)}}}", None),
    lambda r: (f"{r.randint(1, 9)}\\sqrt{{{r.choice([2, 3, 5, 7])}}}", None),
    lambda r: (f"{r.randint(1, 20)}\\pi", None),
    lambda r: (f"({r.randint(-9, 0)}, {r.randint(1, 9)}]", None),
    lambda r: (f"x^2 + {r.randint(1, 9)}x + {r.randint(1, 9)}", None),
    lambda r: (f"{r.randint(1, 99)}.{r.randint(1, 99)}", None),
    lambda r: (f"\\{{{r.randint(1, 5)}, {r.randint(6, 9)}\\}}", None),
    lambda r: (f"({r.randint(0, 9)}, {r.randint(0, 9)})", None),
    lambda r: (f"\\frac{{\\sqrt{{{r.choice([2, 3, 5])}}}}}{{{r.randint(2, 9)}}}", None),
]
WRONG = [
    lambda g, r: g + "+1",
    lambda g, r: str(r.randint(0, 9999)),
    lambda g, r: f"-{g}" if not g.startswith("(") else g[::-1],
]
FILLER = ("We consider the constraints carefully. Let the unknown be $x$; substituting gives "
          "$x^2 - 5x + 6 = 0$, hence $x = 2$ or $x = 3$. Checking both candidates against the "
          "original condition, only one survives. ")


def make_items(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    items = []
    for i in range(n):
        gold, _ = rng.choice(FORMS)(rng)
        answer = gold if rng.random() < 0.5 else rng.choice(WRONG)(gold, rng)
        think = FILLER * rng.randint(5, 40) + f" (case {i})"
        response = f"<think>{think}</think>\nTherefore the answer is $\\boxed{{{answer}}}$."
        items.append({"id": f"m{i}", "domain": "math", "response": response, "ground_truth": gold})
    return items


def baseline(items: list[dict]) -> float:
    """Items/s of a plain single-process math-verify loop (gold first), last box only."""
    from math_verify import parse, verify

    from verifier.extract import after_think, last_boxed

    start = time.perf_counter()
    for it in items:
        region = after_think(it["response"]) or ""
        ans = last_boxed(region)
        if ans is None:
            continue
        verify(parse(f"${it['ground_truth']}$"), parse(f"${ans}$"))
    return len(items) / (time.perf_counter() - start)


def candidate(items: list[dict], workers: int) -> tuple[float, dict]:
    from common import stream_rate

    return stream_rate(items, workers, warmup=make_items(50, seed=99))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="number of unique items (default 3000)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    items = make_items(args.n)
    base = baseline(items)
    cand, counts = candidate(items, args.workers)
    ratio = cand / (2 * base)
    print(f"items: {args.n} unique; verdicts over gRPC: {counts}")
    print(f"baseline  (plain math-verify loop, 1 process): {base:8.1f} items/s  (x2 = {2 * base:.1f})")
    print(f"candidate (verifier serve --workers {args.workers}, gRPC stream): {cand:8.1f} items/s")
    print(f"ratio candidate / (2 x baseline) = {ratio:.2f}  (goal >= 0.8)")


if __name__ == "__main__":
    main()
