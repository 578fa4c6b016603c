"""`make demo-entropy`: does the adaptive entropy controller hold entropy at its target?

Runs the demo's recipe (trainer/configs/demo.yaml) over 3 seeds twice, as it is (adaptive
entropy control) and with ``magic.entropy_mode=off``, everything else equal, then:

- plots both arms' entropy (10-step trailing mean; mean over seeds, the band spanning them)
  against the target, with the controller's coefficient, into docs/demo/entropy_control.png;
- prints, per arm, the mean entropy over the window where the controller acts (per seed: from
  the step its adaptive run first reaches the target to the end; its last 40 steps if it never
  does) and its mean shortfall below the target,
  and the paired difference (adaptive - off, same seed) with its 90% t interval
  (trainer/ablation/stats.py); writes the same to docs/demo/entropy_control.json.

Runs go to runs/demo-entropy/ARM-sSEED; a finished one is not run again. ``--jobs 2`` runs two
at a time. Extra ``key=value`` arguments reach every run (e.g. ``total_steps=40``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.demo import write_data  # noqa: E402 - after the path
from trainer.ablation.report import band, fmt  # noqa: E402
from trainer.ablation.stats import check_verdict, pair_by_seed  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.plot import plt, read_metrics, series, trailing_mean  # noqa: E402

CONFIG = ROOT / "trainer" / "configs" / "demo.yaml"
ARMS = {"adaptive": [], "off": ["magic.entropy_mode=off"]}
SEEDS = (0, 1, 2)


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / f"{arm}-s{seed}"


def finished(run: Path, total_steps: int) -> bool:
    try:
        rows = read_metrics(run)
    except FileNotFoundError:
        return False
    return any(r.get("step") == total_steps and "eval/accuracy" in r for r in rows)


def train(out: Path, arm: str, seed: int, extra: list[str], total_steps: int) -> str:
    run = run_dir(out, arm, seed)
    if finished(run, total_steps):
        return f"{run.name}: finished before, not run again"
    shutil.rmtree(run, ignore_errors=True)  # a half-made run is made again, not resumed
    log = out / f"{run.name}.log"
    cmd = [sys.executable, "-m", "trainer.cli", "run", "--config", str(CONFIG),
           f"seed={seed}", f"name={run.name}", f"output_dir={out}", "checkpoint_every=0",
           "log.tensorboard=false", "log.progress=off", *ARMS[arm], *extra]
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            check=False).returncode
    if rc != 0:
        raise RuntimeError(f"{run.name} failed (exit {rc}): see {log}")
    return f"{run.name}: finished"


def smoothed(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = series(rows, key)
    return xs, trailing_mean(ys)


def analyse(out: Path, target: float, figure: Path, summary: Path) -> dict:
    rows = {(arm, s): read_metrics(run_dir(out, arm, s)) for arm in ARMS for s in SEEDS}
    # Each seed's window is where its controller acts: from the first step at which its
    # adaptive run's 10-step mean entropy reached the target, to the end; both arms of the seed
    # are read over it (until then they are the same run). A seed whose adaptive run never
    # reached the target is read over its last 40 steps (said in the output).
    starts: dict[int, int] = {}
    reached: dict[int, bool] = {}
    for s in SEEDS:
        xs, ys = smoothed(rows[("adaptive", s)], "entropy")
        hit = [x for x, y in zip(xs, ys) if y <= target][:1]
        last = max(r["step"] for r in rows[("adaptive", s)])
        starts[s], reached[s] = (hit[0], True) if hit else (max(1, last - 39), False)
    per_arm: dict[str, dict[int, dict[str, float]]] = {arm: {} for arm in ARMS}
    for (arm, s), rs in rows.items():
        window = [r for r in rs if isinstance(r.get("entropy"), float) and r["step"] >= starts[s]]
        ent = [r["entropy"] for r in window]
        per_arm[arm][s] = {
            "entropy": mean(ent) if ent else None,
            "shortfall": mean(max(0.0, target - e) for e in ent) if ent else None,
            "eval/accuracy": next((r["eval/accuracy"] for r in reversed(rs)
                                   if "eval/accuracy" in r), None)}
    result: dict = {"target": target, "window_start": starts, "target_reached": reached,
                    "seeds": list(SEEDS),
                    "per_seed": per_arm, "paired": {}}
    for key in ("entropy", "shortfall", "eval/accuracy"):
        r = check_verdict(pair_by_seed({s: v[key] for s, v in per_arm["off"].items()},
                                       {s: v[key] for s, v in per_arm["adaptive"].items()}),
                          "lower" if key == "shortfall" else "higher")
        result["paired"][key] = {"adaptive_minus_off": r.mean, "ci90": [r.low, r.high],
                                 "pairs": r.pairs, "verdict": r.verdict}
    summary.write_text(json.dumps(result, indent=1) + "\n")

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(7, 6), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 1]})
    for i, arm in enumerate(ARMS):
        xs, mid, lo, hi = band([smoothed(rows[(arm, s)], "entropy") for s in SEEDS])
        ax.plot(xs, mid, color=f"C{i}", label=f"{arm} ({len(SEEDS)} seeds)")
        ax.fill_between(xs, lo, hi, color=f"C{i}", alpha=0.2)
    ax.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_ylabel("entropy (nats/token, 10-step mean)")
    ax.set_title("demo recipe: adaptive entropy control against none")
    ax.legend(fontsize=8)
    xs, mid, lo, hi = band([series(rows[("adaptive", s)], "entropy/coef") for s in SEEDS])
    bx.plot(xs, mid, color="C0")
    bx.fill_between(xs, lo, hi, color="C0", alpha=0.2)
    bx.set_ylabel("coefficient")
    bx.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(figure, dpi=80)
    plt.close(fig)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "demo-entropy")
    ap.add_argument("--figure", type=Path, default=ROOT / "docs" / "demo" / "entropy_control.png")
    ap.add_argument("overrides", nargs="*", help="key=value for every run")
    args = ap.parse_args(argv)
    cfg = load_config(CONFIG, args.overrides)
    write_data(ROOT / "runs" / "demo-data")
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        jobs = [pool.submit(train, args.out, arm, s, args.overrides, cfg.total_steps)
                for s in SEEDS for arm in ARMS]
        for j in jobs:
            print(j.result(), flush=True)
    result = analyse(args.out, cfg.magic.entropy_target, args.figure,
                     args.figure.with_suffix(".json"))
    print(f"target {result['target']:g}; each seed read from the step its adaptive run reached "
          "the target (else its last 40 steps) to the end: " + ", ".join(
              f"seed {s} from step {w}" + ("" if result["target_reached"][s] else
                                           " (never reached)")
              for s, w in result["window_start"].items()))
    for arm, seeds in result["per_seed"].items():
        print(f"  {arm:9s} entropy " + "  ".join(
            f"s{s} {fmt(v['entropy'])} (shortfall {fmt(v['shortfall'])}, held-out "
            f"{fmt(v['eval/accuracy'])})" for s, v in seeds.items()))
    for key, p in result["paired"].items():
        ci = ("[{:+.4f}, {:+.4f}]".format(*p["ci90"]) if p["ci90"][0] is not None
              else "(none)")
        print(f"  {key}: adaptive - off = {fmt(p['adaptive_minus_off'])}, 90% interval {ci} "
              f"over {p['pairs']} seeds -> {p['verdict']}")
    print(f"plot: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
