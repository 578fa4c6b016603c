"""``trainer`` command line: ``run`` and ``plot``.

    trainer run --config FILE [--verifier-addr ADDR[,ADDR...]] [key=value ...]
    trainer run --resume runs/NAME [key=value ...]
    trainer plot runs/NAME
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

log = logging.getLogger("trainer")


def _setup_logging() -> None:
    from verifier.cli import setup_logging

    setup_logging("text")
    try:  # transformers' per-file progress bars drown the run's own output
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def cmd_run(args: argparse.Namespace) -> int:
    from trainer.loop import Trainer
    from trainer.run_config import load_config

    overrides = list(args.overrides)
    if args.resume:
        run_dir = Path(args.resume)
        cfg_file = run_dir / "config.yaml"
        if not cfg_file.exists():
            raise SystemExit(f"error: {run_dir} has no config.yaml: not a run directory")
        config_path: Path | None = cfg_file
    else:
        if args.config is None:
            raise SystemExit("error: give --config FILE (or --resume runs/NAME)")
        config_path = Path(args.config)
    if args.verifier_addr:
        overrides.append(f"verifier.addr={args.verifier_addr}")
    try:
        cfg = load_config(config_path, overrides)
    except (ValueError, FileNotFoundError) as e:
        Console(stderr=True).print(f"[red]config error:[/red] {e}")
        return 2
    trainer = Trainer(cfg, resume=bool(args.resume))
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    table = Table(title=f"run {cfg.name}")
    table.add_column("")
    table.add_column("value", justify="right")
    for k, v in summary.items():
        table.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
    Console().print(table)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from trainer.plot import plot_run

    for p in plot_run(Path(args.run_dir)):
        print(p)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trainer", description="MAGIC RL trainer")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="train (or resume) a run")
    run.add_argument("--config", help="YAML config (see trainer/configs/)")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue runs/NAME from its latest checkpoint")
    run.add_argument("--verifier-addr", help="HOST:PORT[,HOST:PORT...] of a verifier fleet; "
                     "default: start a local one for the run")
    run.add_argument("overrides", nargs="*", help="key=value config overrides (dotted keys)")
    run.set_defaults(fn=cmd_run)
    plot = sub.add_parser("plot", help="write PNG plots of a run")
    plot.add_argument("run_dir")
    plot.set_defaults(fn=cmd_plot)
    args = ap.parse_args(argv)
    _setup_logging()
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
