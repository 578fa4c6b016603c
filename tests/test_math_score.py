"""The math scorer (docs/verifier.md 1): extraction, equivalence, its chosen rules, bad input, bombs."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import math_verify
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verifier.scoring import math_score
from verifier.items import Limits, Status
from verifier.scoring.math_score import MAX_ANSWER_CHARS, score_math

C, I, N, X = Status.CORRECT, Status.INCORRECT, Status.NO_ANSWER, Status.INVALID_INPUT
LIMITS = Limits()
EVAL_DATA = Path(__file__).resolve().parents[1] / "datasets" / "eval"


def box(answer: str) -> str:
    return f"<think>some reasoning</think>The answer is $\\boxed{{{answer}}}$."


# (id, response, ground truth, expected status)
TABLE: list[tuple[str, str, Any, Status]] = [
    # plain integers, signs, near misses
    ("int", box("5"), "5", C),
    ("int-wrong", box("3"), "5", I),
    ("sign", box("-3"), "3", I),
    ("sign-rev", box("3"), "-3", I),
    ("near-decimal", box("2.0001"), "2", I),
    ("int-as-float", box("2.0"), "2", C),
    ("pi-vs-3.14", box("3.14"), "\\pi", I),
    ("pi-vs-pi", box("\\pi"), "\\pi", C),
    # leading zeros (AIME golds are written 025)
    ("lead-zero-answer", box("007"), "7", C),
    ("lead-zero-gold", box("25"), "025", C),
    ("lead-zero-both", box("073"), "073", C),
    ("lead-zero-wrong", box("026"), "025", I),
    # fractions and decimals
    ("frac-slash", box("1/2"), "0.5", C),
    ("frac-short", box("\\frac12"), "0.5", C),
    ("dfrac", box("\\dfrac{1}{2}"), "\\frac{1}{2}", C),
    ("tfrac", box("\\tfrac{1}{2}"), "1/2", C),
    ("decimal-vs-frac", box("0.5"), "\\frac{1}{2}", C),
    ("frac-wrong", box("\\frac{1}{3}"), "0.5", I),
    ("third-rounded", box("0.333333"), "\\frac{1}{3}", C),
    ("third-short", box("0.33"), "\\frac{1}{3}", I),
    # radicals
    ("radical", box("2\\sqrt{2}"), "\\sqrt{8}", C),
    ("radical-rev", box("\\sqrt{8}"), "2\\sqrt{2}", C),
    ("radical-wrong", box("2\\sqrt{3}"), "\\sqrt{8}", I),
    ("radical-frac", box("\\frac{\\sqrt{2}}{2}"), "\\frac{1}{\\sqrt{2}}", C),
    # factorials: the known weak spot of plain math-verify
    ("fact-near-miss", box("\\frac{1}{2006!}"), "\\frac{1}{2004!}", I),
    ("fact-near-miss-rev", box("\\frac{1}{2004!}"), "\\frac{1}{2006!}", I),
    ("fact-equal", box("\\frac{1}{2004!}"), "\\frac{1}{2004!}", C),
    ("fact-equal-spaced", box("\\frac{1}{2004 !}"), "\\frac{1}{2004!}", C),
    ("fact-pi-near-miss", box("\\frac{\\pi}{2006!}"), "\\frac{\\pi}{2004!}", I),
    ("tiny-near-miss", box("2\\cdot 10^{-20}"), "10^{-20}", I),
    ("tiny-vs-zero", box("0"), "\\frac{\\pi}{2004!}", I),
    ("tiny-rational-vs-zero", box("0"), "\\frac{1}{2004!}", I),
    ("fact-value", box("3628800"), "10!", C),
    ("fact-value-rev", box("10!"), "3628800", C),
    ("fact-value-wrong", box("3628801"), "10!", I),
    # legitimately big golds
    ("pow-big", box("1267650600228229401496703205376"), "2^{100}", C),
    ("pow-big-off-by-one", box("1267650600228229401496703205377"), "2^{100}", I),
    ("pow-big-same", box("2^{100}"), "2^{100}", C),
    ("pow-tower-small", box("2^{2^{2^{2}}}"), "65536", C),
    # \pm: a set of both signs
    ("pm-list", box("2, -2"), "\\pm 2", C),
    ("pm-list-rev", box("-2, 2"), "\\pm 2", C),
    ("pm-nospace", box("\\pm2"), "\\pm 2", C),
    ("pm-gold-list", box("\\pm 2"), "2,-2", C),
    ("pm-one-root", box("2"), "\\pm 2", I),
    ("pm-extra-root", box("\\pm 2"), "2", I),
    ("pm-expr", box("1 \\pm \\sqrt{2}"), "1+\\sqrt{2}, 1-\\sqrt{2}", C),
    ("pm-wrong", box("\\pm 3"), "\\pm 2", I),
    # several boxes: the last one counts
    ("boxes-last-right", "\\boxed{3} no wait \\boxed{5}", "5", C),
    ("boxes-last-wrong", "\\boxed{5} no wait \\boxed{3}", "5", I),
    ("boxes-not-a-set", "\\boxed{2} and \\boxed{-2}", "\\pm 2", I),
    ("box-nested", "\\boxed{\\boxed{5}}", "5", C),
    ("fbox", "\\fbox{5}", "5", C),
    # intervals, tuples, sets
    ("interval-closed", box("[1,2]"), "[1, 2]", C),
    ("interval-half-open", box("(1, 2]"), "[1,2]", I),
    ("interval-open-vs-closed", box("(1,2)"), "[1,2]", I),
    ("interval-inf", box("(-\\infty, 3)"), "(-\\infty,3)", C),
    ("interval-union", box("(-\\infty,1)\\cup(2,\\infty)"), "(-\\infty, 1) \\cup (2, \\infty)", C),
    ("tuple", box("(1, 2)"), "(1,2)", C),
    ("tuple-order", box("(2,1)"), "(1,2)", I),
    ("tuple-frac", box("\\left(\\frac{1}{2}, 3\\right)"), "(0.5, 3)", C),
    ("set-order", box("\\{2,1\\}"), "\\{1,2\\}", C),
    ("set-wrong", box("\\{1,3\\}"), "\\{1,2\\}", I),
    ("list-order", box("3, 1, 2"), "1, 2, 3", C),
    # matrices
    ("matrix", box("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"), "\\begin{pmatrix}1 & 2\\\\ 3 & 4\\end{pmatrix}", C),
    ("matrix-bmatrix", box("\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}"), "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", C),
    ("matrix-wrong", box("\\begin{pmatrix}1&2\\\\3&5\\end{pmatrix}"), "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", I),
    # complex numbers
    ("complex", box("1+2i"), "1+2i", C),
    ("complex-order", box("2i+1"), "1+2i", C),
    ("complex-conj", box("1-2i"), "1+2i", I),
    # percent: p% matches p and p/100
    ("pct-vs-number", box("50\\%"), "50", C),
    ("pct-gold", box("50"), "50\\%", C),
    ("pct-vs-fraction", box("50\\%"), "0.5", C),
    ("pct-wrong", box("40\\%"), "50", I),
    # degrees: dropped, no radian conversion
    ("deg", box("30^\\circ"), "30", C),
    ("deg-braced", box("30^{\\circ}"), "30", C),
    ("deg-gold", box("336"), "336^\\circ", C),
    ("deg-wrong", box("31^\\circ"), "30", I),
    ("deg-vs-radian", box("\\frac{\\pi}{6}"), "30^\\circ", I),
    # equations
    ("eq-answer", box("x = 5"), "5", C),
    ("eq-gold", box("5"), "x=5", C),
    ("eq-both", box("x=5"), "x = 5", C),
    ("eq-other-var", box("y=5"), "x=5", I),
    ("eq-wrong-rhs", box("x = 6"), "5", I),
    # units in \text
    ("unit-cm", box("5\\text{ cm}"), "5", C),
    ("unit-mbox", box("5 \\mbox{cm}"), "5", C),
    ("unit-wrong", box("6\\text{ cm}"), "5", I),
    ("text-answer", box("\\text{(B)}"), "B", C),
    # symbolic
    ("poly", box("x^2+2x+1"), "(x+1)^2", C),
    ("poly-wrong", box("x^2+1"), "(x+1)^2", I),
    ("dollars-inside", "\\boxed{$\\frac{3}{4}$}", "0.75", C),
    ("currency", box("\\$5"), "5", C),
    ("currency-wrong", box("\\$6"), "5", I),
    # think handling
    ("think-unclosed", "<think>so it is \\boxed{5} and then", "5", N),
    ("think-inside-only", "<think>it is \\boxed{5}</think> I am done.", "5", N),
    ("think-after-wins", "<think>maybe \\boxed{4}</think> so \\boxed{5}", "5", C),
    ("think-after-wrong", "<think>maybe \\boxed{5}</think> so \\boxed{4}", "5", I),
    ("think-reopened", "<think>a</think> \\boxed{5} <think> more", "5", N),
    ("no-tags", "We get \\boxed{5}.", "5", C),
    # no box: no answer (no fallback to the last number)
    ("no-box", "<think>r</think>The answer is 5.", "5", N),
    ("empty-box", box(""), "5", N),
    ("unclosed-box", "<think>r</think>\\boxed{5", "5", N),
    ("empty-response", "", "5", N),
    # lists of acceptable answers
    ("list-second", box("\\frac{1}{2}"), ["1", "0.5"], C),
    ("list-none", box("3"), ["1", "2"], I),
    ("list-json", box("3"), '["3", "three"]', C),
    ("list-json-wrong", box("4"), '["3"]', I),
    ("gold-int", box("42"), 42, C),
    ("gold-int-wrong", box("41"), 42, I),
    ("gold-float", box("\\frac{1}{2}"), 0.5, C),
    ("gold-tiny-float", box("10^{-7}"), 1e-07, C),
    ("gold-list-ints", box("7"), [6, 7], C),
    ("gold-boxed", box("9"), "\\boxed{9}", C),
    ("gold-interval-string", box("[1, 2]"), "[1, 2]", C),  # stays an interval, not a JSON list
]


@pytest.mark.parametrize("response, gold, expected", [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_score_table(response: str, gold: Any, expected: Status) -> None:
    out = score_math(response, gold, LIMITS)
    assert out.status is expected, out.detail
    assert out.detail


def test_table_is_broad() -> None:
    assert len(TABLE) >= 80
    assert len({row[0] for row in TABLE}) == len(TABLE)


@pytest.mark.parametrize(
    "gold, needle",
    [
        ({"answer": "3"}, "object"),
        ('{"answer": "3"}', "object"),
        ([["3"]], "nested list"),
        ([], "empty list"),
        ("[]", "empty list"),
        ("", "empty answer"),
        ("   ", "empty answer"),
        (["3", ""], "ground_truth[1] is an empty answer"),
        (True, "boolean"),
        ([True], "boolean"),
        (None, "NoneType"),
        (float("nan"), "finite"),
        (["1"] * (math_score.MAX_GOLD_ANSWERS + 1), "over the cap"),
        ("1" * (math_score.MAX_GOLD_CHARS + 1), "over the cap"),
    ],
)
def test_invalid_ground_truth(gold: Any, needle: str) -> None:
    out = score_math(box("3"), gold, LIMITS)
    assert out.status is Status.INVALID_INPUT
    assert needle in out.detail


def test_invalid_response_type() -> None:
    out = score_math(None, "3", LIMITS)  # type: ignore[arg-type]
    assert out.status is Status.INVALID_INPUT
    assert "response" in out.detail


def test_details_name_answer_and_gold() -> None:
    assert score_math(box("1/2"), "0.5", LIMITS).detail == "answer '1/2' matches gold '0.5'"
    assert score_math(box("3"), "5", LIMITS).detail == "answer '3' does not match gold '5'"
    several = score_math(box("3"), ["1", "2"], LIMITS).detail
    assert "none of the 2 acceptable answers" in several and "'1'" in several
    assert "never closed" in score_math("<think>x", "1", LIMITS).detail
    assert "no \\boxed" in score_math("5", "5", LIMITS).detail
    assert "cut off" in score_math("\\boxed{5", "5", LIMITS).detail


def test_long_details_are_truncated() -> None:
    detail = score_math(box("x+" * 200 + "1"), "1", LIMITS).detail
    assert len(detail) < 200


BOMBS = [
    ("tower", "9^{9^{9^{9}}}"),
    ("tower-flat", "9^9^9^9"),
    ("factorial", "(10^8)!"),
    ("factorial-braced", "{10^{8}}!"),
    ("factorial-left-right", "\\left(10^{8}\\right)!"),
    ("factorial-of-factorial", "100!!!"),
    ("big-exponent-literal", "2^{123456789012345678901234567890}"),
    ("binomial", "\\binom{10^{10^{10}}}{10^{10}}"),
    ("tiny", "\\frac{1}{10^{10^{10}}}"),
    ("inside-function", "\\sin\\left(9^{9^{9^{9}}}\\right)"),
    ("exp", "\\exp{10^{100}}"),
    ("nested-parens", "(" * 3000 + "1" + ")" * 3000),
    ("nested-parens-short", "(" * 400 + "1" + ")" * 400),
    ("nested-unclosed", "((((" * 2000),
    ("nested-braces", "{" * 30 + "1" + "}" * 30),
    ("nested-sqrt", "\\sqrt" * 300 + "{2}"),
    ("long", "1" * 50_000),
    ("long-expr", "+".join(["x"] * 25_000)),
]


@pytest.mark.parametrize("answer", [b[1] for b in BOMBS], ids=[b[0] for b in BOMBS])
def test_bombs_are_refused_quickly(answer: str) -> None:
    start = time.monotonic()
    out = score_math(box(answer), "1", LIMITS)
    elapsed = time.monotonic() - start
    assert out.status is Status.INCORRECT
    assert out.detail.startswith("answer too large to evaluate"), out.detail
    assert elapsed < 2.0


@pytest.mark.parametrize("answer", [b[1] for b in BOMBS], ids=[b[0] for b in BOMBS])
def test_bomb_identical_to_gold_is_correct(answer: str) -> None:
    start = time.monotonic()
    out = score_math(box(answer), answer, LIMITS)
    assert out.status is Status.CORRECT
    assert time.monotonic() - start < 2.0


def test_bomb_matches_gold_after_normalisation_only() -> None:
    gold = "9^{9^{9^{9}}}"
    assert score_math(box("9^{ 9^{9^{9}}}"), gold, LIMITS).status is Status.CORRECT
    assert score_math(box("9^{9^{9^{8}}}"), gold, LIMITS).status is Status.INCORRECT


def test_answer_cap_constant_applies() -> None:
    just_under = "0+" * ((MAX_ANSWER_CHARS - 1) // 2) + "1"
    assert len(just_under) <= MAX_ANSWER_CHARS
    assert math_score._too_big(just_under) is None
    assert "over the cap" in (math_score._too_big("1" * (MAX_ANSWER_CHARS + 1)) or "")


@pytest.mark.parametrize(
    "latex",
    ["2^{100}", "10!", "\\frac{1}{2004!}", "2^{10000}", "\\binom{100}{50}", "x^{x^{x}}",
     "(x+1)^{100}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "10^{-20}", "\\left(\\frac{1}{2}\\right)"],
)
def test_legitimately_big_answers_reach_sympy(latex: str) -> None:
    assert math_score._too_big(latex) is None


def test_verdicts_are_deterministic() -> None:
    rows = [(r[1], r[2]) for r in TABLE[::7]]
    first = [score_math(resp, gold, LIMITS) for resp, gold in rows]
    second = [score_math(resp, gold, LIMITS) for resp, gold in rows]
    assert first == second


def test_works_off_the_main_thread() -> None:
    # math-verify's SIGALRM timeouts only work on the main thread; off it they are turned off
    results: list[Status] = []
    t = threading.Thread(
        target=lambda: results.extend(
            score_math(box(a), g, LIMITS).status for a, g in [("1/2", "0.5"), ("3", "5")]
        )
    )
    t.start()
    t.join(30)
    assert results == [Status.CORRECT, Status.INCORRECT]


def test_soft_time_budget_gives_timeout() -> None:
    out = score_math(box("1/2"), "0.5", Limits(timeout_s=1e-9))
    assert out.status is Status.TIMEOUT
    # a string-identical answer needs no sympy and is judged regardless
    assert score_math(box("0.5"), "0.5", Limits(timeout_s=1e-9)).status is Status.CORRECT


def test_warm_up_runs() -> None:
    math_score.warm_up()
    start = time.monotonic()
    assert score_math(box("\\frac{2}{4}"), "0.5", LIMITS).status is Status.CORRECT
    assert time.monotonic() - start < 2.0


def _aime_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in ("aime24", "aime25"):
        rows.extend(pq.read_table(EVAL_DATA / f"{name}.parquet").to_pylist())
    return rows


def test_real_aime_golds() -> None:
    rows = _aime_rows()
    assert len(rows) == 60
    for row in rows:
        gold = row["reward_model"]["ground_truth"]
        digits = "".join(ch for ch in gold if ch.isdigit())
        off_by_one = str(int(digits) + 1)
        right = score_math(f"<think>...</think>\\boxed{{{gold}}}", gold, LIMITS)
        plain = score_math(f"<think>...</think>\\boxed{{{int(digits)}}}", gold, LIMITS)
        wrong = score_math(f"<think>...</think>\\boxed{{{off_by_one}}}", gold, LIMITS)
        assert right.status is Status.CORRECT, (gold, right.detail)
        assert plain.status is Status.CORRECT, (gold, plain.detail)  # 025 vs 25, 336^\circ vs 336
        assert wrong.status is Status.INCORRECT, (gold, wrong.detail)
    # golds as Skywork-OR1-RL-Data stores them: a JSON list in a string
    gold = json.dumps([rows[0]["reward_model"]["ground_truth"]])
    assert score_math("\\boxed{" + rows[0]["reward_model"]["ground_truth"] + "}", gold, LIMITS).correct


def test_bomb_gold_is_only_compared_as_a_string() -> None:
    bomb = "9^{9^{9^{9}}}"
    start = time.monotonic()
    assert score_math(box("5"), bomb, LIMITS).status is Status.INCORRECT
    assert score_math(box(bomb), bomb, LIMITS).status is Status.CORRECT
    # the other acceptable answers are still judged by sympy
    assert score_math(box("\\frac{10}{2}"), [bomb, "5"], LIMITS).status is Status.CORRECT
    assert time.monotonic() - start < 2.0


def test_scoring_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    for _, response, gold, _ in TABLE[::5]:
        score_math(response, gold, LIMITS)
    assert capsys.readouterr() == ("", "")


_PIECES = ["1", "2", "0", "x", "^", "_", "!", "{", "}", "(", ")", "[", "]", "\\{", "\\}", "\\frac",
           "\\sqrt", "\\pm", "+", "-", "/", ",", "=", "\\cdot", "\\pi", "i", "\\infty", "\\%",
           "^\\circ", "\\left(", "\\right)", "&", "\\\\", "\\begin{pmatrix}", "\\end{pmatrix}", "|",
           ".", "\\text{cm}", " ", "\\boxed{", "$", "<think>", "</think>"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    answer=st.lists(st.sampled_from(_PIECES), max_size=20).map("".join),
    gold=st.lists(st.sampled_from(_PIECES[:30]), min_size=1, max_size=6).map("".join),
)
def test_never_raises_and_is_repeatable(answer: str, gold: str) -> None:
    response = "<think>r</think>\\boxed{" + answer + "}"
    first = score_math(response, gold, LIMITS)
    assert first.status in {Status.CORRECT, Status.INCORRECT, Status.NO_ANSWER, Status.INVALID_INPUT}
    assert first.detail
    assert score_math(response, gold, LIMITS).status is first.status


@pytest.mark.parametrize("response, gold", [
    (r"\boxed{97}", "97"), (r"\boxed{96}", "97"), (r"\boxed{007}", "7"), (r"\boxed{+5}", "5"),
    (r"\boxed{-3}", "3"), (r"\boxed{-0}", "0"), (r"\boxed{ 42 }", ["41", "42"]), (r"$\boxed{12}$", "012"),
    (r"\boxed{5}", '["6", "7"]'), (r"\boxed{10}", 10), ("<think>x</think> \\boxed{8}", "8"),
    ("<think>never closed \\boxed{5}", "5"), ("no box at all", "5"), (r"\boxed{}", "5"),
    (r"\boxed{5}", ""), (r"\boxed{5}", {"a": 1}),
    # plain rationals, and an answer spelled like one of the golds
    (r"\boxed{\frac{2}{4}}", r"\frac{1}{2}"), (r"\boxed{3/4}", r"\dfrac{3}{4}"),
    (r"\boxed{-\frac{1}{3}}", r"\frac{1}{3}"), (r"\boxed{6}", r"\frac{12}{2}"),
    (r"\boxed{5}", '["5", "x=5"]'), (r"\boxed{\sqrt{2}}", r"\sqrt{2}"),
])
def test_quick_verdict_agrees_with_score_math(response, gold) -> None:
    """The service judges these inline (no worker): the verdict must be score_math's."""
    from verifier.scoring.math_score import quick_verdict

    quick = quick_verdict(response, gold)
    assert quick is not None
    full = score_math(response, gold, Limits())
    assert (quick.status, quick.detail) == (full.status, full.detail)


@pytest.mark.parametrize("response, gold", [
    (r"\boxed{\frac{1}{2}}", "0.5"), (r"\boxed{5}", "5.0"), (r"\boxed{5}", '["6", "x=5"]'),
    (r"\boxed{1" + "0" * 300 + "}", "1"), (r"\boxed{50\%}", "50"),
])
def test_quick_verdict_leaves_the_rest_to_the_full_rules(response, gold) -> None:
    from verifier.scoring.math_score import quick_verdict

    assert quick_verdict(response, gold) is None


# -- per-call budgets are CPU time, not wall-clock time ----------------------------------------

def test_the_call_budget_counts_cpu_not_waiting() -> None:
    """A call that waits (a loaded machine: the process is not scheduled) keeps its budget; one
    that computes past it is stopped."""
    assert math_score.limited(time.sleep, math_score.CALL_TIMEOUT_S * 1.5) is None

    def spin() -> None:
        while True:
            pass

    with pytest.raises(math_score.CallTimeout):
        math_score.limited(spin)


def test_a_call_out_of_cpu_is_a_timeout_never_a_silent_incorrect(monkeypatch) -> None:
    """math-verify reads its own alarm as "no parse"/"not equal"; a right answer must not come
    back INCORRECT because a call ran out of time (it did, under load, for ``x = 936``).

    The parse is made slow on purpose (0.3 s of CPU, then the real one): a real parse of
    ``x = 936`` takes a few milliseconds, within one tick of the kernel's CPU accounting, so a
    budget of 1 us fired only when a tick landed inside it (a clean-clone run under load got
    CORRECT). 0.3 s of CPU against a 0.05 s budget fires every time. (``x = 936`` itself no
    longer reaches the parser: its right side is spelled like the gold; ``x = \\frac{1872}{2}``
    does.)"""
    real_parse = math_verify.parse

    def slow_parse(*args: Any, **kwargs: Any) -> Any:
        t0 = time.process_time()
        while time.process_time() - t0 < 0.3:
            pass
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(math_verify, "parse", slow_parse)
    monkeypatch.setattr(math_score, "CALL_TIMEOUT_S", 0.05)
    outcome = score_math(box("x = \\frac{1872}{2}"), "936", LIMITS)
    assert outcome.status is Status.TIMEOUT, outcome
    assert "CPU" in outcome.detail
    monkeypatch.undo()
    assert score_math(box("x = \\frac{1872}{2}"), "936", LIMITS).status is Status.CORRECT


def _rational_spellings(rng: random.Random, num: int, den: int) -> str:
    """One spelling of num/den (den > 0) that the plain-rational fast path reads: an integer
    when it is one, else \\frac, \\dfrac or a/b, scaled or not, with a sign and spacing."""
    k = rng.choice([1, 1, 2, 3, 10, 7])
    n, d = abs(num) * k, den * k
    sign = "-" if num < 0 else rng.choice(["", "", "+"])
    if d == 1 or (n % d == 0 and rng.random() < 0.5):
        body = str(n // d).zfill(rng.choice([1, 1, 3]))
    else:
        body = rng.choice([f"\\frac{{{n}}}{{{d}}}", f"\\dfrac{{{n}}}{{{d}}}",
                           f"\\frac{{ {n} }}{{{d}}}", f"{n}/{d}", f"\\tfrac{{{n}}}{{{d}}}"])
    return sign + rng.choice(["", " "]) + body


def _rational_pairs(n: int, seed: int) -> list[tuple[str, list[str]]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        den = rng.choice([1, 2, 3, 4, 6, 7, 12, 25, 99, 1000, rng.randint(1, 10**6)])
        num = rng.randint(-200, 200) if rng.random() < 0.7 else rng.randint(-10**9, 10**9)
        golds = [_rational_spellings(rng, num, den)]
        r = rng.random()
        if r < 0.4:  # the same value, spelled differently
            a_num, a_den = num, den
        elif r < 0.55:  # equal after math-verify's 6-decimal rounding, yet different
            a_num, a_den = num * 10**7 + rng.choice([-1, 1]), den * 10**7
        elif r < 0.7:  # the sign flipped, or off by one
            a_num, a_den = (-num, den) if num else (1, den)
        else:
            a_num, a_den = rng.randint(-300, 300), rng.choice([1, 2, 3, 5, 8, den])
        answer = _rational_spellings(rng, a_num, a_den)
        if rng.random() < 0.15:  # several acceptable answers
            golds.append(_rational_spellings(rng, rng.randint(-50, 50), rng.choice([1, 3, 9])))
            rng.shuffle(golds)
        pairs.append((answer, golds))
    return pairs


def test_plain_rational_fast_path_is_math_verifys_verdict() -> None:
    """The plain-rational fast path (judged inline by the service, no worker round trip) gives
    exactly the status and detail of the full path (math-verify over sympy, then the exact-
    number check) on a large generated set: equal values spelled differently, values equal at
    math-verify's 6 decimals but different, signs, several golds."""
    from verifier.scoring.math_score import _judge, _plain_verdict

    pairs = _rational_pairs(1500, seed=15)
    fast_hits = 0
    for answer, golds in pairs:
        fast = _plain_verdict(answer, golds)
        assert fast is not None, (answer, golds)
        if math_score._integer_verdict(answer, golds) is None:
            fast_hits += 1
        full = _judge(answer, golds, time.monotonic() + 60)
        assert (fast.status, fast.detail) == (full.status, full.detail), (answer, golds)
    statuses = {(_plain_verdict(a, g).status) for a, g in pairs}
    assert statuses == {Status.CORRECT, Status.INCORRECT}
    assert fast_hits > 1000  # most pairs exercise the fraction path, not the integer one


@pytest.mark.parametrize("answer, gold", [
    (r"\frac{1}{0}", "5"), (r"\frac{1}{2}", r"\frac{x}{2}"), (r"\frac{-1}{2}", r"\frac{1}{2}"),
    (r"0.5", r"\frac{1}{2}"), (r"\frac12", r"\frac{1}{2}"), ("1" + "0" * 40 + "/3", "1/3"),
    (r"\frac{1}{2}\%", r"\frac{1}{2}"), (r"\sqrt{4}", "2"),
])
def test_plain_rational_fast_path_leaves_the_rest_to_math_verify(answer, gold) -> None:
    from verifier.scoring.math_score import _plain_verdict

    assert _plain_verdict(answer, [gold]) is None
