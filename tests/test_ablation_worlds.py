"""The worlds an ablation runs in (trainer/ablation/designs.py WORLDS): the rare-way world is
what it says (the copying way rare in the warm start's references and the only one that fits 48
tokens on level-3 code), the driver writes each world's data apart and passes its settings to
every run, the command offers exactly the worlds there are, pass@k is read over the last 3
evaluations, and on the confirm profile another ablation's run stands for this one only when
it would be confirmatory here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import typing
from pathlib import Path

import pytest

from trainer import metric_names as mn
from trainer.ablation import runner as ab
from trainer.ablation.designs import ABLATIONS, WORLDS, Variant, run_numbers
from trainer.cli import AblateArgs
from trainer.config import load_config
from trainer.tiny import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def _toyworld():
    spec = importlib.util.spec_from_file_location("toyworld_worlds",
                                                  ROOT / "datasets" / "toyworld.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tw = _toyworld()


def _args(world: str) -> dict[str, str]:
    a = WORLDS[world].data_args
    return dict(zip(a[::2], a[1::2], strict=True))


def test_the_command_offers_exactly_the_worlds_there_are() -> None:
    hints = typing.get_type_hints(AblateArgs, include_extras=True)
    offered = {x for x in typing.get_args(hints["world"]) if x is not type(None)}
    offered = {y for x in offered for y in (typing.get_args(x) or (x,))}
    assert offered == set(WORLDS)
    for a in ABLATIONS.values():
        assert a.world in WORLDS


def test_the_rare_way_world_makes_the_rare_way_the_only_one_that_fits() -> None:
    """Its data arguments, generated (fewer problems): every code row draws copy 1 time in 9;
    at the stage's 48 tokens (with the end token) the units scratchpad fits every level-2 row
    and level-3 math row and no level-3 code row, and copy fits every code row."""
    args = _args("rare-way")
    weights = tw.parse_way_weights(args["--way-weights"])
    train, held_out = tw.generate(
        600, 100, levels=[int(x) for x in args["--levels"].split(",")],
        code_share=float(args["--code-share"]), seed=1,
        verbose_share=float(args["--verbose-share"]), ways=args["--ways"].split(","),
        way_weights=weights)
    tok = build_tokenizer(1)
    limit = next(int(x.split("max_response_length: ")[1].split("}")[0])
                 for x in WORLDS["rare-way"].overrides if x.startswith("magic.stages="))
    assert limit == 48 and "eval.max_tokens=48" in WORLDS["rare-way"].overrides

    def tokens(text: str) -> int:
        ids = tok.encode(text)
        return len(getattr(ids, "ids", ids)) + 1  # the end token

    seen = set()
    for r in train + held_out:
        level, ways, refs = r["extra"]["level"], r["extra"]["ways"], r["extra"]["references"]
        fits = {w: tokens(ref) <= limit for w, ref in zip(ways, refs, strict=True)}
        if r["domain"] == "math":
            assert ways == ["units"] and fits["units"]
        else:
            assert ways.count("copy") / len(ways) == pytest.approx(
                weights["copy"] / (weights["copy"] + weights["units"])) == pytest.approx(1 / 9)
            assert fits["copy"] and fits["units"] == (level == 2)
        seen.add((r["domain"], level))
    assert seen == {("math", 2), ("math", 3), ("code", 2), ("code", 3)}


def test_way_weights_repeat_references_and_bad_weights_are_named() -> None:
    train, _ = tw.generate(40, 0, levels=[2], code_share=0.5, seed=0,
                           ways=["units", "carry", "copy"], way_weights={"units": 4, "carry": 2})
    code = next(r for r in train if r["domain"] == "code")
    math_row = next(r for r in train if r["domain"] == "math")
    assert code["extra"]["ways"] == ["units"] * 4 + ["carry"] * 2 + ["copy"]
    assert math_row["extra"]["ways"] == ["units", "units", "carry"]  # 4:2 divided by 2
    assert code["extra"]["reference"] == code["extra"]["references"][0]
    plain, _ = tw.generate(40, 0, levels=[2], code_share=0.5, seed=0,
                           ways=["units", "carry", "copy"])
    assert [r["id"] for r in plain] == [r["id"] for r in train]  # the same problems
    for bad, why in (({"swap": 2}, "not among the ways"), ({"units": 0}, "integer >= 1"),
                     ({"units": 1.5}, "integer >= 1")):
        with pytest.raises(ValueError, match=why):
            tw.generate(4, 0, levels=[2], ways=["units", "copy"], way_weights=bad)
    with pytest.raises(ValueError, match="needs ways"):
        tw.generate(4, 0, levels=[2], way_weights={"units": 2})
    with pytest.raises(ValueError, match="'copy=x' is not way=INTEGER"):
        tw.parse_way_weights("units=2,copy=x")
    r = subprocess.run(["python", str(ROOT / "datasets" / "toyworld.py"), "--out", "/nonexistent",
                        "--ways", "units", "--way-weights", "units"], capture_output=True,
                       text=True, check=False)
    assert r.returncode == 2 and "'units' is not way=INTEGER" in r.stderr


def test_the_driver_writes_a_worlds_data_apart_and_passes_its_settings(tmp_path) -> None:
    d = ab.Driver(ab.AblateOptions(name="entropy-control", seeds=1, out=tmp_path))
    assert d.world is WORLDS["rare-way"] and d.data == tmp_path / "data-rare-way"
    d.write_data()
    rows = [json.loads(x) for x in (d.data / "train.jsonl").read_text().splitlines()]
    assert {r["extra"]["level"] for r in rows} == {2, 3} and len(rows) == 6000
    assert (d.data / "ARGS").read_text() == " ".join(WORLDS["rare-way"].data_args)
    stamp = (d.data / "train.jsonl").stat().st_mtime_ns
    d.write_data()  # the same arguments: not written again
    assert (d.data / "train.jsonl").stat().st_mtime_ns == stamp
    cfg = load_config(ab.BASE_CONFIG, d.run_overrides(d.variants[0], 1, tmp_path / "m"))
    assert [s.max_response_length for s in cfg.magic.stages] == [48]
    assert cfg.eval.n_samples == 8 and cfg.eval.max_tokens == 48
    assert cfg.warm_start.response_template == "{references}"
    assert cfg.data.train_files == [str(d.data / "train.jsonl")]
    # another world on request; the demo's data keeps its place
    demo = ab.Driver(ab.AblateOptions(name="entropy-control", seeds=1, out=tmp_path,
                                      world="demo"))
    assert demo.data == tmp_path / "data" and not demo.world.overrides
    with pytest.raises(ValueError, match="unknown world 'moon'"):
        ab.Driver(ab.AblateOptions(name="kl", out=tmp_path, world="moon"))
    with pytest.raises(ValueError, match="another --world"):
        ab.Driver(ab.AblateOptions(name="kl", profile="confirm", out=tmp_path, world="ways"))


def test_pass_at_k_is_read_over_the_last_three_evaluations() -> None:
    rows = [{mn.STEP: s, mn.EVAL_ACCURACY: 0.1, mn.EVAL_PASS_AT_K: p}
            for s, p in ((0, 0.9), (20, 0.2), (40, 0.4), (60, 0.6), (80, 0.8))]
    assert run_numbers(rows)[mn.EVAL_PASS_LAST3] == pytest.approx(0.6)
    assert run_numbers(rows[:3])[mn.EVAL_PASS_LAST3] is None  # two after step 0
    no_pass = [{k: v for k, v in r.items() if k != mn.EVAL_PASS_AT_K} for r in rows]
    assert run_numbers(no_pass)[mn.EVAL_PASS_LAST3] is None


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout.split()[0]


def test_on_the_confirm_profile_a_twin_counts_only_if_it_would_be_confirmatory(tmp_path) -> None:
    """temperature's t1.0 is the demo's own config, which other ablations run too: a finished
    run made before temperature's pre-registration commit (the repository's first commit here)
    may stand for it on an exploratory profile, not on the confirm one; one made at HEAD may."""
    first, head = _git("rev-list", "--max-parents=0", "HEAD"), _git("rev-parse", "HEAD")
    t10 = Variant("t1.0", {"magic.temperature": "1.0"})
    old, new = tmp_path / "old", tmp_path / "new"
    for run, sha in ((old, first), (new, head)):
        run.mkdir()
        (run / "environment.json").write_text(json.dumps([{"code": {"commit": sha,
                                                                     "dirty": False}}]))
    confirm = ab.Driver(ab.AblateOptions(name="temperature", profile="confirm", out=tmp_path))
    seed = confirm.seeds[0]
    assert not confirm.twin_counts(t10, seed, old)
    assert confirm.twin_counts(t10, seed, new)
    assert not confirm.twin_counts(t10, 0, new)  # not a registered seed
    full = ab.Driver(ab.AblateOptions(name="temperature", profile="full", out=tmp_path))
    assert full.twin_counts(t10, 0, old)


def test_a_confirmatory_summary_checks_its_dose_runs_code_too(tmp_path) -> None:
    """clip-higher's arms run at the dose its dose-finding runs choose (or not at all): a dose
    run made before the pre-registration commit makes the summary not confirmatory, naming it,
    and its commit is among the summary's code commits."""
    first, head = _git("rev-list", "--max-parents=0", "HEAD"), _git("rev-parse", "HEAD")
    d = ab.Driver(ab.AblateOptions(name="clip-higher", profile="confirm", out=tmp_path))
    for name, sha in (("dose-clip0.2-2.0e-4-s900", head), ("dose-clip0.2-4.0e-4-s900", first)):
        run = tmp_path / name
        run.mkdir()
        (run / "environment.json").write_text(json.dumps([{"code": {"commit": sha,
                                                                     "dirty": False}}]))
        d.dose_runs.append(run)
    standing = d.standing([])
    assert standing["confirmatory"] is False and set(standing["code_commits"]) == {first, head}
    assert standing["not_confirmatory_because"] == [
        f"dose run dose-clip0.2-4.0e-4-s900: made at {first[:12]}, before the pre-registration "
        f"commit {standing['preregistration_commit'][:12]} (or off its line)"]
    d.dose_runs.pop()
    assert d.standing([])["confirmatory"] is True


def test_a_report_with_no_dose_that_acted_shows_the_curve_and_no_empty_plots() -> None:
    from trainer.ablation import report as rep

    a = ABLATIONS["clip-higher"]
    reason = "no dose of the registered ladder brought the mechanism into play: magic.lr=..."
    summary = rep.build_summary(a, a.variants_for("confirm"), [], undecidable=reason)
    summary["dose"] = {"rule": "the smallest magic.lr of 2.0e-4, 4.0e-4 ...", "knob": "magic.lr",
                       "curve": {"2.0e-4": 0.00025, "4.0e-4": 0.0011}, "reference": None,
                       "chosen": None}
    text = rep.report_markdown(summary, a, {}, [])
    assert f"The mechanism is absent here: {reason}." in text
    assert a.undecidable_on_cpu not in text  # the measured reason, not the standing mark
    assert "## Dose" in text and "| 4.0e-4 | 0.0011 |" in text
    assert "Chosen: none; the arms were not run." in text
    assert "None: no run of the arms." in text and "![" not in text
    assert rep._label_cell(summary["benefit"]).startswith("**undecidable on CPU** (no arm")
