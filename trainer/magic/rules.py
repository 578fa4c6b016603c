"""MAGIC, the RL recipe of Skywork-OR1 (arXiv 2505.22312), as small pure functions.

Each function states the rule it implements (report section, docs/magic.md). Where a rule is
silent on an edge case, the docstring says what we chose. Shapes: ``B`` responses (rows),
``T`` response tokens (padded), ``V`` vocabulary, ``N = num_groups * group_size`` responses
stored group by group (rows ``g*n .. g*n+n-1`` are the group of prompt ``g``).

Contents:
- rewards -> advantages: :func:`group_advantages`, :func:`filter_groups`
- the sampling distribution: :func:`sampling_logits`
- losses: :func:`policy_loss`, :func:`entropy_loss`, :func:`kl_loss`, :func:`magic_loss`,
  with :func:`kl_penalty`, :func:`token_entropy`, :func:`sampled_entropy`, :func:`masked_mean`
- split invariance: :func:`global_token_count`, :func:`token_mean_denominator`,
  :func:`merge_metrics`
- re-exported from siblings: :class:`AdaptiveEntropyController` (magic_controller),
  :class:`Stage`, :class:`Plateau`, :class:`StageSchedule` (schedule), :class:`OffPolicyConfig`,
  :func:`response_indices` (off_policy), :class:`MagicConfig` (magic_config).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import torch
import torch.utils.checkpoint

from trainer import metric_names as mn
from trainer.magic.config import (ENTROPY_MODES, EntropyMode, KLEstimator, MagicConfig, MaskMode,
                           default_stages)
from trainer.magic.controller import AdaptiveEntropyController
from trainer.magic.off_policy import OffPolicyConfig, response_indices
from trainer.magic.schedule import Plateau, PlateauMode, Stage, StageSchedule, validate_stages

__all__ = [
    "AdaptiveEntropyController", "ENTROPY_MODES", "EntropyMode", "GradReduce", "KLEstimator",
    "LOG_RATIO_CLAMP", "MASK_MODES", "MagicConfig", "MaskMode", "OffPolicyConfig", "Plateau",
    "PlateauMode", "Stage", "StageSchedule", "default_stages", "entropy_loss", "filter_groups",
    "global_token_count", "group_advantages", "kl_loss", "kl_penalty", "magic_loss",
    "masked_mean", "masked_sum", "merge_metrics", "policy_loss", "response_indices",
    "sampled_entropy", "sampling_logits", "token_entropy", "token_mean_denominator",
    "validate_stages",
]

MASK_MODES: tuple[str, ...] = ("none", "before", "after")
GradReduce = Literal["mean", "sum"]

#: Log-ratios (policy vs old policy, or vs reference) are clamped to +-20 before ``exp`` so an
#: extreme token cannot overflow to inf and turn gradients into NaN (as in verl). e^20 ~ 5e8,
#: far beyond any ratio the clip lets through; inside the range nothing changes.
LOG_RATIO_CLAMP = 20.0

Number = int | float


# ---------------------------------------------------------------------------------------------
# Rewards -> advantages
# ---------------------------------------------------------------------------------------------

def _rewards_1d(rewards: torch.Tensor | Sequence[float], group_size: int) -> torch.Tensor:
    r = torch.as_tensor(rewards)
    if r.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(r.shape)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    if r.numel() % group_size != 0:
        raise ValueError(f"the number of rewards ({r.numel()}) must be a multiple of "
                         f"group_size ({group_size}): responses are stored group by group")
    if not r.is_floating_point():
        r = r.to(torch.get_default_dtype())
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards must be finite (no NaN or inf)")
    return r


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_size: int,
    truncated: torch.Tensor | Sequence[bool] | None = None,
    mask_mode: MaskMode = "none",
    eps: float = MagicConfig.adv_eps,
) -> torch.Tensor:
    """GRPO group advantage with MAGIC's truncated-response modes.

    Rule (Skywork-OR1 §2 GRPO and §3 "Advantage Mask for Truncated Responses"; docs/magic.md):
    ``A_i = (r_i - mean(group)) / (std(group) + eps)`` with the SAMPLE std (n-1); the caller
    puts the same ``A_i`` on every token of response ``i``. ``mask_mode``:

    - ``"none"`` (MAGIC): truncated responses are ordinary members and keep their advantage.
    - ``"before"``: truncated responses are left out of the group's mean and std and get 0.
    - ``"after"``: truncated responses stay in the mean and std but get 0.

    Edge cases (our choices, where the rule is silent):

    - A group whose counted rewards are all equal gets exactly 0 (the formula gives 0 up to
      rounding; we make it exact).
    - The std of fewer than two counted samples is defined as 0, so such a sample gets
      ``(r - r) / (0 + eps) = 0``: a group of size 1, a ``"before"`` group with one
      non-truncated response, and a ``"before"`` group where every response is truncated
      (no counted samples) all get 0. ``group_size == 1`` is therefore allowed here (all 0);
      :class:`MagicConfig` rejects it.
    - Statistics are computed in float64; the result has the rewards' floating dtype (the
      default dtype for integer or bool rewards).

    Args:
        rewards: ``[N]`` scalar reward per response, ``N = num_groups * group_size``.
        group_size: responses per prompt (n).
        truncated: ``[N]`` bool, True where the response hit the length limit. Required for
            ``"before"``/``"after"``; ignored by ``"none"``.
        mask_mode: ``"none"`` | ``"before"`` | ``"after"``.
        eps: added to the std (docs/magic.md: 1e-6).

    Returns:
        ``[N]`` advantages.

    Raises:
        ValueError: bad shapes, N not a multiple of group_size, non-finite rewards, unknown
            mode, or a masking mode without ``truncated``.
    """
    r = _rewards_1d(rewards, group_size)  # [N]
    if mask_mode not in MASK_MODES:
        raise ValueError(f"mask_mode must be one of {MASK_MODES}, got {mask_mode!r}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if truncated is None:
        if mask_mode != "none":
            raise ValueError(f"mask_mode {mask_mode!r} needs the truncated flags")
        trunc = torch.zeros(r.shape, dtype=torch.bool, device=r.device)  # [N]
    else:
        trunc = torch.as_tensor(truncated, device=r.device).bool()  # [N]
        if trunc.shape != r.shape:
            raise ValueError(f"truncated must have the rewards' shape {tuple(r.shape)}, "
                             f"got {tuple(trunc.shape)}")
    g = r.to(torch.float64).view(-1, group_size)  # [G, n]
    t = trunc.view(-1, group_size)  # [G, n]
    counted = ~t if mask_mode == "before" else torch.ones_like(t)  # [G, n] in the statistics
    scored = ~t if mask_mode in ("before", "after") else torch.ones_like(t)  # [G, n] keeps A
    adv = _standardise(g, counted, eps)  # [G, n]
    adv = torch.where(scored, adv, torch.zeros_like(adv))
    return adv.reshape(-1).to(r.dtype)  # [N]


def _standardise(g: torch.Tensor, counted: torch.Tensor, eps: float) -> torch.Tensor:
    """``(g - mean) / (sample_std + eps)`` per row over the ``counted`` entries. [G, n]."""
    zeros = torch.zeros_like(g)
    k = counted.sum(dim=1, keepdim=True).to(g.dtype)  # [G, 1]
    mean = torch.where(counted, g, zeros).sum(dim=1, keepdim=True) / k.clamp_min(1)  # [G, 1]
    dev = torch.where(counted, g - mean, zeros)  # [G, n]
    var = (dev * dev).sum(dim=1, keepdim=True) / (k - 1).clamp_min(1)  # [G, 1]
    std = torch.where(k >= 2, var.sqrt(), torch.zeros_like(var))  # [G, 1]
    hi = torch.where(counted, g, torch.full_like(g, -torch.inf)).amax(dim=1, keepdim=True)
    lo = torch.where(counted, g, torch.full_like(g, torch.inf)).amin(dim=1, keepdim=True)
    constant = (hi == lo) | (k < 2)  # [G, 1]
    return torch.where(constant, zeros, (g - mean) / (std + eps))  # [G, n]


def filter_groups(rewards: torch.Tensor | Sequence[float], group_size: int) -> torch.Tensor:
    """Online filter: keep-mask per response, False for groups whose rewards are all equal.

    Rule (Skywork-OR1 §3 data collection, online filtering / rejection sampling; docs/magic.md
    table "online filtering"): a group whose rewards are all equal (all 0 or all 1) has zero
    advantage everywhere and no learning signal; drop it, without refilling the batch.
    A group of size 1 is always "all equal" and dropped.

    Args:
        rewards: ``[N]``, ``N = num_groups * group_size``.
    Returns:
        ``[N]`` bool, constant within each group.
    Raises:
        ValueError: if N is not a multiple of group_size, or rewards are not finite.
    """
    r = _rewards_1d(rewards, group_size)  # [N]
    g = r.view(-1, group_size)  # [G, n]
    keep = g.amax(dim=1) != g.amin(dim=1)  # [G]
    return keep.repeat_interleave(group_size)  # [N]


# ---------------------------------------------------------------------------------------------
# Token aggregation (split-invariant)
# ---------------------------------------------------------------------------------------------

def _bool_mask(mask: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if mask.shape != shape:
        raise ValueError(f"response_mask shape {tuple(mask.shape)} must equal the values' "
                         f"shape {tuple(shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set (non-zero); padding may hold inf/NaN. -> 0-dim.

    The numerator of every token-mean term (docs/magic.md "Policy loss": token mean).
    """
    m = _bool_mask(mask, values.shape)
    return torch.where(m, values, torch.zeros_like(values)).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor,
                num_tokens: Number | torch.Tensor | None = None) -> torch.Tensor:
    """Token mean: ``sum(values[mask]) / num_tokens`` (docs/magic.md, "token mean").

    ``num_tokens`` defaults to the mask's own count. Pass the mini-batch's global count
    (see :func:`token_mean_denominator`) to make a micro-batch's term add up exactly to the
    full mini-batch's. A zero denominator gives 0 (not NaN), still attached to the graph.
    """
    total = masked_sum(values, mask)  # []
    if num_tokens is None:
        denom = _bool_mask(mask, values.shape).sum().to(total.dtype)
    else:
        denom = torch.as_tensor(num_tokens, dtype=total.dtype, device=total.device)
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    return torch.where(denom > 0, total / safe, total * 0.0)


def global_token_count(masks: torch.Tensor | Iterable[torch.Tensor], *,
                       group: torch.distributed.ProcessGroup | None = None,
                       distributed: bool | None = None) -> int:
    """Response tokens in one mini-batch: summed over micro-batch masks and, when
    ``torch.distributed`` is initialised (or ``distributed=True``), all-reduced (SUM) over
    ``group`` (default: the world). Every rank must call it (collective).

    docs/magic.md: "the gradient of a mini-batch must not depend on how it is split into
    micro-batches or data-parallel ranks" -- every micro-batch divides by this one count.
    """
    mask_list = [masks] if isinstance(masks, torch.Tensor) else list(masks)
    local = sum(int((m != 0).sum()) for m in mask_list)
    use_dist = distributed
    if use_dist is None:
        use_dist = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not use_dist:
        return local
    device = mask_list[0].device if mask_list else torch.device("cpu")
    if torch.distributed.get_backend(group) == "nccl" and device.type != "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    count = torch.tensor([local], dtype=torch.int64, device=device)
    torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.SUM, group=group)
    return int(count.item())


def token_mean_denominator(global_tokens: Number, *, world_size: int = 1,
                           grad_reduce: GradReduce = "mean",
                           engine_loss_divisor: int = 1) -> float:
    """The ``num_tokens`` each micro-batch loss must divide by so that the gradient after the
    framework's reductions equals the gradient of the token mean over the whole mini-batch
    (docs/magic.md "Policy loss": split invariance; Skywork-OR1 §3 token-level loss).

    Each micro-batch computes ``masked_sum / D`` and calls backward; gradients accumulate by
    SUM over micro-batches. Across data-parallel ranks:

    - ``grad_reduce="mean"``: DDP, FSDP and DeepSpeed all-reduce and then AVERAGE gradients
      over the ``world_size`` ranks, which divides the summed gradient by ``world_size``; so
      ``D = global_tokens / world_size`` (the loss is scaled up by ``world_size``).
    - ``grad_reduce="sum"``: a plain all-reduce SUM (or one process): ``D = global_tokens``.

    ``engine_loss_divisor``: DeepSpeed's ``engine.backward`` divides the loss by
    ``gradient_accumulation_steps`` (``scale_wrt_gas=True``, the default); pass that number
    and ``D`` is divided by it too. 1 for plain ``loss.backward()``.

    So, with ``world_size`` W, ``grad_reduce`` "mean" and divisor A:
    ``D = global_tokens / (W * A)``. ``global_tokens == 0`` gives 0 (losses are then 0).
    """
    if world_size < 1 or engine_loss_divisor < 1:
        raise ValueError(f"world_size and engine_loss_divisor must be >= 1, got "
                         f"{world_size} and {engine_loss_divisor}")
    if grad_reduce not in ("mean", "sum"):
        raise ValueError(f"grad_reduce must be 'mean' or 'sum', got {grad_reduce!r}")
    if global_tokens < 0:
        raise ValueError(f"global_tokens must be >= 0, got {global_tokens}")
    factor = (world_size if grad_reduce == "mean" else 1) * engine_loss_divisor
    return float(global_tokens) / factor


def merge_metrics(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Token-weighted mean of per-micro-batch metrics (weights ``losses/num_tokens``, which is
    summed), so logged metrics are token means over the mini-batch like the loss (docs/magic.md).
    Keys missing from some part are averaged over the parts that have them."""
    weights = [float(p.get(mn.LOSS_NUM_TOKENS, 0.0)) for p in parts]
    out: dict[str, float] = {mn.LOSS_NUM_TOKENS: sum(weights)}
    keys = sorted({k for p in parts for k in p} - {mn.LOSS_NUM_TOKENS})
    for key in keys:
        pairs = [(w, float(p[key])) for w, p in zip(weights, parts, strict=True) if key in p]
        total_w = sum(w for w, _ in pairs)
        out[key] = sum(w * v for w, v in pairs) / total_w if total_w > 0 else 0.0
    return out


# ---------------------------------------------------------------------------------------------
# The policy being trained: the sampling distribution
# ---------------------------------------------------------------------------------------------

def sampling_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The logits of the distribution the rollouts were sampled from: ``logits / tau``.

    Rule (Skywork-OR1 §3 "High-Temperature Sampling"; docs/magic.md "Temperature"): the
    update's log-probs (new, old and reference) and its entropy are those of
    ``softmax(logits / tau)``, tau the rollout temperature, so that the importance ratio, the
    policy gradient and the entropy the adaptive controller steers all belong to the policy
    that produced the responses. This is what the released trainer does: SkyworkAI/Skywork-OR1
    at 64e96af, verl/workers/actor/dp_actor.py, ``_forward_micro_batch`` divides the logits by
    ``meta_info['temperature']`` (the rollout's) before its log-probs and entropy, for the old
    log-probs and for the update alike. At tau = 1 nothing changes (the same tensor is
    returned). ``[..., V] -> [..., V]``.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    return logits if temperature == 1.0 else logits / temperature


# ---------------------------------------------------------------------------------------------
# Policy loss
# ---------------------------------------------------------------------------------------------

def _token_advantages(advantages: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if advantages.dim() == 1 and advantages.shape[0] == shape[0]:
        return advantages[:, None].expand(shape)  # [B] -> [B, T]
    if advantages.shape == shape:
        return advantages  # [B, T]
    raise ValueError(f"advantages must be [B] or [B, T] with [B, T] = {tuple(shape)}, "
                     f"got {tuple(advantages.shape)}")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float = MagicConfig.clip_low,
    clip_high: float = MagicConfig.clip_high,
    *,
    num_tokens: Number | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate, token-mean over all response tokens of the mini-batch.

    Rule (Skywork-OR1 §3 "Loss Function": token-level policy loss, no per-response length
    normalisation; docs/magic.md "Policy loss")::

        ratio = exp(logprobs - old_logprobs)                         # [B, T]
        l_t   = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
        loss  = sum_{masked t} l_t / num_tokens

    ``num_tokens`` defaults to this call's own token count; pass the global count of the
    mini-batch (:func:`token_mean_denominator`) when it is split into micro-batches or ranks,
    so the summed gradients equal the single-batch gradient. An all-zero mask (or zero
    ``num_tokens``) gives loss 0 and zero gradients, not NaN. Padding positions may hold
    anything (even -inf). The log-ratio is clamped to +-:data:`LOG_RATIO_CLAMP`.

    Args:
        logprobs: ``[B, T]`` log pi_theta of the sampled tokens (with grad).
        old_logprobs: ``[B, T]`` log pi_old of the same tokens (the rollout policy).
        advantages: ``[B]`` per response, or ``[B, T]`` per token.
        response_mask: ``[B, T]`` bool or 0/1, True on response tokens.
        clip_low, clip_high: ratio clipped to ``[1 - clip_low, 1 + clip_high]``.
        num_tokens: denominator (default: ``response_mask.sum()``).

    Returns:
        ``(loss, metrics)``: loss a 0-dim tensor; metrics Python floats over THIS call's tokens
        (plain token means, independent of ``num_tokens``; combine parts with
        :func:`merge_metrics`): ``losses/policy``, ``losses/clipfrac`` (= low + high),
        ``losses/clipfrac_low`` (A < 0 and ratio < 1 - clip_low: the lower clip is active),
        ``losses/clipfrac_high`` (A > 0 and ratio > 1 + clip_high), ``losses/approx_kl``
        (k3 estimate of KL(old || new): mean of ``ratio - 1 - log ratio``, >= 0),
        ``losses/ratio_mean``, ``entropy/rollout`` (``-mean(old_logprobs)``: the sampling
        policy's entropy, estimated from its sampled tokens), ``losses/num_tokens``.
    """
    if not 0 <= clip_low < 1 or not clip_high >= 0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, "
                         f"{clip_high}")
    if old_logprobs.shape != logprobs.shape:
        raise ValueError(f"old_logprobs shape {tuple(old_logprobs.shape)} must equal "
                         f"logprobs shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    mask = _bool_mask(response_mask, shape)  # [B, T]
    zeros = torch.zeros_like(logprobs)  # [B, T]
    adv = torch.where(mask, _token_advantages(advantages, shape).to(logprobs.dtype), zeros)
    log_ratio = torch.where(mask, logprobs - old_logprobs, zeros)  # [B, T]
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)  # [B, T]
    surrogate = ratio * adv  # [B, T]
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv  # [B, T]
    per_token = -torch.minimum(surrogate, clipped)  # [B, T]
    loss = masked_mean(per_token, mask, num_tokens)

    with torch.no_grad():
        n = int(mask.sum())
        low = mask & (adv < 0) & (ratio < 1.0 - clip_low)  # [B, T]
        high = mask & (adv > 0) & (ratio > 1.0 + clip_high)  # [B, T]

        def mean(x: torch.Tensor) -> float:
            return float(masked_sum(x.to(logprobs.dtype), mask)) / n if n else 0.0

        metrics = {
            mn.LOSS_POLICY: mean(per_token),
            mn.LOSS_CLIPFRAC: mean(low | high),
            mn.LOSS_CLIPFRAC_LOW: mean(low),
            mn.LOSS_CLIPFRAC_HIGH: mean(high),
            mn.LOSS_APPROX_KL: mean(ratio - 1.0 - log_ratio),
            mn.LOSS_RATIO_MEAN: mean(ratio),
            # The rollout policy's entropy at sampling time, estimated from its own sampled
            # tokens (-mean log pi_old, pi_old being the policy that sampled them), beside the
            # update's full-distribution entropy, which off-policy is measured on a policy
            # that has already moved within the step.
            mn.ENTROPY_ROLLOUT: mean(-old_logprobs),
            mn.LOSS_NUM_TOKENS: float(n),
        }
    return loss, metrics


# ---------------------------------------------------------------------------------------------
# Entropy
# ---------------------------------------------------------------------------------------------

def entropy_rows(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax over the last dim, ``logsumexp(x) - sum softmax(x) * x``. [n, V]->[n].

    Upcasts this chunk only (to float32 at least); -inf logits (banned tokens) are replaced by
    the dtype's most negative finite value so that ``0 * x`` stays 0 (no NaN).
    """
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))  # [n, V]
    x = x.clamp_min(torch.finfo(x.dtype).min)
    lse = torch.logsumexp(x, dim=-1)  # [n]
    p = torch.softmax(x, dim=-1)  # [n, V]
    return lse - (p * x).sum(dim=-1)  # [n]


def token_entropy(logits: torch.Tensor, chunk_size: int = 1024, *,
                  checkpoint: bool | None = None) -> torch.Tensor:
    """Entropy (nats) of the full next-token distribution at every position.

    Rule (Skywork-OR1 §3 "Adaptive Entropy Control": H is the entropy of the policy's full
    token distribution; docs/magic.md "Entropy"). ``H = logsumexp(x) - sum_v softmax(x)_v x_v``.

    Memory: the positions are processed ``chunk_size`` at a time, and only one chunk is upcast
    (bf16/fp16 -> float32), so the float32 working set is ``chunk_size x V``, never a
    full-vocabulary float32 copy of the whole sequence. For the backward pass each chunk's
    intermediates would still be saved; ``checkpoint`` (default: on when grad is needed)
    recomputes them per chunk in backward instead (``torch.utils.checkpoint``).

    Args:
        logits: ``[..., V]`` (typically ``[B, T, V]``), any float dtype.
        chunk_size: positions per chunk, >= 1.
    Returns:
        ``[...]`` (typically ``[B, T]``) in float32, or float64 for float64 logits.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)  # [B*T, V]
    if checkpoint is None:
        checkpoint = torch.is_grad_enabled() and logits.requires_grad
    parts = []
    for start in range(0, flat.shape[0], chunk_size):
        chunk = flat[start:start + chunk_size]  # [c, V]
        if checkpoint:
            parts.append(torch.utils.checkpoint.checkpoint(entropy_rows, chunk,
                                                           use_reentrant=False))
        else:
            parts.append(entropy_rows(chunk))
    out_dtype = torch.promote_types(logits.dtype, torch.float32)
    if not parts:
        return torch.zeros(lead, dtype=out_dtype, device=logits.device)
    return torch.cat(parts).reshape(lead)  # [...]


def sampled_entropy(logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``-masked_mean(logprobs)``: the sampled-token entropy estimate (nats per token).

    The released Skywork-OR1 code feeds this quantity (from the rollout policy's log-probs)
    to its entropy controller; it is an unbiased estimate of the mean entropy when the tokens
    were sampled at temperature 1. -> 0-dim.
    """
    return -masked_mean(logprobs, response_mask)


def entropy_loss(entropy: torch.Tensor, response_mask: torch.Tensor, coef: float, *,
                 num_tokens: Number | torch.Tensor | None = None) -> torch.Tensor:
    """The entropy bonus term ``-coef * H``, H the token-mean entropy over response tokens.

    Rule (Skywork-OR1 §3 "Adaptive Entropy Control"; docs/magic.md "Entropy"). ``entropy`` is
    ``[B, T]`` from :func:`token_entropy`; ``coef`` comes from
    :class:`AdaptiveEntropyController`. Same ``num_tokens`` semantics as :func:`policy_loss`.
    """
    return -coef * masked_mean(entropy, response_mask, num_tokens)


# ---------------------------------------------------------------------------------------------
# KL to a reference policy (ablation only; MAGIC uses none)
# ---------------------------------------------------------------------------------------------

def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
               estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.

    For the report's KL ablation (Skywork-OR1 §3 "No KL Loss": MAGIC sets beta = 0).
    ``k1 = log pi - log pi_ref`` (unbiased, can be negative; its gradient as a loss term is
    zero in expectation). ``k3 = r - 1 - log r`` with ``r = pi_ref / pi`` (unbiased,
    non-negative, low variance; the GRPO/DeepSeekMath choice). The log-ratio is clamped to
    +-:data:`LOG_RATIO_CLAMP`. ``[B, T] -> [B, T]``.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"ref_logprobs shape {tuple(ref_logprobs.shape)} must equal "
                         f"logprobs shape {tuple(logprobs.shape)}")
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k3":
        log_r = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"estimator must be 'k1' or 'k3', got {estimator!r}")


def kl_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor,
            coef: float, estimator: KLEstimator = "k3", *,
            num_tokens: Number | torch.Tensor | None = None) -> torch.Tensor:
    """``beta * token-mean KL`` over response tokens (0-dim); padding may hold anything."""
    mask = _bool_mask(response_mask, logprobs.shape)
    ref = torch.where(mask, ref_logprobs, logprobs.detach())  # no inf - inf at padding
    return coef * masked_mean(kl_penalty(logprobs, ref, estimator), mask, num_tokens)


# ---------------------------------------------------------------------------------------------
# The whole MAGIC actor loss
# ---------------------------------------------------------------------------------------------

def magic_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    clip_low: float = MagicConfig.clip_low,
    clip_high: float = MagicConfig.clip_high,
    num_tokens: Number | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``policy_loss - entropy_coef * H + kl_coef * KL``, all token means with one denominator.

    Skywork-OR1 §3 "Loss Function" (token-level loss, adaptive entropy, no KL); docs/magic.md.
    ``entropy`` (``[B, T]``, from :func:`token_entropy`) is needed only when
    ``entropy_coef != 0``, ``ref_logprobs`` only when ``kl_coef != 0``. Metrics are those of
    :func:`policy_loss` plus ``losses/entropy`` (token-mean H, when given), ``losses/kl``
    (when a reference is given) and ``losses/total``, all over this call's tokens.
    """
    loss, metrics = policy_loss(logprobs, old_logprobs, advantages, response_mask,
                                clip_low, clip_high, num_tokens=num_tokens)
    local_total = metrics[mn.LOSS_POLICY]
    if entropy_coef != 0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs the token entropy [B, T]")
    if kl_coef != 0 and ref_logprobs is None:
        raise ValueError("kl_coef != 0 needs ref_logprobs [B, T]")
    if entropy is not None:
        if entropy_coef != 0:
            loss = loss + entropy_loss(entropy, response_mask, entropy_coef,
                                       num_tokens=num_tokens)
        h = float(masked_mean(entropy.detach(), response_mask))
        metrics[mn.LOSS_ENTROPY] = h
        local_total -= entropy_coef * h
    if ref_logprobs is not None:
        if kl_coef != 0:
            loss = loss + kl_loss(logprobs, ref_logprobs, response_mask, kl_coef,
                                  kl_estimator, num_tokens=num_tokens)
        kl = float(kl_loss(logprobs.detach(), ref_logprobs, response_mask, 1.0, kl_estimator))
        metrics[mn.LOSS_KL] = kl
        local_total += kl_coef * kl
    metrics[mn.LOSS_TOTAL] = local_total
    return loss, metrics
