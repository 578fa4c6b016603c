"""The problem formats the verifier judges: reading rows and parsing their ground truths.

Three row formats, recognised per row (so a JSONL or parquet file may hold any of them):

- **plain JSONL**: ``{"id", "domain": "math"|"code", "ground_truth", "data_source"?,
  "prompt"?, "checker"?}`` (the item envelope; ``prompt`` is the trainer's business; a code
  row's ``checker`` column goes into its ground truth, docs/contracts.md 1);
- **verl / Skywork parquet**: ``data_source``, ``prompt`` (chat list), ``ability``
  ("math" | "code"), ``reward_model.ground_truth``, ``extra_info`` (``index``/``id``,
  ``model_difficulty`` in Skywork-OR1-RL-Data), and a ``checker`` column as in plain rows.
  Math ground truth is kept as given (an answer
  string or a JSON list string like ``'["3"]'``: the verifier reads both). Code ground truth is
  a JSON string of test cases, parsed, cleaned of empty fields and checked with the verifier's
  own parser, so a bad row fails when it is read, not when it is judged;
- **LiveCodeBench** ``code_generation_lite`` release rows (verifier/data/lcb.py).

The verifier owns these formats because it judges these problems (``verifier eval
--problems``); the trainer imports them and adds prompts (trainer/data.py). A malformed row is a
:class:`DataError` naming the file and row, or, with ``skip_invalid``, skipped and counted
(never a silent drop); whatever a row makes the parsers raise (a RecursionError from JSON
nested thousands deep included) is that row's DataError, never the whole read's. A row whose
tests inflate past the bound is a :class:`TooLarge` DataError; on request it, and any
malformed row that still names its problem (:class:`Unjudged`), is kept apart with its id
instead, for ``verifier eval`` to report as not judged without ending the run. LiveCodeBench rows outside the contest-date window
are counted apart, and their tests are never decoded.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, Literal, Sequence, TypeVar

from verifier.scoring.bigint import MAX_INT_DIGITS, json_loads_digits
from verifier.scoring.checkers import BadChecker, add_checker
from verifier.data.ground_truth import BadGroundTruth, parse_ground_truth
from verifier.data.lcb import (LCB_DATA_SOURCE, LCB_REPORT_WINDOW, LcbQuestion, OversizedTests,
                          in_window, is_lcb_row, parse_lcb_head, parse_lcb_tests)

log = logging.getLogger(__name__)

RowFormat = Literal["plain", "verl", "lcb"]
T = TypeVar("T")


class DataError(ValueError):
    """A data file or row that cannot be used; the message names the file and row."""


@contextmanager
def _row_errors(where: str) -> Iterator[None]:
    """Make any exception raised while decoding one row that row's DataError. A row is
    untrusted input: JSON nested thousands deep makes json (and anything that walks it) raise
    RecursionError, which is no ValueError, and one such row must not end a whole read."""
    try:
        yield
    except DataError:
        raise
    except RecursionError:
        raise DataError(f"{where}: nested too deeply to decode (RecursionError)") from None
    except Exception as e:  # noqa: BLE001 - whatever a hostile row makes a parser raise
        raise DataError(f"{where}: cannot be read: {type(e).__name__}: {e}") from None


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


class Unjudged(DataError):
    """A row that names its problem but cannot be judged (a malformed ground truth, a bad
    field): ``problem`` is the row without its ground truth (None), so ``verifier eval`` can
    report it, with its generations, as not judged instead of ending the run."""

    def __init__(self, message: str, problem: ProblemRow):
        super().__init__(message)
        self.problem = problem
        self.position = 0  # how many problems load_rows had read before it: its place


class TooLarge(Unjudged):
    """A row whose tests inflate past ``verifier.data.lcb.MAX_LCB_TESTS_BYTES``: nothing need be
    wrong with it, but it cannot be judged."""


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
            except (ValueError, RecursionError):  # then an answer string, judged as written
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


def check_code_truth(gt: Any, where: str, checker: Any = None) -> dict[str, Any]:
    """Parse a code ground truth (an object or a JSON string of one) and validate it with the
    verifier's parser. Fields that are None, "", [] or {} are dropped: Skywork's released
    preprocessing drops the None ones, and LiveCodeBench's judge reads a missing or None
    ``fn_name`` as stdin/stdout; dropping the other empty values too makes the release's
    ``"fn_name": ""`` mean stdin/stdout here as well.

    ``checker``: the row's ``checker`` column (docs/contracts.md 1: a built-in comparator's
    name, a checker program object, or a JSON string of one), put into the ground truth; a
    ground truth that names another checker of its own is a DataError."""
    if isinstance(gt, str):
        try:
            gt = json_loads_digits(gt, MAX_INT_DIGITS)
        except RecursionError:  # json's depth bound; not a ValueError
            raise DataError(f"{where}: code ground truth is not valid JSON: nested too deeply "
                            "to decode") from None
        except ValueError as e:
            raise DataError(f"{where}: code ground truth is not valid JSON: {e}") from None
    if not isinstance(gt, dict):
        raise DataError(f"{where}: code ground truth must be an object of test cases, got "
                        f"{type(gt).__name__}")
    cleaned = {k: v for k, v in gt.items() if v not in (None, "", [], {})}
    try:
        cleaned = add_checker(cleaned, checker)
    except BadChecker as e:
        raise DataError(f"{where}: {e}") from None
    try:
        # The judging profile is not known yet (verifier eval picks it per row): integers as
        # large as any profile allows; the judge applies the item's own (code_score._spec).
        parse_ground_truth(cleaned, MAX_INT_DIGITS)
    except BadGroundTruth as e:
        raise DataError(f"{where}: bad code ground truth: {e}") from None
    return cleaned


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------

def row_format(row: dict[str, Any]) -> RowFormat:
    """"verl" (a ``reward_model`` field), "lcb" (verifier.data.lcb.is_lcb_row) or "plain"."""
    if "reward_model" in row:
        return "verl"
    if is_lcb_row(row):
        return "lcb"
    return "plain"


def _lcb_head(row: dict[str, Any], where: str) -> ProblemRow:
    """A LiveCodeBench row without its ground truth (None): its tests are not decoded."""
    try:
        qid, question = parse_lcb_head(row)
    except ValueError as e:
        raise DataError(f"{where}: {e}") from None
    extra = {k: row.get(k) for k in ("platform", "difficulty", "contest_id", "question_title")
             if row.get(k) is not None}
    extra["contest_date"] = question.contest_date.isoformat()
    return ProblemRow(qid, "code", None, LCB_DATA_SOURCE, "lcb", where, None, extra, question)


def _lcb_tests(row: dict[str, Any], head: ProblemRow) -> ProblemRow:
    """``head`` (:func:`_lcb_head`) with the ground truth decoded from the row's tests;
    :class:`TooLarge` for tests over the bound."""
    try:
        gt = parse_lcb_tests(row)
    except OversizedTests as e:
        raise TooLarge(f"{head.where}: {e}", head) from None
    except ValueError as e:
        raise DataError(f"{head.where}: {e}") from None
    head.ground_truth = check_code_truth(gt, head.where)
    return head


def _verl_id(row: dict[str, Any], extra: dict[str, Any], index: int) -> Any:
    """A verl row's ``id``, else ``"{data_source}-{extra_info.index|id|position}"``."""
    pid = row.get("id")
    if pid is None:
        local = next((extra[k] for k in ("index", "id") if extra.get(k) is not None), index)
        pid = f"{row.get('data_source') or 'row'}-{local}"
    return pid


def row_id(row: Any, index: int = 0) -> str | None:
    """The id ``row`` names under :func:`parse_row`'s rules whatever else is wrong with it, or
    None when it names none usable. Never raises: it names rows that were refused (so that
    ``verifier eval`` can tell their generations from generations naming no problem)."""
    try:
        if not isinstance(row, dict):
            return None
        fmt = row_format(row)
        if fmt == "lcb":
            pid = row.get("question_id")
        elif fmt == "verl":
            extra = row.get("extra_info")
            pid = _verl_id(row, extra if isinstance(extra, dict) else {}, index)
        else:
            pid = row.get("id")
        if pid is None or isinstance(pid, bool) or not isinstance(pid, (str, int)):
            return None
        return str(pid)
    except Exception:  # noqa: BLE001 - e.g. RecursionError formatting a hostile extra_info.index
        return None


def unjudged_head(row: Any, where: str, index: int = 0) -> ProblemRow | None:
    """What a malformed row still says about its problem (id, domain, data source, and a
    LiveCodeBench row's question when its head parses), ground truth None; None when it names
    no id (:func:`row_id`). Never raises."""
    pid = row_id(row, index)
    if pid is None:
        return None
    try:
        fmt = row_format(row)
        if fmt == "lcb":
            try:
                return _lcb_head(row, where)
            except DataError:
                return ProblemRow(pid, "code", None, LCB_DATA_SOURCE, "lcb", where)
        if fmt == "verl":
            ability = str(row.get("ability") or "math").lower()
            domain = "code" if ability in ("code", "coding") else "math"
        else:
            domain = row.get("domain", "math")
            domain = domain if domain in ("math", "code") else "math"
        source = row.get("data_source")
        return ProblemRow(pid, domain, None, source if isinstance(source, str) else "", fmt,
                          where)
    except Exception:  # noqa: BLE001 - a hostile row: what it names is enough
        return ProblemRow(pid, "math", None, "", "plain", where)


def parse_row(row: Any, where: str, index: int = 0) -> ProblemRow:
    """One row of any format as a ProblemRow; DataError naming ``where`` when it is malformed.
    ``index`` (the row's position in its file) names verl rows that carry no id."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: a row must be an object")
    fmt = row_format(row)
    if fmt == "lcb":
        return _lcb_tests(row, _lcb_head(row, where))
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
        pid = _verl_id(row, extra, index)
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
        ground_truth = check_code_truth(ground_truth, where, row.get("checker"))
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
    # Bytes, decoded line by line: a line that is not UTF-8 is that line's error, where a text
    # file object would raise from the loop itself and end the whole read.
    with path.open("rb") as f:
        for lineno, data in enumerate(f, 1):
            where = f"{path}: line {lineno}"
            try:
                line = data.decode("utf-8")
            except UnicodeDecodeError as e:
                out.append((where, len(out), DataError(f"{where}: not UTF-8 text: {e}")))
                continue
            if not line.strip():
                continue
            try:
                # Integers as large as any profile allows (verifier/scoring/bigint.py): a plain row's
                # ground truth may hold them as JSON numbers.
                row: Any = json_loads_digits(line, MAX_INT_DIGITS)
            except RecursionError:  # not a ValueError: json's depth bound
                row = DataError(f"{where}: not valid JSON: nested too deeply to decode")
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
class Skipped:
    """A row left out as invalid (``skip_invalid``)."""

    where: str
    id: str | None
    """The id the row names (:func:`row_id`), None when it names none."""
    reason: str


@dataclass
class Loaded(Generic[T]):
    """The problems of some files, and what was left out."""

    problems: list[T]
    skipped: int
    """Malformed rows skipped because ``skip_invalid`` was set."""
    outside_window: list[ProblemRow] = field(default_factory=list)
    """LiveCodeBench problems left out by the contest-date window: id, question and where, but
    no ground truth (None; their tests are never decoded)."""
    rows: list[Row[T]] = field(default_factory=list)
    """Every row read, in file order, when loaded with ``keep_rows`` (else empty)."""
    skipped_rows: list[Skipped] = field(default_factory=list)
    """The ``skipped`` rows: where, the id each names, and why."""
    unjudged: list[Unjudged] = field(default_factory=list)
    """Rows that name their problem but cannot be judged, each with its row (``.problem``, no
    ground truth), in file order: those too large to judge (:class:`TooLarge`) when loaded
    with ``keep_too_large``, and malformed rows when loaded with ``keep_unjudged`` (otherwise
    they are bad rows like any other)."""


def _identity(row: ProblemRow) -> Any:
    return row


def load_rows(paths: Sequence[str | Path] | str | Path, *,
              date_window: tuple[str | None, str | None] | None = LCB_REPORT_WINDOW,
              skip_invalid: bool = False, allow_empty: bool = False, keep_rows: bool = False,
              keep_too_large: bool = False, keep_unjudged: bool = False,
              convert: Callable[[ProblemRow], T] = _identity) -> Loaded[T]:
    """Every row of ``paths`` (parquet or JSONL, any format), in order, each passed through
    ``convert`` (which may raise DataError too: the trainer builds its prompts there).

    ``date_window`` applies to LiveCodeBench rows only (None keeps them all); it is applied
    before a row's tests are decoded, so a row left out by date is never decompressed.
    ``keep_rows`` also returns every raw row (for tools that write the data back; off by
    default, as a large code set would be held twice). ``keep_too_large`` returns the rows
    whose tests inflate past the bound (:class:`TooLarge`) in ``Loaded.unjudged`` instead of
    treating them as bad rows. ``keep_unjudged`` does the same for every malformed row that
    names its problem (:func:`unjudged_head`; not a duplicate id), and records the others (no
    readable id, a duplicate) in ``Loaded.skipped_rows`` as ``skip_invalid`` would: no row
    ends the read (``verifier eval`` reports them all as not judged). Raises DataError naming
    the file and row for a malformed row (unless ``skip_invalid`` or ``keep_unjudged``;
    anything a row makes the parsers raise counts, see :func:`_row_errors`), for a duplicate
    problem id (outside-window rows included), and when no problem is left (unless
    ``allow_empty``).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    problems: list[T] = []
    rows: list[Row[T]] = []
    outside: list[ProblemRow] = []
    skipped: list[Skipped] = []
    unjudged: list[Unjudged] = []
    seen: dict[str, str] = {}
    for p in paths:
        for where, index, raw in read_rows(p):
            rec: Row[T] = Row(where, index, raw)
            if keep_rows:
                rows.append(rec)
            try:
                if isinstance(raw, Exception):
                    raise raw
                with _row_errors(where):
                    # A LiveCodeBench row's head first: the duplicate check and the window
                    # need no tests, and a row left out must not be decompressed (a bomb).
                    lcb = isinstance(raw, dict) and row_format(raw) == "lcb"
                    parsed = _lcb_head(raw, where) if lcb else parse_row(raw, where, index)
                    if parsed.id in seen:
                        raise DataError(f"{where}: duplicate id {parsed.id!r} "
                                        f"(first at {seen[parsed.id]})")
                    if parsed.lcb is not None and not in_window(parsed.lcb.contest_date,
                                                                date_window):
                        seen[parsed.id] = where
                        rec.outside_window = True
                        outside.append(parsed)
                        continue
                    if lcb:
                        parsed = _lcb_tests(raw, parsed)
                prob = convert(parsed)
            except DataError as e:
                if keep_unjudged and not isinstance(e, TooLarge):
                    head = unjudged_head(raw, where, index)
                    if head is not None and head.id not in seen:
                        e = Unjudged(str(e), head)
                if isinstance(e, Unjudged) and (keep_unjudged or (keep_too_large
                                                                  and isinstance(e, TooLarge))):
                    e.position = len(problems)
                    seen[e.problem.id] = where
                    rec.error = str(e)
                    unjudged.append(e)
                    log.warning("row that cannot be judged: %s", e)
                    continue
                if not (skip_invalid or keep_unjudged):
                    raise
                rec.error = str(e)
                skipped.append(Skipped(where, row_id(raw, index), str(e)))
                log.warning("skipping invalid row: %s", e)
                continue
            seen[parsed.id] = where
            rec.problem = prob
            problems.append(prob)
    if skipped:
        log.warning("skipped %d invalid rows", len(skipped), extra={"skipped": len(skipped)})
    if outside:
        log.info("left out %d LiveCodeBench problems outside the contest-date window %s",
                 len(outside), date_window, extra={"outside_window": len(outside)})
    if not problems and not allow_empty:
        why = f" ({len(outside)} outside the date window {date_window})" if outside else ""
        raise DataError(f"no usable problems in {[str(p) for p in paths]}{why}")
    return Loaded(problems, len(skipped), outside, rows, skipped, unjudged)
