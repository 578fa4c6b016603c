"""Per-step metrics: ``metrics.jsonl`` (one JSON object per step), TensorBoard event files,
optional Weights & Biases, and a live rich progress bar (reward, entropy, stage)."""

from __future__ import annotations

import json
import logging
import math
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


class MetricsLogger:
    def __init__(self, run_dir: Path, settings: Any, resume_after: int = 0):
        self.path = run_dir / "metrics.jsonl"
        self.settings = settings
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
            entropy = metrics.get(mn.ENTROPY)
            info = (f"reward {metrics[mn.REWARD_MEAN]:.3f}  "
                    f"entropy {float('nan') if entropy is None else entropy:.3f}  "
                    f"coef {metrics.get(mn.ENTROPY_COEF, 0):.4f}  "
                    f"stage {metrics.get(mn.STAGE, 0)}")
            if mn.EVAL_ACCURACY in metrics:
                info += f"  eval {metrics[mn.EVAL_ACCURACY]:.3f}"
            self._progress.update(self._task, completed=step, info=info)

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
