"""The default profile's math classes (docs/verifier.md 1, verifier/scoring/math_rules.py):
hedged answers, false relations, relation symbols with no left side, hidden LaTeX, base
subscripts, decimal percentages, intervals against inequalities. One table per class, both
directions and the near misses that stay wrong.

Each row also holds the ``skywork`` profile's verdict, recorded by running the code as it was
before these rules (the released Skywork-OR1 reward's verdict): that profile must not move.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from verifier.scoring import extract, math_rules
from verifier.items import Limits, Status
from verifier.scoring.math_score import quick_verdict, score_math
from verifier.scoring.profiles import PROFILE_TABLE

C, I, N = Status.CORRECT, Status.INCORRECT, Status.NO_ANSWER
DEFAULT, SKYWORK = PROFILE_TABLE["default"], PROFILE_TABLE["skywork"]
LIMITS = Limits()
THINK = "<think>some reasoning</think>"

Row = tuple[str, str, Any, Status, Status]
"""(id, response, ground truth, verdict under default, verdict under skywork)"""


def box(answer: str) -> str:
    return f"{THINK}The answer is $\\boxed{{{answer}}}$."


# Hedges: several different final answers after the reasoning are wrong whatever their order;
# a box retracted before the final one is self-correction. Inside one box, alternatives
# (\lor, \vee, or) are a list.
HEDGES: list[Row] = [
    ("two-boxes-last-right", THINK + r"The answer is $\boxed{6}$ or $\boxed{5}$.", "5", I, I),
    ("two-boxes-first-right", THINK + r"The answer is $\boxed{5}$ or $\boxed{6}$.", "5", I, I),
    ("three-boxes", THINK + r"Either $\boxed{5}$, $\boxed{6}$ or $\boxed{7}$.", "7", I, I),
    ("same-value-twice",
     THINK + r"We get $\boxed{\frac{1}{2}}$, that is $\boxed{0.5}$.",
     "0.5", C, C),
    ("same-box-repeated",
     THINK + 'So $\\boxed{5}$.\n\n**Final Answer**\n\\[\\boxed{5}\\]',
     "5", C, C),
    ("retracted-wait",
     THINK + r"I got $\boxed{6}$, but wait, that's wrong. Redoing it: $\boxed{5}$.",
     "5", C, C),
    ("retracted-mistake",
     THINK + r"So $\boxed{6}$. That was a mistake: the answer is $\boxed{5}$.",
     "5", C, C),
    ("retracted-actually",
     THINK + r"So $\boxed{6}$. Actually, the answer is $\boxed{5}$.",
     "5", C, C),
    ("retracted-no-wait", r"\boxed{3} no wait \boxed{5}", "5", C, I),
    ("retraction-then-hedge",
     THINK + r"First $\boxed{4}$. Wait, recomputing: $\boxed{6}$ or $\boxed{5}$.",
     "5", I, I),
    ("retracted-to-wrong", THINK + r"So $\boxed{5}$. Wait, actually it is $\boxed{6}$.", "5", I, I),
    ("think-boxes-not-counted", r"<think>maybe \boxed{6}</think> so \boxed{5}", "5", C, C),
    ("items-of-the-answer",
     THINK + r"$x = \boxed{2}$ and $y = \boxed{3}$, so $(x, y) = \boxed{(2, 3)}$.",
     "(2, 3)", C, C),
    ("two-roots-two-boxes", THINK + r"$\boxed{2}$ or $\boxed{-2}$", "2, -2", I, C),
    ("lor-last-right", box(r"x=13 \lor x=29"), "29", I, C),
    ("lor-first-right", box(r"x=29 \lor x=13"), "29", I, I),
    ("vee", box(r"13 \vee 29"), "29", I, C),
    ("or-word", box("13 or 29"), "29", I, I),
    ("text-or", box(r"13 \text{ or } 29"), "29", I, I),
    ("comma-list", box("13, 29"), "29", I, I),
    ("lor-is-a-list", box(r"x=13 \lor x=29"), "13, 29", C, I),
    ("or-is-a-set", box(r"13 \text{ or } 29"), r"\{13, 29\}", C, C),
    ("lor-missing-a-root", box(r"x=13 \lor x=29"), "13, 29, 31", I, I),
]


# False relations: an equation answering a gold that is not one is judged by each side, but
# a left side that only names the quantity (x, m + n, f(2), a_{10}, AB).
FALSE_RELATIONS: list[Row] = [
    ("number-equals-number", box("6 = 5"), "5", I, C),
    ("expression-left", box("x + 1 = 5"), "5", I, C),
    ("coefficient-left", box("2x = 10"), "10", I, C),
    ("power-left", box("x^2 = 4"), "4", I, C),
    ("chain-disagrees-last", box("x = 13 = 12"), "12", I, C),
    ("chain-disagrees-first", box("x = 13 = 12"), "13", I, I),
    ("numbers-reversed", box("29 = 13"), "13", I, C),
    ("numbers-reversed-left", box("29 = 13"), "29", I, I),
    ("approx-disagrees-right", box(r"13 \approx 29"), "29", I, I),
    ("approx-disagrees-left", box(r"13 \approx 29"), "13", I, C),
    ("lone-variable", box("x = 5"), "5", C, C),
    ("lone-variable-fraction", box(r"x = \frac{1}{2}"), "0.5", C, C),
    ("lone-variable-wrong", box("x = 6"), "5", I, I),
    ("asked-sum", box("m + n = 33"), "33", C, C),
    ("asked-sum-wrong", box("m + n = 34"), "33", I, I),
    ("subscripted-name", box("a_{10} = 19"), "19", C, C),
    ("function-value", box("f(2) = 5"), "5", C, C),
    ("segment", box("AB = 5"), "5", C, C),
    ("name-on-the-right", box("5 = x"), "5", C, I),
    ("chain-agrees", box(r"x = \frac{10}{2} = 5"), "5", C, C),
    ("true-numeric-equation", box("2^{10} = 1024"), "1024", C, C),
    ("degrees-in-trig", box(r"\sin 30^\circ = \frac{1}{2}"), r"\frac{1}{2}", C, C),
    ("approx-agrees-decimal-gold", box(r"\pi \approx 3.14"), "3.14", C, I),
    ("approx-agrees-exact-gold", box(r"\pi \approx 3.14"), r"\pi", C, C),
    ("approx-lone-variable", box(r"x \approx 3.14"), "3.14", C, C),
    ("expression-answer", box("y = 2x + 1"), "2x+1", C, C),
    ("gold-is-equation", box("5"), "x=5", C, C),
    ("both-same-equation", box("x + 1 = 5"), "x+1=5", C, C),
]


# A relation symbol with no left side states no value (= and \approx state the value).
NO_LEFT_SIDE: list[Row] = [
    ("neq", box(r"\neq 9"), "9", I, C),
    ("ne", box(r"\ne 5"), "5", I, C),
    ("not-equals", box(r"\not= 5"), "5", I, C),
    ("less-than", box("< 5"), "5", I, C),
    ("geq", box(r"\geq 2"), "2", I, C),
    ("equals-states-value", box("= 5"), "5", C, C),
    ("approx-states-value", box(r"\approx 5"), "5", C, C),
    ("with-left-side", box(r"x \neq 9"), "9", I, I),
    ("same-spelling", box(r"\neq 9"), r"\neq 9", C, C),
]


# Hidden LaTeX: judged by what renders (phantoms, % comments, \iffalse, macros).
HIDDEN_LATEX: list[Row] = [
    ("phantom-only", box(r"\phantom{5}"), "5", N, C),
    ("hphantom-only", box(r"\hphantom{5}"), "5", N, N),
    ("phantom-hides-gold", box(r"6\phantom{5}"), "5", I, I),
    ("phantom-visible-part", box(r"6\phantom{5}"), "6", C, I),
    ("phantom-before", box(r"\phantom{6}5"), "5", C, I),
    ("vphantom-strut", box(r"\vphantom{5}6"), "6", C, N),
    ("percent-after-number-in-box", THINK + r"The answer is $\boxed{6 % 5}$.", "5", I, I),
    ("comment-inside-box", THINK + '$\\boxed{\\frac{12}{2} % 5\n}$', "5", I, C),
    ("comment-inside-box-visible", THINK + '$\\boxed{\\frac{12}{2} % 5\n}$', "6", C, I),
    ("comment-hides-last-box", THINK + r"The answer is $\boxed{6}$ % \boxed{5}", "5", I, I),
    ("comment-visible-box", THINK + r"The answer is $\boxed{6}$ % \boxed{5}", "6", C, I),
    ("comment-joins-lines", THINK + '$\\boxed{6 \\cdot %\n5}$', "30", C, I),
    ("comment-joins-lines-gold-5", THINK + '$\\boxed{6 \\cdot %\n5}$', "5", I, C),
    ("percent-sign-kept", THINK + r"$\boxed{50%}$", "50", C, C),
    ("percent-in-prose",
     THINK + r"The probability is 50% so $\boxed{\frac{1}{2}}$.",
     r"\frac{1}{2}", C, C),
    ("iffalse-hides-gold", box(r"\iffalse 5\fi 6"), "5", I, C),
    ("iffalse-visible", box(r"\iffalse 6\fi 5"), "5", C, I),
    ("iftrue-else", box(r"\iftrue 6\else 5\fi"), "5", I, I),
    ("iffalse-hides-last-box", THINK + r"$\boxed{6}$ \iffalse $\boxed{5}$ \fi", "5", I, C),
    ("def-expands", box(r"\def\x{5}\x"), "5", C, N),
    ("def-expands-wrong", box(r"\def\x{6}\x"), "5", I, N),
    ("def-unused", THINK + r"\def\hide{5} The answer is $\boxed{6}$.", "5", I, I),
    ("newcommand-in-prose",
     THINK + r"\newcommand{\ans}{6} The answer is $\boxed{\ans}$.",
     "6", C, N),
    ("renewcommand-boxed",
     THINK + r"\renewcommand{\boxed}[1]{6} The answer is $\boxed{5}$.",
     "5", I, C),
    ("let", THINK + r"\let\x\y The answer is $\boxed{5}$.", "5", I, C),
]


# Base subscripts: numerals that both carry a base compare digits and base.
BASES: list[Row] = [
    ("other-base", box("1300_6"), "1300_5", I, C),
    ("other-base-rev", box("1300_5"), "1300_6", I, C),
    ("other-base-braced", box("1300_{6}"), "1300_5", I, C),
    ("other-digits", box("1301_5"), "1300_5", I, I),
    ("same", box("1300_5"), "1300_5", C, C),
    ("braced", box("1300_{5}"), "1300_5", C, C),
    ("parenthesised", box("(1300)_5"), "1300_5", C, N),
    ("hex", box("1A_{16}"), "1A_{16}", C, C),
    ("hex-wrong", box("1B_{16}"), "1A_{16}", I, I),
    ("answer-without-base", box("1300"), "1300_5", C, C),
    ("gold-without-base", box("1300_5"), "1300", C, C),
]


# Decimal percentages: p\% equals p and p/100 for any p, not only integers.
DECIMAL_PERCENTS: list[Row] = [
    ("decimal-pct-vs-number", box(r"12.5\%"), "12.5", C, I),
    ("number-vs-decimal-pct", box("12.5"), r"12.5\%", C, I),
    ("trailing-zero", box(r"12.5\%"), "12.50", C, I),
    ("spaced", box(r"12.5 \%"), "12.5", C, I),
    ("unescaped", box("12.5%"), "12.5", C, I),
    ("fraction-pct", box(r"\frac{25}{2}\%"), "12.5", C, N),
    ("pct-vs-fraction", box(r"12.5\%"), "0.125", C, C),
    ("fraction-vs-pct", box("0.125"), r"12.5\%", C, C),
    ("integer-pct", box(r"50\%"), "50", C, C),
    ("other-value", box(r"12.6\%"), "12.5", I, I),
    ("other-value-rev", box("12.6"), r"12.5\%", I, I),
    ("shifted-point", box(r"1.25\%"), "12.5", I, I),
    ("hundredth-of-fraction", box(r"12.5\%"), "0.0125", I, I),
    ("times-ten", box(r"12.5\%"), "125", I, I),
]


# Interval vs inequality, both ways; endpoints must agree.
INTERVALS: list[Row] = [
    ("open-ineq-vs-interval", box("-2 < x < 2"), "(-2, 2)", C, I),
    ("open-interval-vs-ineq", box("(-2, 2)"), "-2 < x < 2", C, C),
    ("half-open", box(r"-2 \le x < 2"), "[-2, 2)", C, I),
    ("half-open-rev", box("[-2, 2)"), r"-2 \le x < 2", C, C),
    ("closed", box(r"-2 \leq x \leq 2"), "[-2, 2]", C, I),
    ("endpoint-closed-vs-open", box(r"-2 \le x < 2"), "(-2, 2)", I, I),
    ("endpoint-open-vs-closed-rev", box("(-2, 2)"), r"-2 \le x < 2", I, I),
    ("wrong-side-closed", box(r"-2 < x \le 2"), "[-2, 2)", I, I),
    ("other-endpoint", box("-2 < x < 3"), "(-2, 2)", I, I),
    ("other-endpoint-rev", box("(-2, 3)"), "-2 < x < 2", I, I),
    ("ray", box("x > 3"), r"(3, \infty)", C, I),
    ("ray-closed", box(r"x \ge 3"), r"[3, \infty)", C, I),
    ("ray-closed-vs-open", box(r"x \ge 3"), r"(3, \infty)", I, I),
    ("reversed-chain", box("2 > x > -2"), "(-2, 2)", C, I),
    ("other-variable", box("-2 < y < 2"), "(-2, 2)", C, I),
    ("union", box(r"x < -2 \text{ or } x > 2"), r"(-\infty, -2) \cup (2, \infty)", C, I),
    ("union-rev", box(r"(-\infty, -2) \cup (2, \infty)"), r"x < -2 \text{ or } x > 2", C, I),
    ("union-lor", box(r"x < -2 \lor x > 2"), r"(-\infty, -2) \cup (2, \infty)", C, I),
    ("union-other-endpoint",
     box(r"x < -2 \text{ or } x > 3"),
     r"(-\infty, -2) \cup (2, \infty)", I, I),
    ("union-closed-end",
     box(r"x \le -2 \text{ or } x > 2"),
     r"(-\infty, -2) \cup (2, \infty)", I, I),
    ("unsolved-inequality", box("x^2 < 4"), "(-2, 2)", I, I),
    ("membership", box(r"x \in (-2, 2)"), "(-2, 2)", C, C),
]

CLASSES = {
    "hedges": HEDGES,
    "false-relations": FALSE_RELATIONS,
    "no-left-side": NO_LEFT_SIDE,
    "hidden-latex": HIDDEN_LATEX,
    "bases": BASES,
    "decimal-percents": DECIMAL_PERCENTS,
    "intervals": INTERVALS,
}


def _check(response: str, gold: Any, default: Status, skywork: Status) -> None:
    out = score_math(response, gold, LIMITS, DEFAULT)
    assert out.status is default, out.detail
    assert out.detail
    released = score_math(response, gold, LIMITS, SKYWORK)
    assert released.status is skywork, released.detail


def _rows(table: list[Row]) -> Any:
    return pytest.mark.parametrize("response, gold, default, skywork", [r[1:] for r in table],
                                   ids=[r[0] for r in table])


@_rows(HEDGES)
def test_hedges(response: str, gold: Any, default: Status, skywork: Status) -> None:
    _check(response, gold, default, skywork)


@_rows(FALSE_RELATIONS)
def test_false_relations(response: str, gold: Any, default: Status, skywork: Status) -> None:
    _check(response, gold, default, skywork)


@_rows(NO_LEFT_SIDE)
def test_no_left_side(response: str, gold: Any, default: Status, skywork: Status) -> None:
    _check(response, gold, default, skywork)


@_rows(HIDDEN_LATEX)
def test_hidden_latex(response: str, gold: Any, default: Status, skywork: Status) -> None:
    _check(response, gold, default, skywork)


@_rows(BASES)
def test_bases(response: str, gold: Any, default: Status, skywork: Status) -> None:
    _check(response, gold, default, skywork)


@_rows(DECIMAL_PERCENTS)
def test_decimal_percents(response: str, gold: Any, default: Status, skywork: Status) -> None:
    _check(response, gold, default, skywork)


@_rows(INTERVALS)
def test_intervals(response: str, gold: Any, default: Status, skywork: Status) -> None:
    _check(response, gold, default, skywork)


def test_every_class_has_both_verdicts() -> None:
    """Each table holds right answers and near misses that stay wrong, and unique ids."""
    for name, table in CLASSES.items():
        assert {C, I} <= {row[3] for row in table}, name
        assert len({row[0] for row in table}) == len(table), name


# -- the quick (inline) path gives score_math's verdict on hedges --------------------------------

@pytest.mark.parametrize("response, gold", [
    (THINK + r"The answer is $\boxed{6}$ or $\boxed{5}$.", "5"),
    (THINK + r"The answer is $\boxed{5}$ or $\boxed{6}$.", "5"),
    (THINK + r"So $\boxed{6}$. Wait, that is wrong: $\boxed{5}$.", "5"),
    (THINK + r"$\boxed{\frac{10}{2}}$, that is $\boxed{5}$.", "5"),
    (THINK + r"$\boxed{\frac{1}{3}}$ or $\boxed{\frac{1}{2}}$", "1/2"),
    (THINK + "".join(f"$\\boxed{{{k}}}$ " for k in range(20)), "19"),
])
def test_quick_verdict_agrees_on_hedges(response: str, gold: str) -> None:
    quick = quick_verdict(response, gold)
    assert quick is not None
    full = score_math(response, gold, LIMITS)
    assert (quick.status, quick.detail) == (full.status, full.detail)


def test_quick_verdict_leaves_a_rival_that_needs_sympy_to_the_full_rules() -> None:
    response = THINK + r"$\boxed{\sqrt{4}}$ or $\boxed{2}$"
    assert quick_verdict(response, "2") is None
    assert score_math(response, "2", LIMITS).status is C


def test_many_final_answers_are_a_hedge_without_judging_each() -> None:
    response = THINK + "".join(f"$\\boxed{{x_{{{k}}}}}$ " for k in range(50)) + r"$\boxed{7}$"
    out = score_math(response, "7", LIMITS)
    assert out.status is I and "hedged" in out.detail


# -- the rules themselves ---------------------------------------------------------------------

@pytest.mark.parametrize("text, rendered", [
    ("a % comment\nb", "a b"),
    ("50% of it", "50% of it"),
    ("12.5 %", "12.5 %"),
    ("\\% stays", "\\% stays"),
    ("\\\\% gone\nnext", "\\\\next"),
    ("x \\iffalse y \\fi z", "x  z"),
    ("\\iffalse y \\else z\\fi", " z"),
    ("\\iftrue y \\else z\\fi", " y "),
    ("\\def\\a{1}\\a+\\ab", "1+\\ab"),
    ("\\newcommand{\\b}{2} \\b", " 2"),
    ("\\DeclareMathOperator{\\op}{op} \\op", " \\operatorname{op}"),
    ("6\\phantom{5}\\hphantom{x}\\vphantom{y}", "6"),
])
def test_render(text: str, rendered: str) -> None:
    assert math_rules.render(text) == (rendered, None)


_DOUBLING = "".join(f"\\def\\m{chr(97 + i)}{{\\m{chr(98 + i)}\\m{chr(98 + i)}}}" for i in range(25))


@pytest.mark.parametrize("text, why", [
    ("\\newcommand{\\f}[1]{#1}", "arguments"),
    ("\\def\\f#1{#1}", "arguments"),
    ("\\let\\a\\b", "\\let"),
    (_DOUBLING + "\\ma", "past"),
])
def test_render_refuses(text: str, why: str) -> None:
    problem = math_rules.render(text)[1]
    assert problem is not None and why in problem


@pytest.mark.parametrize("side, named", [
    ("x", True), ("m+n", True), ("a_{10}", True), ("f(2)", True), ("AB", True),
    ("\\angle ABC", True), ("\\theta", True), ("\\text{Area}", True), ("(x,y)", True),
    ("x^{\\prime}", True), ("6", False), ("x+1", False), ("2x", False), ("x^2", False),
    ("\\pi", False), ("\\sqrt{x}", False), ("x(x+1)", False), ("", False),
])
def test_names_a_quantity(side: str, named: bool) -> None:
    assert math_rules.names_a_quantity(side) is named


@pytest.mark.parametrize("answer, chain", [
    ("x = 13 = 12", [("", "x"), ("=", "13"), ("=", "12")]),
    ("13 \\approx 29", [("", "13"), ("\\approx", "29")]),
    ("f(x) = (1, 2)", [("", "f(x)"), ("=", "(1, 2)")]),
    ("x = 1, y = 2", None),
    ("x \\le 5", None),
    ("x = 5 \\text{ or } x = 6", [("", "x"), ("=", "5 \\text{ or } x"), ("=", "6")]),
    ("5", None),
])
def test_relation_chain(answer: str, chain: Any) -> None:
    assert math_rules.relation_chain(answer) == chain


def test_alternatives_become_a_list_outside_brackets_only() -> None:
    assert math_rules.alternatives("x=13 \\lor x=29") == "x=13 , x=29"
    assert math_rules.alternatives("13 or 29") == "13 , 29"
    assert math_rules.alternatives("\\{x \\mid x<1 \\lor x>2\\}") == "\\{x \\mid x<1 \\lor x>2\\}"
    assert math_rules.alternatives("\\text{color}") == "\\text{color}"


def test_retractions_between_boxes() -> None:
    text = "A \\boxed{1}. Wait, no. \\boxed{2} or \\boxed{3}, so \\boxed{4}"
    final = extract.last_boxed_at(text)
    assert final is not None and final[1] == "4"
    assert math_rules.unretracted_boxes(text, final[0]) == ["2", "3"]
    assert math_rules.unretracted_boxes("only \\boxed{4}", 5) == []


BIG = 1_000_000


@pytest.mark.parametrize("response", [
    "\\boxed{5}" * (BIG // 9),
    "a %\n" * (BIG // 4),
    "\\def\\a{" + "x" * (BIG // 2) + "}" + "\\a" * (BIG // 5),
    "\\iffalse a\\fi " * (BIG // 14),
    "\\iffalse " * (BIG // 9),
    "\\phantom{1}" * (BIG // 11),
    "\\phantom{" * (BIG // 9),
    "\\boxed{4} wait " * (BIG // 15),
    "\\\\" * (BIG // 2 - 10),
], ids=["boxes", "comments", "macro-bomb", "iffalse", "iffalse-unclosed", "phantoms",
        "phantom-unclosed", "retractions", "backslashes"])
def test_the_rules_stay_linear_on_a_full_size_response(response: str) -> None:
    response = response[:BIG - 20] + "\\boxed{5}"
    start = time.monotonic()
    quick = quick_verdict(response, "5")
    full = score_math(response, "5", LIMITS)
    assert time.monotonic() - start < 3.0
    assert quick is None or quick.status is full.status
