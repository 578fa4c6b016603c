"""The update at real response lengths (trainer/backends/packing.py, docs/magic.md "How a step
is split"): token-budget micro-batches, padding-free packing and token-balanced ranks give the
row split's loss, gradients, entropy and metrics (float32 rounding apart), and a packed row
never sees another row.

Weights are compared under the eps-dominated AdamW of ``tests.ds_worker.LINEAR`` (the step IS
the gradient), so a wrong loss scale or denominator shows in the weights.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.backend_fixtures import model_dir, one_torch_thread  # noqa: F401 (fixtures)
from tests.ds_worker import LINEAR, LOSS, PAD_ID, VOCAB, make_batch
from trainer import metric_names as mn
from trainer.backends import BackendConfig
from trainer.backends.forward import packed_token_stats, token_stats
from trainer.backends.packing import (
    balance_ranks,
    oversized_rows,
    pack_rows,
    rank_rows,
    rebalance,
    split_stats,
    token_budget_micro_batches,
)
from trainer.backends.torch_backend import TorchBackend
from trainer.config import load_config
from trainer.interfaces import Completion, LossSettings, TokenBatch, UpdatePlan

pytestmark = pytest.mark.timeout(180)

#: What the packed path may differ from the row split by: float32 rounding of differently
#: shaped matrix products, on weights moved by up to ~1 (LINEAR: the step is the gradient);
#: the tolerance tests/test_deepspeed.py allows DeepSpeed against TorchBackend.
WEIGHT_TOL = 1e-5


def weights(backend) -> dict[str, torch.Tensor]:
    return {n: t.detach().cpu().clone() for n, t in backend.named_weights()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def random_batch(lengths: list[tuple[int, int]], seed: int) -> tuple[TokenBatch, torch.Tensor,
                                                                      torch.Tensor]:
    """Rows of (prompt, response) lengths; old-log-prob offsets and mixed-sign advantages."""
    g = torch.Generator().manual_seed(seed)
    comps = [Completion(i, 0, torch.randint(4, VOCAB, (p,), generator=g).tolist(),
                        torch.randint(4, VOCAB, (r,), generator=g).tolist(), "", False)
             for i, (p, r) in enumerate(lengths)]
    batch = TokenBatch.from_completions(comps, pad_id=PAD_ID)
    offset = 0.15 * torch.randn(batch.response_mask.shape, generator=g)  # [B, L-1]
    return batch, offset, torch.randn(len(lengths), generator=g)  # [B]


# ---------------------------------------------------------------------------------------------
# The rules, pure
# ---------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=0, max_size=40), st.integers(1, 60),
       st.integers(1, 8))
def test_budget_micro_batches_hold_every_row_once_within_the_budget(lengths, budget, rows):
    bins = token_budget_micro_batches(lengths, budget, rows)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for b in bins:
        assert 1 <= len(b) <= rows and b == sorted(b)
        if sum(lengths[i] for i in b) > budget:  # only a row over the budget, alone
            assert len(b) == 1 and lengths[b[0]] > budget
    assert sum(len(b) == 1 and lengths[b[0]] > budget for b in bins) == oversized_rows(
        lengths, budget)
    assert oversized_rows(lengths, None) == 0


def test_first_fit_decreasing_fills_micro_batches():
    # 8 rows over a 16-token budget pack into 3 full-ish micro-batches (row split by 2: 4)
    assert token_budget_micro_batches([9, 7, 5, 3, 8, 8, 4, 4], 16, 8) == [
        [0, 1], [4, 5], [2, 3, 6, 7]]
    with pytest.raises(ValueError, match="budget and max_rows"):
        token_budget_micro_batches([3], 0, 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=0, max_size=60), st.integers(1, 8))
def test_balanced_ranks_differ_by_at_most_one_row(lengths, world):
    ranks = balance_ranks(lengths, world)
    assert len(ranks) == world
    assert sorted(i for r in ranks for i in r) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in r) for r in ranks]
    # LPT: the busiest rank exceeds the least busy by at most one row
    assert max(loads) - min(loads) <= max(lengths, default=0)


def test_pack_rows_restarts_positions_and_indexes_the_targets():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]])  # [2, 4]
    attn = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    resp = torch.tensor([[False, True, False], [False, True, True]])  # [2, 3]
    p = pack_rows(ids, attn, resp)
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11]]
    assert p.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3]]
    assert p.index.tolist() == [1, 4, 5] and p.targets.tolist() == [7, 10, 11]
    with pytest.raises(ValueError, match="right-padded"):
        pack_rows(ids, torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]]))


def test_split_stats_counts_padding_and_the_lockstep():
    # rank 0: two micro-batches, rank 1: one (so one padding micro-batch)
    packed = split_stats([[[4, 2], [3]], [[5]]], packed=True)
    assert packed["computed_over_useful"] == pytest.approx((9 + 5 + 5) / 14)
    padded = split_stats([[[4, 2], [3]], [[5]]], packed=False)
    assert padded["computed_over_useful"] == pytest.approx((8 + 3 + 5 + 5) / 14)
    assert padded["rank_imbalance"] == pytest.approx(11 / 10.5 - 1)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 5), st.integers(1, 3), st.data())
def test_rebalance_moves_rows_not_minibatches(world, steps, data):
    """Every rank's rows dealt out again: each mini-batch keeps exactly its rows (with their
    tokens, response masks and advantages), each row on one rank, tokens balanced."""
    shares = []
    for r in range(world):
        n = data.draw(st.integers(1, 6))
        lens = data.draw(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 9)),
                                  min_size=n, max_size=n))
        batch, _, adv = random_batch(lens, seed=r)
        mbs = [torch.tensor(sorted(data.draw(st.sets(st.integers(0, n - 1)))), dtype=torch.long)
               for _ in range(steps)]
        shares.append(rank_rows(batch, adv, mbs))

    def content(tokens, resp, adv):
        return (tuple(tokens.tolist()), tuple(resp.tolist()), round(float(adv), 6))

    want = [sorted(content(s.tokens[i], s.response[i], s.advantages[i])
                   for s in shares for i in s.minibatches[k]) for k in range(steps)]
    got: list[list] = [[] for _ in range(steps)]
    for rank in range(world):
        batch, adv, mbs = rebalance(shares, rank, PAD_ID)
        assert len(mbs) == steps
        n = batch.attention_mask.sum(1)
        for k, rows in enumerate(mbs):
            got[k] += [content(batch.input_ids[i, :n[i]], batch.response_mask[i, :n[i] - 1],
                               adv[i]) for i in rows.tolist()]
    assert [sorted(g) for g in got] == want


# ---------------------------------------------------------------------------------------------
# The model: packed equals padded, and rows are isolated
# ---------------------------------------------------------------------------------------------

def test_a_packed_row_never_sees_another_row(model_dir):
    """Change one row's tokens (same length): every other row's log-probs and entropy are
    bit-identical, in the packed forward."""
    backend = TorchBackend(BackendConfig(), model_dir)
    batch = make_batch()[0]
    forward = backend._policy_forward()
    with torch.no_grad():
        lp, ent = packed_token_stats(forward, batch.input_ids, batch.attention_mask,
                                     positions=batch.response_mask, entropy="detached")
        changed = batch.input_ids.clone()
        n = int(batch.attention_mask[3].sum())
        changed[3, :n] = (changed[3, :n] * 7 + 3) % (VOCAB - 4) + 4  # other tokens
        assert not torch.equal(changed, batch.input_ids)
        lp2, ent2 = packed_token_stats(forward, changed, batch.attention_mask,
                                       positions=batch.response_mask, entropy="detached")
        padded, _ = token_stats(forward, batch.input_ids, batch.attention_mask,
                                positions=batch.response_mask)
    others = torch.arange(len(batch)) != 3
    assert torch.equal(lp[others], lp2[others]) and torch.equal(ent[others], ent2[others])
    assert not torch.equal(lp[3], lp2[3])
    torch.testing.assert_close(lp, padded, atol=2e-6, rtol=0)  # the padded forward's values


def update_pair(model_dir, batch, offset, adv, plan: UpdatePlan, budget: int,
                loss: LossSettings = LOSS, on_policy: bool = False):
    """(row-split backend, metrics), (packed backend, metrics) from the same start."""
    out = []
    for max_tokens in (None, budget):
        backend = TorchBackend(BackendConfig(), model_dir, LINEAR)
        old = None if on_policy else backend.logprobs(
            batch, plan.micro_batch_size, response_only=True,
            max_tokens_per_micro_batch=max_tokens) + offset
        m = backend.update(batch, old, adv,
                           dataclasses.replace(plan, max_tokens_per_micro_batch=max_tokens), loss)
        out.append((backend, m))
    return out


def assert_same_update(row, packed, *, got=None, want=None):
    """The packed update's weights (``got``, else its backend's) and metrics equal the row
    split's (``want``, else its backend's)."""
    (a, ma), (b, mb) = row, packed
    wa = weights(a) if want is None else want
    wb = weights(b) if got is None else got
    assert max_diff(wa, wb) < WEIGHT_TOL
    for key in ma:
        if key in (mn.UPDATE_COMPUTED_OVER_REAL, mn.UPDATE_OVERSIZED_ROWS):
            continue  # the point of packing, and a count only a budget has
        rel = 1e-4 if key in (mn.GRAD_NORM, mn.GRAD_NORM_MAX) else 1e-5
        assert mb[key] == pytest.approx(ma[key], rel=rel, abs=1e-6), key
    # packed: no padding, but the lockstep's padding micro-batches (several ranks) count
    assert mb[mn.UPDATE_COMPUTED_OVER_REAL] >= 1.0


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 14)), min_size=2, max_size=9),
       st.integers(4, 30), st.integers(1, 4), st.booleans(), st.integers(0, 10**6))
def test_packed_update_equals_the_row_split(model_dir, lengths, budget, mbs, two_steps, seed):
    """Random lengths, budgets (rows over the budget included), row caps, one or two
    mini-batches (recomputed old log-probs), entropy bonus and clipping active: the packed
    update's weights and every metric equal the row split's."""
    batch, offset, adv = random_batch(lengths, seed)
    rows = torch.randperm(len(batch), generator=torch.Generator().manual_seed(seed))
    minibatches = [rows[::2], rows[1::2]] if two_steps else [rows]
    row, packed = update_pair(model_dir, batch, offset, adv, UpdatePlan(minibatches, mbs),
                              budget)
    assert_same_update(row, packed)
    assert packed[1][mn.UPDATE_COMPUTED_OVER_REAL] == 1.0  # one rank: no padding at all
    n = batch.attention_mask.sum(1)
    assert packed[1][mn.UPDATE_OVERSIZED_ROWS] == sum(
        oversized_rows(n[m].tolist(), budget) for m in minibatches)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_on_policy_update_with_kl_equals_the_row_split(model_dir, checkpointing):
    """On-policy (the training forward's own log-probs) with a reference policy and a KL loss,
    gradient checkpointing off and on (backward recomputes the packed layers): the reference
    forward is packed too, and the KL starts at exactly 0."""
    batch, offset, adv = random_batch([(3, 9), (5, 2), (4, 12), (2, 1), (3, 6)], seed=5)
    loss = LossSettings(clip_high=0.28, entropy_coef=0.01, kl_coef=0.1)
    config = BackendConfig(keep_reference=True, gradient_checkpointing=checkpointing)
    out = []
    for budget in (None, 16):
        backend = TorchBackend(config, model_dir, LINEAR)
        m = backend.update(batch, None, adv, UpdatePlan([torch.arange(5)], 2, budget), loss)
        assert m[mn.LOSS_KL] == 0.0
        out.append((backend, m))
    assert_same_update(*out)
    assert out[1][1][mn.UPDATE_OVERSIZED_ROWS] == 0


def test_packed_logprobs_equal_the_padded_ones(model_dir):
    batch = random_batch([(3, 9), (5, 2), (4, 12), (2, 1)], seed=1)[0]
    backend = TorchBackend(BackendConfig(), model_dir)
    padded = backend.logprobs(batch, 2, response_only=True, temperature=0.7)
    packed = backend.logprobs(batch, 2, response_only=True, temperature=0.7,
                              max_tokens_per_micro_batch=10)
    torch.testing.assert_close(packed, padded, atol=2e-6, rtol=0)
    assert torch.equal(packed == 0, padded == 0)


# ---------------------------------------------------------------------------------------------
# The config key
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, rule", [
    ("0", "max_tokens_per_micro_batch must be >= 1"),
    ("-5", "max_tokens_per_micro_batch must be >= 1"),
    ("2048", "max_tokens_per_micro_batch \\(2048\\) must exceed magic.max_prompt_length"),
    ("100", "max_tokens_per_micro_batch \\(100\\) must exceed magic.max_prompt_length \\(2048"),
])
def test_a_bad_budget_is_refused_naming_the_key(tmp_path, value, rule):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    with pytest.raises(ValueError, match=rule):
        load_config(None, ["tiny_model={}", f"data.train_files=[{data}]", "eval.every_steps=0",
                           f"max_tokens_per_micro_batch={value}"])


def test_the_default_keeps_the_row_split_and_recipes_set_a_budget():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "trainer" / "configs"
    demo = load_config(root / "demo.yaml")
    assert demo.max_tokens_per_micro_batch is None  # the demo's numbers, bit for bit
    for name in ("skywork_or1_7b.yaml", "skywork_or1_32b.yaml"):
        cfg = load_config(root / name, ["data.train_files=[x.jsonl]"])
        longest = cfg.magic.max_prompt_length + max(s.max_response_length
                                                    for s in cfg.magic.stages)
        assert cfg.max_tokens_per_micro_batch is not None
        assert cfg.max_tokens_per_micro_batch >= longest, name  # no row is ever trained alone


# ---------------------------------------------------------------------------------------------
# DeepSpeed: a world of one, and two ranks under the launcher
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("stage", [0, 3])
def test_deepspeed_packed_update_equals_the_torch_row_split(model_dir, stage):
    pytest.importorskip("deepspeed")
    from tests.ds_worker import BUDGET, full_plan
    from tests.test_deepspeed import ds_backend, reference_update

    _, want, ref_metrics, old = reference_update(model_dir)
    batch, _, adv = make_batch()
    backend = ds_backend(model_dir, stage)
    try:
        torch.testing.assert_close(
            backend.logprobs(batch, 2, max_tokens_per_micro_batch=BUDGET), old - make_batch()[1],
            atol=2e-6, rtol=0)
        metrics = backend.update(batch, old, adv, dataclasses.replace(
            full_plan(), max_tokens_per_micro_batch=BUDGET), LOSS)
        got = weights(backend)
    finally:
        backend.close()
    assert_same_update((None, ref_metrics), (None, metrics), got=got, want=want)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_ranks_packed_and_balanced_equal_one_process(model_dir, tmp_path):
    """Two ranks under the deepspeed launcher (gloo), ZeRO 0 and 3: the uneven shares packed
    into token-budget micro-batches, and the rows dealt out again to balance tokens, each give
    the single-process row split's weights and metrics."""
    pytest.importorskip("deepspeed")
    import os
    import subprocess
    from pathlib import Path

    from tests.test_deepspeed import ROOT, _launcher, reference_update
    from trainer.backends.deepspeed_backend import free_port

    out = tmp_path / "out"
    stages = [0, 3]
    cmd = _launcher() + ["--num_gpus", "2", "--master_port", str(free_port()),
                         str(ROOT / "tests" / "ds_worker.py"), "--model", str(model_dir),
                         "--out", str(out), "--stages", *map(str, stages), "--packed"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    _, want, ref_metrics, _ = reference_update(model_dir)
    # the balanced variant recomputes pi_old after the exchange: its reference has no offset
    backend = TorchBackend(BackendConfig(), model_dir, LINEAR)
    batch, _, adv = make_batch()
    from tests.ds_worker import full_plan

    bal_metrics = backend.update(batch, backend.logprobs(batch, 4), adv, full_plan(), LOSS)
    bal_want = weights(backend)
    for stage in stages:
        packed = torch.load(Path(out) / f"packed{stage}.pt", weights_only=True)
        assert_same_update((None, ref_metrics), (None, packed["metrics"]),
                           got=packed["weights"], want=want)
        balanced = torch.load(Path(out) / f"balanced{stage}.pt", weights_only=True)
        assert_same_update((None, bal_metrics), (None, balanced["metrics"]),
                           got=balanced["weights"], want=bal_want)
        tokens = [torch.load(Path(out) / f"balanced{stage}_tokens{r}.pt") for r in (0, 1)]
        assert abs(tokens[0] - tokens[1]) <= 14  # at most one row apart (LPT)


# ---------------------------------------------------------------------------------------------
# The loop: a run's key reaches the update
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_training_step_with_a_budget_equals_the_row_split(tmp_path):
    """One `trainer run` step (tiny random model, HF engine, local verifier, off-policy so that
    the old log-probs are recomputed too) with and without ``max_tokens_per_micro_batch``:
    the same update, computed without padding."""
    from tests.test_trainer import _arithmetic, demo_config
    from trainer.loop import Trainer

    _arithmetic().write(tmp_path, 40, 4, seed=1, ops=("max",))
    steps = []
    for budget in ("null", "80"):
        cfg = demo_config(tmp_path, tmp_path / f"run{budget}", magic__online_filter=False,
                          magic__mini_batch_size=2, log__tensorboard=False, log__plots=False,
                          eval__every_steps=0, max_tokens_per_micro_batch=budget)
        assert cfg.max_tokens_per_micro_batch == (None if budget == "null" else 80)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        trainer = Trainer(cfg)
        try:
            steps.append(trainer.train_step())
        finally:
            trainer.close()
            torch.set_num_threads(threads)
    row, packed = steps
    assert row[mn.OPTIMIZER_STEPS] == packed[mn.OPTIMIZER_STEPS] == 2  # two mini-batches
    for key in (mn.LOSS_POLICY, mn.ENTROPY, mn.GRAD_NORM, mn.LOSS_NUM_TOKENS, mn.REWARD_MEAN):
        assert packed[key] == pytest.approx(row[key], rel=1e-4, abs=1e-6), key
    assert packed[mn.UPDATE_COMPUTED_OVER_REAL] == 1.0 < row[mn.UPDATE_COMPUTED_OVER_REAL]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_compiled_packed_update_equals_eager_and_never_recompiles(model_dir):
    """BackendConfig.compile='on' (the CUDA default), packed: the per-row attention runs outside
    the compiled graph (torch.compiler.disable), so new row lengths do not recompile, and the
    update equals the eager one (inductor's float32 kernels apart). ~40 s of compilation."""
    import torch._dynamo

    ws = []
    for mode in ("off", "on"):
        torch._dynamo.reset()
        backend = TorchBackend(BackendConfig(compile=mode), model_dir, LINEAR, device="cpu")
        for k, lengths in enumerate(([(3, 9), (5, 2), (4, 12), (2, 1), (3, 6)],
                                     [(3, 7), (5, 4), (4, 10), (2, 3), (3, 8), (2, 2)])):
            batch, _, adv = random_batch(lengths, seed=k)
            with torch._dynamo.config.patch(error_on_recompile=k > 0 and mode == "on"):
                backend.update(batch, None, adv, UpdatePlan([torch.arange(len(batch))], 8, 16),
                               LOSS)
        ws.append(weights(backend))
    assert max_diff(*ws) < WEIGHT_TOL


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_trainer_run_on_two_ranks_deals_rows_out_by_tokens(tmp_path):
    """`trainer run` under `deepspeed --num_gpus 2` with a budget: each rank's kept rows are
    gathered and dealt out again by tokens (packing.rebalance) before the old log-probs and the
    update, the collectives stay in lockstep, and the step logs a padding-free update."""
    import json

    from tests.test_trainer import _arithmetic, deepspeed_launch, overrides
    from trainer.tiny import save_tiny

    _arithmetic().write(tmp_path, 40, 4, seed=1, ops=("max",))
    model = save_tiny(tmp_path / "model", hidden_size=32, layers=1, heads=2, kv_heads=1)
    args = overrides(tmp_path, tmp_path, model, total_steps=1, eval__every_steps=0,
                     checkpoint_every=0, backend__kind="deepspeed", backend__zero_stage=2,
                     magic__online_filter="false", magic__mini_batch_size=2,
                     max_tokens_per_micro_batch=80)
    r = deepspeed_launch("--config", "trainer/configs/demo.yaml", *args)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    step = rows[-1]
    assert step["step"] == 1 and step[mn.OPTIMIZER_STEPS] == 2
    # no padding; only the lockstep's padding micro-batches can cost more than the real tokens
    assert 1.0 <= step[mn.UPDATE_COMPUTED_OVER_REAL] < 1.5
