"""Training and evaluation problems: loading, prompt building, and a resumable sampler.

Three row formats, recognised per row (so a file may be JSONL or parquet in any of them):

- **plain JSONL** (DESIGN.md 3.1's item envelope plus a prompt), one problem per line:
  ``{"id", "prompt": str | [chat messages], "domain": "math"|"code", "ground_truth",
  "data_source"?, "extra"?}`` (``extra``, an object, is kept in ``Problem.extra``: the toy world
  stores each problem's level and reference response there);
- **verl / Skywork parquet**: ``data_source``, ``prompt`` (chat list), ``ability``
  ("math" | "code"), ``reward_model.ground_truth``, ``extra_info`` (``index``/``id``,
  ``model_difficulty`` in Skywork-OR1-RL-Data). Math ground truth is an answer string or a JSON
  list string (``'["3"]'``), kept as given (the verifier accepts both). Code ground truth is a
  JSON string of test cases; it is parsed, its empty fields are dropped (as Skywork's released
  preprocessing does: ``{"inputs": [...], "outputs": [...], "fn_name": ""}`` is stdin/stdout)
  and checked with the verifier's own parser, so a bad row fails here, not mid-training;
- **LiveCodeBench** ``code_generation_lite`` release rows (``question_content``,
  ``public_test_cases``, ``private_test_cases`` possibly compressed, ``metadata.func_name``,
  ``contest_date``, ``starter_code``), kept only inside a contest-date window (the report's
  2024-08-01..2025-02-01 by default), prompted with :func:`lcb_prompt`.

The math instruction suffix (the report's "Let's think step by step and output the final answer
within \\boxed{}.") is appended to the last user message of math problems that do not already
end with it; code prompts get ``code_suffix`` (empty by default: LiveCodeBench's prompt and
Skywork's code prompts carry their own format instructions).

A malformed row is a :class:`DataError` naming the file and row, unless ``skip_invalid`` is set,
in which case it is skipped and counted (never a silent drop). Rows outside the date window are
counted separately and logged.
"""

from __future__ import annotations

import base64
import json
import logging
import pickletools
import random
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

log = logging.getLogger(__name__)

DEFAULT_SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."

LCB_REPORT_WINDOW: tuple[str, str] = ("2024-08-01", "2025-02-01")
"""The report's LiveCodeBench window: problems with ``contest_date`` in [start, end], both ends
inclusive at midnight, as LiveCodeBench's ``--start_date/--end_date`` do."""

LCB_DATA_SOURCE = "livecodebench"

MAX_LCB_TESTS_BYTES = 1 << 30
"""Largest decompressed size of one row's private tests (a zlib bomb is refused)."""


class DataError(ValueError):
    """A data file or row that cannot be used; the message names the file and row."""


@dataclass
class Problem:
    id: str
    messages: list[dict[str, str]]
    """Chat messages; the last user message carries the instruction suffix."""
    domain: str
    ground_truth: Any
    data_source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    """Format-specific metadata kept for filters and reports: verl ``extra_info`` (with
    ``model_difficulty``), LiveCodeBench ``platform``/``difficulty``/``contest_date``."""
    where: str = ""
    """``"FILE: row N"`` / ``"FILE: line N"``: where the problem came from."""

    def verifier_item(self, item_id: str, response: str) -> dict[str, Any]:
        """The verifier item (DESIGN.md 3.1) for one response to this problem."""
        return {"id": item_id, "domain": self.domain, "response": response,
                "ground_truth": self.ground_truth, "data_source": self.data_source}


@dataclass
class Row:
    """One row of a data file as read, and what became of it."""

    where: str
    index: int
    """0-based position of the row in its file (blank JSONL lines not counted)."""
    raw: Any
    """The decoded row (a dict for usable rows), or a DataError for a line that is not JSON."""
    problem: Problem | None = None
    error: str | None = None
    """Why the row is unusable (None when it is)."""
    outside_window: bool = False
    """A LiveCodeBench row outside the contest-date window (not an error)."""


@dataclass
class LoadResult:
    problems: list[Problem]
    skipped: int
    """Malformed rows skipped because ``skip_invalid`` was set."""
    outside_window: int = 0
    """LiveCodeBench rows left out by the contest-date window."""
    rows: list[Row] = field(default_factory=list)
    """Every row read, in file order, when loaded with ``keep_rows`` (else empty)."""


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------

def _with_suffix(messages: list[dict[str, str]], suffix: str) -> list[dict[str, str]]:
    if not suffix:
        return messages
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user":
            if not m["content"].rstrip().endswith(suffix.strip()):
                m["content"] = m["content"] + suffix
            break
    return out


LCB_FORMAT_WITH_STARTER = ("You will use the following starter code to write the solution to "
                           "the problem and enclose your code within delimiters.")
LCB_FORMAT_WITHOUT_STARTER = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not "
    "directly test on the sample inputs). Enclose your code within delimiters as follows. "
    "Ensure that when the python program runs, it reads the inputs, runs the algorithm and "
    "writes output to STDOUT.")


def lcb_prompt(question_content: str, starter_code: str = "") -> str:
    """The user message LiveCodeBench builds for a code-generation problem.

    It follows LiveCodeBench's generic chat template (``lcb_runner/prompts/code_generation.py``,
    ``get_generic_question_template_answer``): the question under ``### Question:``, then the
    format instruction (the starter code in a python fence when there is one, otherwise "read
    from stdin, write to stdout" with a ``# YOUR CODE HERE`` fence), then ``### Answer: (use the
    provided format with backticks)``. LiveCodeBench's separate system message is not used:
    DeepSeek-R1-Distill models (the report's base models) are prompted without one.
    """
    prompt = f"### Question:\n{question_content}\n\n"
    if starter_code and starter_code.strip():
        prompt += f"### Format: {LCB_FORMAT_WITH_STARTER}\n```python\n{starter_code}\n```\n\n"
    else:
        prompt += f"### Format: {LCB_FORMAT_WITHOUT_STARTER}\n```python\n# YOUR CODE HERE\n```\n\n"
    prompt += "### Answer: (use the provided format with backticks)\n\n"
    return prompt


# ---------------------------------------------------------------------------------------------
# Ground truths
# ---------------------------------------------------------------------------------------------

def _check_math_truth(gt: Any, where: str) -> Any:
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


def _check_code_truth(gt: Any, where: str) -> dict[str, Any]:
    """Parse a code ground truth (an object or a JSON string of one), drop empty fields (as
    Skywork's released preprocessing does) and validate it with the verifier's parser."""
    if isinstance(gt, str):
        try:
            gt = json.loads(gt)
        except ValueError as e:
            raise DataError(f"{where}: code ground truth is not valid JSON: {e}") from None
    if not isinstance(gt, dict):
        raise DataError(f"{where}: code ground truth must be an object of test cases, got "
                        f"{type(gt).__name__}")
    cleaned = {k: v for k, v in gt.items() if v not in (None, "", [], {})}
    from verifier.code_score import BadGroundTruth, parse_ground_truth

    try:
        parse_ground_truth(cleaned)
    except BadGroundTruth as e:
        raise DataError(f"{where}: bad code ground truth: {e}") from None
    return cleaned


# ---------------------------------------------------------------------------------------------
# LiveCodeBench
# ---------------------------------------------------------------------------------------------

_PICKLE_STR_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
_PICKLE_FRAMING_OPS = {"PROTO", "FRAME", "MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT", "STOP"}


def _unpickle_str(data: bytes) -> str:
    """The string inside a pickle that holds exactly one ``str`` and nothing else.

    LiveCodeBench stores compressed private tests as ``pickle.dumps(json_text)``. Unpickling
    untrusted bytes can run arbitrary code, so nothing is unpickled here: the opcodes are only
    *parsed* (``pickletools.genops`` executes nothing) and anything but protocol/framing/memo
    opcodes around a single string opcode is refused.
    """
    text: str | None = None
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name in _PICKLE_STR_OPS and text is None:
                text = arg
            elif op.name not in _PICKLE_FRAMING_OPS:
                raise ValueError(f"pickle opcode {op.name} is not allowed (only a pickled str)")
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - genops raises assorted errors on corrupt input
        raise ValueError(f"not a valid pickle: {e}") from None
    if text is None:
        raise ValueError("the pickle holds no string")
    return text


def decode_lcb_tests(value: Any) -> list[dict[str, Any]]:
    """LiveCodeBench test cases: a JSON list (or JSON text of one), or the release files'
    compressed form ``base64(zlib(pickle(json_text)))``, decoded without unpickling (see
    :func:`_unpickle_str`). Raises ValueError naming what is wrong."""
    if isinstance(value, list):
        tests = value
    elif isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            tests = json.loads(s)
        else:
            try:
                raw = base64.b64decode(s, validate=True)
            except ValueError as e:
                raise ValueError(f"neither JSON nor base64: {e}") from None
            d = zlib.decompressobj()
            try:
                data = d.decompress(raw, MAX_LCB_TESTS_BYTES)
            except zlib.error as e:
                raise ValueError(f"base64 but not zlib data: {e}") from None
            if d.unconsumed_tail:
                raise ValueError(f"decompressed tests exceed {MAX_LCB_TESTS_BYTES} bytes")
            tests = json.loads(_unpickle_str(data))
    else:
        raise ValueError(f"expected a JSON string, got {type(value).__name__}")
    if not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        raise ValueError("test cases must be a list of objects")
    for i, t in enumerate(tests):
        if not isinstance(t.get("input"), str) or not isinstance(t.get("output"), str):
            raise ValueError(f"test {i} needs string 'input' and 'output'")
        if t.get("testtype", "stdin") not in ("stdin", "functional"):
            raise ValueError(f"test {i} has unknown testtype {t.get('testtype')!r}")
    return tests


def encode_lcb_tests(tests: list[dict[str, Any]]) -> str:
    """The release files' compressed form of ``tests`` (for fixtures): base64 of zlib of a
    pickled JSON string."""
    import pickle

    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def lcb_ground_truth(tests: Sequence[dict[str, Any]], func_name: str | None) -> dict[str, Any]:
    """Our verifier's code ground truth for LiveCodeBench tests: stdin tests become
    ``{"inputs", "outputs"}``; functional tests (LeetCode) ``{"inputs", "outputs", "fn_name"}``
    with each input newline-separated JSON arguments and each output one JSON value (the
    formats agree)."""
    kinds = {t.get("testtype", "stdin") for t in tests}
    if len(kinds) > 1:
        raise ValueError("mixes stdin and functional tests")
    gt: dict[str, Any] = {"inputs": [t["input"] for t in tests],
                          "outputs": [t["output"] for t in tests]}
    if kinds == {"functional"}:
        if not func_name:
            raise ValueError("functional tests but no metadata.func_name")
        gt["fn_name"] = func_name
    return gt


def _parse_date(value: Any) -> datetime:
    if isinstance(value, datetime):
        d = value
    elif isinstance(value, str):
        d = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    else:
        raise ValueError(f"expected an ISO date string, got {type(value).__name__}")
    if d.tzinfo is not None:
        d = d.astimezone(timezone.utc).replace(tzinfo=None)
    return d


def in_window(date: datetime, window: tuple[str | None, str | None] | None) -> bool:
    """``start <= date <= end`` (either end may be None: open)."""
    if window is None:
        return True
    start, end = window
    if start is not None and date < _parse_date(start):
        return False
    if end is not None and date > _parse_date(end):
        return False
    return True


def _lcb_problem(row: dict[str, Any], where: str, code_suffix: str) -> tuple[Problem, datetime]:
    qid = row.get("question_id")
    if qid is None or not isinstance(qid, (str, int)):
        raise DataError(f"{where}: missing 'question_id'")
    content = row.get("question_content")
    if not isinstance(content, str) or not content.strip():
        raise DataError(f"{where}: missing 'question_content'")
    try:
        date = _parse_date(row.get("contest_date"))
    except ValueError as e:
        raise DataError(f"{where}: bad 'contest_date': {e}") from None
    tests = []
    for key in ("public_test_cases", "private_test_cases"):
        value = row.get(key)
        if value in (None, "", []):
            continue
        try:
            tests += decode_lcb_tests(value)
        except ValueError as e:
            raise DataError(f"{where}: bad {key!r}: {e}") from None
    if not tests:
        raise DataError(f"{where}: no test cases")
    meta = row.get("metadata") or {}
    if isinstance(meta, str):
        try:
            meta = json.loads(meta) if meta.strip() else {}
        except ValueError as e:
            raise DataError(f"{where}: 'metadata' is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise DataError(f"{where}: 'metadata' must be an object")
    try:
        gt = lcb_ground_truth(tests, meta.get("func_name"))
    except ValueError as e:
        raise DataError(f"{where}: {e}") from None
    gt = _check_code_truth(gt, where)
    starter = row.get("starter_code") or ""
    messages = [{"role": "user", "content": lcb_prompt(content, starter)}]
    extra = {k: row.get(k) for k in ("platform", "difficulty", "contest_id", "question_title")
             if row.get(k) is not None}
    extra["contest_date"] = date.isoformat()
    return Problem(str(qid), _with_suffix(messages, code_suffix), "code", gt, LCB_DATA_SOURCE,
                   extra, where), date


# ---------------------------------------------------------------------------------------------
# Rows -> problems
# ---------------------------------------------------------------------------------------------

def row_format(row: dict[str, Any]) -> str:
    """"verl", "lcb" or "plain"."""
    if "reward_model" in row:
        return "verl"
    if "question_content" in row and ("public_test_cases" in row or "private_test_cases" in row):
        return "lcb"
    return "plain"


def _messages(prompt: Any, where: str) -> list[dict[str, str]]:
    if isinstance(prompt, str) and prompt.strip():
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, (list, tuple)) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role")
            for m in prompt):
        if not any(m["role"] == "user" for m in prompt):
            raise DataError(f"{where}: the chat prompt has no user message")
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise DataError(f"{where}: 'prompt' must be a string or a list of chat messages")


def _problem_from_row(row: dict[str, Any], where: str, suffix: str, code_suffix: str = "",
                      index: int = 0) -> Problem:
    """One verl or plain row (LiveCodeBench rows go through :func:`_lcb_problem`)."""
    extra: dict[str, Any] = {}
    if "reward_model" in row:  # verl / Skywork parquet schema
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
        extra = row.get("extra") or {}
        if not isinstance(extra, dict):
            raise DataError(f"{where}: 'extra' must be an object")
    if pid is None or isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise DataError(f"{where}: missing 'id'")
    messages = _messages(row.get("prompt"), where)
    if domain not in ("math", "code"):
        raise DataError(f"{where}: unknown domain {domain!r}")
    if ground_truth is None or ground_truth == "":
        raise DataError(f"{where}: missing ground truth")
    if domain == "math":
        ground_truth = _check_math_truth(ground_truth, where)
        messages = _with_suffix(messages, suffix)
    else:
        ground_truth = _check_code_truth(ground_truth, where)
        messages = _with_suffix(messages, code_suffix)
    data_source = row.get("data_source") or ""
    if not isinstance(data_source, str):
        raise DataError(f"{where}: 'data_source' must be a string")
    return Problem(str(pid), messages, domain, ground_truth, data_source, dict(extra), where)


def read_rows(path: str | Path) -> list[tuple[str, int, Any]]:
    """``(where, index, row)`` for every row of a parquet or JSONL file; a JSONL line that is
    not JSON comes back as a DataError in place of the row."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"data file {str(path)!r} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

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


def load_dataset(paths: Sequence[str | Path] | str | Path, *,
                 instruction_suffix: str = DEFAULT_SUFFIX, code_suffix: str = "",
                 skip_invalid: bool = False,
                 date_window: tuple[str | None, str | None] | None = LCB_REPORT_WINDOW,
                 allow_empty: bool = False, keep_rows: bool = False) -> LoadResult:
    """Every row of ``paths`` (parquet or JSONL, any of the three formats), in order.

    ``date_window`` applies to LiveCodeBench rows only (None keeps them all). ``keep_rows``
    also returns every raw row in ``LoadResult.rows`` (for tools that write the data back; off
    by default, as a large code set would be held twice). Raises DataError
    naming the file and row for a malformed row (unless ``skip_invalid``), for a duplicate
    problem id, and when no problem is left (unless ``allow_empty``).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    problems: list[Problem] = []
    rows: list[Row] = []
    skipped = outside = 0
    seen: dict[str, str] = {}
    for p in paths:
        for where, index, raw in read_rows(p):
            rec = Row(where, index, raw)
            if keep_rows:
                rows.append(rec)
            try:
                if isinstance(raw, Exception):
                    raise raw
                if not isinstance(raw, dict):
                    raise DataError(f"{where}: a row must be an object")
                if row_format(raw) == "lcb":
                    prob, date = _lcb_problem(raw, where, code_suffix)
                    if not in_window(date, date_window):
                        rec.outside_window = True
                        outside += 1
                        continue
                else:
                    prob = _problem_from_row(raw, where, instruction_suffix, code_suffix, index)
                if prob.id in seen:
                    raise DataError(f"{where}: duplicate id {prob.id!r} (first at {seen[prob.id]})")
            except DataError as e:
                if not skip_invalid:
                    raise
                rec.error = str(e)
                skipped += 1
                log.warning("skipping invalid row: %s", e)
                continue
            seen[prob.id] = where
            rec.problem = prob
            problems.append(prob)
    if skipped:
        log.warning("skipped %d invalid rows", skipped, extra={"skipped": skipped})
    if outside:
        log.info("left out %d LiveCodeBench problems outside the contest-date window %s",
                 outside, date_window, extra={"outside_window": outside})
    if not problems and not allow_empty:
        why = f" ({outside} outside the date window {date_window})" if outside else ""
        raise DataError(f"no usable problems in {[str(p) for p in paths]}{why}")
    return LoadResult(problems, skipped, outside, rows)


def load_problems(paths: Sequence[str | Path], *, instruction_suffix: str = DEFAULT_SUFFIX,
                  skip_invalid: bool = False, code_suffix: str = "",
                  date_window: tuple[str | None, str | None] | None = LCB_REPORT_WINDOW,
                  ) -> tuple[list[Problem], int]:
    """All problems of ``paths`` in order, and the number of rows skipped (0 unless
    ``skip_invalid``). Raises DataError naming the file and row otherwise. See
    :func:`load_dataset` for the formats and the other counts."""
    res = load_dataset(paths, instruction_suffix=instruction_suffix, code_suffix=code_suffix,
                       skip_invalid=skip_invalid, date_window=date_window)
    return res.problems, res.skipped


# ---------------------------------------------------------------------------------------------
# The released difficulty field
# ---------------------------------------------------------------------------------------------

def model_difficulty(problem_or_row: Problem | dict[str, Any], model: str) -> int | None:
    """``extra_info.model_difficulty[model]`` of a problem or raw verl row: in
    Skywork-OR1-RL-Data, how many of 16 samples of that model were correct (None if absent)."""
    if isinstance(problem_or_row, Problem):
        extra = problem_or_row.extra
    else:
        extra = problem_or_row.get("extra_info") or {}
    md = extra.get("model_difficulty") if isinstance(extra, dict) else None
    if isinstance(md, str):  # some exports keep it as JSON text
        try:
            md = json.loads(md)
        except ValueError:
            return None
    if not isinstance(md, dict) or md.get(model) is None:
        return None
    return int(md[model])


def select_by_difficulty(problems: Iterable[Problem], model: str, lo: int = 1,
                         hi: int = 15) -> tuple[list[Problem], int]:
    """Problems whose released ``model_difficulty[model]`` lies in [lo, hi], and how many had
    no such field (left out). ``lo=1, hi=15`` with model "DeepSeek-R1-Distill-Qwen-7B" is
    Skywork's released 7B training filter (``or1_scripts/data_preprocess``)."""
    kept, missing = [], 0
    for p in problems:
        d = model_difficulty(p, model)
        if d is None:
            missing += 1
        elif lo <= d <= hi:
            kept.append(p)
    return kept, missing


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------

class PromptSampler:
    """Epochs over the problems in a seeded shuffled order; resumable exactly.

    ``next(k)`` returns the next k problems, crossing into a freshly shuffled epoch when one
    runs out. The state is (epoch, position): the order of epoch e is a function of (seed, e).
    """

    def __init__(self, n: int, seed: int, shuffle: bool = True):
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self.pos = 0, 0
        self._order = self._order_of(0)

    def _order_of(self, epoch: int) -> list[int]:
        order = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._order_of(self.epoch)
            take = min(k - len(out), self.n - self.pos)
            out.extend(self._order[self.pos : self.pos + take])
            self.pos += take
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos, "n": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["n"] != self.n or state["seed"] != self.seed:
            raise ValueError(f"sampler state is for {state['n']} problems with seed "
                             f"{state['seed']}, this run has {self.n} with seed {self.seed}")
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._order_of(self.epoch)
