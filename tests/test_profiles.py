"""Judging profiles: one named test per rule of the README's profile table (real nsjail, real
math-verify). Ground truths are in LiveCodeBench's call-based and stdin formats (``inputs`` and
``outputs`` as JSON text, ``fn_name``) and in Skywork-OR1's schema (``assert_case``,
``import_prefix``/``test_code``/``entry_point``); each rule is shown to differ from the default
profile where the reference judges differ from it."""

from __future__ import annotations

import pytest

from tests.conftest_sandbox import after_attack, nsjail_sandbox  # noqa: F401
from verifier.code_score import item_timeout, score_code
from verifier.extract import lcb_code_block, skywork_code_block
from verifier.items import Item, Limits, Status
from verifier.math_score import score_math
from verifier.profiles import PROFILE_TABLE, get_profile
from verifier.scoring import Scorer, ScoringConfig

DEFAULT, LCB, SKYWORK = (get_profile(n) for n in ("default", "lcb", "skywork"))


def fenced(code: str) -> str:
    """A response both extraction rules read the same way: one python block after the think."""
    return f"<think>\nplan\n</think>\nHere it is:\n```python\n{code}\n```\n"


def judge(sb, code, gt, profile, **limits):
    return score_code(fenced(code), gt, Limits(**limits), sb, profile=profile)


def stdin_gt(out: str, inp: str = "\n") -> dict:
    return {"inputs": [inp], "outputs": [out]}


# -- LiveCodeBench's program environment -------------------------------------------------------

LEETCODE_NO_IMPORTS = (
    "class Solution:\n"
    "    def f(self, nums: List[int]) -> int:\n"
    "        c = Counter(nums)\n"
    "        h: List[int] = []\n"
    "        heappush(h, 3)\n"
    "        @lru_cache(None)\n"
    "        def g(k: int) -> int:\n"
    "            return k if k < 2 else g(k - 1) + g(k - 2)\n"
    "        return max(c.values()) + gcd(4, 6) + (1 if inf > 5 else 0) + h[0] + g(10)\n"
)
CALL_GT = {"inputs": ["[1, 1, 2]"], "outputs": ["63"], "fn_name": "f"}


def test_lcb_preamble_leetcode_program_without_imports(nsjail_sandbox):
    assert judge(nsjail_sandbox, LEETCODE_NO_IMPORTS, CALL_GT, LCB).status is Status.CORRECT
    o = judge(nsjail_sandbox, LEETCODE_NO_IMPORTS, CALL_GT, DEFAULT)
    assert o.status is Status.COMPILE_ERROR and "List" in o.detail


def test_lcb_recursion_3000_deep(nsjail_sandbox):
    code = "def d(n):\n    return 0 if n == 0 else 1 + d(n - 1)\nprint(d(3000))"
    assert judge(nsjail_sandbox, code, stdin_gt("3000\n"), LCB).status is Status.CORRECT
    assert judge(nsjail_sandbox, code, stdin_gt("3000\n"), DEFAULT).status is Status.RUNTIME_ERROR


def test_lcb_stack_overflow_is_a_clean_runtime_error(after_attack):
    """With LiveCodeBench's 50,000 recursion limit a C-level recursion overflows the stack:
    the test's process dies of SIGSEGV, the harness survives and says so."""
    for code in (
        "def d(n):\n    return d(n + 1)\nd(0)",
        "x = []\nfor _ in range(200000):\n    x = [x]\nprint(repr(x)[:3])",
    ):
        o = judge(after_attack, code, stdin_gt("[[[\n"), LCB, test_timeout_s=10)
        assert o.status is Status.RUNTIME_ERROR, o


def test_lcb_prints_a_5000_digit_integer(nsjail_sandbox):
    import sys

    n = 7**5900  # 4,987 digits
    with_digits = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        gt = stdin_gt(str(n) + "\n")
    finally:
        sys.set_int_max_str_digits(with_digits)
    code = "print(7 ** 5900)"
    assert judge(nsjail_sandbox, code, gt, LCB).status is Status.CORRECT
    o = judge(nsjail_sandbox, code, gt, DEFAULT)
    assert o.status is Status.RUNTIME_ERROR and "4300" in o.detail


@pytest.mark.parametrize("ending", ["import sys\nsys.exit(1)", "exit('bye')"])
def test_lcb_output_then_system_exit_is_judged_by_its_output(nsjail_sandbox, ending):
    code = "print(3)\n" + ending
    assert judge(nsjail_sandbox, code, stdin_gt("3\n"), LCB).status is Status.CORRECT
    assert judge(nsjail_sandbox, code, stdin_gt("4\n"), LCB).status is Status.INCORRECT
    assert judge(nsjail_sandbox, code, stdin_gt("3\n"), DEFAULT).status is Status.RUNTIME_ERROR


def test_lcb_whole_sample_budget():
    """(6 + 1) x n + 5 s (LiveCodeBench's check_correctness), against min(6n + 3, 60) s."""
    assert item_timeout(Limits(), 20, 6.0, "lcb") == 145.0
    assert item_timeout(Limits(), 20, 6.0, "default") == 60.0
    assert item_timeout(Limits(), 100, 6.0, "lcb") == 300.0  # capped at the server's maximum
    assert item_timeout(Limits(timeout_s=9), 20, 6.0, "lcb") == 9.0


def test_lcb_slow_correct_program_with_many_tests(nsjail_sandbox):
    """Twelve tests of 0.4 s each: every one inside its 6 s, the sample inside (6+1)x12+5 s."""
    code = "import time\ntime.sleep(0.4)\nprint(int(input()) * 2)"
    gt = {"inputs": [f"{i}\n" for i in range(12)], "outputs": [f"{2 * i}\n" for i in range(12)]}
    o = judge(nsjail_sandbox, code, gt, LCB)
    assert o.status is Status.CORRECT and o.passed == 12


def test_lcb_generous_memory(nsjail_sandbox):
    code = "x = bytearray(1500 << 20)\nprint(len(x) >> 20)"
    o = judge(nsjail_sandbox, code, stdin_gt("1500\n"), LCB, test_timeout_s=20)
    assert o.status is Status.CORRECT, o
    o = judge(nsjail_sandbox, code, stdin_gt("1500\n"), DEFAULT, test_timeout_s=20)
    assert o.status is Status.MEMORY_LIMIT


def test_lcb_numpy_importable_and_scalars_compare_as_numbers(nsjail_sandbox):
    code = "import numpy as np\nprint(int(np.arange(4).sum()))"
    assert judge(nsjail_sandbox, code, stdin_gt("6\n"), LCB).status is Status.CORRECT
    assert judge(nsjail_sandbox, code, stdin_gt("6\n"), DEFAULT).status is Status.RUNTIME_ERROR
    scalar = "import numpy as np\ndef f(x):\n    return np.int64(x) * 2\n"
    gt = {"inputs": ["3"], "outputs": ["6"], "fn_name": "f"}
    assert judge(nsjail_sandbox, scalar, gt, LCB).status is Status.CORRECT
    array = "import numpy as np\ndef f(x):\n    return np.array([x])\n"
    gt = {"inputs": ["3"], "outputs": ["[3]"], "fn_name": "f"}
    # An array's == is elementwise: LiveCodeBench's judge fails it (ambiguous truth value).
    assert judge(nsjail_sandbox, array, gt, LCB).status is Status.INCORRECT


def test_lcb_extraction_takes_the_lines_between_the_last_two_fences():
    text = "<think>\n```python\nprint(1)\n```\n</think>\nsee `x` below\n```py\nprint(2)\nprint(3)\n```"
    assert lcb_code_block(text) == "print(2)\nprint(3)"
    # Fences inside lines count too, and a think block is not special to LiveCodeBench.
    assert lcb_code_block("a ``` b\nprint(9)\n c ```") == "print(9)"
    assert lcb_code_block("```python\nprint(1)") is None


def test_lcb_extraction_in_scoring(nsjail_sandbox):
    # An unclosed think block: no answer by default, LiveCodeBench reads the fences anyway.
    response = "<think>\nlet me write it\n```python\nprint(int(input()) + 1)\n```\n"
    gt = stdin_gt("2\n", "1\n")
    assert score_code(response, gt, Limits(), nsjail_sandbox, profile=LCB).status is Status.CORRECT
    o = score_code(response, gt, Limits(), nsjail_sandbox, profile=DEFAULT)
    assert o.status is Status.NO_ANSWER


# -- the released Skywork-OR1 reward ---------------------------------------------------------


def test_skywork_extraction_is_python_only_after_the_first_think_close():
    assert skywork_code_block("<think>a</think>\n```py\nprint(1)\n```") is None
    assert skywork_code_block("<think>a</think>```python\nprint(1)\n``` x ```python\nprint(2)\n```") == "print(2)\n"
    # Only the text between the first </think> and the next one counts.
    assert skywork_code_block("<think>a</think>```python\nA\n```</think>```python\nB\n```") == "A\n"
    assert skywork_code_block("```python\nprint(1)\n```") == "print(1)\n"


def test_skywork_assert_cases_get_the_import_prompt(nsjail_sandbox):
    code = "def f(x):\n    return gcd(x, 6) + (0 if inf > x else 1)\n"
    gt = {"assert_case": ["assert f(4) == 2", "assert isclose(f(9), 3.0)"]}
    assert judge(nsjail_sandbox, code, gt, SKYWORK).status is Status.CORRECT
    assert judge(nsjail_sandbox, code, gt, DEFAULT).status is Status.RUNTIME_ERROR


def test_skywork_units_have_two_seconds(nsjail_sandbox):
    code = "import time\ndef f(x):\n    time.sleep(3)\n    return x\n"
    gt = {"assert_case": ["assert f(1) == 1"]}
    assert judge(nsjail_sandbox, code, gt, SKYWORK).status is Status.TIMEOUT
    assert judge(nsjail_sandbox, code, gt, DEFAULT).status is Status.CORRECT


def test_skywork_program_names_win_over_the_preamble(nsjail_sandbox):
    """The import prompt brings ``from operator import *``; a program's own ``add`` must be the
    one the asserts call (as when the asserts follow the program in one file)."""
    code = "def add(a, b):\n    return a + b + 1\n"
    gt = {"assert_case": ["assert add(1, 2) == 3"]}
    assert judge(nsjail_sandbox, code, gt, SKYWORK).status is Status.INCORRECT


def test_skywork_unboxed_math_answer():
    for response, gold in [("<think>x</think> The answer is 42.", "42"),
                           ("<think>x</think> so it is $\\frac{1}{2}$", "0.5")]:
        assert score_math(response, gold, Limits(), SKYWORK).status is Status.CORRECT
        assert score_math(response, gold, Limits(), DEFAULT).status is Status.NO_ANSWER
    # The first </think> only: the release splits there and takes the next piece.
    assert score_math("<think>a</think>b</think> \\boxed{5}", "5", Limits(), SKYWORK).status is Status.NO_ANSWER
    assert score_math("<think>x</think> 41", "42", Limits(), SKYWORK).status is Status.INCORRECT


# -- choosing a profile ------------------------------------------------------------------------


def test_profile_per_item_and_server_default():
    with Scorer(ScoringConfig(workers=1, profile="skywork")) as s:
        answer = "<think>x</think> The answer is 42."
        by_default, default_item, bad = s.score([
            Item("a", "math", answer, "42"),
            Item("b", "math", answer, "42", profile="default"),
            Item("c", "math", answer, "42", profile="nope"),
        ])
    assert (by_default.status, by_default.profile) == (Status.CORRECT, "skywork")
    assert (default_item.status, default_item.profile) == (Status.NO_ANSWER, "default")
    assert bad.status is Status.INVALID_INPUT and "nope" in bad.detail


def test_profile_table_is_complete():
    assert set(PROFILE_TABLE) == {"default", "lcb", "skywork"}
    assert LCB.preamble.endswith("sys.setrecursionlimit(50000)\n")
