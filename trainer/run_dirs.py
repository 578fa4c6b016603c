"""Whose a run directory is: no run is overwritten without being asked, and a start that fails
leaves no half-made directory behind.

``trainer run`` with a name whose directory already holds a run (its ``config.yaml``,
``metrics.jsonl`` or checkpoints) is refused unless ``--resume`` continues it or ``--overwrite``
starts afresh; ``--overwrite`` moves the old run aside (``NAME.replaced-YYYYmmdd-HHMMSS``), it
never deletes it. Why: a reused name once cut a 35-step run's metrics to 2 rows without a word
and left its checkpoints beside the new run's (issue 46).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints")
"""What makes a directory a run's: a directory holding none of these is free to use."""


class RunDirTaken(Exception):
    """The run directory holds a run and neither --resume nor --overwrite was given."""


def holds_run(run_dir: Path) -> bool:
    return any((run_dir / name).exists() for name in RUN_FILES)


def claim(run_dir: Path, *, resume: bool, overwrite: bool) -> tuple[bool, Path | None]:
    """Make ``run_dir`` this start's: returns (whether it holds nothing of an earlier start, so
    a failed start may remove it; where an old run was moved, or None).

    Raises:
        RunDirTaken: it holds a run, and neither ``resume`` nor ``overwrite`` says what to do.
    """
    if resume:
        return False, None
    moved = None
    if holds_run(run_dir):
        if not overwrite:
            found = ", ".join(n for n in RUN_FILES if (run_dir / n).exists())
            raise RunDirTaken(f"{run_dir} holds a run already ({found}): continue it with "
                              f"--resume {run_dir}, or start afresh with --overwrite (the old "
                              "run is moved aside, not deleted)")
        stem = f"{run_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        moved, n = run_dir.with_name(stem), 1
        while moved.exists():  # two replacements within a second
            n += 1
            moved = run_dir.with_name(f"{stem}-{n}")
        run_dir.rename(moved)
    fresh = not run_dir.exists() or not any(run_dir.iterdir())
    return fresh, moved


def release(run_dir: Path) -> None:
    """Remove what a failed start made in a directory it found empty or missing."""
    shutil.rmtree(run_dir, ignore_errors=True)
