"""AdaptiveEntropyController against hand-written trajectories (docs/magic.md, "Entropy")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.magic.controller import AdaptiveEntropyController


def run(ctrl, entropies):
    return [ctrl.update(e) for e in entropies], ctrl.c


def test_trajectory_table():
    ctrl = AdaptiveEntropyController(target=0.2, delta=1e-4, coef_min=0.0, coef_max=0.005,
                                     coef_init=0.0)
    assert ctrl.coef == 0.0  # before any measurement: coef_init
    # step | e    | e < 0.2 | c after        | coefficient returned (used next step)
    #  1   | 0.10 | yes     | 0 + 1e-4       | 1e-4
    #  2   | 0.10 | yes     | 2e-4           | 2e-4
    #  3   | 0.30 | no      | 1e-4           | 0
    #  4   | 0.25 | no      | 0              | 0
    #  5   | 0.10 | yes     | 1e-4           | 1e-4
    #  6   | 0.30 | no      | 0              | 0
    #  7   | 0.30 | no      | max(-1e-4,0)=0 | 0
    table = [(0.10, 1e-4, 1e-4), (0.10, 2e-4, 2e-4), (0.30, 1e-4, 0.0), (0.25, 0.0, 0.0),
             (0.10, 1e-4, 1e-4), (0.30, 0.0, 0.0), (0.30, 0.0, 0.0)]
    for e, c_after, coef in table:
        assert ctrl.update(e) == pytest.approx(coef, abs=1e-15)
        assert ctrl.c == pytest.approx(c_after, abs=1e-15)
        assert ctrl.coef == pytest.approx(coef, abs=1e-15)
        assert ctrl.last_entropy == e
    assert ctrl.num_updates == len(table)


def test_clamp_at_max_and_release():
    ctrl = AdaptiveEntropyController(target=0.2, delta=1e-4, coef_max=2.5e-4)
    coefs, c = run(ctrl, [0.1, 0.1, 0.1, 0.1, 0.3, 0.1])
    # c: 1e-4, 2e-4, min(3e-4, 2.5e-4), 2.5e-4, 1.5e-4, 2.5e-4
    assert coefs == pytest.approx([1e-4, 2e-4, 2.5e-4, 2.5e-4, 0.0, 2.5e-4], abs=1e-15)
    assert c == pytest.approx(2.5e-4, abs=1e-15)


def test_entropy_equal_to_target_counts_as_not_below():
    ctrl = AdaptiveEntropyController(target=0.2, delta=1e-4, coef_init=3e-4)
    assert ctrl.coef == 3e-4
    assert ctrl.update(0.2) == 0.0
    assert ctrl.c == pytest.approx(2e-4, abs=1e-15)


def test_fixed_and_off_modes():
    fixed = AdaptiveEntropyController(coef_init=0.003, mode="fixed")
    assert [fixed.update(e) for e in (0.1, 0.5, 0.1)] == [0.003] * 3
    assert fixed.coef == 0.003
    off = AdaptiveEntropyController(coef_init=0.003, mode="off")
    assert off.coef == 0.0
    assert [off.update(e) for e in (0.1, 0.5)] == [0.0, 0.0]
    assert AdaptiveEntropyController.fixed(0.01).update(0.0) == 0.01
    assert AdaptiveEntropyController.off().update(0.0) == 0.0


def test_accepts_tensor_entropy():
    import torch

    ctrl = AdaptiveEntropyController()
    assert ctrl.update(torch.tensor(0.1)) == pytest.approx(1e-4)


@pytest.mark.parametrize("kwargs, message", [
    (dict(coef_min=0.01, coef_max=0.005), "0 <= coef_min <= coef_init <= coef_max"),
    (dict(coef_init=0.01), "0 <= coef_min <= coef_init <= coef_max"),
    (dict(coef_min=-1.0), "0 <= coef_min <= coef_init <= coef_max"),
    (dict(delta=-1e-4), "delta must be >= 0"),
    (dict(target=-0.1), "target entropy must be >= 0"),
    (dict(target=float("nan")), "target must be a finite number"),
    (dict(mode="sometimes"), "entropy mode must be one of"),
])
def test_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveEntropyController(**kwargs)


def test_non_finite_entropy_is_rejected():
    ctrl = AdaptiveEntropyController()
    with pytest.raises(ValueError, match="must be finite"):
        ctrl.update(float("nan"))
    assert ctrl.num_updates == 0 and ctrl.c == 0.0


def test_state_round_trip_through_json():
    a = AdaptiveEntropyController()
    run(a, [0.1, 0.1, 0.3, 0.1])
    b = AdaptiveEntropyController()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict()
    assert (b.c, b.coef, b.last_entropy, b.num_updates) == (a.c, a.coef, 0.1, 4)
    tail = [0.3, 0.1, 0.1, 0.25]
    assert run(b, tail) == run(a, tail)
    fresh = AdaptiveEntropyController()
    assert fresh.state_dict()["last_entropy"] is None
    json.dumps(fresh.state_dict())


def test_state_errors():
    state = AdaptiveEntropyController().state_dict()
    with pytest.raises(ValueError, match="saved in mode 'adaptive'"):
        AdaptiveEntropyController(mode="off").load_state_dict(state)
    with pytest.raises(ValueError, match=r"lacks keys \['c'\]"):
        AdaptiveEntropyController().load_state_dict({k: v for k, v in state.items() if k != "c"})
    with pytest.raises(ValueError, match="version"):
        AdaptiveEntropyController().load_state_dict({**state, "version": 99})


def test_controller_module_does_not_import_torch():
    code = "import sys, trainer.magic.controller; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parents[1])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1, allow_nan=False), max_size=40),
       st.floats(0, 1), st.floats(0, 1e-3), st.floats(0, 0.01), st.floats(0, 0.01))
def test_property_rule(entropies, target, delta, x, y):
    lo, hi = sorted((x, y))
    ctrl = AdaptiveEntropyController(target=target, delta=delta, coef_min=lo, coef_max=hi,
                                     coef_init=lo)
    c = lo
    for e in entropies:
        coef = ctrl.update(e)
        c = min(max(c + delta if e < target else c - delta, lo), hi)  # the rule, verbatim
        assert ctrl.c == c
        assert coef == (c if e < target else 0.0)
        assert lo <= ctrl.c <= hi
