"""StageSchedule transitions and state; OffPolicyConfig validation and mini-batch schedule."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.magic.rules import OffPolicyConfig, Plateau, Stage, StageSchedule, response_indices


def steps_stages():
    return [Stage("a", 8, steps=2), Stage("b", 16, steps=3), Stage("c", 32)]


# --- stages --------------------------------------------------------------------------------

def test_transitions_by_steps_and_last_stage_never_ends():
    sched = StageSchedule(steps_stages())
    seen = []
    for step in range(1, 11):
        advanced = sched.observe(step, {})
        seen.append((advanced, sched.current.name, sched.max_response_length))
    # stage a ends after its 2nd step, b after its 3rd; c runs on
    assert seen[:6] == [(False, "a", 8), (True, "b", 16), (False, "b", 16), (False, "b", 16),
                        (True, "c", 32), (False, "c", 32)]
    assert all(not adv and name == "c" for adv, name, _ in seen[5:])
    assert sched.is_last and sched.steps_in_stage == 5
    assert sched.transitions == [{"from": "a", "to": "b", "step": 2, "reason": "steps"},
                                 {"from": "b", "to": "c", "step": 5, "reason": "steps"}]


def test_transition_by_plateau_max():
    sched = StageSchedule([Stage("s1", 8, plateau=Plateau("eval/accuracy", patience=2)),
                           Stage("s2", 16)])
    # step | metric | best | failures
    #  1   | 0.10   | 0.10 | 0        (first observation sets the best)
    #  2   |  -     |      | 0        (no observation: metric absent)
    #  3   | 0.20   | 0.20 | 0
    #  4   | 0.20   | 0.20 | 1        (not strictly better)
    #  5   |  -     |      | 1
    #  6   | 0.15   | 0.20 | 2 -> stage ends on step 6
    metrics = [{"eval/accuracy": 0.1}, {"reward/mean": 0.5}, {"eval/accuracy": 0.2},
               {"eval/accuracy": 0.2}, {}, {"eval/accuracy": 0.15}]
    flags = [sched.observe(i + 1, m) for i, m in enumerate(metrics)]
    assert flags == [False, False, False, False, False, True]
    assert sched.current.name == "s2"
    assert sched.transitions == [{"from": "s1", "to": "s2", "step": 6, "reason": "plateau"}]


def test_plateau_min_delta_and_min_mode():
    p = Plateau("losses/policy", patience=1, min_delta=0.01, mode="min")
    sched = StageSchedule([Stage("s1", 8, plateau=p), Stage("s2", 16)])
    assert not sched.observe(1, {"losses/policy": 1.0})
    assert not sched.observe(2, {"losses/policy": 0.98})  # 0.98 < 1.0 - 0.01: improvement
    assert sched.observe(3, {"losses/policy": 0.975})     # not below 0.98 - 0.01: failure
    maxp = Plateau("m", patience=1, min_delta=0.01)
    assert maxp.improves(0.211, 0.2) and not maxp.improves(0.205, 0.2)


def test_nan_metric_counts_as_failure():
    sched = StageSchedule([Stage("s1", 8, plateau=Plateau("m", patience=2)), Stage("s2", 16)])
    assert not sched.observe(1, {"m": float("nan")})
    assert sched.observe(2, {"m": float("nan")})


def test_steps_and_plateau_whichever_first():
    stages = [Stage("s1", 8, steps=3, plateau=Plateau("m", patience=1)), Stage("s2", 16)]
    s = StageSchedule(stages)
    assert [s.observe(i, {"m": 1.0}) for i in (1, 2)] == [False, True]  # plateau at step 2
    s = StageSchedule(stages)
    assert [s.observe(i, {"m": float(i)}) for i in (1, 2, 3)] == [False, False, True]
    assert s.transitions[0]["reason"] == "steps"


def test_counters_reset_on_transition():
    p = Plateau("m", patience=2)
    s = StageSchedule([Stage("s1", 8, plateau=p), Stage("s2", 16, plateau=p), Stage("s3", 32)])
    for i, v in enumerate([1.0, 1.0, 1.0]):
        s.observe(i, {"m": v})
    assert s.current.name == "s2" and s.steps_in_stage == 0
    # a fresh best in s2: 0.5 (first observation) does not count as a failure
    assert not s.observe(3, {"m": 0.5})
    assert not s.observe(4, {"m": 0.5})
    assert s.observe(5, {"m": 0.5})


@pytest.mark.parametrize("stages, message", [
    ([], "at least one stage"),
    ([Stage("a", 16, steps=1), Stage("b", 16)], "strictly increasing max_response_length"),
    ([Stage("a", 16, steps=1), Stage("b", 8)], "strictly increasing max_response_length"),
    ([Stage("a", 8, steps=1), Stage("a", 16)], "names must be unique"),
    ([Stage("a", 8), Stage("b", 16)], "'a' is not the last stage and needs an end condition"),
])
def test_stage_list_validation(stages, message):
    with pytest.raises(ValueError, match=message):
        StageSchedule(stages)


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="", max_response_length=8), "name must be a non-empty string"),
    (dict(name="a", max_response_length=0), "max_response_length must be an int >= 1"),
    (dict(name="a", max_response_length=8, steps=0), "steps must be an int >= 1"),
    (dict(name="a", max_response_length=8, plateau=5), "plateau must be a Plateau"),
])
def test_stage_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Stage(**kwargs)


def test_plateau_validation():
    with pytest.raises(ValueError, match="patience must be an int >= 1"):
        Plateau("m", patience=0)
    with pytest.raises(ValueError, match="mode must be 'max' or 'min'"):
        Plateau("m", patience=1, mode="up")
    with pytest.raises(ValueError, match="min_delta must be a finite number >= 0"):
        Plateau("m", patience=1, min_delta=-0.1)


def test_stage_dict_round_trip():
    data = {"name": "s1", "max_response_length": 8192, "steps": None,
            "plateau": {"metric": "eval/accuracy", "patience": 3, "min_delta": 0.0,
                        "mode": "max"}}
    stage = Stage.from_dict(data)
    assert stage.plateau == Plateau("eval/accuracy", 3)
    assert stage.to_dict() == data
    with pytest.raises(ValueError, match=r"unknown stage key 'length'"):
        Stage.from_dict({"name": "s", "length": 3})
    with pytest.raises(ValueError, match="max_response_length"):
        Stage.from_dict({"name": "s"})


def test_schedule_state_round_trip_mid_stage():
    stages = [Stage("s1", 8, plateau=Plateau("m", patience=3)), Stage("s2", 16, steps=2),
              Stage("s3", 32)]
    a = StageSchedule(stages)
    for i, v in enumerate([0.5, 0.7, 0.6]):  # best 0.7, one failure
        a.observe(i, {"m": v})
    b = StageSchedule(stages)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict()
    tail = [{"m": 0.6}, {"m": 0.6}, {}, {}, {}]
    assert [b.observe(10 + i, m) for i, m in enumerate(tail)] == \
        [a.observe(10 + i, m) for i, m in enumerate(tail)] == [False, True, False, True, False]
    assert b.transitions == a.transitions and b.current.name == "s3"


def test_schedule_state_errors():
    a = StageSchedule(steps_stages())
    a.observe(1, {})
    a.observe(2, {})  # now in "b"
    other = StageSchedule([Stage("a", 8, steps=2), Stage("x", 16, steps=3), Stage("c", 32)])
    with pytest.raises(ValueError, match="saved stage 'b' at index 1 does not match"):
        other.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="out of range"):
        StageSchedule([Stage("a", 8)]).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="lacks keys"):
        StageSchedule(steps_stages()).load_state_dict({"version": 1})


# --- off-policy quadruple --------------------------------------------------------------------

@pytest.mark.parametrize("quad", [(1, 64, 64, 1), (2, 64, 32, 1), (4, 64, 16, 1),
                                  (2, 64, 64, 2), (4, 64, 32, 2)])
def test_valid_quadruples(quad):
    cfg = OffPolicyConfig(*quad)
    assert cfg.is_on_policy == (quad == (1, 64, 64, 1))
    assert cfg.minibatches_per_epoch * cfg.n_reuse == cfg.n_sgd


@pytest.mark.parametrize("quad, message", [
    ((3, 64, 32, 1), r"N_SGD must equal \(D_R / D_T\) \* N_reuse = \(64 / 32\) \* 1 = 2, "
                     r"got n_sgd=3"),
    ((1, 64, 48, 1), r"mini_batch_size \(D_T=48\) must divide rollout_batch_size \(D_R=64\)"),
    ((0, 64, 64, 1), "n_sgd must be an int >= 1"),
    ((1, 64, 64, 0), "n_reuse must be an int >= 1"),
])
def test_invalid_quadruples(quad, message):
    with pytest.raises(ValueError, match=message):
        OffPolicyConfig(*quad)


def test_on_policy_schedule_is_one_minibatch_of_everything():
    batches = OffPolicyConfig(1, 64, 64, 1).minibatches(generator=torch.Generator().manual_seed(0))
    assert len(batches) == 1 and sorted(batches[0].tolist()) == list(range(64))
    assert OffPolicyConfig(1, 4, 4, 1).minibatches()[0].tolist() == [0, 1, 2, 3]  # no shuffle


def test_off_policy_schedule_epochs_and_determinism():
    cfg = OffPolicyConfig(4, 8, 4, 2)
    run1 = cfg.minibatches(generator=torch.Generator().manual_seed(123))
    run2 = cfg.minibatches(generator=torch.Generator().manual_seed(123))
    assert [b.tolist() for b in run1] == [b.tolist() for b in run2]
    assert len(run1) == 4 and all(len(b) == 4 for b in run1)
    for epoch in (run1[:2], run1[2:]):
        assert sorted(torch.cat(epoch).tolist()) == list(range(8))
    # epochs are reshuffled independently
    assert torch.cat(run1[:2]).tolist() != torch.cat(run1[2:]).tolist()
    other = cfg.minibatches(generator=torch.Generator().manual_seed(7))
    assert [b.tolist() for b in other] != [b.tolist() for b in run1]


def test_filtered_batch_keeps_the_number_of_steps():
    cfg = OffPolicyConfig(2, 64, 32, 1)
    batches = cfg.minibatches(50)
    assert [len(b) for b in batches] == [25, 25]
    assert [len(b) for b in cfg.minibatches(51)] == [26, 25]
    assert [len(b) for b in cfg.minibatches(1)] == [1]  # an empty part is skipped
    assert cfg.minibatches(0) == []
    with pytest.raises(ValueError, match=r"num_prompts must be an int in \[0, D_R=64\]"):
        cfg.minibatches(65)


def test_response_indices():
    assert response_indices(torch.tensor([0, 2]), 3).tolist() == [0, 1, 2, 6, 7, 8]
    assert response_indices(torch.tensor([], dtype=torch.long), 3).tolist() == []
    with pytest.raises(ValueError, match="group_size"):
        response_indices(torch.tensor([0]), 0)


def test_off_policy_dict_round_trip():
    cfg = OffPolicyConfig(4, 64, 32, 2)
    assert OffPolicyConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="unknown off-policy key"):
        OffPolicyConfig.from_dict({"n_sgd": 1, "D_R": 64})


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(1, 6), st.integers(1, 3), st.data())
def test_property_minibatch_schedule(per_epoch, d_t, n_reuse, data):
    d_r = per_epoch * d_t
    cfg = OffPolicyConfig(per_epoch * n_reuse, d_r, d_t, n_reuse)
    n = data.draw(st.integers(0, d_r))
    batches = cfg.minibatches(n, torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    assert len(batches) == min(n, per_epoch) * n_reuse
    assert sorted(torch.cat(batches).tolist() if batches else []) == \
        sorted(list(range(n)) * n_reuse)
    sizes = [len(b) for b in batches]
    assert not sizes or max(sizes) - min(sizes) <= 1
