"""The Skywork-OR1 ablations that ``trainer ablate`` measures on the toy world: each one's claim,
its variants (``key=value`` overrides of ``trainer run``'s config), the profiles, and the pure
rules that turn measured numbers into a verdict. No torch, no I/O: the driver is
trainer/ablate.py. MAGIC's rules and knobs: docs/magic.md.

A claim is split into checks. A check compares one number (a key of :func:`final_numbers`) of a
treatment variant against a baseline variant over the seeds, and its verdict rests on a stated
statistic (:func:`check_verdict`): the difference of the seeds' means against the seeds' spread.
The ablation's verdict combines its checks' (:func:`combine`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import mean
from typing import Any, Literal

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
Expect = Literal["higher", "lower", "similar"]

WINDOW = 10
"""Steps averaged for a run's "final" per-step numbers (entropy, length, truncation): one
step's value is noisy, the last WINDOW steps' mean is not."""


# -- verdict rules -----------------------------------------------------------------------------

def seed_spread(values: Sequence[float]) -> float:
    """The seeds' spread of one variant: max - min of its per-seed values (0 for one seed)."""
    return max(values) - min(values) if values else 0.0


@dataclass(frozen=True)
class CheckResult:
    verdict: str
    diff: float | None
    """mean(treatment) - mean(baseline) over the seeds (None when a side has no values)."""
    spread: float | None
    """The larger of the two variants' seed spreads (max - min over seeds)."""
    seeds: int
    """Seeds on the side with fewer."""
    reason: str


def check_verdict(baseline: Sequence[float], treatment: Sequence[float], expect: Expect,
                  margin: float = 0.0) -> CheckResult:
    """The verdict of one check from per-seed values.

    Statistic: d = mean(treatment) - mean(baseline); spread s = max of the two variants' seed
    spreads (max - min). Rules:

    - fewer than 2 seeds on either side (no spread to compare with): inconclusive;
    - "higher" / "lower": |d| <= s (the difference is within the seeds' spread): inconclusive;
      otherwise reproduced if d has the expected sign, else not reproduced;
    - "similar" (the claim is "no worse than, within ``margin``"): |d| + s <= margin:
      reproduced; |d| - s > margin: not reproduced; otherwise inconclusive.
    """
    base = [float(v) for v in baseline if _finite(v)]
    treat = [float(v) for v in treatment if _finite(v)]
    n = min(len(base), len(treat))
    if not base or not treat:
        return CheckResult(INCONCLUSIVE, None, None, n, "no values (a variant failed or was "
                           "not run)")
    d = mean(treat) - mean(base)
    s = max(seed_spread(base), seed_spread(treat))
    if n < 2:
        return CheckResult(INCONCLUSIVE, d, s, n, "one seed: no spread to compare with")
    if expect == "similar":
        if abs(d) + s <= margin:
            return CheckResult(REPRODUCED, d, s, n, f"|d| + spread <= margin {margin:g}")
        if abs(d) - s > margin:
            return CheckResult(NOT_REPRODUCED, d, s, n, f"|d| - spread > margin {margin:g}")
        return CheckResult(INCONCLUSIVE, d, s, n, f"margin {margin:g} within |d| +- spread")
    if abs(d) <= s:
        return CheckResult(INCONCLUSIVE, d, s, n, "|d| <= the seeds' spread")
    agrees = d > 0 if expect == "higher" else d < 0
    return CheckResult(REPRODUCED if agrees else NOT_REPRODUCED, d, s, n,
                       f"|d| > spread, treatment {'higher' if d > 0 else 'lower'}")


def combine(verdicts: Sequence[str]) -> str:
    """An ablation's verdict from its checks': a claim holds only as a whole, so any check that
    did not reproduce makes it "not reproduced"; all reproduced make it "reproduced"; otherwise
    (some inconclusive, or no checks) it is "inconclusive"."""
    if any(v == NOT_REPRODUCED for v in verdicts):
        return NOT_REPRODUCED
    if verdicts and all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    return INCONCLUSIVE


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# -- a run's numbers ---------------------------------------------------------------------------

def final_numbers(rows: Sequence[dict], entropy_target: float | None = None,
                  window: int = WINDOW) -> dict[str, float | None]:
    """The numbers a run ends with, from its metrics.jsonl rows (keys as the trainer logs them):

    - ``eval/accuracy``: the last held-out accuracy; ``eval/accuracy_best``: the best one;
    - ``eval/last_stage_gain``: last accuracy minus the last one measured before the final
      stage began (None for a one-stage run);
    - ``entropy``, ``response_length/mean``, ``truncated/frac``, ``reward/mean``: means over
      the last ``window`` steps (steps without an update log no entropy and are skipped);
    - ``reward/non_truncated``: training accuracy on responses that were not truncated, over
      the same steps, as reward/mean / (1 - truncated/frac) (exact when a truncated response
      earns 0, as every cut toy-world response does: it has no answer);
    - ``entropy/gap``: |entropy - entropy_target| (when the target is given);
    - ``tokens``: response tokens generated for training, the sum over steps of
      response_length/mean x rollout/responses;
    - ``steps``: the last step.
    """
    steps = [r for r in rows if "reward/mean" in r]
    evals = [r for r in rows if _finite(r.get("eval/accuracy"))]
    out: dict[str, float | None] = {}
    out["eval/accuracy"] = evals[-1]["eval/accuracy"] if evals else None
    out["eval/accuracy_best"] = max(r["eval/accuracy"] for r in evals) if evals else None
    last_stage = steps[-1].get("stage", 0) if steps else 0
    before = [r for r in evals if r.get("stage", 0) < last_stage]
    out["eval/last_stage_gain"] = (out["eval/accuracy"] - before[-1]["eval/accuracy"]
                                   if before and out["eval/accuracy"] is not None else None)
    tail = steps[-window:]

    def tail_mean(key: str) -> float | None:
        vals = [r[key] for r in tail if _finite(r.get(key))]
        return mean(vals) if vals else None

    for key in ("entropy", "response_length/mean", "truncated/frac", "reward/mean"):
        out[key] = tail_mean(key)
    ratios = [r["reward/mean"] / (1.0 - r["truncated/frac"]) for r in tail
              if _finite(r.get("reward/mean")) and _finite(r.get("truncated/frac"))
              and r["truncated/frac"] < 1.0]
    out["reward/non_truncated"] = mean(ratios) if ratios else None
    out["entropy/gap"] = (abs(out["entropy"] - entropy_target)
                          if entropy_target is not None and out["entropy"] is not None else None)
    out["tokens"] = float(sum(r["response_length/mean"] * r.get("rollout/responses", 0)
                              for r in steps if _finite(r.get("response_length/mean"))))
    out["steps"] = steps[-1]["step"] if steps else 0
    return out


# -- the ablations -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict[str, str]
    """Dotted ``key=value`` overrides of ``trainer run``'s config, as strings."""
    quadruple: tuple[str, str, str, str] | None = None
    """(N_SGD, D_R, D_T, N_reuse) as the report writes it (off-policy only)."""
    full_only: bool = False
    """Left out of ``--profile quick``."""


@dataclass(frozen=True)
class Check:
    """One measurable part of the claim: ``metric`` of ``treatment`` against ``baseline``."""

    metric: str
    baseline: str
    treatment: str
    expect: Expect
    margin: float = 0.0
    """For "similar": the largest difference that still counts as similar."""

    def describe(self) -> str:
        if self.expect == "similar":
            return (f"{self.metric}: {self.treatment} within {self.margin:g} of "
                    f"{self.baseline}")
        return f"{self.metric}: {self.treatment} {self.expect} than {self.baseline}"


@dataclass(frozen=True)
class Ablation:
    name: str
    claim: str
    variants: tuple[Variant, ...]
    checks: tuple[Check, ...]
    setup: dict[str, str] = field(default_factory=dict)
    """Overrides shared by every variant (before the variant's own)."""
    notes: str = ""
    """What the toy world or the config cannot do for this claim, and setup choices."""

    def variants_for(self, profile: str) -> tuple[Variant, ...]:
        return tuple(v for v in self.variants if profile == "full" or not v.full_only)

    def checks_for(self, variants: Sequence[str]) -> tuple[Check, ...]:
        """The checks whose two variants are both among ``variants``."""
        names = set(variants)
        return tuple(c for c in self.checks if {c.baseline, c.treatment} <= names)


@dataclass(frozen=True)
class Profile:
    name: str
    seeds: int
    overrides: tuple[str, ...]
    """Applied to trainer/configs/demo.yaml for every run of every ablation."""
    about: str


ONE_STAGE = "[{name: long, max_response_length: 88}]"
PROFILES = {
    # 60 steps (20 at 48 tokens, 40 at 88), evaluation every 20 steps on 100 problems x 2.
    "quick": Profile("quick", 2, (
        "total_steps=60", "checkpoint_every=0", "eval.every_steps=20", "eval.n_samples=2",
        "eval.max_problems=100", "log.tensorboard=false", "log.samples_every=20",
        ("magic.stages=[{name: short, max_response_length: 48, steps: 20}, "
        "{name: long, max_response_length: 88}]")),
        "2 seeds, 60 steps (20 at 48 tokens, then 88), held-out avg@2 on 100 problems every "
        "20 steps; fewer variants for some ablations"),
    # The demo's own schedule: 160 steps (60 at 48 tokens, 100 at 88), avg@4 on 200 problems.
    "full": Profile("full", 3, ("checkpoint_every=0", "log.tensorboard=false"),
                    "3 seeds, the demo's 160 steps (60 at 48 tokens, 100 at 88), held-out "
                    "avg@4 on 200 problems every 20 steps; every variant"),
}

NO_ENTROPY = {"magic.entropy_mode": "off"}
_NO_ENTROPY_NOTE = ("Every variant runs without the entropy bonus (magic.entropy_mode=off): "
                    "the adaptive controller exists to undo entropy collapse and would hide "
                    "the effect measured here.")


def _off_policy() -> Ablation:
    variants = (
        Variant("on-policy", {}, ("1", "D", "D", "1")),
        Variant("nsgd2-mb", {"magic.mini_batch_size": "8"}, ("2", "D", "D/2", "1"),
                full_only=True),
        Variant("nsgd2-reuse", {"magic.n_reuse": "2"}, ("2", "D", "D", "2"), full_only=True),
        Variant("nsgd4-mb", {"magic.mini_batch_size": "4"}, ("4", "D", "D/4", "1")),
        Variant("nsgd4-reuse", {"magic.n_reuse": "4"}, ("4", "D", "D", "4")),
    )
    checks = tuple(c for v in variants[1:] for c in (
        Check("entropy", "on-policy", v.name, "lower"),
        Check("eval/accuracy", "on-policy", v.name, "lower")))
    return Ablation(
        "off-policy",
        "More SGD steps per rollout batch (N_SGD >= 2, by smaller mini-batches or by reusing "
        "the batch) collapses entropy faster and hurts test accuracy (Skywork-OR1 §4, the "
        "off-policy update ablation over (N_SGD, D_R, D_T, N_reuse)).",
        variants, checks, setup=dict(NO_ENTROPY),
        notes="D = D_R = magic.prompts_per_step = 16 prompts (x 8 samples); D_T is "
              "magic.mini_batch_size, N_reuse magic.n_reuse. " + _NO_ENTROPY_NOTE)


ABLATIONS: dict[str, Ablation] = {a.name: a for a in (
    _off_policy(),
    Ablation(
        "temperature",
        "Sampling at temperature 1.0 keeps entropy higher than 0.6 and learns better later "
        "(Skywork-OR1 §4, high-temperature sampling).",
        (Variant("t0.6", {"magic.temperature": "0.6"}),
         Variant("t1.0", {"magic.temperature": "1.0"})),
        (Check("entropy", "t0.6", "t1.0", "higher"),
         Check("eval/accuracy", "t0.6", "t1.0", "higher")),
        setup=dict(NO_ENTROPY),
        notes=_NO_ENTROPY_NOTE + " Held-out accuracy is sampled at 0.6 for both. The "
              "entropy is that of each run's sampling distribution (logits / tau, "
              "docs/magic.md 'Temperature'), as the released trainer logs it; so part of 0.6's "
              "lower entropy is by construction (the same weights sampled at 0.6 give a "
              "sharper distribution), and the accuracy check is the one that does not lean on "
              "it."),
    Ablation(
        "entropy-control",
        "Adaptive entropy control holds entropy near its target; without it entropy "
        "collapses; a fixed coefficient is sensitive to the data (Skywork-OR1 §3-4, adaptive "
        "entropy control).",
        (Variant("adaptive", {"magic.entropy_mode": "adaptive"}),
         Variant("off", {"magic.entropy_mode": "off"}),
         Variant("fixed", {"magic.entropy_mode": "fixed", "magic.entropy_coef_init": "0.005"})),
        (Check("entropy", "adaptive", "off", "lower"),
         Check("entropy/gap", "adaptive", "fixed", "higher")),
        setup={"magic.entropy_target": "0.08", "magic.entropy_delta": "0.0005"},
        notes="The target is 0.08 nats per token (the demo's 0.06 is reached only after ~120 "
              "steps) and the coefficient moves by 5e-4 per step, so that the controller acts "
              "within the budget; the fixed coefficient is the controller's maximum, 0.005. "
              "'Sensitive to the data' needs several data sets: the toy world has one, so the "
              "check is only that the fixed coefficient ends farther from the target than the "
              "adaptive one (entropy/gap = |entropy - target|)."),
    Ablation(
        "kl",
        "A KL loss to the reference policy pulls the policy back and stalls learning in the "
        "later stage (Skywork-OR1 §4, KL loss ablation).",
        (Variant("beta0", {"magic.kl_coef": "0"}),
         Variant("beta0.01", {"magic.kl_coef": "0.01"}),
         Variant("beta0.001", {"magic.kl_coef": "0.001"}, full_only=True)),
        (Check("eval/last_stage_gain", "beta0", "beta0.01", "lower"),
         Check("eval/accuracy", "beta0", "beta0.01", "lower"),
         Check("eval/last_stage_gain", "beta0", "beta0.001", "lower")),
        notes="The reference is the warm-started policy; k3 estimator. The 'later stage' is "
              "the last one: eval/last_stage_gain is the held-out accuracy gained during it."),
    Ablation(
        "adv-mask",
        "Masking the advantages of truncated responses 'before' the group statistics raises "
        "accuracy on non-truncated responses but lowers it overall; no mask ('none') is the "
        "most token-efficient (Skywork-OR1 §4, advantage mask for truncated responses).",
        (Variant("none", {"magic.mask_mode": "none"}),
         Variant("before", {"magic.mask_mode": "before"}),
         Variant("after", {"magic.mask_mode": "after"})),
        (Check("reward/non_truncated", "none", "before", "higher"),
         Check("eval/accuracy", "none", "before", "lower"),
         Check("tokens", "none", "before", "higher"),
         Check("tokens", "none", "after", "higher")),
        notes="Accuracy on non-truncated responses is the training reward over the last 10 "
              "steps divided by the non-truncated share. Token efficiency: the same steps "
              "cost more response tokens with a mask (tokens = training response tokens)."),
    Ablation(
        "clip-higher",
        "A higher upper clip (0.28 against 0.2) slows entropy decay (Skywork-OR1 §4, "
        "clip-higher).",
        (Variant("clip0.2", {"magic.clip_high": "0.2"}),
         Variant("clip0.28", {"magic.clip_high": "0.28"})),
        (Check("entropy", "clip0.2", "clip0.28", "higher"),),
        setup={**NO_ENTROPY, "magic.mini_batch_size": "4"},
        notes="Both variants update off-policy, (N_SGD, D_R, D_T, N_reuse) = (4, 16, 4, 1): "
              "on-policy (N_SGD = 1) the importance ratio is exactly 1 at the only optimizer "
              "step of a batch, so no clip ever acts (a quick run on-policy gave clip 0.2 the "
              "same numbers as 0.28, bit for bit). " + _NO_ENTROPY_NOTE),
    Ablation(
        "group-size",
        "A larger group (more samples per prompt) is better at equal steps (Skywork-OR1 §4).",
        (Variant("g4", {"magic.group_size": "4"}),
         Variant("g8", {"magic.group_size": "8"}),
         Variant("g16", {"magic.group_size": "16"}, full_only=True)),
        (Check("eval/accuracy", "g4", "g8", "higher"),
         Check("eval/accuracy", "g8", "g16", "higher")),
        notes="Equal steps, not equal compute: a larger group generates more tokens."),
    Ablation(
        "batch-size",
        "A larger rollout batch (more prompts per step) is better at equal steps "
        "(Skywork-OR1 §4).",
        (Variant("b8", {"magic.prompts_per_step": "8"}),
         Variant("b16", {"magic.prompts_per_step": "16"}),
         Variant("b32", {"magic.prompts_per_step": "32"}, full_only=True)),
        (Check("eval/accuracy", "b8", "b16", "higher"),
         Check("eval/accuracy", "b16", "b32", "higher")),
        notes="On-policy (D_T = D_R); equal steps, not equal compute."),
    Ablation(
        "multi-stage",
        "Training in stages of growing context length reaches similar accuracy to one long "
        "stage with fewer tokens (Skywork-OR1 §3-4, multi-stage training).",
        (Variant("one-stage", {"magic.stages": ONE_STAGE}),
         Variant("staged", {})),
        (Check("eval/accuracy", "one-stage", "staged", "similar", margin=0.05),
         Check("tokens", "one-stage", "staged", "lower")),
        notes="'staged' is the profile's schedule (48 tokens, then 88); 'one-stage' runs all "
              "steps at 88. Similar: within 5 points of held-out accuracy."),
)}
