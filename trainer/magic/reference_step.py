"""One MAGIC training step in plain torch, in one file: the place to start reading.

``trainer run`` spreads a step over trainer/loop.py (the phases), trainer/magic/rules.py (the rules),
trainer/backends/ (micro-batches, ZeRO, the optimizer) and the verifier (rewards), because it
must scale to many GPUs and stream. This file is the same step for one process and one batch,
with nothing in between, in the order it happens (Skywork-OR1, arXiv 2505.22312, §3 MAGIC):

1. :func:`generate`: ``group_size`` responses per prompt, sampled from softmax(logits / tau)
   (high-temperature sampling, tau = 1), cut at the stage's length limit;
2. :func:`score`: a reward per response from a verifier function (1 correct, 0 not);
3. :func:`group_advantages`: GRPO's group-normalised advantage; truncated responses keep theirs
   (MAGIC: no advantage mask); groups whose rewards are all equal are dropped (online filter);
4. :func:`magic_loss`: the clipped surrogate, ratio clipped to [1 - eps_low, 1 + eps_high] (two
   clips, so clip-higher is eps_high > eps_low; MAGIC releases 0.2 for both), averaged over
   every response token of the batch (token-level loss), minus the adaptive entropy bonus
   c * H, no KL;
5. :func:`update`: one AdamW step on the whole batch (on-policy, N_SGD = 1: the old policy is the
   current one, so the ratio is exactly 1 and its gradient is the policy gradient), gradient
   norm clipped; then the entropy coefficient moves towards its target.

Not used by ``trainer run``. tests/test_reference_step.py checks that :func:`update` changes the
weights exactly as ``TorchBackend.update`` does on the same batch, and :func:`group_advantages`
equals :func:`trainer.magic.rules.group_advantages`, so this reading stays true.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trainer.magic.config import MagicConfig, default_stages


@dataclass
class StepSettings:
    """The knobs of one step; every default is MagicConfig's (trainer/magic/config.py), the
    released value. On-policy the ratio is exactly 1, inside any clip range, so the two clips
    do not change what :func:`update` computes; they matter once the policy moves within a
    step (off-policy, N_SGD > 1)."""

    group_size: int = MagicConfig.group_size  # G responses per prompt
    temperature: float = MagicConfig.temperature  # tau
    max_response_length: int = default_stages()[0].max_response_length  # stage 1's limit, tokens
    clip_low: float = MagicConfig.clip_low  # eps_low
    clip_high: float = MagicConfig.clip_high  # eps_high (clip-higher when > eps_low)
    grad_clip: float = MagicConfig.grad_clip
    entropy_target: float = MagicConfig.entropy_target  # nats per token
    entropy_delta: float = MagicConfig.entropy_delta  # the coefficient's step
    entropy_coef_max: float = MagicConfig.entropy_coef_max


def generate(model, prompts: Sequence[list[int]], s: StepSettings, eos_id: int, pad_id: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample ``s.group_size`` responses per prompt, one token at a time (no cache: clear, not
    fast). Returns ``(input_ids [B, L], attention_mask [B, L], response_mask [B, L-1],
    truncated [B])``, ``B = len(prompts) * G``; ``response_mask[:, t]`` marks the targets
    ``input_ids[:, t + 1]`` that are response tokens."""
    rows = [list(p) for p in prompts for _ in range(s.group_size)]
    starts = [len(r) for r in rows]
    done = [False] * len(rows)
    for _ in range(s.max_response_length):
        if all(done):
            break
        ids, attn = _pad(rows, pad_id)  # [B, L]
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attn).logits  # [B, L, V]
        last = attn.sum(1) - 1  # [B] position of each row's last real token
        step_logits = logits[torch.arange(len(rows)), last] / s.temperature  # [B, V]
        nxt = torch.multinomial(step_logits.softmax(-1), 1).squeeze(1)  # [B]
        for i, tok in enumerate(nxt.tolist()):
            if not done[i]:
                rows[i].append(tok)
                done[i] = tok == eos_id
    ids, attn = _pad(rows, pad_id)
    resp = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)  # [B, L-1]
    for i, (row, start) in enumerate(zip(rows, starts)):
        resp[i, start - 1: len(row) - 1] = True
    truncated = torch.tensor([not d for d in done])  # [B] hit the limit without stopping
    return ids, attn, resp, truncated


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, L]
    attn = torch.zeros_like(ids)  # [B, L]
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        attn[i, :len(r)] = 1
    return ids, attn


def score(responses: Sequence[list[int]], verify: Callable[[list[int]], bool]) -> torch.Tensor:
    """The verifiable reward: 1.0 when ``verify`` accepts the response, else 0.0. ``[B]``."""
    return torch.tensor([1.0 if verify(r) else 0.0 for r in responses])


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = MagicConfig.adv_eps
                     ) -> torch.Tensor:
    """GRPO: ``(r - mean(group)) / (std(group) + eps)``, the sample std; a group whose rewards
    are all equal gets exactly 0 (the online filter drops it). ``[B] -> [B]``."""
    groups = rewards.double().view(-1, group_size)  # [P, G]
    adv = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + eps)
    flat = (groups == groups[:, :1]).all(1, keepdim=True)  # [P, 1] nothing to learn
    return torch.where(flat, torch.zeros_like(adv), adv).view(-1).to(rewards.dtype)


def logprobs_and_entropy(model, ids: torch.Tensor, attn: torch.Tensor, temperature: float
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(target) and the full-distribution entropy at every position, both of
    softmax(logits / tau), the distribution the responses were sampled from. ``[B, L-1]``."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1] / temperature  # [B,L-1,V]
    logp_all = logits.float().log_softmax(-1)  # [B, L-1, V]
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, L-1]
    return logp, entropy


def magic_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
               entropy: torch.Tensor, mask: torch.Tensor, s: StepSettings, entropy_coef: float
               ) -> torch.Tensor:
    """Token-level clipped surrogate minus ``entropy_coef * H``, no KL. ``adv`` is ``[B]``,
    the others ``[B, L-1]``; every mean is over all response tokens of the batch at once."""
    n = mask.sum()
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))  # [B, L-1]
    a = adv[:, None].expand_as(logp)  # [B, L-1] each token carries its response's advantage
    surrogate = torch.minimum(ratio * a, ratio.clamp(1 - s.clip_low, 1 + s.clip_high) * a)
    policy = -(surrogate * mask).sum() / n
    return policy - entropy_coef * (entropy * mask).sum() / n


def update(model, optimizer: torch.optim.Optimizer, ids: torch.Tensor, attn: torch.Tensor,
           response_mask: torch.Tensor, adv: torch.Tensor, s: StepSettings,
           entropy_coef: float) -> dict[str, float]:
    """One on-policy optimizer step: the old log-probs are this forward's, detached (ratio 1).
    Returns the loss, the batch's token-mean entropy (the controller's input) and the grad
    norm before clipping."""
    model.train()
    logp, entropy = logprobs_and_entropy(model, ids, attn, s.temperature)
    loss = magic_loss(logp, logp.detach(), adv, entropy, response_mask, s, entropy_coef)
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    norm = (torch.nn.utils.clip_grad_norm_(params, s.grad_clip) if s.grad_clip > 0 else
            torch.nn.utils.get_total_norm([p.grad for p in params]))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    h = float((entropy.detach() * response_mask).sum() / response_mask.sum())
    return {"loss": float(loss.detach()), "entropy": h, "grad_norm": float(norm)}


def next_entropy_coef(c: float, entropy: float, s: StepSettings) -> tuple[float, float]:
    """Adaptive entropy control: c moves by delta towards raising entropy while it is below the
    target (and back otherwise), clamped to [0, max]; the bonus applies only below the target.
    Returns (c, the coefficient for the next step)."""
    below = entropy < s.entropy_target
    c = min(max(c + (s.entropy_delta if below else -s.entropy_delta), 0.0), s.entropy_coef_max)
    return c, (c if below else 0.0)


def reference_step(model, optimizer, prompts: Sequence[list[int]],
                   verify: Callable[[list[int]], bool], s: StepSettings, c: float,
                   entropy_coef: float, eos_id: int, pad_id: int) -> dict[str, float]:
    """Steps 1-5 for one batch of prompts; returns the step's numbers, with the controller's
    new state ``c`` and the coefficient for the next step."""
    ids, attn, resp, truncated = generate(model, prompts, s, eos_id, pad_id)
    responses = [row[m.nonzero().min() + 1: m.nonzero().max() + 2].tolist()
                 for row, m in zip(ids, resp)]
    rewards = score(responses, verify)
    adv = group_advantages(rewards, s.group_size)
    keep = (adv.view(-1, s.group_size) != 0).any(1).repeat_interleave(s.group_size)  # [B]
    out = {"reward/mean": float(rewards.mean()), "truncated/frac": float(truncated.float().mean()),
           "filtered/frac": 1.0 - float(keep.float().mean())}
    if not keep.any():  # every group was flat: no update, the controller does not move
        return {**out, "c": c, "entropy/next_coef": entropy_coef}
    m = update(model, optimizer, ids[keep], attn[keep], resp[keep], adv[keep], s, entropy_coef)
    c, nxt = next_entropy_coef(c, m["entropy"], s)
    return {**out, **m, "c": c, "entropy/next_coef": nxt}
