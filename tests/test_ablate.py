"""`trainer ablate` (trainer/ablate.py, trainer/ablations.py): the verdict rules on crafted
numbers, a run's final numbers, every ablation's variants as valid `trainer run` configs, and
end to end on a tiny budget: report, plots and summary written, the verdict from the stated
statistic, a failing variant recorded with a non-zero exit, resume, an unknown name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainer import ablate as ab
from trainer.ablations import (
    ABLATIONS,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    PROFILES,
    REPRODUCED,
    check_verdict,
    combine,
    final_numbers,
    seed_spread,
)
from trainer.cli import main as cli_main
from trainer.config import load_config

ROOT = Path(__file__).resolve().parents[1]


# -- the verdict rules -------------------------------------------------------------------------

def test_direction_checks_need_a_difference_beyond_the_seeds_spread() -> None:
    # treatment mean 0.40, baseline 0.60: d = -0.20, spreads 0.04 and 0.02
    r = check_verdict([0.58, 0.60, 0.62], [0.38, 0.42], "lower")
    assert r.verdict == REPRODUCED and r.diff == pytest.approx(-0.2) and r.spread == \
        pytest.approx(0.04) and r.seeds == 2
    assert check_verdict([0.58, 0.60, 0.62], [0.38, 0.42], "higher").verdict == NOT_REPRODUCED
    # the same difference inside a wide spread: inconclusive either way
    wide = check_verdict([0.30, 0.90], [0.38, 0.42], "lower")
    assert wide.verdict == INCONCLUSIVE and wide.spread == pytest.approx(0.6)
    assert check_verdict([0.5, 0.5], [0.5, 0.5], "higher").verdict == INCONCLUSIVE  # |d| = 0
    # exactly at the spread is still inside it
    assert check_verdict([0.0, 0.5], [0.75, 0.75], "higher").verdict == INCONCLUSIVE
    assert check_verdict([0.0, 0.5], [0.8, 0.8], "higher").verdict == REPRODUCED


def test_one_seed_or_no_values_is_inconclusive() -> None:
    one = check_verdict([0.2], [0.9], "higher")
    assert one.verdict == INCONCLUSIVE and one.diff == pytest.approx(0.7) and one.seeds == 1
    assert check_verdict([], [0.9, 0.8], "higher").verdict == INCONCLUSIVE
    assert check_verdict([0.1, float("nan")], [0.9, 0.8], "higher").seeds == 1


def test_similar_checks_against_a_margin() -> None:
    assert check_verdict([0.80, 0.82], [0.81, 0.82], "similar", 0.05).verdict == REPRODUCED
    assert check_verdict([0.80, 0.82], [0.60, 0.62], "similar", 0.05).verdict == NOT_REPRODUCED
    assert check_verdict([0.80, 0.82], [0.75, 0.78], "similar", 0.05).verdict == INCONCLUSIVE


def test_a_claim_holds_as_a_whole() -> None:
    assert combine([REPRODUCED, REPRODUCED]) == REPRODUCED
    assert combine([REPRODUCED, INCONCLUSIVE]) == INCONCLUSIVE
    assert combine([REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE]) == NOT_REPRODUCED
    assert combine([]) == INCONCLUSIVE
    assert seed_spread([0.3, 0.1, 0.2]) == pytest.approx(0.2) and seed_spread([0.5]) == 0.0


def test_final_numbers_from_metrics_rows() -> None:
    rows = [{"step": 0, "stage": 0, "eval/accuracy": 0.4}]
    for s in range(1, 13):
        row = {"step": s, "stage": 0 if s <= 4 else 1, "reward/mean": 0.5,
               "truncated/frac": 0.5 if s <= 4 else 0.0, "response_length/mean": 10.0,
               "rollout/responses": 8, "entropy": None if s == 12 else 0.1 * s}
        if s in (4, 8, 12):
            row["eval/accuracy"] = {4: 0.5, 8: 0.7, 12: 0.6}[s]
        rows.append(row)
    f = final_numbers(rows, entropy_target=0.5, window=3)
    assert f["eval/accuracy"] == 0.6 and f["eval/accuracy_best"] == 0.7
    assert f["eval/last_stage_gain"] == pytest.approx(0.6 - 0.5)  # the stage began after step 4
    assert f["entropy"] == pytest.approx(1.05)  # steps 10, 11 (12 logged no entropy)
    assert f["entropy/gap"] == pytest.approx(0.55)
    assert f["tokens"] == 12 * 10.0 * 8 and f["steps"] == 12
    assert f["reward/non_truncated"] == pytest.approx(0.5)
    early = final_numbers(rows[:4], window=2)  # steps 2-3: half truncated, reward 0.5
    assert early["reward/non_truncated"] == pytest.approx(1.0)
    assert early["eval/last_stage_gain"] is None  # one stage


def test_run_finished_needs_the_last_step_and_its_evaluation() -> None:
    rows = [{"step": 1, "reward/mean": 0.1}, {"step": 2, "reward/mean": 0.1,
                                               "eval/accuracy": 0.3}]
    assert ab.run_finished(rows, 2, with_eval=True)
    assert not ab.run_finished(rows[:1], 2, with_eval=False)
    assert not ab.run_finished([{"step": 2, "reward/mean": 0.1}], 2, with_eval=True)
    assert ab.run_finished([{"step": 2, "reward/mean": 0.1}], 2, with_eval=False)


# -- the ablations' definitions ----------------------------------------------------------------

@pytest.mark.parametrize("name", list(ABLATIONS))
@pytest.mark.parametrize("profile", list(PROFILES))
def test_every_variant_is_a_valid_trainer_run_config(name, profile, tmp_path) -> None:
    """The knobs exist: the profile's, the ablation's and the variant's overrides load through
    `trainer run`'s own config loader, and each variant sets what it claims to."""
    a = ABLATIONS[name]
    driver = ab.Driver(ab.AblateOptions(name=name, profile=profile, out=tmp_path))
    assert driver.variants and len(driver.seeds) == PROFILES[profile].seeds
    assert a.checks_for([v.name for v in driver.variants]), "quick runs no check"
    for v in driver.variants:
        cfg = load_config(ab.BASE_CONFIG, driver.run_overrides(v, 1, tmp_path / "model"))
        assert cfg.seed == 1 and cfg.tiny_model is None and cfg.warm_start.steps == 0
        assert cfg.run_dir == tmp_path / name / "runs" / f"{v.name}-s1"
        for key, value in {**a.setup, **v.overrides}.items():
            section, field = key.split(".")
            got = getattr(getattr(cfg, section), field)
            if field != "stages":
                assert str(got) == value or float(got) == float(value), (key, got, value)
    for c in a.checks:
        assert {c.baseline, c.treatment} <= {v.name for v in a.variants}


def test_off_policy_quadruples_are_what_the_config_derives() -> None:
    d_r = load_config(ab.BASE_CONFIG).magic.prompts_per_step
    names = {"D": d_r, "D/2": d_r // 2, "D/4": d_r // 4}
    a = ABLATIONS["off-policy"]
    for v in a.variants:
        cfg = load_config(ab.BASE_CONFIG, ab._overrides_text(v.overrides))
        q = cfg.magic.off_policy()
        n_sgd, dr, dt, reuse = v.quadruple
        assert (q.n_sgd, q.rollout_batch_size, q.mini_batch_size, q.n_reuse) == \
            (int(n_sgd), names[dr], names[dt], int(reuse))
    quick = {int(v.quadruple[0]) for v in a.variants_for("quick")}
    assert {1, 4} <= quick  # the floor for the quick profile
    assert len(a.variants_for("full")) == 5


def test_boolean_looking_values_reach_the_config_as_strings() -> None:
    cfg = load_config(ab.BASE_CONFIG, ab._overrides_text({"magic.entropy_mode": "off"}))
    assert cfg.magic.entropy_mode == "off"


# -- the command -------------------------------------------------------------------------------

def test_unknown_ablation_lists_the_valid_ones(capsys) -> None:
    assert cli_main(["ablate", "entropy"]) == 2
    err = capsys.readouterr().err
    assert "unknown ablation 'entropy'" in err and "off-policy" in err and "multi-stage" in err
    assert cli_main(["ablate", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ABLATIONS)
    assert cli_main(["ablate", "off-policy", "--variants", "on-policy,nope"]) == 2
    assert "unknown variants ['nope']" in capsys.readouterr().err


# A tiny budget: a 1-layer model, a 10-step warm start, 2 RL steps of 6 prompts x 4 samples,
# evaluation on 8 problems. prompts_per_step=6 makes nsgd4-mb (D_T = 4) an invalid config.
TINY = ["total_steps=2", "warm_start.steps=10", "eval.max_problems=8", "eval.n_samples=1",
        "eval.every_steps=1", "eval.max_tokens=48", "magic.prompts_per_step=6",
        "magic.group_size=4", "micro_batch_size=24", "tiny_model.hidden_size=32",
        "tiny_model.layers=1", "log.samples_every=0",
        ("magic.stages=[{name: a, max_response_length: 24, steps: 1}, "
        "{name: b, max_response_length: 48}]")]


def ablate_cli(out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "trainer.cli", "ablate", "off-policy", "--seeds", "1",
           "--variants", "on-policy,nsgd2-reuse,nsgd4-mb", "--out", str(out)]
    for x in TINY:
        cmd += ["--set", x]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)


@pytest.fixture(scope="module")
def tiny_ablation(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("ablate")
    return out, ablate_cli(out)


@pytest.mark.slow
def test_end_to_end_report_plots_summary_and_a_failing_variant(tiny_ablation) -> None:
    out, r = tiny_ablation
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]  # one variant failed
    root = out / "off-policy"
    summary = json.loads((root / "summary.json").read_text())
    assert set(summary) >= {"ablation", "claim", "verdict", "variants"}
    assert summary["ablation"] == "off-policy" and "N_SGD" in summary["claim"]
    assert list(summary["variants"]) == ["on-policy", "nsgd2-reuse", "nsgd4-mb"]
    for name in ("on-policy", "nsgd2-reuse"):
        v = summary["variants"][name]
        assert v["seeds"] == [0] and len(v["run_dirs"]) == 1 and "failed" not in v
        assert Path(v["run_dirs"][0], "metrics.jsonl").exists()
        assert v["final"]["steps"] == 2 and v["final"]["tokens"] > 0
        assert 0.0 <= v["final"]["eval/accuracy"] <= 1.0
        assert v["overrides"]["magic.entropy_mode"] == "off"
    assert summary["variants"]["nsgd2-reuse"]["quadruple"] == [2, 6, 6, 2]  # D = 6 here
    assert summary["variants"]["nsgd2-reuse"]["quadruple_notation"] == ["2", "D", "D", "2"]
    assert summary["variants"]["nsgd2-reuse"]["overrides"]["magic.n_reuse"] == "2"
    # the failing variant: recorded with why, the others went on
    bad = summary["variants"]["nsgd4-mb"]
    assert bad["seeds"] == [] and bad["final"] == {}
    assert "must divide prompts_per_step" in bad["failed"][0]["error"]
    assert "FAILED: nsgd4-mb seed 0" in r.stderr and "must divide" in r.stderr
    # the verdict rests on the stated statistic over the per-seed numbers
    checks = {c["check"]: c for c in summary["checks"]}
    acc = checks["eval/accuracy: nsgd2-reuse lower than on-policy"]
    expected = check_verdict(
        [f["eval/accuracy"] for f in summary["variants"]["on-policy"]["per_seed"]],
        [f["eval/accuracy"] for f in summary["variants"]["nsgd2-reuse"]["per_seed"]], "lower")
    assert (acc["verdict"], acc["diff"], acc["seeds"]) == \
        (expected.verdict, expected.diff, expected.seeds)
    assert acc["verdict"] == INCONCLUSIVE and acc["reason"].startswith("one seed")
    assert checks["eval/accuracy: nsgd4-mb lower than on-policy"]["reason"].startswith("no val")
    assert summary["verdict"] == combine([c["verdict"] for c in summary["checks"]])
    report = (root / "report.md").read_text()
    assert "**Claim.**" in report and f"**Verdict: {summary['verdict']}.**" in report
    assert "| on-policy | (1, D, D, 1) = (1, 6, 6, 1)" in report and "FAILED" in report
    assert "must divide prompts_per_step" in report
    for png in ("entropy.png", "accuracy.png", "length.png", "truncated.png"):
        assert (root / png).stat().st_size > 1000
        assert f"![{png}]({png})" in report


@pytest.mark.slow
def test_a_rerun_resumes_without_redoing_finished_runs(tiny_ablation) -> None:
    out, _ = tiny_ablation
    runs = out / "off-policy" / "runs"
    done = runs / "on-policy-s0" / "metrics.jsonl"
    before = done.stat().st_mtime_ns
    import shutil

    shutil.rmtree(runs / "nsgd2-reuse-s0")  # as if interrupted before it ran
    r = ablate_cli(out)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "on-policy seed 0: already finished, not run again" in r.stdout
    assert "nsgd2-reuse seed 0: finished in" in r.stdout
    assert done.stat().st_mtime_ns == before
    assert "warm start" not in r.stderr  # the shared warm-started policy was kept too
    summary = json.loads((out / "off-policy" / "summary.json").read_text())
    assert summary["variants"]["on-policy"]["seeds"] == [0]
    assert summary["variants"]["nsgd2-reuse"]["final"]["steps"] == 2


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_a_rerun_resumes_the_interrupted_run(tiny_ablation) -> None:
    """Ctrl-C reaches the driver only (each run has its own session); the driver forwards it
    once: the running variant finishes its step, writes a checkpoint, and the command exits 130.
    The same command again continues that run from its checkpoint (another ablation in the
    same --out shares the data and the warm-started policy)."""
    import os
    import signal
    import time

    out, _ = tiny_ablation
    cmd = [sys.executable, "-m", "trainer.cli", "ablate", "temperature", "--seeds", "1",
           "--variants", "t1.0", "--out", str(out)]
    for x in [*TINY, "total_steps=12", "eval.every_steps=0"]:
        cmd += ["--set", x]
    # SIGINT at its default in the driver: a suite started in the background (`make test &`,
    # a CI runner) inherits it ignored, and Python then installs no KeyboardInterrupt handler.
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    run = out / "temperature" / "runs" / "t1.0-s0"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not (
            (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().strip()):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()  # still running its first variant
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "run the same command again to resume" in err and "warm start" not in err
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert 1 <= steps[-1] < 12
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{steps[-1]:06d}"
    assert not (out / "temperature" / "summary.json").exists()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13))  # continued, not restarted: one row per step
    log = (out / "temperature" / "logs" / "t1.0-s0.log").read_text()
    assert f"--resume {run}" in log
    summary = json.loads((out / "temperature" / "summary.json").read_text())
    assert summary["variants"]["t1.0"]["final"]["steps"] == 12


@pytest.mark.slow
def test_a_variant_equal_to_another_ablations_finished_run_reuses_it(tiny_ablation) -> None:
    """kl's beta0 with the entropy bonus off is off-policy's on-policy run (kl_coef=0 is the
    base's own): the driver links it instead of training it again, and says so; a variant
    that differs (beta0.01) runs. A re-run keeps the link."""
    out, first = tiny_ablation
    assert "on-policy seed 0: finished in" in first.stdout  # the twin is a finished run
    cmd = [sys.executable, "-m", "trainer.cli", "ablate", "kl", "--seeds", "1",
           "--variants", "beta0,beta0.01", "--out", str(out)]
    for x in [*TINY, "magic.entropy_mode=off"]:
        cmd += ["--set", x]
    twin = out / "off-policy" / "runs" / "on-policy-s0"
    for _ in range(2):
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                           check=False)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert f"beta0 seed 0: reused {twin} (the same resolved config)" in r.stdout
        link = out / "kl" / "runs" / "beta0-s0"
        assert link.is_symlink() and link.resolve() == twin.resolve()
        assert "$ " not in (out / "kl" / "logs" / "beta0-s0.log").read_text()  # no child ran
        assert not (out / "kl" / "runs" / "beta0.01-s0").is_symlink()
    assert "beta0.01 seed 0: already finished, not run again" in r.stdout  # the second pass
    summary = json.loads((out / "kl" / "summary.json").read_text())
    beta0 = summary["variants"]["beta0"]
    assert beta0["reused_from"] == {"0": str(twin)}
    target = ab._config(twin)["magic"]["entropy_target"]
    assert beta0["final"] == final_numbers(ab._rows(twin), target)  # the twin's own numbers
    assert "$ " in (out / "kl" / "logs" / "beta0.01-s0.log").read_text()  # it was trained
    assert "reused_from" not in summary["variants"]["beta0.01"]
    assert "ok (reused: seed 0: off-policy/runs/on-policy-s0)" in \
        (out / "kl" / "report.md").read_text()


def test_run_identity_ignores_the_place_and_nothing_else(tmp_path) -> None:
    """Two runs are the same run when their resolved configs agree but for name and
    output_dir, whether read from a run directory's config.yaml (as trainer/loop.py writes
    it) or loaded afresh."""
    base = ["data.train_files=[a.jsonl]", "data.eval_files=[b.jsonl]"]
    cfg = load_config(ab.BASE_CONFIG, [*base, "name=x", "output_dir=/one"])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    written = ab._config(tmp_path)
    moved = load_config(ab.BASE_CONFIG, [*base, "name=y", "output_dir=/two"]).to_dict()
    assert ab.run_identity(written) == ab.run_identity(moved)
    other = load_config(ab.BASE_CONFIG, [*base, "magic.kl_coef=0.01"]).to_dict()
    assert ab.run_identity(other) != ab.run_identity(moved)


@pytest.mark.slow
def test_a_run_directory_made_with_another_config_is_an_error_not_a_reuse(tiny_ablation) -> None:
    """The same command with another --set finds on-policy-s0 made with the old config: that
    variant fails naming the directory (nothing is trained over it or linked to it)."""
    out, _ = tiny_ablation
    run = out / "off-policy" / "runs" / "on-policy-s0"
    before = (run / "metrics.jsonl").stat().st_mtime_ns
    cmd = [sys.executable, "-m", "trainer.cli", "ablate", "off-policy", "--seeds", "1",
           "--variants", "on-policy", "--out", str(out)]
    for x in [*TINY, "magic.lr=0.001"]:
        cmd += ["--set", x]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"{run} was made with another config" in r.stderr
    assert (run / "metrics.jsonl").stat().st_mtime_ns == before and not run.is_symlink()
