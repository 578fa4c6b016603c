"""The statistic behind `trainer ablate`'s verdicts (trainer/ablation/stats.py), tested by
simulation with fixed seeds: how often it decides when there is no effect, how often it finds an
effect of 2 per-seed standard deviations at the profile's seed count, and that its power grows
with seeds. The rule it replaced (|mean difference| against the seeds' max - min range) is
re-stated here and must fail the same simulation: the test can tell a bad statistic."""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import mean

import numpy as np
import pytest

from trainer.ablation.stats import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Paired,
    check_verdict,
    holm,
    minimum_detectable_effect,
    pair_by_seed,
    secondary_verdicts,
    seeds_for_power,
    t_interval,
)
from trainer.ablation.designs import PROFILES

SIMS = 3000
# Monte Carlo slack on a rate near 10% over SIMS draws: 3 standard errors.
SLACK = 3 * math.sqrt(0.1 * 0.9 / SIMS)

Rule = Callable[[list[float], list[float]], str]


def new_rule(base: list[float], treat: list[float]) -> str:
    paired = pair_by_seed(dict(enumerate(base)), dict(enumerate(treat)))
    return check_verdict(paired, "higher").verdict


def old_rule(base: list[float], treat: list[float]) -> str:
    """The replaced rule, as it was (trainer/ablation/designs.py before this change): decided when
    |mean(t) - mean(b)| exceeds the larger of the two variants' max - min over seeds."""
    d = mean(treat) - mean(base)
    spread = max(max(base) - min(base), max(treat) - min(treat))
    if abs(d) <= spread:
        return INCONCLUSIVE
    return REPRODUCED if d > 0 else NOT_REPRODUCED


def rates(rule: Rule, seeds: int, effect: float, sims: int = SIMS,
          rng_seed: int = 0) -> dict[str, float]:
    """Verdict frequencies of a "higher" check when each variant's per-seed value is normal
    with sd 1, the treatment's mean ``effect`` above the baseline's, independent across the
    two sides (no pairing benefit assumed: the worst case for the paired statistic)."""
    rng = np.random.default_rng(rng_seed)
    base = rng.normal(0.0, 1.0, size=(sims, seeds))
    treat = rng.normal(effect, 1.0, size=(sims, seeds))
    counts = {REPRODUCED: 0, NOT_REPRODUCED: 0, INCONCLUSIVE: 0}
    for b, t in zip(base.tolist(), treat.tolist()):
        counts[rule(b, t)] += 1
    return {k: v / sims for k, v in counts.items()}


SEED_COUNTS = (2, 3, 4, 6, 8, 10)


def power_curve(rule: Rule) -> list[float]:
    return [rates(rule, n, 2.0, sims=1000, rng_seed=n)[REPRODUCED] for n in SEED_COUNTS]


def meets_the_goals(rule: Rule) -> list[str]:
    """What a rule gets wrong against the goals set for it (empty: all met)."""
    failures = []
    for n in SEED_COUNTS:
        r = rates(rule, n, 0.0, rng_seed=100 + n)
        decided = r[REPRODUCED] + r[NOT_REPRODUCED]
        if decided > 0.10 + SLACK:
            failures.append(f"no effect, {n} seeds: decided {decided:.1%} of the time")
    seeds = PROFILES["full"].seeds
    right = rates(rule, seeds, 2.0, rng_seed=7)[REPRODUCED]
    if right < 0.80:
        failures.append(f"effect 2 sd, {seeds} seeds: right {right:.1%} of the time")
    curve = power_curve(rule)
    for (n0, p0), (n1, p1) in zip(zip(SEED_COUNTS, curve), zip(SEED_COUNTS[1:], curve[1:])):
        if p1 < p0 - 0.03:  # 3 points of Monte Carlo slack at 1,000 draws
            failures.append(f"power falls from {p0:.1%} at {n0} seeds to {p1:.1%} at {n1}")
    return failures


def test_the_paired_interval_meets_the_goals() -> None:
    assert meets_the_goals(new_rule) == []


def test_the_replaced_spread_rule_fails_the_same_goals() -> None:
    failures = meets_the_goals(old_rule)
    assert any("power falls" in f for f in failures), failures
    assert any("no effect, 2 seeds" in f for f in failures), failures
    assert any("effect 2 sd" in f for f in failures), failures


def test_at_no_effect_each_wrong_call_is_a_one_sided_five_percent() -> None:
    r = rates(new_rule, 6, 0.0, rng_seed=11)
    assert r[REPRODUCED] == pytest.approx(0.05, abs=SLACK)
    assert r[NOT_REPRODUCED] == pytest.approx(0.05, abs=SLACK)


def test_an_effect_against_the_claim_is_not_reproduced() -> None:
    r = rates(new_rule, PROFILES["full"].seeds, -2.0, rng_seed=12)
    assert r[NOT_REPRODUCED] >= 0.80
    assert r[REPRODUCED] < 0.01


def test_similar_is_an_equivalence_test() -> None:
    rng = np.random.default_rng(3)
    seeds, margin = 6, 2.0
    inside = outside = 0
    for _ in range(1000):
        same = rng.normal(0.0, 0.5, seeds).tolist()  # no difference, sd 0.5 per pair
        if check_verdict(Paired(same, list(range(seeds))), "similar", margin).verdict \
                == REPRODUCED:
            inside += 1
        at_margin = rng.normal(margin, 0.5, seeds).tolist()  # exactly at the margin
        if check_verdict(Paired(at_margin, list(range(seeds))), "similar", margin).verdict \
                == REPRODUCED:
            outside += 1
    assert inside / 1000 >= 0.95
    assert outside / 1000 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 1000)
    far = check_verdict(Paired([5.0, 5.5, 4.8], [0, 1, 2]), "similar", 1.0)
    assert far.verdict == NOT_REPRODUCED
    with pytest.raises(ValueError, match="margin > 0"):
        check_verdict(Paired([0.0, 0.1], [0, 1]), "similar", 0.0)


def test_pairs_are_matched_by_seed_and_a_missing_side_drops_the_pair() -> None:
    p = pair_by_seed({0: 1.0, 1: 2.0, 2: 3.0, 4: 5.0},
                     {0: 1.5, 1: None, 2: 4.0, 3: 9.0, 4: float("nan")})
    assert p.seeds == [0, 2]
    assert p.diffs == [0.5, 1.0]
    assert set(p.dropped) == {1, 3, 4}
    assert "treatment" in p.dropped[1] and "baseline" in p.dropped[3]
    r = check_verdict(p, "higher")
    assert r.pairs == 2 and r.dropped == p.dropped


def test_fewer_than_two_pairs_is_inconclusive_with_the_reason() -> None:
    r = check_verdict(Paired([0.3], [0]), "higher")
    assert r.verdict == INCONCLUSIVE and r.mean == 0.3 and r.low is None
    assert "1 paired seed" in r.reason
    assert check_verdict(Paired([], []), "lower").mean is None


def test_t_interval_matches_the_textbook() -> None:
    ci = t_interval([1.0, 2.0, 3.0, 4.0])
    # mean 2.5, sd 1.2910, se 0.6455, t(3, 0.95) = 2.3534
    assert ci.mean == 2.5
    assert ci.low == pytest.approx(2.5 - 2.3534 * 0.6455, abs=1e-3)
    assert ci.high == pytest.approx(2.5 + 2.3534 * 0.6455, abs=1e-3)
    assert ci.p_above + ci.p_below == pytest.approx(1.0)
    flat = t_interval([0.2, 0.2, 0.2])
    assert (flat.low, flat.high, flat.p_above) == (0.2, 0.2, 0.0)


def test_holm_steps_down_and_stops_at_the_first_failure() -> None:
    levels = holm([0.001, 0.04, 0.02, None], alpha=0.05)
    assert levels[0] == pytest.approx(0.05 / 3)
    assert levels[2] == pytest.approx(0.05 / 2)
    assert levels[1] == pytest.approx(0.05 / 1)
    assert levels[3] == 0.0
    stopped = holm([0.001, 0.04, 0.03], alpha=0.05)  # 0.03 fails 0.025: Holm stops there
    assert stopped[2] == pytest.approx(0.025) and stopped[1] == 0.0


def test_a_secondary_check_decided_alone_can_be_undecided_under_holm() -> None:
    clear = Paired([1.0, 1.1, 0.9, 1.05, 0.95, 1.0], list(range(6)))
    weak = Paired([0.9, -0.1, 0.8, 0.2, 0.7, 0.1], list(range(6)))  # one-sided p ~ 0.02
    alone = check_verdict(weak, "higher")
    assert alone.verdict == REPRODUCED and 0.0125 < alone.p < 0.05
    family = secondary_verdicts([(clear, "higher", 0.0)] + [(weak, "higher", 0.0)] * 3)
    assert family[0].verdict == REPRODUCED
    assert all(r.verdict == INCONCLUSIVE for r in family[1:])
    assert "Holm" in family[1].reason


def family_wise_error(secondaries: int, seeds: int = 6, sims: int = 2000,
                      rng_seed: int = 0) -> float:
    """How often a family of ``secondaries`` "higher" checks, every one null (per-seed
    differences normal, mean 0, sd 1, independent), decides at least one of them, either way."""
    rng = np.random.default_rng(rng_seed)
    any_decided = 0
    for draws in rng.normal(0.0, 1.0, size=(sims, secondaries, seeds)).tolist():
        family = secondary_verdicts([(Paired(d, list(range(seeds))), "higher", 0.0)
                                     for d in draws])
        any_decided += any(r.verdict != INCONCLUSIVE for r in family)
    return any_decided / sims


@pytest.mark.parametrize("secondaries", [2, 3, 5])
def test_holm_holds_the_family_wise_error_under_nulls(secondaries: int) -> None:
    """Every secondary's p takes its place in Holm's family, decided alone or not. With the
    family filtered by outcome (only checks decided before correction in it), 5 null
    secondaries at 6 seeds decided one in about 39% of runs; Holm done right: at most the two
    one-sided 5% tails, 10%."""
    rate = family_wise_error(secondaries, rng_seed=secondaries)
    assert rate <= 0.10 + 3 * math.sqrt(0.1 * 0.9 / 2000), rate


def test_not_lower_is_a_non_inferiority_test() -> None:
    """Reproduced when the interval lies above -margin (better counts too), not reproduced when
    wholly below it, inconclusive when it crosses; at the margin's edge it is decided as
    reproduced at most 5% of the time."""
    seeds = list(range(6))
    better = check_verdict(Paired([0.05, 0.06, 0.04, 0.05, 0.07, 0.05], seeds), "not_lower", 0.02)
    assert better.verdict == REPRODUCED
    worse = check_verdict(Paired([-0.05, -0.04, -0.06, -0.05, -0.045, -0.055], seeds),
                          "not_lower", 0.02)
    assert worse.verdict == NOT_REPRODUCED and "wholly below -0.02" in worse.reason
    wide = check_verdict(Paired([-0.05, 0.04, -0.03, 0.02, 0.0, -0.04], seeds), "not_lower",
                         0.02)
    assert wide.verdict == INCONCLUSIVE
    rng = np.random.default_rng(5)
    at_edge = sum(check_verdict(Paired(rng.normal(-0.02, 0.01, 6).tolist(), seeds),
                                "not_lower", 0.02).verdict == REPRODUCED for _ in range(1000))
    assert at_edge / 1000 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 1000)
    with pytest.raises(ValueError, match="margin > 0"):
        check_verdict(Paired([0.0, 0.1], [0, 1]), "not_lower", 0.0)


def test_the_minimum_detectable_effect_is_found_80_percent_of_the_time() -> None:
    """minimum_detectable_effect and seeds_for_power agree with simulation: a true effect of the
    MDE is found (reproduced) about 80% of the time (the approximation errs high: at least
    78%)."""
    n, sd = 6, 1.0
    mde = minimum_detectable_effect(sd, n)
    rng = np.random.default_rng(9)
    found = sum(check_verdict(Paired(rng.normal(mde, sd, n).tolist(), list(range(n))),
                              "higher").verdict == REPRODUCED for _ in range(2000)) / 2000
    assert 0.78 <= found <= 0.90, found
    assert seeds_for_power(sd, mde) == n
    assert seeds_for_power(sd, 10 * mde) == 3 and seeds_for_power(sd, 1e-6, most=50) == 50
