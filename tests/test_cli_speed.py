"""`trainer --help`, a misspelt flag and `trainer config show` answer without importing torch,
transformers or matplotlib (about ten seconds on a 2-core CPU; about one second without):
each command imports what it runs (trainer/cli.py). Checked by what a fresh interpreter has
imported, not by a clock (the machines are noisy)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "matplotlib", "vllm", "deepspeed")

PROBE = """
import json, sys
from trainer.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def imported(*args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, check=False)
    return {**json.loads(r.stdout.strip().splitlines()[-1]), "stderr": r.stderr}


@pytest.mark.parametrize("args", [
    ["--help"], ["run", "--help"], ["eval", "--help"], ["filter", "--help"],
    ["ablate", "--help"], ["plot", "--help"],
    ["config", "show", "--config", "trainer/configs/demo.yaml"],
])
def test_help_and_config_show_import_nothing_heavy(args) -> None:
    got = imported(*args)
    assert got["code"] in (0, None), got["stderr"][-2000:]
    assert got["heavy"] == [], f"trainer {' '.join(args)} imported {got['heavy']}"


def test_a_misspelt_flag_is_refused_without_importing_anything_heavy() -> None:
    got = imported("run", "--config", "trainer/configs/demo.yaml", "--verifer-addr", "x")
    assert got["code"] not in (0, None)
    assert "--verifer-addr" in got["stderr"] and got["heavy"] == []


def test_a_config_error_is_one_line_without_importing_anything_heavy() -> None:
    got = imported("run", "--config", "trainer/configs/demo.yaml", "magic.group_sise=4")
    assert got["code"] == 2 and "group_sise" in got["stderr"] and got["heavy"] == []
