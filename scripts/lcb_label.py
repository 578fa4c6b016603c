"""Label the lcb differential set (tests/lcb_differential.py) with LiveCodeBench's own verdicts.

LiveCodeBench's code is never part of this repository: give the path of a directory holding
its ``lcb_runner/evaluation/{testing_util,compute_code_generation_metrics,pass_k_utils}.py``
(from LiveCodeBench/LiveCodeBench at the commit named with ``--commit``; empty ``__init__.py``
files in ``lcb_runner/`` and ``lcb_runner/evaluation/``, so that nothing else is imported). Each
program is judged as LiveCodeBench judges a generation: ``evaluate_generations_by_problem(
[code], sample, debug=False, timeout=6)`` (its ``check_correctness`` in a process of its own),
and it passes when every test result is True (``compute_metrics_from_results``: all > 0).

    .venv/bin/python scripts/lcb_label.py /tmp/lcb --commit 28fef95... \
        -o tests/fixtures/lcb_labels.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lcb_dir", type=Path)
    ap.add_argument("--commit", required=True)
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--only", default="", help="comma list of program ids (for a quick look)")
    args = ap.parse_args()
    sys.path.insert(0, str(args.lcb_dir))
    sys.path.insert(0, str(ROOT))
    from lcb_runner.evaluation.compute_code_generation_metrics import (  # noqa: E402 - the
        evaluate_generations_by_problem,  # path of LiveCodeBench's code is only known here
    )

    from tests.lcb_differential import PROGRAMS, problems

    probs = problems()
    only = {s for s in args.only.split(",") if s}
    labels = {}
    t0 = time.monotonic()
    for p in PROGRAMS:
        if only and p.id not in only:
            continue
        sample = {"input_output": json.dumps(probs[p.problem])}
        start = time.monotonic()
        res, meta = evaluate_generations_by_problem([[p.code], sample, False, 6])
        results = [r if isinstance(r, (bool, int)) else bool(r) for r in res[0]]
        passed = all(r is True or (type(r) is int and r > 0) for r in results)
        labels[p.id] = {"passed": passed, "results": results,
                        "error": str(meta[0].get("error_message", ""))[:200]}
        print(f"{p.id:40s} {'PASS' if passed else 'fail'} {results} "
              f"{labels[p.id]["error"][:60]} ({time.monotonic() - start:.1f} s)", file=sys.stderr)
    out = {
        "judge": "LiveCodeBench/LiveCodeBench",
        "commit": args.commit,
        "how": ("lcb_runner.evaluation.compute_code_generation_metrics."
                "evaluate_generations_by_problem([[code], sample, False, 6]); passed = every "
                "test result True; run by scripts/lcb_label.py"),
        "python": platform.python_version(),
        "seconds": round(time.monotonic() - t0, 1),
        "labels": labels,
    }
    args.output.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
