"""The ``checker`` of a code ground truth (docs/contracts.md 1): how a program's output is judged
when a problem has more than one right answer.

Pure: no sandbox, no I/O. ``parse_checker`` validates the field (the ground truth's parser calls
it, so a bad checker is the item's INVALID_INPUT, or a data row's error, with a one-line
reason); the built-in rules are applied by verifier/scoring/output_compare.py, program checkers by
verifier/scoring/checker_jail.py.

- absent or ``"exact"``: LiveCodeBench's rule (verifier/scoring/output_compare.py), as before;
- ``"tokens"``: the outputs split on any whitespace are equal token by token;
- ``"tokens_ci"``: the same, case-insensitively (YES / yes / Yes);
- ``"float:EPS"``: token by token; two tokens that both are finite decimal numbers match when
  |got - expected| <= EPS x max(1, |expected|); other tokens must be equal; the token counts
  must be equal; ``nan`` and ``inf`` match nothing. Call-based items may carry it too: it
  applies to the floats anywhere in the returned value;
- ``{"language": "python", "source": "..."}``: a program checker in the testlib convention,
  run in a jail of its own (verifier/scoring/checker_jail.py). stdin/stdout items only.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from verifier.items import decode_ground_truth

__all__ = ["BadChecker", "CHECKERS_AGAINST", "EXACT", "MAX_CHECKER_CHARS", "ProgramChecker",
           "TOKENS", "TOKENS_CI", "add_checker", "describe", "float_eps", "has_checker", "parse_checker",
           "without_checker"]

EXACT = "exact"
TOKENS = "tokens"
TOKENS_CI = "tokens_ci"
FLOAT_PREFIX = "float:"
BUILTIN_NAMES = (EXACT, TOKENS, TOKENS_CI, FLOAT_PREFIX + "EPS")
CHECKERS_AGAINST = EXACT  # ``verifier eval --explain exact``: the checkers against the exact rule
CHECKER_LANGUAGES = ("python",)
MAX_CHECKER_CHARS = 512 * 1024
"""The longest checker source: the cap of a judged program (code_score.MAX_PROGRAM_CHARS)."""
_MAX_EPS_CHARS = 64


class BadChecker(ValueError):
    """A ``checker`` field that cannot be used; the message says why, in one line."""


@dataclass(frozen=True)
class ProgramChecker:
    """A checker program in the testlib convention (``checker.py INPUT OUTPUT ANSWER``; exit 0
    accepted, 1 wrong answer, 2 presentation error, 3 the checker itself failed)."""

    language: str
    source: str
    digest: bytes = field(default=b"", compare=False)
    """sha256 of the source: the key of its self-checks (verifier/scoring/checker_jail.py)."""


def float_eps(rule: str) -> Decimal:
    """EPS of a ``"float:EPS"`` rule: a finite decimal number >= 0 (BadChecker otherwise)."""
    text = rule[len(FLOAT_PREFIX):]
    if not text or len(text) > _MAX_EPS_CHARS or not text.isascii() or "_" in text:
        raise BadChecker(f"checker {rule[:80]!r}: EPS must be a decimal number such as 1e-6")
    try:
        eps = Decimal(text.strip())
    except (InvalidOperation, ValueError):
        raise BadChecker(
            f"checker {rule[:80]!r}: EPS must be a decimal number such as 1e-6") from None
    if not eps.is_finite() or eps < 0 or not math.isfinite(float(eps)):
        raise BadChecker(f"checker {rule[:80]!r}: EPS must be a finite number >= 0")
    return eps


def parse_checker(value: Any, call_based: bool = False) -> str | ProgramChecker:
    """The ground truth's ``checker`` as a rule name (``"exact"``, ``"tokens"``,
    ``"tokens_ci"``, ``"float:EPS"``) or a :class:`ProgramChecker`; BadChecker naming what is
    wrong. ``call_based``: the item has a ``fn_name`` (then only "exact" and "float:EPS")."""
    if value is None or value == EXACT:
        return EXACT
    if isinstance(value, str):
        if value.startswith(FLOAT_PREFIX):
            float_eps(value)
            return value
        if value in (TOKENS, TOKENS_CI):
            if call_based:
                raise BadChecker(f"checker {value!r} compares stdout; a call-based item "
                                 "(fn_name) takes 'exact' or 'float:EPS'")
            return value
        raise BadChecker(f"unknown checker {value[:80]!r}; expected one of "
                         f"{', '.join(BUILTIN_NAMES)} or a program "
                         "{'language': 'python', 'source': ...}")
    if isinstance(value, dict):
        if call_based:
            raise BadChecker("a checker program judges stdout; a call-based item (fn_name) "
                             "takes 'exact' or 'float:EPS'")
        language, source = value.get("language"), value.get("source")
        if language not in CHECKER_LANGUAGES:
            raise BadChecker(f"checker language {str(language)[:40]!r} is not supported; "
                             f"expected one of {', '.join(CHECKER_LANGUAGES)}")
        if not isinstance(source, str) or not source.strip():
            raise BadChecker("a checker program needs a non-empty 'source' string")
        if len(source) > MAX_CHECKER_CHARS:
            raise BadChecker(f"checker source has {len(source)} characters, over the cap of "
                             f"{MAX_CHECKER_CHARS} (a judged program's)")
        digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).digest()
        return ProgramChecker(language, source, digest)
    raise BadChecker(f"'checker' must be a name or an object, got {type(value).__name__}")


def has_checker(ground_truth: Any) -> bool:
    """Whether a code ground truth (an object, or a JSON string of one) names a checker other
    than the exact rule."""
    gt = decode_ground_truth(ground_truth)
    return isinstance(gt, dict) and gt.get("checker") not in (None, "", EXACT)


def without_checker(ground_truth: Any) -> Any:
    """The ground truth judged by the exact rule (its ``checker`` removed), for ``verifier eval
    --explain exact``."""
    gt = decode_ground_truth(ground_truth)
    return {k: v for k, v in gt.items() if k != "checker"} if isinstance(gt, dict) else gt


def add_checker(ground_truth: Any, checker: Any) -> Any:
    """A code ground truth (an object, or a JSON string of one) with a dataset's ``checker``
    column put in (a name, an object, or a JSON string of one; None, "" or {}: none, the ground
    truth as it is). BadChecker when the ground truth is no object or names another checker
    of its own. The checker itself is validated with the ground truth (``parse_checker``)."""
    if checker in (None, "", {}):
        return ground_truth
    if isinstance(checker, str) and checker.lstrip().startswith("{"):
        try:
            checker = json.loads(checker)
        except (ValueError, RecursionError) as e:
            raise BadChecker(f"the 'checker' column is not valid JSON: {type(e).__name__}: "
                             f"{str(e)[:80]}") from None
    gt = decode_ground_truth(ground_truth)
    if not isinstance(gt, dict):
        raise BadChecker("a 'checker' column needs a code ground truth object of tests, got "
                         f"{type(gt).__name__}")
    if gt.get("checker", checker) != checker:
        raise BadChecker("the 'checker' column and the ground truth's 'checker' differ; give "
                         "one")
    return {**gt, "checker": checker}


def describe(rule: str | ProgramChecker) -> str:
    """A short name of a checker for messages: the rule, or "a python checker program"."""
    return rule if isinstance(rule, str) else f"a {rule.language} checker program"
