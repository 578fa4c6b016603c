"""``trainer plot runs/NAME``: PNG plots of a run from its metrics.jsonl.

Each plot marks the stage boundaries (a dashed line, with the stage's response limit), so the
plots tell the stage story together:

- reward.png: training reward (per step, and its 10-step mean) and held-out accuracy (overall
  and per data source);
- entropy.png: the policy's token entropy against the adaptive controller's target, and the
  entropy coefficient;
- length.png: mean response length under the stage's length limit, the truncated fraction and
  the share of responses without an answer;
- kl.png (runs with a KL loss): KL to the reference policy;
- time.png: time breakdown per step.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: plots are files, never windows
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

from trainer import metric_names as mn  # noqa: E402
from trainer.config import read_run_config  # noqa: E402

SMOOTH = 10  # steps in the trailing mean drawn over noisy per-step series


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a run directory?")
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key`` where it is a number (skipped steps log None)."""
    pts = [(r[mn.STEP], float(r[key])) for r in rows
           if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return [s for s, _ in pts], [v for _, v in pts]


def trailing_mean(values: list[float], window: int = SMOOTH,
                  starts: Iterable[int] = ()) -> list[float]:
    """Mean of the last ``window`` values at each point, restarting at every index in
    ``starts`` (a stage boundary: the mean never mixes two stages)."""
    out: list[float] = []
    first = 0
    restart = set(starts)
    for i in range(len(values)):
        if i in restart:
            first = i
        part = values[max(first, i - window + 1): i + 1]
        out.append(sum(part) / len(part))
    return out


def stage_starts(rows: list[dict]) -> list[tuple[int, int, Any]]:
    """(first step, stage index, max response length) of every stage seen in the run."""
    out: list[tuple[int, int, Any]] = []
    for r in rows:
        if mn.STAGE in r and mn.REWARD_MEAN in r and (not out or r[mn.STAGE] != out[-1][1]):
            out.append((r[mn.STEP], r[mn.STAGE], r.get(mn.STAGE_MAX_RESPONSE_LENGTH)))
    return out


def plot_run(run_dir: Path) -> list[Path]:
    """Write the PNGs into ``run_dir/plots`` and return their paths."""
    rows = read_metrics(run_dir)
    cfg = read_run_config(run_dir)  # None: no readable config.yaml, no target line
    magic_cfg = cfg.magic if cfg is not None else None
    out_dir = Path(run_dir) / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    stages = stage_starts(rows)

    def noisy(ax, key: str, color: str, label: str | None = None, style: str = "-") -> None:
        xs, ys = series(rows, key)
        if xs:
            firsts = {step for step, _, _ in stages[1:]}
            starts = [i for i, x in enumerate(xs) if x in firsts or (i and any(
                xs[i - 1] < f <= x for f in firsts))]
            ax.plot(xs, ys, style, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(xs, trailing_mean(ys, SMOOTH, starts), style, color=color,
                    label=label or key)

    def mark_stages(ax) -> None:
        for i, (step, index, limit) in enumerate(stages):
            if i:
                ax.axvline(step - 0.5, color="grey", linestyle="--", linewidth=0.8)
            name = f"stage {index + 1}" + (f": {limit} tokens" if limit else "")
            ax.annotate(name, xy=(step, 1.0), xycoords=("data", "axes fraction"),
                        xytext=(3, -12), textcoords="offset points", fontsize=8, color="grey")

    def finish(fig, ax, title: str, name: str, ax2=None, right_loc: str = "upper right") -> Path:
        mark_stages(ax)
        ax.set_title(title)
        ax.set_xlabel(f"step (faint: every step; solid: {SMOOTH}-step mean within each stage)",
                      fontsize=8)
        ax.legend(loc="upper left", fontsize=7, bbox_to_anchor=(0.0, 0.93))
        if ax2 is not None:
            ax2.legend(loc=right_loc, fontsize=7,
                       bbox_to_anchor=(1.0, 0.93) if right_loc == "upper right" else None)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=80)
        plt.close(fig)
        return path

    written = []
    # reward and held-out accuracy
    fig, ax = plt.subplots(figsize=(7, 4))
    noisy(ax, mn.REWARD_MEAN, "tab:blue", "training reward")
    eval_keys = [mn.EVAL_ACCURACY] + sorted({k for r in rows for k in r
                                            if k.startswith(mn.EVAL_PREFIX) and "/avg@" in k})
    for k, style in zip(eval_keys, ["o-", "s--", "^--", "v--", "D--", "x--"]):
        xs, ys = series(rows, k)
        if xs:
            ax.plot(xs, ys, style, markersize=4, label="held-out " + (
                "accuracy" if k == mn.EVAL_ACCURACY else k[len(mn.EVAL_PREFIX):]))
    ax.set_ylim(0, 1.05)
    written.append(finish(fig, ax, "reward and held-out accuracy", "reward.png"))

    # entropy against its target
    fig, ax = plt.subplots(figsize=(7, 4))
    noisy(ax, mn.ENTROPY, "tab:purple", "entropy (nats per token)")
    if magic_cfg is not None and magic_cfg.entropy_mode == "adaptive":
        target = magic_cfg.entropy_target
        ax.axhline(target, color="tab:purple", linestyle=":", label=f"target {target:g}")
    ax2 = ax.twinx()
    xs, ys = series(rows, mn.ENTROPY_COEF)
    if xs:
        ax2.plot(xs, ys, "-", color="tab:orange", linewidth=1, label="entropy coefficient")
    ax.set_ylim(bottom=0)
    written.append(finish(fig, ax, "entropy and its adaptive coefficient", "entropy.png", ax2))

    # length, limit, truncation
    fig, ax = plt.subplots(figsize=(7, 4))
    noisy(ax, mn.RESPONSE_LENGTH_MEAN, "tab:green", "response length (tokens)")
    xs, ys = series(rows, mn.STAGE_MAX_RESPONSE_LENGTH)
    if xs:
        ax.step(xs, ys, where="post", color="tab:green", linestyle=":",
                label="stage length limit")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    noisy(ax2, mn.TRUNCATED_FRAC, "tab:red", "truncated fraction")
    noisy(ax2, mn.REWARD_NO_ANSWER_FRAC, "black", "no answer (NO_ANSWER)", style="--")
    ax2.set_ylim(0, 1.05)
    written.append(finish(fig, ax, "response length, length limit and truncation",
                          "length.png", ax2, right_loc="center right"))

    if any(isinstance(r.get(mn.LOSS_KL), (int, float)) for r in rows):
        fig, ax = plt.subplots(figsize=(7, 4))
        noisy(ax, mn.LOSS_KL, "tab:cyan", "KL to the reference policy")
        kl_coef = magic_cfg.kl_coef if magic_cfg is not None else None
        written.append(finish(fig, ax, f"KL loss (coefficient {kl_coef})", "kl.png"))

    # time per step
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = sorted({r[mn.STEP] for r in rows if r.get(mn.STEP, 0) > 0})
    bottom = [0.0] * len(steps)
    for k in [mn.TIME_GENERATE, mn.TIME_VERIFY_WAIT, mn.TIME_UPDATE, mn.TIME_SYNC, mn.TIME_EVAL]:
        d = dict(zip(*series(rows, k)))
        if not d:
            continue
        vals = [d.get(s, 0.0) for s in steps]
        ax.bar(steps, vals, bottom=bottom, label=k)
        bottom = [b + v for b, v in zip(bottom, vals)]
    written.append(finish(fig, ax, "time per step (s)", "time.png"))
    return written
