"""Judging profiles: one named test per rule of the profile table in docs/verifier-service.md
(real nsjail, real math-verify). Every rule is judged on a row: LiveCodeBench's release row shape
(``code_generation_lite``: public tests as JSON text, private tests compressed as the release
stores them, ``base64(zlib(pickle(json)))``, ``metadata.func_name``) or Skywork-OR1-RL-Data's
verl schema (``reward_model.ground_truth`` as JSON text: ``inputs``/``outputs``,
``assert_case``, ``import_prefix``/``test_code``/``entry_point``, math answers as a JSON list),
each read by the verifier's own row reader (``verifier.data.problems.parse_row``). Each rule is shown
to differ from the default profile where the reference judges differ from it.

References: LiveCodeBench/LiveCodeBench at 28fef95 (``lcb_runner/evaluation/testing_util.py``,
``compute_code_generation_metrics.py``, ``lcb_runner/utils/extraction_utils.py``) and
SkyworkAI/Skywork-OR1 at 64e96af (``verl/utils/reward_score/livecodebench/compute_score.py``)."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.conftest_sandbox import after_attack, forkserver_sandbox, nsjail_sandbox  # noqa: F401
from verifier.client import VerifierClient
from verifier.scoring.code_score import item_timeout, score_code
from verifier.scoring.extract import lcb_code_block, skywork_code_block
from verifier.items import Item, Limits, Status
from verifier.data.lcb import encode_lcb_tests
from verifier.scoring.math_score import score_math
from verifier.scoring.output_compare import compare_return
from verifier.data.problems import parse_row
from verifier.scoring.profiles import PROFILE_TABLE, get_profile
from verifier.scoring.scorer import Scorer, ScoringConfig
from verifier.service.server import ServeConfig, create_server

DEFAULT, LCB, SKYWORK = (get_profile(n) for n in ("default", "lcb", "skywork"))


# -- rows ------------------------------------------------------------------------------------


def lcb_row_gt(tests: list[tuple[str, str]], fn: str | None = None) -> Any:
    """The ground truth the verifier reads from a LiveCodeBench release row holding ``tests``
    ((input, output) pairs, as the release writes them): the first in ``public_test_cases``
    (JSON text), the others in ``private_test_cases``, compressed as the release stores them."""
    kind = "functional" if fn else "stdin"
    cases = [{"input": i, "output": o, "testtype": kind} for i, o in tests]
    row = {
        "question_title": "a title", "question_content": "Solve it.",
        "platform": "leetcode" if fn else "atcoder", "question_id": "q1", "contest_id": "c1",
        "contest_date": "2024-09-01T00:00:00", "difficulty": "medium",
        "starter_code": f"class Solution:\n    def {fn}(self, nums: List[int]) -> int:\n        "
        if fn else "",
        "public_test_cases": json.dumps(cases[:1]),
        "private_test_cases": encode_lcb_tests(cases[1:]),
        "metadata": json.dumps({"func_name": fn} if fn else {}),
    }
    parsed = parse_row(row, "test row")
    assert parsed.format == "lcb" and len(parsed.ground_truth["inputs"]) == len(tests)
    return parsed.ground_truth


def skywork_row_gt(ground_truth: Any, ability: str = "code") -> Any:
    """The ground truth the verifier reads from a Skywork-OR1-RL-Data row (verl schema) whose
    ``reward_model.ground_truth`` is ``ground_truth`` as JSON text."""
    row = {"data_source": f"train-{ability}", "ability": ability,
           "prompt": [{"role": "user", "content": "Solve it."}],
           "reward_model": {"ground_truth": json.dumps(ground_truth), "style": "rule"},
           "extra_info": {"index": 3}}
    parsed = parse_row(row, "skywork row")
    assert parsed.format == "verl"
    return parsed.ground_truth


def fenced(code: str) -> str:
    """A response every extraction rule reads the same way: one python block after the think."""
    return f"<think>\nplan\n</think>\nHere it is:\n```python\n{code}\n```\n"


def judge(sb, code, gt, profile, **limits):
    return score_code(fenced(code), gt, Limits(**limits), sb, profile=profile)


def stdin_row(out: str, inp: str = "\n") -> Any:
    return lcb_row_gt([(inp, out), (inp, out)])


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


def test_lcb_preamble_leetcode_program_without_imports(nsjail_sandbox):
    """List, Counter, heappush, inf, gcd and lru_cache without an import: LiveCodeBench's
    ``import_string`` runs before every program."""
    gt = lcb_row_gt([("[1, 1, 2]", "63"), ("[2, 2, 2]", "64")], fn="f")
    o = judge(nsjail_sandbox, LEETCODE_NO_IMPORTS, gt, LCB)
    assert (o.status, o.passed) == (Status.CORRECT, 2), o
    o = judge(nsjail_sandbox, LEETCODE_NO_IMPORTS, gt, DEFAULT)
    assert o.status is Status.COMPILE_ERROR and "List" in o.detail


def test_lcb_recursion_3000_deep(nsjail_sandbox):
    code = "def d(n):\n    return 0 if n == 0 else 1 + d(n - 1)\nprint(d(int(input())))"
    gt = lcb_row_gt([("3000\n", "3000\n"), ("2999\n", "2999\n")])
    assert judge(nsjail_sandbox, code, gt, LCB).status is Status.CORRECT
    assert judge(nsjail_sandbox, code, gt, DEFAULT).status is Status.RUNTIME_ERROR


C_DEEP = "x = []\nfor _ in range(200000):\n    x = [x]\n"  # repr(x) recurses in C


def test_lcb_stack_overflow_is_a_clean_runtime_error(after_attack):
    """With LiveCodeBench's 50,000 recursion limit a C-level recursion overflows the stack: the
    process running the program dies of SIGSEGV; the harness survives and says so, in every
    way a program is run (stdin, call-based, LeetCode-format units)."""
    for code in ("def d(n):\n    return d(n + 1)\nd(0)", C_DEEP + "print(repr(x)[:3])"):
        o = judge(after_attack, code, stdin_row("[[[\n"), LCB, test_timeout_s=10)
        assert o.status is Status.RUNTIME_ERROR, o
    deep_call = "def f(nums):\n" + "".join("    " + ln + "\n" for ln in C_DEEP.splitlines()) + \
        "    return len(repr(x))\n"
    o = judge(after_attack, deep_call, lcb_row_gt([("[1]", "1"), ("[2]", "1")], fn="f"), LCB,
              test_timeout_s=10)
    assert o.status is Status.RUNTIME_ERROR, o
    unit = skywork_row_gt({"import_prefix": "", "entry_point": "Solution().f",
                           "test_code": "def check(candidate):\n    assert candidate([1]) == 1\n"})
    o = judge(after_attack, "class Solution:\n    " + deep_call.replace("\n", "\n    ")
              .replace("def f(nums)", "def f(self, nums)"), unit, LCB, test_timeout_s=10)
    assert o.status is Status.RUNTIME_ERROR, o


def test_lcb_prints_a_5000_digit_integer(nsjail_sandbox):
    digits = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        text = str(7**5916)
    finally:
        sys.set_int_max_str_digits(digits)
    assert len(text) == 5000
    code = "print(7 ** 5916)"
    gt = stdin_row(text + "\n")
    assert judge(nsjail_sandbox, code, gt, LCB).status is Status.CORRECT
    o = judge(nsjail_sandbox, code, gt, DEFAULT)
    assert o.status is Status.RUNTIME_ERROR and "4300" in o.detail


@pytest.mark.parametrize("ending", ["import sys\nsys.exit(1)", "exit('bye')"])
def test_lcb_output_then_system_exit_is_judged_by_its_output(nsjail_sandbox, ending):
    code = "print(3)\n" + ending
    assert judge(nsjail_sandbox, code, stdin_row("3\n"), LCB).status is Status.CORRECT
    assert judge(nsjail_sandbox, code, stdin_row("4\n"), LCB).status is Status.INCORRECT
    assert judge(nsjail_sandbox, code, stdin_row("3\n"), DEFAULT).status is Status.RUNTIME_ERROR


def test_lcb_system_exit_in_a_call_based_program_fails(nsjail_sandbox):
    """LiveCodeBench swallows SystemExit for stdin programs only: in a call-based program it
    ends the judge's process before any result is recorded (all tests failed)."""
    code = "import sys\nclass Solution:\n    def f(self, nums):\n        sys.exit(0)\n"
    o = judge(nsjail_sandbox, code, lcb_row_gt([("[1]", "null"), ("[2]", "null")], fn="f"), LCB)
    assert o.status is not Status.CORRECT and o.passed == 0, o


def test_lcb_whole_sample_budget():
    """(6 + 1) x n + 5 s (LiveCodeBench's check_correctness), against min(6n + 3, 60) s."""
    assert item_timeout(Limits(), 20, 6.0, "lcb") == 145.0
    assert item_timeout(Limits(), 20, 6.0, "default") == 60.0
    assert item_timeout(Limits(), 100, 6.0, "lcb") == 300.0  # capped at the server's maximum
    assert item_timeout(Limits(timeout_s=9), 20, 6.0, "lcb") == 9.0


@pytest.mark.slow
def test_lcb_slow_correct_program_with_many_tests(nsjail_sandbox):
    """24 tests of 2.7 s each (a sleep: the same under any CPU load): every one inside its 6 s,
    the sample's 65 s inside LiveCodeBench's (6 + 1) x 24 + 5 = 173 s, and past the default
    profile's 60 s, which would stop it."""
    n, each = 24, 2.7
    code = f"import time\ntime.sleep({each})\nprint(int(input()) * 2)"
    gt = lcb_row_gt([(f"{i}\n", f"{2 * i}\n") for i in range(n)])
    assert item_timeout(Limits(), n, 6.0, DEFAULT.sample_budget) < n * each
    o = judge(nsjail_sandbox, code, gt, LCB)
    assert (o.status, o.passed) == (Status.CORRECT, n), o


def test_lcb_generous_memory(nsjail_sandbox):
    code = "x = bytearray(1500 << 20)\nprint(len(x) >> 20)"
    o = judge(nsjail_sandbox, code, stdin_row("1500\n"), LCB, test_timeout_s=20)
    assert o.status is Status.CORRECT, o
    o = judge(nsjail_sandbox, code, stdin_row("1500\n"), DEFAULT, test_timeout_s=20)
    assert o.status is Status.MEMORY_LIMIT


# Each test's process imports numpy afresh (LiveCodeBench's judge has it imported already): a
# generous test limit keeps these tests about the rule, not about a loaded machine's speed.
NUMPY_TEST_S = 20


def test_lcb_numpy_importable_and_scalars_compare_as_numbers(nsjail_sandbox):
    code = "import numpy as np\nprint(int(np.arange(4).sum()))"
    o = judge(nsjail_sandbox, code, stdin_row("6\n"), LCB, test_timeout_s=NUMPY_TEST_S)
    assert o.status is Status.CORRECT, o
    assert judge(nsjail_sandbox, code, stdin_row("6\n"), DEFAULT).status is Status.RUNTIME_ERROR
    scalar = "import numpy as np\nclass Solution:\n    def f(self, nums):\n        " \
             "return np.int64(nums[0]) * 2\n"
    gt = lcb_row_gt([("[3]", "6"), ("[5]", "10")], fn="f")
    o = judge(nsjail_sandbox, scalar, gt, LCB, test_timeout_s=NUMPY_TEST_S)
    assert o.status is Status.CORRECT, o


@pytest.mark.parametrize(("returned", "expected", "passes"), [
    ("np.array([nums[0] * 2])", "[6]", True),      # (array == [6]) is array([True])
    ("np.array([nums[0] * 2])", "6", True),        # broadcast against a scalar
    ("np.array([[nums[0] * 2]])", "[6]", True),    # any one-element shape
    ("np.array([nums[0] * 2])", "[7]", False),
    ("np.array([nums[0] * 2])", "[6, 6]", False),  # two results: truth value ambiguous
    ("np.array([nums[0], nums[0]])", "[3, 3]", False),
    ("[np.array([nums[0]]), 1]", "[[3], 1]", True),  # inside a list: list == asks each ==
])
def test_lcb_numpy_arrays_compare_as_livecodebench_compares_them(nsjail_sandbox, returned,
                                                                  expected, passes):
    """LiveCodeBench compares a result with ``==`` and reads an array result with
    ``.item(0)`` (compute_code_generation_metrics.py, evaluate_generations_by_problem): a
    one-element array passes against a one-element expected value; a larger one makes
    ``not result`` raise (a runtime error there)."""
    code = f"import numpy as np\nclass Solution:\n    def f(self, nums):\n        return {returned}\n"
    gt = lcb_row_gt([("[3]", expected), ("[3]", expected)], fn="f")
    o = judge(nsjail_sandbox, code, gt, LCB, test_timeout_s=NUMPY_TEST_S)
    assert (o.status is Status.CORRECT) is passes, o


def test_one_element_arrays_match_only_under_a_numpy_profile():
    """The judge applies LiveCodeBench's array rule only where the profile has numpy: under the
    default profile a forged array encoding equals nothing."""
    blob = json.dumps({"v": {"$": "np1", "v": 6}, "objs": []}).encode()
    assert compare_return(blob, [6], False, numpy_arrays=True)[0]
    assert compare_return(blob, [[6]], False, numpy_arrays=True)[0]
    assert not compare_return(blob, [6], False, numpy_arrays=False)[0]
    assert not compare_return(blob, {"a": 6}, False, numpy_arrays=True)[0]
    assert not compare_return(blob, [], False, numpy_arrays=True)[0]


def test_lcb_extraction_takes_the_lines_between_the_last_two_fences():
    text = "<think>\n```python\nprint(1)\n```\n</think>\nsee `x` below\n```py\nprint(2)\nprint(3)\n```"
    assert lcb_code_block(text) == "print(2)\nprint(3)"
    # Fences inside lines count too, and a think block is not special to LiveCodeBench.
    assert lcb_code_block("a ``` b\nprint(9)\n c ```") == "print(9)"
    assert lcb_code_block("```python\nprint(1)") is None


def test_lcb_extraction_in_scoring(nsjail_sandbox):
    # An unclosed think block: no answer by default, LiveCodeBench reads the fences anyway.
    response = "<think>\nlet me write it\n```python\nprint(int(input()) + 1)\n```\n"
    gt = lcb_row_gt([("1\n", "2\n"), ("5\n", "6\n")])
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


def test_skywork_extraction_in_scoring(nsjail_sandbox):
    """A ```py block is no answer for the release; the default rule takes it."""
    response = "<think>x</think>\n```py\nprint(int(input()) + 1)\n```\n"
    gt = skywork_row_gt({"inputs": ["1\n", "5\n"], "outputs": ["2\n", "6\n"]})
    o = score_code(response, gt, Limits(), nsjail_sandbox, profile=SKYWORK)
    assert o.status is Status.NO_ANSWER
    o = score_code(response, gt, Limits(), nsjail_sandbox, profile=DEFAULT)
    assert o.status is Status.CORRECT


def test_skywork_assert_cases_get_the_import_prompt(nsjail_sandbox):
    code = "def f(x):\n    return gcd(x, 6) + (0 if inf > x else 1)\n"
    gt = skywork_row_gt({"assert_case": ["assert f(4) == 2", "assert isclose(f(9), 3.0)"]})
    assert judge(nsjail_sandbox, code, gt, SKYWORK).status is Status.CORRECT
    assert judge(nsjail_sandbox, code, gt, DEFAULT).status is Status.RUNTIME_ERROR


def test_skywork_leetcode_units_get_only_the_rows_import_prefix(nsjail_sandbox):
    """The release's LeetCode-format branch prepends the row's ``import_prefix`` and nothing
    else (no IMPORT_PROMPT, no LiveCodeBench preamble)."""
    code = "class Solution:\n    def f(self, nums):\n        return max(Counter(nums).values())\n"
    check = "def check(candidate):\n    assert candidate([1, 1, 2]) == 2\n    assert candidate([5]) == 1\n"
    bare = skywork_row_gt({"import_prefix": "", "test_code": check, "entry_point": "Solution().f"})
    with_prefix = skywork_row_gt({"import_prefix": "from collections import *\n",
                                  "test_code": check, "entry_point": "Solution().f"})
    assert judge(nsjail_sandbox, code, with_prefix, SKYWORK).status is Status.CORRECT
    assert judge(nsjail_sandbox, code, bare, SKYWORK).status is not Status.CORRECT
    assert judge(nsjail_sandbox, code, bare, LCB).status is Status.CORRECT  # LCB's environment


def test_skywork_units_have_two_seconds(nsjail_sandbox):
    code = "import time\ndef f(x):\n    time.sleep(3)\n    return x\n"
    gt = skywork_row_gt({"assert_case": ["assert f(1) == 1"]})
    assert judge(nsjail_sandbox, code, gt, SKYWORK).status is Status.TIMEOUT
    assert judge(nsjail_sandbox, code, gt, DEFAULT).status is Status.CORRECT


def test_skywork_program_names_win_over_the_preamble(nsjail_sandbox):
    """The import prompt brings ``from operator import *``; a program's own ``add`` must be the
    one the asserts call (as when the asserts follow the program in one file)."""
    code = "def add(a, b):\n    return a + b + 1\n"
    gt = skywork_row_gt({"assert_case": ["assert add(1, 2) == 3"]})
    assert judge(nsjail_sandbox, code, gt, SKYWORK).status is Status.INCORRECT


def test_skywork_unboxed_math_answer():
    golds = {g: skywork_row_gt([g], ability="math") for g in ("42", "0.5", "5")}
    for response, gold in [("<think>x</think> The answer is 42.", "42"),
                           ("<think>x</think> so it is $\\frac{1}{2}$", "0.5")]:
        assert score_math(response, golds[gold], Limits(), SKYWORK).status is Status.CORRECT
        assert score_math(response, golds[gold], Limits(), DEFAULT).status is Status.NO_ANSWER
    # The first </think> only: the release splits there and takes the next piece.
    o = score_math("<think>a</think>b</think> \\boxed{5}", golds["5"], Limits(), SKYWORK)
    assert o.status is Status.NO_ANSWER
    o = score_math("<think>x</think> 41", golds["42"], Limits(), SKYWORK)
    assert o.status is Status.INCORRECT


# -- choosing a profile ------------------------------------------------------------------------

UNBOXED = "<think>x</think> The answer is 42."


def test_profile_per_item_and_server_default():
    with Scorer(ScoringConfig(workers=1, profile="skywork")) as s:
        by_default, default_item, bad = s.score([
            Item("a", "math", UNBOXED, "42"),
            Item("b", "math", UNBOXED, "42", profile="default"),
            Item("c", "math", UNBOXED, "42", profile="nope"),
        ])
    assert (by_default.status, by_default.profile) == (Status.CORRECT, "skywork")
    assert (default_item.status, default_item.profile) == (Status.NO_ANSWER, "default")
    assert bad.status is Status.INVALID_INPUT and "nope" in bad.detail


def test_profile_over_the_wire():
    """A real server whose default is ``skywork`` (``verifier serve --profile skywork``): items
    that name no profile get it, an item's own profile wins, and every result says which."""
    srv, port = create_server("127.0.0.1:0",
                              ServeConfig(scoring=ScoringConfig(workers=1, profile="skywork")))
    try:
        with VerifierClient(f"127.0.0.1:{port}") as client:
            results = client.score([
                {"id": "a", "domain": "math", "response": UNBOXED, "ground_truth": "42"},
                {"id": "b", "domain": "math", "response": UNBOXED, "ground_truth": "42",
                 "profile": "default"},
                {"id": "c", "domain": "math", "response": "\\boxed{42}", "ground_truth": "42",
                 "profile": "lcb"},
            ])
    finally:
        srv.stop(grace_s=1.0)
    by_id = {r.id: (r.status, r.profile) for r in results}
    assert by_id == {"a": (Status.CORRECT, "skywork"), "b": (Status.NO_ANSWER, "default"),
                     "c": (Status.CORRECT, "lcb")}


def test_profile_table_is_complete():
    assert set(PROFILE_TABLE) == {"default", "lcb", "skywork"}
    assert LCB.preamble.endswith("sys.setrecursionlimit(50000)\n")
