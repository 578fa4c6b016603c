"""Evaluation through the rollout engine and the verifier, shared by ``trainer eval``, the
offline filter (trainer/magic/offline_filter.py) and evaluation during training (``Trainer.evaluate``).

One pass (:func:`generate_and_score`): k samples per problem from a RolloutEngine, each finished
chunk streamed to the verifier while generation goes on (trainer/verifier_bridge.py), results matched
by wire id. The metrics and the table are verifier/eval/evaluate.py's (``summarize``,
``eval_table``): avg@k, unbiased pass@k and standard errors, overall and per data source,
exactly what ``verifier eval`` reports for the same generations file.

``trainer eval`` (:func:`run_eval`) writes into its output directory:

- ``generations.jsonl``: ``{"id", "domain", "ground_truth", "data_source", "responses": [k]}``
  per problem, the input format of ``verifier eval`` (written as soon as generation ends, so a
  verifier failure never loses the generations);
- ``results.jsonl``: one verdict per response (status, reward, detail);
- ``summary.json``: ``verifier eval``'s summary plus the model, dataset, sampling settings and
  generation statistics.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from trainer import metric_names as mn
from trainer.command_options import EvalOptions  # the options live apart (its docstring: why)
from trainer.data import (
    LCB_STYLES,
    DataError,
    Problem,
    default_lcb_style,
    load_dataset,
)
from trainer.engines import check_model_path, check_sampling_params, create_engine
from trainer.hf_utils import load_tokenizer, problem_prompt_ids
from trainer.interfaces import Completion, RolloutEngine, SamplingParams
from trainer.verifier_bridge import RewardError, RewardStream, verifier_connection
from verifier.eval.evaluate import (
    NO_SOURCE,
    EvalProblem,
    error_message,
    response_records,
    summarize,
)

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
EVAL_DATA_DIR = ROOT / "datasets" / "eval"
"""Where ``--dataset aime24|aime25`` look: ``datasets/eval/<name>.parquet`` in the repository
(the real AIME 2024 and 2025 problems, 30 each, verl parquet schema)."""

NAMED_DATASETS = ("aime24", "aime25", "lcb")
REPORT_K = {"aime24": 32, "aime25": 32, "lcb": 4}
"""The report's k of avg@k: AIME24/25 avg@32, LiveCodeBench avg@4 (docs/magic.md)."""

EVAL_SOURCE = "eval"
"""``Trainer.evaluate``'s name for problems without a data_source (metric ``eval/eval/avg@k``)."""


# ---------------------------------------------------------------------------------------------
# One generate-and-score pass
# ---------------------------------------------------------------------------------------------

@dataclass
class ScoredRun:
    """k responses per problem and their verdicts."""

    problems: list[Any]
    """``verifier.eval.evaluate.EvalProblem`` per problem (``line`` = 1-based position), responses
    filled in; their ``wire_id(j)`` keys ``results``."""
    results: dict[str, Any]
    """``verifier.items.Result`` by wire id."""
    completions: list[list[Completion]]
    """Per problem, its completions in sample order."""
    generate_s: float
    verify_wait_s: float

    def correct(self) -> list[list[bool]]:
        return [[self.results[p.wire_id(j)].correct for j in range(len(p.responses))]
                for p in self.problems]

    def statuses(self, i: int) -> list[str]:
        p = self.problems[i]
        return [self.results[p.wire_id(j)].status.value for j in range(len(p.responses))]


def _eval_problem(i: int, p: Problem, responses: list[str]) -> Any:
    return EvalProblem(i + 1, p.id, p.domain, p.ground_truth, p.data_source, responses)


def generate_and_score(engine: RolloutEngine, client: Any, problems: Sequence[Problem],
                       prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                       timeout_s: float = 3600.0,
                       after_generate: Callable[[list[Completion]], None] | None = None,
                       owns: Callable[[int], bool] | None = None) -> ScoredRun:
    """Sample ``params.n`` responses per problem and score every one through ``client`` (a
    ``trainer.verifier_bridge.RewardClient``), streaming each finished chunk while generation continues.

    ``after_generate(completions)`` runs when generation has ended, before waiting for the
    remaining verdicts (the trainer puts its engine to sleep there; ``trainer eval`` writes
    the generations file). Raises RewardError when the verifier fails or times out; verdicts
    that are not a judgement (INVALID_INPUT, ...) are returned as they are: see
    :func:`summarize_run`.

    ``owns(i)`` (default: all) picks the problems this call scores and returns; the others are
    only generated, for the tensor-parallel peers that share the engine (trainer/dist.py).
    """
    if len(prompts) != len(problems):
        raise ValueError(f"{len(problems)} problems but {len(prompts)} prompts")
    mine = [i for i in range(len(problems)) if owns is None or owns(i)]
    position = {i: k for k, i in enumerate(mine)}  # problem index -> index in the run
    stream = RewardStream(client)

    def wire(c: Completion) -> str:
        return f"{position[c.prompt_index] + 1}:{c.sample_index}"

    def on_done(chunk: list[Completion]) -> None:
        stream.submit([problems[c.prompt_index].verifier_item(wire(c), c.text) for c in chunk
                       if c.prompt_index in position])

    t0 = time.monotonic()
    try:
        completions = engine.generate(prompts, params, on_done=on_done)
    except BaseException:
        stream.abort()
        raise
    generate_s = time.monotonic() - t0
    per_problem: list[list[Completion]] = [[] for _ in problems]
    for c in completions:
        per_problem[c.prompt_index].append(c)
    for i, cs in enumerate(per_problem):
        cs.sort(key=lambda c: c.sample_index)
        if len(cs) != params.n:
            stream.abort()
            raise RewardError(f"the engine returned {len(cs)} samples for problem "
                              f"{problems[i].id!r}, expected {params.n}")
    if after_generate is not None:
        after_generate(completions)
    results, waited = stream.wait(timeout_s)
    run_problems = [_eval_problem(k, problems[i], [c.text for c in per_problem[i]])
                    for k, i in enumerate(mine)]
    return ScoredRun(run_problems, results, [per_problem[i] for i in mine], generate_s, waited)


def summarize_run(run: ScoredRun, k: int, allow_errors: bool = False) -> dict[str, Any]:
    """``verifier eval``'s summary of a run (avg@k, pass@1, pass@k, stderr, by_source).
    Responses the verifier could not judge raise RewardError naming them, unless
    ``allow_errors`` (then they count as incorrect and the summary says so)."""

    problem = error_message(run.problems, run.results)
    if problem is not None and not allow_errors:
        raise RewardError(problem)
    return summarize(run.problems, run.results, k, allow_errors=allow_errors)


def trainer_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The training loop's evaluation metrics (docs/contracts.md 3): ``eval/accuracy`` (avg@k over
    all problems), ``eval/pass@k`` (unbiased pass@k at k = the samples per problem: the share
    solved at least once, what exploring finds) and ``eval/<data_source>/avg@k``."""

    k = summary["k"]
    out: dict[str, float] = {}
    for src, s in summary["by_source"].items():
        out[mn.eval_avg_at_k(EVAL_SOURCE if src == NO_SOURCE else src, k)] = s["avg@k"]
    out[mn.EVAL_ACCURACY] = summary["avg@k"]
    out[mn.EVAL_PASS_AT_K] = summary["pass@k"]
    return out


def generation_stats(run: ScoredRun) -> dict[str, float]:
    comps = [c for cs in run.completions for c in cs]
    return {"seconds": run.generate_s, "verify_wait_seconds": run.verify_wait_s,
            "responses": len(comps),
            "mean_response_tokens": sum(len(c.token_ids) for c in comps) / max(1, len(comps)),
            "truncated_frac": sum(c.truncated for c in comps) / max(1, len(comps))}


def generations_records(problems: Sequence[Problem],
                        completions: Sequence[Completion]) -> list[dict[str, Any]]:
    """``verifier eval`` input lines for ``completions`` of ``problems``."""
    responses: list[list[tuple[int, str]]] = [[] for _ in problems]
    for c in completions:
        responses[c.prompt_index].append((c.sample_index, c.text))
    return [{"id": p.id, "domain": p.domain, "ground_truth": p.ground_truth,
             "data_source": p.data_source, "responses": [t for _, t in sorted(rs)]}
            for p, rs in zip(problems, responses)]


def write_jsonl(path: Path, records: Any) -> None:
    """Write records atomically (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------
# trainer eval
# ---------------------------------------------------------------------------------------------

def resolve_dataset(dataset: str, lcb_files: Sequence[str | Path] = ()) -> list[Path]:
    """Files for ``--dataset``: aime24/aime25 from EVAL_DATA_DIR, lcb from ``lcb_files`` (local
    LiveCodeBench release JSONL files), anything else a path. DataError naming what is missing."""
    if dataset in ("aime24", "aime25"):
        path = EVAL_DATA_DIR / f"{dataset}.parquet"
        if not path.exists():
            raise DataError(f"--dataset {dataset}: {path} does not exist (the AIME files ship in "
                            "datasets/eval/ in the repository)")
        return [path]
    if dataset == "lcb":
        if not lcb_files:
            raise DataError("--dataset lcb needs --lcb-file PATH: a local LiveCodeBench "
                            "code_generation_lite release JSONL (nothing is downloaded; see "
                            "datasets/README.md)")
        paths = [Path(p) for p in lcb_files]
        for p in paths:
            if not p.exists():
                raise DataError(f"--lcb-file {p} does not exist")
        return paths
    path = Path(dataset)
    if not path.exists():
        raise DataError(f"--dataset {dataset!r} is neither one of {', '.join(NAMED_DATASETS)} "
                        "nor an existing file")
    return [path]


def default_k(dataset: str, problems: Sequence[Problem]) -> int:
    """The report's k: 32 for AIME (and all-math files), 4 for LiveCodeBench (and files with
    code problems)."""
    if dataset in REPORT_K:
        return REPORT_K[dataset]
    return 32 if all(p.domain == "math" for p in problems) else 4


def dataset_name(dataset: str) -> str:
    return dataset if dataset in NAMED_DATASETS else Path(dataset).stem


def default_output_dir(opts: EvalOptions) -> Path:
    return ROOT / "runs" / "eval" / f"{Path(opts.model).name}-{dataset_name(opts.dataset)}"


def run_eval(opts: EvalOptions, engine: RolloutEngine | None = None) -> dict[str, Any]:
    """``trainer eval``: every check that can fail (dataset, k, tokenizer, chat template) runs
    before the model is loaded. Returns the summary (also written to summary.json). ``engine``
    replaces the one built from ``opts.engine`` (tests)."""

    files = resolve_dataset(opts.dataset, opts.lcb_files)
    suffix = opts.instruction_suffix
    style = default_lcb_style(opts.model) if opts.lcb_style == "auto" else opts.lcb_style
    if style not in LCB_STYLES:
        raise ValueError(f"--lcb-style must be auto or one of {', '.join(LCB_STYLES)}, "
                         f"got {opts.lcb_style!r}")
    loaded = load_dataset(files, instruction_suffix=suffix, skip_invalid=opts.skip_invalid,
                          date_window=opts.lcb_window, lcb_style=style)
    problems = loaded.problems[: opts.limit] if opts.limit else loaded.problems
    k = opts.k if opts.k is not None else default_k(opts.dataset, problems)
    if k < 1:
        raise ValueError(f"--k must be >= 1, got {k}")
    params = SamplingParams(n=k, temperature=opts.temperature, top_p=opts.top_p,
                            top_k=opts.top_k, max_tokens=opts.max_tokens, seed=opts.seed)

    check_sampling_params(params)
    if engine is None:
        check_model_path(opts.model)
    tokenizer = load_tokenizer(opts.tokenizer or opts.model)
    prompts = [problem_prompt_ids(tokenizer, p) for p in problems]
    out_dir = Path(opts.output_dir) if opts.output_dir else default_output_dir(opts)
    out_dir.mkdir(parents=True, exist_ok=True)
    log.info("evaluating %s on %s: %d problems x %d samples", opts.model, opts.dataset,
             len(problems), k)

    def save_generations(completions: list[Completion]) -> None:
        write_jsonl(out_dir / "generations.jsonl", generations_records(problems, completions))

    own_engine = engine is None
    engine_kind = opts.engine.kind if own_engine else type(engine).__name__
    with verifier_connection(opts.verifier_addr, opts.verifier_workers) as client:
        if own_engine:
            engine = create_engine(opts.engine, opts.model, tokenizer)
        try:
            run = generate_and_score(engine, client, problems, prompts, params,
                                     timeout_s=opts.timeout_s, after_generate=save_generations)
        finally:
            if own_engine:
                engine.close()

    write_jsonl(out_dir / "results.jsonl", response_records(run.problems, run.results))
    summary = summarize_run(run, k, opts.allow_errors)
    summary.update({
        "model": str(opts.model), "dataset": opts.dataset, "files": [str(f) for f in files],
        "sampling": asdict(params), "generation": generation_stats(run),
        "skipped_rows": loaded.skipped, "outside_window": loaded.outside_window,
        "lcb_window": list(opts.lcb_window) if opts.lcb_window else None,
        "lcb_style": style,
        "engine": engine_kind,
        "output_dir": str(out_dir),
    })
    summary["input"] = str(out_dir / "generations.jsonl")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
