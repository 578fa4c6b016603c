"""The Hugging Face rollout engine (trainer/engines/hf_engine.py) and create_engine, on the
tiny Qwen2 checkpoint: indices, chunk streaming, seeding, truncation/EOS, weight loading and
the sampling knobs. Fast (a few seconds on CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.engines import EngineConfig, create_engine
from trainer.hf_utils import CheckpointError, chat_prompt_ids, load_tokenizer
from trainer.interfaces import Completion, SamplingParams
from trainer.tiny import save_tiny

QUESTIONS = ["What is 2+3?", "Say hi.", "Compute 7*8.", "Name a prime.", "Is 9 odd?"]


def eos_state_dict(state: dict[str, torch.Tensor], eos_id: int) -> dict[str, torch.Tensor]:
    """Weights under which a Qwen2 model puts almost all probability on EOS after any token.

    Zeroing every o_proj and down_proj leaves the residual stream equal to the current
    token's embedding; a final-norm weight that keeps only dimension 0 makes the logits
    ``E[v, 0] * E[tok, 0] / rms(E[tok])``. With ``E[:, 0] = 1`` and ``E[eos, 0] = 10`` EOS
    wins by ~70 nats for every input token, so even temperature-1 sampling stops at once."""
    sd = {k: v.detach().clone() for k, v in state.items()}
    for k, v in sd.items():
        if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
            v.zero_()
    sd["model.norm.weight"].zero_()
    sd["model.norm.weight"][0] = 1.0
    emb = sd["model.embed_tokens.weight"]
    emb[:, 0] = 1.0
    emb[eos_id, 0] = 10.0
    if "lm_head.weight" in sd:
        sd["lm_head.weight"] = emb.clone()
    return sd


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("engines") / "tiny", seed=0)


@pytest.fixture(scope="module")
def tok(ckpt: Path) -> Any:
    return load_tokenizer(ckpt)


@pytest.fixture(scope="module")
def prompts(tok: Any) -> list[list[int]]:
    return [chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture()
def engine(ckpt: Path, tok: Any) -> Any:
    eng = create_engine(EngineConfig(kind="hf", chunk_size=2, dtype="float32"), ckpt, tok)
    yield eng
    eng.close()


def _ids(comps: list[Completion]) -> list[list[int]]:
    return [c.token_ids for c in comps]


def test_create_engine_missing_path_fails_before_loading(tmp_path: Path, tok: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    def boom(*a: Any, **k: Any) -> None:
        raise AssertionError("loaded a model for a missing path")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    with pytest.raises(CheckpointError, match="does not exist"):
        create_engine(EngineConfig(), tmp_path / "nope", tok)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        create_engine(EngineConfig(kind="vllm"), tmp_path / "empty", tok)


def test_engine_config_validates() -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        EngineConfig(chunk_size=0)
    with pytest.raises(ValueError, match="kind"):
        EngineConfig(kind="tgi")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig(dtype="fp8")
    with pytest.raises(ValueError, match="tensor_parallel_size > 1 needs engine.kind=vllm"):
        EngineConfig(kind="hf", tensor_parallel_size=2)
    assert EngineConfig(kind="vllm", tensor_parallel_size=2).tensor_parallel_size == 2


def test_n_samples_per_prompt_with_indices(engine: Any, prompts: list[list[int]],
                                           tok: Any) -> None:
    comps = engine.generate(prompts, SamplingParams(n=3, max_tokens=12, seed=0))
    assert [(c.prompt_index, c.sample_index) for c in comps] == [
        (i, j) for i in range(len(prompts)) for j in range(3)]
    for c in comps:
        assert c.prompt_ids == prompts[c.prompt_index]
        assert 1 <= len(c.token_ids) <= 12
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    # samples in a group differ (temperature 1 over ~100 tokens)
    assert len({tuple(c.token_ids) for c in comps if c.prompt_index == 0}) > 1


def test_on_done_once_per_chunk_before_return(engine: Any, prompts: list[list[int]]) -> None:
    calls: list[list[tuple[int, int]]] = []
    returned = False

    def on_done(chunk: list[Completion]) -> None:
        assert not returned
        calls.append([(c.prompt_index, c.sample_index) for c in chunk])

    comps = engine.generate(prompts, SamplingParams(n=2, max_tokens=8, seed=1), on_done=on_done)
    returned = True
    # 5 prompts, chunk_size 2 -> chunks of 2, 2, 1 prompts, each with all its samples
    assert calls == [[(0, 0), (0, 1), (1, 0), (1, 1)], [(2, 0), (2, 1), (3, 0), (3, 1)],
                     [(4, 0), (4, 1)]]
    assert sum(len(c) for c in calls) == len(comps)


def test_seeded_sampling_is_reproducible(engine: Any, prompts: list[list[int]]) -> None:
    p = SamplingParams(n=4, max_tokens=16, seed=7)
    state = torch.get_rng_state()
    a = engine.generate(prompts, p)
    assert torch.equal(torch.get_rng_state(), state), "generate must not move the global RNG"
    b = engine.generate(prompts, p)
    c = engine.generate(prompts, SamplingParams(n=4, max_tokens=16, seed=8))
    assert _ids(a) == _ids(b)
    assert _ids(a) != _ids(c)


def test_left_padding_does_not_change_greedy_output(engine: Any, prompts: list[list[int]]) -> None:
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=10)
    batched = engine.generate(prompts, greedy)  # chunks mix prompt lengths
    alone = [engine.generate([p], greedy)[0] for p in prompts]
    assert _ids(batched) == _ids(alone)


def test_truncation_and_eos(engine: Any, prompts: list[list[int]], tok: Any) -> None:
    eos = tok.eos_token_id
    # The random model: greedy for 3 tokens never reaches EOS here -> truncated.
    short = engine.generate(prompts, SamplingParams(n=2, temperature=0.0, max_tokens=3))
    for c in short:
        assert eos not in c.token_ids
        assert len(c.token_ids) == 3 and c.truncated
    # An EOS-emitting model: stops at once, EOS kept, empty text, not truncated (also when
    # max_tokens is 1: the response reached max_tokens but ended with EOS).
    engine.load_weights(eos_state_dict(engine.model.state_dict(), eos).items())
    for max_tokens in (1, 5):
        for temp in (0.0, 1.0):
            out = engine.generate(prompts[:2], SamplingParams(n=3, temperature=temp,
                                                              max_tokens=max_tokens, seed=0))
            for c in out:
                assert c.token_ids == [eos] and not c.truncated and c.text == ""


def test_mixed_stops_and_truncations_are_flagged_right(ckpt: Path, tok: Any,
                                                       prompts: list[list[int]]) -> None:
    """Sampling at a high temperature: some responses stop on EOS midway, some run out.
    Rows that stopped early are padded inside the batch; the padding must be stripped."""
    eng = create_engine(EngineConfig(chunk_size=5, dtype="float32"), ckpt, tok)
    eos = tok.eos_token_id
    # Raise EOS's output logit (tied embeddings: move E[eos] towards the mean final hidden
    # state) so that stops are common but not certain: ~10 of 40 samples stop, at 1..18.
    emb = eng.model.model.embed_tokens.weight
    with torch.no_grad():
        h = eng.model.model(torch.tensor([prompts[0]])).last_hidden_state[0].mean(0)  # [H]
        emb[eos] += h / h.norm()
    comps = eng.generate(prompts, SamplingParams(n=8, temperature=1.0, max_tokens=20, seed=3))
    stopped = [c for c in comps if c.token_ids[-1] == eos]
    truncated = [c for c in comps if c.truncated]
    assert stopped and truncated and any(len(c.token_ids) < 20 for c in stopped)
    for c in comps:
        assert eos not in c.token_ids[:-1]
        assert c.truncated == (c.token_ids[-1] != eos)
        assert c.truncated == (len(c.token_ids) == 20 and c.token_ids[-1] != eos)
    eng.close()


def test_load_weights_changes_output_and_is_strict(engine: Any, prompts: list[list[int]]) -> None:
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=12)
    before = engine.generate(prompts, greedy)
    gen = torch.Generator().manual_seed(0)
    new = [(n, p + 0.5 * torch.randn(p.shape, generator=gen))
           for n, p in engine.model.named_parameters()]
    engine.load_weights(new)
    assert _ids(engine.generate(prompts, greedy)) != _ids(before)
    for n, t in new:
        assert torch.equal(dict(engine.model.named_parameters())[n], t)
    with pytest.raises(KeyError, match="model.bogus"):
        engine.load_weights([("model.bogus", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights([("model.norm.weight", torch.zeros(3))])


def test_top_k_and_top_p_are_honoured(engine: Any, prompts: list[list[int]]) -> None:
    greedy = engine.generate(prompts, SamplingParams(n=1, temperature=0.0, max_tokens=12))
    greedy_ids = [c.token_ids for c in greedy]
    top_k1 = engine.generate(prompts, SamplingParams(n=3, top_k=1, max_tokens=12, seed=4))
    top_p0 = engine.generate(prompts, SamplingParams(n=3, top_p=1e-6, max_tokens=12, seed=4))
    for c in top_k1 + top_p0:
        assert c.token_ids == greedy_ids[c.prompt_index]
    # top_k=2 draws only among the two most likely tokens: the first token is one of them
    with torch.no_grad():
        logits = torch.stack([engine.model(torch.tensor([p])).logits[0, -1] for p in prompts])
    top2 = logits.topk(2, dim=-1).indices  # [P, 2]
    k2 = engine.generate(prompts, SamplingParams(n=8, top_k=2, max_tokens=1, seed=5))
    assert all(c.token_ids[0] in top2[c.prompt_index].tolist() for c in k2)
    firsts = [{c.token_ids[0] for c in k2 if c.prompt_index == i} for i in range(len(prompts))]
    assert any(len(f) == 2 for f in firsts)  # both candidates drawn: not just greedy


def test_invalid_params_rejected(engine: Any, prompts: list[list[int]]) -> None:
    with pytest.raises(ValueError, match="top_k"):
        engine.generate(prompts, SamplingParams(top_k=0))
    with pytest.raises(ValueError, match="max_tokens"):
        engine.generate(prompts, SamplingParams(max_tokens=0))
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], SamplingParams(n=1, max_tokens=2))


# -- one batch, finished chunks streamed out of it -----------------------------------------

def _eos_prone(eng: Any, prompts: list[list[int]], eos: int, strength: float) -> None:
    """Move E[eos] towards the mean final hidden state (tied embeddings): EOS becomes likely
    but not certain, so rows stop at different steps."""
    emb = eng.model.model.embed_tokens.weight
    with torch.no_grad():
        h = eng.model.model(torch.tensor([prompts[0]])).last_hidden_state[0].mean(0)  # [H]
        emb[eos] += strength * h / h.norm()


def _count_calls(obj: Any, name: str) -> list[int]:
    """Wrap ``obj.name`` so each call adds 1 to the returned one-element counter."""
    count, original = [0], getattr(obj, name)

    def counting(*a: Any, **k: Any) -> Any:
        count[0] += 1
        return original(*a, **k)

    setattr(obj, name, counting)
    return count


def test_one_batch_streams_each_finished_chunk_once_while_generating(
        ckpt: Path, tok: Any, prompts: list[list[int]]) -> None:
    """engine.one_batch: every prompt in ONE generate call; a chunk (here one prompt's 4
    samples) goes to on_done as soon as all its rows emitted EOS, while the batch goes on;
    chunks with a truncated row follow at the end. Each chunk exactly once, whole, and the
    same completions as returned (in prompt order)."""
    eng = create_engine(EngineConfig(chunk_size=1, dtype="float32", one_batch=True), ckpt, tok)
    eos = tok.eos_token_id
    _eos_prone(eng, prompts, eos, 3.0)
    steps = _count_calls(eng.model, "forward")
    generate_calls = _count_calls(eng.model, "generate")
    calls: list[tuple[int, list[Completion]]] = []
    params = SamplingParams(n=4, temperature=1.0, max_tokens=30, seed=5)
    comps = eng.generate(prompts, params, on_done=lambda c: calls.append((steps[0], c)))
    total = steps[0]
    eng.close()
    assert generate_calls[0] == 1  # one batch of 5 x 4 rows
    assert sorted(c[0].prompt_index for _, c in calls) == list(range(len(prompts)))
    for _, chunk in calls:  # whole chunks: one prompt, all its samples
        assert len({c.prompt_index for c in chunk}) == 1
        assert sorted(c.sample_index for c in chunk) == [0, 1, 2, 3]
    early = [(at, chunk) for at, chunk in calls if at < total]
    assert early, "no chunk was handed over before the batch ended"
    for _, chunk in early:  # handed over mid-batch: every row had stopped on EOS
        assert all(c.token_ids[-1] == eos and not c.truncated for c in chunk)
    assert [(c.prompt_index, c.sample_index) for c in comps] == [
        (i, j) for i in range(len(prompts)) for j in range(4)]
    streamed = {(c.prompt_index, c.sample_index): c for _, chunk in calls for c in chunk}
    assert all(streamed[(c.prompt_index, c.sample_index)] == c for c in comps)
    for c in comps:  # padding after EOS stripped, truncation flagged as before
        assert eos not in c.token_ids[:-1]
        assert c.truncated == (len(c.token_ids) == 30 and c.token_ids[-1] != eos)


def test_one_batch_greedy_equals_chunk_by_chunk(ckpt: Path, tok: Any,
                                                prompts: list[list[int]]) -> None:
    greedy = SamplingParams(n=2, temperature=0.0, max_tokens=10)
    chunked = create_engine(EngineConfig(chunk_size=2, dtype="float32"), ckpt, tok)
    one = create_engine(EngineConfig(chunk_size=2, dtype="float32", one_batch=True), ckpt, tok)
    calls: list[list[Completion]] = []
    assert one.generate(prompts, greedy, on_done=calls.append) == chunked.generate(prompts,
                                                                                  greedy)
    assert sorted(len(c) for c in calls) == [2, 4, 4]  # chunks of 2, 2, 1 prompts x 2
    seeded = SamplingParams(n=3, max_tokens=12, seed=4)
    assert _ids(one.generate(prompts, seeded)) == _ids(one.generate(prompts, seeded))
    chunked.close()
    one.close()
