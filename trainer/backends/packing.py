"""The update at real response lengths: token-budget micro-batches, padding-free packing and
token-balanced data-parallel ranks (docs/magic.md "How a step is split").

Pure rules, each a short function:

- :func:`token_budget_micro_batches`: a mini-batch's rows into micro-batches of at most
  ``budget`` tokens (prompt included) and ``max_rows`` rows, first-fit decreasing; a row longer
  than the budget is a micro-batch of its own (trained alone, never dropped or cut).
- :func:`pack_rows`: the rows of one micro-batch as ONE sequence without padding, with per-row
  position ids (each row restarts at 0) and the index of every row's target positions in it.
- :func:`balance_ranks`: rows over data-parallel ranks so that every rank holds about the same
  number of tokens (longest-processing-time first).
- :func:`rank_rows`, :func:`rebalance`: the exchange that deals a rollout batch's update rows
  out to the ranks that way (the loop's, with several ranks and a token budget).
- :func:`split_stats`: computed over useful tokens and rank imbalance of a split (the
  benchmark's and the metrics' arithmetic).

- :func:`use_packed_attention`: the model's attention, made to run a packed sequence row by
  row (variable-length attention: each row causal over itself only, ``sum(len_i^2)`` work, no
  ``[S, S]`` mask), and to run anything else exactly as before.

Why not transformers' own packing: given ``position_ids`` and no mask, its sdpa and eager
attention build a block-diagonal ``[S, S]`` mask and compute every score of it (the whole
packed length squared: 5x the attention work of five rows packed, and 1.2 GB of mask at 35K
tokens); only flash attention, a CUDA extension not installed here, runs it row by row.

Shapes: ``b`` rows of a micro-batch, ``L`` the padded length, ``S`` the packed length
(the sum of the rows' real lengths), ``n`` wanted target positions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..interfaces import TokenBatch


def token_budget_micro_batches(lengths: Sequence[int], budget: int,
                               max_rows: int) -> list[list[int]]:
    """Micro-batches (lists of positions into ``lengths``) holding at most ``budget`` tokens and
    at most ``max_rows`` rows each, by first-fit decreasing: rows from longest to shortest,
    each into the first micro-batch it fits, else a new one.

    Rule (docs/magic.md "How a step is split"): the unit of work is a token, prompt included;
    a row longer than ``budget`` is a micro-batch of its own (counted by
    :func:`oversized_rows`). The mini-batch gradient does not depend on the split (every
    micro-batch divides by the mini-batch's global token count), so this only changes the
    cost. Deterministic: ties by position; each micro-batch lists its positions in order.
    """
    if budget < 1 or max_rows < 1:
        raise ValueError(f"budget and max_rows must be >= 1, got {budget} and {max_rows}")
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        n = int(lengths[i])
        for k, load in enumerate(loads):
            if load + n <= budget and len(bins[k]) < max_rows:
                bins[k].append(i)
                loads[k] += n
                break
        else:
            bins.append([i])
            loads.append(n)
    return [sorted(b) for b in bins]


def oversized_rows(lengths: Sequence[int], budget: int | None) -> int:
    """Rows longer than ``budget`` tokens (each trained alone in a micro-batch of its own)."""
    return 0 if budget is None else sum(int(n) > budget for n in lengths)


def balance_ranks(lengths: Sequence[int], world: int) -> list[list[int]]:
    """Positions into ``lengths`` for each of ``world`` ranks, tokens balanced: rows from
    longest to shortest, each to the rank with the fewest tokens so far (ties: the fewest rows,
    then the lowest rank). Equal work per rank (docs/magic.md): every rank waits at each
    collective for the one with the most tokens. Each rank's list is in position order."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    ranks: list[list[int]] = [[] for _ in range(world)]
    loads = [0] * world
    for i in sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i)):
        r = min(range(world), key=lambda k: (loads[k], len(ranks[k]), k))
        ranks[r].append(i)
        loads[r] += int(lengths[i])
    return [sorted(r) for r in ranks]


@dataclass(frozen=True)
class PackedRows:
    """Rows of a micro-batch as one padding-free sequence (:func:`pack_rows`)."""

    input_ids: torch.Tensor  # [1, S] the rows' real tokens, one after the other
    position_ids: torch.Tensor  # [1, S] 0 .. len_i - 1 within each row
    index: torch.Tensor  # [n] packed position of each wanted target's features
    targets: torch.Tensor  # [n] the token each of them predicts
    wanted: torch.Tensor  # [b, L-1] bool, the wanted targets (row-major order of ``index``)
    cu_seq_lens: torch.Tensor  # [b + 1] int32, where each row starts (and the end)

    def model_kwargs(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The keywords of the packed forward: per-row ``position_ids`` (rotary positions) and
        ``cu_seq_lens_q`` (transformers' name for the row boundaries of variable-length
        attention), which marks the forward as packed for :func:`use_packed_attention`."""
        return {"position_ids": self.position_ids.to(device),
                "cu_seq_lens_q": self.cu_seq_lens.to(device)}


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor,
              positions: torch.Tensor | None = None) -> PackedRows:
    """Concatenate right-padded rows into one sequence (no padding computed).

    Target ``t`` of row ``i`` (``input_ids[i, t + 1]``) is predicted by the features at packed
    position ``start_i + t``; the wanted targets are the real ones (and, when given, those in
    ``positions`` [b, L-1], the response mask), listed row-major, so results scatter back into
    ``[b, L-1]`` with ``masked_scatter`` as the padded path's do.
    Args: ``input_ids`` [b, L] long, ``attention_mask`` [b, L] (1 on a prefix of each row).
    """
    b, L = input_ids.shape
    real = attention_mask != 0  # [b, L]
    lengths = real.sum(dim=1)  # [b]
    cols = torch.arange(L, device=input_ids.device)  # [L]
    if not torch.equal(real, cols[None, :] < lengths[:, None]):
        raise ValueError("packing needs right-padded rows (attention_mask 1 on a prefix)")
    starts = torch.cumsum(lengths, 0) - lengths  # [b]
    ids = input_ids[real]  # [S] row-major: the rows one after the other
    pos = cols[None, :].expand(b, L)[real]  # [S]
    wanted = real[:, 1:]  # [b, L-1] the target is a real token
    if positions is not None:
        wanted = wanted & positions.to(wanted.device).bool()
    row, t = wanted.nonzero(as_tuple=True)  # [n] each
    index = starts[row] + t  # [n]
    cu = F.pad(torch.cumsum(lengths, 0), (1, 0)).to(torch.int32)  # [b + 1]
    return PackedRows(ids[None], pos[None], index, ids[index + 1], wanted, cu)


def split_stats(rank_micro_batches: Sequence[Sequence[Sequence[int]]], *,
                packed: bool) -> dict[str, float]:
    """Work of one mini-batch's split, from the lengths of its rows: ``rank_micro_batches[r]``
    lists rank r's micro-batches, each the lengths of its rows.

    - ``computed_over_useful``: tokens the forward/backward computes over the rows' real tokens.
      A packed micro-batch computes its rows' tokens; a padded one ``rows x its longest``. Every
      rank runs as many micro-batches as the busiest (the lockstep of ZeRO's collectives,
      trainer.backends.common): each missing one is a padding micro-batch of one row (the
      rank's shortest when packed, its first when padded, as the backends choose).
    - ``rank_imbalance``: the most computed tokens of a rank over the mean, minus 1.
    """
    steps = max((len(m) for m in rank_micro_batches), default=0)
    useful = sum(sum(sum(mb) for mb in m) for m in rank_micro_batches)
    per_rank = []
    for mbs in rank_micro_batches:
        work = sum(sum(mb) if packed else len(mb) * max(mb, default=0) for mb in mbs)
        rows = [n for mb in mbs for n in mb]
        pad = (min(rows) if packed else rows[0]) if rows else 0
        per_rank.append(work + (steps - len(mbs)) * pad)
    mean = sum(per_rank) / len(per_rank) if per_rank else 0.0
    return {"computed_over_useful": sum(per_rank) / useful if useful else 1.0,
            "rank_imbalance": max(per_rank) / mean - 1.0 if mean else 0.0}


def lognormal_lengths(n: int, median: float, sigma: float, cut: int, seed: int) -> list[int]:
    """``n`` response lengths of a long-tailed workload (what reasoning RL samples): lognormal
    around ``median`` tokens with log-spread ``sigma``, cut at ``cut`` (the stage's limit: the
    truncated responses sit exactly at it), at least 1. Seeded. For the benchmark
    (benchmarks/bench_update_lengths.py) and the GPU check's update_lengths phase."""
    g = torch.Generator().manual_seed(seed)
    x = torch.exp(math.log(median) + sigma * torch.randn(n, generator=g))  # [n]
    return [max(1, min(cut, round(float(v)))) for v in x]


@dataclass(frozen=True)
class RankRows:
    """One rank's update rows in a compact form for the exchange of :func:`rebalance`."""

    tokens: list[torch.Tensor]  # each [len_i] long, a row's real tokens (prompt + response)
    response: list[torch.Tensor]  # each [len_i - 1] bool, its response targets
    advantages: torch.Tensor  # [n] float
    minibatches: list[list[int]]  # each mini-batch's rows (positions into the lists above)


def rank_rows(batch: TokenBatch, advantages: torch.Tensor,
              minibatches: Sequence[torch.Tensor]) -> RankRows:
    """This rank's rows of an update (``batch`` [B, L], ``advantages`` [B], its mini-batches as
    row indices) without their padding."""
    lengths = batch.attention_mask.ne(0).sum(dim=1).tolist()  # [B]
    return RankRows([batch.input_ids[i, :n].clone() for i, n in enumerate(lengths)],
                    [batch.response_mask[i, :max(n - 1, 0)].clone()
                     for i, n in enumerate(lengths)],
                    advantages.detach().cpu().clone(), [m.tolist() for m in minibatches])


def rebalance(shares: Sequence[RankRows], rank: int,
              pad_id: int) -> tuple[TokenBatch, torch.Tensor, list[torch.Tensor]]:
    """The rows ``rank`` trains on when every rank's ``shares`` (gathered, in rank order) are
    dealt out again so that, in each mini-batch, every rank holds about the same number of
    tokens (:func:`balance_ranks`; docs/magic.md "How a step is split"). The mini-batches
    (which rows, which optimizer step) are unchanged: only which rank computes a row moves, and
    the update is split-invariant. Every rank computes the same assignment from the same
    data. Returns this rank's ``(batch, advantages [B], mini-batches as row indices)``; a rank
    left without rows gets one row that is in none of its mini-batches (the backend needs a
    batch; the row is never trained)."""
    world = len(shares)
    steps = len(shares[0].minibatches)
    if any(len(s.minibatches) != steps for s in shares):
        raise ValueError("every rank must hold the same number of mini-batches")
    mine: dict[tuple[int, int], int] = {}  # (source rank, source row) -> local row
    local_minibatches: list[list[int]] = []
    for k in range(steps):
        rows = [(r, i) for r, s in enumerate(shares) for i in s.minibatches[k]]
        lengths = [len(shares[r].tokens[i]) for r, i in rows]
        picked = [rows[p] for p in balance_ranks(lengths, world)[rank]]
        local_minibatches.append([mine.setdefault(key, len(mine)) for key in picked])
    if not mine:
        source = next((r, 0) for r, s in enumerate(shares) if s.tokens)
        mine[source] = 0
    keys = sorted(mine, key=mine.__getitem__)
    L = max(len(shares[r].tokens[i]) for r, i in keys)
    ids = torch.full((len(keys), L), pad_id, dtype=torch.long)  # [B, L]
    attn = torch.zeros((len(keys), L), dtype=torch.long)  # [B, L]
    resp = torch.zeros((len(keys), L - 1), dtype=torch.bool)  # [B, L-1]
    for j, (r, i) in enumerate(keys):
        tok, res = shares[r].tokens[i], shares[r].response[i]
        ids[j, :len(tok)] = tok
        attn[j, :len(tok)] = 1
        resp[j, :len(res)] = res
    adv = torch.stack([shares[r].advantages[i] for r, i in keys])  # [B]
    return (TokenBatch(ids, attn, resp), adv,
            [torch.tensor(m, dtype=torch.long) for m in local_minibatches])


# ---------------------------------------------------------------------------------------------
# Attention over a packed sequence
# ---------------------------------------------------------------------------------------------

PACKED_PREFIX = "packed+"
"""Name prefix of the attention implementations :func:`use_packed_attention` registers."""


def _packed_attention(original: Callable[..., Any]) -> Callable[..., Any]:
    """An HF attention function: a packed forward (``cu_seq_lens_q`` [b + 1], the rows'
    boundaries in one sequence of batch 1) runs each row's causal attention alone (sdpa, so no
    score crosses rows and none is computed for another row's tokens); any other forward runs
    ``original`` with its arguments, unchanged (no data-dependent check on that path)."""

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor, attention_mask: torch.Tensor | None,
                  **kwargs: Any) -> tuple[torch.Tensor, None]:
        cu = kwargs.get("cu_seq_lens_q")
        if cu is None:
            return original(module, query, key, value, attention_mask, **kwargs)
        rest = {k: v for k, v in kwargs.items() if k not in _PACKED_KWARGS}
        return _rows_attention(module, query, key, value, cu, rest), None

    return attention


@torch.compiler.disable
def _rows_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, cu_seq_lens: torch.Tensor,
                    kwargs: dict[str, Any]) -> torch.Tensor:
    """Each packed row's causal sdpa alone. query [1, h, S, d], key/value [1, kv, S, d],
    cu_seq_lens [b + 1] -> [1, S, h, d]. Not compiled (a compiled decoder layer breaks its graph
    here): the row boundaries are data, and traced they would recompile per length."""
    bounds = cu_seq_lens.tolist()  # [b + 1]
    rows = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b],
                                   None, is_causal=True, **kwargs)[0]  # [1, len, h, d]
            for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
    return torch.cat(rows, dim=1)


#: Keywords of a packed forward that the per-row attention has used up.
_PACKED_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
                  "position_ids")


def use_packed_attention(model: Any) -> None:
    """Make ``model`` (an HF causal LM) run packed sequences row by row
    (:func:`_packed_attention`), under the name ``packed+<its implementation>``; its masks and
    every unpacked forward stay those of its implementation, bit for bit. A packed forward
    passes :meth:`PackedRows.model_kwargs` and an all-ones ``[1, S]`` attention mask (so that
    transformers builds no ``[S, S]`` mask). Idempotent."""
    config = model.config
    current = config._attn_implementation
    if current.startswith(PACKED_PREFIX):
        return
    name = PACKED_PREFIX + current
    ALL_ATTENTION_FUNCTIONS.register(name, _packed_attention(ALL_ATTENTION_FUNCTIONS[current]))
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[current])
    for module in model.modules():
        sub = getattr(module, "config", None)
        if sub is not None and getattr(sub, "_attn_implementation", None) == current:
            sub._attn_implementation = name
