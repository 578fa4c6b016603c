"""The two small interfaces the training loop talks to, and the data that crosses them.

- ``RolloutEngine``: generates n samples per prompt (HF ``generate`` on CPU, vLLM in
  production) and takes new weights after every update.
- ``TrainingBackend``: recomputes log-probs and applies the MAGIC update (plain torch, or
  DeepSpeed ZeRO).

The loop (trainer/loop.py) holds one of each and never knows which implementation it has.
Token conventions: a sequence is ``prompt_ids + response_ids``, right-padded; ``targets =
input_ids[:, 1:]``; everything per target token is ``[B, L-1]`` ("T" below is ``L - 1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol, Sequence

import torch

from trainer.magic.config import MagicConfig

# ---------------------------------------------------------------------------------------------
# Rollouts
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SamplingParams:
    """How to sample (docs/magic.md: temperature 1.0, top_p 1.0, top_k -1 for training)."""

    n: int = 16
    """Samples per prompt (the group size)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1 disables top-k."""
    max_tokens: int = 8192
    """Maximum response tokens; a response that reaches it is truncated."""
    seed: int | None = None
    """Seed for this call's sampling (makes a run reproducible and resumable)."""


@dataclass
class Completion:
    """One sampled response."""

    prompt_index: int
    """Index of the prompt in the generate() call's list."""
    sample_index: int
    """0..n-1 within its prompt's group."""
    prompt_ids: list[int]
    token_ids: list[int]
    """Response tokens, including the EOS token when the model stopped by itself."""
    text: str
    """Decoded response (special tokens skipped)."""
    truncated: bool
    """True when the response hit ``max_tokens`` without stopping."""


class RolloutEngine(Protocol):
    """Generates rollouts; receives the trainer's weights after every update."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        on_done: Callable[[list[Completion]], None] | None = None,
    ) -> list[Completion]:
        """Sample ``params.n`` responses for each prompt (token ids). Returns all completions
        ordered by (prompt_index, sample_index). ``on_done``, when given, is called with each
        chunk of completions as soon as they are finished, before generate() returns, so the
        caller can start verifying them while generation continues."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights (Hugging Face parameter names, full tensors)."""
        ...

    def sleep(self) -> None:
        """Release accelerator memory between rollout phases (no-op where meaningless)."""
        ...

    def wake_up(self) -> None:
        ...

    def close(self) -> None:
        ...


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

@dataclass
class TokenBatch:
    """A padded batch of prompt+response sequences."""

    input_ids: torch.Tensor  # [B, L] long, right-padded with pad_id
    attention_mask: torch.Tensor  # [B, L] long, 1 on real tokens
    response_mask: torch.Tensor  # [B, L-1] bool, True where targets[:, t] is a response token

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, index: torch.Tensor) -> "TokenBatch":
        """Rows ``index`` ([b] long)."""
        return TokenBatch(self.input_ids[index], self.attention_mask[index],
                          self.response_mask[index])

    @staticmethod
    def from_completions(completions: Sequence[Completion], pad_id: int) -> "TokenBatch":
        """Build the batch; lengths are trimmed to the longest sequence."""
        seqs = [c.prompt_ids + c.token_ids for c in completions]
        L = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)  # [B, L]
        attn = torch.zeros((len(seqs), L), dtype=torch.long)  # [B, L]
        resp = torch.zeros((len(seqs), L - 1), dtype=torch.bool)  # [B, L-1]
        for i, (c, s) in enumerate(zip(completions, seqs)):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            attn[i, : len(s)] = 1
            p = len(c.prompt_ids)
            # target t predicts token t+1: response tokens are targets p-1 .. len(s)-2
            resp[i, p - 1 : len(s) - 1] = True
        return TokenBatch(ids, attn, resp)


@dataclass
class LossSettings:
    """What one update needs from the MAGIC config (docs/magic.md)."""

    clip_low: float = MagicConfig.clip_low
    """PPO ratio clip bounds; the defaults are MagicConfig's (documented there)."""
    clip_high: float = MagicConfig.clip_high
    entropy_coef: float = 0.0
    """Coefficient c of the -c*H term for THIS step (from AdaptiveEntropyController)."""
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    temperature: float = 1.0
    """The rollout temperature: the update's log-probs, entropy and reference log-probs are
    those of ``softmax(logits / temperature)``, the distribution the responses were sampled
    from (trainer.magic.rules.sampling_logits)."""


@dataclass
class UpdatePlan:
    """One rollout batch's update: the mini-batches (row indices into the TokenBatch), in the
    order they are applied; one optimizer step per mini-batch (N_SGD steps in all)."""

    minibatches: list[torch.Tensor]  # each [b] long
    micro_batch_size: int
    """Rows per forward/backward pass (gradient accumulation inside a mini-batch): a run's
    ``micro_batch_size`` (trainer/config.py RunConfig, its one home); with a token budget,
    the most rows of one packed micro-batch."""
    max_tokens_per_micro_batch: int | None = None
    """Tokens (prompt included) per packed, padding-free micro-batch, or None: micro-batches
    of ``micro_batch_size`` padded rows. A run's ``max_tokens_per_micro_batch`` (RunConfig)."""


class TrainingBackend(Protocol):
    """Owns the policy model and its optimizer."""

    rank: int
    world_size: int

    def logprobs(self, batch: TokenBatch, micro_batch_size: int, *,
                 response_only: bool = False, temperature: float = 1.0,
                 max_tokens_per_micro_batch: int | None = None) -> torch.Tensor:
        """log pi(target) for every target token, no grad: ``[B, L-1]`` float32 (padding
        positions hold 0). Used for the old (rollout-policy) log-probs. ``response_only``:
        only the response targets are computed, the others hold 0. ``temperature``: of
        ``softmax(logits / temperature)``, the rollout distribution (LossSettings).
        ``max_tokens_per_micro_batch``: packed token-budget micro-batches (UpdatePlan)."""
        ...

    def update(self, batch: TokenBatch, old_logprobs: torch.Tensor | None,
               advantages: torch.Tensor, plan: UpdatePlan, loss: LossSettings,
               ref_logprobs: torch.Tensor | None = None) -> dict[str, float]:
        """Apply ``plan``: for each mini-batch, accumulate gradients over micro-batches with
        the mini-batch's GLOBAL response-token count (trainer.magic.rules.token_mean_denominator),
        clip the grad norm, one optimizer step. ``advantages`` is ``[B]``. ``old_logprobs``
        None (on-policy, a plan of one mini-batch only): the training forward's detached
        log-probs are the old ones (docs/magic.md "On-policy training"). ``ref_logprobs``
        (``[B, L-1]``) is needed only for a KL loss on a backend that keeps no reference policy
        of its own; one that does scores every micro-batch with it. Returns metrics
        merged over the mini-batches: ``losses/policy``, ``losses/clipfrac``,
        ``losses/clipfrac_low``, ``losses/clipfrac_high``, ``losses/approx_kl``,
        ``losses/entropy_bonus``, ``entropy`` (token-mean entropy of the full next-token
        distribution over response tokens), ``grad_norm``, ``lr``, the work counters
        ``update/computed_over_real_tokens`` and ``update/oversized_rows``, and ``losses/kl``
        when there is a reference."""
        ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in Hugging Face names (gathered under ZeRO-3), for the engine."""
        ...

    def save(self, path: Path) -> None:
        """Model (HF format, safetensors) + optimizer state to directory ``path``."""
        ...

    def load(self, path: Path) -> None:
        ...
