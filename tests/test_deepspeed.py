"""DeepSpeedBackend on the CPU: in-process (a world of 1) for ZeRO 0-3 against TorchBackend, and
a real two-rank run under the ``deepspeed`` launcher against the single-process update.

DeepSpeed runs here on its CPU accelerator (auto-detected without a GPU) with gloo. Its first
use on a machine JIT-compiles the small ``deepspeed_shm_comm`` op (cached in
``~/.cache/torch_extensions``), which can take a minute on 2 cores; the timeouts allow for it.
Weights are compared under the eps-dominated AdamW of ``tests.ds_worker.LINEAR``, where the step
is the gradient itself, so a loss-scaling error cannot hide behind Adam's scale invariance.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.backend_fixtures import model_dir, one_torch_thread  # noqa: F401 (fixtures)
from tests.conftest import deepspeed_shm_buffers
from tests.ds_worker import (
    KL_CONFIG,
    KL_OPTIMIZER,
    KL_LOSS,
    LINEAR,
    LOSS,
    MICRO_BATCH_SIZE,
    RANK_ROWS,
    full_plan,
    make_batch,
    one_minibatch,
    rank_rows,
)
from trainer.backends import BackendConfig, OptimizerConfig, create_backend
from trainer.backends.torch_backend import TorchBackend
from trainer.hf_utils import CheckpointError
from trainer.interfaces import LossSettings

deepspeed = pytest.importorskip("deepspeed")
from trainer.backends.deepspeed_backend import DeepSpeedBackend, deepspeed_config

ROOT = Path(__file__).resolve().parents[1]
STAGES = [0, 1, 2, 3]  # all four run on DeepSpeed's CPU accelerator


@pytest.fixture(scope="module", autouse=True)
def no_leaked_process_group():
    """The backends create and destroy their own world of 1; nothing may outlive the module
    (other test files assert that torch.distributed is not initialised)."""
    assert not torch.distributed.is_initialized()
    yield
    assert not torch.distributed.is_initialized()
    assert "WORLD_SIZE" not in os.environ


def weights(backend) -> dict[str, torch.Tensor]:
    return {n: t.detach().cpu().clone() for n, t in backend.named_weights()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def reference_update(model_dir: Path, optimizer: OptimizerConfig = LINEAR):
    """TorchBackend on the whole batch: (initial weights, weights after, metrics, old)."""
    backend = TorchBackend(BackendConfig(), model_dir, optimizer)
    batch, offset, adv = make_batch()
    old = backend.logprobs(batch, 4) + offset
    before = weights(backend)
    metrics = backend.update(batch, old, adv, full_plan(), LOSS)
    return before, weights(backend), metrics, old


def ds_backend(model_dir: Path, stage: int, config: BackendConfig = BackendConfig(),
               optimizer: OptimizerConfig = LINEAR) -> DeepSpeedBackend:
    backend = create_backend(dataclasses.replace(config, kind="deepspeed", zero_stage=stage),
                             model_dir, optimizer)
    assert isinstance(backend, DeepSpeedBackend)
    return backend


def test_config_dict_keeps_loss_scaling_exact():
    cfg = deepspeed_config(BackendConfig(kind="deepspeed", zero_stage=3),
                           OptimizerConfig(grad_clip=0.5), 4)
    assert cfg["gradient_accumulation_steps"] == 1  # engine.backward divides by 1
    assert cfg["train_batch_size"] == 4 and cfg["gradient_clipping"] == 0.5
    assert cfg["zero_optimization"]["stage"] == 3
    params = cfg["optimizer"]["params"]
    assert cfg["optimizer"]["type"] == "AdamW" and params["torch_adam"] is True
    assert (params["lr"], params["betas"], params["weight_decay"]) == (1e-6, [0.9, 0.999], 0.01)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stage", STAGES)
def test_world_of_one_update_equals_torch_backend(model_dir, stage):
    before, want, ref_metrics, old = reference_update(model_dir)
    batch, _, adv = make_batch()
    backend = ds_backend(model_dir, stage)
    try:
        assert (backend.rank, backend.world_size) == (0, 1)
        torch.testing.assert_close(backend.logprobs(batch, 3), old - make_batch()[1],
                                   atol=1e-6, rtol=0)
        metrics = backend.update(batch, old, adv, full_plan(), LOSS)
        got = weights(backend)  # ZeRO-3: gathered from the partitions
    finally:
        backend.close()
    assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in want.items()}
    assert max_diff(want, before) > 1e-2  # the update is large ...
    assert max_diff(got, want) < 1e-5  # ... and DeepSpeed's equals TorchBackend's
    for key in ("grad_norm", "entropy", "losses/policy", "losses/clipfrac", "losses/num_tokens"):
        assert metrics[key] == pytest.approx(ref_metrics[key], rel=rel_tol(key), abs=1e-7), key


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stage", [0, 3])
def test_save_load_resumes_identically(model_dir, tmp_path, stage):
    """Real Adam (eps 1e-8): the next update depends on the restored moments."""
    adam = OptimizerConfig(lr=1e-3)
    batch, offset, adv = make_batch()
    loss = LossSettings(entropy_coef=0.002)
    a = ds_backend(model_dir, stage, optimizer=adam)
    try:
        old = a.logprobs(batch, 4) + offset
        a.update(batch, old, adv, full_plan(), loss)
        saved = weights(a)
        a.save(tmp_path / "ckpt")
        a.update(batch, old, adv, full_plan(), loss)
        continued = weights(a)
    finally:
        a.close()
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt"), dtype=torch.float32)
    assert max_diff(saved, {n: p.detach() for n, p in hf.named_parameters()}) == 0.0

    b = ds_backend(model_dir, stage, optimizer=adam)
    try:
        b.load(tmp_path / "ckpt")
        assert max_diff(weights(b), saved) == 0.0
        b.update(batch, old, adv, full_plan(), loss)
        resumed = weights(b)
        with pytest.raises(CheckpointError, match="not a DeepSpeedBackend checkpoint"):
            b.load(model_dir)
    finally:
        b.close()
    assert max_diff(resumed, continued) < 1e-7


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stage", [0, 3])
def test_world_of_one_on_policy_update_equals_torch_backend(model_dir, stage):
    """On-policy (one mini-batch, old_logprobs=None: the training forward's detached
    log-probs) DeepSpeed gives TorchBackend's recomputed-old-log-prob update, with its output
    layer on the response positions only (HF's logits_to_keep through the engine)."""
    batch, _, adv = make_batch()
    plan = one_minibatch(len(batch))
    torch_backend = TorchBackend(BackendConfig(), model_dir, LINEAR)
    before = weights(torch_backend)
    ref_metrics = torch_backend.update(batch, torch_backend.logprobs(batch, 4), adv, plan, LOSS)
    want = weights(torch_backend)
    backend = ds_backend(model_dir, stage)
    try:
        old = backend.logprobs(batch, 3, response_only=True)
        torch.testing.assert_close(old[batch.response_mask],
                                   TorchBackend(BackendConfig(), model_dir, LINEAR).logprobs(batch, 3)[
                                       batch.response_mask], atol=1e-6, rtol=0)
        metrics = backend.update(batch, None, adv, plan, LOSS)
        got = weights(backend)
    finally:
        backend.close()
    assert max_diff(want, before) > 1e-2
    assert max_diff(got, want) / max_diff(want, before) < 1e-5
    assert metrics["losses/ratio_mean"] == 1.0
    for key in ("grad_norm", "entropy", "losses/policy", "losses/num_tokens"):
        assert metrics[key] == pytest.approx(ref_metrics[key], rel=rel_tol(key), abs=1e-7), key


def test_deepspeed_backend_rejects_a_missing_model(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        DeepSpeedBackend(BackendConfig(kind="deepspeed"), tmp_path / "missing")
    assert not torch.distributed.is_initialized()  # failed before initialising anything


def rel_tol(key: str) -> float:
    """The grad norm is a float32 sum of squares over every parameter, reduced in a different
    order by DeepSpeed (flat buffers) than by torch.nn.utils.clip_grad_norm_: the relative
    difference is about sqrt(N) * 6e-8, ~2e-5 for the tiny model's ~80K embedding entries."""
    return 1e-4 if key == "grad_norm" else 1e-5


def _launcher() -> list[str]:
    exe = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("the deepspeed launcher is not installed next to this Python")
    return [exe]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_ranks_under_the_deepspeed_launcher_equal_one_process(model_dir, tmp_path):
    """Two ranks, each with its own share of every mini-batch (uneven: different row and token
    counts, and rank 1 runs fewer micro-batches), one update per ZeRO stage 0/2/3: the weights
    and the metrics equal the single-process update on the whole batch. This is the
    global-token-count rule across data-parallel ranks (docs/magic.md)."""
    batch = make_batch()[0]
    counts = [int(batch.response_mask[rank_rows(r)].sum()) for r in (0, 1)]
    assert counts[0] != counts[1] and len(rank_rows(0)) != len(rank_rows(1))
    assert len(RANK_ROWS[0][1]) > MICRO_BATCH_SIZE >= len(RANK_ROWS[1][1])

    from trainer.backends.deepspeed_backend import free_port

    out = tmp_path / "out"
    stages = [0, 2, 3]
    port = free_port()
    cmd = _launcher() + ["--num_gpus", "2", "--master_port", str(port),
                         str(ROOT / "tests" / "ds_worker.py"), "--model", str(model_dir),
                         "--out", str(out), "--stages", *map(str, stages)]
    # PYTHONFAULTHANDLER: a rank that dies on a signal prints every thread's Python stack.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # DeepSpeed's shm all-reduce buffers (69 MB of RAM per rank) were used and then released
    assert "deepspeed_shm_comm_op" in proc.stdout + proc.stderr  # the op that makes them
    assert deepspeed_shm_buffers(port) == []

    before, want, ref_metrics, _ = reference_update(model_dir)
    for stage in stages:
        result = torch.load(out / f"stage{stage}.pt", weights_only=True)
        assert result["world_size"] == 2
        assert max_diff(want, before) > 1e-2
        assert max_diff(result["weights"], want) < 1e-5, stage
        metrics = result["metrics"]
        rank1 = torch.load(out / f"metrics{stage}_rank1.pt", weights_only=True)
        assert rank1 == pytest.approx(metrics, rel=1e-12)  # metrics are global on every rank
        for key in ("grad_norm", "entropy", "losses/policy", "losses/clipfrac",
                    "losses/num_tokens"):
            assert metrics[key] == pytest.approx(ref_metrics[key], rel=rel_tol(key), abs=1e-7), key
        assert (out / f"ckpt{stage}" / "model.safetensors").is_file()


# -- the KL reference policy -------------------------------------------------------------------

def torch_kl_updates(model_dir: Path) -> tuple[dict, dict]:
    """TorchBackend with a reference, on the whole batch: the two updates' metrics."""
    backend = TorchBackend(KL_CONFIG, model_dir, KL_OPTIMIZER)
    batch, _, adv = make_batch()
    plan = one_minibatch(len(batch))
    first = backend.update(batch, backend.logprobs(batch, 4), adv, plan, KL_LOSS)
    second = backend.update(batch, backend.logprobs(batch, 4), adv, plan, KL_LOSS)
    return first, second


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stage", [0, 3])
def test_world_of_one_kl_reference_equals_torch_backend(model_dir, stage):
    want_first, want_second = torch_kl_updates(model_dir)
    batch, _, adv = make_batch()
    backend = ds_backend(model_dir, stage, KL_CONFIG, KL_OPTIMIZER)
    try:
        assert backend.has_reference
        plan = one_minibatch(len(batch))
        first = backend.update(batch, backend.logprobs(batch, 4), adv, plan, KL_LOSS)
        second = backend.update(batch, backend.logprobs(batch, 4), adv, plan, KL_LOSS)
    finally:
        backend.close()
    assert first["losses/kl"] == 0.0 == want_first["losses/kl"]
    assert second["losses/kl"] > 1e-6
    assert second["losses/kl"] == pytest.approx(want_second["losses/kl"], rel=1e-4)


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory) -> Path:
    """hidden 128: the embedding (1,205 x 128 = 154K entries) is above DeepSpeed's ZeRO-3
    persistence threshold (100K), so it is really partitioned over the ranks."""
    from trainer.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("wide"), hidden_size=128, intermediate_size=256)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_kl_reference_on_two_ranks_under_zero3(wide_model_dir, tmp_path):
    """Two ranks under the deepspeed launcher, ZeRO-3, uneven shares: the reference policy is
    partitioned exactly like the policy (the same shard on every parameter, the embedding
    really split), the KL is exactly 0 on the first update and positive after it, the same on
    both ranks, and equal to the single-process TorchBackend's on the whole batch."""
    from trainer.backends.deepspeed_backend import free_port

    out = tmp_path / "out"
    cmd = _launcher() + ["--num_gpus", "2", "--master_port", str(free_port()),
                         str(ROOT / "tests" / "ds_worker.py"), "--model", str(wide_model_dir),
                         "--out", str(out), "--stages", "3", "--kl"]
    # PYTHONFAULTHANDLER: a rank that dies on a signal prints every thread's Python stack.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ranks = [torch.load(out / f"kl3_rank{r}.pt", weights_only=True) for r in (0, 1)]
    want_first, want_second = torch_kl_updates(wide_model_dir)
    for res in ranks:
        assert res["world_size"] == 2
        assert res["first"]["losses/kl"] == 0.0
        assert res["second"]["losses/kl"] == pytest.approx(want_second["losses/kl"], rel=1e-4)
        assert res["second"]["losses/kl"] > 1e-6
        assert res["reference"] == res["policy"]  # sharded like the policy
        embed = res["reference"]["model.embed_tokens.weight"]
        assert embed[0][0] * 2 >= embed[1] > embed[0][0]  # half of it on each rank
    assert ranks[0]["second"] == pytest.approx(ranks[1]["second"], rel=1e-12)
