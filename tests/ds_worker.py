"""Entry script for the two-rank DeepSpeed test (tests/test_deepspeed.py), and its data.

Run by ``deepspeed --num_gpus 2 tests/ds_worker.py --model DIR --out DIR --stages 0 2 3``
(the launcher adds ``--local_rank``). For each ZeRO stage every rank builds a
DeepSpeedBackend, takes ITS rows of the shared batch (split unevenly on purpose: the ranks hold
different numbers of rows and response tokens, and one rank runs fewer micro-batches), applies
one update with the same two-mini-batch plan, and saves a checkpoint (collective). Rank 0
writes the full weights (named_weights, gathered under ZeRO-3) and the metrics to
``OUT/stage{N}.pt``; the test compares them with TorchBackend on the whole batch in one process.

With ``--kl`` it runs the KL reference test instead: for each stage every rank builds a
backend that keeps a reference policy, applies two one-mini-batch updates with a KL loss on its
rows, and writes both updates' metrics and, under ZeRO-3, the shard shapes of the reference's
and the policy's parameters to ``OUT/kl{N}_rank{R}.pt``.

With ``--packed`` it runs the token-budget test instead (trainer/backends/packing.py): for each
stage, the uneven shares above packed into micro-batches of ``BUDGET`` tokens
(``OUT/packed{N}.pt``), then the rows dealt out again to balance tokens over the ranks
(``packing.rebalance``, old log-probs recomputed after it: ``OUT/balanced{N}.pt``).

Importable without side effects: the test imports the data from here.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from the launcher: make `trainer` importable
    sys.path.insert(0, str(ROOT))

from trainer import dist
from trainer.backends import BackendConfig, OptimizerConfig
from trainer.interfaces import Completion, LossSettings, TokenBatch, UpdatePlan

PAD_ID = 0
VOCAB = 100

#: Eps-dominated AdamW: the first step is ``lr * g / (|g| + eps) ~= g`` (plain SGD, step 1),
#: LINEAR in the gradient, so a wrong loss scale shows in the weights (Adam's usual
#: scale-invariant first step, ``lr * sign(g)``, would hide it). No clipping, no decay.
LINEAR = OptimizerConfig(lr=1e4, eps=1e4, weight_decay=0.0, grad_clip=0.0)
LOSS = LossSettings(clip_low=0.2, clip_high=0.28, entropy_coef=0.01)
MICRO_BATCH_SIZE = 2
#: The KL test: real Adam, a reference policy, a KL loss, one mini-batch per update.
KL_CONFIG = BackendConfig(keep_reference=True)
KL_OPTIMIZER = OptimizerConfig(lr=1e-3)
KL_LOSS = LossSettings(clip_low=0.2, clip_high=0.28, kl_coef=0.1)

#: Token budget of the packed test: 14 tokens hold one or two rows of make_batch's (5-13 tokens).
BUDGET = 14

# Global mini-batches (rows of the whole batch) and each rank's share of them.
MINIBATCHES = ([0, 1, 2, 3], [4, 5, 6, 7])
RANK_ROWS = {0: ([0, 1], [4, 5, 6]), 1: ([2, 3], [7])}


def make_batch() -> tuple[TokenBatch, torch.Tensor, torch.Tensor]:
    """8 sequences with prompts of 3-5 and responses of 1-9 tokens (different token counts per
    rank), old log-probs perturbed away from the policy so ratios move, and mixed-sign
    advantages. Returns ``(batch, old_offset [B, L-1], advantages [B])``; the caller's
    old_logprobs are ``backend.logprobs(batch) + old_offset``."""
    g = torch.Generator().manual_seed(1234)
    prompt_lens = [3, 5, 4, 3, 5, 4, 3, 4]
    resp_lens = [2, 9, 1, 6, 8, 3, 5, 7]
    comps = []
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens, strict=True)):
        prompt = torch.randint(4, VOCAB, (p,), generator=g).tolist()
        resp = torch.randint(4, VOCAB, (r,), generator=g).tolist()
        comps.append(Completion(i // 4, i % 4, prompt, resp, "", False))
    batch = TokenBatch.from_completions(comps, pad_id=PAD_ID)
    offset = 0.15 * torch.randn(batch.response_mask.shape, generator=g)  # [B, L-1]
    advantages = torch.tensor([1.0, -0.5, 0.8, -1.2, 0.3, -0.7, 1.1, -0.9])  # [B]
    return batch, offset, advantages


def rank_rows(rank: int) -> torch.Tensor:
    """The rows of the whole batch that ``rank`` holds. [n] long."""
    return torch.tensor([r for mb in RANK_ROWS[rank] for r in mb], dtype=torch.long)


def rank_plan(rank: int) -> UpdatePlan:
    """The two mini-batches as row indices into the rank's LOCAL batch."""
    local, start = [], 0
    for mb in RANK_ROWS[rank]:
        local.append(torch.arange(start, start + len(mb)))
        start += len(mb)
    return UpdatePlan(minibatches=local, micro_batch_size=MICRO_BATCH_SIZE)


def full_plan() -> UpdatePlan:
    """The same two mini-batches over the whole batch (the single-process reference)."""
    return UpdatePlan([torch.tensor(mb) for mb in MINIBATCHES], MICRO_BATCH_SIZE)


def _run_stage(model: Path, out: Path, stage: int) -> None:
    from trainer.backends.deepspeed_backend import DeepSpeedBackend

    cfg = BackendConfig(kind="deepspeed", zero_stage=stage)
    backend = DeepSpeedBackend(cfg, model, LINEAR)
    batch, offset, advantages = make_batch()
    rows = rank_rows(backend.rank)
    local = batch.select(rows)
    old = backend.logprobs(local, micro_batch_size=MICRO_BATCH_SIZE) + offset[rows]
    metrics = backend.update(local, old, advantages[rows], rank_plan(backend.rank), LOSS)
    weights = {n: t.cpu() for n, t in backend.named_weights()}  # every rank iterates (gather)
    backend.save(out / f"ckpt{stage}")  # collective
    if backend.rank == 0:
        torch.save({"weights": weights, "metrics": metrics, "world_size": backend.world_size},
                   out / f"stage{stage}.pt")
    torch.save(metrics, out / f"metrics{stage}_rank{backend.rank}.pt")
    backend.close()


def one_minibatch(n: int) -> UpdatePlan:
    """All ``n`` rows in one mini-batch: every token is scored before the optimizer step."""
    return UpdatePlan([torch.arange(n)], MICRO_BATCH_SIZE)


def _shards(module: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], int]]:
    """ZeRO-3 partition of each parameter: (this rank's shard shape, full element count)."""
    return {n: (tuple(p.ds_tensor.shape), int(p.ds_numel)) for n, p in module.named_parameters()}


def _run_kl(model: Path, out: Path, stage: int) -> None:
    from trainer.backends.deepspeed_backend import DeepSpeedBackend

    cfg = dataclasses.replace(KL_CONFIG, kind="deepspeed", zero_stage=stage)
    backend = DeepSpeedBackend(cfg, model, KL_OPTIMIZER)
    batch, _, advantages = make_batch()
    rows = rank_rows(backend.rank)
    local = batch.select(rows)
    plan = one_minibatch(len(rows))
    first = backend.update(local, backend.logprobs(local, MICRO_BATCH_SIZE), advantages[rows],
                           plan, KL_LOSS)
    second = backend.update(local, backend.logprobs(local, MICRO_BATCH_SIZE), advantages[rows],
                            plan, KL_LOSS)
    result = {"first": first, "second": second, "world_size": backend.world_size}
    if stage == 3:
        result["reference"] = _shards(backend.reference.module)
        result["policy"] = _shards(backend.module)
    torch.save(result, out / f"kl{stage}_rank{backend.rank}.pt")
    backend.close()


def _run_packed(model: Path, out: Path, stage: int) -> None:
    from trainer.backends.deepspeed_backend import DeepSpeedBackend
    from trainer.backends.packing import rank_rows as share_of, rebalance

    backend = DeepSpeedBackend(BackendConfig(kind="deepspeed", zero_stage=stage), model, LINEAR)
    batch, offset, advantages = make_batch()
    rows = rank_rows(backend.rank)
    local = batch.select(rows)
    plan = dataclasses.replace(rank_plan(backend.rank), max_tokens_per_micro_batch=BUDGET)
    old = backend.logprobs(local, MICRO_BATCH_SIZE, max_tokens_per_micro_batch=BUDGET)
    metrics = backend.update(local, old + offset[rows], advantages[rows], plan, LOSS)
    weights = {n: t.cpu() for n, t in backend.named_weights()}  # every rank iterates (gather)
    if backend.rank == 0:
        torch.save({"weights": weights, "metrics": metrics}, out / f"packed{stage}.pt")
    backend.close()

    backend = DeepSpeedBackend(BackendConfig(kind="deepspeed", zero_stage=stage), model, LINEAR)
    mine, adv, minibatches = rebalance(
        dist.gather(share_of(local, advantages[rows], rank_plan(backend.rank).minibatches)),
        backend.rank, PAD_ID)
    plan = UpdatePlan(minibatches, MICRO_BATCH_SIZE, BUDGET)
    old = backend.logprobs(mine, MICRO_BATCH_SIZE, max_tokens_per_micro_batch=BUDGET)
    metrics = backend.update(mine, old, adv, plan, LOSS)
    weights = {n: t.cpu() for n, t in backend.named_weights()}
    tokens = int(mine.attention_mask[torch.cat(minibatches)].sum())
    if backend.rank == 0:
        torch.save({"weights": weights, "metrics": metrics}, out / f"balanced{stage}.pt")
    torch.save(tokens, out / f"balanced{stage}_tokens{backend.rank}.pt")
    backend.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 2, 3])
    parser.add_argument("--kl", action="store_true", help="run the KL reference test")
    parser.add_argument("--packed", action="store_true", help="run the token-budget test")
    parser.add_argument("--local_rank", type=int, default=0)  # added by the deepspeed launcher
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for stage in args.stages:
        run = _run_kl if args.kl else _run_packed if args.packed else _run_stage
        run(args.model, args.out, stage)
    dist.shutdown()  # both ranks finished writing; the groups freed before finalization


if __name__ == "__main__":
    main()
