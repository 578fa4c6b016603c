"""Math scoring throughput: ``verifier serve --workers 2`` over gRPC vs 2x a plain loop.

Baseline: the way public trainers score math, a single-process loop calling math-verify
(``verify(parse(gold), parse(answer))``) on each item; doubled, as if it scaled perfectly to the
2 cores. Candidate: a real ``verifier serve --workers 2`` process, all items streamed by one
client. Same few thousand unique, realistic items (chain-of-thought text, a boxed answer, half
of them wrong), in one of two mixes:

- ``light``: AIME-like, a third integers, a third fractions, a third radicals (goal >= 0.95);
- ``heavy``: ten forms, intervals, polynomials, sets, tuples, decimals among them (goal >= 1.2).

Baseline and candidate alternate for ``--rounds`` rounds (the machine is shared: interleaving
spreads the load over both); the ratios' median is the result. The last candidate run prints
the measured CPU breakdown per item (docs/verifier.md 3). ``--batch N`` sends the candidate's
items as unary ``Score`` calls of N items (4 in flight) instead of a message per item on one
stream: what the per-message cost of the stream is. ``--cli`` runs the candidate's client as
the ``verifier check --addr`` command instead (the items in a JSONL file, the results written to
another; its wall time includes the command's own start and its file I/O).

    .venv/bin/python benchmarks/bench_math.py [--n 3000] [--mix light|heavy] [--rounds 3] [--batch N | --cli]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from statistics import median

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
LIGHT = [
    lambda r: (str(r.randint(0, 999)), None),
    lambda r: (f"\\frac{{{r.randint(1, 99)}}}{{{r.randint(2, 99)}}}", None),
    lambda r: (f"{r.randint(1, 9)}\\sqrt{{{r.choice([2, 3, 5, 6, 7, 10, 11])}}}", None),
]
MIXES = {"light": LIGHT, "heavy": FORMS}
GOALS = {"light": 0.95, "heavy": 1.2}
WRONG = [
    lambda g, r: g + "+1",
    lambda g, r: str(r.randint(0, 9999)),
    lambda g, r: f"-{g}" if not g.startswith("(") else g[::-1],
]
FILLER = ("We consider the constraints carefully. Let the unknown be $x$; substituting gives "
          "$x^2 - 5x + 6 = 0$, hence $x = 2$ or $x = 3$. Checking both candidates against the "
          "original condition, only one survives. ")


def make_items(n: int, seed: int = 0, mix: str = "heavy") -> list[dict]:
    rng = random.Random(seed)
    forms = MIXES[mix]
    items = []
    for i in range(n):
        gold, _ = forms[i % len(forms)](rng) if mix == "light" else rng.choice(forms)(rng)
        answer = gold if rng.random() < 0.5 else rng.choice(WRONG)(gold, rng)
        think = FILLER * rng.randint(5, 40) + f" (case {i})"
        response = f"<think>{think}</think>\nTherefore the answer is $\\boxed{{{answer}}}$."
        items.append({"id": f"m{i}", "domain": "math", "response": response, "ground_truth": gold})
    return items


def baseline(items: list[dict]) -> float:
    """Items/s of a plain single-process math-verify loop (gold first), last box only."""
    from math_verify import parse, verify

    from verifier.scoring.extract import after_think, last_boxed

    start = time.perf_counter()
    for it in items:
        region = after_think(it["response"]) or ""
        ans = last_boxed(region)
        if ans is None:
            continue
        verify(parse(f"${it['ground_truth']}$"), parse(f"${ans}$"))
    return len(items) / (time.perf_counter() - start)


def cli_run(items: list[dict], workers: int, warmup: list[dict]) -> tuple[float, dict]:
    """Items/s of ``verifier check --addr`` scoring ``items`` (a JSONL file) through a new
    ``verifier serve --workers N`` (warmed by ``warmup`` first), and its verdict counts."""
    from verifier.client import VerifierClient
    from verifier.client.local import LocalVerifier

    with tempfile.TemporaryDirectory() as d:
        inp, out = Path(d) / "items.jsonl", Path(d) / "results.jsonl"
        inp.write_text("".join(json.dumps(it) + "\n" for it in items))
        with LocalVerifier(workers=workers) as server:
            with VerifierClient(server.address) as client:
                client.wait_ready()
                list(client.stream(warmup))
            start = time.perf_counter()
            subprocess.run([str(Path(sys.executable).parent / "verifier"), "check", "--addr",
                            server.address, "--input", str(inp), "--output", str(out),
                            "--progress", "off"], check=True)
            wall = time.perf_counter() - start
        results = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(results) == len(items), (len(results), len(items))
    return len(items) / wall, dict(Counter(r["status"] for r in results))


def main() -> None:
    from common import print_breakdown, stream_run

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="number of unique items (default 3000)")
    ap.add_argument("--mix", choices=sorted(MIXES), default="light")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--before", type=Path, default=None,
                    help="a checkout of the code before a change (git archive REV | tar -x -C "
                         "DIR): its server runs in every round too, for a before/after ratio")
    ap.add_argument("--batch", type=int, default=0,
                    help="send unary Score calls of this many items (4 in flight) instead of "
                         "one stream with a message per item (default 0: the stream)")
    ap.add_argument("--cli", action="store_true",
                    help="the candidate's client is the verifier check --addr command (a JSONL "
                         "file in, one out) instead of a stream in this process")
    args = ap.parse_args()
    if args.cli and args.batch:
        ap.error("--cli and --batch are two different candidates: choose one")
    items = make_items(args.n, mix=args.mix)
    if args.cli:
        bases, ratios = [], []
        for k in range(args.rounds):
            base = baseline(items)
            rate, counts = cli_run(items, args.workers, warmup=make_items(50, seed=99,
                                                                          mix=args.mix))
            bases.append(base)
            ratios.append(rate / (2 * base))
            print(f"round {k + 1}: baseline {base:7.1f}/s  verifier check {rate:7.1f}/s  "
                  f"ratio {ratios[-1]:.2f}", flush=True)
        print(f"items: {args.n} unique, {args.mix} mix; verdicts: {counts}")
        print(f"ratio verifier check / (2 x baseline), median of {args.rounds}: "
              f"{median(ratios):.2f}  (goal >= {GOALS[args.mix]})")
        return
    warmup = make_items(50, seed=99, mix=args.mix)
    bases, cands, ratios, befores, gains = [], [], [], [], []
    run = None
    for k in range(args.rounds):
        base = baseline(items)
        if args.before is not None:
            old = stream_run(items, args.workers, warmup, breakdown=False, root=args.before)
            befores.append(old.rate / (2 * base))
        run = stream_run(items, args.workers, warmup, batch=args.batch)
        bases.append(base)
        cands.append(run.rate)
        ratios.append(run.rate / (2 * base))
        line = (f"round {k + 1}: baseline {base:7.1f}/s  candidate {run.rate:7.1f}/s  "
                f"ratio {ratios[-1]:.2f}")
        if befores:
            gains.append(run.rate / old.rate)
            line += f"  (before: {old.rate:7.1f}/s, ratio {befores[-1]:.2f})"
        print(line, flush=True)
    assert run is not None
    print(f"items: {args.n} unique, {args.mix} mix; verdicts over gRPC: {run.counts}")
    print(f"baseline  (plain math-verify loop, 1 process): {median(bases):8.1f} items/s  "
          f"(x2 = {2 * median(bases):.1f})")
    how = f"unary Score calls of {args.batch} items" if args.batch else "gRPC stream"
    print(f"candidate (verifier serve --workers {args.workers}, {how}): "
          f"{median(cands):8.1f} items/s")
    print(f"ratio candidate / (2 x baseline), median of {args.rounds}: {median(ratios):.2f}  "
          f"(goal >= {GOALS[args.mix]})")
    if befores:
        print(f"before ({args.before}): ratio {median(befores):.2f}; candidate / before, "
              f"median of {args.rounds}: {median(gains):.2f}")
    print(f"baseline CPU per item: {1e3 / median(bases):.3f} ms (one process, all of it scoring)")
    print_breakdown(run, ["receive", "pool_supervisor", "worker_ipc", "scoring", "encode"],
                    f"math, {args.mix} mix, last round")


if __name__ == "__main__":
    main()
