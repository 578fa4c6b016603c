"""LiveCodeBench's harness rules as the lcb profile reproduces them (verifier/harness/
lcb_runner.py; LiveCodeBench/LiveCodeBench at 28fef95, lcb_runner/evaluation/testing_util.py),
one test per rule on the pure pieces; tests/test_lcb_differential.py judges whole programs in
real nsjail against LiveCodeBench's own labels. Also: ground truth with integers past 4,300
digits parsed as the profile says (verifier/scoring/bigint.py)."""

from __future__ import annotations

import json

import pytest

from verifier.scoring.bigint import (
    MAX_INT_DIGITS,
    int_from_digits,
    int_to_digits,
    json_loads_digits,
)
from verifier.data.ground_truth import BadGroundTruth, parse_ground_truth
from verifier.harness.lcb_runner import (LcbStdin, lcb_clean_if_name, lcb_make_function,
                                         lcb_program_text, skywork_function_to_method,
                                         skywork_stdin)
from verifier.data.problems import check_code_truth
from verifier.scoring.profiles import LCB_PREAMBLE


def test_rule_clean_if_name_unwraps_only_a_last_standard_guard():
    code = "def main():\n    print(1)\nif __name__ == \"__main__\":\n    main()\n"
    assert "if __name__" not in lcb_clean_if_name(code)
    reversed_ = "def main():\n    print(1)\nif '__main__' == __name__:\n    main()\n"
    assert lcb_clean_if_name(reversed_) == reversed_
    not_last = code + "x = 1\n"
    assert lcb_clean_if_name(not_last) == not_last


def test_rule_make_function_wraps_all_but_imports_after_the_preamble_text():
    text = lcb_make_function("import sys\nfrom __future__ import annotations\nreturn\n", "PRE")
    assert text.startswith("PRE\n")
    assert "def wrapped_function():\n    return" in text
    with pytest.raises(SyntaxError):  # the preamble comes before a __future__ import
        compile(lcb_make_function("from __future__ import annotations\nx = 1\n",
                                  LCB_PREAMBLE), "<string>", "exec")


def test_rule_call_based_preamble_pasted_as_text():
    text = lcb_program_text({"mode": "call", "source": "class Solution: pass", "prefix": "P",
                             "lcb_rules": "lcb", "fn_name": "f"})
    assert text == "P\n\nclass Solution: pass"


def test_skywork_rule_function_made_a_method_of_solution():
    """Skywork-OR1 at 64e96af, compute_score.py ``convert_function_to_class_method``."""
    code = "# c\ndef add(a, b):\n    return a + b\nX = 1\n"
    out = skywork_function_to_method(code, "add")
    assert out == "X = 1\n\nclass Solution:\n\n    def add(self, a, b):\n        return a + b"
    assert "def f(self, a)" in skywork_function_to_method("def f(self, a):\n    pass\n", "f")
    assert skywork_function_to_method("class Helper: pass\n", "add") is None
    assert skywork_function_to_method("async def add(a, b): pass\n", "add") is None
    cfg = {"mode": "call", "source": code, "prefix": "P", "lcb_rules": "skywork",
           "fn_name": "add"}
    assert lcb_program_text(cfg) == "P\n\n" + out
    assert lcb_program_text({**cfg, "lcb_rules": "lcb"}) == "P\n\n" + code
    kept = {**cfg, "source": "# class Solution\ndef add(a, b): pass\n"}
    assert lcb_program_text(kept) == "P\n\n" + kept["source"]  # the text rule comes first


def test_skywork_rule_stdin_is_a_plain_stringio():
    """Skywork-OR1 at 64e96af, lcb_runner/evaluation/testing_util.py ``call_method``."""
    s = skywork_stdin("3\n1\n2\n")
    assert s.readline() == "3\n" and s.readlines() == ["1\n", "2\n"] and s.read() == ""
    assert list(skywork_stdin("a\nb")) == ["a\n", "b"]
    assert not hasattr(s, "buffer")


def test_rule_mock_stdin():
    s = LcbStdin("3\n1\n2\n")
    assert s.readline() == "3\n" and s.read() == "3\n1\n2\n"
    assert s.readlines() == ["3", "1", "2", ""]
    assert s.buffer.readline() == b"3\n" and s.buffer.readline() == b"3\n"
    with pytest.raises(TypeError):
        iter(s)
    with pytest.raises(Exception):
        s.fileno()


def test_rule_int_max_str_digits_in_ground_truth():
    big = int_to_digits(2**17350, MAX_INT_DIGITS)
    gt = {"inputs": ["2\n17350"], "outputs": [big], "fn_name": "power"}
    assert parse_ground_truth(gt, 50_000).outputs[0] == 2**17350
    with pytest.raises(BadGroundTruth):
        parse_ground_truth(gt)  # the default profile keeps Python's 4,300
    assert check_code_truth(json.dumps(gt), "row") == gt  # eval's row reader
    assert int_from_digits("-" + big, MAX_INT_DIGITS) == -(2**17350)
    with pytest.raises(ValueError):
        json_loads_digits("9" * (MAX_INT_DIGITS + 1), MAX_INT_DIGITS)
