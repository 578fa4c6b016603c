"""`make demo`: MAGIC RL in the toy world on a laptop CPU in a few minutes, through `trainer run`.

1. writes the toy world (datasets/toyworld.py: column addition of 2- to 4-digit numbers, a
   quarter of the problems as code judged in the sandbox) to runs/demo-data/, 200 held-out
   problems sharing no operand pair with training;
2. runs `trainer run --config trainer/configs/demo.yaml`: a tiny Qwen2-architecture model and a
   project-made tokenizer, a short supervised warm start on reference responses, then MAGIC RL
   with an embedded verifier (a local `verifier serve`), two stages of growing length limit,
   evaluation every 20 steps, sample completions every 10, checkpoints, TensorBoard files and
   PNG plots in runs/demo/;
3. prints held-out accuracy at every evaluation, how responses end over the last 10 steps, and
   the time, each against the demo's goal.

Extra arguments are `key=value` overrides for `trainer run` (e.g. `total_steps=40`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA_ARGS = ["--train", "6000", "--eval", "200", "--levels", "2,3,4", "--code-share", "0.25",
             "--verbose-share", "0.5", "--seed", "0"]
GOALS = {"gain_points": 15.0, "truncated_last10": 0.25, "seconds": 600.0}


def write_data(data: Path) -> None:
    """The toy world, regenerated when the generator's arguments change."""
    stamp = data / "ARGS"
    wanted = " ".join(DATA_ARGS)
    if (data / "eval.jsonl").exists() and stamp.exists() and stamp.read_text() == wanted:
        return
    subprocess.run([sys.executable, str(ROOT / "datasets" / "toyworld.py"), "--out", str(data),
                    *DATA_ARGS], check=True)
    stamp.write_text(wanted)


def summary(run: Path, seconds: float) -> list[str]:
    """The demo's numbers against its goals, from the run directory (``metrics.jsonl`` and
    ``samples/``). Overrides that switch evaluation or sample files off, or a run too short for
    10 steps, give the numbers there are and say what is missing, never a traceback."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "truncated/frac" in r]
    last = steps[-10:]
    samples = sorted((run / "samples").glob("step_*.jsonl"))
    closed = []
    for f in samples[-2:]:
        closed += ["</think>" in json.loads(x)["response"]
                   for x in f.read_text().splitlines() if x.strip()]

    def verdict(ok: bool) -> str:
        return "meets the goal" if ok else "MISSES the goal"

    out = ["held-out accuracy (avg@4 on 200 problems, temperature 0.6):"]
    if evals:
        (s0, a0), (s1, a1) = evals[0], evals[-1]
        gain = 100 * (a1 - a0)
        out += ["  " + "  ".join(f"step {s}: {a:.1%}" for s, a in evals),
                (f"  step {s0} -> {s1}: {gain:+.1f} points "
                 f"({verdict(gain >= GOALS['gain_points'])}: >= +{GOALS['gain_points']:.0f})")]
    else:
        out.append("  no evaluation ran (eval.every_steps = 0?): no gain to report")
    if last:
        trunc = sum(r["truncated/frac"] for r in last) / len(last)
        no_answer = sum(r["reward/no_answer_frac"] for r in last) / len(last)
        think = (f"think block closed in {sum(closed)}/{len(closed)} sampled responses "
                 f"(samples of steps {', '.join(f.stem[5:].lstrip('0') for f in samples[-2:])})"
                 if closed else "no sample completions kept (log.samples_every = 0?)")
        out.append(f"last {len(last)} steps: truncated {trunc:.3f} "
                   f"({verdict(trunc <= GOALS['truncated_last10'])}: "
                   f"<= {GOALS['truncated_last10']}), no answer (NO_ANSWER) {no_answer:.3f}, "
                   + think)
    else:
        out.append("no RL step ran: no truncation to report")
    out += [(f"time: {seconds:.0f} s for data, warm start, {len(steps)} RL steps, "
             f"{len(evals)} evaluations and plots ({verdict(seconds <= GOALS['seconds'])}: "
             f"<= {GOALS['seconds']:.0f} s)"),
            (f"run directory: {_shown(run)} (metrics.jsonl, samples/, plots/, "
             "checkpoints/, tensorboard/, config.yaml)")]
    return out


def _shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (runs/demo), else as given."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main() -> int:
    start = time.monotonic()
    write_data(ROOT / "runs" / "demo-data")
    run = ROOT / "runs" / "demo"
    shutil.rmtree(run, ignore_errors=True)  # a fresh run each time
    rc = subprocess.run([sys.executable, "-m", "trainer.cli", "run",
                         "--config", str(ROOT / "trainer" / "configs" / "demo.yaml"),
                         *sys.argv[1:]], cwd=ROOT, check=False).returncode
    if rc != 0:
        return rc
    print()
    print("\n".join(summary(run, time.monotonic() - start)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
