"""Expression bombs: how large an exact number a LaTeX answer asks sympy to build
(docs/verifier.md 1). Used by verifier/scoring/math_score.py's ``_too_big`` before an answer reaches
sympy; no sympy here, linear in the length."""

from __future__ import annotations

import math
import re

_TOKEN = re.compile(r"\d+(?:\.\d*)?|\.\d+|\\[A-Za-z]+|\\.|\S")
_LOG10_2 = math.log10(2)
_OPEN = {"{": "}", "(": ")", "[": "]", "\\{": "\\}", "\\lbrace": "\\rbrace", "\\langle": "\\rangle"}
_CLOSE = {"}", ")", "]", "\\}", "\\rbrace", "\\rangle"}
_ADD = {"+", "-", "\\pm", "\\mp"}
_MUL = {"*", "/", "\\cdot", "\\times", "\\div", "\\ast"}
_TWO_ARGS = {"\\frac", "\\dfrac", "\\tfrac", "\\cfrac", "\\binom", "\\dbinom", "\\tbinom"}
_TEXT = {"\\text", "\\textbf", "\\textit", "\\mathrm", "\\mathbf", "\\mathit", "\\mbox",
         "\\operatorname", "\\mathbb", "\\mathcal", "\\begin", "\\end", "\\hbox", "\\textrm"}
MAX_RECURSION = 200
"""Deepest nesting the estimate follows before it gives up (TooDeep)."""


class TooDeep(Exception):
    """The expression nests deeper than MAX_RECURSION."""


class Magnitude:
    """Estimates, without computing anything, the largest exact number sympy would build while
    evaluating a LaTeX expression. A node is (log10 of its magnitude, bounded above; whether it
    is an exact number: only literals, +, *, /, powers and factorials of exact numbers). Only
    exact numbers count: sympy evaluates ``Integer ** Integer`` and ``factorial(Integer)`` in
    uninterruptible C big-integer code, while symbols and floats stay cheap. Upper bounds
    throughout (``\\frac{a}{b}`` counts the digits of both), so it errs towards "too big"."""

    def __init__(self, latex: str):
        self.toks = _TOKEN.findall(latex)
        self.i = 0
        self.peak = 0.0
        self.level = 0

    def peak_digits(self) -> float:
        """Estimated digits of the largest exact number; raises TooDeep past MAX_RECURSION."""
        try:
            while self.i < len(self.toks):
                self.sequence(stop=None)
                self.i += 1  # a stray closer: skip it and go on
        except (OverflowError, ValueError):
            return math.inf
        return self.peak

    # grammar helpers ------------------------------------------------------------------------
    def tok(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def note(self, digits: float, exact: bool) -> tuple[float, bool]:
        if exact and digits > self.peak:
            self.peak = digits
        return digits, exact

    def sequence(self, stop: str | None) -> tuple[float, bool]:
        """Comma/relation separated items up to the closer ``stop`` (not consumed)."""
        self.level += 1
        if self.level > MAX_RECURSION:
            raise TooDeep
        best, exact = 0.0, True
        while (t := self.tok()) is not None and t != stop and not (stop is None and t in _CLOSE):
            if t in _CLOSE:
                self.i += 1  # mismatched closer inside an interval like (1, 2]: ends the group
                break
            before = self.i
            d, e = self.sum()
            best, exact = max(best, d), exact and e
            if self.i == before:
                self.i += 1  # a separator or an unknown token: skip it
        self.level -= 1
        return best, exact

    def sum(self) -> tuple[float, bool]:
        d, e = self.term()
        while self.tok() in _ADD:
            self.i += 1
            d2, e2 = self.term()
            d, e = self.note(max(d, d2) + _LOG10_2, e and e2)
        return d, e

    def term(self) -> tuple[float, bool]:
        d, e = self.factor()
        while True:
            t = self.tok()
            if t in _MUL:
                self.i += 1
            elif t is None or not self.starts_atom(t):
                return d, e
            d2, e2 = self.factor()
            d, e = self.note(d + d2, e and e2)

    def factor(self) -> tuple[float, bool]:
        while self.tok() in _ADD:  # unary signs
            self.i += 1
        d, e = self.atom()
        while True:
            t = self.tok()
            if t == "!":
                self.i += 1
                d, e = self.note(_factorial_digits(d), e)
            elif t == "^":
                exps = []
                while self.tok() == "^":
                    self.i += 1
                    exps.append(self.argument())
                ed, ee = exps[-1]
                for d2, e2 in reversed(exps[:-1]):  # a^b^c read as a^(b^c): the larger
                    ed, ee = self.note(_power_digits(d2, ed), e2 and ee)
                d, e = self.note(_power_digits(d, ed), e and ee)
            elif t == "_":
                self.i += 1
                self.argument()  # a subscript names something; its value is not computed
            elif t == "'":
                self.i += 1
            else:
                return d, e

    def starts_atom(self, t: str) -> bool:
        if t in _OPEN or t[0].isdigit() or t[0] == "." or t[0].isalpha():
            return True
        return t.startswith("\\") and len(t) > 2 and t not in _ADD and t not in _MUL and t not in _CLOSE

    def argument(self) -> tuple[float, bool]:
        """A braced group or a single atom (a command's argument, an exponent)."""
        if self.tok() in _ADD:
            self.i += 1
        return self.atom()

    def group(self, opener: str) -> tuple[float, bool]:
        closer = _OPEN[opener]
        self.i += 1
        d, e = self.sequence(stop=closer)
        if self.tok() == closer:
            self.i += 1
        return d, e

    def atom(self) -> tuple[float, bool]:
        t = self.tok()
        if t is None:
            return 0.0, True
        if t in _OPEN:
            return self.group(t)
        if t[0].isdigit() or t[0] == ".":
            self.i += 1
            return _number_digits(t), True
        if not t.startswith("\\"):
            self.i += 1
            return (1.0, False) if t.isalpha() else (0.0, True)
        # a command
        self.i += 1
        self.level += 1
        if self.level > MAX_RECURSION:
            raise TooDeep
        try:
            if t in _TEXT:
                if self.tok() == "{":
                    self.skip_group()
                return 0.0, False
            if t in _TWO_ARGS:
                a, ea = self.argument()
                b, eb = self.argument()
                if t.endswith("binom"):
                    return self.note(min(_power_digits(_LOG10_2, a), _power_digits(a, b)), ea and eb)
                return self.note(a + b, ea and eb)
            if t == "\\sqrt":
                if self.tok() == "[":
                    self.group("[")
                d, e = self.argument()
                return d / 2, e
            if t == "\\exp":
                d, e = self.argument()
                return self.note(_power_digits(math.log10(math.e), d), e)
            if self.tok() == "{" or self.tok() == "(":
                d, _ = self.argument()  # \sin{...}, \ln(...): a function of an argument
                return d, False
            return 1.0, False  # \pi, \alpha, \infty, \cdots ...: a symbol
        finally:
            self.level -= 1

    def skip_group(self) -> None:
        depth = 0
        while (t := self.tok()) is not None:
            self.i += 1
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                if depth == 0:
                    return


def _number_digits(literal: str) -> float:
    intpart, _, frac = literal.partition(".")
    intpart = intpart.lstrip("0")
    if len(intpart) > 300:
        return float(len(intpart))
    value = float((intpart or "0") + "." + (frac or "0"))
    if value == 0:
        return 0.0
    # a decimal like 0.001 is 1/1000 for sympy's exact arithmetic: count its digits as well
    return abs(math.log10(value)) + (len(frac) if frac else 0)


def _power_digits(base: float, exponent: float) -> float:
    """Digits of a^b given the digits of a and b (upper bound)."""
    if exponent > 300:
        return math.inf
    return (10.0**exponent) * max(base, 0.0)


def _factorial_digits(n_digits: float) -> float:
    """Digits of n! given the digits of n (upper bound: n log10 n)."""
    if n_digits > 300:
        return math.inf
    n = 10.0**n_digits
    return n * math.log10(n) if n > 1 else 0.0
