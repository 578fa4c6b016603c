"""trainer/magic/reference_step.py, the one-file reading of a MAGIC step, held to the real thing: its
update moves the weights exactly as TorchBackend's does on the same batch (an eps-dominated
AdamW, tests.ds_worker.LINEAR, makes the weight change the gradient, so a wrong loss scale or
denominator would show), its advantages and entropy controller are trainer/magic/rules.py's, and the
whole step runs on a real tiny model."""

from __future__ import annotations

import pytest
import torch

from tests.backend_fixtures import model_dir, one_torch_thread  # noqa: F401 (fixtures)
from tests.ds_worker import LINEAR, PAD_ID, VOCAB, make_batch
from trainer.magic import rules as magic
from trainer.magic import reference_step as ref
from trainer.backends import BackendConfig
from trainer.backends.common import adamw_kwargs
from trainer.backends.loading import load_causal_lm
from trainer.backends.torch_backend import TorchBackend
from trainer.interfaces import LossSettings, UpdatePlan

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_update_moves_the_weights_as_the_torch_backend_does(model_dir, entropy_coef) -> None:
    batch, _, adv = make_batch()
    backend = TorchBackend(BackendConfig(), model_dir, LINEAR)
    loss = LossSettings(clip_low=0.2, clip_high=0.28, entropy_coef=entropy_coef)
    m_backend = backend.update(batch, None, adv, UpdatePlan([torch.arange(len(batch))], 3), loss)
    want = {n: t.detach().clone() for n, t in backend.named_weights()}

    model = load_causal_lm(model_dir)
    start = {n: t.detach().clone() for n, t in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), **adamw_kwargs(LINEAR))
    s = ref.StepSettings(clip_low=0.2, clip_high=0.28, grad_clip=LINEAR.grad_clip)
    m_ref = ref.update(model, opt, batch.input_ids, batch.attention_mask, batch.response_mask,
                       adv, s, entropy_coef)
    got = dict(model.named_parameters())
    moved = max(float((want[n] - start[n]).abs().max()) for n in want)
    assert moved > 1e-3  # the step did something
    for n in want:
        torch.testing.assert_close(got[n].detach(), want[n], atol=1e-5, rtol=1e-4)
    assert m_ref["entropy"] == pytest.approx(m_backend["entropy"], rel=1e-5)
    assert m_ref["grad_norm"] == pytest.approx(m_backend["grad_norm"], rel=1e-4)


def test_group_advantages_are_magics() -> None:
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (64,), generator=g).float()
    rewards[:8] = 1.0  # a flat group
    torch.testing.assert_close(ref.group_advantages(rewards, 8),
                               magic.group_advantages(rewards, 8))


def test_the_entropy_controller_is_magics() -> None:
    s = ref.StepSettings(entropy_target=0.2, entropy_delta=0.01, entropy_coef_max=0.03)
    ctl = magic.AdaptiveEntropyController(target=0.2, delta=0.01, coef_max=0.03)
    c = 0.0
    for e in (0.1, 0.1, 0.15, 0.1, 0.1, 0.3, 0.25, 0.1, 0.2):
        c, coef = ref.next_entropy_coef(c, e, s)
        assert coef == pytest.approx(ctl.update(e)) and c == pytest.approx(ctl.c)


def test_a_whole_step_on_a_tiny_model(model_dir) -> None:
    """Generate, score, advantages, loss, update: rewards in [0, 1], some groups kept, the
    weights moved, and the controller's state returned."""
    torch.manual_seed(0)
    model = load_causal_lm(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = {n: t.detach().clone() for n, t in model.named_parameters()}
    s = ref.StepSettings(group_size=4, max_response_length=5, entropy_target=10.0,
                         entropy_delta=0.001)
    prompts = [[5 + i, 6 + i, 7 + i] for i in range(4)]
    out = ref.reference_step(model, opt, prompts, lambda r: r[0] % 2 == 0, s, c=0.0,
                             entropy_coef=0.0, eos_id=VOCAB - 1, pad_id=PAD_ID)
    assert 0.0 < out["reward/mean"] < 1.0 and out["filtered/frac"] < 1.0
    assert 0.0 <= out["truncated/frac"] <= 1.0
    assert out["c"] == pytest.approx(0.001) and out["entropy/next_coef"] == pytest.approx(0.001)
    assert any(float((p.detach() - before[n]).abs().max()) > 0
               for n, p in model.named_parameters())
