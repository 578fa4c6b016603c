"""The statistics behind ``trainer ablate``'s verdicts (pure Python and scipy; no torch, no I/O).

A check compares one number of a treatment variant against a baseline variant over seeds. The
runs are paired: seed k of both variants starts from the same policy and draws the same data
and sampling seeds, so the unit of evidence is the per-seed difference
``d_k = treatment_k - baseline_k``. Its mean and a two-sided 90% Student-t interval decide:

- "higher" / "lower": reproduced when the interval excludes 0 on the claim's side, not
  reproduced when it excludes 0 on the other side, inconclusive otherwise (each wrong call is a
  one-sided 5% test, so at no effect a check is decided, either way, 10% of the time);
- "similar" (within ``margin``): reproduced when the whole interval lies inside
  ``[-margin, +margin]`` (two one-sided tests at 5%, TOST), not reproduced when it lies wholly
  outside, inconclusive otherwise;
- "not_lower" (non-inferiority by ``margin``): reproduced when the interval lies above
  ``-margin`` (the treatment is at most ``margin`` worse, at one-sided 5%), not reproduced when
  it lies wholly below ``-margin``, inconclusive otherwise. For a claim of "the same result for
  less", where doing better is no failure.

The interval narrows as seeds are added (its half-width falls like t(n-1)/sqrt(n)), so power
grows with seeds; the rule it replaces (|mean difference| against the seeds' max - min range)
lost power as seeds were added. tests/test_ablation_stats.py checks both by simulation.

An ablation names a mechanism check and a benefit check (trainer/ablation/designs.py), each deciding
its own label at the plain level: they are two hypotheses, reported apart. The other checks are
secondary: Holm-corrected over their whole family (at the same one-sided 5%), reported, never
able to change a label. :func:`minimum_detectable_effect` and :func:`seeds_for_power` size a
pre-registered seed count (trainer/ablation/preregistration.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import mean, stdev
from typing import Literal

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
Expect = Literal["higher", "lower", "similar", "not_lower"]

LEVEL = 0.90
"""Two-sided confidence level of a check's interval (5% in each tail)."""
ALPHA = (1.0 - LEVEL) / 2
"""One-sided level of each directional decision."""


@dataclass(frozen=True)
class Paired:
    """Per-seed values of two variants matched by seed."""

    diffs: list[float]
    """treatment - baseline for each seed both sides have (in seed order)."""
    seeds: list[int]
    """The seeds of ``diffs``."""
    dropped: dict[int, str] = field(default_factory=dict)
    """seed -> why it is not in ``diffs`` (a side failed, was not run, or gave no value)."""


def pair_by_seed(baseline: Mapping[int, float | None],
                 treatment: Mapping[int, float | None]) -> Paired:
    """Match two variants' per-seed values by seed. A seed missing, or without a finite value,
    on either side drops the pair (and says why): averaging one side over seeds the other lacks
    would mix seed effects into the difference."""
    diffs, seeds, dropped = [], [], {}
    for seed in sorted(set(baseline) | set(treatment)):
        b, t = baseline.get(seed), treatment.get(seed)
        missing = [side for side, v in (("baseline", b), ("treatment", t)) if not _finite(v)]
        if missing:
            dropped[seed] = f"no value on the {' and '.join(missing)} side"
            continue
        diffs.append(float(t) - float(b))
        seeds.append(seed)
    return Paired(diffs, seeds, dropped)


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int
    p_above: float
    """One-sided p-value against "the true mean difference is <= 0" (small: it is above 0)."""
    p_below: float
    """One-sided p-value against ">= 0" (small: it is below 0)."""


def t_interval(diffs: Sequence[float], level: float = LEVEL) -> Interval:
    """Mean of ``diffs`` with its two-sided Student-t interval at ``level`` and the one-sided
    p-values of the paired t-test. Needs n >= 2. Zero spread (identical differences) gives a
    point interval, p 0 or 1 by the sign of the mean (0.5 both at 0)."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"a t interval needs at least 2 paired seeds, got {n}")
    m = mean(diffs)
    se = stdev(diffs) / math.sqrt(n)
    if se == 0.0:
        p_above = 0.0 if m > 0 else (0.5 if m == 0 else 1.0)
        p_below = 0.0 if m < 0 else (0.5 if m == 0 else 1.0)
        return Interval(m, m, m, n, p_above, p_below)
    # Imported here, not at the top: scipy is needed only to decide ablations, and every
    # `trainer` command imports this module through the CLI, including `trainer run` on GPU
    # machines whose images lack scipy (docs/gpu.md).
    from scipy import stats

    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * se
    t = m / se
    return Interval(m, m - half, m + half, n, float(stats.t.sf(t, n - 1)),
                    float(stats.t.cdf(t, n - 1)))


@dataclass(frozen=True)
class CheckResult:
    verdict: str
    mean: float | None
    """Mean paired difference, treatment - baseline (None when no seed is paired)."""
    low: float | None
    high: float | None
    """The 90% interval of the mean difference (None below 2 pairs)."""
    pairs: int
    p: float | None
    """The p-value that decides the check (the smaller one-sided p for a direction; the larger
    of TOST's two for "similar"); before any Holm correction."""
    reason: str
    seeds: list[int] = field(default_factory=list)
    diffs: list[float] = field(default_factory=list)
    dropped: dict[int, str] = field(default_factory=dict)


def check_verdict(paired: Paired, expect: Expect, margin: float = 0.0,
                  alpha: float = ALPHA) -> CheckResult:
    """One check's verdict from its paired differences (the rules of the module docstring;
    ``alpha`` is each one-sided test's level, lowered by :func:`holm` for secondary checks)."""
    base = dict(seeds=paired.seeds, diffs=paired.diffs, dropped=paired.dropped)
    n = len(paired.diffs)
    if n < 2:
        m = paired.diffs[0] if n else None
        return CheckResult(INCONCLUSIVE, m, None, None, n, None,
                           f"{n} paired seed{'s' if n != 1 else ''}: no interval", **base)
    if expect == "similar":
        return _similar(paired, margin, alpha, base)
    if expect == "not_lower":
        return _not_lower(paired, margin, alpha, base)
    ci = t_interval(paired.diffs, 1.0 - 2 * alpha)
    want_above = expect == "higher"
    p_claim, p_other = (ci.p_above, ci.p_below) if want_above else (ci.p_below, ci.p_above)
    where = f"{100 * (1 - 2 * alpha):.3g}% interval"
    if p_claim < alpha:
        verdict, why = REPRODUCED, f"{where} excludes 0, treatment {expect}"
    elif p_other < alpha:
        verdict, why = NOT_REPRODUCED, (f"{where} excludes 0 on the other side, treatment "
                                        f"{'lower' if want_above else 'higher'}")
    else:
        verdict, why = INCONCLUSIVE, f"{where} contains 0"
    return CheckResult(verdict, ci.mean, ci.low, ci.high, n, min(p_claim, p_other), why, **base)


def _similar(paired: Paired, margin: float, alpha: float, base: dict) -> CheckResult:
    """Equivalence within ``margin`` by two one-sided tests: the differences shifted by
    -margin must be below 0 and shifted by +margin above 0, each at ``alpha``."""
    if margin <= 0:
        raise ValueError(f"a 'similar' check needs a margin > 0, got {margin}")
    d = paired.diffs
    ci = t_interval(d, 1.0 - 2 * alpha)
    upper = t_interval([x - margin for x in d], 1.0 - 2 * alpha)  # H0: mean >= +margin
    lower = t_interval([x + margin for x in d], 1.0 - 2 * alpha)  # H0: mean <= -margin
    p_inside = max(upper.p_below, lower.p_above)
    p_outside = min(upper.p_above, lower.p_below)  # wholly beyond one of the margins
    where = f"{100 * (1 - 2 * alpha):.3g}% interval"
    if p_inside < alpha:
        verdict, why, p = REPRODUCED, f"{where} inside +-{margin:g}", p_inside
    elif p_outside < alpha:
        verdict, why, p = NOT_REPRODUCED, f"{where} wholly outside +-{margin:g}", p_outside
    else:
        verdict, why, p = INCONCLUSIVE, f"{where} crosses +-{margin:g}", min(p_inside,
                                                                                p_outside)
    return CheckResult(verdict, ci.mean, ci.low, ci.high, len(d), p, why, **base)


def _not_lower(paired: Paired, margin: float, alpha: float, base: dict) -> CheckResult:
    """Non-inferiority by ``margin``: the differences shifted by +margin must be above 0 at
    ``alpha`` (reproduced); below 0 at ``alpha`` is a decided shortfall (not reproduced)."""
    if margin <= 0:
        raise ValueError(f"a 'not_lower' check needs a margin > 0, got {margin}")
    d = paired.diffs
    ci = t_interval(d, 1.0 - 2 * alpha)
    shifted = t_interval([x + margin for x in d], 1.0 - 2 * alpha)  # H0: mean <= -margin
    where = f"{100 * (1 - 2 * alpha):.3g}% interval"
    if shifted.p_above < alpha:
        verdict, why = REPRODUCED, f"{where} above -{margin:g}"
    elif shifted.p_below < alpha:
        verdict, why = NOT_REPRODUCED, f"{where} wholly below -{margin:g}"
    else:
        verdict, why = INCONCLUSIVE, f"{where} crosses -{margin:g}"
    return CheckResult(verdict, ci.mean, ci.low, ci.high, len(d),
                       min(shifted.p_above, shifted.p_below), why, **base)


POWER = 0.80
"""The power a pre-registered seed count is sized for."""


def minimum_detectable_effect(sd: float, n: int, alpha: float = ALPHA,
                              power: float = POWER) -> float:
    """The smallest true mean difference a directional check finds with probability ``power``
    at ``n`` paired seeds whose differences have standard deviation ``sd``:
    (t(1 - alpha, n - 1) + t(power, n - 1)) x sd / sqrt(n), the usual approximation of the
    noncentral t (it errs a little on the large side at small n)."""
    if n < 2:
        raise ValueError(f"a minimum detectable effect needs at least 2 seeds, got {n}")
    from scipy import stats  # lazily, as in t_interval

    return float((stats.t.ppf(1 - alpha, n - 1) + stats.t.ppf(power, n - 1))
                 * sd / math.sqrt(n))


def check_power(expect: Expect) -> float:
    """The power each one-sided test of a check needs for the check to have :data:`POWER`: a
    "similar" check is decided by two (TOST), each at 90% when there is no true difference;
    any other by one."""
    return 0.90 if expect == "similar" else POWER


def detectable(expect: Expect, sd: float, n: int) -> float:
    """What ``n`` paired seeds with spread ``sd`` show 80% of the time: the minimum detectable
    effect of a direction or "not_lower"; for "similar" the narrowest margin TOST shows at no
    true difference."""
    return minimum_detectable_effect(sd, n, power=check_power(expect))


def seeds_for_power(sd: float, effect: float, alpha: float = ALPHA, power: float = POWER,
                    most: int = 200) -> int:
    """The fewest paired seeds (at least 3) at which :func:`minimum_detectable_effect` is at
    most ``effect``; ``most`` when even that many do not reach it."""
    if effect <= 0 or sd < 0:
        raise ValueError(f"seeds_for_power needs effect > 0 and sd >= 0, got {effect}, {sd}")
    for n in range(3, most + 1):
        if minimum_detectable_effect(sd, n, alpha, power) <= effect:
            return n
    return most


def holm(p_values: Sequence[float | None], alpha: float = ALPHA) -> list[float]:
    """Holm's step-down levels: the one-sided level each test of a family is decided at, so
    that the family's chance of any false call stays at ``alpha``. The test with the k-th
    smallest p (k from 0) of m gets alpha / (m - k), up to and including the first one that
    fails it; every later one gets 0 (Holm stops: it cannot be decided). None (no p-value)
    takes no place in the family and gets 0."""
    order = sorted((i for i, p in enumerate(p_values) if p is not None),
                   key=lambda i: p_values[i])
    m = len(order)
    levels = [0.0] * len(p_values)
    for k, i in enumerate(order):
        levels[i] = alpha / (m - k)
        if p_values[i] >= levels[i]:  # Holm stops here: later ones keep level 0
            break
    return levels


def secondary_verdicts(pairs: Sequence[tuple[Paired, Expect, float]]) -> list[CheckResult]:
    """The secondary checks of an ablation, decided under Holm's correction over their family:
    each check's p at the plain level first, then each re-decided at its Holm level (a check
    that Holm stops is inconclusive whatever its own p).

    The family is every secondary check that has a p-value, decided or not: leaving out the
    ones inconclusive before correction would filter the family by its outcome and raise the
    levels of the rest (with every check null, 5 secondaries and 6 seeds, 39% of runs then
    decided one; tests/test_ablation_stats.py holds the family-wise error at 10%)."""
    plain = [check_verdict(p, e, m) for p, e, m in pairs]
    levels = holm([r.p for r in plain])
    out = []
    for (p, e, m), r, level in zip(pairs, plain, levels):
        if r.verdict == INCONCLUSIVE:
            out.append(r)
        elif level == 0.0:
            out.append(_as_inconclusive(r, "Holm: an earlier secondary check was not decided"))
        else:
            holmed = check_verdict(p, e, m, alpha=level)
            out.append(holmed if holmed.verdict != INCONCLUSIVE else
                       _as_inconclusive(holmed, f"decided alone, not at Holm's level "
                                        f"{level:.3g}"))
    return out


def _as_inconclusive(r: CheckResult, why: str) -> CheckResult:
    return CheckResult(INCONCLUSIVE, r.mean, r.low, r.high, r.pairs, r.p, why, r.seeds,
                       r.diffs, r.dropped)


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
