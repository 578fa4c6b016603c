"""``trainer plot runs/NAME``: PNG plots of a run from its metrics.jsonl.

reward.png (reward, by source, eval accuracy), entropy.png (entropy and its coefficient),
length.png (response length and truncation), time.png (time breakdown per step).
"""

from __future__ import annotations

import json
from pathlib import Path

PLOTS = {
    "reward.png": ("reward and evaluation accuracy", ["reward/mean", "eval/accuracy"], "reward/by_source/"),
    "entropy.png": ("entropy and its coefficient", ["entropy", "entropy/coef"], None),
    "length.png": ("response length and truncation", ["response_length/mean", "truncated/frac"], None),
    "time.png": ("time per step (s)", ["time/generate", "time/verify_wait", "time/update", "time/sync", "time/eval"], None),
}
SECONDARY = {"entropy/coef", "truncated/frac"}


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a run directory?")
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def plot_run(run_dir: Path) -> list[Path]:
    """Write the PNGs into ``run_dir/plots`` and return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    out_dir = Path(run_dir) / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (title, keys, prefix) in PLOTS.items():
        all_keys = list(keys)
        if prefix:
            all_keys += sorted({k for r in rows for k in r if k.startswith(prefix)})
        fig, ax = plt.subplots(figsize=(7, 4))
        ax2 = None
        if name == "time.png":
            series = [(k, [(r["step"], r[k]) for r in rows if k in r and r.get("step", 0) > 0])
                      for k in all_keys]
            series = [(k, pts) for k, pts in series if pts]
            steps = sorted({s for _, pts in series for s, _ in pts})
            bottom = [0.0] * len(steps)
            for k, pts in series:
                d = dict(pts)
                vals = [d.get(s, 0.0) for s in steps]
                ax.bar(steps, vals, bottom=bottom, label=k)
                bottom = [b + v for b, v in zip(bottom, vals)]
        else:
            for k in all_keys:
                pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
                if not pts:
                    continue
                target = ax
                if k in SECONDARY:
                    ax2 = ax2 or ax.twinx()
                    target = ax2
                xs, ys = zip(*pts)
                style = "o-" if k.startswith("eval/") else "-"
                target.plot(xs, ys, style, label=k, markersize=3)
            if ax2 is not None:
                ax2.legend(loc="lower right", fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
