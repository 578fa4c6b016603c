"""Checkers (issue 49, docs/contracts.md 1) through every entry point: gRPC ``Score``, ``verifier
check``, ``verifier eval`` (a problems file with a checker column, ``--explain exact``), the HTTP
gateway's ``/score`` and ``/get_reward``, the TRL and verl reward functions. A real server
(nsjail); the checker travels inside the ground truth, untouched by every client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from tests.conftest import server  # noqa: F401  (fixture)
from tests.test_checkers import PERM_CHECKER
from trainer.data import load_problems
from verifier.cli import main
from verifier.client import VerifierClient
from verifier.config import ScoringConfig, ServeConfig
from verifier.integrations import verl as verl_reward
from verifier.integrations.trl import VerifierReward
from verifier.items import Status
from verifier.data.problems import DataError, load_rows
from verifier.service.server import create_server

TESTS = {"inputs": ["3\n", "2\n"], "outputs": ["1 2 3\n", "1 2\n"]}
PERM_GT = dict(TESTS, checker={"language": "python", "source": PERM_CHECKER})
TOKENS_GT = {"inputs": ["x\n"], "outputs": ["YES\n"], "checker": "tokens_ci"}
REVERSED = "```python\nn = int(input())\nprint(*range(n, 0, -1))\n```"
ONES = "```python\nn = int(input())\nprint(*[1] * n)\n```"
YES = "```python\nprint('yes')\n```"


def items() -> list[dict]:
    return [
        {"id": "perm-right", "domain": "code", "response": REVERSED, "ground_truth": PERM_GT},
        {"id": "perm-wrong", "domain": "code", "response": ONES, "ground_truth": PERM_GT},
        {"id": "ci", "domain": "code", "response": YES,
         "ground_truth": json.dumps(TOKENS_GT)},
        {"id": "bad", "domain": "code", "response": YES,
         "ground_truth": dict(TOKENS_GT, checker="float:x")},
    ]


EXPECTED = {"perm-right": Status.CORRECT, "perm-wrong": Status.INCORRECT, "ci": Status.CORRECT,
            "bad": Status.INVALID_INPUT}


def test_grpc_score(server) -> None:  # noqa: F811
    with VerifierClient(server[1]) as client:
        results = client.score(items())
    assert {r.id: r.status for r in results} == EXPECTED


def test_verifier_check(server, tmp_path: Path) -> None:  # noqa: F811
    src, out = tmp_path / "items.jsonl", tmp_path / "results.jsonl"
    src.write_text("".join(json.dumps(it) + "\n" for it in items()))
    main(["check", "--input", str(src), "--output", str(out), "--addr", server[1],
          "--progress", "off"])
    got = {r["id"]: r["status"] for r in map(json.loads, out.read_text().splitlines())}
    assert got == {k: v.value for k, v in EXPECTED.items()}


def _problems(tmp_path: Path) -> Path:
    rows = [
        # a checker column beside the ground truth
        {"id": "perm", "domain": "code", "ground_truth": json.dumps(TESTS),
         "checker": json.dumps(PERM_GT["checker"]), "prompt": "Print a permutation."},
        # a checker inside the ground truth
        {"id": "ci", "domain": "code", "ground_truth": TOKENS_GT, "prompt": "Say yes."},
        {"id": "plain", "domain": "code", "ground_truth": TESTS, "prompt": "Print 1..n."},
    ]
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_problems_files_read_a_checker_column(tmp_path: Path) -> None:
    loaded = load_rows(_problems(tmp_path))
    gts = {p.id: p.ground_truth for p in loaded.problems}
    assert gts["perm"]["checker"] == PERM_GT["checker"]
    assert gts["ci"]["checker"] == "tokens_ci" and "checker" not in gts["plain"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "domain": "code", "ground_truth": TOKENS_GT,
                               "checker": "tokens"}) + "\n"
                   + json.dumps({"id": "y", "domain": "code", "ground_truth": TESTS,
                                 "checker": "fuzzy"}) + "\n")
    with pytest.raises(DataError, match="'checker' column and the ground truth's 'checker' "
                                        "differ"):
        load_rows(bad)
    loaded = load_rows(bad, skip_invalid=True, allow_empty=True)
    assert [s.reason for s in loaded.skipped_rows][1].endswith(
        "bad code ground truth: unknown checker 'fuzzy'; expected one of exact, tokens, "
        "tokens_ci, float:EPS or a program {'language': 'python', 'source': ...}")


def test_verifier_eval_with_checkers_and_explain_exact(server, tmp_path: Path,  # noqa: F811
                                                       capsys) -> None:
    gens = tmp_path / "gens.jsonl"
    gens.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "perm", "responses": [REVERSED, ONES, "```python\nprint('1 2 3')\n```"]},
        {"id": "ci", "responses": [YES, "```python\nprint('YES')\n```"]},
        {"id": "plain", "responses": [REVERSED]},
    ]))
    out = tmp_path / "summary.json"
    code = main(["eval", "--problems", str(_problems(tmp_path)), "--generations", str(gens),
                 "--output", str(out), "--addr", server[1], "--progress", "off",
                 "--explain", "exact"])
    assert code == 0
    s = json.loads(out.read_text())
    assert s["by_problem"] == {"perm": [True, False, False], "ci": [True, True],
                               "plain": [False]}
    ex = s["explain"]
    assert ex["against"] == "exact" and ex["n_problems"] == 2 and ex["n_responses"] == 5
    # REVERSED passes only with the checker; 'yes' only case-insensitively. The third 'perm'
    # response prints "1 2 3" on both tests: wrong for n = 2 either way.
    assert ex["n_changed"] == 2 and ex["checker_passes_exact_fails"] == 2
    assert ex["checker_fails_exact_passes"] == 0
    assert [c["index"] for c in ex["by_problem"]["perm"]["changed"]] == [0]
    assert "changed 2 of 5 verdicts against the exact rule" in capsys.readouterr().out


@pytest.fixture(scope="module")
def gateway():
    srv, _ = create_server("127.0.0.1:0", ServeConfig(scoring=ScoringConfig(workers=1),
                                                      http_port=0))
    yield f"http://127.0.0.1:{srv.http_port}"
    srv.stop(grace_s=1.0)


def test_http_score_and_get_reward(gateway) -> None:
    r = requests.post(f"{gateway}/score", json={"items": items()}, timeout=60)
    assert r.status_code == 200, r.text
    assert {x["id"]: x["status"] for x in r.json()["results"]} == \
        {k: v.value for k, v in EXPECTED.items()}
    r = requests.post(f"{gateway}/get_reward", timeout=60, json={
        "query": [REVERSED, ONES, YES], "prompts": ["", "", ""],
        "labels": [{"domain": "code", "ground_truth": PERM_GT}, json.dumps(PERM_GT),
                   json.dumps(TOKENS_GT)]})
    assert r.status_code == 200, r.text
    assert r.json()["rewards"] == [1.0, 0.0, 1.0]


def test_trl_reward_function(server) -> None:  # noqa: F811
    reward = VerifierReward(server[1], domain="auto")
    assert reward(prompts=["p"] * 3, completions=[REVERSED, ONES, YES],
                  ground_truth=[PERM_GT, json.dumps(PERM_GT), json.dumps(TOKENS_GT)]) \
        == [1.0, 0.0, 1.0]
    # a checker column beside the ground truth column
    assert reward(prompts=["p"] * 3, completions=[REVERSED, REVERSED, YES],
                  ground_truth=[TESTS, json.dumps(TESTS), {"inputs": ["x\n"],
                                                          "outputs": ["YES\n"]}],
                  checker=[PERM_GT["checker"], json.dumps(PERM_GT["checker"]), "tokens_ci"]) \
        == [1.0, 1.0, 1.0]
    results = reward.score([REVERSED, REVERSED], ground_truth=[TOKENS_GT, "7"],
                           checker=["tokens", "tokens"], domain=["code", "code"])
    assert [r.status for r in results] == [Status.INVALID_INPUT, Status.INVALID_INPUT]
    assert "differ" in results[0].detail and "needs a code ground truth object" in \
        results[1].detail


def test_verl_reward_functions(server) -> None:  # noqa: F811
    addr = server[1]
    assert verl_reward.compute_score("codecontests", REVERSED, json.dumps(PERM_GT), None,
                                     addr=addr, domain="code", return_dict=False) == 1.0
    assert verl_reward.compute_score_batch(
        ["codecontests"] * 2, [ONES, YES], [json.dumps(PERM_GT), json.dumps(TOKENS_GT)],
        [None, None], addr=addr, domain="code", return_dict=False) == [0.0, 1.0]


def test_trainer_path_keeps_the_checker(server, tmp_path: Path) -> None:  # noqa: F811
    """The trainer loads problems through verifier/data/problems.py and sends each response as
    ``Problem.verifier_item`` through the verifier client: the checker column arrives."""
    problems = {p.id: p for p in load_problems([_problems(tmp_path)])[0]}
    sent = [problems["perm"].verifier_item("a", REVERSED), problems["ci"].verifier_item("b", YES),
            problems["plain"].verifier_item("c", REVERSED)]
    assert sent[0]["ground_truth"]["checker"] == PERM_GT["checker"]
    with VerifierClient(server[1]) as client:
        assert [r.status for r in client.score(sent)] == [Status.CORRECT, Status.CORRECT,
                                                          Status.INCORRECT]
