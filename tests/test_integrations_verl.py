"""verifier.integrations.verl called exactly as verl's reward managers call a custom reward
function, against a real verifier (verl itself is not installed: its pins conflict with ours).

The call shapes, from volcengine/verl at commit b178a3cd56f58b2d502255daba591e92833930a7:
- verl/trainer/ppo/reward.py, get_custom_reward_fn (lines 80-96) and _call_with_kwargs (42-48):
  the function named by custom_reward_function.name is loaded from .path (pkg:// imports a
  module) and called with custom_reward_function.reward_kwargs merged into the keywords, the
  config's values winning;
- verl/workers/reward_manager/naive.py, lines 77-83: the row's extra_info gets num_turns and
  rollout_reward_scores; lines 85-90: one keyword call per response (data_source,
  solution_str, ground_truth, extra_info); lines 92-96: a dict's "score" is the reward and
  every key goes into reward_extra_info;
- verl/experimental/reward_loop/reward_manager/naive.py, lines 58-84: the same keyword call from
  executor threads, plus reward_router_address / reward_model_tokenizer;
- verl/workers/reward_manager/prime.py, line 35: partial(fn, data_source, completion, reference,
  extra_info), positional, run in a ProcessPoolExecutor (line 51); lines 84-87: a number is
  float()ed;
- verl/workers/reward_manager/batch.py, lines 62-76: one keyword call per batch (data_sources,
  solution_strs, ground_truths, extra_infos, **reward_kwargs) with numpy arrays from the
  batch's non_tensor_batch, each extra_info given rollout_reward_scores (lines 64-68);
  lines 102-110: scores[i]["score"].

The batch and prime managers are verl's legacy path: at that commit the default is the reward
loop (verl/trainer/config/reward_model/dp_reward_loop.yaml, use_reward_loop: True), whose
registry has naive, dapo and remote only (verl/experimental/reward_loop/reward_manager/), so
they need reward_model.use_reward_loop=false and reward_manager.name=batch|prime
(verl/trainer/ppo/reward.py lines 120-125; reward_model.reward_manager is deprecated,
verl/workers/config/reward_model.py lines 62-69).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from functools import partial
from typing import Any, Callable

import numpy as np
import pytest

from tests.conftest import ROOT, free_port
from verifier.client import ClientConfig
from verifier.integrations import common
from verifier.integrations import verl as verl_reward
from verifier.integrations.verl import UnjudgedError
from verifier.items import VerifierError

TESTS = json.dumps({"inputs": ["2 3\n"], "outputs": ["5\n"]})  # Skywork stores tests as JSON text
PROGRAM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
KEYS = {"score", "acc", "status", "detail"}
REWARD_PATH = "pkg://verifier.integrations.verl"  # custom_reward_function.path


def call_with_kwargs(raw_fn: Callable[..., Any], extra_kwargs: dict[str, Any], *args: Any,
                     **kwargs: Any) -> Any:
    """What verl's wrapper does: the config's reward_kwargs merged over the call's keywords."""
    return raw_fn(*args, **{**kwargs, **extra_kwargs})


def custom_reward_fn(name: str, reward_kwargs: dict[str, Any]) -> Callable[..., Any]:
    """get_custom_reward_fn for path 'pkg://verifier.integrations.verl' (a picklable partial,
    as verl's is, so the prime manager can ship it to its process pool)."""
    # verl/utils/import_utils.py load_module (lines 106-108): pkg:// is a module name
    module = importlib.import_module(REWARD_PATH.removeprefix("pkg://"))
    return partial(call_with_kwargs, getattr(module, name), reward_kwargs)


def naive_manager(fn: Callable[..., Any], rows: list[dict[str, Any]]) -> tuple[list[float], dict]:
    """The naive manager's loop: a keyword call per row, extra info collected per key."""
    rewards, extra = [], defaultdict(list)
    for row in rows:
        extra_info = row.get("extra_info", {})
        extra_info["num_turns"] = row.get("__num_turns__", None)
        extra_info["rollout_reward_scores"] = row.get("reward_scores", {})
        score = fn(data_source=row["data_source"], solution_str=row["response"],
                   ground_truth=row["reward_model"]["ground_truth"], extra_info=extra_info)
        if isinstance(score, dict):
            rewards.append(score["score"])
            for key, value in score.items():
                extra[key].append(value)
        else:
            rewards.append(score)
    return rewards, extra


def rows() -> list[dict[str, Any]]:
    """verl/Skywork rows: JSON-list math answers, JSON-text code tests, extra_info."""
    return [
        {"data_source": "aime24", "response": "<think>...</think> \\boxed{033}",
         "reward_model": {"ground_truth": '["33"]'}, "extra_info": {"index": 0}},
        {"data_source": "aime24", "response": "\\boxed{34}",
         "reward_model": {"ground_truth": "33"}, "extra_info": {"index": 1}},
        {"data_source": "lcb", "response": PROGRAM,
         "reward_model": {"ground_truth": TESTS}, "extra_info": {"index": 2, "domain": "code"}},
    ]


def test_naive_manager_call(server) -> None:
    _, addr = server
    fn = custom_reward_fn("compute_score", {"addr": addr})
    rewards, extra = naive_manager(fn, rows())
    assert rewards == [1.0, 0.0, 1.0]
    # the first call made the process's client for this address; later calls reuse it
    key = (addr, dataclasses.astuple(ClientConfig()))
    client = common._clients[key]
    naive_manager(fn, rows())
    assert common._clients[key] is client
    assert set(extra) == KEYS and all(len(v) == 3 for v in extra.values())
    assert extra["acc"] == [True, False, True]
    assert extra["status"] == ["CORRECT", "INCORRECT", "CORRECT"]
    assert "does not match gold" in extra["detail"][1]


def test_reward_loop_calls_from_threads(server, caplog) -> None:
    _, addr = server
    fn = custom_reward_fn("compute_score", {"addr": addr})

    def one(i: int) -> dict:
        return fn(data_source="gsm8k", solution_str=f"\\boxed{{{i}}}", ground_truth=str(i % 7),
                  extra_info={"num_turns": None, "rollout_reward_scores": {}},
                  reward_router_address="10.0.0.1:8000", reward_model_tokenizer=None)

    with caplog.at_level(logging.WARNING, logger="verifier.integrations.verl"):
        with ThreadPoolExecutor(8) as ex:
            out = list(ex.map(one, range(40)))
    assert [o["score"] for o in out] == [1.0 if i < 7 else 0.0 for i in range(40)]
    assert not caplog.records  # verl's own keywords are not "unknown"


def test_prime_manager_positional_in_a_process_pool(server) -> None:
    """Forked pool workers build their own client (gRPC channels do not survive a fork)."""
    _, addr = server
    verl_reward.compute_score("warm", "\\boxed{1}", "1", None, addr=addr)  # a client to inherit
    fn = custom_reward_fn("compute_score", {"addr": addr, "return_dict": False})
    data = rows()
    with ProcessPoolExecutor(max_workers=2) as ex:
        futures = [ex.submit(partial(fn, r["data_source"], r["response"],
                                     r["reward_model"]["ground_truth"], r["extra_info"]))
                   for r in data]
        scores = [float(f.result(timeout=60)) for f in futures]
    assert scores == [1.0, 0.0, 1.0]


def test_batch_manager_call(server) -> None:
    _, addr = server
    data = rows() + [{"data_source": "lcb", "response": PROGRAM.replace("+", "-"),
                      "reward_model": {"ground_truth": TESTS}, "extra_info": {"index": 3}}]
    # the manager's own reward kwargs (reward_model.reward_kwargs) come on top of the config's
    fn = custom_reward_fn("compute_score_batch", {"addr": addr})
    extras = np.array([r["extra_info"] for r in data], dtype=object)
    for extra_info in extras:
        extra_info["rollout_reward_scores"] = {}
    scores = fn(data_sources=np.array([r["data_source"] for r in data], dtype=object),
                solution_strs=[r["response"] for r in data],
                ground_truths=[r["reward_model"].get("ground_truth", None) for r in data],
                extra_infos=extras, domain="auto")
    assert [s["score"] for s in scores] == [1.0, 0.0, 1.0, 0.0]
    assert [s["status"] for s in scores] == ["CORRECT", "INCORRECT", "CORRECT", "INCORRECT"]
    assert all(set(s) == KEYS for s in scores)
    # numpy ground truths (a parquet list column read through pandas) travel as lists
    floats = verl_reward.compute_score_batch(
        np.array(["a", "b"]), ["\\boxed{7}", "\\boxed{8}"], [np.array(["7", "07"]), np.int64(8)],
        None, addr=addr, return_dict=False)
    assert floats == [1.0, 1.0]


def test_address_from_verifier_addr(server, monkeypatch) -> None:
    _, addr = server
    monkeypatch.setenv("VERIFIER_ADDR", addr)
    fn = custom_reward_fn("compute_score", {})
    assert fn(data_source="x", solution_str="\\boxed{2}", ground_truth="2",
              extra_info=None)["score"] == 1.0
    batch = custom_reward_fn("compute_score_batch", {})
    assert [s["score"] for s in batch(data_sources=["x"], solution_strs=["\\boxed{2}"],
                                      ground_truths=["3"], extra_infos=[{}])] == [0.0]


def test_no_address_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("VERIFIER_ADDR", raising=False)
    with pytest.raises(VerifierError, match=r"reward_kwargs.addr or \$VERIFIER_ADDR"):
        verl_reward.compute_score("x", "\\boxed{1}", "1", {})


def test_unreachable_address_fails_the_first_call_naming_it() -> None:
    addr = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(VerifierError, match=rf"no verifier reachable at {addr}"):
        verl_reward.compute_score_batch(["x"], ["\\boxed{1}"], ["1"], [{}], addr=addr,
                                        connect_timeout_s=1.0)
    assert time.monotonic() - start < 10


def test_bad_ground_truth_names_the_sample_and_is_never_zero(server) -> None:
    _, addr = server
    fn = custom_reward_fn("compute_score", {"addr": addr})
    with pytest.raises(UnjudgedError, match=r"sample \(data_source 'aime24', ground_truth "
                                            r"'\[\]'\): INVALID_INPUT: math ground_truth is an "
                                            r"empty list"):
        fn(data_source="aime24", solution_str="\\boxed{1}", ground_truth="[]", extra_info={})
    batch = custom_reward_fn("compute_score_batch", {"addr": addr})
    with pytest.raises(UnjudgedError) as err:
        batch(data_sources=["a", "lcb", "c"], solution_strs=["\\boxed{1}", PROGRAM, "\\boxed{1}"],
              ground_truths=["1", '{"inputs": ["1"', "1"],
              extra_infos=[{}, {"domain": "code"}, {}])
    assert "could not judge 1 of 3" in str(err.value)
    [(label, result)] = err.value.unjudged  # the other two were scored; only this one failed
    assert label.startswith("sample 1 (data_source 'lcb'")
    assert result.status.value == "INVALID_INPUT" and "code ground_truth" in result.detail


def test_a_runaway_response_is_a_zero_never_an_error(server) -> None:
    # What a policy writes never raises: a response over the verifier's cap is
    # RESPONSE_TOO_LONG with score 0, in the single and the batched call, math and code.
    _, addr = server
    runaway = "x" * 2_000_110
    fn = custom_reward_fn("compute_score", {"addr": addr})
    out = fn(data_source="aime24", solution_str=runaway, ground_truth="1", extra_info={})
    assert out["score"] == 0.0 and out["status"] == "RESPONSE_TOO_LONG"
    batch = custom_reward_fn("compute_score_batch", {"addr": addr})
    scores = batch(data_sources=["a", "lcb", "c"], solution_strs=[runaway, runaway + PROGRAM,
                                                                  "\\boxed{1}"],
                   ground_truths=["1", TESTS, "1"], extra_infos=[{}, {"domain": "code"}, {}])
    assert [s["score"] for s in scores] == [0.0, 0.0, 1.0]
    assert [s["status"] for s in scores] == ["RESPONSE_TOO_LONG"] * 2 + ["CORRECT"]


def test_unknown_keyword_warns_once(server, caplog) -> None:
    _, addr = server
    with caplog.at_level(logging.WARNING, logger="verifier.integrations.verl"):
        for _ in range(3):
            verl_reward.compute_score("x", "\\boxed{1}", "1", {}, addr=addr, adress="typo")
    assert [r.getMessage() for r in caplog.records] == [
        "verifier reward: ignoring unknown keyword 'adress'"]


def test_integrations_import_without_the_training_stack() -> None:
    """verifier/ never imports trainer/ or torch, and TRL and verl are optional: both
    integrations load with those imports blocked."""
    code = ("import sys\n"
            "for name in ('torch', 'trl', 'transformers', 'verl', 'numpy', 'datasets', 'trainer'):\n"
            "    sys.modules[name] = None  # `import name` now raises ImportError\n"
            "import verifier.integrations.trl, verifier.integrations.verl\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
