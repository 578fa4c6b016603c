"""Split invariance (docs/magic.md): the gradient of a mini-batch must not depend on how it is
split into micro-batches or data-parallel ranks. A tiny linear "policy" in float64."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.magic.rules import (
    global_token_count,
    magic_loss,
    policy_loss,
    token_entropy,
    token_mean_denominator,
)

F64 = torch.float64
B, T, D_IN, V = 7, 5, 4, 6
LENGTHS = [5, 1, 0, 3, 5, 2, 4]  # includes an empty and a single-token response


def make_problem(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(D_IN, V, generator=g, dtype=F64)
    return {
        "x": torch.randn(B, T, D_IN, generator=g, dtype=F64),  # [B, T, d] features
        "w": w,  # [d, V] the policy's parameters
        "w_old": w + 0.5 * torch.randn(D_IN, V, generator=g, dtype=F64),  # rollout policy
        "w_ref": w + 0.2 * torch.randn(D_IN, V, generator=g, dtype=F64),  # reference policy
        "actions": torch.randint(V, (B, T), generator=g),  # [B, T] sampled tokens
        "adv": torch.randn(B, generator=g, dtype=F64),  # [B]
        "mask": torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None],  # [B, T]
    }


def logprobs(x: torch.Tensor, w: torch.Tensor, actions: torch.Tensor):
    logits = x @ w  # [b, T, V]
    lp = torch.log_softmax(logits, dim=-1).gather(-1, actions[..., None])[..., 0]  # [b, T]
    return lp, logits


def micro_loss(p, w: torch.Tensor, rows: list[int], num_tokens=None):
    """The full MAGIC actor loss (clipped policy + entropy bonus + KL) on some rows."""
    idx = torch.tensor(rows, dtype=torch.long)
    x, actions = p["x"][idx], p["actions"][idx]
    lp, logits = logprobs(x, w, actions)
    with torch.no_grad():
        old, _ = logprobs(x, p["w_old"], actions)
        ref, _ = logprobs(x, p["w_ref"], actions)
    return magic_loss(lp, old, p["adv"][idx], p["mask"][idx],
                      entropy=token_entropy(logits, chunk_size=3), entropy_coef=0.003,
                      ref_logprobs=ref, kl_coef=0.01, kl_estimator="k3",
                      clip_low=0.2, clip_high=0.28, num_tokens=num_tokens)


def grad_of(p, parts: list[list[int]], num_tokens, divisor: float = 1.0) -> torch.Tensor:
    """Sum of gradients of each part's loss (gradient accumulation); ``divisor`` mimics an
    engine that divides every micro-batch loss (DeepSpeed's 1/GAS)."""
    w = p["w"].clone().requires_grad_(True)
    total = torch.zeros_like(w)
    for rows in parts:
        loss, _ = micro_loss(p, w, rows, num_tokens)
        (g,) = torch.autograd.grad(loss / divisor, w)
        total += g
    return total


def full_grad(p) -> torch.Tensor:
    return grad_of(p, [list(range(B))], None)


def count(p, parts: list[list[int]]) -> int:
    return global_token_count([p["mask"][torch.tensor(r, dtype=torch.long)] for r in parts])


def test_the_problem_exercises_clipping():
    p = make_problem()
    _, m = micro_loss(p, p["w"], list(range(B)))
    assert m["losses/clipfrac_low"] > 0 and m["losses/clipfrac_high"] > 0
    assert m["losses/num_tokens"] == sum(LENGTHS) == 20


def test_micro_batches_sum_to_the_full_gradient():
    p = make_problem()
    parts = [[0, 1], [2], [3, 4, 5, 6]]
    d = token_mean_denominator(count(p, parts))
    assert d == 20.0
    assert torch.allclose(grad_of(p, parts, d), full_grad(p), rtol=0, atol=1e-6)
    assert torch.allclose(grad_of(p, parts, d), full_grad(p), rtol=0, atol=1e-12)


def test_per_micro_batch_token_means_would_be_wrong():
    p = make_problem()
    parts = [[0, 1], [2, 3, 4, 5, 6]]  # 6 and 14 tokens
    naive = sum(grad_of(p, [r], None) for r in parts) / len(parts)
    assert not torch.allclose(naive, full_grad(p), atol=1e-6)


def test_two_ranks_with_averaging_all_reduce():
    # DDP / FSDP / DeepSpeed average gradients over ranks: g = (g_0 + g_1) / 2. Each rank must
    # then divide its token sums by global_tokens / world_size, i.e. multiply by world_size.
    p = make_problem()
    ranks = [[[0, 1], [2]], [[3, 4], [5, 6]]]  # rank 0: 6 tokens, rank 1: 14 tokens
    g_tokens = count(p, [r for rank in ranks for r in rank])
    d = token_mean_denominator(g_tokens, world_size=2, grad_reduce="mean")
    assert d == 10.0
    averaged = sum(grad_of(p, parts, d) for parts in ranks) / 2
    assert torch.allclose(averaged, full_grad(p), rtol=0, atol=1e-6)
    # forgetting the factor (dividing by the global count 20) halves the gradient exactly
    wrong = sum(grad_of(p, parts, float(g_tokens)) for parts in ranks) / 2
    assert torch.allclose(wrong, full_grad(p) / 2, rtol=0, atol=1e-12)


def test_two_ranks_with_summing_all_reduce():
    p = make_problem()
    ranks = [[[0, 1, 2]], [[3], [4, 5, 6]]]
    d = token_mean_denominator(count(p, [r for rank in ranks for r in rank]), world_size=2,
                               grad_reduce="sum")
    assert d == 20.0
    summed = sum(grad_of(p, parts, d) for parts in ranks)
    assert torch.allclose(summed, full_grad(p), rtol=0, atol=1e-6)


def test_engine_that_divides_by_gradient_accumulation_steps():
    # DeepSpeed engine.backward(loss) divides by gradient_accumulation_steps (here 2)
    p = make_problem()
    ranks = [[[0, 1], [2]], [[3, 4], [5, 6]]]
    d = token_mean_denominator(count(p, [r for rank in ranks for r in rank]), world_size=2,
                               engine_loss_divisor=2)
    assert d == 5.0
    averaged = sum(grad_of(p, parts, d, divisor=2) for parts in ranks) / 2
    assert torch.allclose(averaged, full_grad(p), rtol=0, atol=1e-6)


def test_denominator_errors_and_empty_batch():
    assert token_mean_denominator(0, world_size=4) == 0.0
    with pytest.raises(ValueError, match="world_size and engine_loss_divisor must be >= 1"):
        token_mean_denominator(10, world_size=0)
    with pytest.raises(ValueError, match="grad_reduce must be 'mean' or 'sum'"):
        token_mean_denominator(10, grad_reduce="max")
    # a micro-batch with no response tokens adds exactly nothing
    p = make_problem()
    w = p["w"].clone().requires_grad_(True)
    loss, _ = micro_loss(p, w, [2], num_tokens=20.0)
    (g,) = torch.autograd.grad(loss, w)
    assert loss.item() == 0.0 and torch.equal(g, torch.zeros_like(g))


def test_global_token_count_local():
    masks = [torch.tensor([[1, 1, 0]]), torch.tensor([[True, False, False], [True] * 3])]
    assert global_token_count(masks) == 6
    assert global_token_count(torch.ones(2, 2)) == 4
    assert global_token_count([]) == 0


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=B, max_size=B), st.integers(1, 3),
       st.sampled_from(["mean", "sum"]))
def test_property_random_splits(labels, world_size, reduce):
    """Rows assigned to random (rank, micro-batch) cells: gradients always add up."""
    p = make_problem(seed=1)
    ranks: list[list[list[int]]] = [[] for _ in range(world_size)]
    for micro in range(6):
        for rank in range(world_size):
            rows = [i for i, lab in enumerate(labels) if lab == micro and i % world_size == rank]
            if rows:
                ranks[rank].append(rows)
    d = token_mean_denominator(count(p, [r for rank in ranks for r in rank]),
                               world_size=world_size, grad_reduce=reduce)
    per_rank = [grad_of(p, parts, d) for parts in ranks]
    reduced = sum(per_rank) / (world_size if reduce == "mean" else 1)
    assert torch.allclose(reduced, full_grad(p), rtol=0, atol=1e-6)


# --- a real two-process gloo group ----------------------------------------------------------

def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    p = make_problem()
    parts = [[[0, 1], [2]], [[3, 4], [5, 6]]][rank]
    # collective: every rank gets the global count (20) from its local masks (6 or 14)
    tokens = global_token_count([p["mask"][torch.tensor(r)] for r in parts])
    d = token_mean_denominator(tokens, world_size=dist.get_world_size())
    g = grad_of(p, parts, d)
    dist.all_reduce(g, op=dist.ReduceOp.SUM)  # what DDP does: sum ...
    g /= dist.get_world_size()                # ... then average
    torch.save({"tokens": tokens, "grad": g}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    # gloo sometimes aborts ("terminate called without an active exception") while tearing
    # down its threads at exit; the results are saved, so leave without C++ destructors.
    os._exit(0)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_real_gloo_process_group(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    expected = full_grad(make_problem())
    for rank in (0, 1):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert result["tokens"] == 20
        assert torch.allclose(result["grad"], expected, rtol=0, atol=1e-6)


def test_policy_loss_alone_is_split_invariant():
    # the same property for the bare policy loss, with per-token advantages
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(4, 6, generator=g, dtype=F64, requires_grad=True)
    old = lp.detach() + 0.3 * torch.randn(4, 6, generator=g, dtype=F64)
    adv = torch.randn(4, 6, generator=g, dtype=F64)
    mask = torch.rand(4, 6, generator=g) > 0.4
    (full,) = torch.autograd.grad(policy_loss(lp, old, adv, mask)[0], lp)
    n = global_token_count([mask[:1], mask[1:]])
    parts = [policy_loss(lp[s], old[s], adv[s], mask[s], num_tokens=n)[0]
             for s in (slice(0, 1), slice(1, 4))]
    (split,) = torch.autograd.grad(sum(parts), lp)
    assert torch.allclose(split, full, rtol=0, atol=1e-12)
    assert not dist.is_initialized()  # nothing distributed leaked into this process
