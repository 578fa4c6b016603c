"""``trainer ablate --jobs 2`` against ``--jobs 1``: the wall-clock of the same ablation's runs.

Workload: ``trainer ablate off-policy --variants on-policy,nsgd2-reuse --seeds 2 --world demo``
(4 runs of the demo's config, ``--steps`` steps each, the end evaluation included), from one
warm start made first and not timed. Baseline: ``--jobs 1`` (one run at a time); candidate:
``--jobs 2``. Each measurement starts from no runs (the ablation's directory removed, the warm
start kept); baseline and candidate alternate for ``--rounds`` rounds (the machine is shared)
and the ratios' median (baseline seconds / candidate seconds) is the result. Every run is one
CPU thread (the demo config's torch_threads and the engine's cpu_threads), so on a machine of
2 cores or more the two runs of ``--jobs 2`` do not share a core; the verifier each run starts
does share them. Meaningful on an otherwise idle machine.

    .venv/bin/python benchmarks/bench_ablate_jobs.py [--steps 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ablate(out: Path, steps: int, jobs: int, seeds: int, variants: str) -> float:
    """Seconds of one ``trainer ablate`` command; an error if it does not finish."""
    cmd = [sys.executable, "-m", "trainer.cli", "ablate", "off-policy", "--world", "demo",
           "--seeds", str(seeds), "--variants", variants, "--out", str(out), "--jobs", str(jobs),
           "--set", f"total_steps={steps}", "--set", "eval.every_steps=0"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"error: trainer ablate --jobs {jobs} exited {r.returncode}:\n"
                         f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="training steps per run (default 10)")
    ap.add_argument("--rounds", type=int, default=2, help="baseline/candidate pairs (default 2)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        warm = ablate(out, 1, 1, 1, "on-policy")  # the shared warm start (and the data)
        print(f"warm start and a 1-step run: {warm:.0f} s (not timed below)")
        ratios = []
        for i in range(args.rounds):
            times = {}
            for jobs in (1, 2):
                shutil.rmtree(out / "off-policy")
                times[jobs] = ablate(out, args.steps, jobs, 2, "on-policy,nsgd2-reuse")
            ratios.append(times[1] / times[2])
            print(f"round {i + 1}: --jobs 1 {times[1]:.0f} s, --jobs 2 {times[2]:.0f} s: "
                  f"ratio {ratios[-1]:.2f}", flush=True)
    print(f"4 runs of {args.steps} steps: --jobs 2 is {statistics.median(ratios):.2f}x as fast "
          f"as --jobs 1 (median of {args.rounds} rounds: "
          f"{', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
