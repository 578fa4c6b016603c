"""``verifier eval --explain PROFILE``: where the ``lcb`` profile (LiveCodeBench's judge) and
another profile disagree on the same generations, and why.

Rule: every response of a LiveCodeBench problem is judged twice, under the profile that judged
it (``--lcb-profile``, normally ``lcb``) and under ``--explain`` (normally ``default``, this
project's rules, under which correct programs pass). A response is a disagreement when one
verdict is correct and the other is not; each disagreement gets the class of the rule that
explains it (:data:`RULE_CLASSES`, the rows of docs/verifier-service.md's "Not reproduced exactly" list and of
the differential set in tests/lcb_differential.py), read from what both sides saw: the code
each profile extracted, the problem's kind (stdin or call-based), and the two results' statuses
and details. The classes are checked in a fixed order (:func:`classify`) and the first that
matches wins; "other" when none does. The classes are a diagnosis from the program text and the
verdicts, not a proof: a program can hit two rules, and only the first is named.

The report says per problem which responses disagree and why, and overall how many responses
LiveCodeBench's rules fail that ``--explain``'s pass (the harness's share of the model's
LiveCodeBench failures) and the reverse, by class, with pass@1 under both profiles.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from typing import Any, Sequence

from verifier.scoring.checkers import CHECKERS_AGAINST
from verifier.scoring.code_score import extract_program
from verifier.items import Result, Status
from verifier.scoring.profiles import get_profile

RULE_CLASSES: dict[str, str] = {
    "code_extraction": "the two profiles take different code from the response (LiveCodeBench: "
                       "the lines between the last two fence lines; default: the last python "
                       "block after </think>)",
    "output_cap": "output over a profile's cap (default: 8 MiB per test; LiveCodeBench has none "
                  "and reads no prints of a call-based program)",
    "big_int": "integers past Python's 4,300 digits (LiveCodeBench allows 50,000)",
    "preamble": "LiveCodeBench's import preamble: names it imports used without an import, or "
                "pasted as text before a `from __future__` import",
    "reliability_guard": "LiveCodeBench's reliability guard (quit, os.getcwd, os.kill, ... are "
                         "None; resource, psutil, ... unimportable)",
    "exit": "quit(), exit(), sys.exit() or os._exit() (LiveCodeBench swallows SystemExit; "
            "quit is None; os._exit loses the result)",
    "name_guard": "the `__name__` guard (LiveCodeBench unwraps only a last "
                  "`if __name__ == '__main__':`; nothing else under it runs)",
    "wrap": "stdin programs run as the body of a function (module-level global fails; "
            "return and nonlocal at the top level become legal)",
    "stdout": "stdout written other ways (LiveCodeBench captures sys.stdout alone: "
              "sys.stdout.buffer, os.write(1, ...), a stdout bound by `from sys import stdout` "
              "are lost)",
    "stdin": "stdin read other ways (LiveCodeBench's mock stdin: not iterable, readlines() "
             "with a trailing '', buffer.readline() the first line each time, no fileno; "
             "open(0) and fd 0 are empty)",
    "solution_instance": "one Solution() for all tests of a sample (state kept on the instance)",
    "call_shape": "LiveCodeBench's class-vs-function rule (the text 'class Solution' decides; "
                  "the method is looked up on the instance)",
    "time_limit": "time limits (LiveCodeBench gives the module its own alarm and each call "
                  "another; default: one deadline per test covering the module)",
    "equality": "== on returned values (Fraction, Decimal, tuples, deep lists compared as data)",
    "memory": "memory limits (LiveCodeBench: none, lcb: 4 GiB; default: 1 GiB)",
    "numpy": "numpy importable under LiveCodeBench's judge, not under default",
    "other": "no rule of the list identified",
}

_GUARDED = re.compile(r"\bquit\s*\(|\bhelp\s*\(|\bos\.(kill|system|putenv|remove|removedirs|rmdir|"
                      r"fchdir|setuid|fork|forkpty|killpg|rename|renames|truncate|replace|"
                      r"unlink|fchmod|fchown|chmod|chown|chroot|getcwd|chdir)\b|"
                      r"\bimport\s+(resource|psutil|joblib|ipdb|tkinter)\b|"
                      r"\bshutil\.(rmtree|move|chown)\b|\bsubprocess\b")
_EXIT = re.compile(r"\b(quit|exit)\s*\(|\bsys\.exit\b|\bos\._exit\b|\braise\s+SystemExit\b")
_STDOUT = re.compile(r"from\s+sys\s+import[^\n]*\bstdout\b|\bstdout\.buffer\b|"
                     r"\bos\.write\s*\(\s*1\b|\bsys\.__stdout__\b")
_STDIN = re.compile(r"\bfor\s+\w+\s+in\s+(sys\.)?stdin\b|\breadlines\s*\(|\bstdin\.buffer\b|"
                    r"\bopen\s*\(\s*0\b|\bos\.read\s*\(\s*0\b|\bfileno\s*\(|"
                    r"from\s+sys\s+import[^\n]*\bstdin\b|\bsys\.__stdin__\b|\bstdin\b")
_INSTANCE_STATE = re.compile(r"\bself\.\w+\s*(\[[^\]]*\])?\s*=|\b(set|has|get)attr\s*\(\s*self\b")
_PREAMBLE_NAMES = ("NameError",)


def _mode(ground_truth: Any) -> str:
    """"call" for call-based problems (a ``fn_name``), else "stdin"."""
    return "call" if isinstance(ground_truth, dict) and ground_truth.get("fn_name") else "stdin"


def _module_syntax(code: str) -> str:
    """The SyntaxError message of ``code`` compiled as a module, or ""."""
    try:
        ast.parse(code)
    except SyntaxError as e:
        return str(e.msg)
    except (ValueError, RecursionError, MemoryError):
        return ""
    return ""


def _has_solution_class(code: str) -> bool | None:
    """Whether ``code`` defines a top-level ``class Solution`` (None when it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return any(isinstance(n, ast.ClassDef) and n.name == "Solution" for n in tree.body)


def classify(response: str, ground_truth: Any, lcb: Result, other: Result,
             lcb_profile: str = "lcb", other_profile: str = "default") -> str:
    """The rule class (a key of :data:`RULE_CLASSES`) that explains why ``lcb`` and ``other``
    (the results of one response under the two profiles) disagree; "other" when none of the
    checks below matches. Checked in order; the first match wins."""
    code_l, _ = extract_program(response, get_profile(lcb_profile))
    code_o, _ = extract_program(response, get_profile(other_profile))
    if (code_l or "").strip() != (code_o or "").strip():
        return "code_extraction"
    code = code_l or ""
    statuses = {lcb.status, other.status}
    details = f"{lcb.detail}\n{other.detail}"
    mode = _mode(ground_truth)
    failed = other if lcb.correct else lcb      # the side that failed
    if Status.OUTPUT_LIMIT in statuses:
        return "output_cap"
    if "4300" in details or "int_max_str_digits" in details or "Exceeds the limit" in details:
        return "big_int"
    if "from __future__" in code:
        return "preamble"
    if re.search(r"\bnumpy\b", code) and "numpy" in failed.detail:
        return "numpy"
    if _GUARDED.search(code) and not lcb.correct:
        return "reliability_guard" if not re.search(r"\bquit\s*\(", code) else "exit"
    if _EXIT.search(code):
        return "exit"
    if "__main__" in code:
        return "name_guard"
    if mode == "stdin":
        syntax = _module_syntax(code)
        if ("outside function" in syntax or "nonlocal" in syntax
                or (re.search(r"^\s*global\s", code, re.M) and not lcb.correct)):
            return "wrap"
        if _STDOUT.search(code):
            return "stdout"
        if _STDIN.search(code) or re.search(r"\bos\.read\b", code):
            return "stdin"
    if other.correct and not lcb.correct and "NameError" in other.detail and mode == "stdin":
        return "wrap"
    if not other.correct and lcb.correct and any(n in other.detail for n in _PREAMBLE_NAMES):
        return "preamble"
    if mode == "call":
        if _INSTANCE_STATE.search(code):
            return "solution_instance"
        has_class = _has_solution_class(code)
        if has_class is not None and has_class != ("class Solution" in code):
            return "call_shape"
        if has_class is False or (has_class and re.search(r"^def\s", code, re.M)):
            return "call_shape"
    if Status.TIMEOUT in statuses:
        return "time_limit"
    if Status.MEMORY_LIMIT in statuses:
        return "memory"
    if (mode == "call" and Status.INCORRECT in statuses) or "nested too deeply" in details:
        return "equality"
    return "other"


def explain_checkers(problems: Sequence[Any], results: dict[str, Result],
                     exact: dict[str, Result]) -> dict[str, Any]:
    """The ``explain`` block of ``verifier eval --explain exact``: how many verdicts the
    problems' checkers (docs/contracts.md 1) changed. ``problems`` are those with a checker
    (EvalProblem), ``results`` their results with it and ``exact`` without it (the exact
    rule), by the same wire ids."""
    by_problem: dict[str, Any] = {}
    n = checker_passes = exact_passes = 0
    for p in problems:
        changed = []
        for j in range(len(p.responses)):
            rc, re_ = results[p.wire_id(j)], exact[p.wire_id(j)]
            n += 1
            if rc.correct == re_.correct:
                continue
            checker_passes += rc.correct
            exact_passes += re_.correct
            changed.append({"index": j, "checker": rc.status.value, "exact": re_.status.value,
                            "checker_detail": rc.detail, "exact_detail": re_.detail})
        if changed:
            by_problem[p.id] = {"n_responses": len(p.responses), "changed": changed}
    return {
        "against": CHECKERS_AGAINST,
        "n_problems": len(problems),
        "n_responses": n,
        "n_changed": checker_passes + exact_passes,
        "checker_passes_exact_fails": checker_passes,
        "checker_fails_exact_passes": exact_passes,
        "by_problem": by_problem,
    }


def explain(problems: Sequence[Any], results: dict[str, Result], other: dict[str, Result],
            lcb_profile: str, other_profile: str) -> dict[str, Any]:
    """The ``explain`` block of ``verifier eval``'s summary. ``problems`` are the
    LiveCodeBench problems judged (EvalProblem: ``wire_id(j)``, ``responses``,
    ``ground_truth``, ``id``); ``results`` their results under ``lcb_profile`` and ``other``
    under ``other_profile``, by the same wire ids."""
    by_class: dict[str, Counter] = {}
    by_problem: dict[str, Any] = {}
    lcb_fails = other_fails = 0
    fails_here = passes_here = 0
    verdicts_l: list[list[bool]] = []
    verdicts_o: list[list[bool]] = []
    for p in problems:
        row_l, row_o, disagree = [], [], []
        for j, response in enumerate(p.responses):
            rl, ro = results[p.wire_id(j)], other[p.wire_id(j)]
            row_l.append(rl.correct)
            row_o.append(ro.correct)
            lcb_fails += not rl.correct
            other_fails += not ro.correct
            if rl.correct == ro.correct:
                continue
            rule = classify(response, p.ground_truth, rl, ro, lcb_profile, other_profile)
            side = "lcb_passes" if rl.correct else "lcb_fails"
            fails_here += side == "lcb_fails"
            passes_here += side == "lcb_passes"
            by_class.setdefault(rule, Counter())[side] += 1
            disagree.append({"index": j, "class": rule, lcb_profile: rl.status.value,
                             other_profile: ro.status.value, f"{lcb_profile}_detail": rl.detail,
                             f"{other_profile}_detail": ro.detail})
        verdicts_l.append(row_l)
        verdicts_o.append(row_o)
        if disagree:
            by_problem[p.id] = {"n_responses": len(p.responses), "disagree": disagree}
    n = sum(len(v) for v in verdicts_l)

    def pass1(vs: list[list[bool]]) -> float | None:
        return sum(sum(v) / len(v) for v in vs) / len(vs) if vs else None

    return {
        "profile": lcb_profile,
        "against": other_profile,
        "n_problems": len(verdicts_l),
        "n_responses": n,
        "pass@1": {lcb_profile: pass1(verdicts_l), other_profile: pass1(verdicts_o)},
        "n_disagree": fails_here + passes_here,
        f"{lcb_profile}_fails_{other_profile}_passes": fails_here,
        f"{lcb_profile}_passes_{other_profile}_fails": passes_here,
        f"{lcb_profile}_failures": lcb_fails,
        "harness_share_of_failures": fails_here / lcb_fails if lcb_fails else None,
        "by_class": {rule: {f"{lcb_profile}_fails": c["lcb_fails"],
                            f"{lcb_profile}_passes": c["lcb_passes"],
                            "why": RULE_CLASSES[rule]}
                     for rule, c in sorted(by_class.items(),
                                           key=lambda kv: -sum(kv[1].values()))},
        "by_problem": by_problem,
    }
