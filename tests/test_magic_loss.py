"""policy_loss, masked_mean, kl_penalty/kl_loss, entropy_loss, magic_loss: exact values."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.magic.rules import (
    entropy_loss,
    kl_loss,
    kl_penalty,
    magic_loss,
    masked_mean,
    merge_metrics,
    policy_loss,
    sampled_entropy,
)

F64 = torch.float64
LN2 = math.log(2.0)


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def logp_for_ratios(ratios):
    """logprobs with old_logprobs = 0, so ratio = exp(logprobs) = the given ratios."""
    lp = torch.log(t(ratios)).requires_grad_(True)
    return lp, torch.zeros_like(lp)


# Two responses, three tokens, ratios [1.0, 1.5, 0.5] in both, A = +1 and -1.
RATIOS = [[1.0, 1.5, 0.5], [1.0, 1.5, 0.5]]
ADV = [1.0, -1.0]


def test_policy_loss_hand_values_symmetric_clip():
    lp, old = logp_for_ratios(RATIOS)
    mask = torch.ones(2, 3, dtype=torch.bool)
    loss, m = policy_loss(lp, old, t(ADV), mask, clip_low=0.2, clip_high=0.2)
    # row A=+1: r=1   -> -min(1, 1)       = -1
    #           r=1.5 -> -min(1.5, 1.2)   = -1.2   (upper clip active)
    #           r=0.5 -> -min(0.5, 0.8)   = -0.5   (A>0: lower clip inactive)
    # row A=-1: r=1   -> -min(-1, -1)     = 1
    #           r=1.5 -> -min(-1.5, -1.2) = 1.5    (A<0: upper clip inactive)
    #           r=0.5 -> -min(-0.5, -0.8) = 0.8    (lower clip active)
    # sum = -1 - 1.2 - 0.5 + 1 + 1.5 + 0.8 = 0.6 over 6 tokens -> 0.1
    assert loss.item() == pytest.approx(0.1, abs=1e-12)
    assert m["losses/policy"] == pytest.approx(0.1, abs=1e-12)
    assert m["losses/clipfrac_high"] == pytest.approx(1 / 6)
    assert m["losses/clipfrac_low"] == pytest.approx(1 / 6)
    assert m["losses/clipfrac"] == pytest.approx(2 / 6)
    # k3 of KL(old||new): r - 1 - ln r: r=1 -> 0; 1.5 -> .5 - ln 1.5; .5 -> -.5 + ln 2
    kl = 2 * ((0.5 - math.log(1.5)) + (-0.5 + LN2)) / 6  # 0.0958940...
    assert m["losses/approx_kl"] == pytest.approx(kl, abs=1e-12)
    assert m["losses/ratio_mean"] == pytest.approx(1.0, abs=1e-12)
    assert m["losses/num_tokens"] == 6.0
    # gradient wrt logprobs: unclipped token -> -A * r / N, clipped token -> 0
    loss.backward()
    expected = t([[-1 / 6, 0.0, -0.5 / 6], [1 / 6, 1.5 / 6, 0.0]])
    assert torch.allclose(lp.grad, expected, atol=1e-12)


def test_policy_loss_separate_low_high_clip():
    lp, old = logp_for_ratios(RATIOS)
    mask = torch.ones(2, 3, dtype=torch.bool)
    loss, m = policy_loss(lp, old, t(ADV), mask, clip_low=0.2, clip_high=0.28)
    # as above but r=1.5, A=+1 -> -min(1.5, 1.28) = -1.28
    # sum = -1 - 1.28 - 0.5 + 1 + 1.5 + 0.8 = 0.52 -> 0.52 / 6
    assert loss.item() == pytest.approx(0.52 / 6, abs=1e-12)
    lp2, old2 = logp_for_ratios(RATIOS)
    loss2, m2 = policy_loss(lp2, old2, t(ADV), mask, clip_low=0.6, clip_high=0.6)
    # bounds [0.4, 1.6]: nothing clipped; sum = -1 - 1.5 - .5 + 1 + 1.5 + .5 = 0
    assert loss2.item() == pytest.approx(0.0, abs=1e-12)
    assert m2["losses/clipfrac"] == 0.0


def test_policy_loss_mask_and_token_level_aggregation():
    lp, old = logp_for_ratios(RATIOS)
    mask = t([[1, 1, 1], [1, 1, 0]])  # float 0/1 masks are accepted
    loss, m = policy_loss(lp, old, t(ADV), mask)
    # the masked token (r=.5, A=-1, clipped) is dropped: sum = -1 -1.2 -.5 +1 +1.5 = -.2; /5
    assert loss.item() == pytest.approx(-0.04, abs=1e-12)
    assert m["losses/clipfrac_low"] == 0.0 and m["losses/clipfrac_high"] == pytest.approx(0.2)


def test_token_mean_not_sequence_mean():
    # lengths 1 and 3, ratio 1: A=+1 on one token, A=-1 on three tokens.
    # token mean: (-1 + 3) / 4 = 0.5 ; a per-sequence mean would give (-1 + 1) / 2 = 0
    lp, old = logp_for_ratios([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    mask = t([[1, 0, 0], [1, 1, 1]])
    loss, _ = policy_loss(lp, old, t([1.0, -1.0]), mask)
    assert loss.item() == pytest.approx(0.5, abs=1e-12)


def test_per_token_advantages_equal_broadcast_sequence_advantages():
    lp, old = logp_for_ratios(RATIOS)
    mask = torch.ones(2, 3, dtype=torch.bool)
    a, _ = policy_loss(lp, old, t(ADV), mask)
    b, _ = policy_loss(lp, old, t([[1.0] * 3, [-1.0] * 3]), mask)
    assert torch.equal(a, b)
    # genuinely per-token advantages: [[2, 0, 1]] with ratio 1 -> -(2 + 0 + 1) / 3 = -1
    lp1, old1 = logp_for_ratios([[1.0, 1.0, 1.0]])
    c, _ = policy_loss(lp1, old1, t([[2.0, 0.0, 1.0]]), torch.ones(1, 3))
    assert c.item() == pytest.approx(-1.0, abs=1e-12)


def test_single_token_response():
    # one token, ratio 1, A = 2 -> -2 ; the same with padding after it
    lp, old = logp_for_ratios([[1.0]])
    loss, m = policy_loss(lp, old, t([2.0]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-2.0, abs=1e-12) and m["losses/num_tokens"] == 1.0
    lp4, old4 = logp_for_ratios([[1.0, 3.0, 3.0, 3.0]])
    loss4, _ = policy_loss(lp4, old4, t([2.0]), t([[1, 0, 0, 0]]))
    assert loss4.item() == pytest.approx(-2.0, abs=1e-12)


def test_empty_mask_gives_zero_loss_and_zero_grad():
    lp = torch.full((2, 3), -math.inf, dtype=F64, requires_grad=True)  # padding everywhere
    old = torch.full((2, 3), -math.inf, dtype=F64)
    loss, m = policy_loss(lp, old, t([1.0, -1.0]), torch.zeros(2, 3, dtype=torch.bool))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(lp.grad, torch.zeros(2, 3, dtype=F64))
    assert all(v == 0.0 for v in m.values())


def test_padding_may_hold_inf_and_nan():
    lp = t([[math.log(1.5), -math.inf], [0.0, math.nan]]).requires_grad_(True)
    old = t([[0.0, -math.inf], [0.0, 0.0]])
    loss, _ = policy_loss(lp, old, t([1.0, 1.0]), t([[1, 0], [1, 0]]))
    # tokens: r=1.5, A=1 -> -1.2 ; r=1, A=1 -> -1 ; mean -1.1
    assert loss.item() == pytest.approx(-1.1, abs=1e-12)
    loss.backward()
    assert torch.isfinite(lp.grad).all()


def test_extreme_ratio_has_finite_gradient():
    lp = t([[500.0, 0.0]]).requires_grad_(True)  # ratio e^500 overflows without the clamp
    loss, _ = policy_loss(lp, torch.zeros(1, 2, dtype=F64), t([1.0]), torch.ones(1, 2))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()


def test_num_tokens_is_the_denominator():
    lp, old = logp_for_ratios(RATIOS)
    mask = torch.ones(2, 3, dtype=torch.bool)
    loss, m = policy_loss(lp, old, t(ADV), mask, num_tokens=12)
    assert loss.item() == pytest.approx(0.6 / 12, abs=1e-12)
    assert m["losses/policy"] == pytest.approx(0.1)  # metrics stay local token means
    zero, _ = policy_loss(lp, old, t(ADV), mask, num_tokens=0)
    assert zero.item() == 0.0


def test_policy_loss_errors():
    lp, old = logp_for_ratios(RATIOS)
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="advantages must be"):
        policy_loss(lp, old, t([1.0, 2.0, 3.0]), mask)
    with pytest.raises(ValueError, match="response_mask shape"):
        policy_loss(lp, old, t(ADV), torch.ones(2, 4))
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss(lp, old, t(ADV), mask, clip_low=1.0)
    with pytest.raises(ValueError, match="old_logprobs shape"):
        policy_loss(lp, old[:, :2], t(ADV), mask)


# --- masked_mean ---------------------------------------------------------------------------

def test_masked_mean():
    v = t([[1.0, 2.0, math.inf], [4.0, math.nan, 6.0]])
    mask = t([[1, 1, 0], [1, 0, 1]])
    assert masked_mean(v, mask).item() == pytest.approx((1 + 2 + 4 + 6) / 4)
    assert masked_mean(v, mask, 2).item() == pytest.approx(13 / 2)
    assert masked_mean(v, mask, torch.tensor(26.0)).item() == pytest.approx(0.5)
    assert masked_mean(v, torch.zeros(2, 3)).item() == 0.0


# --- KL ------------------------------------------------------------------------------------

def test_kl_penalty_hand_values():
    lp = torch.log(t([[0.5, 0.25, 0.3]]))
    ref = torch.log(t([[0.25, 0.5, 0.3]]))
    # k1 = ln(p / p_ref): ln 2, -ln 2, 0
    assert torch.allclose(kl_penalty(lp, ref, "k1"), t([[LN2, -LN2, 0.0]]), atol=1e-12)
    # k3 = r - 1 - ln r, r = p_ref / p: r=.5 -> -.5 + ln 2 ; r=2 -> 1 - ln 2 ; r=1 -> 0
    assert torch.allclose(kl_penalty(lp, ref, "k3"), t([[LN2 - 0.5, 1 - LN2, 0.0]]),
                          atol=1e-12)
    assert torch.allclose(kl_penalty(lp, ref), kl_penalty(lp, ref, "k3"))  # default k3
    with pytest.raises(ValueError, match="estimator must be 'k1' or 'k3'"):
        kl_penalty(lp, ref, "k2")


def test_kl_loss_masks_padding():
    lp = torch.log(t([[0.5, 0.25]])).requires_grad_(True)
    ref = t([[math.log(0.25), -math.inf]])  # the padded reference token is -inf
    out = kl_loss(lp, ref, t([[1, 0]]), coef=0.1, estimator="k3")
    assert out.item() == pytest.approx(0.1 * (LN2 - 0.5), abs=1e-12)
    out.backward()
    assert torch.isfinite(lp.grad).all() and lp.grad[0, 1] == 0


# --- entropy term and the combined loss -----------------------------------------------------

def test_entropy_loss_and_sampled_entropy():
    h = t([[1.0, 2.0], [3.0, 100.0]])
    mask = t([[1, 1], [1, 0]])
    # -c * mean H = -0.005 * (1 + 2 + 3) / 3 = -0.01
    assert entropy_loss(h, mask, 0.005).item() == pytest.approx(-0.01, abs=1e-15)
    assert entropy_loss(h, mask, 0.005, num_tokens=6).item() == pytest.approx(-0.005)
    lp = torch.log(t([[0.5, 0.25], [0.5, 1.0]]))
    # -(ln .5 + ln .25 + ln .5) / 3 = 4 ln 2 / 3
    assert sampled_entropy(lp, mask).item() == pytest.approx(4 * LN2 / 3, abs=1e-12)


def test_magic_loss_is_the_sum_of_its_terms():
    lp, old = logp_for_ratios(RATIOS)
    mask = torch.ones(2, 3, dtype=torch.bool)
    ent = t([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    ref = old - 0.1
    loss, m = magic_loss(lp, old, t(ADV), mask, entropy=ent, entropy_coef=0.004,
                         ref_logprobs=ref, kl_coef=0.05, kl_estimator="k1")
    # policy 0.1 ; H mean = 2.1 / 6 = 0.35 ; k1 = lp - ref: mean(ln r) + 0.1 over 6 tokens
    k1 = 2 * (math.log(1.5) + math.log(0.5)) / 6 + 0.1
    expected = 0.1 - 0.004 * 0.35 + 0.05 * k1
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert m["losses/total"] == pytest.approx(expected, abs=1e-12)
    assert m["losses/entropy"] == pytest.approx(0.35) and m["losses/kl"] == pytest.approx(k1)
    plain, _ = magic_loss(lp, old, t(ADV), mask)
    assert plain.item() == pytest.approx(0.1, abs=1e-12)
    with pytest.raises(ValueError, match="entropy_coef != 0 needs"):
        magic_loss(lp, old, t(ADV), mask, entropy_coef=0.1)
    with pytest.raises(ValueError, match="kl_coef != 0 needs"):
        magic_loss(lp, old, t(ADV), mask, kl_coef=0.1)


def test_merge_metrics_is_token_weighted():
    parts = [{"losses/policy": 1.0, "losses/num_tokens": 1.0},
             {"losses/policy": 4.0, "losses/num_tokens": 3.0, "losses/kl": 2.0}]
    merged = merge_metrics(parts)
    assert merged == {"losses/num_tokens": 4.0, "losses/policy": (1 + 12) / 4,
                      "losses/kl": 2.0}
