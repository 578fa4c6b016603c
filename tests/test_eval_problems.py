"""``verifier eval --problems FILES --generations FILE`` end to end: LiveCodeBench release rows in
their real shape (private tests compressed as the release stores them), Skywork rows in verl's
parquet schema and plain JSONL, generations in LiveCodeBench's custom-evaluator JSON and in JSONL
of full outputs, the contest-date window, and bad generations files. Scored by a real server
(conftest's, nsjail for code)."""

from __future__ import annotations

import base64
import json
import pickle
import struct
import tracemalloc
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verifier.data import lcb
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


# --------------------------------------------------------------------------------------------
# Hostile rows: one row never ends a run
# --------------------------------------------------------------------------------------------


def lcb_bomb(inflated: int) -> str:
    """Private tests in the release's form, base64(zlib(pickle(json_text))), whose JSON text
    (one stdin test) is ``inflated`` bytes: a zlib bomb, built by streaming (never held whole),
    a few hundred KB however large it inflates."""
    head, tail = '[{"input": "', '", "output": "1\\n", "testtype": "stdin"}]'
    size = len(head) + inflated + len(tail)
    z = zlib.compressobj(1)
    # PROTO 4, BINUNICODE8 <size> <utf-8 text>, STOP: exactly what pickle.dumps(text) parses as
    out = [z.compress(b"\x80\x04\x8d" + struct.pack("<Q", size) + head.encode())]
    block = b"a" * (1 << 20)
    left = inflated
    while left:
        out.append(z.compress(block[:min(left, len(block))]))
        left -= min(left, len(block))
    out += [z.compress(tail.encode() + b"."), z.flush()]
    return base64.b64encode(b"".join(out)).decode()


def write_lines(path: Path, lines: list) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else
                               (x if isinstance(x, str) else json.dumps(x)).encode()) + b"\n"
                              for x in lines))
    return path


def test_lcb_tests_bound_refuses_nothing_the_verifier_could_judge() -> None:
    # The bound: well under the 1 GiB that let a 1.4 MB bomb cost 4.25 GB, and over the
    # verifier's own ground-truth cap, so no row it could judge is refused here.
    from verifier.items import MAX_GROUND_TRUTH_CHARS

    assert 2 * MAX_GROUND_TRUTH_CHARS <= lcb.MAX_LCB_TESTS_BYTES <= 256 << 20


def test_zlib_bomb_is_refused_while_inflating() -> None:
    bound = lcb.MAX_LCB_TESTS_BYTES
    bomb = lcb_bomb(136 << 20)   # ~0.8 MB that inflate past the real bound (128 MiB)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="inflate past"):
            lcb.decode_lcb_tests(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Inflated in 1 MiB steps and refused at the bound: never the bomb's whole output (nor
    # the pickled string and JSON decoded from it).
    assert peak < bound + (4 << 20), peak


def test_zlib_bomb_row_is_not_judged_and_the_run_goes_on(
        tmp_path: Path, server, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(lcb, "MAX_LCB_TESTS_BYTES", 1 << 20)   # a small bomb suffices
    bomb = lcb_row("bomb_1", "atcoder", "hard", "2024-10-01T00:00:00")
    bomb["private_test_cases"] = lcb_bomb(16 << 20)
    problems = write_lines(tmp_path / "lcb.jsonl", [LCB_ROWS[0], bomb, *LCB_ROWS[1:]])
    gens = tmp_path / "custom.json"
    gens.write_text(json.dumps([{"question_id": "bomb_1", "code_list": [ADD, ADD]},
                                {"question_id": "abc400_a", "code_list": [ADD, SUB]}]))
    per_response = tmp_path / "per_response.jsonl"

    # Without --allow-errors: everything else is scored, the row is named as not judged and
    # left out of every number, the summary written, exit 3.
    code, s = run(tmp_path, server[1], [problems], gens, "--results-output", str(per_response))
    out = " ".join(capsys.readouterr().out.split())
    assert code == 3 and s is not None
    assert "not judged: problem 'bomb_1' (2 responses, left out of every number)" in out
    assert "private_test_cases" in out and "inflate past 1048576 bytes" in out
    assert s["by_problem"] == {"abc400_a": [True, False]} and s["errors"] == {}
    assert s["n_not_judged"] == 1 and s["n_not_judged_responses"] == 2
    assert s["lcb"]["n_problems"] == 1 and s["lcb"]["pass@1"] == pytest.approx(0.5)
    records = [json.loads(line) for line in per_response.read_text().splitlines()]
    assert [(r["id"], r["status"]) for r in records] == [
        ("abc400_a", "CORRECT"), ("abc400_a", "INCORRECT"),
        ("bomb_1", "INVALID_INPUT"), ("bomb_1", "INVALID_INPUT")]
    assert "not judged" in records[2]["detail"] and records[2]["profile"] == ""

    # With --allow-errors: its responses count as incorrect; still exit 3 (not judged).
    code, s = run(tmp_path, server[1], [problems], gens, "--allow-errors")
    assert code == 3 and s is not None
    assert s["by_problem"] == {"abc400_a": [True, False], "bomb_1": [False, False]}
    assert s["n_not_judged"] == 1
    [entry] = s["not_judged"]
    assert entry["id"] == "bomb_1" and entry["n_responses"] == 2
    assert "lcb.jsonl: line 2" in entry["reason"] and "inflate past" in entry["reason"]
    assert s["errors"] == {"INVALID_INPUT": 2} and s["errors_counted_as_incorrect"]
    assert s["profiles"] == {"-": 2, "lcb": 2}       # the bomb's items were never sent
    assert s["lcb"]["n_problems"] == 2 and s["lcb"]["pass@1"] == pytest.approx(0.25)
    assert "not judged: problem 'bomb_1' (2 responses, counted as incorrect)" in " ".join(
        capsys.readouterr().out.split())


def test_bomb_outside_the_window_is_never_decoded(tmp_path: Path, server,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = lcb_row("old_bomb", "atcoder", "hard", "2023-01-01T00:00:00")   # before the window
    bomb["private_test_cases"] = lcb_bomb(32 << 20)
    decoded: list[str] = []
    real = lcb.decode_lcb_tests

    def spy(value):
        decoded.append(value if isinstance(value, str) else "")
        return real(value)

    monkeypatch.setattr(lcb, "decode_lcb_tests", spy)
    problems = write_lines(tmp_path / "lcb.jsonl", [bomb, LCB_ROWS[0]])
    plain = write_lines(tmp_path / "plain.jsonl", [
        {"id": "m1", "domain": "math", "ground_truth": "42", "data_source": "plain"}])
    gens = write_lines(tmp_path / "gens.jsonl", [
        {"id": "m1", "responses": ["\\boxed{42}"]},
        {"id": "old_bomb", "responses": ["```python\nprint(1)\n```"]}])
    code, s = run(tmp_path, server[1], [problems, plain], gens)
    assert code == 0 and s is not None
    assert bomb["private_test_cases"] not in decoded      # dropped by date before decoding
    assert LCB_ROWS[0]["private_test_cases"] in decoded   # the row inside is decoded
    assert s["outside_window"] == 1 and s["generations_outside_window"] == 1
    assert s["by_problem"] == {"m1": [True]} and s["missing_generations"] == ["abc400_a"]


DEEP = "[" * 100_000


def test_deeply_nested_problem_rows_are_bad_rows(tmp_path: Path, server,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    deep_tests = lcb_row("deep_lcb", "atcoder", "easy", "2024-09-14T00:00:00")
    deep_tests["public_test_cases"] = DEEP
    deep_args = lcb_row("deep_args", "leetcode", "easy", "2024-09-14T00:00:00", fn="mul")
    deep_args["private_test_cases"] = compressed(
        [{"input": "[" * 50_000 + "\n3", "output": "6", "testtype": "functional"}])
    problems = write_lines(tmp_path / "problems.jsonl", [
        {"id": "m1", "domain": "math", "ground_truth": "42"},
        DEEP,                                                           # line 2: no id at all
        deep_tests,                                                     # line 3
        {"id": "deep_gt", "domain": "code", "ground_truth": DEEP},      # line 4
        deep_args,                                                      # line 5
        {"id": "deep_math", "domain": "math", "ground_truth": DEEP},    # line 6: a string answer
    ])
    gens = write_lines(tmp_path / "gens.jsonl", [
        {"id": "m1", "responses": ["\\boxed{42}", "\\boxed{7}"]},
        {"id": "deep_lcb", "responses": ["x", "y"]},
        {"id": "deep_gt", "responses": ["x", "y"]},
        {"id": "ghost", "responses": ["x", "y"]},     # maybe line 2's: its id cannot be read
    ])
    # Without --skip-invalid: every bad row is not judged, named with its file and line; the
    # generations of those naming their id are counted with them; the run goes on, exit 3.
    code, s = run(tmp_path, server[1], [problems], gens)
    out = " ".join(capsys.readouterr().out.split())
    assert code == 3 and s is not None    # no traceback, no early end
    assert s["by_problem"] == {"m1": [True, False]}
    assert s["missing_generations"] == ["deep_math"]
    entries = {e["where"].rsplit(": ", 1)[1]: e for e in s["not_judged"]}
    assert sorted(entries) == ["line 2", "line 3", "line 4", "line 5"]
    assert [(entries[f"line {n}"]["id"], entries[f"line {n}"]["n_responses"])
            for n in (2, 3, 4, 5)] == [(None, 0), ("deep_lcb", 2), ("deep_gt", 2),
                                       ("deep_args", 0)]
    for e in entries.values():
        assert "nested too deeply" in e["reason"], e
    assert s["n_not_judged"] == 4 and s["n_not_judged_responses"] == 4
    assert s["skipped_rows"] == 0 and s["generations_of_skipped_rows"] == []
    assert s["unmatched_generations"] == ["ghost"]   # maybe line 2's: named, left out
    assert "problems.jsonl: line 2: not valid JSON: nested too deeply" in out
    assert "4 rows were not judged (4 responses); exit status 3" in out

    code, s = run(tmp_path, server[1], [problems], gens, "--skip-invalid")
    assert code == 0 and s is not None
    assert s["by_problem"] == {"m1": [True, False]}
    assert s["missing_generations"] == ["deep_math"]   # a math answer string: not a bad row
    skipped = {r["where"].rsplit(": ", 1)[1]: r for r in s["skipped_problem_rows"]}
    assert list(skipped) == ["line 2", "line 3", "line 4", "line 5"]
    assert skipped["line 2"]["id"] is None
    assert [skipped[f"line {n}"]["id"] for n in (3, 4, 5)] == ["deep_lcb", "deep_gt",
                                                              "deep_args"]
    for n in (2, 3, 4, 5):
        assert "nested too deeply" in skipped[f"line {n}"]["reason"], skipped[f"line {n}"]
    assert s["skipped_rows"] == 4 and len(skipped) == 4
    assert s["generations_of_skipped_rows"] == ["deep_lcb", "deep_gt"]
    assert s["unmatched_generations"] == ["ghost"]


def test_deeply_nested_or_undecodable_generations(tmp_path: Path, files: dict[str, Path],
                                                  server,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    gens = write_lines(tmp_path / "gens.jsonl", [
        {"id": "m1", "responses": ["\\boxed{42}"]},
        DEEP,                                                   # line 2
        '{"id": "m2", "responses": ' + DEEP + "}",              # line 3: deep inside a field
        b'{"id": "m3", "responses": ["\xff\xfe"]}',             # line 4: not UTF-8
    ])
    code, s = run(tmp_path, server[1], [files["plain"]], gens)
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and s is None
    assert "gens.jsonl: line 2: not valid JSON: nested too deeply" in err

    code, s = run(tmp_path, server[1], [files["plain"]], gens, "--skip-invalid")
    assert code == 0 and s is not None
    assert s["by_problem"] == {"m1": [True]}
    assert [x["where"].rsplit(": ", 1)[1] for x in s["skipped"]] == ["line 2", "line 3",
                                                                    "line 4"]
    assert "not UTF-8" in s["skipped"][2]["reason"] and s["skipped_lines"] == 3

    # LiveCodeBench's format is one JSON document: too deep, it is one error for the file.
    custom = tmp_path / "custom.json"
    custom.write_text('[{"question_id": "m1", "code_list": ["print(42)"]}, ' + DEEP + "]")
    code, s = run(tmp_path, server[1], [files["plain"]], custom, "--skip-invalid")
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and s is None
    assert "custom.json: whole file: not valid JSON: nested too deeply" in err


def test_bad_ground_truth_row_is_not_judged_with_its_generations(
        tmp_path: Path, server, capsys: pytest.CaptureFixture[str]) -> None:
    # The reported case: a row whose ground truth cannot be parsed, named by the generations.
    # The plain command finishes: the row is not judged (its generations counted and named),
    # the rest is scored, exit 3; with --skip-invalid the row and its generations are skipped.
    bad = lcb_row("bad_gt", "atcoder", "easy", "2024-09-14T00:00:00")
    bad["public_test_cases"] = json.dumps([{"input": "1\n", "output": "2\n",
                                            "testtype": "stdin"}, {"oops": 1}])
    problems = write_lines(tmp_path / "rows.jsonl", [LCB_ROWS[0], bad])
    gens = tmp_path / "custom.json"
    gens.write_text(json.dumps([{"question_id": "abc400_a", "code_list": [ADD]},
                                {"question_id": "bad_gt", "code_list": [ADD, ADD, SUB]}]))
    code, s = run(tmp_path, server[1], [problems], gens)
    assert code == 3 and s is not None
    assert s["by_problem"] == {"abc400_a": [True]} and s["pass@1"] == 1.0
    [entry] = s["not_judged"]
    assert entry["id"] == "bad_gt" and entry["n_responses"] == 3
    assert entry["where"].endswith("rows.jsonl: line 2")
    assert "rows.jsonl: line 2:" in entry["reason"]
    assert s["lcb"]["n_problems"] == 1

    code, s = run(tmp_path, server[1], [problems], gens, "--allow-errors")
    assert code == 3 and s is not None
    assert s["by_problem"] == {"abc400_a": [True], "bad_gt": [False, False, False]}
    assert s["lcb"]["n_problems"] == 2          # the row's question was still read
    assert s["lcb"]["pass@1"] == pytest.approx(0.5)

    code, s = run(tmp_path, server[1], [problems], gens, "--skip-invalid")
    assert code == 0 and s is not None
    assert s["by_problem"] == {"abc400_a": [True]} and s["n_not_judged"] == 0
    assert s["generations_of_skipped_rows"] == ["bad_gt"]

    # Every row bad: still a summary (no numbers), exit 3
    only_bad = write_lines(tmp_path / "only_bad.jsonl", [bad])
    only_gens = tmp_path / "only_bad.json"
    only_gens.write_text(json.dumps([{"question_id": "bad_gt", "code_list": [ADD]}]))
    code, s = run(tmp_path, server[1], [only_bad], only_gens)
    assert code == 3 and s is not None
    assert s["n_problems"] == 0 and s["pass@1"] is None and s["n_not_judged"] == 1
    capsys.readouterr()


# --------------------------------------------------------------------------------------------
# Integers past Python's 4,300 digits in ground truth: parsed, sent and judged as the profile
# says (verifier/scoring/bigint.py), in eval, on the client and on the server, never by raising the
# process-wide limit
# --------------------------------------------------------------------------------------------

BIG_EXP = 5224
BIG_PROGRAM = ("class Solution:\n    def big(self, n: int) -> int:\n"
               "        return 10 ** n + 12345\n")


def big_digits() -> str:
    """The 5,225 digits of 10**5224 + 12345, written without the interpreter's conversion."""
    return "1" + "0" * (BIG_EXP - 5) + "12345"


def test_a_5225_digit_expected_output_through_the_real_client(server) -> None:
    import sys

    from verifier.client import VerifierClient

    limit = sys.get_int_max_str_digits()
    big = 10**BIG_EXP + 12345
    text = big_digits()
    assert len(text) == 5225
    items = [
        # The reported row: a functional test whose expected output is a JSON string of it.
        {"id": "lcb-text", "domain": "code", "profile": "lcb",
         "response": f"```python\n{BIG_PROGRAM}```",
         "ground_truth": {"inputs": [str(BIG_EXP)], "outputs": [text], "fn_name": "big"}},
        # The same as a Python int in the ground truth (TACO-style outputs): the client must
        # write it on the wire (json.dumps alone raises past 4,300 digits).
        {"id": "lcb-int", "domain": "code", "profile": "lcb",
         "response": f"```python\n{BIG_PROGRAM}```",
         "ground_truth": {"inputs": [[BIG_EXP]], "outputs": [big], "fn_name": "big"}},
        {"id": "default-int", "domain": "code", "profile": "default",
         "response": f"```python\n{BIG_PROGRAM}```",
         "ground_truth": {"inputs": [[BIG_EXP]], "outputs": [big], "fn_name": "big"}},
        {"id": "default-text", "domain": "code", "profile": "default",
         "response": f"```python\n{BIG_PROGRAM}```",
         "ground_truth": {"inputs": [str(BIG_EXP)], "outputs": [text], "fn_name": "big"}},
        {"id": "lcb-stdin", "domain": "code", "profile": "lcb",
         "response": f"```python\nprint(10 ** int(input()) + 12345)\n```",
         "ground_truth": {"inputs": [f"{BIG_EXP}\n"], "outputs": [text + "\n"]}},
    ]
    with VerifierClient(server[1]) as client:
        results = {r.id: r for r in client.score(items)}
    assert sys.get_int_max_str_digits() == limit        # never raised for the process
    for name in ("lcb-text", "lcb-int", "lcb-stdin"):
        assert results[name].status.value == "CORRECT", results[name]
    # The default profile keeps Python's 4,300 digits where text becomes an int: the JSON
    # text of the expected output is refused there; an int already in the ground truth is data
    # (compared as a value, never converted), so it is judged under every profile.
    assert results["default-text"].status.value == "INVALID_INPUT", results["default-text"]
    assert "4300" in results["default-text"].detail
    assert results["default-int"].status.value == "CORRECT", results["default-int"]


def test_a_5225_digit_ground_truth_in_every_row_format_through_eval(tmp_path: Path,
                                                                    server) -> None:
    text = big_digits()
    lcb_big = lcb_row("big_lcb", "leetcode", "hard", "2024-09-14T00:00:00", fn="big")
    lcb_big["public_test_cases"] = json.dumps([{"input": str(BIG_EXP), "output": text,
                                                "testtype": "functional"}])
    lcb_big["private_test_cases"] = compressed([{"input": "3", "output": "13345",
                                                 "testtype": "functional"}])
    # A plain row with the integer as a JSON number (read with json_loads_digits), and a verl
    # row whose ground truth is JSON text holding it: both become Python ints the client sends.
    gt = '{"inputs": [[%d]], "outputs": [%s], "fn_name": "big"}' % (BIG_EXP, text)
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"id": "big_plain", "domain": "code", "ground_truth": ' + gt + "}\n")
    verl = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"data_source": "taco", "prompt": [{"role": "user", "content": "Big."}],
         "ability": "code", "reward_model": {"ground_truth": gt, "style": "rule"},
         "extra_info": {"index": 1}}]), verl)
    problems = write_lines(tmp_path / "rows.jsonl", [lcb_big])
    gens = tmp_path / "custom.json"
    gens.write_text(json.dumps([{"question_id": q, "code_list": [BIG_PROGRAM]}
                                for q in ("big_lcb", "big_plain", "taco-1")]))
    code, s = run(tmp_path, server[1], [problems, plain, verl], gens)
    assert code == 0 and s is not None, s
    assert s["by_problem"] == {"big_lcb": [True], "big_plain": [True], "taco-1": [True]}
    assert s["n_not_judged"] == 0
