"""Metric names are declared once (trainer/metric_names.py): a real training step and evaluation
emit only declared names, every declared name is in docs/contracts.md's table, and no other
module of ``trainer/`` spells one as a string."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.test_trainer import data, demo_config  # noqa: F401  (the arithmetic data fixture)
from trainer import metric_names as mn
from trainer.ablation.designs import WINDOWS, run_numbers

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def emitted(data, tmp_path_factory) -> dict[str, object]:  # noqa: F811
    """The keys of one real step and one evaluation: a tiny random model, the HF engine, the
    torch backend, a local verifier. No online filter (a random model's groups are all wrong:
    filtered, the update would be skipped) and ``log_kl`` (the reference's metric too)."""
    from trainer.loop import Trainer

    cfg = demo_config(data, tmp_path_factory.mktemp("run"), magic__online_filter=False,
                      magic__log_kl=True, log__tensorboard=False, log__plots=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    trainer = Trainer(cfg)
    try:
        metrics = trainer.train_step()
        assert not metrics[mn.UPDATE_SKIPPED]
        metrics.update(trainer.evaluate())
    finally:
        trainer.close()
        torch.set_num_threads(threads)
    return metrics


def test_every_metric_a_step_emits_is_declared(emitted) -> None:
    undeclared = sorted(k for k in emitted if not mn.declared(k))
    assert not undeclared, f"declare these in trainer/metric_names.py: {undeclared}"
    # the families are exercised too: a per-source reward and a per-source avg@k
    assert any(k.startswith("reward/by_source/") for k in emitted)
    assert mn.eval_avg_at_k("arithmetic", 2) in emitted, sorted(emitted)  # eval.n_samples=2


def test_a_step_emits_every_per_step_name(emitted) -> None:
    """METRICS holds nothing stale: each plain name (families aside) is emitted by a step with
    a reference policy and an evaluation."""
    plain = [k for k in mn.METRICS if "<" not in k]
    assert sorted(k for k in plain if k not in emitted) == []


def test_every_declared_name_is_documented_in_the_contracts() -> None:
    doc = (ROOT / "docs" / "contracts.md").read_text(encoding="utf-8")
    missing = [k for k in (*mn.METRICS, *mn.ABLATION_METRICS) if f"`{k}`" not in doc]
    assert not missing, f"docs/contracts.md's metric table lacks {missing}"


def test_an_ablation_summary_names_only_declared_metrics() -> None:
    keys = run_numbers([])
    known = {*mn.METRICS, *mn.ABLATION_METRICS, "steps", f"{mn.TOKENS}@stage1",
             f"{mn.EVAL_ACCURACY}@stage1"}
    windowed = {f"{k}@{w}" for k in known for w in WINDOWS}
    assert sorted(k for k in keys if k not in known | windowed) == []


def test_no_module_spells_a_metric_name() -> None:
    """The rule of trainer/metric_names.py: every other module imports the name (but
    trainer/magic/reference_step.py, plain torch in one file by design)."""
    names = {k for k in (*mn.METRICS, *mn.ABLATION_METRICS) if "/" in k and "<" not in k}
    found = []
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        if path.name in ("metric_names.py", "reference_step.py"):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{n}: {m}"
                      for m in re.findall(r'"([a-z_]+/[a-z_@/]+)"', line) if m in names]
    assert not found, found
