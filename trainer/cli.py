"""``trainer`` command line: ``run``, ``plot``, ``eval``, ``filter`` and ``ablate``.

    trainer run --config FILE [--verifier-addr ADDR[,ADDR...]] [key=value ...]
    trainer run --resume runs/NAME [key=value ...]
    trainer plot runs/NAME
    trainer eval --model PATH --dataset aime24|aime25|lcb|FILE [--k 32] [--temperature 0.6]
                 [--top-p 1.0] [--max-tokens 32768] [--verifier-addr ADDR] [--engine hf|vllm]
    trainer filter --model PATH --input FILE --output FILE [--k 16 --lo 1 --hi 15]
    trainer filter --released-difficulty MODEL --input FILE --output FILE
    trainer ablate NAME [--profile quick|full] [--seeds N] [--out DIR] [--variants A,B]
                   [--set key=value ...]
    trainer ablate --list
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainer.data import DEFAULT_SUFFIX

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


def cmd_ablate(args: argparse.Namespace) -> int:
    from trainer.ablate import AblateOptions, UnknownAblation, ablate, list_text

    if args.list:
        print(list_text())
        return 0
    if args.name is None:
        return _user_error(ValueError("give an ablation NAME (trainer ablate --list names "
                                      "them)"))
    try:
        opts = AblateOptions(name=args.name, profile=args.profile, seeds=args.seeds,
                             out=Path(args.out), extra=list(args.set or []),
                             variants=args.variants.split(",") if args.variants else None)
        return ablate(opts)
    except (UnknownAblation, ValueError, RuntimeError) as e:
        return _user_error(e)


def _engine_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("rollout engine (trainer.engines.EngineConfig)")
    g.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                   help="hf: Hugging Face generate (CPU, small models); vllm: production")
    g.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    g.add_argument("--chunk-size", type=int, default=8,
                   help="prompts per chunk handed to the verifier as it finishes (hf: per batch)")
    g.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm: GPUs per engine")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="vllm: share of GPU memory for weights + KV cache (no trainer shares it)")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="vllm: longest prompt + response, tokens (default: the model's)")
    g.add_argument("--enforce-eager", action="store_true", help="vllm: no CUDA graphs")
    g.add_argument("--kv-cache-gib", type=float, default=None, help="vllm: explicit KV cache size")
    g.add_argument("--tokenizer", default=None, help="tokenizer directory (default: --model)")
    g.add_argument("--verifier-addr", default=None,
                   help="HOST:PORT[,HOST:PORT...] of a verifier; default: start a local one")
    g.add_argument("--verifier-workers", type=int, default=2,
                   help="workers of the local verifier (without --verifier-addr)")


def _engine_config(args: argparse.Namespace):
    from trainer.engines import EngineConfig

    return EngineConfig(kind=args.engine, dtype=args.dtype, chunk_size=args.chunk_size,
                        tensor_parallel_size=args.tensor_parallel_size,
                        gpu_memory_utilization=args.gpu_memory_utilization,
                        max_model_len=args.max_model_len, enforce_eager=args.enforce_eager,
                        kv_cache_gib=args.kv_cache_gib, enable_sleep_mode=False)


def _user_error(e: Exception) -> int:
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {escape(str(e))}")
    return 2


def cmd_eval(args: argparse.Namespace) -> int:
    from trainer.data import DataError
    from trainer.evaluation import EvalOptions, dataset_name, run_eval
    from trainer.hf_utils import CheckpointError
    from trainer.rewards import RewardError
    from verifier.evaluate import eval_table

    window = None if args.lcb_all_dates else (args.lcb_start, args.lcb_end)
    try:
        opts = EvalOptions(
            model=args.model, dataset=args.dataset, output_dir=args.output_dir,
            lcb_files=list(args.lcb_file or []), lcb_window=window,
            lcb_style=args.lcb_style, k=args.k,
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
            max_tokens=args.max_tokens, seed=args.seed, tokenizer=args.tokenizer,
            instruction_suffix=args.instruction_suffix, limit=args.limit,
            skip_invalid=args.skip_invalid, allow_errors=args.allow_errors,
            verifier_addr=args.verifier_addr, verifier_workers=args.verifier_workers,
            timeout_s=args.timeout_s, engine=_engine_config(args))
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


def cmd_filter(args: argparse.Namespace) -> int:
    from trainer.data import DataError
    from trainer.filtering import FilterError, FilterOptions, load_for_filter, released_filter
    from trainer.hf_utils import CheckpointError
    from trainer.rewards import RewardError

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


def _filter_with_model(args: argparse.Namespace, opts, loaded):
    """Sample with a real engine on ``args.model`` and score through a verifier."""
    from trainer.engines import check_model_path, create_engine
    from trainer.evaluation import verifier_connection
    from trainer.filtering import run_filter
    from trainer.hf_utils import load_tokenizer, problem_prompt_ids

    check_model_path(args.model)
    tokenizer = load_tokenizer(args.tokenizer or args.model)
    usable = [r.problem for r in loaded.rows if r.problem is not None]
    if usable:
        problem_prompt_ids(tokenizer, usable[0])  # no chat template: fail before loading
    with verifier_connection(args.verifier_addr, args.verifier_workers) as client:
        engine = create_engine(_engine_config(args), args.model, tokenizer)
        try:
            return run_filter(opts, engine, client,
                              lambda p: problem_prompt_ids(tokenizer, p), loaded)
        finally:
            engine.close()


def main(argv: list[str] | None = None) -> int:
    # allow_abbrev=False: the top-level --local_rank must not swallow subcommand flags by
    # prefix (argparse would read `filter --lo 1` as an ambiguous --local_rank).
    ap = argparse.ArgumentParser(prog="trainer", description="MAGIC RL trainer",
                                 allow_abbrev=False)
    # The deepspeed launcher passes --local_rank=N to every rank; the rank comes from the
    # environment (RANK, LOCAL_RANK) it also sets.
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None,
                    help=argparse.SUPPRESS)
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

    ev = sub.add_parser("eval", help="generate k samples per problem and report avg@k / pass@k",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ev.add_argument("--model", required=True, help="local Hugging Face checkpoint directory")
    ev.add_argument("--dataset", required=True,
                    help="aime24 | aime25 (../shared/data/eval/*.parquet) | lcb (needs "
                         "--lcb-file) | a JSONL or parquet file in any loader format")
    ev.add_argument("--lcb-file", action="append", metavar="PATH",
                    help="local LiveCodeBench code_generation_lite release JSONL (repeatable)")
    ev.add_argument("--lcb-start", default="2024-08-01",
                    help="first contest_date kept (inclusive; the report's window)")
    ev.add_argument("--lcb-end", default="2025-02-01", help="last contest_date kept (inclusive)")
    ev.add_argument("--lcb-all-dates", action="store_true", help="no contest-date window")
    ev.add_argument("--lcb-style", choices=("auto", "generic", "deepseek-r1"), default="auto",
                    help="LiveCodeBench prompt template; auto: LiveCodeBench's choice for the "
                         "model (deepseek-r1 for DeepSeek-R1-Distill models, else generic)")
    ev.add_argument("--k", type=int, default=None,
                    help="samples per problem (avg@k); default: the report's, 32 for AIME and "
                         "math files, 4 for LiveCodeBench and files with code")
    ev.add_argument("--temperature", type=float, default=0.6)
    ev.add_argument("--top-p", type=float, default=1.0)
    ev.add_argument("--top-k", type=int, default=-1, help="-1: off")
    ev.add_argument("--max-tokens", type=int, default=32768, help="response limit, tokens")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--output-dir", type=Path, default=None,
                    help="where generations.jsonl, results.jsonl and summary.json go "
                         "(default: runs/eval/<model>-<dataset>)")
    ev.add_argument("--instruction-suffix", default=DEFAULT_SUFFIX,
                    help="appended to math prompts (the report's; '' for none)")
    ev.add_argument("--limit", type=int, default=None, help="first N problems only")
    ev.add_argument("--skip-invalid", action="store_true",
                    help="skip malformed rows (counted) instead of failing")
    ev.add_argument("--allow-errors", action="store_true",
                    help="count responses the verifier could not judge as incorrect")
    ev.add_argument("--timeout-s", type=float, default=3600.0,
                    help="longest wait for verdicts after generation ends, seconds")
    _engine_args(ev)
    ev.set_defaults(fn=cmd_eval)

    fl = sub.add_parser("filter", help="offline difficulty filter: keep problems solved in "
                        "[lo, hi] of k samples",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    fl.add_argument("--model", default=None, help="local checkpoint that samples the responses")
    fl.add_argument("--released-difficulty", metavar="MODEL", default=None,
                    help="sample nothing: use extra_info.model_difficulty[MODEL] of the data "
                         "(e.g. DeepSeek-R1-Distill-Qwen-7B), as Skywork's release does")
    fl.add_argument("--input", required=True, type=Path, help="JSONL or parquet, any loader format")
    fl.add_argument("--output", required=True, type=Path,
                    help="every row with pass_count/pass_k (same format as the input)")
    fl.add_argument("--kept-output", type=Path, default=None,
                    help="the kept rows (default: <output>.kept.<ext>)")
    fl.add_argument("--k", type=int, default=16, help="samples per problem")
    fl.add_argument("--lo", type=int, default=1, help="keep pass_count >= lo")
    fl.add_argument("--hi", type=int, default=15, help="keep pass_count <= hi")
    fl.add_argument("--temperature", type=float, default=1.0)
    fl.add_argument("--top-p", type=float, default=1.0)
    fl.add_argument("--top-k", type=int, default=-1)
    fl.add_argument("--max-tokens", type=int, default=32768)
    fl.add_argument("--seed", type=int, default=0, help="batch b samples with seed + b")
    fl.add_argument("--batch-size", type=int, default=64,
                    help="problems per generate call and per saved progress record")
    fl.add_argument("--difficulty-key", default=None,
                    help="key under extra_info.model_difficulty for verl rows (default: the "
                         "model directory's name)")
    fl.add_argument("--instruction-suffix", default=DEFAULT_SUFFIX,
                    help="appended to math prompts (the report's; '' for none)")
    fl.add_argument("--skip-invalid", action="store_true")
    fl.add_argument("--allow-errors", action="store_true")
    fl.add_argument("--timeout-s", type=float, default=3600.0)
    _engine_args(fl)
    fl.set_defaults(fn=cmd_filter)

    ab = sub.add_parser("ablate", help="run one ablation of the Skywork-OR1 report on the toy "
                        "world: report.md, plots, summary.json",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ab.add_argument("name", nargs="?", default=None, help="the ablation (--list names them)")
    ab.add_argument("--list", action="store_true", help="name the ablations and their claims")
    ab.add_argument("--profile", choices=("quick", "full"), default="quick",
                    help="quick: at most 30 min on a 2-core CPU; full: every variant, 3 seeds")
    ab.add_argument("--seeds", type=int, default=None, help="seeds per variant (default: the "
                    "profile's: quick 2, full 3)")
    ab.add_argument("--out", default="runs/ablate", help="DIR: writes DIR/NAME/report.md, "
                    "summary.json, plots and runs/")
    ab.add_argument("--variants", default=None, help="comma list: run only these variants")
    ab.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="config override for every run, after the profile's (repeatable)")
    ab.set_defaults(fn=cmd_ablate)
    args = ap.parse_args(argv)
    _setup_logging()
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
