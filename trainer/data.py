"""Training and evaluation problems: loading, prompt building, and a resumable sampler.

Formats (issue 6 extends the list):
- plain JSONL, one problem per line: ``{"id", "prompt": str | [chat messages], "domain":
  "math"|"code", "ground_truth", "data_source"?}``;
- verl / Skywork parquet: ``data_source``, ``prompt`` (chat list), ``ability``,
  ``reward_model.ground_truth``, ``extra_info``.
A malformed row is an error naming the file and row, unless ``skip_invalid`` is set, in which
case it is skipped and counted (never a silent drop).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger(__name__)

DEFAULT_SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."


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

    def verifier_item(self, item_id: str, response: str) -> dict[str, Any]:
        """The verifier item (DESIGN.md 3.1) for one response to this problem."""
        return {"id": item_id, "domain": self.domain, "response": response,
                "ground_truth": self.ground_truth, "data_source": self.data_source}


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


def _problem_from_row(row: dict[str, Any], where: str, suffix: str) -> Problem:
    if "reward_model" in row:  # verl / Skywork parquet schema
        rm = row.get("reward_model") or {}
        ground_truth = rm.get("ground_truth") if isinstance(rm, dict) else None
        ability = row.get("ability") or "math"
        domain = "code" if str(ability).lower() in ("code", "coding") else "math"
        extra = row.get("extra_info") or {}
        pid = row.get("id") or f"{row.get('data_source', 'row')}-{extra.get('index', where)}"
    else:
        ground_truth = row.get("ground_truth")
        domain = row.get("domain", "math")
        pid = row.get("id")
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, (list, tuple)) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role")
            for m in prompt):
        messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    else:
        raise DataError(f"{where}: 'prompt' must be a string or a list of chat messages")
    if pid is None or not isinstance(pid, (str, int)):
        raise DataError(f"{where}: missing 'id'")
    if domain not in ("math", "code"):
        raise DataError(f"{where}: unknown domain {domain!r}")
    if ground_truth is None or ground_truth == "":
        raise DataError(f"{where}: missing ground truth")
    data_source = row.get("data_source") or ""
    return Problem(str(pid), _with_suffix(messages, suffix), domain, ground_truth, str(data_source))


def _rows(path: Path) -> list[tuple[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(f"{path}: row {i}", r) for i, r in enumerate(pq.read_table(path).to_pylist())]
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}: line {lineno}"
            try:
                out.append((where, json.loads(line)))
            except ValueError as e:
                out.append((where, DataError(f"{where}: not valid JSON: {e}")))
    return out


def load_problems(paths: Sequence[str | Path], *, instruction_suffix: str = DEFAULT_SUFFIX,
                  skip_invalid: bool = False) -> tuple[list[Problem], int]:
    """All problems of ``paths`` in order, and the number of rows skipped (0 unless
    ``skip_invalid``). Raises DataError naming the file and row otherwise."""
    problems: list[Problem] = []
    skipped = 0
    seen: set[str] = set()
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise DataError(f"data file {str(p)!r} does not exist")
        for where, row in _rows(path):
            try:
                if isinstance(row, Exception):
                    raise row
                if not isinstance(row, dict):
                    raise DataError(f"{where}: a row must be an object")
                prob = _problem_from_row(row, where, instruction_suffix)
                if prob.id in seen:
                    raise DataError(f"{where}: duplicate id {prob.id!r}")
            except DataError:
                if not skip_invalid:
                    raise
                skipped += 1
                continue
            seen.add(prob.id)
            problems.append(prob)
    if skipped:
        log.warning("skipped invalid rows", extra={"skipped": skipped})
    if not problems:
        raise DataError(f"no usable problems in {[str(p) for p in paths]}")
    return problems, skipped


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
