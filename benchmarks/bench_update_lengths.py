"""The update at real response lengths: token-budget packing against today's row split
(issue 48; docs/magic.md "How a step is split").

Long-tailed response lengths, scaled to the tiny model by ``--scale`` (default 32: 16K tokens
become 512):

- ``report``: lognormal around a median of 5,000 tokens (sigma 0.8), cut at 16K (about 8% at
  the limit), a 300-token prompt: the distribution issue 48 simulates;
- ``truncated30``: the same spread with its median raised so that 30% are cut at the limit.

For each, at the shipped 7B settings (4,096 responses a step over 8 ranks, ``micro_batch_size``
2 for the row split; the 7B recipe's budget, max_prompt_length + 32K, for packing), scaled:

- ``computed_over_useful``: tokens the update computes over the rows' real tokens, packed
  (rows dealt out to the ranks by tokens, then first-fit decreasing), with every rank running
  as many micro-batches as the busiest (the lockstep's padding micro-batches counted); and
  ``row_split_computed_over_useful``, today's (equal rows per rank, pairs padded to the longer);
- ``rank_imbalance``: the busiest rank's computed tokens over the mean, minus 1 (packed; and
  ``row_split_rank_imbalance``);
- ``time_per_useful_token_ratio``: seconds per useful token of a real update on this CPU
  (TorchBackend, the tiny model, ``--rows`` rows of one rank), packed over row split, the
  median of ``--rounds`` interleaved rounds (each round times both, alternating which first).

Prints a table; ``--json FILE`` writes the numbers (top level: the ``report`` distribution).
Ratios only, no absolute time is asserted anywhere.

    .venv/bin/python benchmarks/bench_update_lengths.py --json /tmp/lengths.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `trainer` importable
    sys.path.insert(0, str(ROOT))

from trainer.backends import BackendConfig, OptimizerConfig  # noqa: E402
from trainer.backends.common import split_rows  # noqa: E402
from trainer.backends.packing import (  # noqa: E402
    balance_ranks,
    lognormal_lengths,
    split_stats,
    token_budget_micro_batches,
)
from trainer.backends.torch_backend import TorchBackend  # noqa: E402
from trainer.interfaces import Completion, LossSettings, TokenBatch, UpdatePlan  # noqa: E402
from trainer.tiny import save_tiny  # noqa: E402

#: The shipped 7B recipe (trainer/configs/skywork_or1_7b.yaml) and issue 48's workload.
RESPONSES, WORLD, GROUP = 4096, 8, 16
ROW_SPLIT_MICRO_BATCH = 2
MAX_PROMPT, LAST_STAGE, CUT, PROMPT = 2048, 32768, 16384, 300
MEDIAN, SIGMA = 5000.0, 0.8
#: The 30%-truncated variant: P(lognormal > CUT) = 0.3, i.e. median = CUT / e^(z_0.7 sigma).
Z_07 = 0.5244


def lengths(kind: str, n: int, scale: int, seed: int) -> list[tuple[int, int]]:
    """(prompt, response) token counts of ``n`` responses, scaled down by ``scale``; each group
    of GROUP responses shares its prompt's length (+-20% around PROMPT)."""
    median = MEDIAN if kind == "report" else CUT / math.exp(Z_07 * SIGMA)
    resp = lognormal_lengths(n, median / scale, SIGMA, round(CUT / scale), seed)
    g = torch.Generator().manual_seed(seed + 1)
    prompts = PROMPT * (0.8 + 0.4 * torch.rand(n // GROUP + 1, generator=g))  # [groups]
    return [(max(1, round(float(prompts[i // GROUP]) / scale)), resp[i]) for i in range(n)]


def rank_split(rows: list[tuple[int, int]], budget: int, cut: int) -> dict[str, float]:
    """computed/useful and rank imbalance at WORLD ranks, both splits (pure arithmetic), and
    the share of responses at the (scaled) limit ``cut``."""
    total = [p + r for p, r in rows]
    # Today: rank r owns prompts r, r + WORLD, ... (trainer.dist.Layout), rows in group order.
    groups = [list(range(g * GROUP, (g + 1) * GROUP)) for g in range(len(rows) // GROUP)]
    today = [[i for grp in groups[r::WORLD] for i in grp] for r in range(WORLD)]
    row_split = [[[total[i] for i in mb.tolist()]
                  for mb in split_rows(torch.tensor(mine), ROW_SPLIT_MICRO_BATCH)]
                 for mine in today]
    packed = []
    for mine in balance_ranks(total, WORLD):
        lens = [total[i] for i in mine]
        packed.append([[lens[j] for j in mb]
                       for mb in token_budget_micro_batches(lens, budget, 10**6)])
    a, b = split_stats(packed, packed=True), split_stats(row_split, packed=False)
    return {"computed_over_useful": a["computed_over_useful"],
            "row_split_computed_over_useful": b["computed_over_useful"],
            "rank_imbalance": a["rank_imbalance"], "row_split_rank_imbalance": b["rank_imbalance"],
            "cut_frac": sum(r >= cut for _, r in rows) / len(rows)}


def make_batch(rows: list[tuple[int, int]], vocab: int, seed: int) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    comps = [Completion(i, 0, torch.randint(4, vocab, (p,), generator=g).tolist(),
                        torch.randint(4, vocab, (r,), generator=g).tolist(), "", False)
             for i, (p, r) in enumerate(rows)]
    return TokenBatch.from_completions(comps, pad_id=0)


def timed_update(model: Path, batch: TokenBatch, adv: torch.Tensor,
                 budget: int | None) -> tuple[float, dict[str, float]]:
    """Seconds of one on-policy update (one mini-batch), and its metrics."""
    # One output-layer chunk per micro-batch: at full scale both splits exceed the 1,024-token
    # chunk and recompute their output layer in backward; scaled down, only the packed one's
    # larger micro-batches would, which is no difference of the splits.
    backend = TorchBackend(BackendConfig(compile="off", entropy_chunk_size=1 << 16), model,
                           OptimizerConfig(lr=1e-6))
    plan = UpdatePlan([torch.arange(len(batch))],
                      ROW_SPLIT_MICRO_BATCH if budget is None else 10**6, budget)
    t0 = time.perf_counter()
    metrics = backend.update(batch, None, adv, plan, LossSettings(entropy_coef=0.001))
    return time.perf_counter() - t0, metrics


def run(kind: str, args: argparse.Namespace, model: Path, vocab: int) -> dict[str, float]:
    budget = (MAX_PROMPT + LAST_STAGE) // args.scale  # the 7B recipe's, scaled
    rows = lengths(kind, RESPONSES, args.scale, seed=1)
    out = rank_split(rows, budget, round(CUT / args.scale))
    sample = lengths(kind, args.rows, args.scale, seed=2)
    batch = make_batch(sample, vocab, seed=3)
    adv = torch.randn(len(batch), generator=torch.Generator().manual_seed(4))
    ratios, packed_metrics = [], {}
    for k in range(args.rounds):
        order = (None, budget) if k % 2 == 0 else (budget, None)
        t = {}
        for b in order:
            t[b], m = timed_update(model, batch, adv, b)
            if b is not None:
                packed_metrics = m
        ratios.append(t[budget] / t[None])
    out["time_per_useful_token_ratio"] = statistics.median(ratios)
    out["time_ratios"] = ratios
    out["timed_rows"] = len(batch)
    out["timed_useful_tokens"] = int(batch.attention_mask.sum())
    out["timed_packed_computed_over_real"] = packed_metrics["update/computed_over_real_tokens"]
    out["budget_tokens"] = budget
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write the numbers here")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--rows", type=int, default=64, help="rows of the timed update")
    ap.add_argument("--scale", type=int, default=32, help="tokens of the report per tiny token")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--hidden", type=int, default=128, help="tiny model width")
    ap.add_argument("--layers", type=int, default=4, help="tiny model decoder layers")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    longest = (MAX_PROMPT + LAST_STAGE) // args.scale + 1
    with tempfile.TemporaryDirectory() as tmp:
        # Wider and deeper than the test model, so that the output layer's share of the work
        # (13% here) is nearer a 7B model's (7%) than the 2-layer, 64-wide model's (37%).
        model = save_tiny(Path(tmp) / "tiny", max_positions=max(512, longest),
                          hidden_size=args.hidden, layers=args.layers,
                          intermediate_size=4 * args.hidden)
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(str(model)).vocab_size
        results = {kind: run(kind, args, model, vocab) for kind in ("report", "truncated30")}
    print(f"{'distribution':<13} {'computed/useful':>16} {'row split':>10} {'imbalance':>10} "
          f"{'row split':>10} {'time ratio':>11} {'cut':>5}")
    for kind, r in results.items():
        print(f"{kind:<13} {r['computed_over_useful']:>16.3f} "
              f"{r['row_split_computed_over_useful']:>10.3f} {r['rank_imbalance']:>10.3%} "
              f"{r['row_split_rank_imbalance']:>10.3%} {r['time_per_useful_token_ratio']:>11.3f} "
              f"{r['cut_frac']:>5.0%}")
    if args.json:
        args.json.write_text(json.dumps({**results["report"], "distributions": results,
                                         "settings": vars(args) | {"json": str(args.json)}},
                                        indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
