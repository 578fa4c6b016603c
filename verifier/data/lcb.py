"""LiveCodeBench's problem format: test cases (compressed as the release files store them), the
verifier's ground truth built from them, the contest-date window, and LiveCodeBench's prompts.

The verifier owns this format because it judges these problems (``verifier eval --problems``);
the trainer imports it to build its prompts and training sets. Nothing here imports torch or a
tokenizer.

References (LiveCodeBench/LiveCodeBench at 28fef95): ``lcb_runner/benchmarks/code_generation.py``
(the row shape: ``question_content``, ``platform``, ``question_id``, ``contest_date``,
``starter_code``, ``difficulty``, ``public_test_cases``/``private_test_cases`` as JSON text or
``base64(zlib(pickle(json_text)))``, ``metadata`` JSON text with ``func_name``; the date window
``start <= contest_date <= end`` at midnight), ``lcb_runner/prompts/code_generation.py`` (the
generic and DeepSeekR1 templates) and ``lcb_runner/lm_styles.py`` (DeepSeek-R1-Distill models
use the DeepSeekR1 style).
"""

from __future__ import annotations

import base64
import json
import pickletools
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Sequence

LCB_REPORT_WINDOW: tuple[str, str] = ("2024-08-01", "2025-02-01")
"""The Skywork-OR1 report's LiveCodeBench window: problems with ``contest_date`` in
[start, end], both ends inclusive at midnight, as LiveCodeBench's ``--start_date/--end_date``."""

LCB_DATA_SOURCE = "livecodebench"
"""``data_source`` of problems read from LiveCodeBench rows."""

MAX_LCB_TESTS_BYTES = 128 << 20
"""Largest decompressed size of one compressed test field (128 MiB); a field over it is refused
while it is being inflated (:func:`_inflate`), so a zlib bomb costs at most this much memory.

Why 128 MiB: the largest rows of LiveCodeBench's releases hold tens of MB of private tests
decompressed, and the verifier refuses any ground truth over
``verifier.items.MAX_GROUND_TRUTH_CHARS`` (64 million characters) anyway; the ground truth
holds the same strings as the tests' JSON text, less the per-test keys. Twice that cap leaves
room for every real row the verifier could judge, while a row that does inflate to the bound
costs a few times 128 MiB to parse (the bytes, the pickled string, the decoded lists), not
gigabytes; the old bound, 1 GiB, let a 1.4 MB row cost 4.25 GB."""

_INFLATE_CHUNK = 1 << 20
"""Output of one ``decompress`` step while inflating (see :func:`_inflate`)."""

LcbStyle = Literal["generic", "deepseek-r1"]
LCB_STYLES: tuple[str, ...] = ("generic", "deepseek-r1")


# ---------------------------------------------------------------------------------------------
# Test cases
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


class OversizedTests(ValueError):
    """Compressed test cases that inflate past :data:`MAX_LCB_TESTS_BYTES`: the row cannot be
    judged (nothing in it need be malformed), which callers may report apart from bad rows."""


def _json(text: str) -> Any:
    """``json.loads``, with nesting too deep for the decoder reported as the ValueError every
    caller handles: json raises RecursionError there (it is not a ValueError), and one row of
    ``[[[[...`` would otherwise end a whole run."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to decode") from None


def _inflate(raw: bytes, limit: int) -> bytes:
    """``zlib.decompress(raw)``, refused with :class:`OversizedTests` as soon as the output passes
    ``limit`` bytes: it is inflated in steps of ``_INFLATE_CHUNK`` (``max_length``), so a bomb
    never holds more than ``limit`` plus one step, whatever it would inflate to. Truncated
    data is a ValueError (it never holds a whole pickle)."""
    d = zlib.decompressobj()
    parts: list[bytes] = []
    size = 0
    pending = raw
    while True:
        try:
            chunk = d.decompress(pending, _INFLATE_CHUNK)
        except zlib.error as e:
            raise ValueError(f"base64 but not zlib data: {e}") from None
        size += len(chunk)
        if size > limit:
            raise OversizedTests(f"the compressed tests inflate past {limit} bytes "
                                "(verifier.data.lcb.MAX_LCB_TESTS_BYTES); not decoded further")
        parts.append(chunk)
        pending = d.unconsumed_tail
        if d.eof:
            break
        if not pending and not chunk:  # all input used, nothing more comes out: cut short
            raise ValueError("truncated zlib data")
    data = b"".join(parts)
    del parts
    return data


def decode_lcb_tests(value: Any) -> list[dict[str, Any]]:
    """LiveCodeBench test cases: a JSON list (or JSON text of one), or the release files'
    compressed form ``base64(zlib(pickle(json_text)))``, decoded without unpickling (see
    :func:`_unpickle_str`) and inflated only up to :data:`MAX_LCB_TESTS_BYTES` (see
    :func:`_inflate`). Raises ValueError naming what is wrong; :class:`OversizedTests` (a
    ValueError) when the compressed form inflates past the bound."""
    if isinstance(value, list):
        tests = value
    elif isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            tests = _json(s)
        else:
            try:
                raw = base64.b64decode(s, validate=True)
            except ValueError as e:
                raise ValueError(f"neither JSON nor base64: {e}") from None
            # Read the bound here, not as a default argument: tests lower it to keep bombs small.
            tests = _json(_unpickle_str(_inflate(raw, MAX_LCB_TESTS_BYTES)))
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
    """The release files' compressed form of ``tests`` (for fixtures and tests): base64 of zlib
    of a pickled JSON string."""
    import pickle  # lazy: only ever used to *write* the release form; never to read it

    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def lcb_ground_truth(tests: Sequence[dict[str, Any]], func_name: str | None) -> dict[str, Any]:
    """The verifier's code ground truth for LiveCodeBench tests: stdin tests become
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


# ---------------------------------------------------------------------------------------------
# Dates
# ---------------------------------------------------------------------------------------------

def parse_date(value: Any) -> datetime:
    """An ISO date or datetime (a ``datetime`` as parquet gives it), as naive UTC."""
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
    """``start <= date <= end`` (either end may be None: open; no window: always)."""
    if window is None:
        return True
    start, end = window
    if start is not None and date < parse_date(start):
        return False
    if end is not None and date > parse_date(end):
        return False
    return True


# ---------------------------------------------------------------------------------------------
# One row
# ---------------------------------------------------------------------------------------------

@dataclass
class LcbQuestion:
    """What a LiveCodeBench row says beyond its tests: the prompt's parts and the report's
    breakdowns (pass@1 by difficulty and by platform)."""

    question_content: str
    starter_code: str
    contest_date: datetime
    platform: str = ""
    difficulty: str = ""


def is_lcb_row(row: dict[str, Any]) -> bool:
    """A LiveCodeBench release row: ``question_content`` and some test cases."""
    return "question_content" in row and ("public_test_cases" in row
                                          or "private_test_cases" in row)


def parse_lcb_head(row: dict[str, Any]) -> tuple[str, LcbQuestion]:
    """``(question_id, question)`` of a release row, its test cases left alone: what the
    contest-date window needs, so a row left out by date is never decompressed (a zlib bomb
    outside the window costs nothing). Raises ValueError naming the field that is wrong."""
    qid = row.get("question_id")
    if qid is None or isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise ValueError("missing 'question_id'")
    content = row.get("question_content")
    if not isinstance(content, str) or not content.strip():
        raise ValueError("missing 'question_content'")
    try:
        date = parse_date(row.get("contest_date"))
    except ValueError as e:
        raise ValueError(f"bad 'contest_date': {e}") from None
    starter = row.get("starter_code") or ""
    if not isinstance(starter, str):
        raise ValueError("'starter_code' must be a string")
    question = LcbQuestion(content, starter, date, str(row.get("platform") or ""),
                           str(row.get("difficulty") or ""))
    return str(qid), question


def parse_lcb_tests(row: dict[str, Any]) -> dict[str, Any]:
    """The verifier's ground truth of a release row: public + private tests (compressed or
    not) with ``metadata.func_name``. Raises ValueError naming the field that is wrong, and
    :class:`OversizedTests` (a ValueError) for tests that inflate past the bound."""
    tests: list[dict[str, Any]] = []
    for key in ("public_test_cases", "private_test_cases"):
        value = row.get(key)
        if value in (None, "", []):
            continue
        try:
            tests += decode_lcb_tests(value)
        except OversizedTests as e:
            raise OversizedTests(f"{key!r}: {e}") from None
        except ValueError as e:
            raise ValueError(f"bad {key!r}: {e}") from None
    if not tests:
        raise ValueError("no test cases")
    meta = row.get("metadata") or {}
    if isinstance(meta, str):
        try:
            meta = _json(meta) if meta.strip() else {}
        except ValueError as e:
            raise ValueError(f"'metadata' is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise ValueError("'metadata' must be an object")
    return lcb_ground_truth(tests, meta.get("func_name"))


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------

LCB_FORMAT_WITH_STARTER = ("You will use the following starter code to write the solution to "
                           "the problem and enclose your code within delimiters.")
LCB_FORMAT_WITHOUT_STARTER = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not "
    "directly test on the sample inputs). Enclose your code within delimiters as follows. "
    "Ensure that when the python program runs, it reads the inputs, runs the algorithm and "
    "writes output to STDOUT.")
LCB_R1_INSTRUCTION = ("You will be given a question (problem specification) and will generate a "
                      "correct Python program that matches the specification and passes all "
                      "tests.\n\n")
LCB_R1_SYSTEM = (
    "<｜begin▁of▁sentence｜>A conversation between User and Assistant. The user asks a question, "
    "and the Assistant solves it. The assistant first thinks about the reasoning process in the "
    "mind and then provides the user with the answer. The reasoning process and answer are "
    "enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., <think> "
    "reasoning process here </think> <answer> answer here </answer>.<｜User｜>")
"""The DeepSeekR1 style's fixed head (``PromptConstants.SYSTEM_MESSAGE_DEEPSEEK_R1``): it
carries DeepSeek's own special-token text, so the prompt is used as raw text, not as a chat
message."""
LCB_R1_ASSISTANT = "<｜Assistant｜>"


def _format_block(starter_code: str) -> tuple[str, str]:
    """The format instruction and the fenced block under it. LiveCodeBench tests the starter
    code for truthiness; a whitespace-only one counts as none here (no release row has one)."""
    if starter_code and starter_code.strip():
        return LCB_FORMAT_WITH_STARTER, f"```python\n{starter_code}\n```\n\n"
    return LCB_FORMAT_WITHOUT_STARTER, "```python\n# YOUR CODE HERE\n```\n\n"


def lcb_prompt(question_content: str, starter_code: str = "") -> str:
    """The user message of LiveCodeBench's generic template
    (``get_generic_question_template_answer``): the question under ``### Question:``, the
    format instruction with the starter code or a ``# YOUR CODE HERE`` fence, then
    ``### Answer: (use the provided format with backticks)``. LiveCodeBench's separate system
    message for chat APIs is not included: R1-style models are prompted without one."""
    instruction, block = _format_block(starter_code)
    return (f"### Question:\n{question_content}\n\n### Format: {instruction}\n{block}"
            "### Answer: (use the provided format with backticks)\n\n")


def lcb_r1_prompt(question_content: str, starter_code: str = "") -> str:
    """The whole prompt text of LiveCodeBench's DeepSeekR1 style (``format_prompt_generation``
    with ``LMStyle.DeepSeekR1``: the fixed head, ``get_deepseek_r1_question_template_answer``,
    then ``<｜Assistant｜>``). It already holds the beginning-of-sentence, user and assistant
    markers as text, so it is tokenized as it is, not through a chat template."""
    instruction, block = _format_block(starter_code)
    return (f"{LCB_R1_SYSTEM}{LCB_R1_INSTRUCTION}Question: {question_content}\n\n"
            f"{instruction}\n{block}{LCB_R1_ASSISTANT}")


def default_lcb_style(model: str | Path | None) -> LcbStyle:
    """The style LiveCodeBench assigns a model (``lcb_runner/lm_styles.py``): DeepSeekR1 for
    the DeepSeek-R1-Distill models (the report's base models and their RL descendants named
    so), the generic template otherwise."""
    name = Path(str(model)).name.lower() if model else ""
    return "deepseek-r1" if "deepseek-r1-distill" in name else "generic"
