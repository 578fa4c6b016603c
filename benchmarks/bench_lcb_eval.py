"""An LCB-scale evaluation: LiveCodeBench's own judge against ``verifier serve`` (``lcb``).

The same samples (bench_code.py's LiveCodeBench-like workload: stdin/stdout problems of 10-30
tests each, a fifth of them CPU-heavy, a few that never finish a test, 30% wrong programs) are
judged two ways on this machine, alternating for ``--rounds`` rounds:

- baseline: LiveCodeBench's ``codegen_metrics(samples, generations, k_list=[1],
  num_process_evaluate=2, timeout=6)`` (``lcb_runner/evaluation/compute_code_generation_metrics.py``:
  a process pool of 2, each sample judged in a process of its own, no sandbox), imported from
  a directory holding LiveCodeBench's ``lcb_runner/evaluation/`` at the commit the differential
  labels name (give it as the argument; LiveCodeBench's code is never part of this repository);
- candidate: a real ``verifier serve --workers 2 --profile lcb`` (nsjail), the samples streamed
  by one client.

It prints each side's wall time and samples/s, the ratio (candidate / baseline, median of the
rounds), and how many samples the two judges gave the same verdict (pass = every test passed).

    .venv/bin/python benchmarks/bench_lcb_eval.py /tmp/lcb [--n 100] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_code import make_samples  # noqa: E402 - after the path
from common import stream_run  # noqa: E402


def livecodebench(samples: list[dict], workers: int) -> tuple[float, list[bool]]:
    """Seconds for LiveCodeBench's judge on ``samples`` and its pass/fail per sample."""
    from lcb_runner.evaluation.compute_code_generation_metrics import (  # noqa: E402 - lazy:
        codegen_metrics,  # its directory is only known at run time
    )

    rows = [{"input_output": json.dumps(s["ground_truth"])} for s in samples]
    gens = [[s["program"]] for s in samples]
    start = time.perf_counter()
    # Its progress bar and prints go to this process's stdout and stderr. (Not redirected: its
    # judging processes are forked from here, and a redirected sys.stdout fails every test.)
    metrics, results, _ = codegen_metrics(rows, gens, k_list=[1],
                                          num_process_evaluate=workers, timeout=6)
    wall = time.perf_counter() - start
    passed = [all(r is True or (type(r) is int and r > 0) for r in results[i][0])
              for i in range(len(samples))]
    return wall, passed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lcb_dir", type=Path, help="a directory holding LiveCodeBench's lcb_runner/")
    ap.add_argument("--n", type=int, default=100, help="samples (default 100)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    ap.add_argument("--workers", type=int, default=2, help="processes on each side (default 2)")
    args = ap.parse_args()
    sys.path.insert(0, str(args.lcb_dir))
    samples = make_samples(args.n, workload="lcb")
    items = [dict({k: v for k, v in s.items() if k != "program"}, profile="lcb")
             for s in samples]
    for it in items:
        it.pop("limits", None)  # LiveCodeBench's 6 s per test on both sides
    warmup = [dict(it, id=f"w{it['id']}") for it in items[:5]]
    ratios, base_s, cand_s = [], [], []
    agree = total = 0
    for k in range(args.rounds):
        wall, lcb_pass = livecodebench(samples, args.workers)
        run = stream_run(items, args.workers, warmup, breakdown=False,
                         extra_args=("--profile", "lcb"))
        base_s.append(wall)
        cand_s.append(run.wall_s)
        ratios.append(wall / run.wall_s)
        ours = {r.id: r.status.value == "CORRECT" for r in run.results}
        agree = sum(ours[s["id"]] == p for s, p in zip(samples, lcb_pass))
        total = len(samples)
        print(f"round {k + 1}: LiveCodeBench {wall:6.1f} s ({len(samples) / wall:5.1f}/s)  "
              f"verifier {run.wall_s:6.1f} s ({run.rate:5.1f}/s)  ratio {ratios[-1]:.2f}  "
              f"same verdict {agree}/{total}", flush=True)
    tests = sum(len(s["ground_truth"]["inputs"]) for s in samples)
    print(f"samples: {args.n} ({tests} tests); LiveCodeBench passes {sum(lcb_pass)}, "
          f"the verifier (lcb) {sum(ours.values())}; same verdict on {agree} of {total}")
    print(f"LiveCodeBench codegen_metrics, {args.workers} processes, no sandbox: "
          f"{median(base_s):.1f} s")
    print(f"verifier serve --workers {args.workers} --profile lcb, nsjail: {median(cand_s):.1f} s")
    print(f"speed, verifier / LiveCodeBench, median of {args.rounds}: {median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
