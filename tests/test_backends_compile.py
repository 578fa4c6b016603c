"""``BackendConfig.compile``: TorchBackend's compiled path (decoder layers and the output
layer's per-chunk log-prob/entropy reduction under torch.compile, found and measured by
`make gpu-check` on an H200: docs/gpu.md) computes what the eager path computes, and does not
recompile when lengths change (the H200's first `trainer run` with it recompiled the head
reduction for every chunk length: ~14 s a step instead of ~0.5 s).

Real torch.compile (inductor) on the CPU: each compiling test costs ~20-30 s of compilation on
2 cores, which is why the three compiled checks share one backend pair.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch._dynamo

from tests.ds_worker import LINEAR, make_batch
from trainer.backends import BackendConfig
from trainer.backends.forward import compile_decoder_layers, token_stats
from trainer.backends.torch_backend import TorchBackend
from trainer.interfaces import LossSettings, TokenBatch, UpdatePlan
from trainer.tiny import save_tiny

LOSS = LossSettings(clip_low=0.2, clip_high=0.28, entropy_coef=0.01)  # entropy with its grad


def _weights(backend: TorchBackend) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone().double() for n, p in backend.module.named_parameters()}


def _batch(rows: int, prompt: int, response: int, seed: int, padded: bool) -> TokenBatch:
    """``rows`` sequences of ``prompt + response`` tokens; ``padded``: every other row's
    response ends early (right padding, so the model gets an attention-mask tensor)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 40, (rows, prompt + response), generator=g)  # [B, L]
    attn = torch.ones_like(ids)  # [B, L]
    if padded:
        attn[1::2, prompt + response // 2:] = 0
    resp = torch.zeros(rows, prompt + response - 1, dtype=torch.bool)  # [B, L-1]
    resp[:, prompt - 1:] = True
    resp &= attn[:, 1:].bool()
    return TokenBatch(ids, attn, resp)


def _step(backend: TorchBackend, batch: TokenBatch, micro: int) -> None:
    rows = batch.input_ids.shape[0]
    backend.update(batch, None, torch.linspace(-1, 1, rows),
                   UpdatePlan([torch.arange(rows)], micro), LOSS)
    backend.logprobs(batch, micro, response_only=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same tiny model twice: compile off and compile on (CPU)."""
    model = save_tiny(tmp_path_factory.mktemp("compile") / "tiny")
    torch._dynamo.reset()
    off = TorchBackend(BackendConfig(compile="off"), model, LINEAR, device="cpu")
    on = TorchBackend(BackendConfig(compile="on"), model, LINEAR, device="cpu")
    yield off, on
    off.close()
    on.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compiled_update_equals_the_eager_one_and_never_recompiles_for_a_new_length(pair):
    off, on = pair
    assert (off.compiled, on.compiled) == (False, True)
    batch, _, adv = make_batch()
    plan = UpdatePlan([torch.arange(len(batch))], 3)  # micro-batches of 3, 3 and 2 rows
    w0_off, w0_on = _weights(off), _weights(on)
    m_off = off.update(batch, None, adv, plan, LOSS)
    m_on = on.update(batch, None, adv, plan, LOSS)
    w1_off, w1_on = _weights(off), _weights(on)
    # the update's change of every weight: the same float32 arithmetic, fused in another order
    for name in w0_off:
        d_off, d_on = w1_off[name] - w0_off[name], w1_on[name] - w0_on[name]
        scale = float(d_off.abs().max()) or 1.0
        assert float((d_on - d_off).abs().max()) / scale < 1e-4, name
    for key in ("entropy", "grad_norm", "losses/policy"):
        if key in m_off:
            assert m_on[key] == pytest.approx(m_off[key], rel=1e-4, abs=1e-6), key
    assert torch.allclose(on.logprobs(batch, 3), off.logprobs(batch, 3), atol=1e-5)

    # A fixed set of graphs exists per variant of the call, not per length: with and without
    # grad, a padded micro-batch (an attention-mask tensor) or an unpadded one (HF passes
    # None), one row or several (size-1 specialization). Make each variant once...
    for padded in (False, True):
        _step(on, _batch(4, 4, 6, 0, padded), micro=3)  # micro-batches of 3 rows and 1 row
    # ...then new lengths and row counts (a training run's every step) must reuse them: a
    # recompile raises here.
    with torch._dynamo.config.patch(error_on_recompile=True):
        for rows, prompt, response, seed in ((4, 5, 11, 1), (2, 3, 29, 2), (5, 7, 3, 3)):
            for padded in (False, True):
                _step(on, _batch(rows, prompt, response, seed, padded), micro=rows)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compiled_head_reduction_is_one_graph_for_every_chunk_length(pair):
    """The regression the H200 run found: each chunk's length (the number of response tokens
    of a micro-batch, the last chunk's remainder) used to be a new graph."""
    _, on = pair
    split = on._policy_forward()
    with torch.no_grad():
        for n in (7, 13):  # the first call may compile this no-grad, detached-entropy graph
            ids = torch.randint(4, 40, (2, n))
            token_stats(split, ids, torch.ones_like(ids), entropy="detached", chunk_size=5,
                        compiled=True)
        with torch._dynamo.config.patch(error_on_recompile=True):
            for n in (3, 17, 26, 40):  # chunk lengths 2, 4, 5 and remainders 1 and 3
                ids = torch.randint(4, 40, (2, n))
                lp, ent = token_stats(split, ids, torch.ones_like(ids), entropy="detached",
                                      chunk_size=5, compiled=True)
                ref_lp, ref_ent = token_stats(split, ids, torch.ones_like(ids),
                                              entropy="detached", chunk_size=5)
                assert torch.allclose(lp, ref_lp, atol=1e-5)
                assert torch.allclose(ent, ref_ent, atol=1e-5)


def test_compile_auto_is_off_on_the_cpu_and_on_is_refused_for_deepspeed(tmp_path):
    model = save_tiny(tmp_path / "tiny")
    backend = TorchBackend(BackendConfig(), model, LINEAR, device="cpu")  # compile='auto'
    assert backend.compiled is False
    assert not hasattr(backend.module.model.layers[0], "_compiled_call_impl") or \
        backend.module.model.layers[0]._compiled_call_impl is None
    backend.close()
    with pytest.raises(ValueError, match="compile='on' needs kind='torch'"):
        BackendConfig(kind="deepspeed", compile="on")
    with pytest.raises(ValueError, match="compile must be one of"):
        BackendConfig(compile="yes")  # type: ignore[arg-type]
    assert dataclasses.replace(BackendConfig(kind="deepspeed"), compile="off").compile == "off"


def test_a_model_without_decoder_layers_is_refused_by_name():
    class NoLayers(torch.nn.Module):
        def get_decoder(self):
            return torch.nn.Linear(2, 2)

    with pytest.raises(ValueError, match="NoLayers has no get_decoder\\(\\).layers"):
        compile_decoder_layers(NoLayers())
