"""VerifierReward as TRL's reward function: a real GRPOTrainer run (two steps, tiny CPU model)
against a real verifier, plus the call shapes TRL uses (plain and conversational completions,
extra columns, None for unjudged completions) and the failures a user meets first (no verifier
at the address, no ground-truth column, a ground truth that does not parse)."""

from __future__ import annotations

import json
import multiprocessing as mp
import pickle
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from tests.backend_fixtures import one_torch_thread  # noqa: F401  (autouse fixture)
from tests.conftest import free_port
from trainer.config import WarmStartSettings
from trainer.data import Problem
from trainer.hf_utils import chat_prompt_ids, load_tokenizer
from trainer.tiny import save_tiny
from trainer.warmstart import warm_start
from verifier.client import ClientConfig, VerifierClient
from verifier.integrations import common
from verifier.integrations.trl import UnjudgedError, VerifierReward, completion_text
from verifier.items import Status, VerifierError

PROMPTS = {"one": "Say one.", "uno": "Say uno.", "bad": "Say three."}
"""Both judged rows reward the answer 1 (rows rewarding 1 and 2 for prompts the tiny model
barely tells apart would cancel each other's update); the third row's ground truth does not
parse."""
ROWS = [("one", "1"), ("uno", "1"), ("bad", "[]")]


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    """The tiny Qwen2 model after a 60-step supervised warm start on ``\\boxed{1}`` and
    ``\\boxed{2}`` equally for every prompt: it answers in the format, 1 or 2 at about even
    odds, so the verifier's rewards vary within each group and GRPO has something to learn."""
    base = save_tiny(tmp_path_factory.mktemp("tiny"))
    tok = load_tokenizer(base)
    problems = [Problem(f"{k}{a}", chat(p), "math", a, "", {}, "")
                for k, p in PROMPTS.items() for a in ("1", "2")]
    settings = WarmStartSettings(lr=3e-3, steps=60, batch_size=8,
                                 response_template="\\boxed{{{answer}}}")
    return warm_start(base, tok, problems, settings, tmp_path_factory.mktemp("warm"), seed=0,
                      prompt_ids=lambda p: chat_prompt_ids(tok, p.messages))


class Recording(VerifierReward):
    """VerifierReward that keeps what TRL passed and what it returned, call by call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[dict] = []

    def __call__(self, prompts, completions, **columns):
        out = super().__call__(prompts, completions, **columns)
        self.calls.append({"completions": completions, "columns": columns, "rewards": out})
        return out


def grpo(policy_dir: Path, reward: VerifierReward, out: Path, rows=ROWS, plain: bool = False,
         steps: int = 2) -> GRPOTrainer:
    """``steps`` GRPO steps; each generates 4 completions for each of the 3 rows. Prompts are
    chat messages (conversational data), or with ``plain`` text (plain completions)."""
    dataset = Dataset.from_list([{"prompt": PROMPTS[k] if plain else chat(PROMPTS[k]),
                                  "ground_truth": gt} for k, gt in rows])
    args = GRPOConfig(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=12, num_generations=4,
        max_completion_length=8, learning_rate=3e-3, logging_steps=1, report_to="none",
        bf16=False, use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True)
    return GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(str(policy_dir)),
                       processing_class=load_tokenizer(policy_dir), reward_funcs=reward,
                       args=args, train_dataset=dataset)


def answer_logprob(model, tok, prompt: str, answer: str) -> float:
    """log p(``\\boxed{answer}`` + EOS | chat prompt) under ``model``."""
    ids = chat_prompt_ids(tok, chat(prompt))
    full = ids + tok(f"\\boxed{{{answer}}}", add_special_tokens=False)["input_ids"]
    full.append(tok.eos_token_id)
    with torch.no_grad():
        logp = model(torch.tensor([full])).logits.log_softmax(-1)[0]
    return sum(logp[i - 1, full[i]].item() for i in range(len(ids), len(full)))


def test_grpo_trains_two_steps_on_verifier_rewards(server, policy_dir, tmp_path) -> None:
    _, addr = server
    reward = Recording(addr, on_unjudged="none")
    trainer = grpo(policy_dir, reward, tmp_path)
    tok = load_tokenizer(policy_dir)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    lp_before = {k: answer_logprob(trainer.model, tok, PROMPTS[k], "1") for k in ("one", "uno")}

    trainer.train()

    assert trainer.reward_func_names == ["verifier"]  # TRL names it by __name__
    assert len(reward.calls) == 2  # one call per step, with the whole generation batch
    with VerifierClient(addr) as client:
        for call in reward.calls:
            completions, rewards = call["completions"], call["rewards"]
            gts = call["columns"]["ground_truth"]
            assert len(completions) == len(rewards) == 12
            # conversational data: each completion is a list with the assistant's message
            assert all(c[0]["role"] == "assistant" for c in completions)
            # exactly what the verifier says for these texts; None only for the bad row
            verdicts = client.score([{"id": str(i), "domain": "math", "ground_truth": gt,
                                      "response": c[0]["content"]}
                                     for i, (c, gt) in enumerate(zip(completions, gts))])
            for gt, r, v in zip(gts, rewards, verdicts):
                if gt == "[]":
                    assert r is None and v.status is Status.INVALID_INPUT
                else:
                    assert r == v.reward and v.status in (Status.CORRECT, Status.INCORRECT,
                                                          Status.NO_ANSWER)
    judged = [r for call in reward.calls for r in call["rewards"] if r is not None]
    assert 1.0 in judged and 0.0 in judged  # a real learning signal

    steps = [h for h in trainer.state.log_history if "rewards/verifier/mean" in h]
    assert len(steps) == 2
    for call, logged in zip(reward.calls, steps):  # the trainer logged these rewards
        scored = [r for r in call["rewards"] if r is not None]
        assert logged["rewards/verifier/mean"] == pytest.approx(sum(scored) / len(scored))
        assert logged["verifier/unjudged_frac"] == pytest.approx(1 / 3)
    assert max(h["grad_norm"] for h in steps) > 1e-3

    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed
    # both judged rows reward "1": the policy moved toward it
    for k in ("one", "uno"):
        assert answer_logprob(trainer.model, tok, PROMPTS[k], "1") > lp_before[k] + 0.05


def test_grpo_stops_on_an_unjudged_completion_by_default(server, policy_dir, tmp_path) -> None:
    _, addr = server
    trainer = grpo(policy_dir, VerifierReward(addr), tmp_path)
    with pytest.raises(UnjudgedError, match=r"could not judge 4 of 12 .*INVALID_INPUT: math "
                                            r"ground_truth is an empty list") as err:
        trainer.train()
    assert len(err.value.unjudged) == 4
    assert trainer.state.global_step == 0


def test_grpo_a_runaway_completion_is_a_zero_not_an_error(server, policy_dir, tmp_path) -> None:
    # A policy's output must never make the reward raise: a completion over the verifier's
    # 1,000,000-character cap is RESPONSE_TOO_LONG, a genuine 0 (it was INVALID_INPUT, and
    # VerifierReward raised UnjudgedError, failing the TRL step). TRL decodes each completion
    # with the policy's tokenizer; in this copy of the policy the tokenizer spells the token
    # "2" as two million characters, so every completion that answers 2 reaches the reward
    # function as a runaway generation, through TRL's own generate-decode-reward path.
    runaway = tmp_path / "runaway"
    shutil.copytree(policy_dir, runaway)
    spec = json.loads((runaway / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["x" * 2_000_000] = vocab.pop("2")
    (runaway / "tokenizer.json").write_text(json.dumps(spec))
    _, addr = server
    reward = Recording(addr)  # on_unjudged="raise", the default
    trainer = grpo(runaway, reward, tmp_path / "out", rows=[("one", "1"), ("uno", "1"),
                                                            ("one", "1")], steps=1)
    trainer.train()
    assert trainer.state.global_step == 1
    (call,) = reward.calls
    texts = [c[0]["content"] for c in call["completions"]]
    long = [r for t, r in zip(texts, call["rewards"]) if len(t) > 1_000_000]
    assert long and long == [0.0] * len(long)  # judged, and judged zero
    assert any(r == 1.0 for t, r in zip(texts, call["rewards"]) if len(t) < 1000)


def test_grpo_with_plain_text_prompts_scores_string_completions(server, policy_dir,
                                                                tmp_path) -> None:
    """Non-conversational data: TRL hands the reward plain strings (no chat template)."""
    _, addr = server
    reward = Recording(addr)
    trainer = grpo(policy_dir, reward, tmp_path, rows=[("one", "1"), ("uno", "1"), ("one", "2")],
                   plain=True, steps=1)
    trainer.train()
    [call] = reward.calls
    assert len(call["completions"]) == 12
    assert all(isinstance(c, str) for c in call["completions"])
    with VerifierClient(addr) as client:
        verdicts = client.score([{"id": str(i), "domain": "math", "ground_truth": gt,
                                  "response": c}
                                 for i, (c, gt) in enumerate(zip(call["completions"],
                                                                 call["columns"]["ground_truth"]))])
    assert call["rewards"] == [v.reward for v in verdicts]
    assert trainer.state.global_step == 1


def test_failover_past_a_dead_replica_in_the_address_list(server) -> None:
    """The reward scores through the client's fleet: a dead replica in the list is skipped and
    its items go to the live one (failover is the client's: tests/test_fleet.py)."""
    _, addr = server
    dead = f"127.0.0.1:{free_port()}"
    reward = VerifierReward(f"{dead},{addr}", config=ClientConfig(max_backoff_s=0.5))
    n = 40
    out = reward(prompts=["p"] * n, completions=[f"\\boxed{{{i}}}" for i in range(n)],
                 ground_truth=[str(i % 4) for i in range(n)])
    assert out == [1.0 if i < 4 else 0.0 for i in range(n)]
    stats = common.shared_client(f"{dead},{addr}", reward.config).replica_stats()
    assert stats[dead]["answered"] == 0 and stats[addr]["answered"] >= n


def test_plain_completions_and_the_domain_and_data_source_columns(server) -> None:
    _, addr = server
    tests = json.dumps({"inputs": ["2 3\n"], "outputs": ["5\n"]})
    program = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    reward = VerifierReward(addr)
    out = reward(prompts=["p"] * 4,
                 completions=["so \\boxed{\\frac12}", "\\boxed{3}", program, "no box"],
                 ground_truth=["0.5", '["4", "3"]', tests, "7"],
                 domain=["math", None, "code", "math"],
                 data_source=["aime", "aime", "lcb", "aime"],
                 completion_ids=[[1], [2], [3], [4]], trainer_state=None)
    assert out == [1.0, 1.0, 1.0, 0.0]
    results = reward.score(["\\boxed{3}"], ground_truth=['["3"]'], data_source=["aime"])
    assert results[0].status is Status.CORRECT and results[0].data_source == "aime"
    # "auto": an object of test cases is code, anything else math
    auto = VerifierReward(addr, domain="auto")
    assert auto(prompts=["p", "p"], completions=[program, "\\boxed{5}"],
                ground_truth=[tests, "5"]) == [1.0, 1.0]


def test_conversational_completions(server) -> None:
    _, addr = server
    reward = VerifierReward(addr)
    completions = [
        [{"role": "assistant", "content": "<think>2+2</think> \\boxed{4}"}],
        # after a tool call the answer is in a later assistant message
        [{"role": "assistant", "content": None, "tool_calls": [{"name": "calc"}]},
         {"role": "tool", "content": "\\boxed{5}"},
         {"role": "assistant", "content": "so \\boxed{4}"}],
        # content as parts
        [{"role": "assistant", "content": [{"type": "text", "text": "\\boxed{"},
                                           {"type": "text", "text": "5}"}]}],
        [{"role": "assistant", "content": "<think>never closed \\boxed{4}"}],
    ]
    out = reward(prompts=[chat("2+2?")] * 4, completions=completions, ground_truth=["4"] * 4)
    assert out == [1.0, 1.0, 0.0, 0.0]
    assert completion_text(completions[1]) == "\nso \\boxed{4}"  # the tool's text is not scored


def test_unjudged_completions_raise_naming_each_or_become_none(server) -> None:
    _, addr = server
    args = dict(prompts=["p"] * 4,
                completions=["\\boxed{1}", "\\boxed{1}", "\\boxed{1}", {"text": "\\boxed{1}"}],
                ground_truth=["1", "[]", None, "1"])
    with pytest.raises(UnjudgedError) as err:
        VerifierReward(addr)(**args)
    msg = str(err.value)
    assert "could not judge 3 of 4" in msg and "not a 0" in msg
    assert "completion 1: INVALID_INPUT: math ground_truth is an empty list" in msg
    assert "completion 2: INVALID_INPUT: 'ground_truth' is missing" in msg
    assert "completion 3: INVALID_INPUT: expected a string or a list of chat messages" in msg
    assert [label for label, _ in err.value.unjudged] == [f"completion {i}" for i in (1, 2, 3)]
    assert "on_unjudged='none'" in msg
    assert VerifierReward(addr, on_unjudged="none")(**args) == [1.0, None, None, None]


def test_unreachable_address_fails_the_first_call_naming_it() -> None:
    addr = f"127.0.0.1:{free_port()}"  # nothing listens there
    reward = VerifierReward(addr, connect_timeout_s=1.0)  # constructing connects to nothing
    start = time.monotonic()
    with pytest.raises(VerifierError, match=rf"no verifier reachable at {addr}"):
        reward(prompts=["p"], completions=["\\boxed{1}"], ground_truth=["1"])
    assert time.monotonic() - start < 10


def test_missing_ground_truth_column_is_named(server) -> None:
    _, addr = server
    with pytest.raises(ValueError, match=r"no 'ground_truth' column .*\['answer'\]"):
        VerifierReward(addr)(prompts=["p"], completions=["\\boxed{1}"], answer=["1"],
                             trainer_state=None, log_metric=print)


def test_bad_arguments_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="on_unjudged"):
        VerifierReward("127.0.0.1:1", on_unjudged="zero")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="domain"):
        VerifierReward("127.0.0.1:1", domain="physics")
    with pytest.raises(VerifierError, match="unknown limits"):
        VerifierReward("127.0.0.1:1", limits={"timeout": 3})


def test_it_pickles_and_keeps_its_name(server) -> None:
    _, addr = server
    reward = pickle.loads(pickle.dumps(VerifierReward(addr, name="math_verifier")))
    assert reward.__name__ == "math_verifier"
    assert reward(prompts=["p"], completions=["\\boxed{2}"], ground_truth=["2"]) == [1.0]


@pytest.fixture
def fresh_embedded():
    """Stop and forget this process's embedded verifier after the test."""
    yield
    local = common._local
    common._local = None
    if local is not None:
        local.stop()


def test_without_addr_one_embedded_verifier_per_process(fresh_embedded) -> None:
    first, second = VerifierReward(), VerifierReward(name="again")
    assert first(prompts=["p"], completions=["\\boxed{6}"], ground_truth=["6"]) == [1.0]
    local = common._local
    assert local is not None and local.proc.poll() is None
    assert second(prompts=["p"], completions=["\\boxed{6}"], ground_truth=["7"]) == [0.0]
    assert common._local is local  # the same server for both
    # a forked worker scores through its parent's verifier, with a client of its own
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("fork")) as ex:
        assert ex.submit(score_once, "\\boxed{6}", "6").result(timeout=60) == (
            [1.0], local.address)
    assert local.proc.poll() is None  # the child's exit did not stop it


def score_once(response: str, gold: str) -> tuple[list, str]:
    out = VerifierReward()(prompts=["p"], completions=[response], ground_truth=[gold])
    return out, common.embedded_address()
