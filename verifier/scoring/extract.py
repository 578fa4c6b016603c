"""Pulling the final answer out of a model response (docs/verifier.md 1).

Pure string functions shared by the math and code scorers; no sympy, no sandbox.
"""

from __future__ import annotations

import re

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


def after_think(response: str) -> str | None:
    """The part of ``response`` that carries the final answer.

    - With a ``</think>``: everything after the last one; but None when a new ``<think>`` opens
      after it and never closes (the response was cut off inside a second reasoning block).
    - With a ``<think>`` and no ``</think>``: the response was cut off inside its reasoning and
      has no answer (None).
    - With no think tags: the whole text.
    """
    close = response.rfind(_THINK_CLOSE)
    if close >= 0:
        tail = response[close + len(_THINK_CLOSE):]
        return None if _THINK_OPEN in tail else tail
    if _THINK_OPEN in response:
        return None
    return response


_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])(\s*)")
_TOKEN = re.compile(r"[^\s$]+")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced;
    None when there is none or the last one is never closed (the answer was cut off).
    Escaped braces ``\\{ \\}`` and ``\\\\`` inside do not count. ``\\boxed 5`` (no braces)
    gives the next token."""
    found = last_boxed_at(text)
    return None if found is None else found[1]


def last_boxed_at(text: str) -> tuple[int, str] | None:
    """``(where its \\boxed starts, content)`` of the box :func:`last_boxed` reads; None
    where that is None."""
    for m in reversed(list(_BOX.finditer(text))):
        i = m.end()
        if i < len(text) and text[i] == "{":
            content = _braced(text, i)
            return None if content is None else (m.start(), content)
        if m.group(1):
            # At position i, not on text[i:]: a copy of the rest for each of 125,000 "\boxed $"
            # was quadratic (3 s of a server thread on a 1,000,000-character response).
            tok = _TOKEN.match(text, i)
            if tok:
                return m.start(), tok.group(0)
    return None


def boxed_spans(text: str) -> list[tuple[int, int, str]]:
    """Every outermost closed box as ``(start, end, content)``, in order; a box inside another
    is part of it. Stops at a box that never closes (everything after it is inside it). Linear:
    each character is scanned by at most one brace match."""
    spans: list[tuple[int, int, str]] = []
    end = 0
    for m in _BOX.finditer(text):
        if m.start() < end:
            continue  # inside the previous box
        i = m.end()
        if i < len(text) and text[i] == "{":
            content = _braced(text, i)
            if content is None:
                break
            end = i + len(content) + 2
        elif m.group(1) and (tok := _TOKEN.match(text, i)):
            content, end = tok.group(0), tok.end()
        else:
            continue
        spans.append((m.start(), end, content))
    return spans


def brace_group(text: str, start: int) -> str | None:
    """The content of the brace group opening at ``text[start]`` (a ``{``), braces balanced and
    escaped ones not counted; None when it never closes."""
    return _braced(text, start)


def _braced(text: str, start: int) -> str | None:
    """The content of the brace group opening at ``text[start]``, or None if it never closes."""
    depth = 0
    j = start
    n = len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2  # \{ \} \\ and any command letter: never a group brace
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : j]
        j += 1
    return None


_FENCE = "```"
_TAG_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+-")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced block as ``(tag, body)``, in order: a fence, a tag of ``[A-Za-z0-9_+-]``
    (the rest of the fence's line is ignored), a newline, the body, the next fence.

    A scan in linear time: each fence is found once with ``str.find``. (The regular expression
    this replaces backtracked quadratically on a run of backticks without a newline, and a
    200,000-backtick response held the server for 30 s.)"""
    blocks = []
    pos = text.find(_FENCE)
    while pos >= 0:
        nl = text.find("\n", pos + 3)
        if nl < 0:
            break  # no newline after this fence: none after any later one either
        close = text.find(_FENCE, nl + 1)
        if close < 0:
            break  # no closing fence: none for any later opening either
        end = pos + 3
        while end < nl and text[end] in _TAG_CHARS:
            end += 1
        blocks.append((text[pos + 3 : end], text[nl + 1 : close]))
        pos = text.find(_FENCE, close + 3)
    return blocks


def lcb_code_block(text: str) -> str | None:
    """LiveCodeBench's extraction ("lcb" profile; lcb_runner/utils/extraction_utils.py,
    ``extract_code``, at 28fef95): the lines strictly between the last two lines of the whole
    response that hold a fence anywhere in them; None with fewer than two such lines."""
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if _FENCE in line]
    if len(fences) < 2:
        return None
    return "\n".join(lines[fences[-2] + 1 : fences[-1]])


_SKYWORK_OPEN = "```python\n"


def skywork_code_block(text: str) -> str | None:
    """The released Skywork-OR1 reward's extraction ("skywork" profile; SkyworkAI/Skywork-OR1
    at 64e96af, verl/utils/reward_score/livecodebench/compute_score.py): the text between the
    first ``</think>`` and the next one (the whole response without one), then the last
    non-overlapping ```` ```python\n ... ``` ```` block (exactly that tag), as
    ``re.findall(r"```python\n(.*?)```", text, re.DOTALL)[-1]`` finds it, in linear time."""
    if "</think>" in text:
        text = text.split("</think>")[1]
    found = None
    pos = text.find(_SKYWORK_OPEN)
    while pos >= 0:
        start = pos + len(_SKYWORK_OPEN)
        close = text.find(_FENCE, start)
        if close < 0:
            break  # no closing fence after this opening: none after a later one either
        found = text[start:close]
        pos = text.find(_SKYWORK_OPEN, close + 3)
    return found


def last_code_block(text: str, languages: tuple[str, ...] = ("python", "py", "python3", "")) -> str | None:
    """Body of the last fenced code block whose language tag is in ``languages`` (an untagged
    block counts when ``""`` is listed); None when there is none."""
    found = None
    for tag, body in code_blocks(text):
        if tag.lower() in languages:
            found = body
    return found
