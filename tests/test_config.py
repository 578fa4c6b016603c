"""The run config as a user meets it (trainer/config.py): one typed tree, YAML plus key=value,
every knob shown by ``trainer run --help`` and ``trainer config show``, values read as the field
expects, misspelt keys named with the closest valid one, one home per value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainer.cli import main
from trainer.config import (
    BACKEND_FIELDS_SET_BY_RUN,
    RunConfig,
    config_yaml,
    knob_help,
    load_config,
    read_yaml,
)

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "trainer" / "configs" / "demo.yaml"


def test_words_are_read_as_the_field_expects() -> None:
    cfg = load_config(DEMO, ["magic.entropy_mode=off", "verifier.profile=skywork",
                             "log.progress=on", "log.plots=no", "magic.online_filter=off",
                             "data.instruction_suffix=none", "tokenizer_path=none"])
    assert cfg.magic.entropy_mode == "off"  # a Literal: the string, not False
    assert cfg.log.progress == "on"
    assert cfg.data.instruction_suffix == "none"  # a plain string stays a string
    assert cfg.log.plots is False and cfg.magic.online_filter is False
    assert cfg.tokenizer_path is None  # str | None: none is None


def test_a_yaml_file_keeps_off_and_yes_as_strings(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("tiny_model: {}\ndata: {train_files: [a.jsonl]}\neval: {every_steps: 0}\n"
                    "magic:\n  entropy_mode: off\n  kl_coef: 1e-3\n"
                    "log:\n  progress: off\n  plots: false\n")
    cfg = load_config(path)
    assert cfg.magic.entropy_mode == "off" and cfg.log.progress == "off"
    assert cfg.magic.kl_coef == pytest.approx(1e-3)  # YAML 1.2: 1e-3 is a float


def test_lists_and_numbers(tmp_path) -> None:
    cfg = load_config(DEMO, ["data.train_files=[a.jsonl, b.jsonl]", "magic.lr=1e-5",
                             "magic.betas=[0.8, 0.9]", "backend.zero_stage=0"])
    assert cfg.data.train_files == ["a.jsonl", "b.jsonl"]
    assert cfg.magic.lr == 1e-5 and cfg.magic.betas == (0.8, 0.9)


@pytest.mark.parametrize("override, message", [
    ("magic.grup_size=4", r"unknown magic key 'grup_size' \(did you mean 'group_size'\?\)"),
    ("nmae=x", r"unknown run config key 'nmae' \(did you mean 'name'\?\)"),
    ("engine.chunk_sise=4", r"unknown engine key 'chunk_sise' \(did you mean 'chunk_size'\?\)"),
    ("magic.group_size=many", "magic.group_size must be an int, got 'many'"),
    ("log.plots=maybe", "log.plots must be a bool"),
    ("magic.entropy_mode=auto", r"entropy_mode must be one of \['adaptive', 'fixed', 'off'\]"),
    ("magic", "overrides must look like key=value"),
    ("magic.stages.0.steps=3", "magic.stages is not a section"),
])
def test_bad_overrides_name_what_is_wrong(override, message) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(DEMO, [override])


def test_a_misspelt_yaml_key_names_the_closest(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(DEMO.read_text().replace("magic:\n", "magic:\n  clip_hihg: 0.3\n", 1))
    with pytest.raises(ValueError, match=r"'clip_hihg' \(did you mean 'clip_high'\?\)"):
        load_config(path)


@pytest.mark.parametrize("name", sorted(BACKEND_FIELDS_SET_BY_RUN))
def test_every_value_has_one_home(tmp_path, name) -> None:
    """The optimizer's settings (and the seed, and the KL reference switch) live in one place:
    a backend section that sets them is refused, naming where they are set."""
    home = BACKEND_FIELDS_SET_BY_RUN[name]
    with pytest.raises(ValueError, match=f"backend.{name} cannot be set: a run sets it from "
                                         f"{home.split(' ')[0]}"):
        load_config(DEMO, [f"backend.{name}=1"])
    path = tmp_path / "c.yaml"
    path.write_text(DEMO.read_text() + f"\nbackend:\n  {name}: 1\n")
    with pytest.raises(ValueError, match=f"backend.{name} cannot be set"):
        load_config(path)
    assert f"backend.{name}" not in {row[0] for row in knob_help()}


def test_every_knob_has_help() -> None:
    rows = knob_help()
    assert len(rows) > 80
    assert [key for key, _, _, doc in rows if not doc] == []
    keys = {key for key, *_ in rows}
    assert {"magic.group_size", "magic.entropy_mode", "engine.chunk_size", "backend.zero_stage",
            "verifier.addr", "eval.n_samples", "log.samples_every"} <= keys


def test_run_help_lists_every_knob(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for key, _, _, doc in knob_help():
        assert f"{key} (" in out, key
        assert " ".join(doc.split())[:40] in out, key


def test_config_show_round_trips(tmp_path, capsys) -> None:
    assert main(["config", "show", "--config", str(DEMO), "magic.group_size=4",
                 "magic.entropy_mode=off"]) == 0
    text = capsys.readouterr().out
    assert "# Responses sampled per prompt (GRPO group)" in text  # the help as comments
    shown = tmp_path / "shown.yaml"
    shown.write_text(text)
    again = load_config(shown)
    want = load_config(DEMO, ["magic.group_size=4", "magic.entropy_mode=off"])
    assert again.to_dict() == want.to_dict()
    assert again.magic.group_size == 4 and again.magic.entropy_mode == "off"


def test_config_show_refuses_a_bad_key(capsys) -> None:
    assert main(["config", "show", "--config", str(DEMO), "magic.grup_size=4"]) == 2
    assert "did you mean 'group_size'" in capsys.readouterr().err


def test_to_dict_round_trips_through_yaml() -> None:
    cfg = load_config(DEMO, ["engine.kind=hf", "eval.max_problems=3"])
    text = config_yaml(cfg, comments=False)
    assert RunConfig.from_dict(read_yaml(text, "x")) == cfg
    assert dataclasses.asdict(RunConfig.from_dict(cfg.to_dict())) == dataclasses.asdict(cfg)


@pytest.mark.parametrize("section, key, value, message", [
    ("engine", "kv_cache_gib", "lots", r"engine.kv_cache_gib must be a number, got 'lots'"),
    ("engine", "max_model_len", 1.5, r"engine.max_model_len must be an int, got 1.5"),
    ("verifier", "addr", 8080, r"verifier.addr must be a string, got 8080"),
    ("backend", "gradient_checkpointing", "yes", r"backend.gradient_checkpointing must be a bool"),
    ("backend", "zero_stage", True, r"backend.zero_stage must be one of \[0, 1, 2, 3\]"),
    ("data", "train_files", "a.jsonl", r"data.train_files must be a list of strings"),
    ("eval", "n_samples", True, r"eval.n_samples must be an int, got True"),
    ("magic", "stages", [{"name": "a", "max_response_length": "8"}],
     r"magic.stages\[0\].max_response_length must be an int, got '8'"),
])
def test_every_section_is_parsed_by_the_one_routine(tmp_path, section, key, value, message):
    """One parsing routine for the whole tree (config_schema.build): a value of the wrong type
    is refused in any section, naming its dotted key, before anything loads (the sections
    outside magic were once built without a type check)."""
    data = read_yaml(DEMO.read_text(), "demo")
    data.setdefault(section, {})[key] = value
    with pytest.raises(ValueError, match=message):
        RunConfig.from_dict(data)


def test_a_run_directory_from_before_the_optimizer_left_the_backend_still_loads(tmp_path):
    """Earlier versions wrote backend.eps (1e-08, which no run changed) into config.yaml: such
    a run still resumes and compares equal to a fresh config; any other value is refused."""
    fresh = load_config(DEMO)
    old = tmp_path / "config.yaml"
    old.write_text(DEMO.read_text() + "\nbackend:\n  eps: 1.0e-08\n")
    assert load_config(old) == fresh
    old.write_text(DEMO.read_text() + "\nbackend:\n  eps: 1.0e-06\n")
    with pytest.raises(ValueError, match=r"backend.eps cannot be set any more.*1e-06"):
        load_config(old)
