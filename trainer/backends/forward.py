"""The forward kernels both backends share: one micro-batch through a causal LM -> target-token
log-probs ``[b, T]`` and, when asked, the full-distribution entropy ``[b, T]`` (``T = L - 1``).

- :func:`token_stats` (padded rows) and :func:`packed_token_stats` (rows packed into one
  sequence), memory-aware: the output layer runs only on the wanted (response) positions, a
  chunk at a time, when the backend splits its model (:class:`SplitForward`,
  :func:`split_causal_lm`);
- :func:`target_logprobs`, the chunked ``log softmax(logits)[target]``;
- :func:`compiled_head_stats` and :func:`compile_decoder_layers` (``BackendConfig.compile``).

The update loop that calls them is trainer/backends/common.py; loading is
trainer/backends/loading.py. Shapes: ``b`` rows of one micro-batch, ``L`` padded sequence
length, ``l`` its trimmed length, ``V`` vocabulary, ``D`` hidden size, ``n`` wanted positions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from trainer.magic import rules as magic
from .packing import pack_rows

EntropyGrad = Literal["none", "detached", "grad"]
"""How a forward pass computes the entropy: not at all, detached (a metric), or with its
gradient (the entropy bonus is in the loss). Not MAGIC's entropy_mode (the controller's)."""
ForwardFn = Callable[..., torch.Tensor]
"""``(input_ids, attention_mask, **model_kwargs) -> logits``."""


@dataclass(frozen=True)
class SplitForward:
    """A causal LM's forward split at its output layer, so that the vocabulary projection runs
    only where a statistic is wanted (docs/magic.md "Output layer on response tokens only").

    ``body(input_ids [b, l], attention_mask [b, l], keep, **model_kwargs)`` returns the
    features of the LAST ``keep`` positions, ``[b, keep, D]``, or, when ``keep`` is a 1-D
    index tensor ``[n]``, of those positions, ``[b, n, D]`` (a packed sequence, whose
    ``model_kwargs`` are :meth:`packing.PackedRows.model_kwargs`). ``head`` maps selected
    features ``[n, D]`` to logits ``[n, V]``. With ``head`` None the body's features ARE the
    logits (``D = V``): a backend that cannot split its model (ZeRO-3, whose hooks gather
    parameters per module call) still saves the logits of the positions no row needs (HF's
    ``logits_to_keep``).
    """

    body: Callable[..., torch.Tensor]
    head: Callable[[torch.Tensor], torch.Tensor] | None = None


Keep = int | torch.Tensor
"""Which positions a :class:`SplitForward` body returns: the last ``int`` ones, or an index
tensor ``[n]`` of them."""


def keep_positions(h: torch.Tensor, keep: Keep) -> torch.Tensor:
    """``h[:, positions]`` for a :data:`Keep`. [b, l, D] -> [b, keep or n, D]."""
    return h[:, keep] if isinstance(keep, torch.Tensor) else h[:, h.shape[1] - keep:]


def logits_forward(forward: ForwardFn) -> SplitForward:
    """A :class:`SplitForward` over a plain ``(input_ids, attention_mask) -> logits`` call
    (which takes the packed rows' model keywords, ``position_ids`` and ``cu_seq_lens_q``,
    when packed rows are asked for)."""
    return SplitForward(lambda ids, attn, keep, **model_kwargs: keep_positions(
        forward(ids, attn, **model_kwargs), keep))


def split_causal_lm(model: Any, autocast: Callable[[], Any] = contextlib.nullcontext,
                    ) -> SplitForward | None:
    """``model``'s decoder (``base_model``, final norm included) and its output layer as a
    :class:`SplitForward`, both run under ``autocast()``; None where the split would not
    reproduce ``model(...).logits`` (no separate base model or output layer, or a config that
    post-processes the logits: soft-capping, logit scaling)."""
    base, head = getattr(model, "base_model", None), model.get_output_embeddings()
    cfg = getattr(model, "config", None)
    # Why: these configs transform lm_head's output inside the model's forward; applying
    # the bare head would give different logits.
    if base is None or base is model or head is None or any(
            getattr(cfg, k, None) not in (None, 1.0) for k in ("final_logit_softcapping",
                                                               "logit_scale")):
        return None

    def body(ids: torch.Tensor, attn: torch.Tensor, keep: Keep,
             **model_kwargs: Any) -> torch.Tensor:
        with autocast():
            h = base(input_ids=ids, attention_mask=attn, use_cache=False,
                     **model_kwargs).last_hidden_state
        return keep_positions(h, keep)  # [b, keep, D]

    def project(h: torch.Tensor) -> torch.Tensor:
        with autocast():
            return head(h)  # [n, V]

    return SplitForward(body, project)


def _chunk_target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``x[target] - logsumexp(x)`` for one chunk, in float32 at least. [n, V], [n] -> [n]."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))  # [n, V]
    picked = x.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [n]
    return picked - torch.logsumexp(x, dim=-1)  # [n]


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                    chunk_size: int = 1024) -> torch.Tensor:
    """log softmax(logits)[target] at every position, without a [.., V] log-softmax copy.

    Rule: ``log pi(t) = x_t - logsumexp(x)`` (the log-prob the PPO ratio needs, docs/magic.md).
    Memory: positions are processed ``chunk_size`` at a time and only one chunk is upcast to
    float32; when the logits are lower precision and grad is needed, each chunk is
    checkpointed so that backward does not keep every chunk's float32 copy alive.

    Args:
        logits: ``[..., V]`` any float dtype (typically ``[b, l, V]``), contiguous preferred.
        targets: ``[...]`` long, the token whose log-prob is wanted at each position.
    Returns:
        ``[...]`` float32 (float64 for float64 logits).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)  # [n, V] (a view for contiguous logits)
    flat_t = targets.reshape(-1)  # [n]
    upcast = flat.dtype not in (torch.float32, torch.float64)
    checkpoint = upcast and torch.is_grad_enabled() and flat.requires_grad
    parts = []
    for start in range(0, flat.shape[0], chunk_size):
        chunk, t = flat[start:start + chunk_size], flat_t[start:start + chunk_size]
        if checkpoint:
            parts.append(torch.utils.checkpoint.checkpoint(_chunk_target_logprobs, chunk, t,
                                                           use_reentrant=False))
        else:
            parts.append(_chunk_target_logprobs(chunk, t))
    if not parts:
        return torch.zeros(lead, dtype=torch.promote_types(logits.dtype, torch.float32),
                           device=logits.device)
    return torch.cat(parts).reshape(lead)


def used_length(attention_mask: torch.Tensor) -> int:
    """Columns up to the last real token of any row (right padding beyond it is dropped)."""
    cols = attention_mask.ne(0).any(dim=0).nonzero()  # [k, 1]
    return int(cols.max()) + 1 if cols.numel() else 0


def _head_stats(features: torch.Tensor, targets: torch.Tensor,
                head: Callable[[torch.Tensor], torch.Tensor] | None,
                entropy: EntropyGrad, temperature: float = 1.0) -> tuple[torch.Tensor, ...]:
    """One chunk: output layer, target log-prob and (optionally) entropy, both of
    ``softmax(logits / temperature)`` (:func:`token_stats`).
    [n, D], [n] -> ([n] float32, [n] float32 when ``entropy`` is not "none")."""
    logits = head(features) if head is not None else features  # [n, V]
    logits = magic.sampling_logits(logits, temperature)  # [n, V]
    lp = _chunk_target_logprobs(logits, targets).float()  # [n]
    # entropy_rows on the whole chunk (the caller already chunks): no Python loop over the
    # chunk's length, which torch.compile would specialize on (a recompile per length)
    if entropy == "grad":
        return lp, magic.entropy_rows(logits).float()
    if entropy == "detached":
        with torch.no_grad():
            return lp, magic.entropy_rows(logits.detach()).float()
    return (lp,)


_COMPILED_HEAD_STATS: Callable[..., tuple[torch.Tensor, ...]] | None = None


def compiled_head_stats() -> Callable[..., tuple[torch.Tensor, ...]]:
    """:func:`_head_stats` under ``torch.compile(dynamic=True)``, built once per process: the
    float32 upcast, log-sum-exp, target gather and entropy of a ``[chunk, V]`` block fuse into
    a few passes over it instead of one per operation (the output layer's matrix product stays
    a library GEMM). Dynamic shapes: the last, shorter chunk does not recompile."""
    global _COMPILED_HEAD_STATS
    if _COMPILED_HEAD_STATS is None:
        _COMPILED_HEAD_STATS = torch.compile(_head_stats, dynamic=True)
    return _COMPILED_HEAD_STATS


def compile_decoder_layers(model: Any) -> int:
    """``torch.compile(dynamic=True)`` each decoder layer of an HF causal LM in place
    (``model.get_decoder().layers``), so the norms, rotary embedding, SiLU gate and residual
    adds between a layer's matrix products fuse; HF gradient checkpointing still wraps each
    compiled layer. Returns how many layers were compiled. A model without that layout is
    refused with its class named (``BackendConfig.compile='off'`` runs it uncompiled)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"compile: {type(model).__name__} has no get_decoder().layers to "
                         "compile; set backend.compile='off'")
    # Lazy: torch._dynamo is heavy and only a compiling backend needs it. (`from torch import`:
    # a plain `import torch._dynamo` here would make `torch` a local name of this function.)
    from torch import _dynamo

    # Why raise dynamo's graphs-per-function limit (8): a layer legitimately has up to 8 (grad
    # on or off x an attention-mask tensor or none x one row or several,
    # tests/test_backends_compile.py), and past the limit dynamo runs a new variant eager,
    # silently. Raised, never lowered.
    _dynamo.config.recompile_limit = max(_dynamo.config.recompile_limit, 16)
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


def token_stats(forward: ForwardFn | SplitForward, input_ids: torch.Tensor,
                attention_mask: torch.Tensor, *, positions: torch.Tensor | None = None,
                entropy: EntropyGrad = "none", chunk_size: int = 1024,
                temperature: float = 1.0,
                compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One micro-batch through the model: per-target log-probs and (optionally) entropy.

    ``targets = input_ids[:, 1:]`` (interfaces.py token conventions). The micro-batch is first
    trimmed to its longest real sequence (right padding is inert under a causal mask). Only the
    wanted targets are computed: every real one, or those in ``positions`` (the response mask:
    docs/magic.md, only response tokens enter the loss and the entropy). The model runs to the
    last ``keep`` positions (from the first wanted one); the wanted positions' features are
    gathered (``[n, D]``) and, ``chunk_size`` at a time, projected to the vocabulary and
    reduced to log-prob and entropy. So no ``[b, l, V]`` logits exist when the backend splits
    its model (:class:`SplitForward`), and prompt positions cost no output-layer work. When
    grad is needed and there is more than one chunk, each chunk is checkpointed (backward
    recomputes its logits), so at most one chunk's ``[chunk, V]`` float32 working set is alive.

    Args:
        forward: a :class:`SplitForward`, or ``(input_ids [b, l], attention_mask [b, l]) ->
            logits [b, l, V]``.
        positions: ``[b, L-1]`` bool, the targets wanted (None: every real target).
        entropy: ``"none"``; ``"detached"`` (metric only, no graph); ``"grad"`` (for -c*H).
        temperature: the rollout temperature tau: log-probs and entropy are those of
            ``softmax(logits / tau)``, the distribution the responses were sampled from
            (docs/magic.md "Temperature"; rule :func:`trainer.magic.rules.sampling_logits`).
        compiled: reduce each chunk with the torch.compile'd form of the same function
            (:func:`compiled_head_stats`; ``BackendConfig.compile``).
    Returns:
        ``(logprobs [b, L-1] float32, entropy [b, L-1] float32 or None)``; 0 wherever the
        target is padding or not wanted.
    """
    if entropy not in ("none", "detached", "grad"):
        raise ValueError(f"entropy must be 'none', 'detached' or 'grad', got {entropy!r}")
    split = forward if isinstance(forward, SplitForward) else logits_forward(forward)
    b, L = input_ids.shape
    length = max(used_length(attention_mask), min(2, L))
    ids, attn = input_ids[:, :length], attention_mask[:, :length]  # [b, l]
    want = attn[:, 1:] != 0  # [b, l-1] target is a real token
    if positions is not None:
        want = want & positions[:, :length - 1].to(want.device).bool()
    cols = want.any(dim=0).nonzero()  # [k, 1] positions some row wants
    first = int(cols.min()) if cols.numel() else length - 1
    keep = length - first  # the features of positions first .. l-1
    states = split.body(ids, attn, keep)  # [b, keep, D]
    sel = F.pad(want[:, first:], (0, 1))  # [b, keep]; the last position has no target
    feats = states[sel]  # [n, D], row-major like want's True entries
    targets = ids[:, 1:][want]  # [n]
    full = F.pad(want, (0, L - length))  # [b, L-1]
    return _stats_at(split, feats, targets, states[:1, -1], full, entropy=entropy,
                     chunk_size=chunk_size, temperature=temperature, compiled=compiled)


def packed_token_stats(forward: ForwardFn | SplitForward, input_ids: torch.Tensor,
                       attention_mask: torch.Tensor, *, positions: torch.Tensor | None = None,
                       entropy: EntropyGrad = "none", chunk_size: int = 1024,
                       temperature: float = 1.0,
                       compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`token_stats` without padding: the rows run as ONE sequence (packing.pack_rows:
    per-row position ids, attention that never crosses rows), so the model computes exactly
    the rows' real tokens, and the output layer only the wanted (response) positions. The
    model must run packed attention (:func:`packing.use_packed_attention`, which both backends
    install): any other attention would let a row see the rows packed before it.

    Same arguments and results as :func:`token_stats` (``[b, L-1]`` log-probs and entropy, 0
    where not wanted); equal to it within float rounding (tests/test_packing.py), and a row's
    results do not depend on the other rows' tokens.
    """
    if entropy not in ("none", "detached", "grad"):
        raise ValueError(f"entropy must be 'none', 'detached' or 'grad', got {entropy!r}")
    split = forward if isinstance(forward, SplitForward) else logits_forward(forward)
    packed = pack_rows(input_ids, attention_mask, positions)
    S = packed.input_ids.shape[1]
    ids = packed.input_ids.to(input_ids.device)  # [1, S]
    # A micro-batch with no wanted target still computes the last position (the graph).
    index = packed.index if packed.index.numel() else torch.tensor([S - 1])  # [n]
    # All ones: transformers then builds no [S, S] mask; the rows are kept apart by the
    # model's packed attention (packing.use_packed_attention), which reads cu_seq_lens_q.
    ones = torch.ones_like(ids)  # [1, S]
    feats = split.body(ids, ones, index.to(ids.device),
                       **packed.model_kwargs(ids.device))[0]  # [n, D]
    return _stats_at(split, feats[:packed.index.numel()], packed.targets.to(ids.device),
                     feats[-1:], packed.wanted, entropy=entropy, chunk_size=chunk_size,
                     temperature=temperature, compiled=compiled)


def _stats_at(split: SplitForward, feats: torch.Tensor, targets: torch.Tensor,
              tie: torch.Tensor, full: torch.Tensor, *, entropy: EntropyGrad,
              chunk_size: int, temperature: float,
              compiled: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output layer on the wanted positions' features ``feats`` [n, D] (targets [n]),
    ``chunk_size`` at a time (each checkpointed when grad is needed and there is more than one
    chunk), scattered into the wanted entries ``full`` [b, L-1] of zero tensors.
    ``tie`` [1, D]: features that keep a graph through every parameter when n = 0."""
    n = int(targets.numel())
    grad = torch.is_grad_enabled() and (feats.requires_grad or tie.requires_grad)
    checkpoint = grad and n > chunk_size
    stats = compiled_head_stats() if compiled else _head_stats
    parts: list[tuple[torch.Tensor, ...]] = []
    for start in range(0, n, chunk_size):
        args = (feats[start:start + chunk_size], targets[start:start + chunk_size],
                split.head, entropy, temperature)
        parts.append(torch.utils.checkpoint.checkpoint(stats, *args, use_reentrant=False)
                     if checkpoint else stats(*args))
    full = full.to(tie.device)
    zeros = torch.zeros(full.shape, dtype=torch.float32, device=tie.device)  # [b, L-1]
    if n == 0:
        # Why: a micro-batch with no wanted target (e.g. a token-free padding micro-batch)
        # must still have a graph through every parameter, head included: under ZeRO 2/3 each
        # rank's backward runs the same gradient reductions, whatever its data.
        out = split.head(tie) if split.head is not None else tie  # [1, V]
        zeros = zeros + 0.0 * out.float().sum()
        return zeros, (zeros if entropy != "none" else None)
    lp = zeros.masked_scatter(full, torch.cat([p[0] for p in parts]))  # [b, L-1]
    ent = None
    if entropy != "none":
        ent = zeros.masked_scatter(full, torch.cat([p[1] for p in parts]))  # [b, L-1]
    return lp, ent
