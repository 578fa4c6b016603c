"""The `entropy-control` ablation (Skywork-OR1 §4.5, Ablation 9) on a toy world with several
ways to a correct response, where the report's entropy story can happen.

The demo's toy world has one reference response per problem, so its warm-started policy is
near-deterministic (about 0.10 nats/token) and has nothing to collapse onto. This world
(datasets/toyworld.py ``--ways units,carry,swap,copy``, otherwise the demo's data arguments) has
three scratchpads per problem that are as good as each other and, for code problems, a fourth
way that needs no arithmetic (``return x+A+B``); the warm start trains on a uniformly drawn one
per problem per step (``warm_start.response_template={references}``), so RL starts spread over
the ways.

    python scripts/entropy_world.py --seeds 3 --jobs 2          # adaptive and off, 3 seeds each

runs ``trainer ablate entropy-control``'s variants (``adaptive``, ``off``; its setup,
(N_SGD, D_R, D_T, N_reuse) = (4, 16, 4, 1)) through trainer/ablation/runner.py's driver in the
``ways`` world (trainer/ablation/designs.py WORLDS: ``trainer ablate entropy-control --world
ways`` runs the same, one run at a time), under ``--out`` (default runs/entropy-world): the same
report.md,
summary.json and plots as ``trainer ablate``, plus ways.json: which way each run's sampled
responses took, per 20 steps (every prompt's 8 samples are kept every 5 steps). Extra
``--set key=value`` overrides reach every run (after the defaults below). ``--check`` only
warm-starts (once per ``--out``) and prints the entropy of the warm-started policy's first RL
step and the ways of its rollouts there. ``--world rare-way`` does the same in that world (the
entropy-control and off-policy ablations' own). ``--ways-of DIR`` only reads: the ways of the
kept samples of every run under DIR (a ``runs/`` folder of ``trainer ablate``), per 20 steps.

Measured (2-core CPU shared with other low-priority runs, two runs at a time; 160 steps each,
750-950 s per run, as a demo-world run under the same load; the entropy target is the demo's
ratio to the starting entropy, 0.8x):

- the demo's 1000-step warm start on the mix (``--set magic.entropy_target=0.18``, 1 seed):
  RL starts at 0.23 nats/token but 14% held-out accuracy; most of that entropy is a blurred
  skill, not the way choice. Off: entropy 0.04 at the end, held-out 65%; adaptive: 0.17, 56%.
- a 3000-step warm start (``--set warm_start.steps=3000 --set magic.entropy_target=0.07``,
  3 seeds): RL starts at 0.09-0.11 nats/token and 61-64% held-out, the ways spread (math:
  units 36%, carry 39%, swap 10%; code: copy 16%). Off collapses onto carry (math, 99%) and
  copy (code), entropy 0.014 at the end against the controller's 0.066 (reproduced: 90%
  interval of the paired difference excludes 0), but held-out accuracy is HIGHER without
  control: 98.7% against 91.2% at the end, 90.9% against 86.4% averaged over the evaluations
  (not reproduced). Both arms find the copy way for code (100% code accuracy): exploring
  the ways pays, and the off-policy updates explore enough without the bonus.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.ablation.runner import (  # noqa: E402 - after the path
    AblateOptions,
    Driver,
    write_outputs,
)
from trainer.ablation.report import build_summary  # noqa: E402


class WaysDriver(Driver):
    """trainer/ablation/runner.py's driver, with several runs at a time."""

    def run_parallel(self, jobs: int):
        self.root.mkdir(parents=True, exist_ok=True)
        self.write_data()
        model = self.warm_start()
        pairs = [(v, s) for s in self.seeds for v in self.variants]
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            outcomes = list(pool.map(lambda vs: self.run_one(vs[0], vs[1], model), pairs))
        for o in outcomes:
            print(f"[{self.ablation.name}] {o.variant} seed {o.seed}: {o.status} "
                  f"({o.seconds:.0f} s) {o.error}", flush=True)
        summary = build_summary(self.ablation, self.variants, outcomes, self.quadruples(),
                                base=self.out)
        summary["profile"] = self.profile.name
        write_outputs(self, summary, outcomes)
        return summary, outcomes


# -- which way a response took --------------------------------------------------------------------

_OPERANDS = re.compile(r"(\d+)\+(\d+)\.?$")
_COPY_SHAPE = re.compile(r"\d+\+\d+")


def operands(prompt: str) -> tuple[str, str] | None:
    """(A, B) of "Compute A+B." or "Write f(x) that returns x+A+B."."""
    m = _OPERANDS.search(prompt.strip())
    return (m.group(1), m.group(2)) if m else None


def way_of(prompt: str, response: str) -> str:
    """The way a response took (datasets/toyworld.py's WAYS), read from how it begins, so that
    a later slip does not change it: ``copy`` (the think block is ``A+B``, or any ``X+Y`` of
    digits: the copying way with its digits wrong), ``carry`` (the first
    column writes its ``+0``), ``units`` or ``swap`` (the first column whose digits differ comes
    in the prompt's order, or the other); "units|swap" when no column tells (equal digits),
    "other" when the beginning fits none (wrong digits, no scratchpad)."""
    ops = operands(prompt)
    think = response.split("<think>", 1)[-1].split("</think>", 1)[0].strip()
    if ops is None or not think:
        return "other"
    a, b = ops
    if think == f"{a}+{b}" or _COPY_SHAPE.fullmatch(think):
        return "copy"  # the copying way, its digits right or not
    think = re.sub(r"^\d+\+\d+: ", "", think)  # the verbose restatement
    steps = think.split(" ")
    first = steps[0].split("=")[0].split("+")
    if len(first) == 3 and first[2] == "0":
        return "carry"
    if len(first) != 2:
        return "other"
    for i, step in enumerate(steps[:min(len(a), len(b))]):
        terms = step.split("=")[0].split("+")[:2]
        x, y = a[-1 - i], b[-1 - i]
        if x != y:
            return "units" if terms == [x, y] else "swap" if terms == [y, x] else "other"
    return "units|swap"


def way_counts(run: Path, every: int = 20) -> dict[str, dict[str, int]]:
    """Per window of ``every`` steps (keyed by its first step), the ways of the run's kept
    samples, split by domain (``math:units``, ``code:copy``, ...)."""
    out: dict[str, Counter] = {}
    for f in sorted((run / "samples").glob("step_*.jsonl")):
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            dom = "code" if r.get("data_source") == "toy_code" else "math"
            window = str((int(r["step"]) - 1) // every * every + 1)
            out.setdefault(window, Counter())[f"{dom}:{way_of(r['prompt'], r['response'])}"] += 1
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items(), key=lambda kv: int(kv[0]))}


def per_run(run: Path, seconds: float) -> dict:
    """One run's numbers: rollout entropy at step 1, entropy over the last 10 steps, held-out
    accuracy at the end (all, math, code), its mean over the evaluations after step 0, the ways
    of the last 20 steps' kept samples (shares per domain), and the wall-clock."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "entropy" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    last_ways = list(way_counts(run).values())[-1:] or [{}]
    shares: dict[str, dict[str, float]] = {}
    for dom in ("math", "code"):
        mine = {k.split(":", 1)[1]: v for k, v in last_ways[0].items() if k.startswith(dom)}
        n = sum(mine.values()) or 1
        shares[dom] = {k: round(v / n, 3) for k, v in sorted(mine.items(), key=lambda kv: -kv[1])}
    return {"entropy_rollout_step1": steps[0].get("entropy/rollout") if steps else None,
            "entropy_final": sum(r["entropy"] for r in steps[-10:]) / max(1, len(steps[-10:])),
            "eval_step0": evals[0]["eval/accuracy"] if evals else None,
            "eval_final": evals[-1]["eval/accuracy"] if evals else None,
            "eval_final_math": evals[-1].get("eval/toy_math/avg@4") if evals else None,
            "eval_final_code": evals[-1].get("eval/toy_code/avg@4") if evals else None,
            "eval_auc": (sum(r["eval/accuracy"] for r in evals[1:]) / len(evals[1:])
                         if len(evals) > 1 else None),
            "ways_last20": shares, "seconds": round(seconds)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    ap.add_argument("--profile", default="full", help="trainer ablate's profile (default full)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "entropy-world")
    ap.add_argument("--variants", default="adaptive,off")
    ap.add_argument("--set", dest="extra", action="append", default=[],
                    help="key=value for every run (repeatable)")
    ap.add_argument("--world", default="ways", choices=["ways", "rare-way"],
                    help="the world (trainer/ablation/designs.py WORLDS; default ways)")
    ap.add_argument("--ways-of", type=Path, default=None, metavar="DIR",
                    help="only print the ways of the kept samples of the runs under DIR")
    ap.add_argument("--check", action="store_true",
                    help="only warm-start and print the first RL step's entropy")
    args = ap.parse_args(argv)
    if args.ways_of is not None:
        runs = sorted(p for p in args.ways_of.iterdir() if (p / "samples").is_dir())
        if not runs:
            ap.exit(2, f"error: no run with kept samples under {args.ways_of}\n")
        for run in runs:
            print(run.name)
            for window, counts in way_counts(run).items():
                n = sum(counts.values())
                print(f"  steps {window}+: " + ", ".join(f"{k} {v / n:.0%}"
                                                        for k, v in counts.items()))
        return 0
    driver = WaysDriver(AblateOptions("entropy-control", profile=args.profile, seeds=args.seeds,
                                      out=args.out, variants=args.variants.split(","),
                                      extra=args.extra, world=args.world))
    if args.check:
        driver.write_data()
        model = driver.warm_start()
        rows = [json.loads(x) for x in (model.parent / "metrics.jsonl").read_text().splitlines()
                if x.strip()]
        first = next(r for r in rows if "entropy" in r)
        print(f"warm start: {model}; step 1: entropy {first['entropy']:.4f}, rollout entropy "
              f"{first.get('entropy/rollout', float('nan')):.4f}, reward "
              f"{first.get('reward/mean', float('nan')):.3f}")
        # The warm-started policy's own samples: one RL step that keeps every prompt's 8
        # rollouts (sampled before its update).
        run = driver.out / "check-samples"
        if not (run / "samples" / "step_000001.jsonl").exists():
            driver._child([*driver.common(), *driver.data_overrides(), f"model_path={model}",
                           "tiny_model=null", "warm_start.steps=0", "total_steps=1",
                           "eval.every_steps=0", "log.samples_every=1", "log.plots=false",
                           "seed=0", f"name={run.name}", f"output_dir={driver.out}"],
                          driver.out / "logs" / f"{run.name}.log", resume=None)
        counts = way_counts(run, every=1).get("1", {})
        n = sum(counts.values())
        print(f"ways of the warm-started policy's {n} rollouts at step 1: " + ", ".join(
            f"{k} {v / n:.0%}" for k, v in counts.items()))
        return 0
    summary, outcomes = driver.run_parallel(args.jobs)
    ways = {f"{o.variant}-s{o.seed}": way_counts(o.run_dir) for o in outcomes}
    (driver.root / "ways.json").write_text(json.dumps(ways, indent=1) + "\n")
    runs = {f"{o.variant}-s{o.seed}": per_run(o.run_dir, o.seconds) for o in outcomes
            if (o.run_dir / "metrics.jsonl").exists()}
    (driver.root / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    for name, r in runs.items():
        print(f"  {name:12s} entropy step 1 {r['entropy_rollout_step1']:.3f} -> last 10 steps "
              f"{r['entropy_final']:.3f}; held-out {r['eval_step0']:.3f} -> {r['eval_final']:.3f}"
              f" (math {r['eval_final_math']:.3f}, code {r['eval_final_code']:.3f}; mean after "
              f"step 0 {r['eval_auc']:.3f}); {r['seconds']} s; ways {r['ways_last20']}")
    print(f"report: {driver.root / 'report.md'}; ways: {driver.root / 'ways.json'}; "
          f"per run: {driver.root / 'runs.json'}")
    return 0 if all(o.status in ("finished", "skipped", "reused") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
