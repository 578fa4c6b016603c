"""``trainer`` command line: ``run``, ``config show``, ``plot``, ``eval``, ``filter`` and
``ablate``.

    trainer run --config FILE [--verifier-addr ADDR[,ADDR...]] [key=value ...]
    trainer run --resume runs/NAME [key=value ...]
    trainer config show [--config FILE] [key=value ...]
    trainer plot runs/NAME
    trainer eval --model PATH --dataset aime24|aime25|lcb|FILE [--k 32] [--temperature 0.6]
                 [--top-p 1.0] [--max-tokens 32768] [--verifier-addr ADDR]
                 [--engine.kind hf|vllm] [--engine.FIELD VALUE ...]
    trainer filter --model PATH --input FILE --output FILE [--k 16 --lo 1 --hi 15]
    trainer filter --released-difficulty MODEL --input FILE --output FILE
    trainer ablate NAME [--profile quick|full|confirm] [--seeds N] [--out DIR] [--variants A,B]
                   [--set key=value ...]
    trainer ablate --list

Built like ``verifier``'s: each subcommand is one dataclass whose fields and docstrings tyro
turns into flags and help. ``eval`` and ``filter`` are the options dataclasses that
trainer/evaluation.py and trainer/magic/offline_filter.py run with, the rollout engine's
``EngineConfig`` nested under ``--engine.*`` (one declaration of every knob), declared in
trainer/command_options.py. ``trainer run
--help`` also lists every knob of the run config (trainer/config.py), the keys of
``key=value``.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import tyro
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainer import run_dirs
from trainer.command_options import EvalOptions, FilterOptions
from trainer.config import config_yaml, knob_help, load_config
from trainer.data import DataError
from trainer.engines import check_model_path, create_engine
from trainer.hf_utils import CheckpointError, load_tokenizer, problem_prompt_ids
from trainer.verifier_bridge import RewardError, verifier_connection
from verifier.logs import setup_logging

# Not imported here: trainer.loop, trainer.evaluation, trainer.magic.offline_filter, trainer.ablation.runner,
# trainer.dist and trainer.plot bring torch, transformers or matplotlib (about ten seconds on a
# small CPU). Each command imports what it runs, so --help, a misspelt flag and `trainer config
# show` answer in about a second (tests/test_cli_speed.py).

log = logging.getLogger("trainer")


def _setup_logging() -> None:
    setup_logging("text")


def _quiet_hf_downloads() -> None:
    """For the commands that load Hugging Face models: per-file progress bars would drown the
    command's own output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


# -- the subcommands' arguments --------------------------------------------------------------

@dataclass
class RunArgs:
    """Train (or resume) a run. Settings come from the YAML file, then the key=value
    overrides (dotted keys of the run config, listed below)."""

    overrides: tyro.conf.Positional[list[str]] = field(default_factory=list)
    """key=value config overrides, dotted keys (e.g. magic.group_size=8 data.train_files=[a,b])."""
    config: Path | None = None
    """YAML config (see trainer/configs/)."""
    resume: Path | None = None
    """Continue runs/NAME from its latest checkpoint (its config.yaml is the base)."""
    verifier_addr: str | None = None
    """HOST:PORT[,HOST:PORT...] of a verifier fleet; default: start a local one for the run."""
    overwrite: bool = False
    """Start afresh in a run directory that holds a run: the old run is moved aside to
    runs/NAME.replaced-YYYYmmdd-HHMMSS (never deleted). Without it (or --resume) such a start
    is refused."""


@dataclass
class ConfigArgs:
    """Print the resolved run config as YAML, each key with its help as a comment (what
    `trainer run` with the same arguments would use)."""

    action: tyro.conf.Positional[Literal["show"]]
    """What to do: show."""
    overrides: tyro.conf.Positional[list[str]] = field(default_factory=list)
    """key=value config overrides, dotted keys."""
    config: Path | None = None
    """YAML config (default: every default; then model_path or tiny_model and
    data.train_files must be given as overrides)."""
    resume: Path | None = None
    """A run directory: show its config.yaml with the overrides applied."""
    comments: bool = True
    """Write each key's help as # comments above it."""


@dataclass
class PlotArgs:
    """Write PNG plots of a run (reward, entropy, length, ...)."""

    run_dir: tyro.conf.Positional[Path]
    """The run directory (runs/NAME)."""


@dataclass
class AblateArgs:
    """Run one ablation of the Skywork-OR1 report on the toy world, through `trainer run`:
    DIR/NAME/report.md, plots and summary.json (trainer/ablation/runner.py)."""

    name: tyro.conf.Positional[str | None] = None
    """The ablation (--list names them)."""
    list_ablations: Annotated[bool, tyro.conf.arg(name="list")] = False
    """Name the ablations and their claims."""
    profile: Literal["quick", "full", "confirm"] = "quick"
    """quick: a smoke test, at most 30 min on a 2-core CPU (2 seeds, 60 steps); full: the demo's 160 steps, 6 seeds, the mechanism and benefit checks' arms and the cheap secondary ones (exploratory); confirm: the pre-registered design on its fresh seeds, one warm start per seed (docs/ablations/preregistration.md), from a clean checkout: the only runs the confirmatory table of docs/ablations/README.md counts."""
    seeds: int | None = None
    """Seeds per variant (default: the profile's: quick 2, full 6; confirm takes the registered seeds and refuses this)."""
    out: Path = Path("runs/ablate")
    """DIR: writes DIR/NAME/report.md, summary.json, plots and runs/."""
    variants: str | None = None
    """Comma list: run only these variants."""
    overrides: Annotated[tyro.conf.UseAppendAction[list[str]], tyro.conf.arg(name="set")] = \
        field(default_factory=list)
    """key=value config override for every run, after the profile's (repeatable)."""
    world: Literal["demo", "ways", "rare-way"] | None = None
    """The data the runs train on (default: the ablation's own world; --list names it): demo, the demo's toy world; ways, four equally good ways to an answer (docs/entropy-world); rare-way, a way the warm start rarely takes that alone fits the length limit for a quarter of the problems (trainer/ablation/designs.py WORLDS). Runs of one ablation in two worlds need two --out directories (a run directory made with another config is an error)."""
    jobs: int = 1
    """Runs at a time, each its own `trainer run` process (the warm starts too; the dose-finding runs stay one at a time). Each run uses one CPU thread (engine and trainer), so on 2 cores --jobs 2 finishes sooner (1.67x as fast for 4 short demo runs: benchmarks/bench_ablate_jobs.py); each run's own seconds grow. A run's numbers do not depend on it (a test compares them)."""


def knobs_text() -> str:
    """Every key of the run config with its type, default and help (``trainer run --help``)."""
    out = ["config keys (key=value overrides; `trainer config show` prints them as YAML):", ""]
    for key, kind, default, doc in knob_help():
        if len(default) > 60:
            default = default[:57] + "..."
        out.append(f"  {key}  ({kind}; default {default})")
        out += textwrap.wrap(doc, 96, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(out)


# -- the subcommands ----------------------------------------------------------------------------

def _resolved_config(args: RunArgs | ConfigArgs):
    overrides = list(args.overrides)
    if args.resume is not None:
        cfg_file = Path(args.resume) / "config.yaml"
        if not cfg_file.exists():
            raise SystemExit(f"error: {args.resume} has no config.yaml: not a run directory")
        config_path: Path | None = cfg_file
    else:
        config_path = args.config
    if getattr(args, "verifier_addr", None):
        overrides.append(f"verifier.addr={args.verifier_addr}")
    return load_config(config_path, overrides)


def cmd_config(args: ConfigArgs) -> int:
    try:
        cfg = _resolved_config(args)
    except (ValueError, FileNotFoundError) as e:
        return _user_error(e, "config error")
    print(config_yaml(cfg, comments=args.comments))
    return 0


def cmd_run(args: RunArgs) -> int:
    if args.resume is None and args.config is None:
        raise SystemExit("error: give --config FILE (or --resume runs/NAME)")
    try:
        cfg = _resolved_config(args)
    except (ValueError, FileNotFoundError) as e:
        return _user_error(e, "config error")
    missing = missing_inputs(cfg)
    if missing:
        return _user_error(FileNotFoundError(missing))
    resume = args.resume is not None
    fresh = False
    if int(os.environ.get("RANK", "0")) == 0:  # one rank decides for the run directory
        try:
            fresh, moved = run_dirs.claim(cfg.run_dir, resume=resume, overwrite=args.overwrite)
        except run_dirs.RunDirTaken as e:
            return _user_error(e)
        if moved is not None:
            log.warning("--overwrite: the old run in %s was moved aside to %s", cfg.run_dir, moved)
    try:
        # Imported only now: a config error above answers in about a second (module comment).
        from trainer import dist
        from trainer.loop import Trainer

        _quiet_hf_downloads()
        trainer = Trainer(cfg, resume=resume)
    except (DataError, CheckpointError, RewardError) as e:
        if fresh:  # a failed start leaves no half-made run directory
            run_dirs.release(cfg.run_dir)
        return _user_error(e)
    except BaseException:
        if fresh:
            run_dirs.release(cfg.run_dir)
        raise
    try:
        summary = trainer.run()
    except RewardError as e:  # the verifier failed for good; the run checkpointed first
        return _stopped_by_verifier(e, trainer.latest_checkpoint(), cfg.run_dir)
    finally:
        trainer.close()
        dist.shutdown()  # a launcher's process group too, before interpreter finalization
    table = Table(title=f"run {cfg.name}")
    table.add_column("")
    table.add_column("value", justify="right")
    for k, v in summary.items():
        table.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
    Console().print(table)
    return 0


MADE_BY = {"runs/demo-data": "`make demo` (scripts/demo.py: the toy world)"}
"""Input folders a command of this repository writes: named in the error when they are missing."""


def missing_inputs(cfg: Any) -> str | None:
    """One line naming every input of a run config that does not exist (the data files, and
    the model and tokenizer directories when given), where relative paths are read from, and
    the command that writes them where there is one; None when all exist. Checked before torch
    is imported, so the answer takes a second, not a minute."""
    wanted = [("data.train_files", f) for f in cfg.data.train_files]
    wanted += [("data.eval_files", f) for f in cfg.data.eval_files]
    wanted += [(k, v) for k, v in (("model_path", cfg.model_path),
                                   ("tokenizer_path", cfg.tokenizer_path)) if v]
    gone = [(key, path) for key, path in wanted if not Path(path).exists()]
    if not gone:
        return None
    parts = [f"{key}: {path} does not exist" for key, path in gone]
    if any(not Path(p).is_absolute() for _, p in gone):
        parts.append(f"relative paths are read from {Path.cwd()}")
    parts += [f"{folder}/ is written by {made}" for folder, made in MADE_BY.items()
              if any(Path(p).as_posix().startswith(folder + "/") for _, p in gone)]
    return "; ".join(parts)


def _stopped_by_verifier(error: RewardError, checkpoint: Path | None, run_dir: Path) -> int:
    """One line on stderr (the error, where the run can resume from); exit status 1."""
    where = (f"; resume from {checkpoint.name} with: trainer run --resume {run_dir}"
             if checkpoint is not None else "; no checkpoint yet")
    Console(stderr=True, soft_wrap=True).print(
        f"[red]error:[/red] run stopped: {escape(str(error))}{escape(where)}")
    return 1


def cmd_plot(args: PlotArgs) -> int:
    from trainer.plot import plot_run

    for p in plot_run(Path(args.run_dir)):
        print(p)
    return 0


def cmd_ablate(args: AblateArgs) -> int:
    from trainer.ablation.runner import AblateOptions, UnknownAblation, ablate, list_text

    if args.list_ablations:
        print(list_text())
        return 0
    if args.name is None:
        return _user_error(ValueError("give an ablation NAME (trainer ablate --list names "
                                      "them)"))
    try:
        opts = AblateOptions(name=args.name, profile=args.profile, seeds=args.seeds,
                             out=Path(args.out), extra=list(args.overrides),
                             variants=args.variants.split(",") if args.variants else None,
                             world=args.world, jobs=args.jobs)
        return ablate(opts)
    except (UnknownAblation, ValueError, RuntimeError) as e:
        return _user_error(e)


def _user_error(e: Exception, what: str = "error") -> int:
    Console(stderr=True, soft_wrap=True).print(f"[red]{what}:[/red] {escape(str(e))}")
    return 2


def cmd_eval(opts: EvalOptions) -> int:
    from trainer.evaluation import dataset_name, run_eval
    from verifier.eval.evaluate import eval_table

    _quiet_hf_downloads()
    try:
        summary = run_eval(opts)
    except (DataError, CheckpointError, RewardError, ValueError) as e:
        return _user_error(e)
    title = (f"trainer eval: {Path(opts.model).name} on {dataset_name(opts.dataset)} "
             f"(k={summary['k']}, {summary['n_problems']} problems, "
             f"temperature {opts.temperature}, max {opts.max_tokens} tokens)")
    Console().print(eval_table(summary, title=title))
    out = Path(summary["output_dir"])
    print(f"generations: {out / 'generations.jsonl'}\nsummary:     {out / 'summary.json'}")
    return 0


def cmd_filter(opts: FilterOptions) -> int:
    from trainer.magic.offline_filter import FilterError, load_for_filter, released_filter

    _quiet_hf_downloads()
    if (opts.model is None) == (opts.released_difficulty is None):
        return _user_error(ValueError("give --model PATH (sample and score) or "
                                      "--released-difficulty MODEL (use the data's own field)"))
    try:
        if opts.released_difficulty is not None:
            report = released_filter(opts, opts.released_difficulty)
        else:
            report = _filter_with_model(opts, load_for_filter(opts))
    except (DataError, CheckpointError, RewardError, FilterError, ValueError) as e:
        return _user_error(e)
    table = Table(title=f"trainer filter: keep {opts.lo} <= pass_count <= {opts.hi} of {opts.k}")
    table.add_column("pass_count", justify="right")
    table.add_column("problems", justify="right")
    for c, n in report.histogram.items():
        table.add_row(str(c), str(n))
    Console().print(table)
    print(f"rows {report.rows}, scored {report.scored}, kept {report.kept}, "
          f"skipped invalid {report.skipped_invalid}, batches run now "
          f"{len(report.batches_run)}/{report.batches_total}")
    print(f"all rows: {report.output}\nkept:     {report.kept_output}")
    return 0


def _filter_with_model(opts: FilterOptions, loaded):
    """Sample with a real engine on ``opts.model`` and score through a verifier."""
    from trainer.magic.offline_filter import run_filter

    assert opts.model is not None
    check_model_path(opts.model)
    tokenizer = load_tokenizer(opts.tokenizer or opts.model)
    usable = [r.problem for r in loaded.rows if r.problem is not None]
    if usable:
        problem_prompt_ids(tokenizer, usable[0])  # no chat template: fail before loading
    with verifier_connection(opts.verifier_addr, opts.verifier_workers) as client:
        engine = create_engine(opts.engine, opts.model, tokenizer)
        try:
            return run_filter(opts, engine, client,
                              lambda p: problem_prompt_ids(tokenizer, p), loaded)
        finally:
            engine.close()


_COMMANDS = {RunArgs: cmd_run, ConfigArgs: cmd_config, PlotArgs: cmd_plot,
             EvalOptions: cmd_eval, FilterOptions: cmd_filter, AblateArgs: cmd_ablate}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The deepspeed launcher passes --local_rank=N to every rank; the rank comes from the
    # environment (RANK, LOCAL_RANK) it also sets.
    argv = [a for a in argv if not a.startswith(("--local_rank", "--local-rank"))]
    run_doc = inspect.cleandoc(RunArgs.__doc__ or "")
    run_help = f"{run_doc}\n\n{knobs_text()}" if "run" in argv[:1] else run_doc
    command = Union[
        Annotated[RunArgs, tyro.conf.subcommand("run", description=run_help)],
        Annotated[ConfigArgs, tyro.conf.subcommand("config")],
        Annotated[PlotArgs, tyro.conf.subcommand("plot")],
        Annotated[EvalOptions, tyro.conf.subcommand("eval")],
        Annotated[FilterOptions, tyro.conf.subcommand("filter")],
        Annotated[AblateArgs, tyro.conf.subcommand("ablate")],
    ]
    try:
        args = tyro.cli(command, args=argv, prog="trainer",  # type: ignore[call-overload]
                        description="MAGIC RL trainer")
    except ValueError as e:  # a cross-field rule of an options dataclass (__post_init__)
        return _user_error(e)
    _setup_logging()
    return _COMMANDS[type(args)](args)


if __name__ == "__main__":
    sys.exit(main())
