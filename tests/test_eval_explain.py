"""``verifier eval --explain default``: the LiveCodeBench problems' responses judged under both
``lcb`` and ``default``, and each disagreement named with its rule class (verifier/eval/explain.py).
Programs of the differential set (tests/lcb_differential.py) whose verdicts differ between the
profiles, judged by a real server (nsjail); the lcb verdicts are LiveCodeBench's own labels
(tests/fixtures/lcb_labels.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.lcb_differential import PROGRAMS, problems
from verifier.cli import main
from verifier.eval.explain import RULE_CLASSES

LABELS = json.loads((Path(__file__).parent / "fixtures" / "lcb_labels.json").read_text())
CHOSEN = ["stdin_for_line", "stdout_os_write", "wrap_global_in_function", "guard_reversed",
          "exit_quit", "preamble_future_stdio", "preamble_names_without_import",
          "guard_os_getcwd", "stdin_input", "call_class_text_in_comment", "call_solution",
          "call_memo_on_instance", "eq_fraction_for_float"]
AGREE = {"stdin_input", "call_solution"}       # correct programs: pass under both


def lcb_rows() -> list[dict]:
    """The differential problems as LiveCodeBench release rows (tests public, uncompressed)."""
    rows = []
    for pid, io in problems().items():
        if pid not in ("sum", "add", "square", "half"):
            continue
        kind = "functional" if io.get("fn_name") else "stdin"
        tests = [{"input": i, "output": o, "testtype": kind}
                 for i, o in zip(io["inputs"], io["outputs"])]
        rows.append({"question_title": pid, "question_content": f"Problem {pid}.",
                     "platform": "leetcode" if kind == "functional" else "atcoder",
                     "question_id": pid, "contest_id": "c", "contest_date": "2024-09-14T00:00:00",
                     "starter_code": "", "difficulty": "easy",
                     "public_test_cases": json.dumps(tests), "private_test_cases": "",
                     "metadata": json.dumps({"func_name": io["fn_name"]} if kind == "functional"
                                            else {})})
    return rows


def test_explain_names_each_disagreement_and_its_rule(tmp_path: Path, server,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    chosen = [p for p in PROGRAMS if p.id in CHOSEN]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in lcb_rows()))
    by_problem: dict[str, list] = {}
    for p in chosen:
        by_problem.setdefault(p.problem, []).append(p)
    gens = tmp_path / "custom.json"
    gens.write_text(json.dumps([{"question_id": pid, "code_list": [p.code for p in ps]}
                                for pid, ps in by_problem.items()]))
    out = tmp_path / "summary.json"
    code = main(["eval", "--problems", str(rows), "--generations", str(gens), "--output",
                 str(out), "--addr", server[1], "--progress", "off", "--explain", "default"])
    assert code == 0
    s = json.loads(out.read_text())
    # The lcb verdicts are LiveCodeBench's.
    for pid, ps in by_problem.items():
        assert s["by_problem"][pid] == [LABELS["labels"][p.id]["passed"] for p in ps], pid
    ex = s["explain"]
    assert ex["profile"] == "lcb" and ex["against"] == "default"
    assert ex["n_responses"] == len(chosen) and ex["n_problems"] == 4
    # Every program chosen for a rule disagrees, named with the rule it stresses; the correct
    # programs agree.
    named = {by_problem[pid][d["index"]].id: d for pid, e in ex["by_problem"].items()
             for d in e["disagree"]}
    assert set(named) == set(CHOSEN) - AGREE
    for pid, d in named.items():
        program = next(p for p in chosen if p.id == pid)
        assert d["class"] == program.rule, (pid, d)
        assert d["class"] in RULE_CLASSES
        assert (d["lcb"] == "CORRECT") == LABELS["labels"][pid]["passed"]
    fails_here = sum(1 for pid in named if not LABELS["labels"][pid]["passed"])
    assert ex["lcb_fails_default_passes"] == fails_here == 9
    assert ex["lcb_passes_default_fails"] == 2   # preamble names, Fraction ==
    assert ex["n_disagree"] == 11
    lcb_failures = sum(1 for p in chosen if not LABELS["labels"][p.id]["passed"])
    assert ex["lcb_failures"] == lcb_failures
    assert ex["harness_share_of_failures"] == pytest.approx(fails_here / lcb_failures)
    assert ex["by_class"]["stdin"] == {"lcb_fails": 1, "lcb_passes": 0,
                                       "why": RULE_CLASSES["stdin"]}
    assert ex["by_class"]["preamble"]["lcb_fails"] == 1
    assert ex["by_class"]["preamble"]["lcb_passes"] == 1
    assert ex["pass@1"]["lcb"] == pytest.approx(s["lcb"]["pass@1"])
    text = " ".join(capsys.readouterr().out.split())
    assert "where lcb and default disagree (11 of 13 responses)" in text
    assert "9 of" in text and "pass under default" in text
    assert "problem 'sum': responses" in text
    j = named["stdin_for_line"]["index"]
    assert f"{j} (stdin: lcb {named['stdin_for_line']['lcb']}, default CORRECT)" in text
    assert "0 (equality: lcb CORRECT, default INCORRECT)" in text    # the Fraction


def test_explain_flags_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gens = tmp_path / "g.jsonl"
    gens.write_text('{"id": "x", "responses": ["a"]}\n')
    for argv, message in [
        (["--input", str(gens), "--explain", "default"], "--explain compares profiles"),
        (["--problems", str(gens), "--generations", str(gens), "--explain", "lcb"],
         "is --lcb-profile itself"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(["eval", *argv, "--output", str(tmp_path / "s.json")])
        assert exit_.value.code == 2
        assert message in " ".join(capsys.readouterr().err.split())
