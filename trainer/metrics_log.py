"""Per-step metrics: ``metrics.jsonl`` (one JSON object per step), TensorBoard event files,
optional Weights & Biases, and what a person watching sees: a live rich progress bar on a
terminal, or else one log line per step (``log.every_steps``), as verl prints each step's
metrics and TRL logs every ``logging_steps`` (nohup, SLURM, CI and pipes have no terminal)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainer import metric_names as mn

log = logging.getLogger(__name__)


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _finite(metrics: dict[str, Any], key: str) -> float | None:
    """``metrics[key]`` when it is a finite number this step, else None (a metric that does not
    exist this step, e.g. entropy when every group was filtered out, is left out, never nan)."""
    v = metrics.get(key)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def stage_label(index: int, names: Sequence[str]) -> str:
    """The stage as the docs name it: 1-based, with its name ("stage 2/2 (long)")."""
    if not names:
        return f"stage {index + 1}"
    name = names[index] if 0 <= index < len(names) else "?"
    return f"stage {index + 1}/{len(names)} ({name})"


def step_line(metrics: dict[str, Any], total: int, stage_names: Sequence[str] = ()) -> str:
    """One step's log line: step, stage, reward, held-out accuracy when evaluated, entropy,
    truncated share, mean response length and the step's seconds, each only when the step has
    it."""
    parts = [f"step {int(metrics.get(mn.STEP, 0))}/{total}",
             stage_label(int(metrics.get(mn.STAGE, 0)), stage_names)]
    for key, fmt in ((mn.REWARD_MEAN, "reward {:.3f}"), (mn.EVAL_ACCURACY, "eval {:.1%}"),
                     (mn.ENTROPY, "entropy {:.3f}"), (mn.TRUNCATED_FRAC, "truncated {:.1%}"),
                     (mn.RESPONSE_LENGTH_MEAN, "length {:.1f}"), (mn.TIME_STEP, "{:.1f} s")):
        v = _finite(metrics, key)
        if v is not None:
            parts.append(fmt.format(v))
    return "  ".join(parts)


class MetricsLogger:
    def __init__(self, run_dir: Path, settings: Any, resume_after: int = 0, total: int = 0,
                 stage_names: Sequence[str] = ()):
        self.path = run_dir / "metrics.jsonl"
        self.settings = settings
        self.total = total
        self.stage_names = tuple(stage_names)
        if self.path.exists():
            # On resume, drop steps logged after the checkpoint (the crashed run's tail), so
            # the file reads as one uninterrupted run.
            kept = [ln for ln in self.path.read_text().splitlines()
                    if ln.strip() and json.loads(ln).get(mn.STEP, 0) <= resume_after]
            self.path.write_text("".join(ln + "\n" for ln in kept) if resume_after else "")
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if settings.tensorboard:
            # lazy: optional (log.tensorboard); heavy
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_after + 1)
        self._wandb = None
        if settings.wandb:
            import wandb  # an explicit ask: a missing package is an error, not a silent skip

            self._wandb = wandb.init(project="magic-rlvr", name=run_dir.name, dir=str(run_dir),
                                     resume="allow")
        self._progress: Progress | None = None
        self._task = None

    def log(self, metrics: dict[str, Any]) -> None:
        row = {k: _jsonable(v) for k, v in metrics.items()}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        step = int(metrics.get(mn.STEP, 0))
        for k, v in metrics.items():
            if k != mn.STEP and isinstance(v, (int, float)) and math.isfinite(v):
                if self._tb is not None:
                    self._tb.add_scalar(k, v, step)
        if self._tb is not None:
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(row, step=step)
        if self._progress is not None and self._task is not None and mn.REWARD_MEAN in metrics:
            info = step_line(metrics, self.total, self.stage_names).split("  ", 1)[1]
            self._progress.update(self._task, completed=step, info=info)
        elif self._progress is None and self._every(step, metrics):
            log.info(step_line(metrics, self.total, self.stage_names))

    def _every(self, step: int, metrics: dict[str, Any]) -> bool:
        """Whether this step gets a log line: every ``log.every_steps`` steps, and every
        evaluation (step 0's included)."""
        every = getattr(self.settings, "every_steps", 1)
        return bool(every) and (step % every == 0 or mn.EVAL_ACCURACY in metrics)

    def start_progress(self, total: int, done: int) -> None:
        console = Console(stderr=True)
        mode = self.settings.progress
        if mode == "off" or (mode == "auto" and not console.is_terminal):
            return
        self._progress = Progress(TextColumn("[bold]step"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                                  console=console)
        self._progress.start()
        self._task = self._progress.add_task("train", total=total, completed=done, info="")

    def stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def close(self) -> None:
        self.stop_progress()
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
