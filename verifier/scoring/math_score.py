"""The math scorer: ``score_math(response, ground_truth, limits) -> Outcome``.

Two rule sets, chosen by the judging profile (verifier/scoring/profiles.py):

- ``skywork``: the released Skywork-OR1 math reward, as released (SkyworkAI/Skywork-OR1 at
  64e96af, verl/utils/reward_score/livecodebench/compute_score.py,
  ``math_verify_reward_function``; :func:`_score_released`): the text between the first
  ``</think>`` and the next one (the whole response without one) goes to math-verify's
  default extraction, LaTeX or plain expressions, no ``\\boxed`` needed ("The answer is 42."
  counts); CORRECT when the extracted string is one of the golds or math-verify calls it
  equivalent to ``\\boxed{gold}``. Ours there: only the input caps and the per-call CPU budget
  below (the release has a 5 s wall-clock alarm per call; its budget is kept at 5 s).
- ``default`` and ``lcb``: this project's rules (docs/verifier.md 1), described below. Only
  one of them is the release's: equivalence is decided by math-verify over sympy, gold first
  (``verify(gold, answer)``). The extraction is ours, NOT the release's: the released reward
  needs no box and reads the text after the FIRST ``</think>``; the ``\\boxed`` requirement is
  that of verl's own math reward (verl/utils/reward_score/math.py), which the Skywork-OR1
  release does not use.

This project's rules (``default``):

- the answer is read after the last ``</think>``; a response that opened ``<think>`` and never
  closed it has no answer (NO_ANSWER); without think tags the whole text counts;
- that region is read as TeX renders it (verifier/scoring/math_rules.py, ``render``): ``%`` comments
  (a ``%`` right after a number is a percent sign), ``\\iffalse ... \\fi`` and ``\\phantom``,
  ``\\hphantom``, ``\\vphantom`` are dropped; argument-free ``\\def``/``\\newcommand``
  macros are expanded; a region defining macros with arguments, or using ``\\let``, is not
  judged (INCORRECT);
- the answer is the content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``) of that region, not a
  set of all boxes; there is no fallback when there is no box (NO_ANSWER); one that renders
  empty (``\\phantom{5}``) is NO_ANSWER;
- hedging is INCORRECT: every earlier box of the region that no retraction ("wait", "wrong",
  "mistake", "actually", "no,", "instead", ...) follows before the final box is another final
  answer, and each must match a gold too (``\\boxed{6}`` or ``\\boxed{5}`` is INCORRECT for 5,
  either order; ``\\boxed{1/2}``, that is ``\\boxed{0.5}``, is CORRECT; a box that is one of
  the final answer's items, ``x = \\boxed{2}`` before ``\\boxed{(2, 3)}``, is not another
  answer); over MAX_RIVALS of them is INCORRECT without judging each;
- equivalence is decided by math-verify over sympy, gold first (``verify(gold, answer)``); the
  item is CORRECT when any acceptable answer matches;
- known weak spots of plain math-verify are fixed: exact numbers that math-verify calls equal
  after its 6-decimal rounding but that differ (``1/2004!`` vs ``1/2006!``, ``10^{-20}`` vs
  ``2\\cdot 10^{-20}``) are INCORRECT; ``\\pm`` answers are sets (below); false relations,
  relation symbols with no left side, bases and intervals (below);
- inputs have size caps, and expression bombs (huge power towers or factorials, deep nesting,
  over-long answers) are detected before sympy sees them; such an answer only matches a gold
  that is string-identical after normalisation. The service also kills a worker at a hard
  deadline (TIMEOUT); this is defence in depth.

Rules chosen where the design leaves a choice (each one is tested):

- leading zeros: ``007`` equals ``7`` (AIME golds are written ``025``, answers ``25``);
- percent: ``p\\%`` equals both ``p`` and ``p/100``, for any ``p`` (math-verify's rule for
  integers; ours for decimals and fractions): ``50\\%`` matches golds ``50``, ``50\\%`` and
  ``0.5``, ``12.5\\%`` matches ``12.5`` and ``0.125`` and a gold ``12.5\\%`` accepts ``12.5``;
- degrees: ``^\\circ`` is dropped, ``30^\\circ`` equals ``30``; there is no conversion between
  degrees and radians (``\\frac{\\pi}{6}`` does not match ``30^\\circ``);
- ``\\pm``: ``a \\pm b`` is the set ``{a+b, a-b}``: ``\\pm 2`` equals ``2, -2``, ``-2, 2`` and
  ``\\pm2``, in either direction; ``2`` alone does not match ``\\pm 2`` (a root is missing), nor
  does ``\\pm 2`` match ``2``;
- equations: against a gold that is no relation, an answer with ``=`` or ``\\approx`` is judged
  by each side (_chain_matches), but sides that only name the quantity: a variable, a name
  with a subscript, primes or accents, a function's value at plain arguments, letters joined
  by + - * / (``x``, ``a_{10}``, ``f(2)``, ``AB``, ``m + n``). ``x = 5`` and ``m + n = 33``
  match 5 and 33; ``6 = 5``, ``x + 1 = 5``, ``2x = 10``, ``x^2 = 4``, ``x = 13 = 12`` (12),
  ``29 = 13`` (13) do not; ``x = \\frac{10}{2} = 5`` and ``2^{10} = 1024`` do (every side
  matches). Around ``\\approx`` one run of equal sides must match and the sides must agree to
  the decimals shown: ``\\pi \\approx 3.14`` matches ``\\pi`` and ``3.14``, ``13 \\approx 29``
  matches neither. ``= 5`` states 5. A gold ``x = 5`` accepts ``5``; ``y = 5`` does not match
  ``x = 5``;
- a relation symbol with no left side (``\\neq 9``, ``\\ne 5``, ``< 5``, ``\\geq 2``) states no
  value and matches only a gold spelled the same;
- alternatives in one box are a list, not a choice: ``x = 13 \\lor x = 29``, ``13 \\vee 29``,
  ``13 or 29`` (and ``13 \\text{ or } 29``, ``13, 29``, as math-verify reads them) match the
  gold ``13, 29`` and not ``29``;
- bases: two numerals that both carry a base subscript compare digits and base (``1300_6``
  does not match ``1300_5``, ``1300_{5}`` and ``(1300)_5`` do); with the base on one side only,
  math-verify's reading stands (the subscript is dropped: ``1300`` matches ``1300_5``);
- intervals: an inequality in one variable against an interval or union, either way round, is
  its set of solutions (``-2 < x < 2`` and ``(-2, 2)``, ``-2 \\le x < 2`` and ``[-2, 2)``,
  ``x < -2 \\text{ or } x > 2`` and ``(-\\infty, -2) \\cup (2, \\infty)``); endpoints must
  agree, and the variable must stand alone (``x^2 < 4`` is not ``(-2, 2)``);
- units in ``\\text{...}`` after a number are ignored (``5\\text{ cm}`` equals ``5``);
- decimals follow math-verify's rounding to 6 decimal places (``0.333333`` equals ``1/3``,
  ``3.14`` does not equal ``\\pi``); the exact-number check above only applies when neither side
  holds a decimal or a percentage.

Each math-verify call (a parse, a comparison) gets CALL_TIMEOUT_S of the process's CPU time,
measured by ITIMER_PROF, not math-verify's own SIGALRM wall-clock alarm: on a loaded machine a
one-second wall alarm fired inside plain answers (``x = 936``), and math-verify reads its own
timeout as "no parse" or "not equal", so a right answer came back INCORRECT. A call that runs
out of CPU is a TIMEOUT verdict, never a silent INCORRECT. Signals only reach a process's main
thread: the service scores in worker processes' main threads. Called from another thread (an
in-process caller), the per-call limits are off and the bomb checks plus the caller's own
deadline bound the work.
"""

from __future__ import annotations

import decimal
import logging
import math
import re
import signal
import threading
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from verifier.scoring import extract, math_bombs, math_rules
from verifier.scoring.profiles import PROFILE_TABLE, Profile
from verifier.items import (
    MAX_RESPONSE_CHARS,
    Limits,
    Outcome,
    Status,
    decode_ground_truth,
    invalid,
    response_too_long,
)

log = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 1_000
"""Longest boxed answer (and gold) handed to sympy; a longer one is only compared as a string.
Real final answers are far shorter (a 4x4 matrix of fractions is ~200 characters)."""
MAX_GOLD_CHARS = 100_000
"""A gold answer longer than this is INVALID_INPUT (no real math answer is that long)."""
MAX_GOLD_ANSWERS = 64
"""Most acceptable answers one item may list."""
MAX_NESTING = 10
"""Deepest bracket nesting ( ( [ { ) handed to the LaTeX parser. Its ANTLR grammar slows down
sharply with nesting (tens of levels take seconds); real answers nest 3 or 4 deep."""
MAX_EXACT_DIGITS = 20_000
"""Largest exact number (in decimal digits, estimated) an answer may ask sympy to compute:
``2004!`` (5,700 digits) and ``2^{10000}`` pass, ``(10^8)!`` and ``9^{9^{9^9}}`` do not."""
CALL_TIMEOUT_S = 1.0
"""CPU seconds one math-verify call (a parse, a comparison) may use (ITIMER_PROF)."""
MAX_RIVALS = 8
"""Most other final answers (differently spelled boxes no retraction follows) judged one by one;
a response with more is hedging and INCORRECT."""
MAX_BOX_SPELLINGS = 256
"""Most differently written earlier boxes normalised one by one (a bound on a flood of boxes)."""
RELEASED_CALL_S = 5.0
"""The "skywork" profile's per-call budget: math-verify's default 5 s, as released."""
DEFAULT_TIMEOUT_S = 5.0
"""Soft budget for one item when ``limits.timeout_s`` is unset (the service's math default)."""
_DETAIL_CHARS = 60
DEFAULT_PROFILE = PROFILE_TABLE["default"]


class CallTimeout(BaseException):
    """A math-verify call ran past its CPU budget. A BaseException: math-verify and sympy catch
    ``Exception`` everywhere and would turn it into "no parse" or "not equal"."""


def _on_sigprof(signum: int, frame: Any) -> None:
    raise CallTimeout


def limited(fn: Any, *args: Any, cpu_s: float | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` under a budget of ``cpu_s`` (default CALL_TIMEOUT_S) of this
    process's CPU time; CallTimeout past it. Off outside the main thread (signals reach the
    main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)
    previous = signal.signal(signal.SIGPROF, _on_sigprof)
    signal.setitimer(signal.ITIMER_PROF, CALL_TIMEOUT_S if cpu_s is None else cpu_s)
    try:
        return fn(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _timed_out() -> Outcome:
    return Outcome(Status.TIMEOUT, f"math-verify used over {CALL_TIMEOUT_S:g} s of CPU on one "
                                   "parse or comparison")


# --------------------------------------------------------------------------------------------
# public API


def score_math(
    response: str, ground_truth: Any, limits: Limits, profile: Profile = DEFAULT_PROFILE
) -> Outcome:
    """Score one math item (docs/verifier.md 1) under ``profile``'s extraction rule. Never raises for
    bad input: INVALID_INPUT instead."""
    budget = getattr(limits, "timeout_s", None) or DEFAULT_TIMEOUT_S
    if profile.math_extraction == "skywork":
        return _score_released(response, ground_truth, time.monotonic() + budget)
    prepared = _prepare(response, ground_truth)
    if isinstance(prepared, Outcome):
        return prepared
    answer, golds, rivals = prepared
    deadline = time.monotonic() + budget

    def judge(latex: str) -> Outcome:
        quick = _plain_verdict(latex, golds)
        return quick if quick is not None else _judge(latex, golds, deadline)

    verdict = _hedge_verdict(judge(answer), answer, rivals, judge)
    assert verdict is not None  # judge always answers here
    return verdict


def quick_verdict(
    response: str, ground_truth: Any, profile: Profile = DEFAULT_PROFILE
) -> Outcome | None:
    """score_math's verdict when it needs no sympy, else None: bad input (INVALID_INPUT), no
    answer (NO_ANSWER), an answer and acceptable golds that are all plain integers (AIME
    style), compared as integers, or all plain rationals (integers and fractions), or an
    answer spelled like a gold (_plain_verdict), when the response's other final answers
    (hedges) are all decided the same way. The same code as score_math's first steps, so the
    same verdict; cheap and bounded (no parser), so the service runs it inline, sparing the
    item a round trip through a worker process. (Under the "skywork" extraction, math-verify
    reads the whole response: only a bad ground truth is decided here.)"""
    if profile.math_extraction == "skywork":
        golds = _gold_answers(ground_truth)
        return golds if isinstance(golds, Outcome) else None
    prepared = _prepare(response, ground_truth)
    if isinstance(prepared, Outcome):
        return prepared
    answer, golds, rivals = prepared
    verdict = _plain_verdict(answer, golds)
    if verdict is None:
        return None
    return _hedge_verdict(verdict, answer, rivals, lambda latex: _plain_verdict(latex, golds))


def _hedge_verdict(verdict: Outcome, answer: str, rivals: list[str],
                   judge: Callable[[str], Outcome | None]) -> Outcome | None:
    """``verdict`` on the final box, unless it is CORRECT and the response gives other final
    answers (``rivals``): then every one of them must match a gold too, else the response
    hedges and is INCORRECT. ``judge(latex)`` is an Outcome, or None when it cannot tell
    (quick_verdict: then None)."""
    if verdict.status is not Status.CORRECT or not rivals:
        return verdict
    if len(rivals) > MAX_RIVALS:
        return Outcome(Status.INCORRECT, f"answer {_q(answer)} is hedged: over {MAX_RIVALS + 1} "
                                         "different final answers, none retracted")
    for rival in rivals:
        outcome = judge(rival)
        if outcome is None or outcome.status is Status.TIMEOUT:
            return outcome
        if outcome.status is not Status.CORRECT:
            return Outcome(Status.INCORRECT,
                           f"answer {_q(answer)} is hedged: the response also answers "
                           f"{_q(rival)}, not retracted, which does not match")
    return verdict


def _checked(response: str, ground_truth: Any) -> list[str] | Outcome:
    """The acceptable golds once the response and the ground truth pass their checks, or the
    INVALID_INPUT Outcome saying what is wrong."""
    golds = _gold_answers(ground_truth)
    if isinstance(golds, Outcome):
        return golds
    if not isinstance(response, str):
        return invalid(f"'response' must be a string, got {type(response).__name__}")
    if len(response) > MAX_RESPONSE_CHARS:
        return response_too_long(len(response))
    return golds


def _prepare(response: str, ground_truth: Any) -> tuple[str, list[str], list[str]] | Outcome:
    """(answer, acceptable golds, other final answers), or the Outcome that ends scoring early.
    The answer region is read as it renders (math_rules.render: comments, ``\\iffalse``,
    macros, phantoms); the other final answers are the boxes before the last that no
    retraction follows, spelled unlike the answer (math_rules.unretracted_boxes)."""
    golds = _checked(response, ground_truth)
    if isinstance(golds, Outcome):
        return golds
    region = extract.after_think(response)
    if region is None:
        return Outcome(Status.NO_ANSWER, "response opened <think> and never closed it")
    region, problem = math_rules.render(region)
    if problem is not None:
        return Outcome(Status.INCORRECT, f"not judged: the answer region {problem}")
    found = extract.last_boxed_at(region)
    if found is None:
        if re.search(r"\\(?:boxed|fbox)", region):
            return Outcome(Status.NO_ANSWER, "the last \\boxed{ is never closed (answer cut off)")
        return Outcome(Status.NO_ANSWER, "no \\boxed{...} answer after the reasoning")
    start, boxed = found
    answer = _unwrap_boxes(boxed).strip()
    if not _normalise(answer):
        return Outcome(Status.NO_ANSWER, "the last \\boxed{} is empty")
    others = math_rules.unretracted_boxes(region, start)
    return answer, golds, (_rivals(answer, others) if others else [])


def _rivals(answer: str, others: list[str]) -> list[str]:
    """The other final answers among the contents ``others`` of earlier boxes: spelled unlike
    the answer and unlike its own items (``x = \\boxed{2}``, ``y = \\boxed{3}``, then
    ``\\boxed{(2, 3)}``); at most MAX_RIVALS + 1 (more is hedging whatever they are). Over
    MAX_BOX_SPELLINGS different spellings are not normalised one by one: they are rivals."""
    spellings = list(dict.fromkeys(others))
    if len(spellings) > MAX_BOX_SPELLINGS:
        return spellings[-(MAX_RIVALS + 1):]
    seen = {_normalise(answer)}
    if len(answer) <= MAX_ANSWER_CHARS:
        seen |= {_normalise(item) for item in math_rules.list_items(answer)}
    rivals: list[str] = []
    for content in spellings:
        rival = _unwrap_boxes(content).strip()
        norm = _normalise(rival)
        if norm and norm not in seen:
            seen.add(norm)
            rivals.append(rival)
            if len(rivals) > MAX_RIVALS:
                break
    return rivals


_PLAIN_INT = re.compile(r"[+-]?\d{1,200}")


def _integer_verdict(answer: str, golds: list[str]) -> Outcome | None:
    """Integers compare as integers (``007`` = ``7``, ``+5`` = ``5``); None unless the answer
    and every gold are plain integers."""
    a = _normalise(answer)
    norm_golds = [_normalise(g) for g in golds]
    if not _PLAIN_INT.fullmatch(a) or not all(_PLAIN_INT.fullmatch(g) for g in norm_golds):
        return None
    for gold, g in zip(golds, norm_golds):
        if int(g) == int(a):
            return Outcome(Status.CORRECT, _matches(answer, gold))
    return _no_match(answer, golds)


_PLAIN_RATIONAL = re.compile(
    r"(?P<sign>[+-]?)(?:\\frac\{(?P<num>\d{1,30})\}\{(?P<den>\d{1,30})\}"
    r"|(?P<n2>\d{1,30})/(?P<d2>\d{1,30})|(?P<int>\d{1,30}))")


def _plain_rational(norm: str) -> Fraction | None:
    """The value of a normalised plain rational: ``[+-]`` then an integer, ``\\frac{a}{b}`` or
    ``a/b`` of digit strings, with a denominator that is not zero; else None."""
    m = _PLAIN_RATIONAL.fullmatch(norm)
    if m is None:
        return None
    if m["int"] is not None:
        value = Fraction(int(m["int"]))
    else:
        num, den = (m["num"], m["den"]) if m["num"] is not None else (m["n2"], m["d2"])
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
    return -value if m["sign"] == "-" else value


def _plain_verdict(answer: str, golds: list[str]) -> Outcome | None:
    """The verdict of answers that need no parser, identical to what score_math's judging
    (math-verify, then the exact-number check) returns for them; None for anything else.

    - integers against integer golds: _integer_verdict;
    - an answer spelled like a gold (after normalisation): CORRECT, _judge's first step;
    - an answer and golds that are all plain rationals (integers, ``\\frac{a}{b}``, ``a/b``):
      compared exactly as fractions, gold by gold in order. math-verify parses each to a sympy
      Rational; it calls equal rationals equal, and unequal ones that its 6-decimal rounding
      calls equal are then told apart by _exact_numbers_differ (both Rational: ``g != a``),
      so the verdict is exact equality. tests/test_math_score.py pins this against the full
      path over a large generated set."""
    quick = _integer_verdict(answer, golds)
    if quick is not None:
        return quick
    norm_answer = _normalise(answer)
    for gold in golds:
        if _normalise(gold) == norm_answer:
            return Outcome(Status.CORRECT, _matches(answer, gold))
    a = _plain_rational(norm_answer)
    if a is None:
        return None
    values = [_plain_rational(_normalise(g)) for g in golds]
    if any(v is None for v in values):
        return None
    for gold, v in zip(golds, values):
        if v == a:
            return Outcome(Status.CORRECT, _matches(answer, gold))
    return _no_match(answer, golds)


def warm_up() -> None:
    """Import math-verify and sympy and score a few trivial items, so that a worker's first real
    item is not slow. Called once when a worker process starts."""
    import math_verify  # lazy: warms a worker process up (~1 s)
    import sympy  # noqa: F401  # lazy: warms a worker process up

    # math-verify warns, once per process, that a parse or verify without its own timeout
    # "must provide the logic for timeout interruption yourself": here every call runs under
    # our CPU budget and the pool's deadline (module docstring), so the warning is untrue and
    # only fills the server's log with one line per worker.
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)

    # The first parse loads math-verify's LaTeX grammar: seconds of CPU, done here without a
    # budget so that no CPU limit can interrupt it halfway through an import.
    math_verify.verify(math_verify.parse("\\boxed{\\frac{1}{2}}", parsing_timeout=0),
                       math_verify.parse("\\boxed{0.5}", parsing_timeout=0), timeout_seconds=0)
    limits = Limits()
    score_math("\\boxed{1}", "1", limits)
    score_math("\\boxed{\\left(\\frac{1}{2}, \\sqrt{2}\\right)}", "(0.5, \\sqrt{2})", limits)


# --------------------------------------------------------------------------------------------
# ground truth


def _gold_answers(ground_truth: Any) -> list[str] | Outcome:
    """The acceptable answers as strings, or an INVALID_INPUT Outcome saying what is wrong."""
    value = decode_ground_truth(ground_truth)
    if value == [] or (isinstance(value, str) and re.fullmatch(r"\s*\[\s*\]\s*", value)):
        return invalid("math ground_truth is an empty list; expected at least one answer")
    if isinstance(value, list):
        if len(value) > MAX_GOLD_ANSWERS:
            return invalid(
                f"math ground_truth lists {len(value)} answers, over the cap of {MAX_GOLD_ANSWERS}"
            )
        golds = []
        for i, v in enumerate(value):
            gold = _one_gold(v, f"math ground_truth[{i}]")
            if isinstance(gold, Outcome):
                return gold
            golds.append(gold)
        return golds
    gold = _one_gold(value, "math ground_truth")
    return gold if isinstance(gold, Outcome) else [gold]


def _one_gold(value: Any, where: str) -> str | Outcome:
    if isinstance(value, bool):
        return invalid(f"{where} must be an answer string, got a boolean")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return invalid(f"{where} must be a finite number, got {value!r}")
        return format(decimal.Decimal(repr(value)), "f")  # 1e-07 -> 0.0000001
    if isinstance(value, dict):
        return invalid(f"{where} must be an answer string or a list of them, got an object")
    if isinstance(value, list):
        return invalid(f"{where} must be an answer string, got a nested list")
    if not isinstance(value, str):
        return invalid(f"{where} must be an answer string, got {type(value).__name__}")
    if len(value) > MAX_GOLD_CHARS:
        return invalid(f"{where} has {len(value)} characters, over the cap of {MAX_GOLD_CHARS}")
    if "\\boxed" in value or "\\fbox" in value:
        inner = extract.last_boxed(value)
        if inner is not None:
            value = inner
    value = _unwrap_boxes(value).strip()
    if not _normalise(value):
        return invalid(f"{where} is an empty answer")
    return value


# --------------------------------------------------------------------------------------------
# judging


def _judge(answer: str, golds: list[str], deadline: float) -> Outcome:
    norm_answer = _normalise(answer)
    for gold in golds:
        if _normalise(gold) == norm_answer:
            return Outcome(Status.CORRECT, _matches(answer, gold))

    problem = _too_big(answer)
    if problem is not None:
        log.debug("answer not handed to sympy: %s", problem)
        return Outcome(Status.INCORRECT, f"answer too large to evaluate: {problem}")

    parsed: dict[str, list[Any]] = {}  # each spelling is parsed once
    try:
        for gold in golds:
            if _too_big(gold) is not None:
                continue  # only the string comparison above applies to a gold sympy cannot take
            if time.monotonic() > deadline:
                return Outcome(Status.TIMEOUT, "math scoring ran past its time budget")
            if _matches_gold(answer, gold, parsed):
                return Outcome(Status.CORRECT, _matches(answer, gold))
    except CallTimeout:
        return _timed_out()

    return _no_match(answer, golds, _why_not(answer, golds))


def _matches_gold(answer: str, gold: str, parsed: dict[str, list[Any]]) -> bool:
    """Whether ``answer`` matches ``gold`` under this project's rules (math_rules), in order:
    the same spelling; a relation with no left side matches nothing; numerals in a base
    compare digits and base; alternatives in one box are a list; an equation answering a gold
    that is no relation is judged by its sides (_chain_matches); ``p\\%`` also equals ``p``;
    else math-verify (_equivalent). ``parsed`` caches the parses."""
    norm_answer, norm_gold = _normalise(answer), _normalise(gold)
    if norm_answer == norm_gold:
        return True
    if math_rules.missing_left_side(norm_answer):
        return False
    based = math_rules.based_number(norm_answer), math_rules.based_number(norm_gold)
    if based[0] is not None and based[1] is not None:
        return based[0] == based[1]
    answer, gold = math_rules.alternatives(answer), math_rules.alternatives(gold)
    if not math_rules.is_relation(gold):
        chain = math_rules.relation_chain(answer)
        if chain is not None:
            return _chain_matches(chain, gold, parsed)
    if _equivalent(_parsed(gold, parsed), _parsed(answer, parsed)):
        return True
    answer_number = math_rules.without_percent(answer)
    gold_number = math_rules.without_percent(gold)
    if answer_number is not None and gold_number is None:
        return _matches_gold(answer_number, gold, parsed)
    if gold_number is not None and answer_number is None:
        return _matches_gold(answer, gold_number, parsed)
    return False


def _chain_matches(chain: list[tuple[str, str]], gold: str, parsed: dict[str, list[Any]]) -> bool:
    """An equation or chain (``x = 5``, ``6 = 5``, ``x = 13 = 12``, ``\\pi \\approx 3.14``)
    against a gold that is no relation. Empty sides are dropped (``= 5`` states 5), and so are
    sides that only name the quantity (math_rules.names_a_quantity: ``x``, ``m + n``) from the
    left (else from the right). The rest, split at each ``\\approx``, are runs of equal
    sides: every side of one run must match the gold, and the runs on either side of each
    ``\\approx`` must agree to the decimals shown (math_rules.agree)."""
    sides = [(link, side) for link, side in chain if _normalise(side)]
    named = False
    while len(sides) > 1 and math_rules.names_a_quantity(_normalise(sides[0][1])):
        sides, named = sides[1:], True
    while not named and len(sides) > 1 and math_rules.names_a_quantity(_normalise(sides[-1][1])):
        sides = sides[:-1]
    runs: list[list[str]] = []
    for k, (link, side) in enumerate(sides):
        if k == 0 or link != "=":
            runs.append([])
        runs[-1].append(math_rules.trig_in_radians(side))
    if not any(all(_matches_gold(side, gold, parsed) for side in run) for run in runs):
        return False
    for before, after in zip(runs, runs[1:]):
        a, b = _parsed(before[-1], parsed), _parsed(after[0], parsed)
        if not (a and b and limited(math_rules.agree, a[0], b[0], before[-1], after[0])):
            return False
    return True


def _why_not(answer: str, golds: list[str]) -> str | None:
    """The rule that turned ``answer`` down, for the detail, when it is one of math_rules'."""
    if math_rules.missing_left_side(_normalise(answer)):
        return "a relation with no left side states no value"
    chain = math_rules.relation_chain(math_rules.alternatives(answer))
    if (chain is not None and not math_rules.names_a_quantity(_normalise(chain[0][1]))
            and not any(math_rules.is_relation(math_rules.alternatives(g)) for g in golds)):
        return "an equation is judged by each side but a name on its left"
    return None


def _parsed(latex: str, parsed: dict[str, list[Any]]) -> list[Any]:
    """math-verify's parse of ``latex`` (_parse), once per spelling: ``parsed`` keeps them."""
    if latex not in parsed:
        parsed[latex] = _parse(latex)
    return parsed[latex]


def _score_released(response: str, ground_truth: Any, deadline: float) -> Outcome:
    r"""The released Skywork-OR1 math reward (the "skywork" profile; SkyworkAI/Skywork-OR1,
    verl/utils/reward_score/livecodebench/compute_score.py at 64e96af,
    ``math_verify_reward_function``): the text between the first ``</think>`` and the next one
    (the whole response without one) goes to math-verify's default extraction (LaTeX and plain
    expressions: "The answer is 42." counts, no ``\boxed`` needed); CORRECT when its extracted
    string is one of the golds, or when math-verify calls it equivalent to ``\boxed{gold}``
    for some gold. None of this project's fixes applies (factorial near-misses, ``\pm`` sets,
    bomb checks): the worker's hard deadline bounds the work."""
    # lazy: math-verify/sympy load in the math worker processes only (~1 s)
    from math_verify import parse, verify

    golds = _checked(response, ground_truth)
    if isinstance(golds, Outcome):
        return golds
    region = response.split("</think>")[1] if "</think>" in response else response
    try:
        parsed = limited(parse, region, cpu_s=RELEASED_CALL_S, parsing_timeout=0)
    except CallTimeout:
        return _timed_out()
    except Exception as e:  # noqa: BLE001 - the release scores any parse failure as 0
        return Outcome(Status.NO_ANSWER, f"math-verify could not parse the answer: {type(e).__name__}")
    if len(parsed) < 2:
        return Outcome(Status.NO_ANSWER, "math-verify extracted no answer after the reasoning")
    answer = parsed[1]
    if answer in golds:
        return Outcome(Status.CORRECT, _matches(answer, answer))
    for gold in golds:
        if time.monotonic() > deadline:
            return Outcome(Status.TIMEOUT, "math scoring ran past its time budget")
        try:
            gold_parsed = limited(parse, f"\\boxed{{{gold}}}", cpu_s=RELEASED_CALL_S,
                                  parsing_timeout=0)
            if limited(verify, gold_parsed, parsed, cpu_s=RELEASED_CALL_S, timeout_seconds=0):
                return Outcome(Status.CORRECT, _matches(answer, gold))
        except CallTimeout:
            return _timed_out()
        except Exception:  # noqa: BLE001 - as released: a failed comparison is no match
            continue
    return _no_match(answer, golds)


def _no_match(answer: str, golds: list[str], why: str | None = None) -> Outcome:
    note = "" if why is None else f" ({why})"
    if len(golds) == 1:
        return Outcome(
            Status.INCORRECT, f"answer {_q(answer)} does not match gold {_q(golds[0])}{note}"
        )
    listed = ", ".join(_q(g) for g in golds[:5]) + (", ..." if len(golds) > 5 else "")
    return Outcome(
        Status.INCORRECT,
        f"answer {_q(answer)} matches none of the {len(golds)} acceptable answers ({listed}){note}",
    )


def _parse(latex: str) -> list[Any]:
    """math-verify's parse of ``\\boxed{latex}`` under :func:`limited` (its own alarm off)."""
    # lazy: math-verify/sympy load in the math worker processes only (~1 s)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return limited(
        parse,
        "\\boxed{" + _DOLLAR.sub("", latex) + "}",
        extraction_config=(LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()),
        parsing_timeout=0,
    )


def _equivalent(gold: list[Any], answer: list[Any]) -> bool:
    # lazy: math-verify/sympy load in the math worker processes only (~1 s)
    from math_verify import verify

    if not gold or not answer:
        return False
    if not limited(verify, gold, answer, timeout_seconds=0):
        # an inequality against an interval, either way round (math-verify: gold side only)
        as_sets = limited(math_rules.solution_sets, gold[0], answer[0])
        return as_sets is not None and limited(verify, [as_sets[0]], [as_sets[1]],
                                               timeout_seconds=0)
    g, a = gold[0], answer[0]
    if _exact_numbers_differ(g, a):
        log.debug("math-verify matched exact numbers that differ")
        return False
    return True


def _exact_numbers_differ(gold: Any, answer: Any) -> bool:
    """True when both sides are exact closed-form numbers (no symbols, decimals or percentages)
    whose values differ, though math-verify's rounding called them equal: ``1/2004!`` vs
    ``1/2006!``. False when unsure (the math-verify verdict then stands)."""
    # lazy: math-verify/sympy load in the math worker processes only (~1 s)
    from sympy import Expr, Float, UnevaluatedExpr

    if not (isinstance(gold, Expr) and isinstance(answer, Expr)):
        return False

    def check() -> bool:
        for e in (gold, answer):
            if e.free_symbols or not e.is_number or e.has(Float) or e.has(UnevaluatedExpr):
                return False
        g, a = gold.doit(), answer.doit()
        if g.is_Rational and a.is_Rational:
            return bool(g != a)
        if g.is_zero is not None and a.is_zero is not None and g.is_zero != a.is_zero:
            return True  # 0 vs pi/2004!: one exactly zero, the other provably not
        gv, av = g.evalf(40), a.evalf(40)
        if not (gv.is_finite and av.is_finite) or gv == 0 or av == 0:
            return False
        scale = max(abs(gv), abs(av))
        return bool(abs(gv - av) > scale * 1e-20)

    try:
        return limited(check)
    except (Exception, CallTimeout):  # unsure: keep math-verify's verdict
        log.debug("exact-number check failed", exc_info=True)
        return False


# --------------------------------------------------------------------------------------------
# normalisation


_DOLLAR = re.compile(r"\\?\$")  # math delimiters, and an escaped dollar sign (currency)
_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|~|\\(?:displaystyle|textstyle|quad|qquad)(?![A-Za-z])")
_LEFT_RIGHT = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![A-Za-z])")
# (Not ``\^\s*\{?\s*\\circ``: with no brace its two ``\s*`` split one run of spaces every way,
# quadratic backtracking; a "^" and 32,000 spaces held the server's thread for 6.5 s.)
_DEGREES = re.compile(r"\^\s*(?:\{\s*)?\\circ\s*\}?|°|\\degree(?![A-Za-z])")
_FRAC = re.compile(r"\\[dt]frac(?![A-Za-z])")
_WS_BETWEEN_WORDS = re.compile(r"(?<=\w)\s+(?=\w)")
_WS = re.compile(r"\s+")


def _normalise(s: str) -> str:
    """A canonical spelling for string comparison: spacing, ``\\left``/``\\right``, ``$``,
    ``\\dfrac``, degree marks and a final period dropped. Never merges different answers."""
    s = _DOLLAR.sub("", s)
    s = _SPACING.sub(" ", s)
    s = _LEFT_RIGHT.sub("", s)
    s = _DEGREES.sub("", s)
    s = _FRAC.sub(r"\\frac", s)
    s = _WS_BETWEEN_WORDS.sub("\x00", s.strip())  # "\\pi r" keeps one space, "( 1" none
    s = _WS.sub("", s).replace("\x00", " ")
    s = s.rstrip(".").strip()
    return s


def _unwrap_boxes(s: str) -> str:
    """``\\boxed{\\boxed{5}}`` -> ``5``: a box whose whole content is another box."""
    for _ in range(8):
        m = re.fullmatch(r"\s*\\(?:boxed|fbox)\s*\{(.*)\}\s*", s, re.DOTALL)
        if m is None or extract.last_boxed(s) != m.group(1):
            return s
        s = m.group(1)
    return s


def _q(s: str) -> str:
    s = _WS.sub(" ", s.strip())
    if len(s) > _DETAIL_CHARS:
        s = s[: _DETAIL_CHARS - 3] + "..."
    return "'" + s + "'"


def _matches(answer: str, gold: str) -> str:
    return f"answer {_q(answer)} matches gold {_q(gold)}"


# --------------------------------------------------------------------------------------------
# expression bombs


def _too_big(latex: str) -> str | None:
    """Why ``latex`` must not reach sympy (too long, too deeply nested, or asking for a huge
    exact number), or None. Linear in the length; never raises."""
    if len(latex) > MAX_ANSWER_CHARS:
        return f"{len(latex)} characters, over the cap of {MAX_ANSWER_CHARS}"
    depth = peak = 0
    for c in latex:
        if c in "([{":
            depth += 1
            peak = max(peak, depth)
        elif c in ")]}":
            depth = max(depth - 1, 0)
    if peak > MAX_NESTING:
        return f"brackets nested {peak} deep, over the cap of {MAX_NESTING}"
    try:
        digits = math_bombs.Magnitude(_normalise(latex)).peak_digits()
    except math_bombs.TooDeep:
        return f"expression nested more than {math_bombs.MAX_RECURSION} levels deep"
    if digits > MAX_EXACT_DIGITS:
        shown = "an unbounded number of" if math.isinf(digits) else f"about {digits:.3g}"
        return f"it asks for an exact number with {shown} digits (cap {MAX_EXACT_DIGITS})"
    return None
