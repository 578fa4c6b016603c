"""The problem formats the verifier judges: reading rows and parsing their ground truths.

Three row formats, recognised per row (so a JSONL or parquet file may hold any of them):

- **plain JSONL**: ``{"id", "domain": "math"|"code", "ground_truth", "data_source"?,
  "prompt"?}`` (the item envelope; ``prompt`` is the trainer's business);
- **verl / Skywork parquet**: ``data_source``, ``prompt`` (chat list), ``ability``
  ("math" | "code"), ``reward_model.ground_truth``, ``extra_info`` (``index``/``id``,
  ``model_difficulty`` in Skywork-OR1-RL-Data). Math ground truth is kept as given (an answer
  string or a JSON list string like ``'["3"]'``: the verifier reads both). Code ground truth is
  a JSON string of test cases, parsed, cleaned of empty fields and checked with the verifier's
  own parser, so a bad row fails when it is read, not when it is judged;
- **LiveCodeBench** ``code_generation_lite`` release rows (verifier/lcb.py).

The verifier owns these formats because it judges these problems (``verifier eval
--problems``); the trainer imports them and adds prompts (trainer/data.py). A malformed row is a
:class:`DataError` naming the file and row, or, with ``skip_invalid``, skipped and counted
(never a silent drop). LiveCodeBench rows outside the contest-date window are counted apart.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Literal, Sequence, TypeVar

from verifier.ground_truth import BadGroundTruth, parse_ground_truth
from verifier.lcb import (LCB_DATA_SOURCE, LCB_REPORT_WINDOW, LcbQuestion, in_window,
                          is_lcb_row, parse_lcb_row)

log = logging.getLogger(__name__)

RowFormat = Literal["plain", "verl", "lcb"]
T = TypeVar("T")


class DataError(ValueError):
    """A data file or row that cannot be used; the message names the file and row."""


@dataclass
class ProblemRow:
    """One problem as the verifier sees it: what to judge a response against, and where the
    problem came from."""

    id: str
    domain: str
    ground_truth: Any
    data_source: str
    format: RowFormat
    where: str
    """``"FILE: row N"`` / ``"FILE: line N"``."""
    prompt: Any = None
    """The row's ``prompt`` as given (plain and verl rows; None for LiveCodeBench, whose prompt
    is built from ``lcb``)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """verl ``extra_info`` (with ``model_difficulty``); LiveCodeBench ``platform``,
    ``difficulty``, ``contest_id``, ``question_title``, ``contest_date``."""
    lcb: LcbQuestion | None = None
    """The LiveCodeBench question (LiveCodeBench rows only)."""


# ---------------------------------------------------------------------------------------------
# Ground truths
# ---------------------------------------------------------------------------------------------

def check_math_truth(gt: Any, where: str) -> Any:
    """A math ground truth as the verifier takes it (a string, or a list of strings); numbers
    become strings. DataError for an empty one or another type."""
    if isinstance(gt, str):
        s = gt.strip()
        if not s:
            raise DataError(f"{where}: empty ground truth")
        if s.startswith("["):
            try:
                decoded = json.loads(s)
            except ValueError:
                decoded = None
            if decoded == []:
                raise DataError(f"{where}: ground truth is an empty JSON list")
        return gt
    if isinstance(gt, (list, tuple)):
        if not gt or not all(isinstance(x, str) and x.strip() for x in gt):
            raise DataError(f"{where}: a math ground-truth list must hold non-empty strings")
        return list(gt)
    if isinstance(gt, (int, float)) and not isinstance(gt, bool):
        return str(gt)
    raise DataError(f"{where}: math ground truth must be a string or a list of strings, "
                    f"got {type(gt).__name__}")


def check_code_truth(gt: Any, where: str) -> dict[str, Any]:
    """Parse a code ground truth (an object or a JSON string of one) and validate it with the
    verifier's parser. Fields that are None, "", [] or {} are dropped: Skywork's released
    preprocessing drops the None ones, and LiveCodeBench's judge reads a missing or None
    ``fn_name`` as stdin/stdout; dropping the other empty values too makes the release's
    ``"fn_name": ""`` mean stdin/stdout here as well."""
    if isinstance(gt, str):
        try:
            gt = json.loads(gt)
        except ValueError as e:
            raise DataError(f"{where}: code ground truth is not valid JSON: {e}") from None
    if not isinstance(gt, dict):
        raise DataError(f"{where}: code ground truth must be an object of test cases, got "
                        f"{type(gt).__name__}")
    cleaned = {k: v for k, v in gt.items() if v not in (None, "", [], {})}
    try:
        parse_ground_truth(cleaned)
    except BadGroundTruth as e:
        raise DataError(f"{where}: bad code ground truth: {e}") from None
    return cleaned


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------

def row_format(row: dict[str, Any]) -> RowFormat:
    """"verl" (a ``reward_model`` field), "lcb" (verifier.lcb.is_lcb_row) or "plain"."""
    if "reward_model" in row:
        return "verl"
    if is_lcb_row(row):
        return "lcb"
    return "plain"


def _lcb_row(row: dict[str, Any], where: str) -> ProblemRow:
    try:
        qid, gt, question = parse_lcb_row(row)
    except ValueError as e:
        raise DataError(f"{where}: {e}") from None
    gt = check_code_truth(gt, where)
    extra = {k: row.get(k) for k in ("platform", "difficulty", "contest_id", "question_title")
             if row.get(k) is not None}
    extra["contest_date"] = question.contest_date.isoformat()
    return ProblemRow(qid, "code", gt, LCB_DATA_SOURCE, "lcb", where, None, extra, question)


def parse_row(row: Any, where: str, index: int = 0) -> ProblemRow:
    """One row of any format as a ProblemRow; DataError naming ``where`` when it is malformed.
    ``index`` (the row's position in its file) names verl rows that carry no id."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: a row must be an object")
    fmt = row_format(row)
    if fmt == "lcb":
        return _lcb_row(row, where)
    extra: dict[str, Any] = {}
    if fmt == "verl":
        rm = row.get("reward_model")
        if not isinstance(rm, dict):
            raise DataError(f"{where}: 'reward_model' must be an object with 'ground_truth'")
        ground_truth = rm.get("ground_truth")
        ability = str(row.get("ability") or "math").lower()
        if ability in ("code", "coding"):
            domain = "code"
        elif ability == "math":
            domain = "math"
        else:
            raise DataError(f"{where}: unknown ability {row.get('ability')!r} (math or code)")
        extra = row.get("extra_info") or {}
        if not isinstance(extra, dict):
            raise DataError(f"{where}: 'extra_info' must be an object")
        pid = row.get("id")
        if pid is None:
            local = next((extra[k] for k in ("index", "id") if extra.get(k) is not None), index)
            pid = f"{row.get('data_source') or 'row'}-{local}"
    else:
        ground_truth = row.get("ground_truth")
        domain = row.get("domain", "math")
        pid = row.get("id")
        extra = row.get("extra") or {}  # kept for filters and tools (the toy world's levels)
        if not isinstance(extra, dict):
            raise DataError(f"{where}: 'extra' must be an object")
    if pid is None or isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise DataError(f"{where}: missing 'id'")
    if domain not in ("math", "code"):
        raise DataError(f"{where}: unknown domain {domain!r}")
    if ground_truth is None or ground_truth == "":
        raise DataError(f"{where}: missing ground truth")
    if domain == "math":
        ground_truth = check_math_truth(ground_truth, where)
    else:
        ground_truth = check_code_truth(ground_truth, where)
    data_source = row.get("data_source") or ""
    if not isinstance(data_source, str):
        raise DataError(f"{where}: 'data_source' must be a string")
    return ProblemRow(str(pid), domain, ground_truth, data_source, fmt, where, row.get("prompt"),
                      dict(extra))


def read_rows(path: str | Path) -> list[tuple[str, int, Any]]:
    """``(where, index, row)`` for every row of a parquet or JSONL file; a JSONL line that is
    not JSON comes back as a DataError in place of the row."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"data file {str(path)!r} does not exist")
    if path.suffix == ".parquet":
        try:
            # Lazy: pyarrow belongs to the train/dev extras, and only parquet input needs it.
            import pyarrow.parquet as pq  # lazy: optional heavy dependency (parquet files only)
        except ImportError:
            raise DataError(f"{path}: reading parquet needs pyarrow (pip install pyarrow, or "
                            "the project's train extra)") from None
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # noqa: BLE001 - pyarrow's errors are many; name the file
            raise DataError(f"{path}: not a readable parquet file: {e}") from None
        return [(f"{path}: row {i}", i, r) for i, r in enumerate(rows)]
    out: list[tuple[str, int, Any]] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}: line {lineno}"
            try:
                row: Any = json.loads(line)
            except ValueError as e:
                row = DataError(f"{where}: not valid JSON: {e}")
            out.append((where, len(out), row))
    return out


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------

@dataclass
class Row(Generic[T]):
    """One row of a data file as read, and what became of it."""

    where: str
    index: int
    """0-based position of the row in its file (blank JSONL lines not counted)."""
    raw: Any
    """The decoded row (a dict for usable rows), or a DataError for a line that is not JSON."""
    problem: T | None = None
    error: str | None = None
    """Why the row is unusable (None when it is)."""
    outside_window: bool = False
    """A LiveCodeBench row outside the contest-date window (not an error)."""


@dataclass
class Loaded(Generic[T]):
    """The problems of some files, and what was left out."""

    problems: list[T]
    skipped: int
    """Malformed rows skipped because ``skip_invalid`` was set."""
    outside_window: list[ProblemRow] = field(default_factory=list)
    """LiveCodeBench problems left out by the contest-date window (parsed and checked)."""
    rows: list[Row[T]] = field(default_factory=list)
    """Every row read, in file order, when loaded with ``keep_rows`` (else empty)."""


def _identity(row: ProblemRow) -> Any:
    return row


def load_rows(paths: Sequence[str | Path] | str | Path, *,
              date_window: tuple[str | None, str | None] | None = LCB_REPORT_WINDOW,
              skip_invalid: bool = False, allow_empty: bool = False, keep_rows: bool = False,
              convert: Callable[[ProblemRow], T] = _identity) -> Loaded[T]:
    """Every row of ``paths`` (parquet or JSONL, any format), in order, each passed through
    ``convert`` (which may raise DataError too: the trainer builds its prompts there).

    ``date_window`` applies to LiveCodeBench rows only (None keeps them all). ``keep_rows``
    also returns every raw row (for tools that write the data back; off by default, as a large
    code set would be held twice). Raises DataError naming the file and row for a malformed
    row (unless ``skip_invalid``), for a duplicate problem id (outside-window rows included),
    and when no problem is left (unless ``allow_empty``).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    problems: list[T] = []
    rows: list[Row[T]] = []
    outside: list[ProblemRow] = []
    skipped = 0
    seen: dict[str, str] = {}
    for p in paths:
        for where, index, raw in read_rows(p):
            rec: Row[T] = Row(where, index, raw)
            if keep_rows:
                rows.append(rec)
            try:
                if isinstance(raw, Exception):
                    raise raw
                parsed = parse_row(raw, where, index)
                if parsed.id in seen:
                    raise DataError(f"{where}: duplicate id {parsed.id!r} "
                                    f"(first at {seen[parsed.id]})")
                if parsed.lcb is not None and not in_window(parsed.lcb.contest_date,
                                                            date_window):
                    seen[parsed.id] = where
                    rec.outside_window = True
                    outside.append(parsed)
                    continue
                prob = convert(parsed)
            except DataError as e:
                if not skip_invalid:
                    raise
                rec.error = str(e)
                skipped += 1
                log.warning("skipping invalid row: %s", e)
                continue
            seen[parsed.id] = where
            rec.problem = prob
            problems.append(prob)
    if skipped:
        log.warning("skipped %d invalid rows", skipped, extra={"skipped": skipped})
    if outside:
        log.info("left out %d LiveCodeBench problems outside the contest-date window %s",
                 len(outside), date_window, extra={"outside_window": len(outside)})
    if not problems and not allow_empty:
        why = f" ({len(outside)} outside the date window {date_window})" if outside else ""
        raise DataError(f"no usable problems in {[str(p) for p in paths]}{why}")
    return Loaded(problems, skipped, outside, rows)

