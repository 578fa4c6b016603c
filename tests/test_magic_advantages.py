"""group_advantages and filter_groups: hand-computed values for every mode and edge case."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.magic.rules import filter_groups, group_advantages

EPS = 1e-6
F64 = torch.float64


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def b(values):
    return torch.tensor(values, dtype=torch.bool)


# --- mode "none" ---------------------------------------------------------------------------

def test_none_binary_group_uses_sample_std():
    # r = [1, 0, 0, 1]: mean 0.5; sample var = 4 * 0.25 / (4 - 1) = 1/3; std = 1/sqrt(3)
    # A = +-0.5 / (1/sqrt(3) + 1e-6)
    a = 0.5 / (1 / math.sqrt(3) + EPS)  # 0.866024...
    out = group_advantages(t([1, 0, 0, 1]), 4)
    assert torch.allclose(out, t([a, -a, -a, a]), rtol=0, atol=1e-12)
    # the population std (n) would give 0.5 / (0.5 + eps) = 0.999998: not what we compute
    assert not torch.allclose(out, t([1, -1, -1, 1]), atol=1e-3)


def test_none_continuous_rewards():
    # r = [0, 1, 2]: mean 1; sample var = (1 + 0 + 1) / 2 = 1; std 1 -> A = (r - 1) / (1 + 1e-6)
    out = group_advantages(t([0.0, 1.0, 2.0]), 3)
    assert torch.allclose(out, t([-1 / (1 + EPS), 0.0, 1 / (1 + EPS)]), rtol=0, atol=1e-15)


def test_groups_are_independent():
    # group 1 = [1, 0] : mean .5, var = 2 * .25 / 1 = .5, std = .70710678 -> +-.5 / (std + eps)
    # group 2 = [3, 3] : all equal -> 0
    a = 0.5 / (math.sqrt(0.5) + EPS)
    out = group_advantages(t([1, 0, 3, 3]), 2)
    assert torch.allclose(out, t([a, -a, 0, 0]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("rewards", [[1, 1, 1, 1], [0, 0, 0, 0], [0.1, 0.1, 0.1, 0.1],
                                     [-7.3, -7.3, -7.3, -7.3]])
@pytest.mark.parametrize("mode", ["none", "before", "after"])
def test_all_equal_group_is_exactly_zero(rewards, mode):
    # 0.1 * 4 / 4 != 0.1 in floating point; we still return exact zeros
    out = group_advantages(t(rewards), 4, truncated=b([0, 1, 0, 0]), mask_mode=mode)
    assert torch.equal(out, torch.zeros(4, dtype=F64))


def test_none_ignores_truncated_flags():
    a = 0.5 / (1 / math.sqrt(3) + EPS)
    out = group_advantages(t([1, 0, 0, 1]), 4, truncated=b([0, 1, 1, 0]), mask_mode="none")
    assert torch.allclose(out, t([a, -a, -a, a]), rtol=0, atol=1e-12)


# --- mode "before" -------------------------------------------------------------------------

def test_before_excludes_truncated_from_statistics():
    # r = [1, 0*, 0, 1] (* truncated): counted [1, 0, 1], mean 2/3,
    # sample var = ((1/3)^2 + (2/3)^2 + (1/3)^2) / 2 = (6/9) / 2 = 1/3, std = 1/sqrt(3)
    # A = [(1/3)/(std+eps), 0, -(2/3)/(std+eps), (1/3)/(std+eps)]
    s = 1 / math.sqrt(3) + EPS
    out = group_advantages(t([1, 0, 0, 1]), 4, truncated=b([0, 1, 0, 0]), mask_mode="before")
    assert torch.allclose(out, t([(1 / 3) / s, 0, -(2 / 3) / s, (1 / 3) / s]),
                          rtol=0, atol=1e-12)


def test_before_every_response_truncated_gives_zeros():
    out = group_advantages(t([1, 0, 0, 1]), 4, truncated=b([1, 1, 1, 1]), mask_mode="before")
    assert torch.equal(out, torch.zeros(4, dtype=F64))


def test_before_single_untruncated_response_gets_zero():
    # std over one sample is defined as 0 -> A = (r - r) / (0 + eps) = 0
    out = group_advantages(t([1, 0, 0, 0]), 4, truncated=b([0, 1, 1, 1]), mask_mode="before")
    assert torch.equal(out, torch.zeros(4, dtype=F64))


def test_before_mixed_groups():
    # group 1 all truncated -> 0; group 2 [1, 0, 1*] -> counted [1, 0]: mean .5, std sqrt(.5)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    out = group_advantages(t([1, 0, 1, 1, 0, 1]), 3, truncated=b([1, 1, 1, 0, 0, 1]),
                           mask_mode="before")
    assert torch.allclose(out, t([0, 0, 0, a, -a, 0]), rtol=0, atol=1e-12)


# --- mode "after" --------------------------------------------------------------------------

def test_after_keeps_truncated_in_statistics_but_zeroes_them():
    # same statistics as "none" (mean .5, std 1/sqrt 3); truncated response 1 gets 0
    a = 0.5 / (1 / math.sqrt(3) + EPS)
    out = group_advantages(t([1, 0, 0, 1]), 4, truncated=b([0, 1, 0, 0]), mask_mode="after")
    assert torch.allclose(out, t([a, 0, -a, a]), rtol=0, atol=1e-12)


def test_after_every_response_truncated_gives_zeros():
    out = group_advantages(t([1, 0, 0, 1]), 4, truncated=b([1, 1, 1, 1]), mask_mode="after")
    assert torch.equal(out, torch.zeros(4, dtype=F64))


def test_after_single_untruncated_response_keeps_group_statistics():
    # r = [1, 0*, 0*, 0*]: mean .25, var = (.75^2 + 3 * .25^2) / 3 = (.5625 + .1875) / 3 = .25
    # std .5 -> A_0 = .75 / (.5 + 1e-6); the rest are truncated -> 0
    out = group_advantages(t([1, 0, 0, 0]), 4, truncated=b([0, 1, 1, 1]), mask_mode="after")
    assert torch.allclose(out, t([0.75 / (0.5 + EPS), 0, 0, 0]), rtol=0, atol=1e-12)


# --- shapes, dtypes, errors ----------------------------------------------------------------

def test_group_size_one_gives_zeros():
    assert torch.equal(group_advantages(t([1, 0, 5]), 1), torch.zeros(3, dtype=F64))


def test_dtypes_and_inputs():
    out32 = group_advantages(torch.tensor([1.0, 0.0]), 2)
    assert out32.dtype == torch.float32
    out_int = group_advantages(torch.tensor([1, 0]), 2)  # ints -> default float dtype
    assert out_int.dtype == torch.get_default_dtype()
    out_list = group_advantages([1.0, 0.0], 2, truncated=[False, True], mask_mode="after")
    assert out_list[1] == 0 and out_list[0] > 0
    assert group_advantages(torch.zeros(0), 4).shape == (0,)


@pytest.mark.parametrize("kwargs, message", [
    (dict(rewards=t([1, 0, 1]), group_size=2), "must be a multiple of group_size"),
    (dict(rewards=t([1, 0]), group_size=0), "group_size must be an int >= 1"),
    (dict(rewards=t([[1, 0]]), group_size=2), "rewards must be 1-D"),
    (dict(rewards=t([1, float("nan")]), group_size=2), "rewards must be finite"),
    (dict(rewards=t([1, 0]), group_size=2, mask_mode="bogus"), "mask_mode must be one of"),
    (dict(rewards=t([1, 0]), group_size=2, mask_mode="before"), "needs the truncated flags"),
    (dict(rewards=t([1, 0]), group_size=2, truncated=b([1, 0, 0]), mask_mode="after"),
     "truncated must have the rewards' shape"),
    (dict(rewards=t([1, 0]), group_size=2, eps=0.0), "eps must be > 0"),
])
def test_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(**kwargs)


# --- filter_groups -------------------------------------------------------------------------

def test_filter_groups_hand_case():
    rewards = t([1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0])
    expected = b([0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0])
    assert torch.equal(filter_groups(rewards, 4), expected)


def test_filter_groups_edge_cases():
    assert torch.equal(filter_groups(t([0.5, 0.5000001]), 2), b([1, 1]))
    assert torch.equal(filter_groups(t([1, 0, 1]), 1), b([0, 0, 0]))  # size 1: never varies
    assert filter_groups(torch.zeros(0), 3).shape == (0,)
    with pytest.raises(ValueError, match=r"number of rewards \(5\) must be a multiple of "
                                         r"group_size \(2\)"):
        filter_groups(t([1, 0, 1, 0, 1]), 2)


# --- properties ----------------------------------------------------------------------------

groups_strategy = st.integers(2, 6).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.lists(st.one_of(st.sampled_from([0.0, 1.0]),
                                st.floats(-10, 10, allow_nan=False, width=32)),
                      min_size=n, max_size=n), min_size=1, max_size=5),
    st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=5, max_size=5),
))


@settings(max_examples=60, deadline=None)
@given(groups_strategy)
def test_property_modes(data):
    n, groups, truncs = data
    truncs = truncs[:len(groups)]
    rewards = t([r for g in groups for r in g])
    trunc = b([x for g in truncs for x in g])
    none = group_advantages(rewards, n).view(-1, n)
    after = group_advantages(rewards, n, trunc, "after").view(-1, n)
    before = group_advantages(rewards, n, trunc, "before").view(-1, n)
    keep = filter_groups(rewards, n).view(-1, n)
    tr = trunc.view(-1, n)
    for i in range(len(groups)):
        g = rewards.view(-1, n)[i]
        # filter mask is constant within a group and True iff the group is not constant
        assert keep[i].all() == keep[i].any() == bool(g.max() != g.min())
        if keep[i].any():
            # non-degenerate group: mean 0 and sample std = std / (std + eps) ~ 1
            assert abs(float(none[i].mean())) < 1e-9
            std = float(g.std())
            assert abs(float(none[i].std()) - std / (std + EPS)) < 1e-9
        else:
            assert torch.equal(none[i], torch.zeros(n, dtype=F64))
        # "after": the "none" values on untruncated responses, 0 on truncated
        assert torch.equal(after[i], torch.where(tr[i], 0.0, none[i]))
        # "before": untruncated responses standardised among themselves, truncated 0
        kept = g[~tr[i]]
        sub = group_advantages(kept, max(len(kept), 1)) if len(kept) else kept
        assert torch.allclose(before[i][~tr[i]], sub, atol=1e-12)
        assert torch.equal(before[i][tr[i]], torch.zeros(int(tr[i].sum()), dtype=F64))
