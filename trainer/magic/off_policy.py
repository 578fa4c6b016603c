"""The off-policy quadruple (N_SGD, D_R, D_T, N_reuse) of MAGIC's update: Skywork-OR1 (arXiv
2505.22312) §3 "On-Policy Training" and the off-policy-update ablation of §4 (entropy-collapse
studies); docs/magic.md, rule "Off-policy knobs".

:class:`OffPolicyConfig` is derived from the run config (``MagicConfig.off_policy()``), never
written in it; it plans one rollout batch's mini-batches. torch is imported lazily (only
:meth:`OffPolicyConfig.minibatches` and :func:`response_indices` need it), so configs can be
built and validated without it. Re-exported by :mod:`trainer.magic.rules`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.config_schema import build, is_int

if TYPE_CHECKING:
    import torch  # lazy: MagicConfig (the config layer) imports this module without torch


@dataclass(frozen=True)
class OffPolicyConfig:
    """The quadruple (N_SGD, D_R, D_T, N_reuse) of the report's off-policy ablation.

    Units: ``rollout_batch_size`` (D_R) and ``mini_batch_size`` (D_T) count PROMPTS (groups),
    as in the report's batch sizes; a mini-batch always holds whole groups, i.e.
    ``D_T * group_size`` responses. ``n_reuse`` is the number of passes (epochs) over one
    rollout batch and ``n_sgd`` the number of optimizer steps per rollout batch, so
    ``N_SGD = (D_R / D_T) * N_reuse``. ``(1, D, D, 1)`` is on-policy (MAGIC; the report's
    (1, 64, 64, 1)): one optimizer step per rollout batch, one epoch.

    Skywork-OR1 §3 "On-Policy Training" and §4 off-policy ablation; docs/magic.md.

    Raises:
        ValueError: unless all four are ints >= 1, D_T divides D_R and
            N_SGD == (D_R / D_T) * N_reuse.
    """

    n_sgd: int = 1
    rollout_batch_size: int = 256
    mini_batch_size: int = 256
    n_reuse: int = 1

    def __post_init__(self) -> None:
        for name in ("n_sgd", "rollout_batch_size", "mini_batch_size", "n_reuse"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        d_r, d_t = self.rollout_batch_size, self.mini_batch_size
        if d_r % d_t != 0:
            raise ValueError(f"mini_batch_size (D_T={d_t}) must divide rollout_batch_size "
                             f"(D_R={d_r})")
        expected = (d_r // d_t) * self.n_reuse
        if self.n_sgd != expected:
            raise ValueError(f"N_SGD must equal (D_R / D_T) * N_reuse = ({d_r} / {d_t}) * "
                             f"{self.n_reuse} = {expected}, got n_sgd={self.n_sgd}")

    @property
    def minibatches_per_epoch(self) -> int:
        """D_R / D_T."""
        return self.rollout_batch_size // self.mini_batch_size

    @property
    def is_on_policy(self) -> bool:
        """True for N_SGD == 1: one optimizer step on data from the current policy."""
        return self.n_sgd == 1

    def minibatches(self, num_prompts: int | None = None,
                    generator: torch.Generator | None = None,
                    keep_empty: bool = False) -> list[torch.Tensor]:
        """Prompt-index mini-batches of one update, in order: N_reuse epochs x D_R/D_T each.

        ``num_prompts`` is how many prompts (groups) the rollout batch holds now, D_R unless
        online filtering dropped some (MAGIC filters without refilling). Each epoch permutes
        ``range(num_prompts)`` with ``generator`` (identity order when it is None) and splits it
        into D_R/D_T nearly equal parts (sizes differ by at most one, larger first), so the
        number of optimizer steps stays N_SGD whatever the filter kept; empty parts (fewer
        prompts than mini-batches) are skipped unless ``keep_empty`` (data-parallel ranks keep
        them, so every rank takes the same N_SGD optimizer steps: each step is a collective).
        Deterministic for a given generator state.

        Returns:
            list of int64 tensors of prompt indices, each ``[n_i]``; see
            :func:`response_indices` for the matching response rows.

        Raises:
            ValueError: if ``num_prompts`` is negative or larger than D_R.
        """
        import torch  # lazy: MagicConfig (the config layer) imports this module without torch

        n = self.rollout_batch_size if num_prompts is None else num_prompts
        if not is_int(n) or not 0 <= n <= self.rollout_batch_size:
            raise ValueError(f"num_prompts must be an int in [0, D_R={self.rollout_batch_size}]"
                             f", got {num_prompts!r}")
        out: list[torch.Tensor] = []
        for _ in range(self.n_reuse):
            if generator is None:
                order = torch.arange(n, dtype=torch.long)  # [n]
            else:
                order = torch.randperm(n, generator=generator, dtype=torch.long)  # [n]
            out.extend(p for p in torch.tensor_split(order, self.minibatches_per_epoch)
                       if keep_empty or p.numel() > 0)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OffPolicyConfig:
        return build(cls, data, "off-policy")

    def to_dict(self) -> dict[str, int]:
        return {"n_sgd": self.n_sgd, "rollout_batch_size": self.rollout_batch_size,
                "mini_batch_size": self.mini_batch_size, "n_reuse": self.n_reuse}


def response_indices(prompt_indices: torch.Tensor, group_size: int) -> torch.Tensor:
    """Response rows of the given prompts when responses are stored group by group.

    Turns a prompt mini-batch of :meth:`OffPolicyConfig.minibatches` (D_T counts prompts,
    Skywork-OR1 §4 off-policy ablation) into the rows of its responses.

    Prompt ``p`` owns rows ``p * group_size .. p * group_size + group_size - 1``.
    ``[P] -> [P * group_size]``.
    """
    import torch  # lazy: MagicConfig (the config layer) imports this module without torch

    if not is_int(group_size) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    offsets = torch.arange(group_size, dtype=torch.long, device=prompt_indices.device)  # [g]
    rows = prompt_indices.long()[:, None] * group_size + offsets[None, :]  # [P, g]
    return rows.reshape(-1)  # [P * g]
