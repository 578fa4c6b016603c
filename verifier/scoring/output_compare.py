"""Comparing what a judged program produced with the expected output (LiveCodeBench's rules).

Everything here reads data that a judged program wrote, so nothing here may cost more than a
bounded, predictable amount of work on any input:

- no container is built whose cost the program controls: a returned value is compared with the
  expected one on its wire encoding, walking the EXPECTED value's structure; no set is built,
  and no dict is keyed by anything but strings (whose hashes are randomised), so a set of
  integers that all hash alike (quadratic to build) is never built;
- recursion follows the expected value only (trusted data), never the program's nesting;
- messages describe values within a character budget, without ``repr`` of a huge integer
  (past Python's 4,300-digit limit, ``repr`` raises) or of a huge container.

The scorer runs these functions in a worker process under a deadline (``verifier.scoring.scorer``), off
the server's threads: even linear work on 8 MiB of output (millions of numeric tokens) must not
hold the server's GIL. ``compare_stdout`` and ``compare_return`` are the tasks; the fast
paths (``stdout_identical``, and equal bytes with ``canonical_return``) are cheap enough to run
anywhere.

LiveCodeBench's rules (``lcb_runner/evaluation/testing_util.py``, LiveCodeBench/LiveCodeBench
at 28fef95): stdin/stdout outputs are compared line by line after stripping the whole output and
each line; a pair of lines that differ as text is equal when both consist entirely of decimal
tokens with equal values. Call-based results: a returned tuple counts as a list, then ``==``.
That is the "exact" rule; a ground truth's ``checker`` may name another built-in one
(verifier/scoring/checkers.py, docs/contracts.md 1): "tokens", "tokens_ci" and "float:EPS", applied by
``compare_stdout`` and (``float:EPS`` only) ``compare_return`` with the same bounds.
"""

from __future__ import annotations

import json
import math
import re
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from verifier.scoring.checkers import EXACT, TOKENS, TOKENS_CI, float_eps
from verifier.harness.codec import encode_message

SHORT = 80  # characters of a value shown in a verdict's message


# ---------------------------------------------------------------------------------------------
# stdin/stdout


def _stripped_lines(s: str) -> list[str]:
    return [line.strip() for line in s.strip().split("\n")]


def _decimals(tokens: list[str]) -> list[Decimal] | None:
    try:
        return [Decimal(tok) for tok in tokens]
    except (InvalidOperation, ValueError):
        return None


def stdout_identical(got: str, expected: str) -> bool:
    """The cheap sufficient test: equal after stripping the whole text (then every line is)."""
    return got.strip() == expected.strip()


def outputs_match(got: str, expected: str) -> bool:
    """LiveCodeBench's stdin/stdout rule: strip the whole output, split into lines, strip each;
    the line counts must agree; each pair of lines is equal as strings, or else both parse
    entirely as decimal tokens and the token lists are equal (so ``1.0`` == ``1``). Linear in
    the output: decimals are parsed only on lines that differ as text and hold as many tokens."""
    if stdout_identical(got, expected):
        return True
    a, b = _stripped_lines(got), _stripped_lines(expected)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        tx, ty = x.split(), y.split()
        if len(tx) != len(ty):
            return False
        dx, dy = _decimals(tx), _decimals(ty)
        if dx is None or dy is None:
            return False
        try:
            if dx != dy:
                return False
        except InvalidOperation:  # signalling NaN
            return False
    return True


def compare_stdout(got: bytes, expected: str, rule: str = EXACT) -> tuple[bool, str]:
    """Task: ``(ok, message)`` for one stdin/stdout test by the built-in checker ``rule``
    (verifier/scoring/checkers.py; validated with the ground truth)."""
    if rule == EXACT:
        text = got.decode("utf-8", errors="replace")
        ok = outputs_match(text, expected)
    else:
        # Bytes that are not UTF-8 become lone surrogates, equal to no character of the
        # expected text (errors="replace" would make them U+FFFD, which an expected output
        # may hold).
        text = got.decode("utf-8", errors="surrogateescape")
        ok = tokens_match(text, expected, rule)
    if ok:
        return True, ""
    return False, f"wrong answer (expected {short(expected)}, got {short(text)})"


# ---------------------------------------------------------------------------------------------
# The other built-in checkers of a ground truth (docs/contracts.md 1).

# A finite decimal number in ASCII. Possessive quantifiers: a token of millions of digits is
# matched in linear time (a backtracking pattern would be quadratic on "999...9x").
_DECIMAL_TOKEN = re.compile(r"[+-]?(?:\d++(?:\.\d*+)?|\.\d++)(?:[eE][+-]?\d++)?", re.ASCII)
# Differences and bounds to 40 significant digits, at any exponent, never trapping (an
# overflow is an infinite difference: no match).
_TOLERANCE = Context(prec=40, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[])
_ONE = Decimal(1)


def decimal_token(tok: str) -> Decimal | None:
    """The value of ``tok`` when it is a finite decimal number (``-1``, ``2.50``, ``.5``,
    ``1e-9``; ASCII digits only: no ``nan``, ``inf``, underscores or hex), else None."""
    if _DECIMAL_TOKEN.fullmatch(tok) is None:
        return None
    return Decimal(tok)


def within(got: Decimal, expected: Decimal, eps: Decimal) -> bool:
    """``|got - expected| <= eps * max(1, |expected|)``."""
    diff = _TOLERANCE.subtract(got, expected).copy_abs()
    bound = _TOLERANCE.multiply(eps, max(_ONE, expected.copy_abs()))
    return diff.is_finite() and diff <= bound


def tokens_match(got: str, expected: str, rule: str) -> bool:
    """The built-in checkers other than "exact": the outputs split on any whitespace are equal
    token by token ("tokens"), case-insensitively ("tokens_ci"), or ("float:EPS") with two
    tokens that both are finite decimal numbers equal within EPS x max(1, |expected|) and any
    other pair equal as text, ``nan`` and ``inf`` matching nothing. The token counts must be
    equal. Linear in the output: tokens are split once, numbers parsed only where the texts
    differ (or may be nan/inf)."""
    a, b = got.split(), expected.split()
    if len(a) != len(b):
        return False
    if rule == TOKENS:
        return a == b
    if rule == TOKENS_CI:
        return all(x == y or x.lower() == y.lower() for x, y in zip(a, b))
    eps = float_eps(rule)
    for x, y in zip(a, b):
        ey = decimal_token(y)
        if ey is None:
            if x != y or _non_finite(y):
                return False
            continue
        if x == y:
            continue
        ex = decimal_token(x)
        if ex is None or not within(ex, ey, eps):
            return False
    return True


def _non_finite(tok: str) -> bool:
    """``nan`` and ``inf`` as Python's float() reads them (any case, signed, ``infinity``):
    they match nothing under "float:EPS", themselves included."""
    return tok.lower().lstrip("+-") in ("nan", "inf", "infinity")


# ---------------------------------------------------------------------------------------------
# Call-based return values, compared on their wire encoding (verifier/harness/codec.py's
# Encoder: JSON values stand for themselves, other values are {"$": tag, "v": ...}).

_NUMBER = (bool, int, float)
_FRACTION_BITS = 1 << 16  # the largest numerator or denominator compared (gcd is quadratic)
_DECIMAL_CHARS = 1 << 12  # the longest Decimal text compared


def _number(x: Any) -> Any:
    """The numeric value of an encoded number, or None when ``x`` is not one."""
    if type(x) in _NUMBER:
        return x
    if type(x) is dict:
        tag, v = x.get("$"), x.get("v")
        if tag == "int" and type(v) is str and 0 < len(v) <= 1_000_000:
            try:
                return int(v, 16)  # linear: a power-of-two base
            except ValueError:
                return None
        if tag == "fraction" and type(v) is list and len(v) == 2:
            # The lcb profile's Fraction (codec.Encoder(numbers=True)): == with any number.
            num, den = _number(v[0]), _number(v[1])
            if (type(num) is int and type(den) is int and den > 0
                    and max(abs(num).bit_length(), den.bit_length()) <= _FRACTION_BITS):
                return Fraction(num, den)
            return None
        if tag == "decimal" and type(v) is str and len(v) <= _DECIMAL_CHARS:
            try:
                return Decimal(v)  # the lcb profile's Decimal: == with any number
            except (InvalidOperation, ValueError):
                return None
        if tag == "complex" and type(v) is list and len(v) == 2:
            re_, im = v
            if type(re_) in _NUMBER and type(im) in _NUMBER and im == 0:
                return re_  # complex(r, 0) == r in Python
    return None


def _encoded_equal(x: Any, expected: Any, numpy_arrays: bool = False,
                   eps: float | None = None) -> bool:
    """``decode(x) == expected`` for a plain JSON ``expected``, without decoding ``x``.
    Iterative over the expected structure (its depth is bounded by the ground truth).

    ``eps`` (the "float:EPS" checker): a pair of numbers of which either is a float matches
    when both are finite and ``|got - expected| <= eps * max(1, |expected|)``.

    ``numpy_arrays`` (profiles with numpy): a one-element numpy array (``np1``) equals what
    LiveCodeBench's ``==`` makes of it: an expected value holding exactly one element (a
    scalar, or single-element lists around one) equal to the array's; anything else
    broadcasts to an empty or many-element result, whose truth LiveCodeBench's judge cannot
    take (a failure there)."""
    stack = [(x, expected)]
    while stack:
        got, exp = stack.pop()
        if type(got) is dict and got.get("$") == "np1":
            if not numpy_arrays:
                return False
            while type(exp) is list and len(exp) == 1:
                exp = exp[0]
            if type(exp) in (list, dict):
                return False
            got = got.get("v")
        if exp is None:
            if got is not None:
                return False
        elif type(exp) in _NUMBER:
            n = _number(got)
            if eps is not None and n is not None and (type(exp) is float or type(n) is float):
                if not _floats_close(n, exp, eps):
                    return False
                continue
            try:
                if n is None or not (n == exp):
                    return False
            except (InvalidOperation, OverflowError, ValueError):  # sNaN, huge exponents
                return False
        elif type(exp) is str:
            if type(got) is not str or got != exp:
                return False
        elif type(exp) is list:
            if type(got) is not list or len(got) != len(exp):
                return False
            stack.extend(zip(got, exp))
        elif type(exp) is dict:
            if type(got) is not dict or got.get("$") != "dict" or type(got.get("v")) is not list:
                return False
            items: dict[str, Any] = {}
            for pair in got["v"]:
                # A key that is not a string can equal no key of a JSON object.
                if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str:
                    return False
                items[pair[0]] = pair[1]  # later duplicates win, as when building a dict
            if len(items) != len(exp):
                return False
            for k, v in exp.items():
                if k not in items:
                    return False
                stack.append((items[k], v))
        else:  # not a JSON value: cannot happen for parsed ground truth
            return False
    return True


def _floats_close(got: Any, expected: Any, eps: float) -> bool:
    """The "float:EPS" rule for two numbers (a bool is no number here; nan, inf, and a value
    too large for a float match nothing)."""
    if type(got) is bool or type(expected) is bool:
        return False
    try:
        g, e = float(got), float(expected)
    except (OverflowError, ValueError, InvalidOperation):  # a huge int, a signalling NaN
        return False
    if not (math.isfinite(g) and math.isfinite(e)):
        return False
    return abs(g - e) <= eps * max(1.0, abs(e))


def _as_list(x: Any) -> Any:
    """A returned tuple counts as a list (LiveCodeBench)."""
    if type(x) is dict and x.get("$") == "tuple" and type(x.get("v")) is list:
        return x["v"]
    return x


def canonical_return(expected: Any) -> bytes:
    """The exact bytes the harness sends for a program that returns ``expected`` (used for the
    fast path: equal bytes are equal values)."""
    return json.dumps({"v": _plain_encoding(expected), "objs": []}, allow_nan=True).encode()


def _plain_encoding(v: Any) -> Any:
    if type(v) is dict:
        return {"$": "dict", "v": [[k, _plain_encoding(x)] for k, x in v.items()]}
    if type(v) is list:
        return [_plain_encoding(x) for x in v]
    if type(v) is int and not -(1 << 1000) < v < (1 << 1000):
        return {"$": "int", "v": format(v, "x")}
    return v


def compare_return(blob: bytes, expected: Any, taco: bool,
                   numpy_arrays: bool = False, rule: str = EXACT) -> tuple[bool, str]:
    """Task: ``(ok, message)`` for one call-based test. With TACO-style outputs (JSON values,
    not strings) ``expected[0]`` is accepted too, as TACO's checker does. ``numpy_arrays``:
    one-element numpy arrays compare as LiveCodeBench's judge compares them
    (:func:`_encoded_equal`). ``rule``: "exact" or "float:EPS" (verifier/scoring/checkers.py)."""
    try:
        msg = json.loads(blob)
        got = _as_list(msg["v"])
    except (ValueError, TypeError, KeyError, RecursionError):
        return False, "unreadable return value"
    eps = None if rule == EXACT else float(float_eps(rule))
    if _encoded_equal(got, expected, numpy_arrays, eps):
        return True, ""
    if (taco and type(expected) is list and expected
            and _encoded_equal(got, expected[0], numpy_arrays, eps)):
        return True, ""
    return False, f"wrong answer (expected {short(expected)}, got {describe_encoded(got)})"


# ---------------------------------------------------------------------------------------------
# Bounded descriptions.


class _Budget(Exception):
    pass


class _Writer:
    def __init__(self, limit: int):
        self.parts: list[str] = []
        self.left = limit

    def put(self, s: str) -> None:
        if len(s) > self.left:
            self.parts.append(s[: self.left])
            self.left = 0
            raise _Budget
        self.parts.append(s)
        self.left -= len(s)

    def text(self, limit: int) -> str:
        s = "".join(self.parts)
        return s if self.left > 0 or len(s) < limit else s[: limit - 3] + "..."


def _int_text(n: int) -> str:
    if -(10**30) < n < 10**30:
        return str(n)
    digits = int(abs(n).bit_length() * math.log10(2)) + 1
    return f"<{'-' if n < 0 else ''}integer of about {digits} digits>"


def short(v: Any, n: int = SHORT) -> str:
    """A description of a plain value (expected outputs, stdout text) in at most ``n``
    characters, in time proportional to ``n`` (strings are cut before ``repr``)."""
    return _describe(v, n, encoded=False)


def describe_encoded(x: Any, n: int = SHORT) -> str:
    """A description of an encoded program value in at most ``n`` characters, without
    decoding it (its integers may be huge, its sets hash-flooded, its nesting deep)."""
    return _describe(x, n, encoded=True)


class _Lit:
    __slots__ = ("s",)

    def __init__(self, s: str):
        self.s = s


_OPEN = {"tuple": ("(", ")"), "set": ("{", "}"), "frozenset": ("frozenset({", "})"),
         "deque": ("deque([", "])")}


def _describe(v: Any, n: int, encoded: bool) -> str:
    """Walk ``v`` (iteratively, depth-first) writing at most ``n`` characters. ``encoded``:
    dicts are the harness's tagged values rather than plain dicts."""
    w = _Writer(n + 1)
    stack: list[Any] = [v]
    try:
        while stack:
            x = stack.pop()
            if isinstance(x, _Lit):
                w.put(x.s)
            elif type(x) is list:
                _push_seq(stack, x, "[", "]", w)
            elif type(x) is dict and encoded:
                _describe_tagged(x, stack, w)
            elif type(x) is dict:
                _push_pairs(stack, list(x.items())[: w.left], w)
            elif type(x) is str:
                w.put(repr(x[: w.left + 1]))
            elif type(x) is int:
                w.put(_int_text(x))
            elif type(x) in (bool, float) or x is None:
                w.put(repr(x))
            else:
                w.put(f"<{type(x).__name__}>")
    except _Budget:
        pass
    return w.text(n)


def _describe_tagged(x: dict, stack: list, w: _Writer) -> None:
    tag, val = x.get("$"), x.get("v")
    if tag in _OPEN and type(val) is list:
        _push_seq(stack, val, *_OPEN[tag], w)
    elif tag == "dict" and type(val) is list:
        pairs = [p for p in val[: w.left] if type(p) is list and len(p) == 2]
        _push_pairs(stack, pairs, w)
    elif tag == "int":
        num = _number(x)
        w.put("<bad int>" if num is None else _int_text(num))
    elif tag in ("bytes", "bytearray") and type(val) is str:
        w.put(f"{tag}({val[: w.left + 1]!r})")
    elif tag == "complex" and type(val) is list and len(val) == 2:
        w.put(f"complex({short(val[0], 20)}, {short(val[1], 20)})")
    elif tag in ("fraction", "decimal"):
        num = _number(x)
        w.put(f"<{tag}>" if num is None else f"{tag}({short(str(num), 40)})")
    elif tag == "np1":
        w.put(f"array([{describe_encoded(val, 40)}])")
    elif tag in ("obj", "ref", "opaque"):
        w.put(f"<{str(x.get('t', 'object'))[:40]} object>")
    else:
        w.put("<unreadable>")


def _push_pairs(stack: list, pairs: list, w: _Writer) -> None:
    stack.append(_Lit("}"))
    for i, (k, item) in enumerate(reversed(pairs)):
        stack += [item, _Lit(": "), k]
        if i < len(pairs) - 1:
            stack.append(_Lit(", "))
    w.put("{")


def _push_seq(stack: list, seq: list, open_: str, close: str, w: _Writer) -> None:
    stack.append(_Lit(close))
    part = seq[: w.left]
    for i, item in enumerate(reversed(part)):
        stack.append(item)
        if i < len(part) - 1:
            stack.append(_Lit(", "))
    w.put(open_)


def values_match(got: Any, expected: Any, taco: bool = False, rule: str = EXACT) -> bool:
    """LiveCodeBench's call-based rule (or the built-in checker ``rule``) for a Python value:
    the judge applies it to the value's wire encoding, exactly as a returned value arrives
    from the sandbox."""
    if type(got) is tuple:
        got = list(got)
    blob = json.dumps(encode_message(got), allow_nan=True).encode()
    return compare_return(blob, expected, taco, rule=rule)[0]
