"""``trainer`` command line: ``run``, ``config show``, ``plot``, ``eval``, ``filter`` and
``ablate``.

    trainer run --config FILE [--verifier-addr ADDR[,ADDR...]] [key=value ...]
    trainer run --resume runs/NAME [key=value ...]
    trainer config show [--config FILE] [key=value ...]
    trainer plot runs/NAME
    trainer eval --model PATH --dataset aime24|aime25|lcb|FILE [--k 32] [--temperature 0.6]
                 [--top-p 1.0] [--max-tokens 32768] [--verifier-addr ADDR] [--engine hf|vllm]
    trainer filter --model PATH --input FILE --output FILE [--k 16 --lo 1 --hi 15]
    trainer filter --released-difficulty MODEL --input FILE --output FILE
    trainer ablate NAME [--profile quick|full] [--seeds N] [--out DIR] [--variants A,B]
                   [--set key=value ...]
    trainer ablate --list

Built like ``verifier``'s: each subcommand is one dataclass whose fields and docstrings tyro
turns into flags and help. ``trainer run --help`` also lists every knob of the run config
(trainer/config.py), the keys of ``key=value``.
"""

from __future__ import annotations

import inspect
import logging
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Union

import tyro
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from transformers.utils import logging as hf_logging

from trainer import dist
from trainer.ablate import AblateOptions, UnknownAblation, ablate, list_text
from trainer.config import config_yaml, knob_help, load_config
from trainer.data import DEFAULT_SUFFIX, DataError
from trainer.engines import EngineConfig, check_model_path, create_engine
from trainer.evaluation import EvalOptions, dataset_name, run_eval
from trainer.hf_utils import CheckpointError, load_tokenizer, problem_prompt_ids
from trainer.loop import Trainer
from trainer.offline_filter import (
    FilterError,
    FilterOptions,
    load_for_filter,
    released_filter,
    run_filter,
)
from trainer.plot import plot_run
from trainer.verifier_bridge import RewardError, verifier_connection
from verifier.evaluate import eval_table
from verifier.logs import setup_logging

log = logging.getLogger("trainer")


def _setup_logging() -> None:
    setup_logging("text")
    hf_logging.disable_progress_bar()  # per-file progress bars drown the run's own output


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
class EngineArgs:
    """The rollout engine of ``trainer eval`` and ``trainer filter``."""

    engine: Literal["hf", "vllm"] = "hf"
    """hf: Hugging Face generate (CPU, small models); vllm: production."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The engine's weights/compute dtype ("auto": the checkpoint's)."""
    chunk_size: int = 8
    """Prompts per chunk handed to the verifier as it finishes (hf: per batch)."""
    tensor_parallel_size: int = 1
    """vllm: GPUs per engine."""
    gpu_memory_utilization: float = 0.9
    """vllm: share of GPU memory for weights + KV cache (no trainer shares it)."""
    max_model_len: int | None = None
    """vllm: longest prompt + response, tokens (default: the model's)."""
    enforce_eager: bool = False
    """vllm: no CUDA graphs."""
    kv_cache_gib: float | None = None
    """vllm: explicit KV cache size, GiB."""
    tokenizer: str | None = None
    """Tokenizer directory (default: --model)."""
    verifier_addr: str | None = None
    """HOST:PORT[,HOST:PORT...] of a verifier; default: start a local one."""
    verifier_workers: int = 2
    """Workers of the local verifier (without --verifier-addr)."""

    def engine_config(self) -> EngineConfig:
        return EngineConfig(kind=self.engine, dtype=self.dtype, chunk_size=self.chunk_size,
                            tensor_parallel_size=self.tensor_parallel_size,
                            gpu_memory_utilization=self.gpu_memory_utilization,
                            max_model_len=self.max_model_len, enforce_eager=self.enforce_eager,
                            kv_cache_gib=self.kv_cache_gib, enable_sleep_mode=False)


@dataclass
class EvalArgs(EngineArgs):
    """Generate k samples per problem and report avg@k / pass@k (the report's table)."""

    model: str = ""
    """Local Hugging Face checkpoint directory (required)."""
    dataset: str = ""
    """aime24 | aime25 (datasets/eval/*.parquet) | lcb (needs --lcb-file) | a JSONL or parquet
    file in any loader format (required)."""
    lcb_file: list[str] = field(default_factory=list)
    """Local LiveCodeBench code_generation_lite release JSONL files."""
    lcb_start: str = "2024-08-01"
    """First contest_date kept (inclusive; the report's window)."""
    lcb_end: str = "2025-02-01"
    """Last contest_date kept (inclusive)."""
    lcb_all_dates: bool = False
    """No contest-date window."""
    lcb_style: Literal["auto", "generic", "deepseek-r1"] = "auto"
    """LiveCodeBench prompt template; auto: LiveCodeBench's choice for the model (deepseek-r1
    for DeepSeek-R1-Distill models, else generic)."""
    k: int | None = None
    """Samples per problem (avg@k); default: the report's, 32 for AIME and math files, 4 for
    LiveCodeBench and files with code."""
    temperature: float = 0.6
    """Sampling temperature (the report's 0.6 for the 7B model)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = -1
    """Top-k sampling (-1: off)."""
    max_tokens: int = 32768
    """Response limit, tokens."""
    seed: int = 0
    """Sampling seed."""
    output_dir: Path | None = None
    """Where generations.jsonl, results.jsonl and summary.json go (default:
    runs/eval/<model>-<dataset>)."""
    instruction_suffix: str = DEFAULT_SUFFIX
    """Appended to math prompts (the report's; '' for none)."""
    limit: int | None = None
    """First N problems only."""
    skip_invalid: bool = False
    """Skip malformed rows (counted) instead of failing."""
    allow_errors: bool = False
    """Count responses the verifier could not judge as incorrect."""
    timeout_s: float = 3600.0
    """Longest wait for verdicts after generation ends, seconds."""


@dataclass
class FilterArgs(EngineArgs):
    """Offline difficulty filter: keep problems solved in [lo, hi] of k samples."""

    input: Path = Path()
    """JSONL or parquet, any loader format (required)."""
    output: Path = Path()
    """Every row with pass_count/pass_k (same format as the input; required)."""
    model: str | None = None
    """Local checkpoint that samples the responses."""
    released_difficulty: str | None = None
    """Sample nothing: use extra_info.model_difficulty[MODEL] of the data (e.g.
    DeepSeek-R1-Distill-Qwen-7B), as Skywork's release does."""
    kept_output: Path | None = None
    """The kept rows (default: <output>.kept.<ext>)."""
    k: int = 16
    """Samples per problem."""
    lo: int = 1
    """Keep pass_count >= lo."""
    hi: int = 15
    """Keep pass_count <= hi."""
    temperature: float = 1.0
    """Sampling temperature (the training rollouts')."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = -1
    """Top-k sampling (-1: off)."""
    max_tokens: int = 32768
    """Response limit, tokens."""
    seed: int = 0
    """Batch b samples with seed + b."""
    batch_size: int = 64
    """Problems per generate call and per saved progress record."""
    difficulty_key: str | None = None
    """Key under extra_info.model_difficulty for verl rows (default: the model directory's
    name)."""
    instruction_suffix: str = DEFAULT_SUFFIX
    """Appended to math prompts (the report's; '' for none)."""
    skip_invalid: bool = False
    """Skip malformed rows (counted) instead of failing."""
    allow_errors: bool = False
    """Count responses the verifier could not judge as incorrect."""
    timeout_s: float = 3600.0
    """Longest wait for verdicts after generation ends, seconds."""


@dataclass
class AblateArgs:
    """Run one ablation of the Skywork-OR1 report on the toy world, through `trainer run`:
    DIR/NAME/report.md, plots and summary.json (trainer/ablate.py)."""

    name: tyro.conf.Positional[str | None] = None
    """The ablation (--list names them)."""
    list_ablations: Annotated[bool, tyro.conf.arg(name="list")] = False
    """Name the ablations and their claims."""
    profile: Literal["quick", "full"] = "quick"
    """quick: at most 30 min on a 2-core CPU; full: every variant, 3 seeds."""
    seeds: int | None = None
    """Seeds per variant (default: the profile's: quick 2, full 3)."""
    out: Path = Path("runs/ablate")
    """DIR: writes DIR/NAME/report.md, summary.json, plots and runs/."""
    variants: str | None = None
    """Comma list: run only these variants."""
    overrides: Annotated[tyro.conf.UseAppendAction[list[str]], tyro.conf.arg(name="set")] = \
        field(default_factory=list)
    """key=value config override for every run, after the profile's (repeatable)."""


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
    trainer = Trainer(cfg, resume=args.resume is not None)
    try:
        summary = trainer.run()
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


def cmd_plot(args: PlotArgs) -> int:
    for p in plot_run(Path(args.run_dir)):
        print(p)
    return 0


def cmd_ablate(args: AblateArgs) -> int:
    if args.list_ablations:
        print(list_text())
        return 0
    if args.name is None:
        return _user_error(ValueError("give an ablation NAME (trainer ablate --list names "
                                      "them)"))
    try:
        opts = AblateOptions(name=args.name, profile=args.profile, seeds=args.seeds,
                             out=Path(args.out), extra=list(args.overrides),
                             variants=args.variants.split(",") if args.variants else None)
        return ablate(opts)
    except (UnknownAblation, ValueError, RuntimeError) as e:
        return _user_error(e)


def _user_error(e: Exception, what: str = "error") -> int:
    Console(stderr=True, soft_wrap=True).print(f"[red]{what}:[/red] {escape(str(e))}")
    return 2


def cmd_eval(args: EvalArgs) -> int:
    if not args.model or not args.dataset:
        return _user_error(ValueError("give --model PATH and --dataset NAME|FILE"))
    window = None if args.lcb_all_dates else (args.lcb_start, args.lcb_end)
    try:
        opts = EvalOptions(
            model=args.model, dataset=args.dataset, output_dir=args.output_dir,
            lcb_files=list(args.lcb_file), lcb_window=window,
            lcb_style=args.lcb_style, k=args.k,
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
            max_tokens=args.max_tokens, seed=args.seed, tokenizer=args.tokenizer,
            instruction_suffix=args.instruction_suffix, limit=args.limit,
            skip_invalid=args.skip_invalid, allow_errors=args.allow_errors,
            verifier_addr=args.verifier_addr, verifier_workers=args.verifier_workers,
            timeout_s=args.timeout_s, engine=args.engine_config())
        summary = run_eval(opts)
    except (DataError, CheckpointError, RewardError, ValueError) as e:
        return _user_error(e)
    title = (f"trainer eval: {Path(args.model).name} on {dataset_name(args.dataset)} "
             f"(k={summary['k']}, {summary['n_problems']} problems, "
             f"temperature {args.temperature}, max {args.max_tokens} tokens)")
    Console().print(eval_table(summary, title=title))
    out = Path(summary["output_dir"])
    print(f"generations: {out / 'generations.jsonl'}\nsummary:     {out / 'summary.json'}")
    return 0


def cmd_filter(args: FilterArgs) -> int:
    if args.input == Path() or args.output == Path():
        return _user_error(ValueError("give --input FILE and --output FILE"))
    if (args.model is None) == (args.released_difficulty is None):
        return _user_error(ValueError("give --model PATH (sample and score) or "
                                      "--released-difficulty MODEL (use the data's own field)"))
    try:
        opts = FilterOptions(
            input=args.input, output=args.output, kept_output=args.kept_output, k=args.k,
            lo=args.lo, hi=args.hi, temperature=args.temperature, top_p=args.top_p,
            top_k=args.top_k, max_tokens=args.max_tokens, seed=args.seed,
            batch_size=args.batch_size,
            instruction_suffix=args.instruction_suffix,
            skip_invalid=args.skip_invalid, allow_errors=args.allow_errors,
            difficulty_key=args.difficulty_key, model_id=str(args.model or ""),
            timeout_s=args.timeout_s)
        if args.released_difficulty is not None:
            report = released_filter(opts, args.released_difficulty)
        else:
            report = _filter_with_model(args, opts, load_for_filter(opts))
    except (DataError, CheckpointError, RewardError, FilterError, ValueError) as e:
        return _user_error(e)
    table = Table(title=f"trainer filter: keep {args.lo} <= pass_count <= {args.hi} of {args.k}")
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


def _filter_with_model(args: FilterArgs, opts, loaded):
    """Sample with a real engine on ``args.model`` and score through a verifier."""
    assert args.model is not None
    check_model_path(args.model)
    tokenizer = load_tokenizer(args.tokenizer or args.model)
    usable = [r.problem for r in loaded.rows if r.problem is not None]
    if usable:
        problem_prompt_ids(tokenizer, usable[0])  # no chat template: fail before loading
    with verifier_connection(args.verifier_addr, args.verifier_workers) as client:
        engine = create_engine(args.engine_config(), args.model, tokenizer)
        try:
            return run_filter(opts, engine, client,
                              lambda p: problem_prompt_ids(tokenizer, p), loaded)
        finally:
            engine.close()


_COMMANDS = {RunArgs: cmd_run, ConfigArgs: cmd_config, PlotArgs: cmd_plot, EvalArgs: cmd_eval,
             FilterArgs: cmd_filter, AblateArgs: cmd_ablate}


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
        Annotated[EvalArgs, tyro.conf.subcommand("eval")],
        Annotated[FilterArgs, tyro.conf.subcommand("filter")],
        Annotated[AblateArgs, tyro.conf.subcommand("ablate")],
    ]
    args = tyro.cli(command, args=argv, prog="trainer",  # type: ignore[call-overload]
                    description="MAGIC RL trainer")
    _setup_logging()
    return _COMMANDS[type(args)](args)


if __name__ == "__main__":
    sys.exit(main())
