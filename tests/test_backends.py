"""TorchBackend and the shared forward/update code (trainer/backends), on a real tiny Qwen2.

Exactness checks use an eps-dominated AdamW (``tests.ds_worker.LINEAR``: the first step is
plain SGD with step size 1), so the weight change IS the gradient and any error in the loss
scale or the token-mean denominator shows up in the weights; with the usual eps, Adam's first
step is ``lr * sign(g)`` and would hide scale errors.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.ds_worker import LINEAR, make_batch
from trainer.magic import rules as magic
from trainer.backends import BackendConfig, OptimizerConfig, check_model_path, create_backend
from trainer.backends.common import UPDATE_METRIC_KEYS
from trainer.backends.forward import SplitForward, target_logprobs, token_stats
from trainer.config_schema import field_docs
from trainer.backends.torch_backend import TorchBackend
from trainer.hf_utils import CheckpointError
from trainer.interfaces import Completion, LossSettings, TokenBatch, UpdatePlan
from tests.backend_fixtures import model_dir, one_torch_thread  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(120)

ADAM = OptimizerConfig(lr=1e-3)  # real Adam (eps 1e-8): optimizer state matters on resume
PLAIN = BackendConfig()


@pytest.fixture(scope="module")
def data():
    return make_batch()


def weights(backend) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in backend.named_weights()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def whole(batch: TokenBatch, mbs: int = 4) -> UpdatePlan:
    return UpdatePlan([torch.arange(len(batch))], micro_batch_size=mbs)


def run_update(model_dir, data, *, config=PLAIN, optimizer=LINEAR, mbs=4, loss=None, adv=None,
               plan=None):
    loss = loss or LossSettings()
    backend = TorchBackend(config, model_dir, optimizer)
    batch, offset, advantages = data
    old = backend.logprobs(batch, 4) + offset
    before = weights(backend)
    metrics = backend.update(batch, old, advantages if adv is None else adv,
                             plan or whole(batch, mbs), loss)
    return backend, before, weights(backend), metrics


# ---------------------------------------------------------------------------------------------
# Config and construction
# ---------------------------------------------------------------------------------------------

def test_config_defaults_are_the_released_optimizer():
    cfg, opt = BackendConfig(), OptimizerConfig()
    assert (cfg.kind, cfg.zero_stage, opt.lr, opt.betas, opt.weight_decay, opt.grad_clip) == (
        "torch", 0, 1e-6, (0.9, 0.999), 0.01, 1.0)
    for kind in (BackendConfig, OptimizerConfig):
        docs = field_docs(kind)
        for f in dataclasses.fields(kind):
            assert docs[f.name], f.name


def test_a_run_takes_the_optimizer_from_magic_only():
    """The report's optimizer row has one home, magic: the backend config has no optimizer
    field, and a run's optimizer is magic's values."""
    names = {f.name for f in dataclasses.fields(BackendConfig)}
    assert not names & {"lr", "betas", "eps", "weight_decay", "grad_clip"}
    m = magic.MagicConfig(lr=3e-6, betas=(0.8, 0.95), weight_decay=0.02, grad_clip=0.5)
    assert OptimizerConfig.from_magic(m) == OptimizerConfig(
        lr=3e-6, betas=(0.8, 0.95), weight_decay=0.02, grad_clip=0.5)


@pytest.mark.parametrize("kwargs, rule", [
    ({"zero_stage": 2}, "needs kind='deepspeed'"),
    ({"kind": "jax"}, "kind must be one of"),
    ({"kind": "deepspeed", "zero_stage": 4}, "zero_stage must be one of"),
    ({"dtype": "float16"}, "dtype must be one of"),
    ({"entropy_chunk_size": 0}, "entropy_chunk_size must be"),
])
def test_config_rules(kwargs, rule):
    with pytest.raises(ValueError, match=rule):
        BackendConfig(**kwargs)


@pytest.mark.parametrize("kwargs, rule", [
    ({"lr": 0.0}, "lr must be"),
    ({"betas": (0.9, 1.0)}, "betas must be"),
    ({"eps": 0.0}, "eps must be"),
    ({"weight_decay": -1.0}, "weight_decay must be"),
    ({"lr": 10.0, "weight_decay": 0.5}, "lr \\* weight_decay must be < 1"),
    ({"grad_clip": -1.0}, "grad_clip must be"),
])
def test_optimizer_rules(kwargs, rule):
    with pytest.raises(ValueError, match=rule):
        OptimizerConfig(**kwargs)


@pytest.mark.parametrize("kind", ["torch", "deepspeed"])
def test_missing_model_path_is_a_clear_error(tmp_path, kind):
    with pytest.raises(CheckpointError, match="does not exist"):
        create_backend(BackendConfig(kind=kind), tmp_path / "no-such-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        check_model_path(tmp_path / "empty")


# ---------------------------------------------------------------------------------------------
# Forward pass
# ---------------------------------------------------------------------------------------------

def test_logprobs_match_a_direct_log_softmax(model_dir, data):
    from transformers import AutoModelForCausalLM

    batch = data[0]
    backend = create_backend(BackendConfig(), model_dir)
    got = backend.logprobs(batch, micro_batch_size=3)  # [B, L-1]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        logp = model(input_ids=batch.input_ids,
                     attention_mask=batch.attention_mask).logits.log_softmax(-1)  # [B, L, V]
    want = logp[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
    real = batch.attention_mask[:, 1:].bool()  # targets that are real tokens
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)
    assert bool((got[~real] == 0).all())  # padding positions hold 0


def test_logprobs_entropy_and_kl_are_of_the_sampling_distribution(model_dir, data):
    """docs/magic.md "Temperature": at rollout temperature tau the backend's log-probs, the
    update's entropy and its reference log-probs are those of softmax(logits / tau); old
    log-probs taken at tau start the update at ratio exactly 1 (taken at 1 they would not)."""
    from transformers import AutoModelForCausalLM

    batch, _, adv = data
    tau = 0.6
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids,
                       attention_mask=batch.attention_mask).logits[:, :-1]  # [B, L-1, V]
    scaled = logits / tau  # [B, L-1, V]
    want_lp = scaled.log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    want_h = float(magic.masked_mean(magic.token_entropy(scaled), batch.response_mask))
    plain_h = float(magic.masked_mean(magic.token_entropy(logits), batch.response_mask))
    real = batch.attention_mask[:, 1:].bool()  # [B, L-1]

    backend = TorchBackend(BackendConfig(keep_reference=True), model_dir, LINEAR)
    old = backend.logprobs(batch, 3, temperature=tau)  # [B, L-1]
    torch.testing.assert_close(old[real], want_lp[real], atol=1e-5, rtol=0)
    loss = LossSettings(kl_coef=0.1, temperature=tau)
    m = backend.update(batch, old, adv, whole(batch, 3), loss)
    assert m["entropy"] == pytest.approx(want_h, abs=1e-5)
    assert abs(want_h - plain_h) > 1e-2  # the check can tell the two distributions apart
    assert m["losses/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert m["losses/approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert m["losses/kl"] == 0.0  # the reference is scored at tau too (same initial weights)

    mismatched = TorchBackend(PLAIN, model_dir, LINEAR)
    m1 = mismatched.update(batch, mismatched.logprobs(batch, 3), adv, whole(batch, 3),
                           LossSettings(temperature=tau))
    assert abs(m1["losses/ratio_mean"] - 1.0) > 1e-3  # old at tau 1, update at 0.6


def test_sampling_logits_rule():
    logits = torch.randn(2, 3, 5)  # [B, T, V]
    assert magic.sampling_logits(logits, 1.0) is logits
    torch.testing.assert_close(magic.sampling_logits(logits, 0.5), logits * 2)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature must be > 0"):
            magic.sampling_logits(logits, bad)


def test_target_logprobs_chunked_equals_log_softmax_in_bf16_with_grad():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 7, (2, 5), generator=g)
    got = target_logprobs(logits, targets, chunk_size=3)  # checkpointed chunks
    want = logits.float().log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    (g1,) = torch.autograd.grad(got.sum(), logits)
    (g2,) = torch.autograd.grad(want.sum(), logits)
    torch.testing.assert_close(g1.float(), g2.float())


def test_dropout_is_disabled_for_the_ratio():
    from trainer.backends.loading import disable_dropout

    class Attn(torch.nn.Module):
        attention_dropout = 0.1

    model = torch.nn.Sequential(torch.nn.Dropout(0.3), Attn())
    disable_dropout(model)
    assert model[0].p == 0.0 and model[1].attention_dropout == 0.0


def test_on_policy_update_starts_at_ratio_one(model_dir, data):
    batch, _, adv = data
    backend = TorchBackend(PLAIN, model_dir, LINEAR)
    m = backend.update(batch, backend.logprobs(batch, 4), adv, whole(batch), LossSettings())
    assert m["losses/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert m["losses/clipfrac"] == 0.0 and m["losses/approx_kl"] == pytest.approx(0, abs=1e-9)


def test_response_mask_aligns_with_response_tokens():
    comps = [Completion(0, 0, [5, 6, 7], [8, 9], "", False),
             Completion(0, 1, [5], [10, 11, 12, 2], "", False)]
    batch = TokenBatch.from_completions(comps, pad_id=0)
    targets = batch.input_ids[:, 1:]  # [B, L-1]
    for i, c in enumerate(comps):
        assert targets[i][batch.response_mask[i]].tolist() == c.token_ids
        assert batch.response_mask[i].nonzero().flatten().tolist() == list(
            range(len(c.prompt_ids) - 1, len(c.prompt_ids) - 1 + len(c.token_ids)))


def test_prompt_and_padding_positions_do_not_enter_the_loss(model_dir, data):
    batch, offset, adv = data
    _, _, w_ref, m_ref = run_update(model_dir, data)
    # garbage old log-probs wherever the target is not a response token: same update
    garbage = torch.where(batch.response_mask, offset, torch.full_like(offset, 50.0))
    _, _, w_gar, _ = run_update(model_dir, (batch, garbage, adv))
    assert max_diff(w_ref, w_gar) == 0.0
    assert m_ref["losses/num_tokens"] == int(batch.response_mask.sum())


# ---------------------------------------------------------------------------------------------
# The update
# ---------------------------------------------------------------------------------------------

def test_positive_advantage_raises_the_sequence_logprob(model_dir, data):
    batch = data[0].select(torch.tensor([1]))
    backend = TorchBackend(PLAIN, model_dir, ADAM)
    old = backend.logprobs(batch, 1)
    backend.update(batch, old, torch.tensor([1.0]), whole(batch), LossSettings())
    new = backend.logprobs(batch, 1)
    mask = batch.response_mask
    assert float(new[mask].sum()) > float(old[mask].sum()) + 1e-3


def test_micro_batch_size_does_not_change_the_update(model_dir, data):
    """docs/magic.md: the mini-batch gradient must not depend on its split into micro-batches
    (every micro-batch divides by the mini-batch's global token count)."""
    loss = LossSettings(clip_high=0.28, entropy_coef=0.01)
    _, before, w1, m1 = run_update(model_dir, data, mbs=1, loss=loss)
    _, _, w4, m4 = run_update(model_dir, data, mbs=4, loss=loss)
    _, _, w8, _ = run_update(model_dir, data, mbs=8, loss=loss)
    assert max_diff(w1, before) > 1e-2  # the update is large: equality below means something
    assert max_diff(w1, w4) < 1e-6 and max_diff(w4, w8) < 1e-6
    assert m1["grad_norm"] == pytest.approx(m4["grad_norm"], rel=1e-5)
    for key in ("losses/policy", "losses/clipfrac", "entropy", "losses/num_tokens"):
        assert m1[key] == pytest.approx(m4[key], rel=1e-5, abs=1e-7), key


def test_metrics_keys_and_entropy_is_the_masked_token_entropy(model_dir, data):
    from transformers import AutoModelForCausalLM

    batch = data[0]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    h = magic.token_entropy(logits[:, :-1])  # [B, L-1] at the pre-update weights
    want = float(magic.masked_mean(h, batch.response_mask))
    _, _, _, metrics = run_update(model_dir, data, mbs=3)  # one mini-batch: pre-step forward
    assert set(UPDATE_METRIC_KEYS) <= metrics.keys()
    assert metrics["entropy"] == pytest.approx(want, abs=1e-5)
    assert metrics["losses/entropy_bonus"] == 0.0  # coefficient 0
    assert metrics["lr"] == LINEAR.lr and metrics["optimizer_steps"] == 1


def test_entropy_coefficient_changes_the_gradient_and_raises_entropy(model_dir, data):
    batch = data[0]
    zero = torch.zeros(len(batch))
    _, before, w0, _ = run_update(model_dir, data, adv=zero)
    backend, _, wc, m = run_update(model_dir, data, adv=zero,
                                   loss=LossSettings(entropy_coef=0.5))
    assert max_diff(w0, before) == 0.0  # LINEAR has no weight decay: zero advantage, no change
    # -c*H alone moves the weights (the step is the raw gradient here, whose entries scale
    # like 1/vocab: ~6e-4 with the 1,200-token tiny tokenizer; 0.0 without the bonus) ...
    assert max_diff(wc, before) > 1e-4
    assert m["losses/entropy_bonus"] == pytest.approx(-0.5 * m["entropy"])
    after = run_update_entropy(backend, batch)
    assert after > m["entropy"]  # ... towards higher entropy


def run_update_entropy(backend, batch) -> float:
    ids, attn = batch.input_ids, batch.attention_mask
    with torch.no_grad():
        _, h = token_stats(backend._forward_logits, ids, attn, entropy="detached")
    return float(magic.masked_mean(h, batch.response_mask))


def test_grad_clipping_scales_the_step_and_grad_norm_is_pre_clip(model_dir, data):
    _, before, w_free, m_free = run_update(model_dir, data)
    clip = 0.1
    _, _, w_clip, m_clip = run_update(model_dir, data,
                                      optimizer=dataclasses.replace(LINEAR, grad_clip=clip))
    norm = m_free["grad_norm"]
    assert norm > clip  # clipping is active
    assert m_clip["grad_norm"] == pytest.approx(norm, rel=1e-6)  # reported before clipping
    scale = clip / (norm + 1e-6)
    for k in before:  # linear regime: the step is the clipped gradient
        torch.testing.assert_close(w_clip[k] - before[k], scale * (w_free[k] - before[k]),
                                   atol=1e-6, rtol=1e-3)


def test_zero_advantages_only_apply_weight_decay(model_dir, data):
    """All-zero advantages and no entropy term: every gradient is exactly 0, so AdamW's moments
    stay 0 and its Adam step is 0/(0+eps) = 0; what remains is the decoupled weight decay,
    p <- p * (1 - lr * wd), on every parameter. We assert exactly that (to float rounding)."""
    cfg = OptimizerConfig(lr=1e-2, weight_decay=0.1)
    zero = torch.zeros(len(data[0]))
    _, before, after, m = run_update(model_dir, data, optimizer=cfg, adv=zero)
    assert m["grad_norm"] == 0.0
    for k in before:
        torch.testing.assert_close(after[k], before[k] * (1 - cfg.lr * cfg.weight_decay),
                                   atol=1e-9, rtol=1e-6)


def test_two_minibatches_are_two_sequential_steps(model_dir, data):
    batch, offset, adv = data
    plan = UpdatePlan([torch.tensor([0, 2, 4, 6]), torch.tensor([1, 3, 5, 7])], 2)
    a = TorchBackend(PLAIN, model_dir, ADAM)
    old = a.logprobs(batch, 4) + offset
    m = a.update(batch, old, adv, plan, LossSettings())
    b = TorchBackend(PLAIN, model_dir, ADAM)
    for rows in plan.minibatches:
        b.update(batch, old, adv, UpdatePlan([rows], 2), LossSettings())
    assert m["optimizer_steps"] == 2
    assert max_diff(weights(a), weights(b)) == 0.0


def test_save_load_restores_weights_and_optimizer_exactly(model_dir, data, tmp_path):
    batch, offset, adv = data
    plan, loss = whole(batch), LossSettings(entropy_coef=0.002)
    a = TorchBackend(PLAIN, model_dir, ADAM)
    old = a.logprobs(batch, 4) + offset
    a.update(batch, old, adv, plan, loss)
    a.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    assert (tmp_path / "ckpt" / "optimizer.pt").is_file()

    b = TorchBackend(PLAIN, model_dir, ADAM)  # fresh: initial weights, empty optimizer
    b.load(tmp_path / "ckpt")
    assert torch.equal(a.logprobs(batch, 4), b.logprobs(batch, 4))
    ma = a.update(batch, old, adv, plan, loss)
    mb = b.update(batch, old, adv, plan, loss)
    assert max_diff(weights(a), weights(b)) == 0.0  # the NEXT update is identical
    assert ma == mb
    # The optimizer state matters: weights alone (fresh Adam moments) step differently.
    c = TorchBackend(PLAIN, tmp_path / "ckpt", ADAM)
    c.update(batch, old, adv, plan, loss)
    assert max_diff(weights(a), weights(c)) > 1e-5


def test_saved_checkpoint_loads_in_transformers(model_dir, data, tmp_path):
    from transformers import AutoModelForCausalLM

    backend, _, after, _ = run_update(model_dir, data)
    backend.save(tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    loaded = dict(model.named_parameters())
    assert max_diff(after, {k: loaded[k].detach() for k in after}) == 0.0


def test_load_rejects_a_checkpoint_without_optimizer_state(model_dir):
    backend = TorchBackend(BackendConfig(), model_dir)
    with pytest.raises(CheckpointError, match="optimizer.pt"):
        backend.load(model_dir)


def test_gradient_checkpointing_gives_the_same_update(model_dir, data):
    _, _, w_plain, _ = run_update(model_dir, data)
    _, _, w_ckpt, _ = run_update(
        model_dir, data, config=BackendConfig(gradient_checkpointing=True))
    assert max_diff(w_plain, w_ckpt) < 1e-6


def test_bfloat16_autocast_keeps_float32_master_weights(model_dir, data):
    batch = data[0]
    fp32 = TorchBackend(BackendConfig(), model_dir).logprobs(batch, 4)
    backend, before, after, m = run_update(
        model_dir, data, config=BackendConfig(dtype="bfloat16"), optimizer=OptimizerConfig(lr=1e-6))
    assert all(t.dtype == torch.float32 for t in after.values())
    assert max_diff(after, before) > 0  # a 1e-6 step survives: the weights are float32
    bf16 = backend.logprobs(batch, 4)
    assert float((bf16 - fp32).abs().max()) < 0.1 and m["grad_norm"] > 0


def test_kl_term_with_a_reference_policy(model_dir, data):
    batch, offset, adv = data
    backend = TorchBackend(PLAIN, model_dir, LINEAR)
    ref = backend.logprobs(batch, 4)  # the reference is the current policy: KL = 0
    m = backend.update(batch, ref + offset, adv, whole(batch), LossSettings(kl_coef=0.1),
                       ref_logprobs=ref)
    assert m["losses/kl"] == pytest.approx(0.0, abs=1e-6)


def test_bad_inputs_are_rejected(model_dir, data):
    batch, offset, adv = data
    backend = TorchBackend(BackendConfig(), model_dir)
    with pytest.raises(ValueError, match="old_logprobs must be"):
        backend.update(batch, offset[:, :-1], adv, whole(batch), LossSettings())
    with pytest.raises(ValueError, match="advantages must be"):
        backend.update(batch, offset, adv[:-1], whole(batch), LossSettings())
    with pytest.raises(ValueError, match="row indices"):
        backend.update(batch, offset, adv, UpdatePlan([torch.tensor([0, 99])], 4), LossSettings())


# ---------------------------------------------------------------------------------------------
# The KL reference policy (keep_reference)
# ---------------------------------------------------------------------------------------------

REF = BackendConfig(keep_reference=True)


def test_kl_to_the_kept_reference_is_exactly_zero_until_the_policy_moves(model_dir, data):
    """The backend's frozen copy of the starting weights: on the first update (one mini-batch,
    so every token is scored before any step) the KL is exactly 0; after it, positive; the
    reference itself never changes."""
    batch, _, adv = data
    backend = TorchBackend(REF, model_dir, ADAM)
    assert backend.has_reference
    frozen = {n: p.detach().clone() for n, p in backend.reference.named_parameters()}
    loss = LossSettings(kl_coef=0.1)
    m1 = backend.update(batch, backend.logprobs(batch, 4), adv, whole(batch, 3), loss)
    m2 = backend.update(batch, backend.logprobs(batch, 4), adv, whole(batch, 3), loss)
    assert m1["losses/kl"] == 0.0
    assert m2["losses/kl"] > 1e-6
    assert max_diff(weights(backend), frozen) > 1e-4  # the policy moved ...
    assert max_diff({n: p.detach() for n, p in backend.reference.named_parameters()},
                    frozen) == 0.0  # ... its reference did not


def test_the_kl_loss_pulls_the_policy_back_to_the_reference(model_dir, data):
    """With zero advantages the KL term is the only loss: each step lowers the KL (the
    gradient has the right sign); without it nothing moves."""
    batch, _, adv = data
    backend = TorchBackend(REF, model_dir, ADAM)
    backend.update(batch, backend.logprobs(batch, 4), adv, whole(batch), LossSettings())
    zero = torch.zeros(len(batch))
    kls = [backend.update(batch, backend.logprobs(batch, 4), zero, whole(batch),
                          LossSettings(kl_coef=1.0))["losses/kl"] for _ in range(4)]
    assert kls[0] > 1e-4
    assert all(b < a for a, b in zip(kls, kls[1:])), kls


def test_the_reference_comes_from_reference_path(model_dir, data, tmp_path):
    """A resumed run trains from its checkpoint but keeps the INITIAL policy as reference."""
    from trainer.tiny import save_tiny

    other = save_tiny(tmp_path / "other", seed=1)
    backend = create_backend(REF, model_dir, ADAM, reference_path=other)
    ref = TorchBackend(BackendConfig(), other)
    got = {n: p.detach() for n, p in backend.reference.named_parameters()}
    assert max_diff(got, weights(ref)) == 0.0
    batch, _, adv = data
    m = backend.update(batch, backend.logprobs(batch, 4), adv, whole(batch),
                       LossSettings(kl_coef=0.1))
    assert m["losses/kl"] > 0.01  # the policy is not the reference


def test_kl_without_a_reference_is_a_clear_error(model_dir, data):
    batch, offset, adv = data
    backend = TorchBackend(PLAIN, model_dir, ADAM)
    assert not backend.has_reference
    with pytest.raises(ValueError, match="kl_coef != 0 needs a reference policy"):
        backend.update(batch, offset, adv, whole(batch), LossSettings(kl_coef=0.1))


def test_reference_memory_is_stated_and_counted_from_the_headers(model_dir):
    from trainer.backends.reference_memory import (ZERO3_PERSISTENCE_THRESHOLD, reference_memory,
                                            tensor_sizes)

    sizes = tensor_sizes(model_dir)
    n = sum(sizes)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    assert n == sum(p.numel() for p in model.parameters())  # tied weights counted once
    assert reference_memory(model_dir, REF).bytes_per_rank == 4 * n
    ds = BackendConfig(kind="deepspeed", zero_stage=3, dtype="bfloat16")
    assert reference_memory(model_dir, ds, world_size=1).bytes_per_rank == 2 * n
    sharded = sum(s if s <= ZERO3_PERSISTENCE_THRESHOLD else -(-s // 4) for s in sizes)
    assert reference_memory(model_dir, ds, world_size=4).bytes_per_rank == 2 * sharded
    assert "keep_reference" in BackendConfig.__dataclass_fields__
    help_text = magic.MagicConfig.field_help()["kl_coef"]
    assert "parameters x 4 bytes" in help_text and "reference_memory_gib" in help_text


def test_a_reference_too_large_for_the_memory_is_refused_before_loading(model_dir, monkeypatch):
    import trainer.backends.torch_backend as tb

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the memory check")

    monkeypatch.setattr(tb, "load_causal_lm", no_loading)
    monkeypatch.setattr(tb, "load_frozen_reference", no_loading)
    tight = dataclasses.replace(REF, reference_memory_gib=1e-5)  # ~10 KiB
    with pytest.raises(ValueError, match=r"keeps a frozen reference copy of the policy, which "
                                         r"needs [\d,]+ parameters x 4 bytes = [\d.]+ \w+ per "
                                         r"rank \(a full copy\), more than "
                                         r"backend.reference_memory_gib = 1e-05 GiB"):
        create_backend(tight, model_dir)
    with pytest.raises(ValueError, match="reference_memory_gib must be None or > 0"):
        BackendConfig(reference_memory_gib=0.0)


# ---------------------------------------------------------------------------------------------
# The output layer on response positions only; on-policy updates without the
# separate old-log-prob forward
# ---------------------------------------------------------------------------------------------

SPLITS = {
    "float32": BackendConfig(),
    "float32, one position per chunk (checkpointed chunks)": BackendConfig(entropy_chunk_size=1),
    "gradient checkpointing": BackendConfig(gradient_checkpointing=True, entropy_chunk_size=5),
    "bfloat16 autocast": BackendConfig(dtype="bfloat16", entropy_chunk_size=7),
}


@pytest.mark.parametrize("name", list(SPLITS))
def test_response_only_stats_equal_the_full_computation(model_dir, data, name):
    """token_stats over the split model (decoder, then the output layer on the response
    positions only, chunk by chunk) gives the log-probs, entropies and gradients of the full
    logits [B, L, V], at every response position; the other positions hold 0."""
    batch = data[0]
    backend = TorchBackend(SPLITS[name], model_dir)
    backend.model.train()  # as in the update (gradient checkpointing needs it)
    mask = batch.response_mask  # [B, L-1]
    chunk = backend.config.entropy_chunk_size
    ids, attn = batch.input_ids, batch.attention_mask

    def stats_and_grads(forward, positions):
        backend.model.zero_grad(set_to_none=True)
        lp, ent = token_stats(forward, ids, attn, positions=positions, entropy="grad",
                              chunk_size=chunk)  # [B, L-1] x2
        w = torch.linspace(0.5, 1.5, lp.numel()).view_as(lp)  # distinct weight per position
        ((lp * w * mask).sum() + (ent * w * mask).sum()).backward()
        return lp.detach(), ent.detach(), {n: p.grad.clone()
                                           for n, p in backend.model.named_parameters()}

    lp_full, ent_full, g_full = stats_and_grads(backend._forward_logits, None)
    lp, ent, g = stats_and_grads(backend._policy_forward(), mask)
    assert backend._policy_forward().head is not None  # the split path, not full logits
    tol = {"atol": 1e-5, "rtol": 1e-5} if name != "bfloat16 autocast" else {"atol": 1e-2,
                                                                             "rtol": 1e-2}
    torch.testing.assert_close(lp[mask], lp_full[mask], **tol)
    torch.testing.assert_close(ent[mask], ent_full[mask], **tol)
    assert bool((lp[~mask] == 0).all()) and bool((ent[~mask] == 0).all())
    for k in g_full:
        scale = float(g_full[k].abs().max()) + 1e-12
        assert float((g[k] - g_full[k]).abs().max()) / scale < (
            1e-4 if name != "bfloat16 autocast" else 5e-2), k


def test_response_only_logprobs_equal_the_full_ones_on_response_positions(model_dir, data):
    batch = data[0]
    backend = TorchBackend(BackendConfig(), model_dir)
    full = backend.logprobs(batch, 3)  # [B, L-1]
    resp = backend.logprobs(batch, 3, response_only=True)  # [B, L-1]
    mask = batch.response_mask
    torch.testing.assert_close(resp[mask], full[mask], atol=1e-6, rtol=1e-6)
    assert bool((resp[~mask] == 0).all())


def relative_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor],
                  before: dict[str, torch.Tensor]) -> float:
    """max |a - b| relative to the largest weight change of the update ``before -> b``."""
    return max_diff(a, b) / max_diff(b, before)


ON_POLICY_CASES = {
    "plain, 3 rows per micro-batch": (PLAIN, LossSettings(clip_high=0.28), 3),
    "entropy bonus, 1 row per micro-batch": (PLAIN, LossSettings(clip_high=0.28,
                                                                 entropy_coef=0.01), 1),
    "gradient checkpointing": (BackendConfig(gradient_checkpointing=True),
                               LossSettings(entropy_coef=0.01), 4),
    "KL to a kept reference": (BackendConfig(keep_reference=True),
                               LossSettings(kl_coef=0.1, entropy_coef=0.01), 3),
}


@pytest.mark.parametrize("name", list(ON_POLICY_CASES))
def test_on_policy_update_without_old_logprobs_equals_the_recomputed_path(model_dir, data,
                                                                          name):
    """One mini-batch: the old policy IS the current one, so old_logprobs=None (the training
    forward's detached log-probs) gives the update of the separate no-grad forward."""
    config, loss, mbs = ON_POLICY_CASES[name]
    batch, _, adv = data
    a = TorchBackend(config, model_dir, LINEAR)
    before = weights(a)
    ma = a.update(batch, a.logprobs(batch, mbs, response_only=True), adv, whole(batch, mbs),
                  loss)
    b = TorchBackend(config, model_dir, LINEAR)
    mb = b.update(batch, None, adv, whole(batch, mbs), loss)
    assert max_diff(weights(a), before) > 1e-2  # a large update: the equality means something
    assert relative_diff(weights(b), weights(a), before) < 1e-6
    assert mb["losses/ratio_mean"] == 1.0 and mb["losses/clipfrac"] == 0.0
    assert mb["losses/approx_kl"] == 0.0
    for key in ("losses/policy", "entropy", "grad_norm", "losses/num_tokens", "losses/kl"):
        assert mb.get(key, 0.0) == pytest.approx(ma.get(key, 0.0), rel=1e-5, abs=1e-7), key


def test_on_policy_update_runs_one_forward_per_micro_batch(model_dir, data):
    """The extra forward is skipped: with old_logprobs=None the policy runs once per
    micro-batch (the training forward), against twice with the recomputed old log-probs."""
    batch, _, adv = data
    backend = TorchBackend(PLAIN, model_dir, LINEAR)
    calls = []
    split = backend._split
    backend._split = SplitForward(
        lambda ids, attn, keep: calls.append(len(ids)) or split.body(ids, attn, keep),
        split.head)
    backend.update(batch, None, adv, whole(batch, 3), LossSettings())
    assert calls == [3, 3, 2]  # 8 rows, 3 per micro-batch: the update's forwards only
    calls.clear()
    old = backend.logprobs(batch, 3, response_only=True)
    backend.update(batch, old, adv, whole(batch, 3), LossSettings())
    assert calls == [3, 3, 2, 3, 3, 2]


def test_old_logprobs_none_needs_a_single_minibatch(model_dir, data):
    batch, _, adv = data
    backend = TorchBackend(PLAIN, model_dir, LINEAR)
    plan = UpdatePlan([torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 6, 7])], 2)
    with pytest.raises(ValueError, match="exactly one mini-batch"):
        backend.update(batch, None, adv, plan, LossSettings())
