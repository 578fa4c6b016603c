"""``verifier eval --problems FILES --generations FILE`` end to end: LiveCodeBench release rows in
their real shape (private tests compressed as the release stores them), Skywork rows in verl's
parquet schema and plain JSONL, generations in LiveCodeBench's custom-evaluator JSON and in JSONL
of full outputs, the contest-date window, and bad generations files. Scored by a real server
(conftest's, nsjail for code)."""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verifier.cli import main

ADD = "a, b = map(int, input().split())\nprint(a + b)"
SUB = "a, b = map(int, input().split())\nprint(a - b)"
MUL_CLASS = ("class Solution:\n    def mul(self, a: int, b: int) -> int:\n"
             "        return a * b")
ADD_CLASS = MUL_CLASS.replace("a * b", "a + b")


def compressed(tests: list[dict]) -> str:
    """Private tests as LiveCodeBench's release files store them: base64(zlib(pickle(json)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def lcb_row(qid: str, platform: str, difficulty: str, date: str, *, fn: str | None = None,
            starter: str = "") -> dict:
    """A code_generation_lite row, every field of the release, as JSON text where it is."""
    kind = "functional" if fn else "stdin"
    if fn:
        public = [{"input": "2\n3", "output": "6", "testtype": kind}]
        private = [{"input": "4\n5", "output": "20", "testtype": kind},
                   {"input": "-1\n7", "output": "-7", "testtype": kind}]
    else:
        public = [{"input": "1 2\n", "output": "3\n", "testtype": kind}]
        private = [{"input": "10 20\n", "output": "30\n", "testtype": kind},
                   {"input": "-5 5\n", "output": "0\n", "testtype": kind}]
    return {"question_title": f"title {qid}", "question_content": f"Problem {qid}.",
            "platform": platform, "question_id": qid, "contest_id": f"c-{qid}",
            "contest_date": date, "starter_code": starter, "difficulty": difficulty,
            "public_test_cases": json.dumps(public), "private_test_cases": compressed(private),
            "metadata": json.dumps({"func_name": fn} if fn else {})}


LCB_ROWS = [
    lcb_row("abc400_a", "atcoder", "easy", "2024-09-14T00:00:00"),
    lcb_row("3500", "leetcode", "medium", "2025-02-01T00:00:00", fn="mul",   # the window's end
            starter="class Solution:\n    def mul(self, a: int, b: int) -> int:\n        "),
    lcb_row("2000C", "codeforces", "hard", "2024-08-01T00:00:00"),           # the window's start
    lcb_row("abc360_b", "atcoder", "easy", "2024-07-31T23:00:00"),           # before the window
]


def skywork_rows() -> list[dict]:
    """Skywork-OR1-RL-Data rows in verl's schema (code tests as JSON text with the release's
    empty fn_name)."""
    return [
        {"data_source": "train-code-taco", "prompt": [{"role": "user", "content": "Add."}],
         "ability": "code",
         "reward_model": {"ground_truth": json.dumps({"inputs": ["1 2\n", "7 8\n"],
                                                      "outputs": ["3\n", "15\n"],
                                                      "fn_name": ""}), "style": "rule"},
         "extra_info": {"index": 7, "model_difficulty": {"DeepSeek-R1-Distill-Qwen-7B": 5}}},
        {"data_source": "train-math-deepscaler", "prompt": [{"role": "user", "content": "1+2?"}],
         "ability": "math", "reward_model": {"ground_truth": '["3"]', "style": "rule"},
         "extra_info": {"index": 8, "model_difficulty": {"DeepSeek-R1-Distill-Qwen-7B": 9}}},
    ]


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    lcb = tmp_path / "test5.jsonl"
    lcb.write_text("".join(json.dumps(r) + "\n" for r in LCB_ROWS))
    sky = tmp_path / "skywork.parquet"
    pq.write_table(pa.Table.from_pylist(skywork_rows()), sky)
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"id": "m1", "domain": "math", "ground_truth": "42",
                                 "data_source": "plain"}) + "\n")
    return {"lcb": lcb, "sky": sky, "plain": plain}


def run(tmp_path: Path, addr: str, problems: list[Path], generations: Path,
        *extra: str) -> tuple[int, dict | None]:
    out = tmp_path / "summary.json"
    out.unlink(missing_ok=True)
    code = main(["eval", "--problems", ",".join(map(str, problems)), "--generations",
                 str(generations), "--output", str(out), "--addr", addr, "--progress", "off",
                 *extra])
    return code, json.loads(out.read_text()) if out.exists() else None


def test_lcb_custom_evaluator_json(tmp_path: Path, files: dict[str, Path], server,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    gens = tmp_path / "custom.json"
    gens.write_text(json.dumps([
        {"question_id": "3500", "code_list": [MUL_CLASS, MUL_CLASS]},
        {"question_id": "abc400_a", "code_list": [ADD, SUB]},
        {"question_id": "train-code-taco-7", "code_list": [SUB, ADD]},
        {"question_id": "abc360_b", "code_list": [ADD]},           # its problem is outside
    ]))
    code, s = run(tmp_path, server[1], [files["lcb"], files["sky"]], gens)
    assert code == 0 and s is not None
    assert s["generations_format"] == "lcb-custom"
    assert s["by_problem"] == {"abc400_a": [True, False], "3500": [True, True],
                               "train-code-taco-7": [False, True]}   # problems-file order
    assert s["k"] == 2 and s["n_problems"] == 3 and s["n_responses"] == 6
    assert s["avg@k"] == pytest.approx((0.5 + 1 + 0.5) / 3)
    assert s["pass@k"] == pytest.approx(1.0)
    assert s["lcb_window"] == ["2024-08-01", "2025-02-01"]
    assert s["outside_window"] == 1 and s["generations_outside_window"] == 1
    # problems without a generation are named and left out, not scored as 0
    assert s["missing_generations"] == ["2000C", "train-math-deepscaler-8"]
    assert s["n_missing_generations"] == 2
    assert s["profiles"]["lcb"] == 4            # the verifier says which rules applied
    lcb = s["lcb"]
    assert lcb["profile"] == "lcb" and lcb["n_problems"] == 2
    assert lcb["pass@1"] == pytest.approx(0.75)
    assert lcb["by_difficulty"] == {"easy": {"n_problems": 1, "pass@1": 0.5},
                                    "medium": {"n_problems": 1, "pass@1": 1.0}}
    assert lcb["by_platform"] == {"atcoder": {"n_problems": 1, "pass@1": 0.5},
                                  "leetcode": {"n_problems": 1, "pass@1": 1.0}}
    assert set(s["by_source"]) == {"livecodebench", "train-code-taco"}
    out = capsys.readouterr().out
    for text in ("LiveCodeBench pass@1", "difficulty: easy", "platform: leetcode", "75.0",
                 "1 LiveCodeBench problems outside", "2 problems have no generation",
                 "2000C"):
        assert text in out, text


def test_jsonl_full_outputs_and_the_window(tmp_path: Path, files: dict[str, Path],
                                           server) -> None:
    def fenced(code: str) -> str:
        return f"<think>plan it</think>\nHere it is:\n```python\n{code}\n```\n"

    gens = tmp_path / "gens.jsonl"
    gens.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "abc400_a", "responses": [fenced(ADD), fenced(SUB)]},
        {"id": "2000C", "responses": [fenced(SUB), "<think>no code</think>"]},
        {"id": "abc360_b", "responses": [fenced(ADD), fenced(ADD)]},
        {"id": "m1", "responses": ["<think>6*7</think> \\boxed{42}", "\\boxed{41}"]},
    ]))
    problems = [files["lcb"], files["plain"]]
    code, s = run(tmp_path, server[1], problems, gens, "--lcb-all-dates")
    assert code == 0 and s is not None
    assert s["generations_format"] == "jsonl" and s["lcb_window"] is None
    assert s["outside_window"] == 0
    assert s["by_problem"] == {"abc400_a": [True, False], "2000C": [False, False],
                               "abc360_b": [True, True], "m1": [True, False]}
    assert s["missing_generations"] == ["3500"]
    assert s["lcb"]["by_difficulty"]["easy"] == {"n_problems": 2, "pass@1": 0.75}
    assert s["lcb"]["by_platform"]["codeforces"] == {"n_problems": 1, "pass@1": 0.0}
    assert s["by_source"]["plain"]["avg@k"] == 0.5

    # A narrower window: 2000C (Aug 1) and abc360_b (Jul 31) fall out; the end stays inclusive
    code, s = run(tmp_path, server[1], problems, gens, "--lcb-start", "2024-08-02")
    assert code == 0 and s is not None
    assert s["outside_window"] == 2 and s["generations_outside_window"] == 2
    assert list(s["by_problem"]) == ["abc400_a", "m1"]
    assert s["missing_generations"] == ["3500"]
    assert s["lcb"]["n_problems"] == 1


@pytest.mark.parametrize(("name", "content", "message"), [
    ("unknown.json", [{"question_id": "nope", "code_list": ["x"]},
                      {"question_id": "abc400_a", "code_list": ["x"]},
                      {"question_id": 77, "code_list": ["x"]}],
     r"2 generations name problems that are not in the problems files: 'nope' \(.*entry 0\), "
     r"'77' \(.*entry 2\)"),
    ("dup.json", [{"question_id": "abc400_a", "code_list": ["x"]},
                  {"question_id": "abc400_a", "code_list": ["y"]}],
     r"dup.json: entry 1: duplicate question_id 'abc400_a' \(first at entry 0\)"),
    ("shape.json", [["print(1)"]], r"shape.json: entry 0: expected an object"),
    ("str.json", [{"question_id": "abc400_a", "code_list": "print(1)"}],
     r"str.json: entry 0: 'code_list' of 'abc400_a' must be a non-empty list of strings"),
    ("int.json", [{"question_id": "abc400_a", "code_list": ["print(1)", 3]}],
     r"int.json: entry 0: 'code_list' of 'abc400_a': item 1 is int, not a string"),
    ("top.json", {"abc400_a": ["x"]}, r"top.json: line 1: 'id' must be a string"),
    ("dup.jsonl", ['{"id": "abc400_a", "responses": ["a"]}', "",
                   '{"id": "abc400_a", "responses": ["b"]}'],
     r"dup.jsonl: line 3: duplicate id 'abc400_a' \(first on line 1\)"),
    ("bad.jsonl", ['{"id": "abc400_a", "responses": ["a"]}', '{"id": "3500", "responses": "b"}'],
     r"bad.jsonl: line 2: 'responses' of '3500' must be a non-empty list"),
    ("notjson.jsonl", ['{"id": "abc400_a", "responses": ["a"]}', "{oops"],
     r"notjson.jsonl: line 2: not valid JSON"),
])
def test_bad_generations_files_name_the_entry(tmp_path: Path, files: dict[str, Path], name: str,
                                              content, message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    import re

    path = tmp_path / name
    if name.endswith(".jsonl"):
        path.write_text("\n".join(content) + "\n")
    else:
        path.write_text(json.dumps(content))
    # No verifier is needed: the files are checked before anything is scored.
    code, summary = run(tmp_path, "127.0.0.1:1", [files["lcb"]], path)
    err = capsys.readouterr().err
    assert code == 1 and summary is None
    assert re.search(message, " ".join(err.split())), err


def test_flags_are_checked(tmp_path: Path, files: dict[str, Path],
                           capsys: pytest.CaptureFixture[str]) -> None:
    gens = tmp_path / "g.jsonl"
    gens.write_text('{"id": "abc400_a", "responses": ["a"]}\n')
    out = str(tmp_path / "s.json")
    cases = {
        "not both": ["--input", str(gens), "--problems", str(files["lcb"]), "--generations",
                     str(gens)],
        "with --generations FILE": ["--problems", str(files["lcb"])],
        "--lcb-start must be a date": ["--problems", str(files["lcb"]), "--generations",
                                       str(gens), "--lcb-start", "August"],
    }
    for message, argv in cases.items():
        with pytest.raises(SystemExit) as exit_:  # tyro reports a config's ValueError
            main(["eval", *argv, "--output", out])
        assert exit_.value.code == 2
        assert message in " ".join(capsys.readouterr().err.split())
