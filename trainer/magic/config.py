"""``MagicConfig``: every knob of the MAGIC recipe, documented and validated (no torch).

Defaults are the released Skywork-OR1 values (arXiv 2505.22312; docs/magic.md table). Each field's
docstring gives unit, default and why, and the report's section.
:meth:`MagicConfig.from_dict` builds one from plain data (a YAML layer sits on top).
Re-exported by :mod:`trainer.magic.rules`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from trainer.config_schema import build, coerce_fields, field_docs
from trainer import metric_names as mn
from trainer.magic.off_policy import OffPolicyConfig
from trainer.magic.schedule import Plateau, Stage, StageSchedule, validate_stages

MaskMode = Literal["none", "before", "after"]
KLEstimator = Literal["k1", "k3"]
EntropyMode = Literal["adaptive", "fixed", "off"]
ENTROPY_MODES: tuple[str, ...] = get_args(EntropyMode)


def check_entropy_settings(target: float, delta: float, coef_min: float, coef_init: float,
                           coef_max: float, mode: str) -> None:
    """The entropy controller's rules, the one place they are checked: by :class:`MagicConfig`
    and by :class:`trainer.magic.controller.AdaptiveEntropyController` built on its own.

    Raises:
        ValueError: unless all are finite numbers, ``target >= 0``, ``delta >= 0``,
            ``0 <= coef_min <= coef_init <= coef_max`` and ``mode`` is one of ENTROPY_MODES.
    """
    values = {"target": target, "delta": delta, "coef_min": coef_min, "coef_max": coef_max,
              "coef_init": coef_init}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if mode not in ENTROPY_MODES:
        raise ValueError(f"entropy mode must be one of {ENTROPY_MODES}, got {mode!r}")
    if target < 0:
        raise ValueError(f"target entropy must be >= 0 (nats per token; entropy_target), "
                         f"got {target}")
    if delta < 0:
        raise ValueError(f"delta must be >= 0 (a step size; entropy_delta), got {delta}")
    if not 0.0 <= coef_min <= coef_init <= coef_max:
        raise ValueError(
            "entropy coefficients must satisfy 0 <= coef_min <= coef_init <= coef_max, got "
            f"coef_min={coef_min}, coef_init={coef_init}, coef_max={coef_max}")


def default_stages() -> tuple[Stage, ...]:
    """MAGIC's context stages 8K -> 16K -> 32K (docs/magic.md table, Skywork-OR1 §3).

    The report moves on "once the model's performance converged" and publishes no step counts,
    so stages 1 and 2 end on a plateau of ``eval/accuracy`` (5 evaluations without
    improvement); the last stage runs until the run's step budget ends.
    """
    converged = Plateau(metric=mn.EVAL_ACCURACY, patience=5, min_delta=0.0, mode="max")
    return (Stage("8k", 8192, plateau=converged),
            Stage("16k", 16384, plateau=converged),
            Stage("32k", 32768))


@dataclass(frozen=True)
class MagicConfig:
    """The MAGIC recipe's knobs (Skywork-OR1 §3; docs/magic.md). Frozen: use
    ``dataclasses.replace`` (re-validated) to vary one. Cross-field rules are checked at
    construction; a broken one raises ValueError naming the rule."""

    # --- rollout -------------------------------------------------------------------------------
    group_size: int = 16
    """Responses sampled per prompt (GRPO group), count. Default 16 as released. Must be >= 2: the
    group advantage divides by the group's sample std (n-1). Skywork-OR1 §2/§3."""
    prompts_per_step: int = 256
    """Prompts per rollout batch, count; this is D_R of the off-policy quadruple. Default 256 as
    released (256 x 16 = 4096 responses per step). Skywork-OR1 §3."""
    temperature: float = 1.0
    """Rollout sampling temperature, > 0. Default 1.0: the report finds tau=1.0 keeps entropy and
    learning signal higher than 0.6. The update's log-probs and entropy are of logits / tau,
    the sampling distribution, as in the released trainer. Skywork-OR1 §3 'High-Temperature
    Sampling'; docs/magic.md 'Temperature'."""
    top_p: float = 1.0
    """Rollout nucleus sampling mass, in (0, 1]. Default 1.0 (off), as released."""
    top_k: int = -1
    """Rollout top-k, -1 for off or >= 1. Default -1, as released."""
    max_prompt_length: int = 2048
    """Longest prompt in tokens. Default 2048 as released. A training problem with a longer
    prompt is dropped when the run starts (counted in the log), as the released recipe's data
    layer does; a held-out problem with one is an error naming it, before any model loads
    (an evaluation covers its whole set)."""
    # --- advantages and filtering ----------------------------------------------------------
    mask_mode: MaskMode = "none"
    """Advantage mask for truncated responses: 'none' (MAGIC: truncated responses keep their,
    usually negative, advantage), 'before' (left out of the group's mean/std, advantage 0),
    'after' (in the statistics, advantage 0). Default 'none': the report finds masking hurts
    token efficiency and later-stage scaling. Skywork-OR1 §3 'Advantage Mask for Truncated
    Responses'."""
    adv_eps: float = 1e-6
    """Epsilon added to the group std in A = (r - mean) / (std + eps), > 0. Default 1e-6 as in the
    released GRPO code."""
    online_filter: bool = True
    """Drop groups whose rewards are all equal (all 0 or all 1: zero advantage, no signal) before
    the update, without refilling the batch. Default True as released. Skywork-OR1 §3 data
    collection, online filtering / rejection sampling."""
    # --- policy loss -----------------------------------------------------------------------
    clip_low: float = 0.2
    """PPO ratio lower clip: ratio >= 1 - clip_low, in [0, 1). Default 0.2 as released. Skywork-OR1
    §3 'Loss Function'."""
    clip_high: float = 0.2
    """PPO ratio upper clip: ratio <= 1 + clip_high, >= 0. Default 0.2 as released; the report
    studies clip-higher, and 0.28 is DAPO's usual high value. Skywork-OR1 §4."""
    # --- entropy ---------------------------------------------------------------------------
    entropy_mode: EntropyMode = "adaptive"
    """'adaptive' (MAGIC's controller), 'fixed' (constant coefficient entropy_coef_init) or 'off'
    (no entropy bonus), the last two for ablations. Default 'adaptive'. Skywork-OR1 §3
    'Adaptive Entropy Control'."""
    entropy_target: float = 0.2
    """Target entropy, nats per token, >= 0. Default 0.2 as released: the bonus turns on only while
    measured entropy is below it."""
    entropy_delta: float = 1e-4
    """Per-step change of the entropy coefficient, >= 0. Default 1e-4 as released."""
    entropy_coef_min: float = 0.0
    """Lower clamp of the entropy coefficient, >= 0. Default 0 as released."""
    entropy_coef_max: float = 0.005
    """Upper clamp of the entropy coefficient. Default 0.005 as released: caps how hard the bonus
    can push. Rule: 0 <= coef_min <= coef_init <= coef_max."""
    entropy_coef_init: float = 0.0
    """Starting entropy coefficient (the constant one in 'fixed' mode). Default 0 as released."""
    # --- KL to a reference policy ---------------------------------------------------------
    kl_coef: float = 0.0
    """Coefficient beta of a KL loss to the reference (initial) policy, >= 0. Default 0: MAGIC keeps
    no reference model. Skywork-OR1 §3 'No KL Loss' (the KL ablation uses > 0). > 0 keeps a
    frozen copy of the initial policy (after any warm start) beside the trained one, in both
    backends, and logs losses/kl every step. Memory: one more copy of the weights per rank,
    parameters x 4 bytes (float32; 2 in DeepSpeed's bf16 mode), divided over the ranks under
    ZeRO-3, which shards it like the policy: 7B in bf16 is about 14 GiB on one rank, 1.8 GiB
    per rank over 8. Checked before anything loads against backend.reference_memory_gib
    (default: the free memory); a model that does not fit is refused with the numbers."""
    kl_estimator: KLEstimator = "k3"
    """KL estimator when kl_coef > 0: 'k1' = log(pi/pi_ref) or 'k3' = r - 1 - log r with r =
    pi_ref/pi (non-negative, low variance; GRPO's choice). Default 'k3'."""
    log_kl: bool = False
    """Keep the reference policy and log losses/kl (the estimator above, pi against the initial
    policy) even at kl_coef 0, where it is not in the loss. Default False: MAGIC keeps no
    reference. For ablations: it shows how far the policy moves when no KL binds it, at the
    reference's memory cost (as kl_coef > 0)."""
    # --- off-policy quadruple -------------------------------------------------------------
    mini_batch_size: int | None = None
    """D_T, prompts per optimizer step (a mini-batch holds whole groups); must divide
    prompts_per_step (D_R). Default None = prompts_per_step (on-policy, as released).
    Skywork-OR1 §3 'On-Policy Training', §4 off-policy ablation."""
    n_reuse: int = 1
    """N_reuse, passes (epochs) over each rollout batch, >= 1. Default 1 (on-policy)."""
    n_sgd: int | None = None
    """N_SGD, optimizer steps per rollout batch. Default None = derived as (D_R / D_T) * N_reuse; if
    given it must equal that."""
    # --- optimizer ------------------------------------------------------------------------
    lr: float = 1e-6
    """AdamW learning rate, constant, > 0. Default 1e-6 as released."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas, each in [0, 1). Default (0.9, 0.999) as released."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay, >= 0. Default 0.01 as released."""
    grad_clip: float = 1.0
    """Max global gradient norm, > 0. Default 1.0 as released."""
    # --- stages ---------------------------------------------------------------------------
    stages: tuple[Stage, ...] = field(default_factory=default_stages)
    """Training stages, each {name, max_response_length (tokens), steps and/or plateau {metric,
    patience, min_delta, mode}}; max_response_length strictly increasing; every stage but the
    last needs an end condition. Default 8K -> 16K -> 32K as released, moving on when
    eval/accuracy plateaus. Skywork-OR1 §3 'Multi-Stage Training'."""

    def __post_init__(self) -> None:
        coerce_fields(self, "magic")  # built from Python too: the same checks as from_dict's
        self._check()

    # -- cross-field rules --
    def _check(self) -> None:
        def need(ok: bool, rule: str) -> None:
            if not ok:
                raise ValueError(rule)

        need(self.group_size >= 2, "group_size must be >= 2: group advantages need a sample "
             f"std (n-1), got {self.group_size}")
        need(self.prompts_per_step >= 1, f"prompts_per_step must be >= 1, "
             f"got {self.prompts_per_step}")
        need(self.temperature > 0, f"temperature must be > 0, got {self.temperature}")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        need(self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 (off) or >= 1, "
             f"got {self.top_k}")
        need(self.max_prompt_length >= 1, f"max_prompt_length must be >= 1, "
             f"got {self.max_prompt_length}")
        need(self.adv_eps > 0, f"adv_eps must be > 0, got {self.adv_eps}")
        need(0 <= self.clip_low < 1, "clip_low must be in [0, 1) so that the lower ratio bound "
             f"1 - clip_low stays positive, got {self.clip_low}")
        need(self.clip_high >= 0, f"clip_high must be >= 0, got {self.clip_high}")
        check_entropy_settings(self.entropy_target, self.entropy_delta, self.entropy_coef_min,
                               self.entropy_coef_init, self.entropy_coef_max, self.entropy_mode)
        need(self.kl_coef >= 0, f"kl_coef must be >= 0, got {self.kl_coef}")
        d_t = self.mini_batch_size
        need(d_t is None or d_t >= 1, f"mini_batch_size (D_T) must be >= 1, got {d_t}")
        need(d_t is None or self.prompts_per_step % d_t == 0,
             f"mini_batch_size (D_T={d_t}) must divide prompts_per_step "
             f"(D_R={self.prompts_per_step})")
        need(self.n_reuse >= 1, f"n_reuse must be >= 1, got {self.n_reuse}")
        self.off_policy()  # N_SGD == (D_R / D_T) * N_reuse, with its own message
        need(self.lr > 0, f"lr must be > 0, got {self.lr}")
        need(all(0 <= b < 1 for b in self.betas), f"betas must each be in [0, 1), "
             f"got {self.betas}")
        need(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        need(self.grad_clip > 0, f"grad_clip must be > 0, got {self.grad_clip}")
        validate_stages(self.stages)

    # -- derived objects --
    @property
    def keeps_reference(self) -> bool:
        """Whether a run keeps the frozen reference policy: for the KL loss, or to log it."""
        return self.kl_coef > 0 or self.log_kl

    def off_policy(self) -> OffPolicyConfig:
        """The quadruple with D_R = prompts_per_step (prompts), D_T defaulting to D_R."""
        d_r = self.prompts_per_step
        d_t = d_r if self.mini_batch_size is None else self.mini_batch_size
        n_sgd = (d_r // d_t) * self.n_reuse if self.n_sgd is None else self.n_sgd
        return OffPolicyConfig(n_sgd=n_sgd, rollout_batch_size=d_r, mini_batch_size=d_t,
                               n_reuse=self.n_reuse)

    def stage_schedule(self) -> StageSchedule:
        """A fresh stage schedule over ``stages``."""
        return StageSchedule(self.stages)

    # -- plain data --
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MagicConfig:
        """Build from plain data (e.g. parsed YAML): ``stages`` as a list of dicts, ``betas``
        as a list. Numeric strings are accepted for float fields (YAML 1.1 reads ``1e-6``
        as a string).

        Raises:
            ValueError: naming unknown keys, a value of the wrong type, or a broken rule.
        """
        return build(cls, data, "magic")

    def to_dict(self) -> dict[str, Any]:
        """JSON/YAML-safe plain data; ``MagicConfig.from_dict(c.to_dict()) == c``."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "stages":
                value = [s.to_dict() for s in value]
            elif f.name == "betas":
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def field_help(cls) -> dict[str, str]:
        """Field name -> help text (unit, default and why, report section): the attribute
        docstrings."""
        return field_docs(cls)
