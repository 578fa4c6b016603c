"""docs/verifier-service.md's table of the lcb differential set: per class of rule, how many
programs LiveCodeBench's judge passes, how many the ``lcb`` profile judges as it does, and how
many the ``default`` profile passes (where the two profiles part, and by how much).

Every program of tests/lcb_differential.py is judged here under ``lcb`` and under ``default``
(real nsjail), against LiveCodeBench's labels (tests/fixtures/lcb_labels.json). The table is
written into docs/verifier-service.md ("Judging profiles") between
``<!-- lcb-differential:begin -->`` and ``<!-- ...:end -->``;
tests/test_lcb_differential.py checks that its program and label counts match the fixture.

    .venv/bin/python scripts/lcb_table.py            # judge, print, rewrite the table in the doc
    .venv/bin/python scripts/lcb_table.py --check    # judge and print only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox import create_sandbox  # noqa: E402 - after the path
from tests.lcb_differential import PROGRAMS, problems  # noqa: E402
from verifier.scoring.code_score import score_code  # noqa: E402
from verifier.items import Limits, Status  # noqa: E402
from verifier.scoring.profiles import get_profile  # noqa: E402

LABELS = ROOT / "tests" / "fixtures" / "lcb_labels.json"
README = ROOT / "docs" / "verifier-service.md"  # where the table lives
BEGIN, END = "<!-- lcb-differential:begin -->", "<!-- lcb-differential:end -->"
HEADER = ("| rule class | programs | LiveCodeBench passes | `lcb` gives LiveCodeBench's verdict "
          "| `default` passes |")


def fenced(code: str) -> str:
    return f"<think>\nplan\n</think>\nHere it is:\n```python\n{code}\n```\n"


def judge_all() -> dict[str, dict[str, bool]]:
    """Program id -> {"lcb": passed, "default": passed} (real nsjail)."""
    sb = create_sandbox("nsjail")
    probs = problems()
    out: dict[str, dict[str, bool]] = {}
    try:
        for p in PROGRAMS:
            out[p.id] = {}
            for name in ("lcb", "default"):
                o = score_code(fenced(p.code), probs[p.problem], Limits(), sb,
                               profile=get_profile(name))
                out[p.id][name] = o.status is Status.CORRECT
    finally:
        sb.close()
    return out


def rows(labels: dict, judged: dict[str, dict[str, bool]] | None) -> list[tuple]:
    """(class, programs, LiveCodeBench passes, lcb agrees, default passes) per class, in the
    order the classes first appear in the set; the last two are None without ``judged``."""
    by: dict[str, list] = defaultdict(list)
    for p in PROGRAMS:
        by[p.rule].append(p)
    out = []
    for rule, ps in by.items():
        lcb_pass = sum(labels[p.id]["passed"] for p in ps)
        if judged is None:
            out.append((rule, len(ps), lcb_pass, None, None))
        else:
            agree = sum(judged[p.id]["lcb"] == labels[p.id]["passed"] for p in ps)
            out.append((rule, len(ps), lcb_pass, agree, sum(judged[p.id]["default"] for p in ps)))
    return out


def table(labels: dict, judged: dict[str, dict[str, bool]]) -> str:
    lines = [HEADER, "|---|---|---|---|---|"]
    total = [0, 0, 0, 0]
    for rule, n, lcb_pass, agree, default_pass in rows(labels, judged):
        lines.append(f"| {rule} | {n} | {lcb_pass} | {agree} | {default_pass} |")
        total = [a + b for a, b in zip(total, (n, lcb_pass, agree, default_pass))]
    lines.append(f"| **all** | **{total[0]}** | **{total[1]}** | **{total[2]}** "
                 f"| **{total[3]}** |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="print only; leave docs/verifier-service.md alone")
    args = ap.parse_args()
    labels = json.loads(LABELS.read_text(encoding="utf-8"))["labels"]
    t0 = time.monotonic()
    judged = judge_all()
    text = table(labels, judged)
    print(text)
    print(f"({len(PROGRAMS)} programs x 2 profiles in {time.monotonic() - t0:.0f} s)")
    if args.check:
        return 0
    readme = README.read_text(encoding="utf-8")
    a, b = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    README.write_text(readme[:a] + "\n" + text + "\n" + readme[b:], encoding="utf-8")
    print(f"wrote the table into {README.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
