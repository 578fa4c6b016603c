"""`make demo-entropy` (scripts/demo_entropy.py): what it concludes from the runs' metrics.
The runs themselves are `trainer run` of the demo config (tested in tests/test_trainer.py); here
the analysis reads crafted metrics: the window starts where an adaptive run first reaches the
target, the paired differences and their verdicts, the plot, and a run that never reaches it."""

from __future__ import annotations

import json
from pathlib import Path

from scripts import demo_entropy as de
from trainer.ablation.stats import INCONCLUSIVE, REPRODUCED


def write_run(out: Path, arm: str, seed: int, entropy: list[float]) -> None:
    run = de.run_dir(out, arm, seed)
    run.mkdir(parents=True)
    rows = [{"step": s + 1, "entropy": e, "entropy/coef": 0.01 if arm == "adaptive" else 0.0,
             "reward/mean": 0.5} for s, e in enumerate(entropy)]
    rows[-1]["eval/accuracy"] = 0.8 + 0.01 * seed
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_controller_holding_its_target_is_reproduced(tmp_path) -> None:
    steps = 60
    for seed in de.SEEDS:
        falling = [0.10 - 0.0008 * s + 0.0005 * seed for s in range(steps)]  # to ~0.053
        held = [max(0.08 - 0.0003 * seed, x) for x in falling]  # stops at the target
        write_run(tmp_path, "off", seed, falling)
        write_run(tmp_path, "adaptive", seed, held)
    fig = tmp_path / "fig.png"
    result = de.analyse(tmp_path, 0.08, fig, tmp_path / "fig.json")
    # each adaptive run's smoothed (10-step) entropy reaches 0.08 near step 30
    assert all(result["target_reached"].values())
    assert all(25 <= w <= 40 for w in result["window_start"].values())
    assert result["paired"]["entropy"]["verdict"] == REPRODUCED
    assert result["paired"]["entropy"]["ci90"][0] > 0
    assert result["paired"]["shortfall"]["verdict"] == REPRODUCED  # adaptive: less shortfall
    assert result["paired"]["eval/accuracy"]["verdict"] == INCONCLUSIVE  # equal accuracies
    assert fig.stat().st_size > 1000
    assert json.loads((tmp_path / "fig.json").read_text())["seeds"] == list(de.SEEDS)


def test_a_target_never_reached_reads_the_last_40_steps(tmp_path) -> None:
    for seed in de.SEEDS:
        for arm in de.ARMS:
            write_run(tmp_path, arm, seed, [0.2 + 0.001 * seed] * 50)
    result = de.analyse(tmp_path, 0.08, tmp_path / "f.png", tmp_path / "f.json")
    assert not any(result["target_reached"].values())
    assert set(result["window_start"].values()) == {11}
    assert result["paired"]["entropy"]["verdict"] == INCONCLUSIVE
