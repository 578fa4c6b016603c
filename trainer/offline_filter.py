"""Offline difficulty filtering (``trainer filter``, docs/magic.md): sample k responses per problem
with the rollout engine, score them through the verifier, write every row back with its pass
count, and keep the problems solved in [lo, hi] of k (the report's released filter: 1..15 of
16, with the base model).

Outputs (same format as the input: JSONL in, JSONL out; parquet in, parquet out):

- ``--output``: every row of the input, in order, with two added fields: ``pass_count`` (correct
  responses out of ``pass_k``; null for rows that were skipped as invalid) and ``pass_k`` (k).
  verl/Skywork rows also get ``extra_info.model_difficulty[<difficulty key>] = pass_count``,
  the released data's own field (default key: the model directory's name, e.g.
  "DeepSeek-R1-Distill-Qwen-7B"), so the output can be filtered again like the release.
- ``--kept-output`` (default ``<output>.kept.<ext>``): the rows with lo <= pass_count <= hi.

Resumable: problems are scored in fixed batches of ``batch_size`` (batch b samples with seed
``seed + b``) and each finished batch is appended to a sidecar ``<output>.progress.jsonl``
(flushed and fsynced). A re-run with the same settings skips the batches already there, so an
interrupted run ends with the same pass counts as an uninterrupted one (for a deterministic
engine). The sidecar's first line records the settings that change pass counts (input, model,
k, sampling, batch size, seed, suffix); a re-run with other settings is refused rather than
mixing counts. ``lo``/``hi`` are not among them: re-splitting with other bounds reuses every
score. The sidecar is kept after the run (delete it to score again from scratch).

``--released-difficulty MODEL`` samples nothing: it reproduces Skywork's released filter from
the ``extra_info.model_difficulty[MODEL]`` field the data already carries.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from trainer.data import (
    DEFAULT_SUFFIX,
    LoadResult,
    Problem,
    load_dataset,
    model_difficulty,
    row_format,
)
from trainer.engines import EngineConfig, standalone_engine
from trainer.evaluation import generate_and_score
from trainer.interfaces import RolloutEngine, SamplingParams
from verifier.items import NOT_A_VERDICT

log = logging.getLogger(__name__)

PROGRESS_VERSION = 1


class FilterError(RuntimeError):
    """The filter cannot go on as asked; the message says why and what to do."""


@dataclass
class FilterOptions:
    """Offline difficulty filter: keep problems solved in [lo, hi] of k samples."""

    input: Path
    """JSONL or parquet, any loader format."""
    output: Path
    """Every row with pass_count/pass_k (same format as the input)."""
    model: str | None = None
    """Local checkpoint that samples the responses (its path also identifies the model in the
    progress file)."""
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
    """Sampling temperature: the rollout temperature of training (docs/magic.md), so the filter
    measures how the policy will see each problem."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = -1
    """Top-k sampling (-1: off)."""
    max_tokens: int = 32768
    """Response limit, tokens."""
    seed: int = 0
    """Batch b samples with seed + b."""
    batch_size: int = 64
    """Problems per generate call and per saved progress record: the unit of resumption."""
    difficulty_key: str | None = None
    """Key under extra_info.model_difficulty for verl rows (default: the model directory's
    name)."""
    instruction_suffix: str = DEFAULT_SUFFIX
    """Appended to math prompts (the report's; '' for none)."""
    skip_invalid: bool = False
    """Skip malformed rows (counted) instead of failing."""
    allow_errors: bool = False
    """Count responses the verifier could not judge as incorrect instead of stopping."""
    timeout_s: float = 3600.0
    """Longest wait for verdicts after generation ends, seconds."""
    tokenizer: str | None = None
    """Tokenizer directory (default: --model)."""
    verifier_addr: str | None = None
    """HOST:PORT[,HOST:PORT...] of a verifier; default: start a local one."""
    verifier_workers: int = 2
    """Workers of the local verifier (without --verifier-addr)."""
    engine: EngineConfig = field(default_factory=standalone_engine)
    """The rollout engine (hf: Hugging Face generate, CPU and small models; vllm: production)."""

    def __post_init__(self) -> None:
        self.input, self.output = Path(self.input), Path(self.output)
        if self.kept_output is not None:
            self.kept_output = Path(self.kept_output)
        if self.k < 1:
            raise ValueError(f"--k must be >= 1, got {self.k}")
        if not 0 <= self.lo <= self.hi <= self.k:
            raise ValueError(f"need 0 <= lo <= hi <= k, got lo={self.lo}, hi={self.hi}, k={self.k}")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.output.resolve() == self.input.resolve():
            raise ValueError("--output must differ from --input (the input is never overwritten)")

    @property
    def kept_path(self) -> Path:
        if self.kept_output is not None:
            return self.kept_output
        return self.output.with_name(f"{self.output.stem}.kept{self.output.suffix}")

    @property
    def progress_path(self) -> Path:
        return self.output.with_name(self.output.name + ".progress.jsonl")

    def fingerprint(self) -> dict[str, Any]:
        return {"version": PROGRESS_VERSION, "input": str(self.input.resolve()),
                "model": self.model or "", "k": self.k, "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "max_tokens": self.max_tokens,
                "seed": self.seed, "batch_size": self.batch_size,
                "instruction_suffix": self.instruction_suffix}


@dataclass
class FilterReport:
    rows: int
    scored: int
    kept: int
    skipped_invalid: int
    histogram: dict[int, int]
    """pass_count -> number of problems."""
    batches_total: int = 0
    batches_run: list[int] = field(default_factory=list)
    """Batches generated by this invocation (the others came from the progress file)."""
    errors_counted_as_incorrect: int = 0
    output: str = ""
    kept_output: str = ""


# ---------------------------------------------------------------------------------------------
# The progress sidecar
# ---------------------------------------------------------------------------------------------

class Progress:
    """``<output>.progress.jsonl``: a header line with the settings, then one line per scored
    problem ``{"batch", "row", "id", "pass_count", "errors", "statuses"}``."""

    def __init__(self, path: Path, fingerprint: dict[str, Any]):
        self.path = path
        self.records: dict[int, dict[str, Any]] = {}
        if path.exists():
            self._load(fingerprint)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", encoding="utf-8") as f:
                f.write(json.dumps({"header": fingerprint}) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def _load(self, fingerprint: dict[str, Any]) -> None:
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a line cut short by a crash: drop it before appending
            log.warning("dropping an incomplete last line of %s", self.path)
            with self.path.open("r+b") as f:
                f.truncate(end)
            data = data[:end]
        lines = data.decode("utf-8").splitlines()
        try:
            header = json.loads(lines[0])["header"] if lines else None
        except (ValueError, KeyError, TypeError):
            header = None
        if header is None:
            raise FilterError(f"{self.path} is not a filter progress file; move it away or "
                              "choose another --output")
        if header != fingerprint:
            diff = {k: (header.get(k), v) for k, v in fingerprint.items() if header.get(k) != v}
            raise FilterError(f"{self.path} was written with other settings (was, now): {diff}. "
                              "Delete it to start over, or use the same settings to resume.")
        for n, line in enumerate(lines[1:], 2):
            try:
                rec = json.loads(line)
                self.records[int(rec["row"])] = rec
            except (ValueError, KeyError, TypeError) as e:
                raise FilterError(f"{self.path} line {n} is corrupt ({e}); delete the file to "
                                  "start over") from None

    def append(self, records: list[dict[str, Any]]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
        for rec in records:
            self.records[int(rec["row"])] = rec

    def has_batch(self, rows: list[tuple[int, Problem]]) -> bool:
        for index, p in rows:
            rec = self.records.get(index)
            if rec is None:
                return False
            if rec.get("id") != p.id:
                raise FilterError(f"{self.path}: row {index} was problem {rec.get('id')!r}, the "
                                  f"input now has {p.id!r} there; the input changed: delete the "
                                  "progress file to start over")
        return True


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------

def score_problems(opts: FilterOptions, loaded: LoadResult, engine: RolloutEngine | None,
                   client: Any, prompt_ids: Callable[[Problem], list[int]] | None,
                   on_batch: Callable[[int, int], None] | None = None,
                   ) -> tuple[dict[int, int], list[int], int]:
    """Pass counts by row index for every usable row, generating only the batches the
    progress file lacks. Returns (pass counts, batches run now, errors counted as incorrect)."""

    usable = [(r.index, r.problem) for r in loaded.rows if r.problem is not None]
    batches = [usable[i:i + opts.batch_size] for i in range(0, len(usable), opts.batch_size)]
    progress = Progress(opts.progress_path, opts.fingerprint())
    todo = [b for b, rows in enumerate(batches) if not progress.has_batch(rows)]
    if len(todo) < len(batches):
        log.info("resuming: %d of %d batches already scored in %s", len(batches) - len(todo),
                 len(batches), opts.progress_path)
    error_values = {s.value for s in NOT_A_VERDICT}
    counted_errors = 0
    for n, b in enumerate(todo):
        rows = batches[b]
        assert engine is not None and prompt_ids is not None
        params = SamplingParams(n=opts.k, temperature=opts.temperature, top_p=opts.top_p,
                                top_k=opts.top_k, max_tokens=opts.max_tokens, seed=opts.seed + b)
        probs = [p for _, p in rows]
        run = generate_and_score(engine, client, probs, [prompt_ids(p) for p in probs], params,
                                 timeout_s=opts.timeout_s)
        correct = run.correct()
        records = []
        for i, (index, p) in enumerate(rows):
            statuses = run.statuses(i)
            errors = sum(s in error_values for s in statuses)
            if errors and not opts.allow_errors:
                bad = next(run.results[run.problems[i].wire_id(j)] for j, s in enumerate(statuses)
                           if s in error_values)
                raise FilterError(
                    f"problem {p.id!r} ({p.where}): {errors} of {opts.k} responses could not be "
                    f"judged ({bad.status.value}: {bad.detail}); fix the data or the verifier, "
                    "or pass --allow-errors to count them as incorrect. Batches already "
                    f"finished are saved in {opts.progress_path}.")
            counted_errors += errors
            records.append({"batch": b, "row": index, "id": p.id, "pass_count": sum(correct[i]),
                            "errors": errors, "statuses": dict(Counter(statuses))})
        progress.append(records)
        if on_batch is not None:
            on_batch(n + 1, len(todo))
        log.info("filter batch %d/%d scored (%d problems)", n + 1, len(todo), len(rows))
    counts = {index: int(progress.records[index]["pass_count"]) for index, _ in usable}
    return counts, todo, counted_errors


# ---------------------------------------------------------------------------------------------
# Writing back
# ---------------------------------------------------------------------------------------------

def _annotate(row: dict[str, Any], count: int | None, k: int, key: str | None) -> dict[str, Any]:
    out = dict(row)
    out["pass_count"] = count
    out["pass_k"] = k
    if key and count is not None and row_format(row) == "verl":
        extra = dict(out.get("extra_info") or {})
        md = extra.get("model_difficulty")
        if isinstance(md, str):
            try:
                md = json.loads(md)
            except ValueError:
                md = None
        md = dict(md) if isinstance(md, dict) else {}
        md[key] = count
        extra["model_difficulty"] = md
        out["extra_info"] = extra
    return out


def _write_jsonl(src: Path, dst: Path, counts: dict[int, int | None], k: int, key: str | None,
                 keep: Callable[[int | None], bool] | None) -> int:
    """Copy ``src`` to ``dst`` line by line, annotating JSON-object rows (index = position among
    non-blank lines, as trainer.data.read_rows counts). Lines that are not JSON objects are
    copied unchanged (and never kept). Returns the rows written."""
    tmp = dst.with_name(dst.name + ".tmp")
    dst.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with src.open(encoding="utf-8") as f, tmp.open("w", encoding="utf-8") as out:
        index = 0
        for line in f:
            if not line.strip():
                continue
            count = counts.get(index)
            index += 1
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict):
                if keep is None:
                    out.write(line if line.endswith("\n") else line + "\n")
                    written += 1
                continue
            if keep is not None and not keep(count):
                continue
            out.write(json.dumps(_annotate(row, count, k, key), ensure_ascii=False) + "\n")
            written += 1
    tmp.replace(dst)
    return written


def _write_parquet(src: Path, dst: Path, counts: dict[int, int | None], k: int,
                   key: str | None, keep: Callable[[int | None], bool] | None) -> int:
    """The input table with ``pass_count``/``pass_k`` columns (replaced if present) and, for verl
    rows, ``extra_info.model_difficulty[key]``; the other columns are kept as they were."""
    import pyarrow as pa  # lazy: optional: parquet files only
    import pyarrow.parquet as pq  # lazy: optional: parquet files only

    table = pq.read_table(src)
    n = table.num_rows
    values = [counts.get(i) for i in range(n)]
    for name in ("pass_count", "pass_k"):
        if name in table.column_names:
            table = table.drop_columns([name])
    if key and "extra_info" in table.column_names and "reward_model" in table.column_names:
        extras = table.column("extra_info").to_pylist()
        new = [_annotate({"reward_model": {}, "extra_info": e}, c, k, key)["extra_info"]
               for e, c in zip(extras, values)]
        idx = table.column_names.index("extra_info")
        table = table.set_column(idx, "extra_info", pa.array(new))
    table = table.append_column("pass_count", pa.array(values, pa.int64()))
    table = table.append_column("pass_k", pa.array([k] * n, pa.int64()))
    if keep is not None:
        table = table.filter(pa.array([keep(v) for v in values], pa.bool_()))
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(dst)
    return table.num_rows


def write_outputs(opts: FilterOptions, counts: dict[int, int | None],
                  key: str | None) -> tuple[int, int]:
    """Write ``--output`` (every row) and the kept subset; returns (rows, kept)."""
    writer = _write_parquet if opts.input.suffix == ".parquet" else _write_jsonl

    def keep(c: int | None) -> bool:
        return c is not None and opts.lo <= c <= opts.hi

    rows = writer(opts.input, opts.output, counts, opts.k, key, None)
    kept = writer(opts.input, opts.kept_path, counts, opts.k, key, keep)
    return rows, kept


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------

def load_for_filter(opts: FilterOptions) -> LoadResult:
    """Every row of the input (no LiveCodeBench date window: the filter scores what it is
    given). DataError naming the row unless ``skip_invalid``."""
    return load_dataset([opts.input], instruction_suffix=opts.instruction_suffix,
                        skip_invalid=opts.skip_invalid, date_window=None, keep_rows=True)


def run_filter(opts: FilterOptions, engine: RolloutEngine | None, client: Any,
               prompt_ids: Callable[[Problem], list[int]] | None,
               loaded: LoadResult | None = None) -> FilterReport:
    """Score (resuming from the progress file), then write the outputs."""
    loaded = loaded or load_for_filter(opts)
    counts, ran, errors = score_problems(opts, loaded, engine, client, prompt_ids)
    key = opts.difficulty_key or (Path(opts.model).name if opts.model else None)
    return _finish(opts, loaded, counts, key, ran, errors)


def released_filter(opts: FilterOptions, model: str) -> FilterReport:
    """No sampling: pass counts from the data's own ``extra_info.model_difficulty[model]``
    (Skywork-OR1-RL-Data), split with [lo, hi] exactly as Skywork's released preprocessing
    does. Rows without the field get a null pass count and are not kept."""
    loaded = load_for_filter(opts)
    counts: dict[int, int | None] = {}
    missing = 0
    for r in loaded.rows:
        if r.problem is None:
            continue
        d = model_difficulty(r.problem, model)
        missing += d is None
        counts[r.index] = d
    if missing:
        log.warning("%d problems have no model_difficulty[%r]: not kept", missing, model)
    return _finish(opts, loaded, counts, None, [], 0)


def _finish(opts: FilterOptions, loaded: LoadResult, counts: dict[int, Any], key: str | None,
            ran: Sequence[int], errors: int) -> FilterReport:
    rows, kept = write_outputs(opts, counts, key)
    scored = [c for c in counts.values() if c is not None]
    n_batches = -(-sum(1 for r in loaded.rows if r.problem is not None) // opts.batch_size)
    return FilterReport(rows=rows, scored=len(scored), kept=kept,
                        skipped_invalid=loaded.skipped,
                        histogram=dict(sorted(Counter(scored).items())),
                        batches_total=n_batches, batches_run=list(ran),
                        errors_counted_as_incorrect=errors, output=str(opts.output),
                        kept_output=str(opts.kept_path))
