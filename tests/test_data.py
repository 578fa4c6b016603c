"""Loaders (trainer/data.py): the real AIME parquet files, every fixture in datasets/fixtures/
round-tripped through the real verifier, LiveCodeBench's compressed tests and date window,
prompt building, malformed rows, and the released difficulty field."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import pickle
import zlib
from datetime import datetime
from pathlib import Path

import pytest

from trainer.data import (DEFAULT_SUFFIX, LCB_REPORT_WINDOW, DataError, decode_lcb_tests,
                          default_lcb_style, in_window, lcb_prompt, lcb_r1_prompt, load_dataset,
                          load_problems, model_difficulty, select_by_difficulty)

ROOT = Path(__file__).resolve().parents[1]
AIME = ROOT / "datasets" / "eval"
FIX = ROOT / "datasets" / "fixtures"
R7 = "DeepSeek-R1-Distill-Qwen-7B"


def _fixtures_module():
    spec = importlib.util.spec_from_file_location("make_fixtures", FIX / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _score(server, problems, responses: dict[str, str]) -> dict:
    """Verdicts of the real verifier (conftest's server: a real gRPC server, nsjail sandbox)."""
    from verifier.client import VerifierClient

    with VerifierClient(server[1]) as client:
        results = client.score([p.verifier_item(p.id, responses[p.id]) for p in problems])
    return {r.id: r for r in results}


# -- the real AIME files ---------------------------------------------------------------------

def test_aime_files_round_trip_through_the_verifier(server) -> None:
    from trainer.evaluation import generations_records
    from verifier.eval.evaluate import problem_from_dict

    res = load_dataset([AIME / "aime24.parquet", AIME / "aime25.parquet"])
    assert (len(res.problems), res.skipped, res.outside_window) == (60, 0, 0)
    ids = [p.id for p in res.problems]
    assert ids[:2] == ["test-math-aime24-0", "test-math-aime24-1"]
    assert ids[30:32] == ["test-math-aime25-0", "test-math-aime25-1"]  # aime25 has extra_info.id
    assert len(set(ids)) == 60
    assert {p.data_source for p in res.problems} == {"test-math-aime24", "test-math-aime25"}
    assert res.problems[0].ground_truth == "204" and res.problems[1].ground_truth == "025"
    for p in res.problems:
        assert p.domain == "math" and p.messages[-1]["role"] == "user"
        assert p.messages[-1]["content"].count(DEFAULT_SUFFIX.strip()) == 1
    # the gold answers, boxed, are judged correct (leading zeros included: "025" = 25)
    def gold(gt: str) -> str:  # "025" -> "25"; one answer is "336^\\circ"
        return str(int(gt)) if gt.isdigit() else gt

    results = _score(server, res.problems,
                     {p.id: f"<think>ok</think> $\\boxed{{{gold(p.ground_truth)}}}$" for p in res.problems})
    assert {r.status.value for r in results.values()} == {"CORRECT"}
    # and a generations line built from a problem is valid `verifier eval` input
    from trainer.interfaces import Completion

    line = generations_records(res.problems[:1], [Completion(0, 0, [1], [2], "x", False)])[0]
    assert not isinstance(problem_from_dict(json.loads(json.dumps(line)), 1), str)


# -- fixtures ----------------------------------------------------------------------------------

def test_every_fixture_round_trips_through_the_verifier(server) -> None:
    mf = _fixtures_module()
    res = load_dataset([FIX / "skywork_rl.parquet", FIX / "lcb_release.jsonl", FIX / "plain.jsonl"])
    assert res.skipped == 0 and res.outside_window == 1  # the LCB problem from May 2024
    by_id = {p.id: p for p in res.problems}
    assert set(by_id) == set(mf.REFERENCE)
    assert [p.domain for p in res.problems] == ["math"] * 3 + ["code"] * 4 + ["math"] * 2 + ["code"]
    # Skywork: math ground truth kept as given (JSON list string or plain), code parsed and
    # cleaned of empty fields (fn_name "" = stdin/stdout, as the release's preprocessing does)
    assert by_id["train-math-numinamath1.5_amc_aime-0"].ground_truth == '["3"]'
    assert by_id["train-code-taco-easy-3"].ground_truth == {
        "inputs": ["1 2\n", "10 -4\n"], "outputs": ["3\n", "6\n"]}
    assert by_id["train-code-leetcode-Easy-4"].ground_truth["fn_name"] == "maxOfList"
    assert by_id["train-math-deepscaler-1"].extra["model_difficulty"][R7] == 9
    # LiveCodeBench: public + decompressed private tests; functional -> fn_name
    assert by_id["abc999_a"].ground_truth == {"inputs": ["1 2\n", "100 200\n", "-5 5\n"],
                                              "outputs": ["3\n", "300\n", "0\n"]}
    assert by_id["3999"].ground_truth == {"inputs": ["1\n2", "-7\n7"], "outputs": ["3", "0"],
                                          "fn_name": "addTwo"}
    assert by_id["3999"].data_source == "livecodebench"
    # LiveCodeBench rows are judged by LiveCodeBench's rules; other rows by the server's default
    assert by_id["3999"].verifier_item("x", "r")["profile"] == "lcb"
    assert by_id["train-code-taco-easy-3"].verifier_item("x", "r")["profile"] == ""
    assert by_id["3999"].extra["platform"] == "leetcode"
    # the suffix goes to math prompts only; code prompts keep their own format instructions
    assert by_id["plain-m2"].messages[0] == {"role": "system",
                                             "content": "You are a careful solver."}
    assert by_id["plain-m2"].messages[-1]["content"].endswith(DEFAULT_SUFFIX)
    assert not by_id["plain-c1"].messages[-1]["content"].endswith(DEFAULT_SUFFIX)
    results = _score(server, res.problems, mf.REFERENCE)
    assert {k: r.status.value for k, r in results.items()} == {k: "CORRECT" for k in mf.REFERENCE}
    wrong = _score(server, res.problems, {k: "<think>x</think> \\boxed{7}\n```python\nprint(7)\n```"
                                  for k in mf.REFERENCE})
    assert not any(r.correct for r in wrong.values())


def test_fixture_files_are_what_the_generator_writes(tmp_path) -> None:
    import pyarrow.parquet as pq

    mf = _fixtures_module()
    mf.write(tmp_path)
    for name in ("lcb_release.jsonl", "plain.jsonl"):
        assert (tmp_path / name).read_text() == (FIX / name).read_text(), name
    assert (pq.read_table(tmp_path / "skywork_rl.parquet").to_pylist()
            == pq.read_table(FIX / "skywork_rl.parquet").to_pylist())


def test_prompts_go_through_the_chat_template() -> None:
    from trainer.hf_utils import chat_prompt_ids
    from trainer.tiny import build_tokenizer

    tok = build_tokenizer()
    p = load_dataset([FIX / "skywork_rl.parquet"]).problems[0]
    text = tok.decode(chat_prompt_ids(tok, p.messages))
    assert text == ("<|im_start|>user\nWhat is $1+2$?" + DEFAULT_SUFFIX
                    + "<|im_end|>\n<|im_start|>assistant\n")
    custom = load_dataset([FIX / "skywork_rl.parquet"], instruction_suffix=" Box it.").problems[0]
    assert custom.messages[-1]["content"] == "What is $1+2$? Box it."
    bare = load_dataset([FIX / "skywork_rl.parquet"], instruction_suffix="").problems[0]
    assert bare.messages[-1]["content"] == "What is $1+2$?"


# -- LiveCodeBench -----------------------------------------------------------------------------

def test_lcb_prompt_follows_livecodebench() -> None:
    with_starter = lcb_prompt("Add.", "class Solution:\n    def f(self):\n        ")
    assert with_starter == (
        "### Question:\nAdd.\n\n### Format: You will use the following starter code to write the "
        "solution to the problem and enclose your code within delimiters.\n```python\n"
        "class Solution:\n    def f(self):\n        \n```\n\n"
        "### Answer: (use the provided format with backticks)\n\n")
    stdin = lcb_prompt("Add.")
    assert stdin == (
        "### Question:\nAdd.\n\n### Format: Read the inputs from stdin solve the problem and write "
        "the answer to stdout (do not directly test on the sample inputs). Enclose your code "
        "within delimiters as follows. Ensure that when the python program runs, it reads the "
        "inputs, runs the algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n"
        "```\n\n### Answer: (use the provided format with backticks)\n\n")


def test_lcb_deepseek_r1_prompt_and_style() -> None:
    from trainer.hf_utils import problem_prompt_ids
    from trainer.tiny import build_tokenizer

    head = ("<｜begin▁of▁sentence｜>A conversation between User and Assistant. The user asks a "
            "question, and the Assistant solves it. The assistant first thinks about the "
            "reasoning process in the mind and then provides the user with the answer. The "
            "reasoning process and answer are enclosed within <think> </think> and <answer> "
            "</answer> tags, respectively, i.e., <think> reasoning process here </think> "
            "<answer> answer here </answer>.<｜User｜>You will be given a question (problem "
            "specification) and will generate a correct Python program that matches the "
            "specification and passes all tests.\n\nQuestion: Add.\n\n")
    assert lcb_r1_prompt("Add.", "class Solution:\n    def f(self):\n        ") == (
        head + "You will use the following starter code to write the solution to the problem "
        "and enclose your code within delimiters.\n```python\nclass Solution:\n    def "
        "f(self):\n        \n```\n\n<｜Assistant｜>")
    assert lcb_r1_prompt("Add.") == (
        head + "Read the inputs from stdin solve the problem and write the answer to stdout (do "
        "not directly test on the sample inputs). Enclose your code within delimiters as "
        "follows. Ensure that when the python program runs, it reads the inputs, runs the "
        "algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```\n\n"
        "<｜Assistant｜>")
    # LiveCodeBench's choice per model (lcb_runner/lm_styles.py)
    assert default_lcb_style("/ckpt/DeepSeek-R1-Distill-Qwen-7B") == "deepseek-r1"
    assert default_lcb_style("Skywork-OR1-7B") == "generic"
    r1 = load_dataset([FIX / "lcb_release.jsonl"], lcb_style="deepseek-r1").problems
    generic = load_dataset([FIX / "lcb_release.jsonl"]).problems
    assert [p.raw_prompt for p in generic] == [None, None]
    assert r1[1].raw_prompt == lcb_r1_prompt(
        r1[1].messages[0]["content"].split("### Question:\n")[1].split("\n\n### Format")[0],
        "class Solution:\n    def addTwo(self, a: int, b: int) -> int:\n        ")
    assert r1[0].ground_truth == generic[0].ground_truth
    # the raw prompt is tokenized as it is: no chat template, no added special tokens
    tok = build_tokenizer()
    assert problem_prompt_ids(tok, r1[0]) == tok(r1[0].raw_prompt, add_special_tokens=False)[
        "input_ids"]
    assert problem_prompt_ids(tok, generic[0]) != problem_prompt_ids(tok, r1[0])
    with pytest.raises(ValueError, match="unknown LiveCodeBench style"):
        load_dataset([FIX / "lcb_release.jsonl"], lcb_style="llama")


def test_lcb_date_window_is_inclusive_like_livecodebench() -> None:
    w = LCB_REPORT_WINDOW
    assert w == ("2024-08-01", "2025-02-01")
    assert in_window(datetime(2024, 8, 1), w) and in_window(datetime(2025, 2, 1), w)
    assert not in_window(datetime(2024, 7, 31, 23, 59), w)
    assert not in_window(datetime(2025, 2, 1, 0, 0, 1), w)
    assert in_window(datetime(2020, 1, 1), None)
    assert in_window(datetime(2020, 1, 1), (None, "2021-01-01"))
    everything = load_dataset([FIX / "lcb_release.jsonl"], date_window=None)
    assert [p.id for p in everything.problems] == ["abc999_a", "3999", "1999A"]
    late = load_dataset([FIX / "lcb_release.jsonl"], date_window=("2024-10-01", None))
    assert [p.id for p in late.problems] == ["3999"] and late.outside_window == 2
    with pytest.raises(DataError, match="outside the date window"):
        load_dataset([FIX / "lcb_release.jsonl"], date_window=("2030-01-01", None))


def test_compressed_tests_decode_without_unpickling(tmp_path) -> None:
    tests = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()
    assert decode_lcb_tests(packed) == tests
    assert decode_lcb_tests(json.dumps(tests)) == tests

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    for payload, why in ((Evil(), "not allowed"), (["a list"], "not allowed"),
                         ((json.dumps(tests), "x"), "not allowed")):
        blob = base64.b64encode(zlib.compress(pickle.dumps(payload))).decode()
        with pytest.raises(ValueError, match=why):
            decode_lcb_tests(blob)
    assert not marker.exists()  # nothing was executed
    with pytest.raises(ValueError, match="not zlib"):
        decode_lcb_tests(base64.b64encode(b"plain bytes").decode())
    # and inside a file the error names the row
    row = json.loads((FIX / "lcb_release.jsonl").read_text().splitlines()[0])
    row["private_test_cases"] = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    bad = tmp_path / "lcb.jsonl"
    bad.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=r"lcb.jsonl: line 1: bad 'private_test_cases'.*not allowed"):
        load_dataset([bad])
    assert not marker.exists()


# -- malformed rows --------------------------------------------------------------------------

def _write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_malformed_rows_name_the_file_and_row_or_are_counted(tmp_path) -> None:
    mf = _fixtures_module()
    rows = [dict(r) for r in mf.SKYWORK_ROWS]
    rows[1] = {**rows[1], "reward_model": {"ground_truth": "", "style": "rule"}}
    rows[3] = {**rows[3], "reward_model": {"ground_truth": "{not json", "style": "rule"}}
    rows[4] = {**rows[4], "reward_model": {"ground_truth": json.dumps({"inputs": ["1"],
               "outputs": []}), "style": "rule"}}
    path = _write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(DataError, match=r"bad.parquet: row 1: missing ground truth"):
        load_dataset([path])
    res = load_dataset([path], skip_invalid=True, keep_rows=True)
    assert res.skipped == 3 and [p.id for p in res.problems] == [
        "train-math-numinamath1.5_amc_aime-0", "train-math-still3-2"]
    errors = [r.error for r in res.rows if r.error]
    assert "row 3: code ground truth is not valid JSON" in errors[1]
    assert "row 4: bad code ground truth" in errors[2]

    cases = {
        '{"id": "a", "prompt": "p", "ground_truth": "[]"}': "empty JSON list",
        '{"id": "a", "prompt": "p", "domain": "bio", "ground_truth": "1"}': "unknown domain",
        '{"id": "a", "prompt": [{"role": "system", "content": "s"}], "ground_truth": "1"}':
            "no user message",
        '{"data_source": "x", "prompt": [{"role": "user", "content": "q"}], "ability": "chem", '
        '"reward_model": {"ground_truth": "1"}}': "unknown ability",
        '{"question_content": "q", "question_id": "1", "contest_date": "2024-09-01", '
        '"public_test_cases": "[]", "private_test_cases": ""}': "no test cases",
        '{"question_content": "q", "question_id": "1", "contest_date": "2024-09-01", '
        '"public_test_cases": "[{\\"input\\": \\"1\\", \\"output\\": \\"1\\", \\"testtype\\": '
        '\\"functional\\"}]", "metadata": "{}"}': "no metadata.func_name",
        '{"question_content": "q", "question_id": "1", "contest_date": "soon", '
        '"public_test_cases": "[]"}': "bad 'contest_date'",
    }
    for line, message in cases.items():
        f = tmp_path / "rows.jsonl"
        f.write_text('{"id": "ok", "prompt": "1+1?", "ground_truth": "2"}\n\n' + line + "\n")
        with pytest.raises(DataError, match=rf"rows.jsonl: line 3: .*{message}"):
            load_dataset([f])
        problems, skipped = load_problems([f], skip_invalid=True)
        assert [p.id for p in problems] == ["ok"] and skipped == 1


def test_duplicate_ids_across_files_are_an_error(tmp_path) -> None:
    with pytest.raises(DataError, match="duplicate id 'plain-m1'"):
        load_dataset([FIX / "plain.jsonl", FIX / "plain.jsonl"])
    with pytest.raises(DataError, match="does not exist"):
        load_dataset([tmp_path / "nope.parquet"])


# -- the released difficulty field -------------------------------------------------------------

def test_select_by_released_difficulty() -> None:
    problems = load_dataset([FIX / "skywork_rl.parquet", FIX / "plain.jsonl"]).problems
    kept, missing = select_by_difficulty(problems, R7, 1, 15)  # Skywork's released 7B filter
    assert [p.id for p in kept] == ["train-math-deepscaler-1", "train-code-taco-easy-3",
                                    "train-code-leetcode-Easy-4"]
    assert missing == 3  # the plain rows carry no model_difficulty
    assert model_difficulty(problems[0], "DeepSeek-R1-Distill-Qwen-32B") == 16
    assert model_difficulty({"extra_info": {"model_difficulty": json.dumps({R7: 4})}}, R7) == 4
    assert model_difficulty({"extra_info": None}, R7) is None
