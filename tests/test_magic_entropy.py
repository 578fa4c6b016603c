"""token_entropy: exact values, chunking, dtype handling, gradients."""

from __future__ import annotations

import math

import pytest
import torch

import trainer.magic.rules as magic
from trainer.magic.rules import masked_mean, token_entropy

F64 = torch.float64
LN2 = math.log(2.0)


def reference_entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.to(F64), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def test_hand_values():
    logits = torch.log(torch.tensor([
        [[0.25, 0.25, 0.25, 0.25],   # uniform over 4: ln 4
         [0.5, 0.25, 0.25, 1e-300],  # .5 ln 2 + 2 * .25 ln 4 = 1.5 ln 2 (last term ~0)
         [1.0, 0.0, 0.0, 0.0],       # one-hot (ln 0 = -inf logits): exactly 0, no NaN
         [0.5, 0.5, 0.0, 0.0]]],     # ln 2
        dtype=F64))
    out = token_entropy(logits)
    assert out.shape == (1, 4) and out.dtype == F64
    assert torch.allclose(out, torch.tensor([[2 * LN2, 1.5 * LN2, 0.0, LN2]], dtype=F64),
                          atol=1e-12)
    # shift invariance: adding a constant to all logits changes nothing
    assert torch.allclose(token_entropy(torch.log(torch.full((1, 4), 0.25)) + 1e3),
                          torch.full((1,), 2 * LN2, dtype=torch.float32), atol=1e-4)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 64])
def test_chunking_does_not_change_values(chunk_size):
    torch.manual_seed(0)
    logits = torch.randn(3, 11, 17, dtype=F64) * 3
    assert torch.allclose(token_entropy(logits, chunk_size=chunk_size),
                          reference_entropy(logits), atol=1e-12)


def test_only_one_chunk_is_upcast_at_a_time(monkeypatch):
    seen = []
    real = magic.entropy_rows

    def spy(chunk):
        seen.append((tuple(chunk.shape), chunk.dtype))
        return real(chunk)

    monkeypatch.setattr(magic, "entropy_rows", spy)
    logits = torch.randn(2, 10, 32).to(torch.bfloat16)  # [B, T, V]
    out = token_entropy(logits, chunk_size=4)
    # 20 positions -> chunks of 4, 4, 4, 4, 4; each arrives in bf16 (upcast inside)
    assert seen == [((4, 32), torch.bfloat16)] * 5
    assert out.dtype == torch.float32 and out.shape == (2, 10)
    # values: float32 math on the bf16 values
    assert torch.allclose(out.double(), reference_entropy(logits.float()), atol=1e-5)


@pytest.mark.parametrize("checkpoint", [True, False])
def test_gradient_matches_reference(checkpoint):
    torch.manual_seed(1)
    base = torch.randn(2, 5, 7, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    x1 = base.clone().requires_grad_(True)
    masked_mean(token_entropy(x1, chunk_size=3, checkpoint=checkpoint), mask).backward()
    x2 = base.clone().requires_grad_(True)
    masked_mean(reference_entropy(x2), mask).backward()
    assert torch.allclose(x1.grad, x2.grad, atol=1e-12)


def test_gradient_with_banned_tokens_is_finite():
    x = torch.tensor([[[0.0, 1.0, -math.inf]]], dtype=F64, requires_grad=True)
    token_entropy(x).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_empty_and_errors():
    assert token_entropy(torch.zeros(0, 3, 5)).shape == (0, 3)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        token_entropy(torch.zeros(1, 2, 3), chunk_size=0)
