"""`trainer ablate` (trainer/ablation/runner.py, trainer/ablation/report.py, trainer/ablation/designs.py): the
labels of an ablation from its checks (the mechanism and the benefit each by its own check,
secondaries cannot sink them, an ablation undecidable on CPU says so), a run's numbers over the windows the claims read, every
ablation's variants as valid `trainer run` configs with one benefit check each, the
pre-registration (rendered document, fresh seeds, power, which runs are confirmatory), the README
tables from the confirmatory and exploratory summaries, and end to end on a tiny budget: report, plots and summary written, the
verdict from the stated statistic, a failing variant recorded with a non-zero exit, resume, an
unknown name. The statistic itself: tests/test_ablation_stats.py."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from trainer.ablation import runner as ab
from trainer.ablation import report as rep
from trainer.ablation.stats import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    check_verdict,
    pair_by_seed,
)
from trainer.ablation.designs import (
    ABLATIONS,
    LABELS,
    PROFILES,
    Ablation,
    Check,
    Variant,
    run_numbers,
)
from trainer.cli import main as cli_main
from trainer.config import load_config, read_run_config
from trainer.ablation.preregistration import plan

ROOT = Path(__file__).resolve().parents[1]


# -- an ablation's verdict ---------------------------------------------------------------------

TOY = Ablation("toy", "claim (Fig. 0)", (Variant("a", {}), Variant("b", {}), Variant("c", {})),
               (Check("x", "a", "b", "higher", role="benefit"), Check("y", "a", "b", "lower"),
                Check("x", "a", "c", "higher")))


def numbers(**per_variant: list[tuple[float, float]]) -> dict:
    """variant -> seed -> {"x": .., "y": ..} from lists of (x, y) per seed."""
    return {v: {s: {"x": x, "y": y} for s, (x, y) in enumerate(vals)}
            for v, vals in per_variant.items()}


def test_the_benefit_check_decides_and_secondaries_cannot_sink_it() -> None:
    a = [(0.50, 0.5), (0.52, 0.6), (0.48, 0.4), (0.51, 0.5)]
    b = [(0.60, 0.9), (0.63, 0.8), (0.57, 0.9), (0.62, 0.7)]  # x higher (benefit), y higher
    labels, checks = rep.decide(TOY, numbers(a=a, b=b, c=a))
    assert labels["benefit"]["verdict"] == REPRODUCED and labels["mechanism"] is None
    assert rep.verdict_text(labels) == "benefit reproduced"
    by = {c["check"]: c for c in checks}
    assert by["x: b higher than a"]["role"] == "benefit"
    assert by["y: b lower than a"]["verdict"] == NOT_REPRODUCED  # reported, did not sink it
    assert by["x: c higher than a"]["verdict"] == INCONCLUSIVE  # c == a
    prim = by["x: b higher than a"]
    expected = check_verdict(pair_by_seed({s: v[0] for s, v in enumerate(a)},
                                          {s: v[0] for s, v in enumerate(b)}), "higher")
    assert (prim["mean_diff"], prim["ci90"], prim["pairs"]) == \
        (expected.mean, [expected.low, expected.high], 4)
    assert prim["ci90"][0] > 0
    assert prim["detectable"] > 0 and labels["benefit"]["ci90"] == prim["ci90"]


def test_mechanism_and_benefit_are_labelled_apart() -> None:
    """"Mechanism reproduced, benefit not reproduced" is a result: each label from its own
    check, neither able to change the other."""
    two = replace(TOY, checks=(Check("y", "a", "b", "higher", role="mechanism"),
                               Check("x", "a", "b", "higher", role="benefit")))
    a = [(0.50, 0.5), (0.52, 0.6), (0.48, 0.4), (0.51, 0.5)]
    b = [(0.40, 0.9), (0.43, 0.8), (0.37, 0.9), (0.42, 0.7)]  # y higher, x lower
    labels, _ = rep.decide(two, numbers(a=a, b=b, c=a))
    assert labels["mechanism"]["verdict"] == REPRODUCED
    assert labels["benefit"]["verdict"] == NOT_REPRODUCED
    assert rep.verdict_text(labels) == "mechanism reproduced, benefit not reproduced"


def test_a_missing_benefit_arm_is_inconclusive_and_pairs_drop_with_why() -> None:
    a = [(0.5, 0.5), (0.52, 0.6), (0.48, 0.4)]
    labels, checks = rep.decide(TOY, numbers(a=a, b=[], c=a))
    assert labels["benefit"]["verdict"] == INCONCLUSIVE and labels["benefit"]["pairs"] == 0
    assert all(c["role"] == "secondary" for c in checks)
    one_side = numbers(a=a, b=[(0.6, 0.1), (0.7, 0.1), (0.65, 0.1)], c=a)
    del one_side["b"][2]  # seed 2 of b failed
    _, checks = rep.decide(TOY, one_side)
    prim = next(c for c in checks if c["role"] == "benefit")
    assert prim["pairs"] == 2 and prim["seeds"] == [0, 1]
    assert "treatment" in prim["dropped"]["2"]


def test_an_ablation_undecidable_on_cpu_says_so_whatever_its_checks() -> None:
    a = [(0.50, 0.5), (0.52, 0.6), (0.48, 0.4)]
    b = [(0.60, 0.9), (0.63, 0.8), (0.57, 0.9)]
    marked = replace(TOY, undecidable_on_cpu="no mechanism")
    labels, checks = rep.decide(marked, numbers(a=a, b=b, c=a))
    assert labels["benefit"]["verdict"] == rep.UNDECIDABLE and checks[0]["verdict"] == REPRODUCED


def test_an_ablation_needs_one_benefit_check_and_at_most_one_mechanism_check() -> None:
    with pytest.raises(ValueError, match="exactly one benefit"):
        Ablation("t", "c", (Variant("a", {}), Variant("b", {})), (Check("x", "a", "b",
                                                                       "higher"),))
    with pytest.raises(ValueError, match="at most one mechanism"):
        Ablation("t", "c", (Variant("a", {}), Variant("b", {})),
                 (Check("x", "a", "b", "higher", role="benefit"),
                  *[Check(m, "a", "b", "higher", role="mechanism") for m in "yz"]))
    with pytest.raises(ValueError, match="unknown variant"):
        Ablation("t", "c", (Variant("a", {}),), (Check("x", "a", "z", "higher", role="benefit"),))


def test_run_numbers_over_the_claims_windows() -> None:
    rows = [{"step": 0, "stage": 0, "eval/accuracy": 0.4}]
    for s in range(1, 13):
        row = {"step": s, "stage": 0 if s <= 4 else 1, "reward/mean": 0.5,
               "truncated/frac": 0.5 if s <= 4 else 0.0, "response_length/mean": 10.0,
               "rollout/responses": 8, "entropy": None if s == 12 else 0.1 * s}
        if s in (4, 8, 12):
            row["eval/accuracy"] = {4: 0.5, 8: 0.7, 12: 0.6}[s]
        rows.append(row)
    f = run_numbers(rows, entropy_target=0.5, window=3)
    assert f["eval/accuracy"] == 0.6 and f["eval/accuracy_best"] == 0.7
    assert f["eval/accuracy_auc"] == pytest.approx((0.5 + 0.7 + 0.6) / 3)  # step 0 left out
    assert f["eval/accuracy_last3"] == pytest.approx((0.5 + 0.7 + 0.6) / 3)
    assert run_numbers(rows[:9])["eval/accuracy_last3"] is None  # 2 evaluations after step 0
    assert f["eval/accuracy@stage1"] == 0.5
    assert f["eval/last_stage_gain"] == pytest.approx(0.6 - 0.5)  # the stage began after step 4
    assert f["entropy"] == pytest.approx(1.05)  # steps 10, 11 (12 logged no entropy)
    assert f["entropy@stage1"] == pytest.approx(0.25)  # steps 1-4
    assert f["entropy@stage1_end"] == pytest.approx(0.3)  # steps 2-4
    assert f["entropy@run"] == pytest.approx(0.6)  # steps 1-11
    assert f["truncated/frac@stage1"] == 0.5 and f["truncated/frac"] == 0.0
    assert f["entropy/gap"] == pytest.approx(0.55)
    assert f["tokens"] == 12 * 10.0 * 8 and f["tokens@stage1"] == 4 * 10.0 * 8
    assert f["steps"] == 12
    assert f["reward/non_truncated"] == pytest.approx(0.5)
    assert f["reward/non_truncated@stage1"] == pytest.approx(1.0)
    early = run_numbers(rows[:4], window=2)  # one stage
    assert early["eval/last_stage_gain"] is None and early["eval/accuracy@stage1"] is None


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
    if profile == "confirm" and plan(name).pending:
        pytest.skip(f"{name} is not registered")
    driver = ab.Driver(ab.AblateOptions(name=name, profile=profile, out=tmp_path))
    seeds = plan(name).seed_list if profile == "confirm" else list(range(PROFILES[profile].seeds))
    assert driver.variants and driver.seeds == seeds
    ran = a.checks_for([v.name for v in driver.variants])
    if profile != "quick":
        assert all(a.labelled(r) in ran for r in LABELS if a.labelled(r)), \
            "the profile does not run the labelled checks' variants"
    for v in driver.variants:
        cfg = load_config(ab.BASE_CONFIG, driver.run_overrides(v, 1, tmp_path / "model"))
        assert cfg.seed == 1 and cfg.tiny_model is None and cfg.warm_start.steps == 0
        assert cfg.run_dir == tmp_path / name / "runs" / f"{v.name}-s1"
        for key, value in {**a.setup, **v.overrides}.items():
            section, _, field = key.rpartition(".")
            got = getattr(getattr(cfg, section) if section else cfg, field)
            if isinstance(got, bool):
                assert got == (value == "true"), (key, got, value)
            elif key == "total_steps":
                assert cfg.total_steps == int(value)
            elif field != "stages":
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
    assert {1, 4} <= quick  # the quick profile's floor: N_SGD 1 and 4
    assert [v.name for v in a.variants_for("full")] == ["on-policy", "nsgd4-mb"]
    assert len(a.variants) == 5  # every quadruple of the report's Fig. 16, two optional


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
           "--variants", "on-policy,nsgd2-reuse,nsgd4-mb", "--out", str(out), "--world", "demo"]
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
        assert not Path(v["run_dirs"][0]).is_absolute()  # relative to --out: no machine paths
        assert Path(out, v["run_dirs"][0], "metrics.jsonl").exists()
        assert v["mean"]["steps"] == 2 and v["mean"]["tokens"] > 0
        assert 0.0 <= v["mean"]["eval/accuracy"] <= 1.0
        assert v["overrides"]["magic.entropy_mode"] == "off"
    assert summary["variants"]["nsgd2-reuse"]["quadruple"] == [2, 6, 6, 2]  # D = 6 here
    assert summary["variants"]["nsgd2-reuse"]["quadruple_notation"] == ["2", "D", "D", "2"]
    assert summary["variants"]["nsgd2-reuse"]["overrides"]["magic.n_reuse"] == "2"
    # the failing variant: recorded with why, the others went on
    bad = summary["variants"]["nsgd4-mb"]
    assert bad["seeds"] == [] and bad["mean"] == {}
    assert "must divide prompts_per_step" in bad["failed"][0]["error"]
    assert "FAILED: nsgd4-mb seed 0" in r.stderr and "must divide" in r.stderr
    # the labels rest on the stated statistic over the per-seed numbers: the labelled checks
    # (nsgd4-mb's) have a failed arm, so they are not among the checks and the labels are
    # inconclusive; a secondary check with one seed a side has no interval
    checks = {c["check"]: c for c in summary["checks"]}
    assert all(c["role"] == "secondary" for c in checks.values())
    acc = checks["eval/accuracy: nsgd2-reuse lower than on-policy"]
    per = summary["variants"]
    expected = check_verdict(pair_by_seed(
        {int(k): n["eval/accuracy"] for k, n in per["on-policy"]["per_seed"].items()},
        {int(k): n["eval/accuracy"] for k, n in per["nsgd2-reuse"]["per_seed"].items()}),
        "lower")
    assert (acc["verdict"], acc["mean_diff"], acc["pairs"]) == \
        (expected.verdict, expected.mean, expected.pairs)
    assert acc["verdict"] == INCONCLUSIVE and acc["reason"].startswith("1 paired seed")
    assert summary["verdict"] == "mechanism inconclusive, benefit inconclusive"
    assert summary["benefit"]["verdict"] == INCONCLUSIVE
    assert summary["confirmatory"] is False and summary["seeds"] == [0]
    assert "exploratory" in summary["not_confirmatory_because"][0]
    assert len(summary["code_commits"]) == 1 and summary["machines"][0]["flags"]
    report = (root / "report.md").read_text()
    assert "**Exploratory**" in report
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
    assert summary["variants"]["nsgd2-reuse"]["mean"]["steps"] == 2


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
    assert summary["variants"]["t1.0"]["mean"]["steps"] == 12


def _numbers(run: Path) -> list[dict]:
    """A run's metrics rows without the wall-clock keys."""
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in ab._rows(run)]


@pytest.mark.slow
def test_jobs_2_gives_each_run_the_numbers_it_has_alone(tiny_ablation, tmp_path) -> None:
    """--jobs 2 makes two runs at a time, each its own one-thread process: every run's
    numbers are the ones the same run has when made alone (the module's --jobs 1 runs)."""
    out, _ = tiny_ablation
    cmd = [sys.executable, "-m", "trainer.cli", "ablate", "off-policy", "--seeds", "1",
           "--variants", "on-policy,nsgd2-reuse", "--out", str(tmp_path), "--world", "demo",
           "--jobs", "2"]
    for x in TINY:
        cmd += ["--set", x]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for run in ("on-policy-s0", "nsgd2-reuse-s0"):
        alone = _numbers(out / "off-policy" / "runs" / run)
        assert len(alone) >= 2 and _numbers(tmp_path / "off-policy" / "runs" / run) == alone


@pytest.mark.slow
def test_ctrl_c_with_jobs_2_stops_both_running_runs_and_a_rerun_resumes_both(tmp_path) -> None:
    """With two runs at a time, one Ctrl-C reaches both children: each finishes its step and
    writes a checkpoint, the command exits 130, and the same command continues both."""
    import os
    import signal
    import time

    cmd = [sys.executable, "-m", "trainer.cli", "ablate", "off-policy", "--seeds", "1",
           "--variants", "on-policy,nsgd2-reuse", "--out", str(tmp_path), "--world", "demo",
           "--jobs", "2"]
    for x in [*TINY, "total_steps=12", "eval.every_steps=0"]:
        cmd += ["--set", x]
    runs = [tmp_path / "off-policy" / "runs" / f"{v}-s0" for v in ("on-policy", "nsgd2-reuse")]
    # SIGINT at its default: a suite started in the background inherits it ignored.
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and proc.poll() is None and not all(
            (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().strip()
            for run in runs):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()  # both runs under way at once
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "the 2 running variants finish their step" in err
    for run in runs:
        steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert 1 <= steps[-1] < 12
        assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{steps[-1]:06d}"
    assert not (tmp_path / "off-policy" / "summary.json").exists()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for run in runs:
        steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(1, 13))  # continued, not restarted
    summary = json.loads((tmp_path / "off-policy" / "summary.json").read_text())
    assert [summary["variants"][v]["mean"]["steps"] for v in ("on-policy", "nsgd2-reuse")] \
        == [12, 12]


def test_jobs_2_waits_without_spinning() -> None:
    """The driver's main thread waits on its workers in slices: while one item is still under
    way after another finished it must sleep, not spin (a spinning driver took half a core
    from the runs it drives)."""
    import time

    driver = ab.Driver(ab.AblateOptions("off-policy", jobs=2))
    t0, cpu0 = time.monotonic(), time.process_time()
    assert driver._each([0.0, 1.5], lambda s: time.sleep(s) or s) == [0.0, 1.5]
    assert time.monotonic() - t0 >= 1.5
    assert time.process_time() - cpu0 < 0.5  # spinning costs about the whole 1.5 s


def test_jobs_below_1_is_refused() -> None:
    with pytest.raises(ValueError, match="--jobs must be >= 1, got 0"):
        ab.Driver(ab.AblateOptions("off-policy", jobs=0))


@pytest.mark.slow
def test_a_variant_equal_to_another_ablations_finished_run_reuses_it(tiny_ablation) -> None:
    """adv-mask's none with the entropy bonus off is off-policy's on-policy run (mask_mode
    none is the base's own): the driver links it instead of training it again, and says so;
    a variant that differs (before) runs. A re-run keeps the link."""
    out, first = tiny_ablation
    assert "on-policy seed 0: finished in" in first.stdout  # the twin is a finished run
    cmd = [sys.executable, "-m", "trainer.cli", "ablate", "adv-mask", "--seeds", "1",
           "--variants", "none,before", "--out", str(out)]
    for x in [*TINY, "magic.entropy_mode=off"]:
        cmd += ["--set", x]
    twin = out / "off-policy" / "runs" / "on-policy-s0"
    for _ in range(2):
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                           check=False)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert f"none seed 0: reused {twin} (the same resolved config)" in r.stdout
        link = out / "adv-mask" / "runs" / "none-s0"
        assert link.is_symlink() and link.resolve() == twin.resolve()
        assert "$ " not in (out / "adv-mask" / "logs" / "none-s0.log").read_text()  # no child
        assert not (out / "adv-mask" / "runs" / "before-s0").is_symlink()
    assert "before seed 0: already finished, not run again" in r.stdout  # the second pass
    summary = json.loads((out / "adv-mask" / "summary.json").read_text())
    none = summary["variants"]["none"]
    assert none["reused_from"] == {"0": "off-policy/runs/on-policy-s0"}
    target = read_run_config(twin).magic.entropy_target
    assert none["per_seed"]["0"] == run_numbers(ab._rows(twin), target)  # the twin's numbers
    assert "$ " in (out / "adv-mask" / "logs" / "before-s0.log").read_text()  # it was trained
    assert "reused_from" not in summary["variants"]["before"]
    assert "ok (reused: seed 0: off-policy/runs/on-policy-s0)" in \
        (out / "adv-mask" / "report.md").read_text()


@pytest.mark.slow
def test_the_kl_ablation_logs_the_kl_at_beta_0(tiny_ablation) -> None:
    """beta0 keeps the reference only to log losses/kl (a key on every step); the ablation is marked undecidable on CPU, and the report and summary say why."""
    out, _ = tiny_ablation
    cmd = [sys.executable, "-m", "trainer.cli", "ablate", "kl", "--seeds", "1",
           "--variants", "beta0", "--out", str(out)]
    for x in TINY:
        cmd += ["--set", x]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [row for row in ab._rows(out / "kl" / "runs" / "beta0-s0") if "reward/mean" in row]
    assert len(rows) == 2 and all("losses/kl" in row for row in rows)  # values: test_trainer
    summary = json.loads((out / "kl" / "summary.json").read_text())
    assert summary["benefit"]["verdict"] == rep.UNDECIDABLE and "late-training" in \
        summary["undecidable_on_cpu"]
    assert "The mechanism is absent here" in (out / "kl" / "report.md").read_text()
    assert f"benefit {rep.UNDECIDABLE}" in r.stdout


def test_the_readme_tables_are_made_from_the_summaries(tmp_path, monkeypatch) -> None:
    """`python -m trainer.ablation.report DIR`: between the README's markers, the confirmatory
    table from DIR/confirmatory/NAME/summary.json (mechanism and benefit labels with their
    intervals, the pre-registration commit; a summary not marked confirmatory there is an
    error) and the exploratory one from DIR/NAME/summary.json, relabelled from each check's
    stored differences; unknown ablations and a README without markers are errors."""
    def entry(check, role, metric, base, treat, diffs, expect="higher", margin=0.0):
        return {"check": check, "role": role, "metric": metric, "baseline": base,
                "treatment": treat, "expect": expect, "margin": margin, "diffs": diffs,
                "seeds": list(range(len(diffs))), "verdict": INCONCLUSIVE}

    old = tmp_path / "abl" / "temperature"
    old.mkdir(parents=True)
    (old / "summary.json").write_text(json.dumps({
        "ablation": "temperature", "seconds": 3000.0, "checks": [
            entry("auc", "primary", "eval/accuracy_auc", "t0.6", "t1.0",
                  [0.02, 0.03, 0.025, 0.02]),
            entry("ent", "secondary", "entropy/rollout@run", "t0.6", "t1.0",
                  [-0.01, -0.012, -0.011])]}))
    conf = tmp_path / "abl" / "confirmatory" / "batch-size"
    conf.mkdir(parents=True)
    label = {"check": "b", "verdict": NOT_REPRODUCED, "mean_diff": -0.03, "ci90": [-0.05, -0.01],
             "pairs": 7}
    (conf / "summary.json").write_text(json.dumps({
        "ablation": "batch-size", "confirmatory": True, "preregistration_commit": "ab" * 20,
        "seeds": [1000, 1006], "seconds": 1200.0, "mechanism": None, "benefit": label}))
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{rep.BEGIN}\nstale\n{rep.END}\nafter\n")
    from trainer.ablation import preregistration as pr
    monkeypatch.setitem(pr.PLANS, "off-policy", pr.Plan(pending="a world to build"))
    assert rep.main([str(tmp_path / "abl"), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "stale" not in text and text.startswith("before\n") and text.endswith("after\n")
    confirm, explore = text.split("**Exploratory**")
    assert ("| `batch-size` | confirmatory, pre-registered at ababababab, seeds 1000-1006 | "
            "- (no such part) | **not reproduced**: -0.03 [-0.05, -0.01], 7 pairs | 20 min | "
            "[report](abl/confirmatory/batch-size/report.md) |") in confirm
    assert "| `temperature` | registered, 9 seeds, not yet run" in confirm
    assert "| `off-policy` | not registered yet" in confirm
    # exploratory: the benefit re-decided from the stored differences, the mechanism from the
    # entropy check on the same arms, each naming what it was measured on
    row = next(x for x in explore.splitlines() if x.startswith("| `temperature`"))
    assert "**reproduced**" in row.split("|")[3] and "(eval/accuracy_auc)" in row
    assert "**not reproduced**" in row.split("|")[2] and "(entropy/rollout@run)" in row
    assert "| `kl` | not run | not run |" in explore
    (conf / "summary.json").write_text(json.dumps({"ablation": "batch-size",
                                                   "confirmatory": False,
                                                   "not_confirmatory_because": ["a pilot seed"]}))
    assert rep.main([str(tmp_path / "abl"), "--readme", str(readme)]) == 2
    (conf / "summary.json").unlink()
    (tmp_path / "abl" / "nope").mkdir()
    (tmp_path / "abl" / "nope" / "summary.json").write_text("{}")
    assert rep.main([str(tmp_path / "abl"), "--readme", str(readme)]) == 2
    (tmp_path / "abl" / "nope" / "summary.json").unlink()
    readme.write_text("no markers")
    assert rep.main([str(tmp_path / "abl"), "--readme", str(readme)]) == 2


def test_the_committed_exploratory_summaries_read_as_the_review_found() -> None:
    """The committed exploratory runs, relabelled: entropy control holds entropy (mechanism
    reproduced) and costs accuracy here (benefit not reproduced); staged lengths at equal
    steps save tokens and fall short by more than 2 points."""
    def labels(name):
        s = json.loads((ROOT / "docs" / "ablations" / name / "summary.json").read_text())
        return rep.exploratory_labels(ABLATIONS[name], s)

    ec = labels("entropy-control")
    assert (ec["mechanism"]["verdict"], ec["benefit"]["verdict"]) == (REPRODUCED, NOT_REPRODUCED)
    ms = labels("multi-stage")
    assert (ms["mechanism"]["verdict"], ms["benefit"]["verdict"]) == (REPRODUCED, NOT_REPRODUCED)
    assert labels("clip-higher")["benefit"]["verdict"] == rep.UNDECIDABLE


def test_run_identity_ignores_the_place_and_nothing_else(tmp_path) -> None:
    """Two runs are the same run when their resolved configs agree but for name and
    output_dir, whether read from a run directory's config.yaml (as trainer/loop.py writes
    it) or loaded afresh."""
    base = ["data.train_files=[a.jsonl]", "data.eval_files=[b.jsonl]"]
    cfg = load_config(ab.BASE_CONFIG, [*base, "name=x", "output_dir=/one"])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    moved = load_config(ab.BASE_CONFIG, [*base, "name=y", "output_dir=/two"]).to_dict()
    assert ab._identity_of(tmp_path) == ab.run_identity(moved)
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
           "--variants", "on-policy", "--out", str(out), "--world", "demo"]
    for x in [*TINY, "magic.lr=0.001"]:
        cmd += ["--set", x]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"{run} was made with another config" in r.stderr
    assert (run / "metrics.jsonl").stat().st_mtime_ns == before and not run.is_symlink()


def test_a_dose_rule_accepts_the_first_value_at_which_the_mechanism_acts() -> None:
    from trainer.ablation.preregistration import Dose

    absolute = Dose("magic.lr", ("1", "2"), "a", "m", at_least=0.01)
    assert absolute.passes(0.01, None) and not absolute.passes(0.009, None)
    assert not absolute.passes(None, None)
    relative = Dose("magic.kl_coef", ("1", "2"), "b", "m", at_least=0.25, relative_to="a")
    assert relative.passes(0.07, 0.1) and not relative.passes(0.08, 0.1)
    assert not relative.passes(0.01, None) and not relative.passes(0.01, 0.0)
    assert "at least 0.25" in relative.rule() and "a's" in relative.rule()


@pytest.mark.slow
def test_the_dose_finding_runs_up_the_ladder_and_stops_at_the_first_that_acts(tmp_path) -> None:
    """Real short runs of the measured arm, one per ladder value, from the dose seed's warm
    start: a rule every value meets stops at the first; a rule none meets runs them all and
    chooses none (the curve is what the summary carries); finished dose runs are not redone."""
    from trainer.ablation.preregistration import Dose

    driver = ab.Driver(ab.AblateOptions(name="clip-higher", seeds=1, out=tmp_path,
                                        extra=[*TINY, "magic.prompts_per_step=8"]))
    driver.root.mkdir(parents=True)
    driver.write_data()
    dose = Dose("magic.lr", ("1.0e-4", "3.0e-3"), measured_on="clip0.2",
                metric="response_length/mean@run", at_least=0.0, steps=2, seed=900)
    first = driver.find_dose(dose)
    assert first["chosen"] == "1.0e-4" and list(first["curve"]) == ["1.0e-4"]
    assert first["curve"]["1.0e-4"] > 0
    never = driver.find_dose(replace(dose, at_least=1e9))
    assert never["chosen"] is None and list(never["curve"]) == ["1.0e-4", "3.0e-3"]
    assert never["curve"]["1.0e-4"] == first["curve"]["1.0e-4"]  # the finished run, read again
    runs = sorted(p.name for p in (driver.root / "runs").iterdir())
    assert runs == ["dose-clip0.2-1.0e-4-s900", "dose-clip0.2-3.0e-3-s900"]
    cfg = yaml.safe_load((driver.root / "runs" / runs[1] / "config.yaml").read_text())
    assert cfg["magic"]["lr"] == 3.0e-3 and cfg["total_steps"] == 2 and cfg["seed"] == 900
    assert (tmp_path / f"warm-start-{driver.warm_start(900).parent.name[11:]}").exists()


def test_an_undecidable_reason_from_the_dose_overrides_the_ablations_mark() -> None:
    marked = replace(TOY, undecidable_on_cpu="absent")
    a = [(0.50, 0.5), (0.52, 0.6), (0.48, 0.4)]
    b = [(0.60, 0.9), (0.63, 0.8), (0.57, 0.9)]
    labels, _ = rep.decide(marked, numbers(a=a, b=b, c=a), undecidable="")
    assert labels["benefit"]["verdict"] == REPRODUCED  # a dose brought the mechanism into play
    labels, _ = rep.decide(TOY, numbers(a=a, b=b, c=a), undecidable="no dose acted")
    assert labels["benefit"]["verdict"] == rep.UNDECIDABLE
