"""The differential test of the ``lcb`` profile: every program of tests/lcb_differential.py gets
the verdict LiveCodeBench's own judge gave it (tests/fixtures/lcb_labels.json: the judge's
commit and how it was run are recorded there; scripts/lcb_label.py made it). Real nsjail.
A pass is CORRECT here and all-True there; anything else is a failure on both sides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest_sandbox import nsjail_sandbox  # noqa: F401
from tests.lcb_differential import PROGRAMS, problems
from verifier.code_score import score_code
from verifier.items import Limits, Status
from verifier.profiles import get_profile

LABELS_PATH = Path(__file__).resolve().parent / "fixtures" / "lcb_labels.json"
LABELS = json.loads(LABELS_PATH.read_text(encoding="utf-8"))
PROBLEMS = problems()
LCB = get_profile("lcb")


def fenced(code: str) -> str:
    return f"<think>\nplan\n</think>\nHere it is:\n```python\n{code}\n```\n"


def test_every_program_is_labelled():
    assert LABELS["judge"] == "LiveCodeBench/LiveCodeBench"
    assert LABELS["commit"].startswith("28fef95")
    assert sorted(LABELS["labels"]) == sorted(p.id for p in PROGRAMS)


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.id for p in PROGRAMS])
def test_lcb_gives_livecodebench_verdict(nsjail_sandbox, program):
    o = score_code(fenced(program.code), PROBLEMS[program.problem], Limits(), nsjail_sandbox,
                   profile=LCB)
    want = LABELS["labels"][program.id]["passed"]
    assert (o.status is Status.CORRECT) == want, (program.rule, o, LABELS["labels"][program.id])
