"""MagicConfig: defaults, help text, plain-data round trips, cross-field rules."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.magic.config import MagicConfig, default_stages
from trainer.magic.rules import AdaptiveEntropyController, OffPolicyConfig, Stage, StageSchedule


def test_defaults_are_the_released_values():
    c = MagicConfig()
    assert (c.prompts_per_step, c.group_size) == (256, 16)
    assert (c.temperature, c.top_p, c.top_k, c.max_prompt_length) == (1.0, 1.0, -1, 2048)
    assert (c.clip_low, c.clip_high, c.mask_mode, c.adv_eps) == (0.2, 0.2, "none", 1e-6)
    assert (c.entropy_mode, c.entropy_target, c.entropy_delta) == ("adaptive", 0.2, 1e-4)
    assert (c.entropy_coef_min, c.entropy_coef_max, c.entropy_coef_init) == (0.0, 0.005, 0.0)
    assert (c.kl_coef, c.online_filter) == (0.0, True)
    assert (c.lr, c.betas, c.weight_decay, c.grad_clip) == (1e-6, (0.9, 0.999), 0.01, 1.0)
    assert [s.max_response_length for s in c.stages] == [8192, 16384, 32768]
    assert c.stages == default_stages()
    assert c.off_policy() == OffPolicyConfig(1, 256, 256, 1)


def test_every_field_has_help():
    helps = MagicConfig.field_help()
    assert set(helps) == {f.name for f in dataclasses.fields(MagicConfig)}
    for name, text in helps.items():
        assert len(text) > 30, name
        assert "Default" in text or "default" in text, name


def test_dict_and_json_round_trip():
    c = MagicConfig(group_size=8, mask_mode="before", entropy_mode="fixed",
                    entropy_coef_init=0.001, prompts_per_step=64, mini_batch_size=16,
                    n_reuse=2, stages=(Stage("s1", 1024, steps=5), Stage("s2", 2048)))
    data = json.loads(json.dumps(c.to_dict()))
    assert MagicConfig.from_dict(data) == c
    assert data["stages"][0] == {"name": "s1", "max_response_length": 1024, "steps": 5,
                                 "plateau": None}


def test_from_dict_plain_yaml_like_data():
    c = MagicConfig.from_dict({
        "lr": "1e-6",  # YAML 1.1 reads 1e-6 as a string
        "betas": [0.9, 0.95],
        "clip_high": 0.28,
        "stages": [{"name": "short", "max_response_length": 4096,
                    "plateau": {"metric": "eval/accuracy", "patience": 2}},
                   {"name": "long", "max_response_length": 8192}],
    })
    assert c.lr == 1e-6 and c.betas == (0.9, 0.95) and c.clip_high == 0.28
    assert c.stages[0].plateau.patience == 2


def test_from_dict_unknown_keys_are_named():
    with pytest.raises(ValueError, match=r"unknown magic keys 'gs', 'clip_ratio' \(did you mean "
                                         r"'clip_low'\?\); valid keys: group_size, "):
        MagicConfig.from_dict({"gs": 4, "clip_ratio": 0.2, "lr": 1e-6})


@pytest.mark.parametrize("kwargs, message", [
    (dict(group_size=1), "group_size must be >= 2: group advantages need a sample std"),
    (dict(prompts_per_step=64, mini_batch_size=48),
     r"mini_batch_size \(D_T=48\) must divide prompts_per_step \(D_R=64\)"),
    (dict(prompts_per_step=64, mini_batch_size=32, n_sgd=3),
     r"N_SGD must equal \(D_R / D_T\) \* N_reuse = \(64 / 32\) \* 1 = 2"),
    (dict(stages=(Stage("a", 16, steps=1), Stage("b", 8))),
     "stages must have strictly increasing max_response_length"),
    (dict(stages=()), "stages must hold at least one stage"),
    (dict(entropy_coef_init=0.01),
     "entropy coefficients must satisfy 0 <= coef_min <= coef_init <= coef_max"),
    (dict(entropy_coef_min=0.004, entropy_coef_max=0.003, entropy_coef_init=0.003),
     "0 <= coef_min <= coef_init <= coef_max"),
    (dict(clip_low=1.0), r"clip_low must be in \[0, 1\)"),
    (dict(clip_high=-0.1), "clip_high must be >= 0"),
    (dict(temperature=0.0), "temperature must be > 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_k=0), "top_k must be -1"),
    (dict(kl_coef=-1.0), "kl_coef must be >= 0"),
    (dict(n_reuse=0), "n_reuse must be >= 1"),
    (dict(lr=0.0), "lr must be > 0"),
    (dict(betas=(0.9, 1.0)), r"betas must each be in \[0, 1\)"),
    (dict(grad_clip=0.0), "grad_clip must be > 0"),
    (dict(mask_mode="sometimes"), r"mask_mode must be one of \['none', 'before', 'after'\]"),
    (dict(entropy_mode="auto"), r"entropy_mode must be one of \['adaptive', 'fixed', 'off'\]"),
    (dict(kl_estimator="k2"), r"kl_estimator must be one of \['k1', 'k3'\]"),
    (dict(group_size="16"), "group_size must be an int"),
    (dict(group_size=16.0), "group_size must be an int"),
    (dict(online_filter=1), "online_filter must be a bool"),
    (dict(lr="fast"), "lr must be a number"),
    (dict(lr=float("inf")), "lr must be a finite number"),
    (dict(betas=(0.9,)), "betas must be a sequence of 2 numbers"),
    (dict(stages="8k"), "stages must be a list of stages"),
    (dict(stages=[{"name": "a", "max_response_length": 8, "oops": 1}]),
     r"unknown magic.stages\[0\] key 'oops'"),
])
def test_rules_are_stated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MagicConfig(**kwargs)


def test_replace_revalidates():
    c = MagicConfig()
    assert dataclasses.replace(c, clip_high=0.28).clip_high == 0.28
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        dataclasses.replace(c, group_size=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.lr = 1.0  # type: ignore[misc]


def test_derived_objects():
    c = MagicConfig(prompts_per_step=64, mini_batch_size=16, n_reuse=2,
                    entropy_mode="off")
    assert c.off_policy() == OffPolicyConfig(8, 64, 16, 2)
    assert MagicConfig(prompts_per_step=64, mini_batch_size=16, n_reuse=2, n_sgd=8)
    ctrl = AdaptiveEntropyController.from_config(c)
    assert isinstance(ctrl, AdaptiveEntropyController) and ctrl.mode == "off"
    sched = c.stage_schedule()
    assert isinstance(sched, StageSchedule) and sched.max_response_length == 8192


def test_config_module_does_not_import_torch():
    code = ("import sys, trainer, trainer.config; c = trainer.config.MagicConfig(); "
            "from trainer.magic.controller import AdaptiveEntropyController; "
            "AdaptiveEntropyController.from_config(c); c.stage_schedule(); "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parents[1])
