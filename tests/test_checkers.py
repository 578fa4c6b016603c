"""Checkers of code ground truths (issue 49, docs/contracts.md 1): the built-in comparators
("exact", "tokens", "tokens_ci", "float:EPS") and program checkers in testlib's convention, run
in a jail of their own. Real nsjail (and the forkserver) for everything that runs a program;
the comparators' rules are also checked directly."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from tests.conftest_sandbox import (SUM_GT, SUM_OK, after_attack, forkserver_sandbox,  # noqa: F401
                                    nsjail_sandbox, respond)
from verifier.scoring import checker_jail, code_score
from verifier.scoring.checker_jail import Case, cached_self_check
from verifier.scoring.checkers import MAX_CHECKER_CHARS, ProgramChecker, float_eps, parse_checker
from verifier.scoring.code_score import score_code
from verifier.data.ground_truth import BadGroundTruth, parse_ground_truth
from verifier.items import NOT_A_VERDICT, Item, Limits, Status
from verifier.scoring.output_compare import compare_stdout, tokens_match, values_match
from verifier.data.problems import DataError, check_code_truth
from verifier.scoring.profiles import get_profile
from verifier.scoring.scorer import Scorer, ScoringConfig

# -- the built-in comparators' rules -------------------------------------------------------------


def test_tokens_rule():
    assert tokens_match("1 2\n3", "1\n2   3\n", "tokens")
    assert not tokens_match("1 2 3 4", "1 2 3", "tokens")  # an extra token
    assert not tokens_match("1.0", "1", "tokens")  # as text
    assert not tokens_match("YES", "yes", "tokens")
    assert not tokens_match("", "1", "tokens")


def test_tokens_ci_rule():
    assert tokens_match("YES\nno", "yes NO", "tokens_ci")
    assert tokens_match("Yes", "yEs", "tokens_ci")
    assert not tokens_match("yes yes", "yes", "tokens_ci")


@pytest.mark.parametrize("got, expected, ok", [
    ("0.3333333", "0.333333333", True),
    ("0.334", "0.333333333", False),
    ("1000000.5", "1000000", True),  # relative: 1e-6 x 1e6 = 1
    ("1000002", "1000000", False),
    ("1e-7", "0", True),  # absolute below 1: 1e-6 x max(1, 0)
    ("2e-6", "0", False),
    ("3 apples", "3.0000001 apples", True),
    ("3 pears", "3 apples", False),  # other tokens must be equal
    ("1 2", "1", False),  # token counts
    ("nan", "nan", False),  # nan and inf match nothing, themselves included
    ("inf", "inf", False),
    ("-Infinity", "-Infinity", False),
    ("1e999999", "1", False),  # a huge number
    ("9" * 200_000, "3.14", False),
    ("1_0", "10", False),  # not a decimal number: compared as text
    ("0x10", "16", False),
    ("\u0661", "1", False),  # not ASCII digits
    ("-0", "0", True),
    (".5", "0.5", True),
])
def test_float_rule(got, expected, ok):
    assert tokens_match(got, expected, "float:1e-6") is ok


def test_float_rule_eps_zero_is_numeric_equality():
    assert tokens_match("1.000", "1", "float:0")
    assert not tokens_match("1.0000000001", "1", "float:0")


def test_non_utf8_output_matches_no_text():
    # U+FFFD in the expected output: the exact rule's decoding would turn 0xff into it.
    assert compare_stdout(b"\xff", "\ufffd", "tokens")[0] is False
    assert compare_stdout(b"\xff", "\ufffd", "tokens_ci")[0] is False
    assert compare_stdout(b"\xff 1", "x 1", "float:1e-6")[0] is False
    ok, msg = compare_stdout(b"1 2", "1 2 3", "tokens")
    assert not ok and "wrong answer" in msg


def test_float_rule_on_returned_values():
    assert values_match([0.1 + 0.2, {"a": 1.0000001}], [0.3, {"a": 1}], rule="float:1e-6")
    assert not values_match([0.31], [0.3], rule="float:1e-6")
    assert values_match(2, 2.0000001, rule="float:1e-6")
    assert not values_match(float("nan"), float("nan"), rule="float:1e-6")
    assert not values_match(10 ** 400, 1.0, rule="float:1e-6")  # too large for a float
    assert not values_match(True, 1.0, rule="float:1e-6")
    assert values_match(3, 3, rule="float:1e-6") and not values_match(3, 4, rule="float:1e-6")
    assert not values_match([0.1 + 0.2], [0.3])  # the exact rule is unchanged


# -- bad checkers: one clear line each -----------------------------------------------------------


STDIO = {"inputs": ["1\n"], "outputs": ["1\n"]}
CALL = {"inputs": ["1"], "outputs": ["1"], "fn_name": "f"}


@pytest.mark.parametrize("gt, why", [
    (dict(STDIO, checker="fuzzy"), "unknown checker 'fuzzy'"),
    (dict(STDIO, checker="float:"), "EPS must be a decimal number"),
    (dict(STDIO, checker="float:1e-6x"), "EPS must be a decimal number"),
    (dict(STDIO, checker="float:1_0"), "EPS must be a decimal number"),
    (dict(STDIO, checker="float:-1e-6"), "EPS must be a finite number >= 0"),
    (dict(STDIO, checker="float:nan"), "EPS must be a finite number >= 0"),
    (dict(STDIO, checker="float:1e999"), "EPS must be a finite number >= 0"),
    (dict(STDIO, checker=7), "'checker' must be a name or an object"),
    (dict(STDIO, checker={"language": "cpp", "source": "int main(){}"}),
     "checker language 'cpp' is not supported"),
    (dict(STDIO, checker={"language": "python"}), "needs a non-empty 'source'"),
    (dict(STDIO, checker={"language": "python", "source": "#" * (MAX_CHECKER_CHARS + 1)}),
     f"over the cap of {MAX_CHECKER_CHARS}"),
    (dict(CALL, checker="tokens"), "a call-based item (fn_name) takes 'exact' or 'float:EPS'"),
    (dict(CALL, checker={"language": "python", "source": "pass"}), "a call-based item"),
    ({"assert_case": ["assert f() == 1"], "checker": "tokens"},
     "not to assert or LeetCode-style test code"),
])
def test_bad_checker_is_a_one_line_error(gt, why):
    with pytest.raises(BadGroundTruth) as e:
        parse_ground_truth(gt)
    assert why in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DataError, match="bad code ground truth"):  # a data row's error too
        check_code_truth(gt, "f.jsonl: line 1")


def test_checker_names_parse():
    assert parse_checker(None) == parse_checker("exact") == "exact"
    assert parse_checker("float:1e-6", call_based=True) == "float:1e-6"
    p = parse_checker({"language": "python", "source": "pass"})
    assert isinstance(p, ProgramChecker) and len(p.digest) == 32
    assert parse_ground_truth(dict(STDIO, checker="tokens_ci")).checker == "tokens_ci"


def test_bad_checker_is_the_items_invalid_input_in_a_batch(nsjail_sandbox):
    """Through the Scorer: one bad checker is its item's INVALID_INPUT, its neighbours are
    judged."""
    with Scorer(ScoringConfig(workers=1), sandbox=nsjail_sandbox) as scorer:
        items = [Item("bad", "code", respond(SUM_OK), dict(SUM_GT, checker="float:abc")),
                 Item("good", "code", respond(SUM_OK), dict(SUM_GT, checker="tokens"))]
        bad, good = scorer.score(items)
    assert bad.status is Status.INVALID_INPUT and "float:abc" in bad.detail
    assert good.status is Status.CORRECT


def test_large_outputs_are_compared_in_the_compare_pool(nsjail_sandbox):
    """Over INLINE_COMPARE_BYTES the built-in checkers run in the Scorer's worker processes
    (off the server's threads), as the exact rule does."""
    n = 30_000
    expected = "\n".join(str(i / 3) for i in range(n)) + "\n"
    gt = {"inputs": [f"{n}\n"], "outputs": [expected]}
    close = "n = int(input())\nprint(' '.join('%.9f' % (i / 3) for i in range(n)))"
    off = "n = int(input())\nprint(' '.join('%.9f' % (i / 3 + (i == n - 1)) for i in range(n)))"
    assert len(expected) > code_score.INLINE_COMPARE_BYTES
    with Scorer(ScoringConfig(workers=1), sandbox=nsjail_sandbox) as scorer:
        results = scorer.score([
            Item("float", "code", respond(close), dict(gt, checker="float:1e-6")),
            Item("float-off", "code", respond(off), dict(gt, checker="float:1e-6")),
            Item("exact", "code", respond(close), gt),
            Item("tokens", "code", respond("import sys\nsys.stdout.write(sys.stdin.read())"),
                 {"inputs": [expected], "outputs": [expected.replace("\n", " ")],
                  "checker": "tokens"}),
        ])
    assert [r.status for r in results] == [Status.CORRECT, Status.INCORRECT, Status.INCORRECT,
                                           Status.CORRECT]


# -- built-in comparators in the sandbox ---------------------------------------------------------


def score(sb, code, gt, profile="default", **limits):
    return score_code(respond(code), gt, Limits(**limits), sb, profile=get_profile(profile))


def test_tokens_checker_judges_in_the_sandbox(nsjail_sandbox):
    gt = {"inputs": ["x\n"], "outputs": ["1 2\n3\n"], "checker": "tokens"}
    assert score(nsjail_sandbox, "print(1)\nprint(2, 3)", gt).status is Status.CORRECT
    assert score(nsjail_sandbox, "print(1, 2, 3, 4)", gt).status is Status.INCORRECT
    exact = dict(gt, checker="exact")
    assert score(nsjail_sandbox, "print(1)\nprint(2, 3)", exact).status is Status.INCORRECT


def test_tokens_ci_checker_judges_in_the_sandbox(nsjail_sandbox):
    gt = {"inputs": ["x\n"], "outputs": ["YES\n"], "checker": "tokens_ci"}
    assert score(nsjail_sandbox, "print('yes')", gt).status is Status.CORRECT
    assert score(nsjail_sandbox, "print('no')", gt).status is Status.INCORRECT


def test_float_checker_judges_in_the_sandbox(nsjail_sandbox):
    gt = {"inputs": ["3\n"], "outputs": ["0.333333333333\n"], "checker": "float:1e-6"}
    assert score(nsjail_sandbox, "print(1 / int(input()))", gt).status is Status.CORRECT
    assert score(nsjail_sandbox, "print('%.7f' % (1 / int(input())))", gt).status \
        is Status.CORRECT
    assert score(nsjail_sandbox, "print(0.34)", gt).status is Status.INCORRECT
    assert score(nsjail_sandbox, "print('9' * 100000)", gt).status is Status.INCORRECT
    assert score(nsjail_sandbox, "print('nan')", gt).status is Status.INCORRECT
    # nan matches nothing, not even an expected nan printed as it is
    nan = {"inputs": ["x\n"], "outputs": ["nan\n"], "checker": "float:1e-6"}
    assert score(nsjail_sandbox, "print('nan')", nan).status is Status.INCORRECT


def test_float_checker_on_a_call_based_item(nsjail_sandbox):
    gt = {"fn_name": "f", "inputs": ["3", "4"], "outputs": ["[0.333333333, 1]", "[0.25, 1]"],
          "checker": "float:1e-6"}
    assert score(nsjail_sandbox, "def f(n):\n    return [1 / n, 1.0]", gt).status \
        is Status.CORRECT
    assert score(nsjail_sandbox, "def f(n):\n    return [1 / n + 0.01, 1]", gt).status \
        is Status.INCORRECT
    exact = dict(gt, checker="exact")
    assert score(nsjail_sandbox, "def f(n):\n    return [1 / n, 1]", exact).status \
        is Status.INCORRECT


@pytest.mark.parametrize("profile", ["lcb", "skywork"])
def test_reference_profiles_keep_their_judges_rule_and_say_so(nsjail_sandbox, profile):
    gt = {"inputs": ["x\n"], "outputs": ["YES\n"], "checker": "tokens_ci"}
    o = score(nsjail_sandbox, "print('yes')", gt, profile)
    assert o.status is Status.INCORRECT
    assert f"the {profile!r} profile judges by its reference judge's exact rule" in o.detail
    o = score(nsjail_sandbox, "print('YES')", dict(gt, checker={"language": "python",
                                                                 "source": "raise SystemExit(3)"}),
              profile)
    assert o.status is Status.CORRECT and "is not used" in o.detail


# -- program checkers ----------------------------------------------------------------------------

# Any permutation of 1..n is a right answer; the expected output holds one of them. A checker
# in testlib's spirit: it reads the output's tokens strictly and says why it rejects.
PERM_CHECKER = r'''
import sys
n = int(open(sys.argv[1]).read().split()[0])
ans = open(sys.argv[3]).read().split()
assert sorted(map(int, ans)) == list(range(1, n + 1)), "bad answer file"
try:
    got = open(sys.argv[2], encoding="utf-8").read().split()
    vals = [int(t) for t in got]
except (ValueError, UnicodeDecodeError) as e:
    print(f"unreadable output: {type(e).__name__}", file=sys.stderr)
    sys.exit(2)
if sorted(vals) != list(range(1, n + 1)):
    print(f"not a permutation of 1..{n}", file=sys.stderr)
    sys.exit(1)
'''
# A naive checker: crashes (int() of a non-number, a huge number past Python's digit limit,
# bytes that are not UTF-8) instead of saying "wrong answer".
NAIVE_CHECKER = r'''
import sys
n = int(open(sys.argv[1]).read())
vals = list(map(int, open(sys.argv[2]).read().split()))
sys.exit(0 if sorted(vals) == list(range(1, n + 1)) else 1)
'''
PERM_GT = {"inputs": ["3\n", "4\n", "2\n"], "outputs": ["1 2 3\n", "1 2 3 4\n", "1 2\n"]}
REVERSED = "n = int(input())\nprint(*range(n, 0, -1))"


def with_checker(source, gt=PERM_GT):
    return dict(gt, checker={"language": "python", "source": source})


class CountingSandbox:
    """The sandbox, counting its runs (every other attribute is the sandbox's own)."""

    def __init__(self, sb):
        self._sb, self.runs = sb, 0

    def run(self, *args, **kwargs):
        self.runs += 1
        return self._sb.run(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._sb, name)


@pytest.mark.parametrize("sandbox", ["nsjail", "forkserver"])
def test_a_right_answer_other_than_the_expected_one_is_correct(request, sandbox):
    sb = request.getfixturevalue(f"{sandbox}_sandbox")
    o = score(sb, REVERSED, with_checker(PERM_CHECKER))
    assert o.status is Status.CORRECT and (o.passed, o.total) == (3, 3), o
    assert score(sb, REVERSED, PERM_GT).status is Status.INCORRECT  # the exact rule


def test_a_wrong_answer_is_incorrect_at_its_first_failing_test(nsjail_sandbox):
    code = "n = int(input())\nprint(*range(n, 0, -1)) if n != 4 else print(1, 1, 2, 3)"
    o = score(nsjail_sandbox, code, with_checker(PERM_CHECKER))
    assert o.status is Status.INCORRECT and o.passed == 1, o
    assert "test 2/3" in o.detail and "not a permutation of 1..4" in o.detail
    all_tests = score(nsjail_sandbox, code, with_checker(PERM_CHECKER), run_all_tests=True)
    assert all_tests.status is Status.INCORRECT and all_tests.passed == 2


def test_one_checker_jail_per_sample_started_only_when_needed(nsjail_sandbox):
    sb = CountingSandbox(nsjail_sandbox)
    code_score.harness_files(sb)  # the harness's compile run, not counted below
    sb.runs = 0
    assert score(sb, REVERSED, with_checker(PERM_CHECKER)).status is Status.CORRECT
    assert sb.runs == 2  # the program's jail, then one checker jail for its three tests
    sb.runs = 0
    same = "n = int(input())\nprint(*range(1, n + 1))"
    assert score(sb, same, with_checker(PERM_CHECKER)).status is Status.CORRECT
    assert sb.runs == 1  # every output is the expected one: no checker needed
    sb.runs = 0
    assert score(sb, "print(1 / 0)", with_checker(PERM_CHECKER)).status \
        is Status.RUNTIME_ERROR
    assert sb.runs == 1  # the program failed its first test: nothing to check


def test_checker_verdicts_are_the_same_through_the_scorer(forkserver_sandbox):
    with Scorer(ScoringConfig(workers=1), sandbox=forkserver_sandbox) as scorer:
        results = scorer.score([
            Item("right", "code", respond(REVERSED), with_checker(PERM_CHECKER)),
            Item("wrong", "code", respond("print(1)"), with_checker(PERM_CHECKER)),
            Item("broken", "code", respond(REVERSED), with_checker("raise SystemExit(3)")),
            Item("json", "code", respond(REVERSED), json.dumps(with_checker(PERM_CHECKER))),
        ])
    assert [r.status for r in results] == [Status.CORRECT, Status.INCORRECT,
                                           Status.INVALID_INPUT, Status.CORRECT]


# Programs that try to fool the checker: never CORRECT, never unjudged.
FOOLING = {
    "extra_tokens": "n = int(input())\nprint(*range(n, 0, -1), n + 1)",
    "no_output": "input()",
    "huge_number": "input()\nprint('9' * 100000)",
    "non_utf8": "import sys\ninput()\nsys.stdout.buffer.write(b'\\xff\\xfe 1 2 3\\n')",
    "answer_file_name": (
        "import os\nn = int(input())\n"
        "for d in ('/tmp', os.getcwd()):\n"
        "    for name in ('answer.txt', 'output.txt', 'input.txt', 'judge-check-0'):\n"
        "        try:\n"
        "            open(os.path.join(d, name), 'w').write('1\\n')\n"
        "        except OSError:\n"
        "            pass\n"
        "print('ANSWER_FILE')"),
    "crashes_naive_checker": "input()\nprint('x')",
    "negative_and_zero": "n = int(input())\nprint(*range(0, -n, -1))",
}


@pytest.mark.parametrize("name", sorted(FOOLING))
@pytest.mark.parametrize("checker", ["testlib_style", "naive"])
def test_programs_cannot_fool_the_checker(after_attack, name, checker):
    source = PERM_CHECKER if checker == "testlib_style" else NAIVE_CHECKER
    o = score(after_attack, FOOLING[name], with_checker(source), test_timeout_s=3)
    assert o.status is not Status.CORRECT, o
    assert o.status not in NOT_A_VERDICT, o


def test_a_crash_on_the_programs_output_is_its_wrong_answer_and_self_checked_once(
        nsjail_sandbox):
    gt = with_checker(NAIVE_CHECKER + "\n# self-check cache probe\n")
    o = score(nsjail_sandbox, "input()\nprint('x')", gt)
    assert o.status is Status.INCORRECT and "accepts the expected answer" in o.detail, o
    checker = parse_ground_truth(gt).checker
    case = Case(0, PERM_GT["inputs"][0], b"", PERM_GT["outputs"][0])
    assert cached_self_check(checker, case) == ""  # accepted, remembered by content


BROKEN = {
    "fails_exit_3": "import sys\nprint('jury answer is wrong', file=sys.stderr)\nsys.exit(3)",
    "always_crashes": "raise RuntimeError('checker bug')",
    "never_exits": "while True:\n    pass",
    "does_not_compile": "def check(:\n    pass",
    "rejects_its_own_answer_and_crashes": (
        "import sys\nout = open(sys.argv[2]).read()\n"
        "if out == open(sys.argv[3]).read():\n    sys.exit(1)\nraise ValueError('bug')"),
    "odd_exit_code": "import os\nos._exit(7)",
    "floods_stdout": "print('x' * (1 << 20))",
}


def test_a_checker_that_fills_its_scratch_makes_its_item_invalid_input(nsjail_sandbox):
    """The next test's files (larger than the last's) no longer fit: the checker's own doing,
    never SANDBOX_ERROR."""
    fills = ("import sys\n"
             "try:\n"
             "    for k in range(1000):\n"
             "        with open(f'/tmp/junk{k}', 'wb') as f:\n"
             "            for _ in range(15):\n"
             "                f.write(b'x' * (1 << 20))\n"
             "except OSError:\n    pass\n")
    gt = {"inputs": ["3\n", "2\n" + " " * 300_000 + "\n"], "outputs": ["1 2 3\n", "1 2\n"],
          "checker": {"language": "python", "source": fills}}
    o = score(nsjail_sandbox, REVERSED, gt)
    assert o.status is Status.INVALID_INPUT and "could not be given its files" in o.detail, o


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_checker_makes_its_item_invalid_input(nsjail_sandbox, name):
    o = score(nsjail_sandbox, REVERSED, with_checker(BROKEN[name]), test_timeout_s=1)
    assert o.status is Status.INVALID_INPUT, o
    assert "checker" in o.detail and "\n" not in o.detail


def test_a_broken_checker_never_costs_a_program_that_prints_the_expected_answer(
        nsjail_sandbox):
    same = "n = int(input())\nprint(*range(1, n + 1))"
    o = score(nsjail_sandbox, same, with_checker(BROKEN["fails_exit_3"]))
    assert o.status is Status.CORRECT


def test_the_checker_runs_in_a_jail_of_its_own(nsjail_sandbox):
    """The checker sees the program's stdout, never its files or processes: a program that
    leaves a file and a process behind finds neither in the checker's jail."""
    program = ("import os, subprocess, sys\nn = int(input())\n"
               "open('/tmp/left_by_program', 'w').write('x')\n"
               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
               "print(*range(n, 0, -1))")
    checker = ("import os, sys\n"
               "if os.path.exists('/tmp/left_by_program'):\n    sys.exit(1)\n"
               "sys.exit(0)\n")
    assert score(nsjail_sandbox, program, with_checker(checker)).status is Status.CORRECT


def test_outputs_waiting_for_the_checker_are_bounded(nsjail_sandbox, monkeypatch):
    monkeypatch.setattr(code_score, "CHECK_PENDING_BYTES", 10)
    o = score(nsjail_sandbox, REVERSED, with_checker(PERM_CHECKER))
    assert o.status is Status.OUTPUT_LIMIT and "waiting for the checker" in o.detail


def test_the_checks_time_budget_is_a_timeout_of_the_checker(nsjail_sandbox, monkeypatch):
    """When the sample's time for checks runs out, the test at hand counts as a checker timeout
    (the self-check then decides): here the checker is slow on the program's outputs only."""
    monkeypatch.setattr(checker_jail, "MAX_CHECK_BUDGET_S", 0.5)
    slow_on_reversed = ("import sys, time\nout = open(sys.argv[2]).read().split()\n"
                        "if out != sorted(out):\n    time.sleep(0.4)\n")
    o = score(nsjail_sandbox, REVERSED, with_checker(slow_on_reversed), test_timeout_s=2)
    assert o.status is Status.INCORRECT and "on the program's output" in o.detail, o
    o = score(nsjail_sandbox, REVERSED, with_checker(slow_on_reversed), test_timeout_s=2,
              run_all_tests=True)
    assert o.status is Status.INCORRECT and o.passed < 3, o


def test_checker_eps_is_decimal():
    assert float_eps("float:1e-6") == Decimal("1e-6")
