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
the line (1-based), or with ``skip_invalid`` that entry is skipped and recorded. A JSONL line
that is not JSON (not UTF-8, or nested too deeply for the decoder: a RecursionError) is such an
entry too; a custom-evaluator file that cannot be decoded is one error for the whole file (its
entries cannot be told apart).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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


def _loads(text: str) -> Any:
    """``json.loads``; JSON nested too deeply is its ValueError too (json raises RecursionError,
    which no caller's ``except ValueError`` would catch)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to decode") from None


def _custom_entry(entry: Any) -> tuple[str, list[str]] | str:
    """``(question_id, responses)`` of one custom-evaluator entry, or why it is unusable."""
    if not isinstance(entry, dict):
        return (f'expected an object {{"question_id", "code_list"}}, got '
                f"{type(entry).__name__}")
    qid = _id(entry.get("question_id"))
    if qid is None:
        return "'question_id' must be a string"
    codes = entry.get("code_list")
    why = _not_strings(codes, "code_list", qid, "item")
    if why:
        return why
    for j, code in enumerate(codes):
        bad = next((m for m in _UNWRAPPABLE if m in code), None)
        if bad is not None:
            return (f"'code_list' of {qid!r}: item {j} contains {bad!r}, so it cannot be "
                    "passed to the verifier as extracted code unchanged")
    return qid, [code_response(c) for c in codes]


def _jsonl_entry(line: str) -> tuple[str, list[str]] | str:
    """``(id, responses)`` of one JSONL line, or why it is unusable."""
    try:
        obj = _loads(line)
    except ValueError as e:
        return f"not valid JSON: {e}"
    if not isinstance(obj, dict):
        return f'expected an object {{"id", "responses"}}, got {type(obj).__name__}'
    pid = _id(obj.get("id"))
    if pid is None:
        return "'id' must be a string"
    responses = obj.get("responses")
    why = _not_strings(responses, "responses", pid, "response")
    return why or (pid, list(responses))


def _not_strings(values: Any, key: str, owner: str, noun: str) -> str:
    """Why ``values`` (the ``key`` field of ``owner``) is not a non-empty list of strings, or
    "" when it is."""
    if not isinstance(values, list) or not values:
        return f"'{key}' of {owner!r} must be a non-empty list of strings"
    for j, v in enumerate(values):
        if not isinstance(v, str):
            return f"'{key}' of {owner!r}: {noun} {j} is {type(v).__name__}, not a string"
    return ""


@dataclass
class _Entries:
    """Entries in file order; a bad one raises VerifierError naming the file and entry or,
    with ``skip_invalid``, is recorded in ``skipped`` as ``{"where", "reason"}``."""

    path: Path
    skip_invalid: bool
    out: list[Generation] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def bad(self, where: str, why: str) -> None:
        if not self.skip_invalid:
            raise _bad(self.path, where, why)
        self.skipped.append({"where": f"{self.path}: {where}", "reason": why})

    def add(self, gid: str, responses: list[str], where: str) -> None:
        self.out.append(Generation(gid, responses, f"{self.path}: {where}"))


def _read_custom(path: Path, text: str, skip_invalid: bool) -> _Entries:
    try:
        data = _loads(text)
    except ValueError as e:
        raise _bad(path, "whole file", f"not valid JSON: {e}") from None
    if not isinstance(data, list):
        raise _bad(path, "whole file", "LiveCodeBench's custom-evaluator format is a JSON list of "
                   '{"question_id", "code_list"} objects')
    entries = _Entries(path, skip_invalid)
    first: dict[str, int] = {}
    for i, entry in enumerate(data):
        where = f"entry {i}"
        parsed = _custom_entry(entry)
        if isinstance(parsed, str):
            entries.bad(where, parsed)
            continue
        qid, responses = parsed
        if qid in first:
            entries.bad(where, f"duplicate question_id {qid!r} (first at entry {first[qid]})")
            continue
        first[qid] = i
        entries.add(qid, responses, where)
    return entries


def _read_jsonl(path: Path, data: bytes, skip_invalid: bool) -> _Entries:
    entries = _Entries(path, skip_invalid)
    first: dict[str, int] = {}
    # Bytes, decoded line by line: a line that is not UTF-8 is that line's problem.
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        where = f"line {lineno}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            entries.bad(where, f"not UTF-8 text: {e}")
            continue
        if not line.strip():
            continue
        parsed = _jsonl_entry(line)
        if isinstance(parsed, str):
            entries.bad(where, parsed)
            continue
        pid, responses = parsed
        if pid in first:
            entries.bad(where, f"duplicate id {pid!r} (first on line {first[pid]})")
            continue
        first[pid] = lineno
        entries.add(pid, responses, where)
    return entries


def read_generations_file(path: Path, skip_invalid: bool = False
                          ) -> tuple[GenerationsFormat, list[Generation], list[dict[str, str]]]:
    """The format of ``path``, its entries in file order, and the entries skipped with
    ``skip_invalid`` (``{"where", "reason"}`` each; see the module docstring)."""
    if not path.exists():
        raise VerifierError(f"generations file {str(path)!r} does not exist", "invalid_argument")
    data = path.read_bytes()
    head = data.lstrip()[:1]
    if head == b"[":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _bad(path, "whole file", f"not UTF-8 text: {e}") from None
        entries = _read_custom(path, text, skip_invalid)
        return "lcb-custom", entries.out, entries.skipped
    if head == b"{":
        entries = _read_jsonl(path, data, skip_invalid)
        return "jsonl", entries.out, entries.skipped
    raise VerifierError(f"{path}: neither LiveCodeBench's custom-evaluator JSON (a list) nor "
                        'JSONL of {"id", "responses"} objects', "invalid_argument")
