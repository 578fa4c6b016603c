"""``verifier eval``: the pass@k / avg@k estimators, and whole evaluations of small generations
files scored by the real verifier (in-process and through a real server), math items only."""

from __future__ import annotations

import json
import math
import statistics
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from verifier.cli import main
from verifier.eval.evaluate import (
    EvalConfig,
    avg_at_k,
    eval_table,
    mean_pass_at_k,
    metrics,
    pass_at_k,
    problem_from_dict,
    run_eval,
    standard_error,
)
from verifier.items import MAX_RESPONSE_CHARS, VerifierError

RIGHT = r"The answer is \boxed{%s}."
WRONG = r"I think it is \boxed{-999}."


# --------------------------------------------------------------------------------------------
# pass@k and friends
# --------------------------------------------------------------------------------------------


def exact_pass_at_k(n: int, c: int, k: int) -> float:
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2) = 0.7
        (5, 2, 5, 1.0),  # k = n, c > 0
        (5, 0, 5, 0.0),  # k = n, c = 0
        (5, 0, 1, 0.0),
        (5, 5, 1, 1.0),  # c = n
        (5, 5, 3, 1.0),
        (10, 3, 4, 1 - 35 / 210),  # n > k: 1 - C(7,4)/C(10,4)
        (4, 1, 2, 0.5),
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_stable_for_large_n() -> None:
    # C(1000, 500) overflows a float; the product form does not.
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)
    assert pass_at_k(1000, 10, 32) == pytest.approx(exact_pass_at_k(1000, 10, 32), rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_rejects_impossible_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


@st.composite
def nck(draw: st.DrawFn) -> tuple[int, int, int]:
    n = draw(st.integers(1, 64))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


@given(nck())
def test_pass_at_k_properties(args: tuple[int, int, int]) -> None:
    n, c, k = args
    p = pass_at_k(n, c, k)
    assert 0.0 <= p <= 1.0
    assert p == pytest.approx(exact_pass_at_k(n, c, k), abs=1e-9)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)
    if c < n:
        assert pass_at_k(n, c + 1, k) >= p  # more correct samples never hurt
    if k < n:
        assert pass_at_k(n, c, k + 1) >= p  # more attempts never hurt


def test_avg_at_k_uses_the_first_k_responses() -> None:
    verdicts = [[True, False, False, False], [True] * 4, [False] * 4]
    assert avg_at_k(verdicts, 4) == pytest.approx(5 / 12)
    assert avg_at_k(verdicts, 2) == pytest.approx((0.5 + 1 + 0) / 3)
    assert avg_at_k(verdicts, 1) == pytest.approx(2 / 3)
    # With k = n, avg@k is the mean unbiased pass@1.
    assert avg_at_k(verdicts, 4) == pytest.approx(mean_pass_at_k(verdicts, 1))
    with pytest.raises(ValueError):
        avg_at_k([[True, False]], 3)


def test_standard_errors() -> None:
    per_problem = [0.25, 1.0, 0.0]
    se = statistics.stdev(per_problem) / math.sqrt(3)
    assert standard_error(per_problem) == pytest.approx(se)
    assert standard_error([0.5]) is None
    m = metrics([[True, False, False, False], [True] * 4, [False] * 4], 4)
    assert m["stderr"]["avg@k"] == pytest.approx(statistics.stdev(per_problem) / math.sqrt(3))
    assert m["stderr"]["pass@k"] == pytest.approx(statistics.stdev([1.0, 1.0, 0.0]) / math.sqrt(3))
    assert m["pass@1"] == pytest.approx(m["avg@k"])


# --------------------------------------------------------------------------------------------
# Whole evaluations (real verifier)
# --------------------------------------------------------------------------------------------


def problem(pid: str, gold: str, right: list[bool], source: str | None = None, **extra) -> dict:
    row = {"id": pid, "domain": "math", "ground_truth": gold,
           "responses": [RIGHT % gold if ok else WRONG for ok in right], **extra}
    if source is not None:
        row["data_source"] = source
    return row


def three_problems() -> list[dict]:
    """1/4, 4/4 and 0/4 right: avg@4 = 5/12, pass@4 = 2/3. The one right answer of p1 comes
    first, so avg@2 = (1/2 + 1 + 0) / 3."""
    return [
        problem("p1", "42", [True, False, False, False], "aime24"),
        problem("p2", r"\frac{1}{2}", [True] * 4, "aime24"),
        problem("p3", "7", [False] * 4, "aime25"),
    ]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def config(tmp_path: Path, rows: list, **kw) -> EvalConfig:
    return EvalConfig(input=write_jsonl(tmp_path / "gen.jsonl", rows),
                      output=tmp_path / "summary.json", progress="off", **kw)


def check_three_problems(summary: dict) -> None:
    assert summary["k"] == 4
    assert summary["n_problems"] == 3
    assert summary["n_responses"] == 12
    assert summary["avg@k"] == pytest.approx(5 / 12)  # 41.67 %
    assert summary["pass@1"] == pytest.approx(5 / 12)
    assert summary["pass@k"] == pytest.approx(2 / 3)  # 66.67 %
    assert summary["errors"] == {}
    assert summary["statuses"] == {"CORRECT": 5, "INCORRECT": 7}
    assert set(summary["stderr"]) == {"avg@k", "pass@1", "pass@k"}
    assert summary["profiles"] == {"default": 12}  # the judging profile the verifier applied


def test_eval_in_process(tmp_path: Path) -> None:
    cfg = config(tmp_path, three_problems(), results_output=tmp_path / "per_response.jsonl")
    summary = run_eval(cfg)
    check_three_problems(summary)
    assert json.loads(cfg.output.read_text()) == summary
    lines = (tmp_path / "per_response.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    expected = [(p, j) for p in ("p1", "p2", "p3") for j in range(4)]
    assert [(r["id"], r["index"]) for r in records] == expected
    assert [r["reward"] for r in records[:4]] == [1.0, 0.0, 0.0, 0.0]
    assert {r["status"] for r in records} == {"CORRECT", "INCORRECT"}


def test_eval_through_a_server(tmp_path: Path, server: tuple[object, str]) -> None:
    _, addr = server
    summary = run_eval(config(tmp_path, three_problems(), addr=addr))
    check_three_problems(summary)


def test_eval_by_source(tmp_path: Path) -> None:
    rows = three_problems() + [problem("q1", "3", [False, True, True, True])]  # no data_source
    summary = run_eval(config(tmp_path, rows))
    by = summary["by_source"]
    assert list(by) == ["-", "aime24", "aime25"]
    assert by["aime24"]["n_problems"] == 2
    assert by["aime24"]["avg@k"] == pytest.approx(5 / 8)
    assert by["aime24"]["pass@k"] == pytest.approx(1.0)
    assert by["aime25"]["avg@k"] == 0.0 and by["aime25"]["pass@k"] == 0.0
    assert by["aime25"]["stderr"]["avg@k"] is None  # one problem: undefined
    assert by["-"]["avg@k"] == pytest.approx(0.75)
    assert summary["avg@k"] == pytest.approx((0.25 + 1 + 0 + 0.75) / 4)

    console = Console(record=True, width=120)
    console.print(eval_table(summary))
    text = console.export_text()
    for expected in ("avg@4", "pass@4", "aime24", "aime25", "ALL", "62.5", "100.0", "50.0"):
        assert expected in text


def test_k_smaller_than_n(tmp_path: Path) -> None:
    summary = run_eval(config(tmp_path, three_problems(), k=2))
    assert summary["k"] == 2
    assert summary["avg@k"] == pytest.approx(0.5)  # first two responses: 1/2, 1, 0
    assert summary["pass@k"] == pytest.approx((0.5 + 1 + 0) / 3)  # pass_at_k(4, 1, 2) = 0.5
    assert summary["pass@1"] == pytest.approx(5 / 12)  # all n samples
    assert summary["n_responses"] == 12  # every response is still scored


def test_different_n_per_problem(tmp_path: Path) -> None:
    rows = three_problems() + [problem("short", "5", [True, False], "aime25")]
    summary = run_eval(config(tmp_path, rows))
    assert summary["k"] == 2
    assert summary["responses_per_problem"] == {"min": 2, "max": 4}
    with pytest.raises(VerifierError, match=r"'short' \(line 4\) has only 2"):
        run_eval(config(tmp_path, rows, k=3))
    with pytest.raises(VerifierError, match="at least 1"):
        run_eval(config(tmp_path, rows, k=0))


def test_malformed_lines_are_not_judged_and_the_run_goes_on(tmp_path: Path) -> None:
    # Without --skip-invalid a malformed line is NOT JUDGED: named with its file, line, reason
    # and responses; a line whose id and responses can be read keeps them (its generations are
    # counted); the rest is scored and the summary written; exit_code says 3.
    from verifier.eval.evaluate import EXIT_NOT_JUDGED, exit_code

    p1, p2, p3 = three_problems()
    no_truth = {"id": "nt", "domain": "math", "responses": [RIGHT % "1", WRONG, WRONG]}
    rows = [p1, "{not json", p2, no_truth, p3, dict(p3)]   # line 6 repeats p3's id
    per_response = tmp_path / "per_response.jsonl"
    cfg = config(tmp_path, rows, results_output=per_response)
    summary = run_eval(cfg)
    check_three_problems(summary)                           # the numbers leave them out
    assert json.loads(cfg.output.read_text()) == summary
    assert exit_code(summary) == EXIT_NOT_JUDGED == 3
    assert summary["n_not_judged"] == 3 and summary["n_not_judged_responses"] == 3 + 4
    by_line = {e["line"]: e for e in summary["not_judged"]}
    assert sorted(by_line) == [2, 4, 6]
    assert by_line[2]["id"] is None and by_line[2]["n_responses"] == 0
    assert "gen.jsonl line 2: not valid JSON" in by_line[2]["reason"]
    assert by_line[2]["where"].endswith("gen.jsonl: line 2")
    assert by_line[4]["id"] == "nt" and by_line[4]["n_responses"] == 3
    assert "ground_truth" in by_line[4]["reason"]
    assert by_line[6]["id"] == "p3" and by_line[6]["n_responses"] == 4
    assert "duplicate problem id 'p3' (first on line 5)" in by_line[6]["reason"]
    assert "nt" not in summary["by_problem"] and not summary["not_judged_counted_as_incorrect"]
    records = [json.loads(line) for line in per_response.read_text().splitlines()]
    nt = [r for r in records if r["id"] == "nt"]
    assert [r["status"] for r in nt] == ["INVALID_INPUT"] * 3   # its generations, unsent
    assert all("not judged" in r["detail"] for r in nt)

    # --allow-errors counts the responses of the problem it could keep as incorrect
    summary = run_eval(config(tmp_path, rows, allow_errors=True))
    assert summary["by_problem"]["nt"] == [False, False, False]
    assert summary["n_problems"] == 4 and summary["not_judged_counted_as_incorrect"]
    assert summary["k"] == 3 and summary["avg@k"] == pytest.approx((1 / 3 + 1 + 0 + 0) / 4)
    assert exit_code(summary) == 3


def test_skip_invalid_counts_skipped_lines(tmp_path: Path) -> None:
    p1, p2, p3 = three_problems()
    rows = [p1, "{not json", p2, {"id": "x", "domain": "math", "ground_truth": "1"}, p3,
            dict(p3)]  # the last one repeats p3's id
    summary = run_eval(config(tmp_path, rows, skip_invalid=True))
    check_three_problems(summary)
    assert summary["skipped_lines"] == 3
    assert [s["line"] for s in summary["skipped"]] == [2, 4, 6]
    assert "responses" in summary["skipped"][1]["reason"]
    assert "duplicate problem id 'p3'" in summary["skipped"][2]["reason"]


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ([1, 2], "JSON object"),
        ({"domain": "math", "ground_truth": "1", "responses": ["a"]}, "missing 'id'"),
        ({"id": "a", "domain": "math", "ground_truth": "1", "responses": []}, "non-empty list"),
        ({"id": "a", "domain": "math", "ground_truth": "1", "responses": ["x", 3]}, "response 1"),
        ({"id": "a", "domain": "chem", "ground_truth": "1", "responses": ["x"]}, "unknown domain"),
        ({"id": "a", "domain": "math", "responses": ["x"]}, "ground_truth"),
        ({"id": "a", "domain": "math", "ground_truth": "1", "responses": ["x"],
          "limits": {"bogus": 1}}, "unknown limits"),
    ],
)
def test_problem_from_dict_names_the_problem(row: object, reason: str) -> None:
    out = problem_from_dict(row, 1)
    assert isinstance(out, str) and reason in out


def test_unscorable_response_fails_unless_allowed(tmp_path: Path) -> None:
    rows = three_problems()
    # A limit over the server's maximum: every response of p2 is INVALID_INPUT (the item's fault)
    rows[1]["limits"] = {"timeout_s": 10_000}
    per_response = tmp_path / "per_response.jsonl"
    cfg = config(tmp_path, rows, results_output=per_response)
    with pytest.raises(VerifierError, match=r"4 of 12 responses could not be scored "
                                            r"\(INVALID_INPUT: 4\).*'p2' \(line 2\) response 0"):
        run_eval(cfg)
    assert not cfg.output.exists()  # no summary that looks valid
    statuses = [json.loads(line)["status"] for line in per_response.read_text().splitlines()]
    assert statuses.count("INVALID_INPUT") == 4  # but the failures can be inspected

    summary = run_eval(config(tmp_path, rows, allow_errors=True))
    assert summary["errors"] == {"INVALID_INPUT": 4}
    assert summary["errors_counted_as_incorrect"] is True
    assert summary["by_source"]["aime24"]["errors"] == {"INVALID_INPUT": 4}
    assert summary["avg@k"] == pytest.approx((0.25 + 0 + 0) / 3)  # counted as incorrect


def test_a_runaway_response_is_a_wrong_answer_not_an_error(tmp_path: Path) -> None:
    # Over the verifier's cap: RESPONSE_TOO_LONG, the model's own failure, a genuine zero.
    rows = three_problems()
    rows[1]["responses"][3] = "x" * (MAX_RESPONSE_CHARS + 1)
    per_response = tmp_path / "per_response.jsonl"
    summary = run_eval(config(tmp_path, rows, results_output=per_response))
    assert not summary.get("errors")
    statuses = [json.loads(line)["status"] for line in per_response.read_text().splitlines()]
    assert statuses.count("RESPONSE_TOO_LONG") == 1
    assert summary["avg@k"] == pytest.approx((0.25 + 0.75 + 0) / 3)


def test_cli_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gen = write_jsonl(tmp_path / "gen.jsonl", three_problems())
    out = tmp_path / "out" / "summary.json"
    assert main(["eval", "--input", str(gen), "--output", str(out), "--progress", "off"]) == 0
    check_three_problems(json.loads(out.read_text()))
    table = capsys.readouterr().out
    assert "avg@4" in table and "41.7" in table and "66.7" in table

    bad = write_jsonl(tmp_path / "bad.jsonl", [three_problems()[0], "nope"])
    argv = ["eval", "-i", str(bad), "-o", str(tmp_path / "bad.json"), "--progress", "off"]
    assert main(argv) == 3                       # finished, one row not judged
    out = " ".join(capsys.readouterr().out.split())
    assert "not judged: a row naming no problem" in out and "bad.jsonl line 2" in out
    assert "1 rows were not judged (0 responses); exit status 3" in out
    assert json.loads((tmp_path / "bad.json").read_text())["by_problem"] == {
        "p1": [True, False, False, False]}
    assert main([*argv, "--skip-invalid"]) == 0  # asked to skip: skipped, exit 0

    # a run that cannot start at all is still 1
    missing = ["eval", "-i", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "x.json")]
    assert main([*missing, "--progress", "off"]) == 1


def test_undecodable_lines_are_bad_lines(tmp_path: Path) -> None:
    # JSON nested past the decoder's depth (a RecursionError, not a ValueError), deep inside a
    # field too, and bytes that are not UTF-8: each is that line's error, never a traceback.
    p1, p2, p3 = three_problems()
    deep = "[" * 100_000
    path = tmp_path / "gen.jsonl"
    path.write_bytes(b"\n".join([json.dumps(p1).encode(), deep.encode(),
                                 json.dumps(p2).encode(),
                                 b'{"id": "d", "responses": ' + deep.encode() + b"}",
                                 b'{"id": "u", "responses": ["\xff"]}',
                                 json.dumps(p3).encode()]) + b"\n")
    cfg = EvalConfig(input=path, output=tmp_path / "summary.json", progress="off")
    summary = run_eval(cfg)
    check_three_problems(summary)
    reasons = {e["line"]: e["reason"] for e in summary["not_judged"]}
    assert list(reasons) == [2, 4, 5]
    assert "gen.jsonl line 2: not valid JSON: nested too deeply" in reasons[2]
    assert "not UTF-8" in reasons[5]

    cfg.skip_invalid = True
    summary = run_eval(cfg)
    check_three_problems(summary)
    assert [s["line"] for s in summary["skipped"]] == [2, 4, 5]
    assert "nested too deeply" in summary["skipped"][1]["reason"]
    assert "not UTF-8" in summary["skipped"][2]["reason"]


def test_problem_over_the_ground_truth_cap_is_not_judged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A ground truth the verifier would refuse (over MAX_GROUND_TRUTH_CHARS; lowered here) is
    # never sent: its responses are INVALID_INPUT, and they fail the run unless allowed.
    import verifier.eval.evaluate as evaluate

    monkeypatch.setattr(evaluate, "MAX_GROUND_TRUTH_CHARS", 100, raising=False)
    rows = three_problems() + [problem("big", "9" * 200, [True, True], "aime25")]
    per_response = tmp_path / "per_response.jsonl"
    cfg = config(tmp_path, rows, results_output=per_response)
    summary = run_eval(cfg)          # never a failure: not judged, left out, summary written
    check_three_problems(summary)
    assert summary["n_not_judged"] == 1 and "big" not in summary["by_problem"]
    records = [json.loads(line) for line in per_response.read_text().splitlines()]
    assert [r["status"] for r in records[-2:]] == ["INVALID_INPUT", "INVALID_INPUT"]
    assert len(records) == 14   # the other problems were scored all the same

    summary = run_eval(config(tmp_path, rows, allow_errors=True))
    assert summary["not_judged"] == [{"id": "big", "line": 4,
                                      "where": str(tmp_path / "gen.jsonl") + ": line 4",
                                      "n_responses": 2,
                                      "reason": "the ground truth is 202 characters of JSON, "
                                                "over the verifier's cap of 100"}]
    assert summary["n_not_judged"] == 1
    assert summary["errors"] == {"INVALID_INPUT": 2}
    assert summary["by_problem"]["big"] == [False, False]
    assert summary["profiles"] == {"-": 2, "default": 12}   # never sent to a scorer


def test_eval_help_says_what_the_flags_do(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "nested too deeply" in text                        # --skip-invalid
    assert "not_judged" in text and "never sent" in text      # --allow-errors
    assert "Exit status: 0 every row judged; 3" in text
