"""Generations files for ``verifier eval --problems ... --generations FILE``, in two formats:

- **LiveCodeBench's custom-evaluator JSON** (LiveCodeBench/LiveCodeBench at 28fef95,
  ``lcb_runner/runner/custom_evaluator.py``): one JSON list of ``{"question_id": ...,
  "code_list": [code, ...]}``, the code already extracted from the model's output;
- **JSONL of full model outputs**: one ``{"id": ..., "responses": [text, ...]}`` per line; the
  verifier extracts the answer or program from each response under the problem's profile.

Each entry names its problem by id (a LiveCodeBench problem's id is its ``question_id``). The
format is told by the file's first character: ``[`` is the custom-evaluator JSON, ``{`` JSONL.
A wrong shape, a duplicate id or a ``code_list`` that is not a list of strings is a
VerifierError("invalid_argument") naming the file and the entry (0-based, as in the list) or
the line (1-based).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from verifier.items import VerifierError

GenerationsFormat = Literal["lcb-custom", "jsonl"]

FENCE = "```"
_UNWRAPPABLE = (FENCE, "<think>", "</think>")


@dataclass
class Generation:
    """The responses to one problem, in the order given."""

    id: str
    responses: list[str]
    where: str
    """``"FILE: entry N"`` or ``"FILE: line N"``."""


def code_response(code: str) -> str:
    """A response the verifier extracts ``code`` from unchanged under every profile: the code
    in one python fence, with no think block. The default rule takes the last python block
    after the last ``</think>`` (here: the whole text), LiveCodeBench's the lines between the
    last two lines holding a fence, Skywork's the last ```` ```python\\n```` block: all three
    give back the code (the first two and the third with a trailing newline, which no judge
    reads)."""
    return f"```python\n{code}\n```"


def _bad(path: Path, where: str, why: str) -> VerifierError:
    return VerifierError(f"{path}: {where}: {why}", "invalid_argument")


def _id(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    return str(value)


def _read_custom(path: Path, text: str) -> list[Generation]:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise _bad(path, "whole file", f"not valid JSON: {e}") from None
    if not isinstance(data, list):
        raise _bad(path, "whole file", "LiveCodeBench's custom-evaluator format is a JSON list of "
                   '{"question_id", "code_list"} objects')
    out: list[Generation] = []
    first: dict[str, int] = {}
    for i, entry in enumerate(data):
        where = f"entry {i}"
        if not isinstance(entry, dict):
            raise _bad(path, where, f'expected an object {{"question_id", "code_list"}}, got '
                       f"{type(entry).__name__}")
        qid = _id(entry.get("question_id"))
        if qid is None:
            raise _bad(path, where, "'question_id' must be a string")
        codes = entry.get("code_list")
        if not isinstance(codes, list) or not codes:
            raise _bad(path, where, f"'code_list' of {qid!r} must be a non-empty list of strings")
        for j, code in enumerate(codes):
            if not isinstance(code, str):
                raise _bad(path, where, f"'code_list' of {qid!r}: item {j} is "
                           f"{type(code).__name__}, not a string")
            bad = next((m for m in _UNWRAPPABLE if m in code), None)
            if bad is not None:
                raise _bad(path, where, f"'code_list' of {qid!r}: item {j} contains {bad!r}, so "
                           "it cannot be passed to the verifier as extracted code unchanged")
        if qid in first:
            raise _bad(path, where, f"duplicate question_id {qid!r} (first at entry {first[qid]})")
        first[qid] = i
        out.append(Generation(qid, [code_response(c) for c in codes], f"{path}: {where}"))
    return out


def _read_jsonl(path: Path, text: str) -> list[Generation]:
    out: list[Generation] = []
    first: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"line {lineno}"
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise _bad(path, where, f"not valid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise _bad(path, where, f'expected an object {{"id", "responses"}}, got '
                       f"{type(obj).__name__}")
        pid = _id(obj.get("id"))
        if pid is None:
            raise _bad(path, where, "'id' must be a string")
        responses = obj.get("responses")
        if not isinstance(responses, list) or not responses:
            raise _bad(path, where, f"'responses' of {pid!r} must be a non-empty list of strings")
        for j, r in enumerate(responses):
            if not isinstance(r, str):
                raise _bad(path, where, f"'responses' of {pid!r}: response {j} is "
                           f"{type(r).__name__}, not a string")
        if pid in first:
            raise _bad(path, where, f"duplicate id {pid!r} (first on line {first[pid]})")
        first[pid] = lineno
        out.append(Generation(pid, list(responses), f"{path}: {where}"))
    return out


def read_generations_file(path: Path) -> tuple[GenerationsFormat, list[Generation]]:
    """The format of ``path`` and its entries, in file order (see the module docstring)."""
    if not path.exists():
        raise VerifierError(f"generations file {str(path)!r} does not exist", "invalid_argument")
    text = path.read_text(encoding="utf-8")
    head = text.lstrip()[:1]
    if head == "[":
        return "lcb-custom", _read_custom(path, text)
    if head == "{":
        return "jsonl", _read_jsonl(path, text)
    raise VerifierError(f"{path}: neither LiveCodeBench's custom-evaluator JSON (a list) nor "
                        'JSONL of {"id", "responses"} objects', "invalid_argument")
