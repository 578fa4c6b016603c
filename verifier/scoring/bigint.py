"""Decimal integers past Python's 4,300-digit limit, without raising it for the process.

LiveCodeBench raises the limit to 50,000 digits for its whole process
(LiveCodeBench/LiveCodeBench at 28fef95, ``lcb_runner/evaluation/
compute_code_generation_metrics.py``: ``sys.set_int_max_str_digits(50000)`` at import), so its
ground truth may hold integers of up to 50,000 digits. ``sys.set_int_max_str_digits`` is
interpreter-wide, and the verifier's processes (server, eval, client) judge items of every
profile at once, so it is never changed here: the conversions below split the digits into
pieces under the limit and join them with arithmetic (which has no limit), each refusing more
than the ``max_digits`` the caller's profile allows (the bound keeps the quadratic cost of a
hostile row small: 50,000 digits convert in milliseconds).

Rule: a profile's ``int_max_str_digits`` (``verifier.scoring.profiles``) is where its ground truth is
parsed, as well as inside the sandbox.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
from typing import Any, Callable

__all__ = ["MAX_INT_DIGITS", "int_from_digits", "int_to_digits", "json_dumps_digits",
           "json_loads_digits"]

MAX_INT_DIGITS = 50_000
"""The most digits any judging profile lets an integer of a ground truth have (LiveCodeBench's
``sys.set_int_max_str_digits(50000)``; verifier/scoring/profiles.py checks that none allows more).
Readers that do not know yet which profile will judge a ground truth (the server's item
decoding, ``verifier eval``'s row reader) accept this many; the judge then applies the item's
own profile (``verifier.scoring.code_score._spec``)."""

_CHUNK = 4000  # digits converted at once: under the default limit of 4,300


def _limit() -> int:
    get = getattr(sys, "get_int_max_str_digits", None)
    return get() if get is not None else 0


def int_from_digits(text: str, max_digits: int) -> int:
    """``int(text)`` for an optionally signed decimal literal of up to ``max_digits`` digits,
    whatever the interpreter's own limit; ValueError past ``max_digits`` (or for no number)."""
    s = text.strip()
    neg = s[:1] == "-"
    digits = s[1:] if s[:1] in "+-" and s else s
    if len(digits) <= _CHUNK or _limit() == 0:
        return int(s)
    if len(digits) > max_digits:
        raise ValueError(f"an integer of {len(digits)} digits, over the limit of {max_digits}")
    if not digits.isdigit() or not digits.isascii():
        raise ValueError(f"not a decimal integer: {s[:40]!r}...")
    value = _join(digits)
    return -value if neg else value


def _join(digits: str) -> int:
    if len(digits) <= _CHUNK:
        return int(digits)
    half = len(digits) // 2
    low = len(digits) - half
    return _join(digits[:half]) * 10**low + _join(digits[half:])


def int_to_digits(n: int, max_digits: int) -> str:
    """``str(n)`` whatever the interpreter's own limit, for ``n`` of up to ``max_digits``
    digits; ValueError past it."""
    if -(10**_CHUNK) < n < 10**_CHUNK or _limit() == 0:
        return str(n)
    if n < 0:
        return "-" + int_to_digits(-n, max_digits)
    if n.bit_length() > max_digits * 3.33 + 4:
        raise ValueError(f"an integer over {max_digits} digits")
    return _split(n, 0)


def _split(n: int, width: int) -> str:
    """Decimal digits of ``n`` >= 0, zero-padded to ``width``."""
    if n < 10**_CHUNK:
        s = str(n)
        return s.zfill(width) if width else s
    k = max(_CHUNK, int(n.bit_length() * 0.30103) // 2)  # about half of n's digits
    hi, lo = divmod(n, 10**k)
    return _split(hi, max(0, width - k)) + _split(lo, k)


def json_loads_digits(text: str | bytes, max_digits: int | None) -> Any:
    """``json.loads`` where integers may have up to ``max_digits`` digits (None: the
    interpreter's limit, as plain ``json.loads``)."""
    if max_digits is None:
        return json.loads(text)
    parse_int: Callable[[str], int] = lambda s: int_from_digits(s, max_digits)  # noqa: E731
    return json.loads(text, parse_int=parse_int)


def json_dumps_digits(obj: Any, max_digits: int | None, **kwargs: Any) -> str:
    """``json.dumps(obj, **kwargs)`` where integers (values, and keys of dicts) may have up to
    ``max_digits`` digits (None: the interpreter's limit, as plain ``json.dumps``): the client
    side of the wire writes the ground truths :func:`json_loads_digits` reads. ValueError past
    ``max_digits``; RecursionError for an object nested too deeply, as ``json.dumps``.

    The common case costs one ``json.dumps``; only when it refuses an integer are the large
    ones put in as digits, through placeholder strings named by a random token that are then
    replaced in the text (and the text checked to hold each exactly once)."""
    try:
        return json.dumps(obj, **kwargs)
    except ValueError:
        if max_digits is None:
            raise
    token = secrets.token_hex(12)
    digits: list[str] = []

    def big(v: Any) -> bool:
        return type(v) is not bool and isinstance(v, int) and not -(10**_CHUNK) < v < 10**_CHUNK

    def placeholder(v: int) -> str:
        digits.append(int_to_digits(int(v), max_digits))
        return f"{token}:{len(digits) - 1}"

    def swap(v: Any) -> Any:
        if big(v):
            return placeholder(v)
        if isinstance(v, dict):
            return {(int_to_digits(int(k), max_digits) if big(k) else k): swap(x)
                    for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(obj), **kwargs)
    found = re.findall(f'"{token}:(\\d+)"', text)
    if sorted(map(int, found)) != list(range(len(digits))):  # cannot happen: a fresh token
        raise ValueError("integer placeholders did not survive encoding")
    return re.sub(f'"{token}:(\\d+)"', lambda m: digits[int(m.group(1))], text)
