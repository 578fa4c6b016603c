"""``verifier.dedupe`` on against off: the same training run, judging each distinct response of
a step once against judging every sample.

Workload: the ``off-policy`` ablation's ``on-policy`` run in its world (``rare-way``: half the
problems code, each code sample a sandbox run) from a warm start made first and not timed
(``trainer ablate``'s own: trainer/ablation/runner.py), ``--steps`` steps with held-out
evaluations every ``--eval-every``. Baseline: ``verifier.dedupe=false``; candidate: the
default. Both alternate for ``--rounds`` rounds (the machine is shared); the result is the
median ratio of the runs' step-plus-evaluation seconds (baseline / candidate). Also printed:
the share of responses judged and whether the two runs' numbers (every metric but time and
``rollout/judged``) are the same, as they must be for deterministic programs.

    .venv/bin/python benchmarks/bench_dedupe.py [--steps 40] [--eval-every 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(driver, model: Path, steps: int, eval_every: int, dedupe: bool, name: str) -> list[dict]:
    """One ``trainer run`` of the ablation's on-policy arm; its metrics rows."""
    from trainer.ablation.runner import BASE_CONFIG

    variant = next(v for v in driver.variants if v.name == "on-policy")
    overrides = [*driver.run_overrides(variant, 0, model), f"name={name}",
                 f"total_steps={steps}", f"eval.every_steps={eval_every}",
                 f"verifier.dedupe={str(dedupe).lower()}", "log.samples_every=0"]
    r = subprocess.run([sys.executable, "-m", "trainer.cli", "run", "--config",
                        str(BASE_CONFIG), *overrides], cwd=ROOT, capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        raise SystemExit(f"error: trainer run (dedupe={dedupe}) exited {r.returncode}:\n"
                         f"{r.stderr[-3000:]}")
    out = driver.root / "runs" / name / "metrics.jsonl"
    return [json.loads(x) for x in out.read_text().splitlines()]


def seconds(rows: list[dict]) -> float:
    return sum(row.get("time/step", 0.0) + row.get("time/eval", 0.0) for row in rows)


def numbers(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time/") and k != "rollout/judged"}
            for row in rows]


def main() -> None:
    from trainer.ablation.runner import AblateOptions, Driver

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    ap.add_argument("--eval-every", type=int, default=20,
                    help="steps between held-out evaluations (default 20)")
    ap.add_argument("--rounds", type=int, default=2, help="baseline/candidate pairs (default 2)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        driver = Driver(AblateOptions("off-policy", profile="quick", seeds=1,
                                      variants=["on-policy"], out=Path(d)))
        driver.write_data()
        model = driver.warm_start(0)
        ratios, same, judged = [], True, []
        for i in range(args.rounds):
            rows = {dedupe: run(driver, model, args.steps, args.eval_every, dedupe,
                                f"r{i}-{'on' if dedupe else 'off'}") for dedupe in (False, True)}
            same = same and numbers(rows[True]) == numbers(rows[False])
            steps = [row for row in rows[True] if "rollout/judged" in row]
            judged.append(sum(r["rollout/judged"] for r in steps)
                          / sum(r["rollout/responses"] for r in steps))
            ratios.append(seconds(rows[False]) / seconds(rows[True]))
            print(f"round {i + 1}: judging every sample {seconds(rows[False]):.0f} s, each "
                  f"distinct response once {seconds(rows[True]):.0f} s ({judged[-1]:.0%} of "
                  f"training responses judged): ratio {ratios[-1]:.2f}", flush=True)
    print(f"{args.steps} steps of the rare-way world's on-policy run: dedupe is "
          f"{statistics.median(ratios):.2f}x as fast (median of {args.rounds} rounds: "
          f"{', '.join(f'{r:.2f}' for r in ratios)}); numbers the same: "
          f"{'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
