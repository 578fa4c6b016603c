"""The code ground truth (docs/contracts.md 1), validated and normalised into a ``Spec``.

Pure: no sandbox, no harness, no I/O. The trainer's data layer and the problem readers
(verifier/data/problems.py) use it to check rows; the judge (verifier/scoring/code_score.py) to run them.
Four formats: stdin/stdout ``{inputs, outputs}``, call-based ``{inputs, outputs, fn_name}``,
asserts ``{assert_case}`` and LeetCode-style ``{import_prefix, test_code, entry_point}``. The
asserts of the last two are rewritten here into call-outs to the in-jail evaluator's recorder
(verifier/harness/), so the evaluator, not the program, decides each test. The first two may
carry a ``checker`` (verifier/scoring/checkers.py), validated here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from verifier.scoring.bigint import json_loads_digits
from verifier.scoring.checkers import EXACT, BadChecker, ProgramChecker, parse_checker
from verifier.items import decode_ground_truth

__all__ = ["BadGroundTruth", "Spec", "parse_ground_truth"]


class BadGroundTruth(Exception):
    pass


@dataclass
class Spec:
    mode: str  # "stdio" | "call" | "check"
    total: int
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)  # stdio: str; call: decoded JSON values
    taco_outputs: bool = False  # call-based outputs given as JSON values (TACO): also accept out[0]
    fn_name: str = ""
    prefix: str = ""
    units: dict = field(default_factory=dict)
    checker: str | ProgramChecker = EXACT  # stdio and call: how outputs are judged


def _text(v: Any, what: str) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return "\n".join(v)
    raise BadGroundTruth(f"{what} must be a string, got {type(v).__name__}")


def parse_ground_truth(gt: Any, int_digits: int | None = None) -> Spec:
    """Validate and normalise a code ground truth (docs/contracts.md 1); BadGroundTruth names
    what is wrong. ``int_digits``: the judging profile's ``int_max_str_digits`` (integers of
    call-based tests, given as JSON text, may have that many digits: LiveCodeBench's 50,000;
    None: Python's default, 4,300), applied without changing the process's own limit
    (verifier/scoring/bigint.py)."""
    gt = decode_ground_truth(gt)
    if isinstance(gt, str):
        raise BadGroundTruth(
            "code ground_truth must be an object (or a JSON string of one), got a plain string"
        )
    if not isinstance(gt, dict):
        raise BadGroundTruth(f"code ground_truth must be an object, got {type(gt).__name__}")
    if "checker" in gt and any(k in gt for k in ("assert_case", "test_code", "entry_point")):
        raise BadGroundTruth("a 'checker' judges outputs: it applies to {inputs, outputs"
                             "[, fn_name]} tests, not to assert or LeetCode-style test code")
    if "assert_case" in gt:
        return _parse_asserts(gt["assert_case"])
    if "test_code" in gt or "entry_point" in gt:
        return _parse_leetcode(gt)
    if "inputs" in gt or "outputs" in gt:
        return _parse_io(gt, int_digits)
    raise BadGroundTruth(
        "code ground_truth has none of the known formats: {inputs, outputs[, fn_name]}, "
        "{import_prefix, test_code, entry_point} or {assert_case}"
    )


def _parse_io(gt: dict, int_digits: int | None = None) -> Spec:
    inputs, outputs = gt.get("inputs"), gt.get("outputs")
    if not isinstance(inputs, list):
        raise BadGroundTruth(f"'inputs' must be a list, got {type(inputs).__name__}")
    if not isinstance(outputs, list):
        raise BadGroundTruth(f"'outputs' must be a list, got {type(outputs).__name__}")
    if len(inputs) != len(outputs):
        raise BadGroundTruth(f"'inputs' has {len(inputs)} tests but 'outputs' has {len(outputs)}")
    if not inputs:
        raise BadGroundTruth("'inputs' is empty: no tests")
    fn_name = gt.get("fn_name")
    call_based = not (fn_name is None or fn_name == "")
    try:
        checker = parse_checker(gt.get("checker"), call_based)
    except BadChecker as e:
        raise BadGroundTruth(str(e)) from None
    if not call_based:
        return Spec(
            "stdio",
            len(inputs),
            inputs=[_text(x, f"inputs[{i}]") for i, x in enumerate(inputs)],
            outputs=[_text(x, f"outputs[{i}]") for i, x in enumerate(outputs)],
            checker=checker,
        )
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise BadGroundTruth(f"'fn_name' must be a Python identifier, got {fn_name!r}")
    args_list, outs = [], []
    taco = False
    for i, (x, y) in enumerate(zip(inputs, outputs)):
        if isinstance(x, str):
            try:
                args = [json_loads_digits(line, int_digits) for line in x.split("\n")
                        if line.strip()]
            except ValueError as e:
                raise BadGroundTruth(f"inputs[{i}] is not newline-separated JSON arguments: {e}")
        elif isinstance(x, list):
            args = x
        else:
            raise BadGroundTruth(
                f"inputs[{i}] must be a string of JSON lines or a list of arguments"
            )
        if isinstance(y, str):
            try:
                out = json_loads_digits(y, int_digits)
            except ValueError as e:
                raise BadGroundTruth(f"outputs[{i}] is not one JSON value: {e}")
        else:
            out, taco = y, True
        args_list.append(args)
        outs.append(out)
    return Spec(
        "call", len(inputs), inputs=args_list, outputs=outs, fn_name=fn_name, taco_outputs=taco,
        checker=checker,
    )


class _AssertRewriter(ast.NodeTransformer):
    """Turn every ``assert T`` into a call-out to the evaluator's recorder under one id."""

    def __init__(self, fixed_id: int | None = None):
        self.n = 0
        self.fixed_id = fixed_id

    def visit_Assert(self, node: ast.Assert):
        i = self.fixed_id if self.fixed_id is not None else self.n
        self.n += 1
        new = ast.parse(
            f"if __judge__.begin({i}):\n"
            "    try:\n"
            "        __judge_ok = bool(__JUDGE_TEST__)\n"
            "    except __judge__.Control:\n"
            "        raise\n"
            "    except BaseException as __judge_exc:\n"
            f"        __judge__.error({i}, __judge_exc)\n"
            "    else:\n"
            f"        __judge__.result({i}, __judge_ok)\n"
        ).body[0]
        test = self.visit(node.test)

        class _Fill(ast.NodeTransformer):
            def visit_Name(self, n):
                return test if n.id == "__JUDGE_TEST__" else n

        new = _Fill().visit(new)
        return ast.copy_location(new, node)


def _parse_code(src: str, what: str) -> ast.Module:
    try:
        return ast.parse(src)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise BadGroundTruth(f"{what} does not parse: {type(e).__name__}: {e}")


def _unparse(tree: ast.AST, what: str) -> str:
    """Source of a rewritten tree, checked to parse again (the evaluator compiles it)."""
    try:
        src = ast.unparse(tree)
        ast.parse(src)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise BadGroundTruth(
            f"{what} cannot be rewritten for the evaluator: {type(e).__name__}: {e}"
        )
    return src


def _parse_asserts(cases: Any) -> Spec:
    if not isinstance(cases, list) or not cases:
        raise BadGroundTruth("'assert_case' must be a non-empty list of strings")
    units = []
    for k, c in enumerate(cases):
        if not isinstance(c, str):
            raise BadGroundTruth(f"assert_case[{k}] must be a string, got {type(c).__name__}")
        tree = _parse_code(c, f"assert_case[{k}]")
        rw = _AssertRewriter(fixed_id=k)
        tree = ast.fix_missing_locations(rw.visit(tree))
        if rw.n == 0:
            raise BadGroundTruth(f"assert_case[{k}] contains no assert statement")
        units.append(_unparse(tree, f"assert_case[{k}]"))
    return Spec("check", len(cases), units={"kind": "asserts", "cases": units})


def _parse_leetcode(gt: dict) -> Spec:
    prefix = gt.get("import_prefix", "") or ""
    test_code = gt.get("test_code")
    entry = gt.get("entry_point")
    if not isinstance(prefix, str):
        raise BadGroundTruth(f"'import_prefix' must be a string, got {type(prefix).__name__}")
    if not isinstance(test_code, str) or not test_code.strip():
        raise BadGroundTruth("'test_code' must be a non-empty string")
    if not isinstance(entry, str) or not entry.strip():
        raise BadGroundTruth("'entry_point' must be a non-empty string")
    _parse_code(prefix, "import_prefix")
    try:
        ast.parse(entry.strip(), mode="eval")
    except SyntaxError as e:
        raise BadGroundTruth(f"'entry_point' is not an expression: {e}")
    tree = _parse_code(test_code, "test_code")
    has_check = any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body)
    # Calls of check(...) at module level are replaced by ours (with the program's entry point).
    tree.body = [
        n
        for n in tree.body
        if not (
            isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Name)
            and n.value.func.id == "check"
        )
    ]
    rw = _AssertRewriter()
    tree = ast.fix_missing_locations(rw.visit(tree))
    if rw.n == 0:
        raise BadGroundTruth("'test_code' contains no assert statement")
    if has_check:
        units = {
            "kind": "leetcode",
            "test_code": _unparse(tree, "test_code"),
            "entry_point": entry.strip(),
            "call": "check(__judge_candidate__)",
        }
    else:  # top-level asserts using `candidate`
        units = {
            "kind": "leetcode",
            "test_code": "",
            "entry_point": entry.strip(),
            "call": "candidate = __judge_candidate__\n" + _unparse(tree, "test_code"),
        }
    return Spec("check", rw.n, prefix=prefix, units=units)
