"""score_code on every format of docs/contracts.md 1, right and wrong, with LiveCodeBench's comparison
rules, early stop vs run-all, bad ground truths and a broken sandbox. Real nsjail."""

from __future__ import annotations

import ast
import json
import marshal
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from sandbox.nsjail import NsjailSandbox
from tests.conftest_sandbox import (SUM_GT, SUM_OK, nsjail_sandbox, refuse_sandbox,  # noqa: F401
                                    respond)
from verifier.scoring import code_score
from verifier.scoring.code_score import score_code
from verifier.scoring.checker_jail import Case, checker_run
from verifier.scoring.checkers import parse_checker
from verifier.data.ground_truth import BadGroundTruth, parse_ground_truth
from verifier.harness import build, framing, harness_source
from verifier.scoring.output_compare import outputs_match, values_match
from verifier.items import PROFILES, Item, Limits, Status
from verifier.scoring.profiles import get_profile
from verifier.scoring.scorer import Scorer, ScoringConfig


def score(sb, code, gt, **limits):
    return score_code(respond(code), gt, Limits(**limits), sb)


# -- stdin/stdout ----------------------------------------------------------------------------


def test_stdio_correct(nsjail_sandbox):
    o = score(nsjail_sandbox, SUM_OK, SUM_GT)
    assert o.status is Status.CORRECT and (o.passed, o.total) == (3, 3)


def test_stdio_ground_truth_as_json_string(nsjail_sandbox):
    o = score(nsjail_sandbox, SUM_OK, json.dumps(SUM_GT))
    assert o.status is Status.CORRECT


def test_stdio_wrong(nsjail_sandbox):
    o = score(nsjail_sandbox, "a, b = map(int, input().split())\nprint(a * b)", SUM_GT)
    assert o.status is Status.INCORRECT and o.passed == 0 and o.total == 3
    assert "test 1/3" in o.detail


def test_stdio_multiline_and_sys_stdin(nsjail_sandbox):
    gt = {"inputs": ["3\n1 2 3\n", "2\n5 5\n"], "outputs": ["6\n", "10\n"]}
    code = "import sys\ndata = sys.stdin.read().split()\nn = int(data[0])\nprint(sum(map(int, data[1:1 + n])))"
    assert score(nsjail_sandbox, code, gt).status is Status.CORRECT


def test_stdio_exit_builtin_and_main_guard(nsjail_sandbox):
    code = "def main():\n    a, b = map(int, input().split())\n    print(a + b)\n    exit()\nif __name__ == '__main__':\n    main()"
    assert score(nsjail_sandbox, code, SUM_GT).status is Status.CORRECT


def test_lcb_rules_whitespace_and_blank_lines(nsjail_sandbox):
    gt = {"inputs": ["x\n"], "outputs": ["1 2\n3\n"]}
    code = "print()\nprint('1 2   ')\nprint('   3')\nprint()\nprint()"
    assert score(nsjail_sandbox, code, gt).status is Status.CORRECT


def test_lcb_rules_numeric_tolerance(nsjail_sandbox):
    gt = {"inputs": ["x\n"], "outputs": ["1.0 2\n0.50\n"]}
    assert score(nsjail_sandbox, "print('1 2.000')\nprint(0.5)", gt).status is Status.CORRECT
    assert score(nsjail_sandbox, "print('1 2.001')\nprint(0.5)", gt).status is Status.INCORRECT


def test_outputs_match_rules():
    assert outputs_match("3\n", "3")
    assert outputs_match("  3  \n\n\n", "3\n")
    assert outputs_match("1.0\n", "1")
    assert outputs_match("1e2", "100")
    assert outputs_match("a b\n1 2", "a b  \n1.0 2.00")
    assert not outputs_match("a  b", "a b")  # not numeric: compared as stripped strings
    assert not outputs_match("1\n2", "1 2")
    assert not outputs_match("1\n\n2", "1\n2")  # inner blank lines count
    assert not outputs_match("YES", "yes")
    assert not outputs_match("", "0")
    assert outputs_match("", "\n")
    assert not outputs_match("nan", "1")


def test_values_match_rules():
    assert values_match((1, 2), [1, 2])
    assert not values_match([(1, 2)], [[1, 2]])  # only the top level (LiveCodeBench)
    assert values_match(5, [5], taco=True) and not values_match(5, [5])
    assert not values_match({1: 2}, {"1": 2})


# -- call-based ------------------------------------------------------------------------------

CALL_GT = {
    "inputs": ["[1, 2, 3]\n2", "[]\n0", "[5]\n-1"],
    "outputs": ["[2, 4, 6]", "[]", "[-5]"],
    "fn_name": "scale",
}


def test_call_based_bare_function(nsjail_sandbox):
    o = score(nsjail_sandbox, "def scale(xs, k):\n    return [x * k for x in xs]", CALL_GT)
    assert o.status is Status.CORRECT and (o.passed, o.total) == (3, 3)


def test_call_based_solution_class_and_tuple(nsjail_sandbox):
    code = "from typing import List\nclass Solution:\n    def scale(self, xs: List[int], k: int) -> List[int]:\n        return tuple(x * k for x in xs)"
    assert score(nsjail_sandbox, code, CALL_GT).status is Status.CORRECT


def test_call_based_wrong(nsjail_sandbox):
    o = score(nsjail_sandbox, "def scale(xs, k):\n    return xs", CALL_GT)
    assert o.status is Status.INCORRECT and o.passed == 0


def test_call_based_missing_function(nsjail_sandbox):
    o = score(nsjail_sandbox, "def other(xs, k):\n    return xs", CALL_GT)
    assert o.status is Status.RUNTIME_ERROR and "scale" in o.detail


def test_call_based_exception_and_run_all(nsjail_sandbox):
    code = "def scale(xs, k):\n    if not xs: raise ValueError('empty')\n    return [x * k for x in xs]"
    o = score(nsjail_sandbox, code, CALL_GT, run_all_tests=True)
    assert o.status is Status.RUNTIME_ERROR and (o.passed, o.total) == (2, 3)
    assert "ValueError" in o.detail


def test_call_based_taco_lists(nsjail_sandbox):
    gt = {"inputs": [[1, 2], [3, 4]], "outputs": [[3], [7]], "fn_name": "add"}
    assert score(nsjail_sandbox, "def add(a, b):\n    return a + b", gt).status is Status.CORRECT


def test_call_based_dict_and_strings(nsjail_sandbox):
    gt = {
        "inputs": ['"hello"'],
        "outputs": ['{"h": 1, "e": 1, "l": 2, "o": 1}'],
        "fn_name": "count",
    }
    code = "from collections import Counter\ndef count(s):\n    return dict(Counter(s))"
    assert score(nsjail_sandbox, code, gt).status is Status.CORRECT


# -- LeetCode style --------------------------------------------------------------------------

PREFIX = (
    "from typing import *\n"
    "class ListNode:\n"
    "    def __init__(self, val=0, next=None):\n"
    "        self.val = val\n"
    "        self.next = next\n"
    "def list_node(values):\n"
    "    head = ListNode()\n"
    "    p = head\n"
    "    for v in values:\n"
    "        p.next = ListNode(v)\n"
    "        p = p.next\n"
    "    return head.next\n"
    "def is_same_list(a, b):\n"
    "    while a and b:\n"
    "        if a.val != b.val:\n"
    "            return False\n"
    "        a, b = a.next, b.next\n"
    "    return a is None and b is None\n"
)
LEET_GT = {
    "import_prefix": PREFIX,
    "test_code": (
        "def check(candidate):\n"
        "    assert is_same_list(candidate(head=list_node([1, 2, 3])), list_node([3, 2, 1]))\n"
        "    assert is_same_list(candidate(head=list_node([7])), list_node([7]))\n"
        "    assert candidate(head=None) is None\n"
        "    assert is_same_list(candidate(list_node(list(range(3000)))), list_node(list(range(2999, -1, -1))))\n"
    ),
    "entry_point": "Solution().reverseList",
}
REVERSE_OK = (
    "class Solution:\n"
    "    def reverseList(self, head: Optional[ListNode]) -> Optional[ListNode]:\n"
    "        prev = None\n"
    "        while head:\n"
    "            head.next, prev, head = prev, head, head.next\n"
    "        return prev\n"
)


def test_leetcode_correct(nsjail_sandbox):
    o = score(nsjail_sandbox, REVERSE_OK, LEET_GT)
    assert o.status is Status.CORRECT and (o.passed, o.total) == (4, 4), o


def test_leetcode_wrong(nsjail_sandbox):
    o = score(
        nsjail_sandbox,
        "class Solution:\n    def reverseList(self, head):\n        return head",
        LEET_GT,
        run_all_tests=True,
    )
    assert o.status is Status.INCORRECT and (o.passed, o.total) == (2, 4), o


def test_leetcode_simple_values(nsjail_sandbox):
    gt = {
        "import_prefix": "from typing import *",
        "test_code": "def check(candidate):\n    assert candidate(nums=[2, 7, 11, 15], target=9) == [0, 1]\n    assert candidate(nums=[3, 2, 4], target=6) == [1, 2]\n",
        "entry_point": "Solution().twoSum",
    }
    code = (
        "class Solution:\n"
        "    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n"
        "        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n"
        "                return [seen[target - x], i]\n"
        "            seen[x] = i\n"
    )
    assert score(nsjail_sandbox, code, gt).status is Status.CORRECT
    assert (
        score(
            nsjail_sandbox, code.replace("[seen[target - x], i]", "[i, seen[target - x]]"), gt
        ).status
        is Status.INCORRECT
    )


def test_leetcode_in_place_argument(nsjail_sandbox):
    gt = {
        "import_prefix": "from typing import *",
        "test_code": (
            "def check(candidate):\n"
            "    nums = [1, 2, 3, 4]\n"
            "    candidate(nums, 1)\n"
            "    assert nums == [4, 1, 2, 3]\n"
            "    nums = [5, 6]\n"
            "    assert candidate(nums, 2) is None\n"
            "    assert nums == [5, 6]\n"
        ),
        "entry_point": "Solution().rotate",
    }
    code = "class Solution:\n    def rotate(self, nums: List[int], k: int) -> None:\n        k %= len(nums)\n        nums[:] = nums[-k:] + nums[:-k]\n"
    o = score(nsjail_sandbox, code, gt)
    assert o.status is Status.CORRECT and o.total == 3, o


def test_leetcode_exception_between_asserts(nsjail_sandbox):
    gt = {
        "import_prefix": "",
        "test_code": "def check(candidate):\n    assert candidate(1) == 2\n    x = candidate(0)\n    assert x == 1\n    assert candidate(3) == 4\n",
        "entry_point": "inc",
    }
    code = "def inc(x):\n    if x == 0:\n        raise ZeroDivisionError('no')\n    return x + 1"
    o = score(nsjail_sandbox, code, gt, run_all_tests=True)
    assert o.status is Status.RUNTIME_ERROR and (o.passed, o.total) == (2, 3), o


# -- assert cases ----------------------------------------------------------------------------

ASSERT_GT = {
    "assert_case": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
}


def test_asserts_correct(nsjail_sandbox):
    o = score(nsjail_sandbox, "def add(a, b):\n    return a + b", ASSERT_GT)
    assert o.status is Status.CORRECT and (o.passed, o.total) == (3, 3)


def test_asserts_wrong_run_all(nsjail_sandbox):
    o = score(
        nsjail_sandbox,
        "def add(a, b):\n    return a + b if a > 0 else 7",
        ASSERT_GT,
        run_all_tests=True,
    )
    assert o.status is Status.INCORRECT and (o.passed, o.total) == (2, 3)


def test_asserts_with_statements_and_classes(nsjail_sandbox):
    gt = {
        "assert_case": [
            "s = Stack()\ns.push(4)\ns.push(5)\nassert s.pop() == 5\nassert len(s.items) == 1",
            "assert math.isclose(area(1.0), 3.14159, rel_tol=1e-4)",
        ]
    }
    code = "import math\nclass Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\ndef area(r):\n    return math.pi * r * r"
    o = score(
        nsjail_sandbox,
        "import math\n" + code,
        {"assert_case": ["import math\n" + gt["assert_case"][1], gt["assert_case"][0]]},
    )
    assert o.status is Status.CORRECT, o


def test_asserts_undefined_function(nsjail_sandbox):
    o = score(nsjail_sandbox, "def plus(a, b):\n    return a + b", ASSERT_GT)
    assert o.status is Status.RUNTIME_ERROR and "add" in o.detail


# -- early stop vs run-all -------------------------------------------------------------------

FIVE = {"inputs": [f"{i}\n" for i in range(5)], "outputs": [f"{i * i}\n" for i in range(5)]}
FAILS_AT_1 = "n = int(input())\nprint(n * n if n != 1 else -1)"


def test_early_stop_counts(nsjail_sandbox):
    o = score(nsjail_sandbox, FAILS_AT_1, FIVE)
    assert o.status is Status.INCORRECT and (o.passed, o.total) == (1, 5)


def test_run_all_counts(nsjail_sandbox):
    o = score(nsjail_sandbox, FAILS_AT_1, FIVE, run_all_tests=True)
    assert o.status is Status.INCORRECT and (o.passed, o.total) == (4, 5)


def test_early_stop_skips_slow_tests(nsjail_sandbox):
    import time

    code = "import time\nn = int(input())\nif n == 0:\n    print(-1)\nelse:\n    time.sleep(0.5)\n    print(n * n)"
    t = time.monotonic()
    o = score(nsjail_sandbox, code, FIVE)
    assert o.status is Status.INCORRECT and o.passed == 0
    assert time.monotonic() - t < 1.5


def test_run_all_after_timeout(nsjail_sandbox):
    code = "n = int(input())\nwhile n == 2:\n    pass\nprint(n * n)"
    o = score(nsjail_sandbox, code, FIVE, run_all_tests=True, test_timeout_s=1)
    assert o.status is Status.TIMEOUT and (o.passed, o.total) == (4, 5)


def test_item_deadline_bounds_everything(nsjail_sandbox):
    import time

    code = "import time\ntime.sleep(0.8)\nprint(int(input()) ** 2)"
    t = time.monotonic()
    o = score(nsjail_sandbox, code, FIVE, timeout_s=2.0, test_timeout_s=5)
    assert o.status is Status.TIMEOUT and 0 < o.passed < 5
    assert time.monotonic() - t < 4


# -- no answer, syntax -----------------------------------------------------------------------


def test_no_code_block(nsjail_sandbox):
    o = score_code("The answer is 42.", SUM_GT, Limits(), nsjail_sandbox)
    assert o.status is Status.NO_ANSWER and o.total == 3


def test_unclosed_think(nsjail_sandbox):
    o = score_code("<think>\n```python\nprint(3)\n```\nhmm", SUM_GT, Limits(), nsjail_sandbox)
    assert o.status is Status.NO_ANSWER


def test_last_block_after_think_is_used(nsjail_sandbox):
    resp = (
        "<think>```python\nprint('no')\n```</think>\n```python\nprint('wrong')\n```\nfinal:\n```python\n"
        + SUM_OK
        + "\n```"
    )
    assert score_code(resp, SUM_GT, Limits(), nsjail_sandbox).status is Status.CORRECT


def test_syntax_error(nsjail_sandbox):
    o = score(nsjail_sandbox, "def f(:\n    pass", SUM_GT)
    assert o.status is Status.SYNTAX_ERROR and o.total == 3


# -- bad ground truth ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gt, fragment",
    [
        ({"inputs": ["1"], "outputs": ["1", "2"]}, "'outputs' has 2"),
        ({"inputs": [], "outputs": []}, "empty"),
        ({"inputs": "1", "outputs": ["1"]}, "'inputs' must be a list"),
        ({"inputs": [1], "outputs": ["1"]}, "inputs[0]"),
        ({"inputs": ["x"], "outputs": ["1"], "fn_name": "f"}, "inputs[0]"),
        ({"inputs": ["1"], "outputs": ["not json"], "fn_name": "f"}, "outputs[0]"),
        ({"inputs": ["1"], "outputs": ["1"], "fn_name": "no such"}, "fn_name"),
        ({"assert_case": []}, "assert_case"),
        ({"assert_case": ["x = 1"]}, "no assert"),
        ({"assert_case": ["assert ("]}, "does not parse"),
        ({"test_code": "def check(c):\n    assert c(1) == 1", "entry_point": ""}, "entry_point"),
        ({"test_code": "", "entry_point": "f"}, "test_code"),
        ({"something": 1}, "none of the known formats"),
        ("just text", "plain string"),
        (42, "must be an object"),
        ('{"inputs": ["1"]', "plain string"),
    ],
)
def test_invalid_ground_truth(nsjail_sandbox, gt, fragment):
    o = score(nsjail_sandbox, SUM_OK, gt)
    assert o.status is Status.INVALID_INPUT, o
    assert fragment in o.detail, o.detail


def test_parse_ground_truth_counts():
    assert parse_ground_truth(LEET_GT).total == 4
    assert parse_ground_truth(ASSERT_GT).total == 3
    with pytest.raises(BadGroundTruth):
        parse_ground_truth(None)


def test_broken_import_prefix_is_invalid_input(nsjail_sandbox):
    gt = dict(LEET_GT, import_prefix="import no_such_module_xyz")
    o = score(nsjail_sandbox, REVERSE_OK, gt)
    assert o.status is Status.INVALID_INPUT and "import_prefix" in o.detail


# -- the smallest memory limit ----------------------------------------------------------------

TRIVIAL = {
    "stdio": ("a, b = map(int, input().split())\nprint(a + b)",
              {"inputs": ["1 2\n"], "outputs": ["3\n"]}),
    "call": ("class Solution:\n    def add(self, a, b):\n        return a + b\n",
             {"inputs": ["1\n2"], "outputs": ["3"], "fn_name": "add"}),
    "asserts": ("def add(a, b):\n    return a + b\n", {"assert_case": ["assert add(1, 2) == 3"]}),
    "leetcode": ("class Solution:\n    def add(self, a, b):\n        return a + b\n",
                 {"import_prefix": "",
                  "test_code": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
                  "entry_point": "Solution().add"}),
}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("fmt", list(TRIVIAL))
def test_a_trivial_program_is_judged_at_the_minimum_memory_limit(nsjail_sandbox, fmt, profile):
    """At MIN_MEMORY_MB (the server's smallest accepted limit) the harness runs and a correct
    program is CORRECT, in every format under every profile. (At 8 MiB it was RUNTIME_ERROR.)"""
    code, gt = TRIVIAL[fmt]
    o = score_code(respond(code), gt, Limits(memory_mb=code_score.MIN_MEMORY_MB), nsjail_sandbox,
                   profile=get_profile(profile))
    assert o.status is Status.CORRECT, o


# -- the record stream -------------------------------------------------------------------------


def _record(key: bytes, head: dict, blobs: list[bytes]) -> bytes:
    """One authenticated record as the harness's Reporter frames it."""
    text = json.dumps(dict(head, blobs=[len(b) for b in blobs])).encode()
    frame = [framing.MAGIC, len(text).to_bytes(4, "big"), text, *blobs]
    return b"".join(frame) + framing.hmac_sha256(key, frame)


@pytest.mark.parametrize(
    "bad",
    [
        {"type": ["test"]},
        {"type": {"test": 1}},
        {"status": ["exited"]},
        {"status": {"exited": 1}},
        {"i": "0"},
        {"status": "signal", "signal": [9]},
        {"status": "timeout", "detail": {"why": 1}},
        {"exit": "0"},
        {"raised": 1},
    ],
    ids=repr,
)
def test_a_record_with_a_field_of_the_wrong_type_is_the_programs_failure(bad):
    """Every header field the judge reads has its type checked: anything else is the program's
    failure (RUNTIME_ERROR, "malformed"), never an exception in the judge (an unhashable
    status used to raise TypeError there: SANDBOX_ERROR) and never ignored."""
    spec = parse_ground_truth(SUM_GT)
    judge = code_score._Judge(spec, True, code_score.run_inline, time.monotonic() + 10)
    keys = [bytes([k]) * framing.KEY_BYTES for k in range(4)]
    stream = code_score._Stream(keys, judge.on_record)
    head = {"type": "test", "i": 0, "status": "exited", "exit": 0, "raised": False, "seq": 0}
    assert stream.feed(_record(keys[0], {**head, **bad}, [b"3\n", b""])) is False
    assert not stream.error
    status, detail = judge.results[0]
    assert status is Status.RUNTIME_ERROR and "malformed record" in detail, detail
    # The same record, well-formed, is judged as usual.
    judge = code_score._Judge(spec, True, code_score.run_inline, time.monotonic() + 10)
    stream = code_score._Stream(keys, judge.on_record)
    assert stream.feed(_record(keys[0], head, [b"3\n", b""])) is True
    assert judge.results[0] == (Status.CORRECT, "")


def test_small_stdout_comparisons_run_on_the_judges_thread_and_large_ones_in_a_worker():
    """A stdin/stdout test whose outputs are small is compared on the judge's thread (no
    worker's round trip, so a wrong answer's jail is stopped sooner), with the same rule as
    the workers' (LiveCodeBench's: 1.0 equals 1); past ``INLINE_COMPARE_BYTES`` the program's
    output goes to ``run_bounded``, a worker under a deadline."""
    calls = []

    def run_bounded(fn, args, deadline_s):
        calls.append(len(args[0]))
        return fn(*args)

    spec = parse_ground_truth({"inputs": ["x\n"] * 4, "outputs": ["1 2.5\n", "7\n", "1\n",
                                                                   "9\n"]})
    judge = code_score._Judge(spec, True, run_bounded, time.monotonic() + 10)
    head = {"type": "test", "status": "exited", "exit": 0, "raised": False}
    assert judge.judge_test({**head, "i": 0}, [b"1.0 2.50\n", b""]) == (Status.CORRECT, "")
    status, detail = judge.judge_test({**head, "i": 1}, [b"8\n", b""])
    assert status is Status.INCORRECT and "expected '7" in detail, detail
    assert calls == []
    big = b"1" + b" " * code_score.INLINE_COMPARE_BYTES + b"\n"  # strips to "1": right
    assert judge.judge_test({**head, "i": 2}, [big, b""]) == (Status.CORRECT, "")
    status, _ = judge.judge_test({**head, "i": 3}, [b"8" * code_score.INLINE_COMPARE_BYTES, b""])
    assert status is Status.INCORRECT
    assert calls == [code_score.INLINE_COMPARE_BYTES]  # the big right one was identical


RECORD_VALUES = [None, True, False, 0, -7, 2**70, 1.5, -0.0, 1e300, float("inf"), float("-inf"),
                 float("nan"), "", "plain text_1.2-3", 'a quote " and a \\ backslash',
                 "tab\tnew\nline\rnul\x00us\x1fdel\x7f\b\f",
                 "SyntaxError: invalid syntax (solution.py, line 1)", "é ü ✓ 中文 \u2028",
                 "astral 𝄞 😀", "a lone \udc80 surrogate", [1, 2, 3], []]


@pytest.mark.parametrize("key_len", [0, 1, 32, 64, 65, 200])
def test_the_harness_signs_records_with_rfc2104_hmac_sha256(key_len):
    """The harness's own HMAC (no hashlib in the jail) is the standard library's, which the
    judge checks records with, for keys shorter than, as long as and longer than a block."""
    import hashlib
    import hmac

    key = bytes(range(key_len % 256)) * (key_len // 256 + 1)
    key = key[:key_len]
    parts = [b"MGK1", b"\x00\x00\x00\x02", b"{}", bytes(range(256)) * 12, b""]
    want = hmac.new(key, b"".join(parts), hashlib.sha256).digest()
    assert framing.hmac_sha256(key, parts) == want


def test_record_headers_are_jsons_own_text_without_importing_json():
    """The harness writes each record's header as json.dumps would (compact), for every kind
    of value a header holds (a syntax error's message, control characters, non-ASCII text,
    astral characters, lone surrogates, non-finite floats), and never imports json for it
    (~4 ms of a jail's CPU)."""
    probe = ("import sys\nns = {'__name__': 'harness'}\n"
             "exec(compile(sys.stdin.read(), 'harness.py', 'exec'), ns)\n"
             f"inf, nan = float('inf'), float('nan')\nvalues = {RECORD_VALUES!r}\n"
             "out = [ns['_dumps']({'detail': v, 'i': 1}).decode() for v in values]\n"
             "print(repr(out))\nprint('json' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-I", "-S", "-c", probe], input=harness_source(),
                         capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    got, imported = run.stdout.decode().splitlines()
    want = [json.dumps({"detail": v, "i": 1}, separators=(",", ":")) for v in RECORD_VALUES]
    assert ast.literal_eval(got) == want
    assert imported == "False"


# -- the judge-harness payload -----------------------------------------------------------------
# Declared once (framing.PAYLOAD_FIELDS), built in one function (code_score.harness_payload),
# checked on both sides.

LEETCODE_GT = {
    "test_code": "def check(candidate):\n    assert candidate(1) == 2\n",
    "entry_point": "inc",
}
PAYLOAD_ARGS = dict(test_timeout=6, memory_mb=256, output_bytes=1 << 20, stop_on_fail=True,
                    oom_is_memory=True, budget_s=12.5, packages="/opt/sandbox-packages")


def _declared(mode: str) -> set[str]:
    return set(framing.PAYLOAD_FIELDS) | set(framing.PAYLOAD_MODE_FIELDS[mode])


@pytest.mark.parametrize("profile", ["default", "lcb", "skywork"])
@pytest.mark.parametrize("gt", [SUM_GT, CALL_GT, ASSERT_GT, LEETCODE_GT],
                         ids=["stdio", "call", "asserts", "leetcode"])
def test_the_judge_builds_exactly_the_declared_payload(gt, profile):
    spec = parse_ground_truth(gt)
    cfg = code_score.harness_payload(spec, "print(1)", get_profile(profile), **PAYLOAD_ARGS)
    assert set(cfg) == _declared(spec.mode)
    assert framing.payload_problem(cfg) == ""
    assert marshal.loads(marshal.dumps(cfg, 4)) == cfg  # what the harness receives


def test_the_declared_payload_is_the_one_the_harness_reads():
    """Every ``cfg[...]`` the harness's parts read is declared (or one main() adds itself);
    every declared field is read somewhere."""
    read: set[str] = set()
    for part in build.PARTS:
        for node in ast.walk(ast.parse((build.HERE / part).read_text())):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                    and node.value.id == "cfg" and isinstance(node.slice, ast.Constant)):
                read.add(node.slice.value)
    own = {"_budget", "_deadline"}  # set by main() from budget_s on arrival
    declared = set().union(*map(_declared, framing.PAYLOAD_MODE_FIELDS))
    assert read - own == declared


def _payload(mode: str) -> dict:
    """A payload of ``mode`` as the judge builds it (a checker's: verifier/scoring/checker_jail.py)."""
    if mode == "checker":
        checker = parse_checker({"language": "python", "source": "pass"})
        cfg, _limits = checker_run(checker, [Case(0, "1\n", b"2\n", "1\n")], test_timeout=6,
                                   memory_mb=256, stop_on_fail=True, oom_is_memory=True)
        return cfg
    spec = parse_ground_truth({"stdio": SUM_GT, "call": CALL_GT, "check": ASSERT_GT}[mode])
    return code_score.harness_payload(spec, "print(1)", get_profile("default"), **PAYLOAD_ARGS)


def test_the_checker_payload_is_the_declared_one():
    cfg = _payload("checker")
    assert set(cfg) == _declared("checker") and framing.payload_problem(cfg) == ""
    assert marshal.loads(marshal.dumps(cfg, 4)) == cfg


@pytest.mark.parametrize("mode", sorted(framing.PAYLOAD_MODE_FIELDS))
def test_the_payload_check_names_what_is_wrong(mode):
    cfg = _payload(mode)
    for field in _declared(mode):
        bad = {k: v for k, v in cfg.items() if k != field}
        assert field in framing.payload_problem(bad), field
    assert "'extra'" in framing.payload_problem({**cfg, "extra": 1})
    assert "'memory_mb' is a bool" in framing.payload_problem({**cfg, "memory_mb": True})
    assert "unknown mode" in framing.payload_problem({**cfg, "mode": "json"})
    assert "not a dict" in framing.payload_problem([cfg])


CRASHING = "def f():\n    raise KeyError('k')\n\nf()\n"
SHOW_CRASH = r"""
import os, sys
ns = {"__name__": "judge_harness"}
exec(compile(sys.stdin.read(), "judge_harness.py", "exec"), ns)
sys.modules["traceback"] = None  # importing it would now fail
err_r, err_w = os.pipe()
st_r, st_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.dup2(err_w, 2)
    sys.stderr = open(2, "w", closefd=False)
    ns["run_main_program"](compile(sys.argv[1], "<program>", "exec"), st_w)
os.close(err_w)
os.close(st_w)
_, status = os.waitpid(pid, 0)
print(repr((os.read(st_r, 10), os.waitstatus_to_exitcode(status), os.read(err_r, 1 << 16).decode())))
"""


def test_a_crashing_program_gets_the_interpreters_own_traceback():
    """A test process whose program raises prints the traceback a fresh interpreter prints
    (its frames, then the exception), with the interpreter's C printer: the ``traceback``
    module, 8-10 ms of imports in every crashing test, is not needed (here it cannot be
    imported at all)."""
    run = subprocess.run([sys.executable, "-I", "-S", "-c", SHOW_CRASH, CRASHING],
                         input=harness_source(), capture_output=True, timeout=60)
    marker, code, err = eval(run.stdout)  # noqa: S307 - our own repr
    assert (marker, code) == (b"E", 1), run.stderr[-2000:]
    assert err.startswith("Traceback (most recent call last):\n"), err
    assert 'File "<program>", line 4, in <module>' in err and "line 2, in f" in err, err
    assert err.endswith("KeyError: 'k'\n"), err


def test_the_harness_refuses_a_payload_missing_a_field():
    """The shipped harness, given a payload without ``budget_s``, answers with one
    authenticated "payload_error" record naming it (before anything of a program runs), which
    the judge reads as INTERNAL_ERROR: the verifier's bug, never the program's verdict."""
    spec = parse_ground_truth(SUM_GT)
    cfg = code_score.harness_payload(spec, "print(1)", get_profile("default"), **PAYLOAD_ARGS)
    del cfg["budget_s"]
    payload = marshal.dumps(cfg, 4)
    keys = [bytes([k]) * framing.KEY_BYTES for k in range(4)]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "harness.py")
        with open(path, "wb") as f:
            f.write(harness_source())
        run = subprocess.run([sys.executable, "-I", "-S", path],
                             input=len(payload).to_bytes(8, "big") + payload + b"".join(keys),
                             capture_output=True, timeout=60)
    judge = code_score._Judge(spec, True, code_score.run_inline, time.monotonic() + 10)
    stream = code_score._Stream(keys, judge.on_record)
    assert stream.feed(run.stdout) is False and not stream.error, (run.stdout, run.stderr)
    assert stream.seq == 1 and judge.special is not None
    assert judge.special.status is Status.INTERNAL_ERROR
    assert "field(s) missing: budget_s" in judge.special.detail


def test_a_payload_the_harness_refuses_is_internal_error(nsjail_sandbox, monkeypatch):
    """Through the whole scorer and a real jail: a payload missing a field (a judge whose
    builder and harness disagree) is INTERNAL_ERROR naming the field."""
    build_payload = code_score.harness_payload

    def missing_field(*a, **kw):
        cfg = build_payload(*a, **kw)
        del cfg["n_units"]
        return cfg

    monkeypatch.setattr(code_score, "harness_payload", missing_field)
    o = score(nsjail_sandbox, SUM_OK, SUM_GT)
    assert o.status is Status.INTERNAL_ERROR and "n_units" in o.detail, o


def test_a_bug_in_the_judge_is_internal_error(monkeypatch):
    """An exception in the judge's own code is INTERNAL_ERROR (the proto's status for the
    verifier's failures, which trainers treat as a missing result), never SANDBOX_ERROR."""

    def bug(*a, **kw):
        raise KeyError("judge bug")

    monkeypatch.setattr(code_score, "harness_payload", bug)
    o = score(NsjailSandbox(binary="/nonexistent"), SUM_OK, SUM_GT)
    assert o.status is Status.INTERNAL_ERROR and "judge bug" in o.detail, o


# -- the sandbox itself failing ----------------------------------------------------------------


def test_missing_sandbox_binary_is_sandbox_error(tmp_path):
    sb = NsjailSandbox(binary=str(tmp_path / "nsjail-missing"))
    o = score_code(respond(SUM_OK), SUM_GT, Limits(), sb)
    assert o.status is Status.SANDBOX_ERROR and "nsjail-missing" in o.detail and o.total == 3


def test_broken_sandbox_binary_is_sandbox_error(tmp_path):
    fake = tmp_path / "nsjail"
    fake.write_text("#!/bin/sh\nexit 255\n")
    fake.chmod(0o755)
    o = score_code(respond(SUM_OK), SUM_GT, Limits(), NsjailSandbox(binary=str(fake)))
    assert o.status is Status.SANDBOX_ERROR, o


def test_broken_policy_is_sandbox_error(tmp_path):
    cfg = tmp_path / "bad.cfg"
    cfg.write_text("this is not a policy {")
    o = score_code(respond(SUM_OK), SUM_GT, Limits(), NsjailSandbox(config=str(cfg)))
    assert o.status is Status.SANDBOX_ERROR, o


def test_a_sandbox_whose_harness_did_not_compile_scores_again(tmp_path):
    """The harness's bytecode failed to compile in this sandbox (the cache holds "no
    bytecode"): the next item on the same sandbox is judged again, with the harness source. It
    used to take the cache's lock twice and block forever (a clean-clone run hung 300 s in
    test_broken_policy_is_sandbox_error, whose new sandbox reused a dead one's id)."""
    cfg = tmp_path / "bad.cfg"
    cfg.write_text("this is not a policy {")
    sandbox = NsjailSandbox(config=str(cfg))
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(
        score_code(respond(SUM_OK), SUM_GT, Limits(), sandbox) for _ in range(2)), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the second item on the sandbox never finished"
    assert [o.status for o in out] == [Status.SANDBOX_ERROR] * 2, out


# -- threads -----------------------------------------------------------------------------------


def test_concurrent_scoring(nsjail_sandbox):
    out = {}
    codes = {i: (SUM_OK if i % 2 == 0 else "print(0)") for i in range(8)}

    def work(i):
        out[i] = score(nsjail_sandbox, codes[i], SUM_GT).status

    threads = [threading.Thread(target=work, args=(i,)) for i in codes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {i: (Status.CORRECT if i % 2 == 0 else Status.INCORRECT) for i in codes}


def test_unsafe_backend_scores_the_same():
    from sandbox import create_sandbox

    sb = create_sandbox("unsafe-none")
    assert score(sb, SUM_OK, SUM_GT).status is Status.CORRECT
    assert score(sb, "def add(a, b):\n    return a + b", ASSERT_GT).status is Status.CORRECT
    assert score(sb, "while True: pass", SUM_GT, test_timeout_s=1).status is Status.TIMEOUT


def test_leetcode_assert_in_loop(nsjail_sandbox):
    gt = {
        "import_prefix": "",
        "test_code": "def check(candidate):\n    for i in range(200):\n        assert candidate(i) == i + 1\n    assert candidate(-1) == 0\n",
        "entry_point": "inc",
    }
    o = score(nsjail_sandbox, "def inc(x):\n    return x + 1", gt)
    assert o.status is Status.CORRECT and (o.passed, o.total) == (2, 2), o
    o = score(
        nsjail_sandbox, "def inc(x):\n    return x + 1 if x != 150 else 0", gt, run_all_tests=True
    )
    assert o.status is Status.INCORRECT and (o.passed, o.total) == (1, 2), o


def test_unicode_io(nsjail_sandbox):
    gt = {"inputs": ["héllo wörld ✓\n"], "outputs": ["HÉLLO WÖRLD ✓\n"]}
    assert score(nsjail_sandbox, "print(input().upper())", gt).status is Status.CORRECT


def test_deep_recursion_in_a_thread(nsjail_sandbox):
    """The usual competitive-programming trick (big thread stack + recursion limit) works."""
    code = (
        "import sys, threading\n"
        "sys.setrecursionlimit(1 << 20)\n"
        "threading.stack_size(1 << 27)\n"
        "def depth(n):\n"
        "    return 0 if n == 0 else 1 + depth(n - 1)\n"
        "def main():\n"
        "    print(depth(int(input())))\n"
        "t = threading.Thread(target=main)\n"
        "t.start()\n"
        "t.join()\n"
    )
    gt = {"inputs": ["100000\n"], "outputs": ["100000\n"]}
    assert score(nsjail_sandbox, code, gt).status is Status.CORRECT


def test_output_printed_by_non_daemon_thread_and_atexit(nsjail_sandbox):
    code = (
        "import atexit, threading, time\n"
        "atexit.register(lambda: print(30))\n"
        "def late():\n"
        "    time.sleep(0.1)\n"
        "    print(7)\n"
        "threading.Thread(target=late).start()\n"
        "print(3)\n"
    )
    gt = {"inputs": [""], "outputs": ["3\n7\n30\n"]}
    assert score(nsjail_sandbox, code, gt).status is Status.CORRECT


def test_the_harness_imports_nothing_for_a_program_at_its_exit(nsjail_sandbox):
    """At a test's exit the harness runs the program's atexit hooks the way the interpreter does,
    without importing ``atexit`` when the program did not (that import cost every test 0.3 ms
    and 100 copy-on-write faults, issue 29). A program's own audit hook sees every import: one
    after its last line would print here and fail the test."""
    code = (
        "import sys\n"
        "def hook(event, args):\n"
        "    if event == 'import':\n"
        "        sys.stdout.write('imported ' + args[0] + '\\n')\n"
        "sys.addaudithook(hook)\n"
        "print(int(input()) * 2)\n"
    )
    gt = {"inputs": ["3\n", "5\n"], "outputs": ["6\n", "10\n"]}
    out = score(nsjail_sandbox, code, gt)
    assert out.status is Status.CORRECT, out
    with_atexit = "import atexit\natexit.register(lambda: print('bye'))\n" + code
    gt = {"inputs": ["3\n"], "outputs": ["6\nbye\n"]}
    assert score(nsjail_sandbox, with_atexit, gt).status is Status.CORRECT


def test_asserts_run_all_after_crash_and_timeout(nsjail_sandbox):
    gt = {"assert_case": [f"assert f({i}) == {i * i}" for i in range(5)]}
    code = "import os\ndef f(x):\n    if x == 1:\n        os._exit(3)\n    while x == 3:\n        pass\n    return x * x"
    o = score(nsjail_sandbox, code, gt, run_all_tests=True, test_timeout_s=1)
    assert o.status is Status.RUNTIME_ERROR and (o.passed, o.total) == (3, 5), o


def test_leetcode_run_all_after_timeout_resumes(nsjail_sandbox):
    gt = {
        "import_prefix": "",
        "test_code": "def check(candidate):\n"
        + "".join(f"    assert candidate({i}) == {i * i}\n" for i in range(5)),
        "entry_point": "Solution().sq",
    }
    code = "class Solution:\n    def sq(self, x):\n        while x == 2:\n            pass\n        return x * x"
    o = score(nsjail_sandbox, code, gt, run_all_tests=True, test_timeout_s=1)
    assert o.status is Status.TIMEOUT and (o.passed, o.total) == (4, 5), o


def test_unavailable_sandbox_refuses_code_items(monkeypatch):
    """With no working sandbox the scorer answers code items SANDBOX_ERROR with the reason
    (the production path: verifier.scoring.scorer.open_sandbox), never runs them unsandboxed."""
    monkeypatch.setattr("verifier.scoring.scorer.create_sandbox",
                        refuse_sandbox("nsjail binary not found at /x"))
    scorer = Scorer(ScoringConfig(workers=1))
    try:
        item = Item(id="c", domain="code", response=respond(SUM_OK), ground_truth=SUM_GT)
        (r,) = scorer.score([item])
    finally:
        scorer.close()
    assert r.status is Status.SANDBOX_ERROR and "nsjail binary not found" in r.detail


def test_module_level_exception_is_compile_error(nsjail_sandbox):
    """Function formats: a program whose module-level code raises before any test can call
    it gets COMPILE_ERROR (LiveCodeBench's "compilation error"), not a per-test failure."""
    code = "import no_such_module_xyz\ndef f(x):\n    return x * x"
    for gt in ({"inputs": ["5"], "outputs": ["25"], "fn_name": "f"},
               {"assert_case": ["assert f(5) == 25"]}):
        o = score(nsjail_sandbox, code, gt)
        assert o.status is Status.COMPILE_ERROR, o
        assert "failed to load" in o.detail and "no_such_module_xyz" in o.detail
        assert (o.passed, o.total) == (0, 1)


class _MeetingSandbox:
    """The real jail, except that every sample's run first waits for ``n`` runs to be in
    flight together (a barrier), so it fails unless ``n`` samples really run at once."""

    def __init__(self, inner, n: int):
        self.inner, self.barrier = inner, threading.Barrier(n)
        self.name, self.python = inner.name, inner.python
        self.met = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, argv, **kw):
        if "-c" not in argv:  # a sample's run, not the harness's one-time compile
            try:
                self.barrier.wait(timeout=60)
                self.met += 1
            except threading.BrokenBarrierError:
                pass
        return self.inner.run(argv, **kw)


def test_code_concurrency_runs_more_samples_than_workers(nsjail_sandbox):
    """--code-concurrency 3 with one worker: three samples run in their own jails at once
    (docs/verifier.md 3), each judged as alone."""
    sb = _MeetingSandbox(nsjail_sandbox, 3)
    with Scorer(ScoringConfig(workers=1, code_concurrency=3), sandbox=sb) as scorer:
        items = [Item(id=f"c{i}", domain="code", response=respond(SUM_OK), ground_truth=SUM_GT)
                 for i in range(3)]
        results = scorer.score(items)
    assert [r.status for r in results] == [Status.CORRECT] * 3, [r.detail for r in results]
    assert sb.met == 3
