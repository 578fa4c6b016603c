"""Training and evaluation problems: prompts on top of the verifier's problem formats, and a
resumable sampler.

The row formats (plain JSONL, verl / Skywork parquet, LiveCodeBench release rows), their
ground-truth parsing and the LiveCodeBench contest-date window belong to the verifier, which
judges these problems (verifier/data/problems.py, verifier/data/lcb.py; ``verifier eval --problems`` reads
the same files). This module adds what training needs on top: the chat prompt of each problem.

- plain and verl rows: their ``prompt`` (a string or chat messages); the math instruction suffix
  (the report's "Let's think step by step and output the final answer within \\boxed{}.") is
  appended to the last user message of math problems that do not already end with it; code
  prompts get ``code_suffix`` (empty by default: LiveCodeBench's and Skywork's code prompts
  carry their own format instructions);
- LiveCodeBench rows: LiveCodeBench's prompt for the model style (``lcb_style``): its generic
  template as the user message, or its DeepSeekR1 template, a whole prompt text with DeepSeek's
  special-token markers (``Problem.raw_prompt``), which LiveCodeBench uses for R1-distill models.
- plain JSONL rows keep their ``extra`` object in ``Problem.extra`` (the toy world stores each
  problem's level and reference response there).

A malformed row is a :class:`DataError` naming the file and row, unless ``skip_invalid`` is set,
in which case it is skipped and counted (never a silent drop). Rows outside the date window are
counted separately and logged.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from verifier.data.lcb import (  # noqa: F401
    LCB_DATA_SOURCE,
    LCB_REPORT_WINDOW,
    LCB_STYLES,
    MAX_LCB_TESTS_BYTES,
    LcbStyle,
    decode_lcb_tests,
    default_lcb_style,
    encode_lcb_tests,
    in_window,
    lcb_ground_truth,
    lcb_prompt,
    lcb_r1_prompt,
)
from verifier.data.problems import (  # noqa: F401
    DataError,
    ProblemRow,
    Row,
    load_rows,
    read_rows,
    row_format,
)

DEFAULT_SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."


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
    raw_prompt: str | None = None
    """A whole prompt text used as it is instead of ``messages`` through the chat template
    (LiveCodeBench's DeepSeekR1 style, which writes the special-token markers itself)."""
    profile: str = ""
    """The verifier's judging profile for this problem's responses: "lcb" for LiveCodeBench
    rows (its benchmark numbers are judged by its judge's rules), else "" (the verifier's
    default); ``verifier.profile`` in a run's config overrides it for every problem."""

    def verifier_item(self, item_id: str, response: str) -> dict[str, Any]:
        """The verifier item (docs/contracts.md 1) for one response to this problem."""
        return {"id": item_id, "domain": self.domain, "response": response,
                "ground_truth": self.ground_truth, "data_source": self.data_source,
                "profile": self.profile}


@dataclass
class LoadResult:
    problems: list[Problem]
    skipped: int
    """Malformed rows skipped because ``skip_invalid`` was set."""
    outside_window: int = 0
    """LiveCodeBench rows left out by the contest-date window."""
    rows: list[Row[Problem]] = field(default_factory=list)
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


def problem_from_row(row: ProblemRow, instruction_suffix: str = DEFAULT_SUFFIX,
                     code_suffix: str = "", lcb_style: LcbStyle = "generic") -> Problem:
    """The trainer's Problem for a parsed row: its prompt built (see the module docstring).
    DataError naming the row for a missing or malformed prompt."""
    raw_prompt = None
    if row.lcb is not None:
        if lcb_style not in LCB_STYLES:
            raise ValueError(f"unknown LiveCodeBench style {lcb_style!r}; expected one of "
                             f"{', '.join(LCB_STYLES)}")
        q = row.lcb
        messages = [{"role": "user", "content": lcb_prompt(q.question_content, q.starter_code)}]
        if lcb_style == "deepseek-r1":
            raw_prompt = lcb_r1_prompt(q.question_content, q.starter_code)
    else:
        messages = _messages(row.prompt, row.where)
    messages = _with_suffix(messages, instruction_suffix if row.domain == "math" else code_suffix)
    if raw_prompt is not None and code_suffix:
        raise ValueError("a code suffix cannot be added to LiveCodeBench's DeepSeekR1 prompt "
                         "(it ends with the assistant marker)")
    return Problem(row.id, messages, row.domain, row.ground_truth, row.data_source,
                   dict(row.extra), row.where, raw_prompt,
                   profile="lcb" if row.lcb is not None else "")


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------

def load_dataset(paths: Sequence[str | Path] | str | Path, *,
                 instruction_suffix: str = DEFAULT_SUFFIX, code_suffix: str = "",
                 skip_invalid: bool = False,
                 date_window: tuple[str | None, str | None] | None = LCB_REPORT_WINDOW,
                 allow_empty: bool = False, keep_rows: bool = False,
                 lcb_style: LcbStyle = "generic") -> LoadResult:
    """Every row of ``paths`` (parquet or JSONL, any of the three formats), in order, as
    Problems with prompts (verifier.data.problems.load_rows reads and checks the rows).

    ``date_window`` applies to LiveCodeBench rows only (None keeps them all); ``lcb_style``
    picks their prompt. ``keep_rows`` also returns every raw row in ``LoadResult.rows``. Raises
    DataError naming the file and row for a malformed row (unless ``skip_invalid``), for a
    duplicate problem id, and when no problem is left (unless ``allow_empty``).
    """
    loaded = load_rows(paths, date_window=date_window, skip_invalid=skip_invalid,
                       allow_empty=allow_empty, keep_rows=keep_rows,
                       convert=lambda r: problem_from_row(r, instruction_suffix, code_suffix,
                                                          lcb_style))
    return LoadResult(loaded.problems, loaded.skipped, len(loaded.outside_window), loaded.rows)


def load_problems(paths: Sequence[str | Path], *, instruction_suffix: str = DEFAULT_SUFFIX,
                  skip_invalid: bool = False, code_suffix: str = "",
                  date_window: tuple[str | None, str | None] | None = LCB_REPORT_WINDOW,
                  lcb_style: LcbStyle = "generic") -> tuple[list[Problem], int]:
    """All problems of ``paths`` in order, and the number of rows skipped (0 unless
    ``skip_invalid``). Raises DataError naming the file and row otherwise. See
    :func:`load_dataset` for the formats and the other counts."""
    res = load_dataset(paths, instruction_suffix=instruction_suffix, code_suffix=code_suffix,
                       skip_invalid=skip_invalid, date_window=date_window, lcb_style=lcb_style)
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
