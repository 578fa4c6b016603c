"""Label the lcb differential set (tests/lcb_differential.py) with a reference judge's own verdicts.

Neither reference's code is ever part of this repository: give the path of a directory holding it.

``--judge lcb`` (the default): LiveCodeBench's judge. The directory holds its
``lcb_runner/evaluation/{testing_util,compute_code_generation_metrics,pass_k_utils}.py`` (from
LiveCodeBench/LiveCodeBench at the commit named with ``--commit``; empty ``__init__.py`` files in
``lcb_runner/`` and ``lcb_runner/evaluation/``, so that nothing else is imported). Each program is
judged as LiveCodeBench judges a generation: ``evaluate_generations_by_problem([code], sample,
debug=False, timeout=6)`` (its ``check_correctness`` in a process of its own), and it passes when
every test result is True (``compute_metrics_from_results``: all > 0).

    .venv/bin/python scripts/lcb_label.py /tmp/lcb --commit 28fef95... \\
        -o tests/fixtures/lcb_labels.json

``--judge skywork``: the released Skywork-OR1 reward, which calls its own older copy of
LiveCodeBench's judge. The directory holds SkyworkAI/Skywork-OR1's
``verl/utils/reward_score/livecodebench/`` tree at ``--commit`` (``git show COMMIT:path`` of every
file under it), with empty ``verl/__init__.py``, ``verl/utils/__init__.py`` and
``verl/utils/reward_score/__init__.py``. Each program is judged by its entry point itself,
``compute_score.compute_score(response, input_output, timeout=6)`` (binary reward: the code block
after ``</think>``, ``ast.parse``, a function turned into a ``Solution`` method, then its
``check_correctness``; a pass is a True score), on the same response text the differential test
sends (``tests.lcb_differential.fenced``). The package's ``__init__.py`` is not run (it imports
its LLM runners); ``lcb_compute_score`` and ``prepare_unit_test_data``, which only its
``question_id`` branch uses, are None.

    .venv/bin/python scripts/lcb_label.py /tmp/sky --judge skywork --commit 64e96af... \\
        -o tests/fixtures/skywork_labels.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SKYWORK_PKG = "verl.utils.reward_score.livecodebench"


def lcb_judge(judge_dir: Path):
    """LiveCodeBench's judge: (code, input_output) -> (passed, results, error)."""
    sys.path.insert(0, str(judge_dir))
    from lcb_runner.evaluation.compute_code_generation_metrics import (  # noqa: E402 - the
        evaluate_generations_by_problem,  # path of LiveCodeBench's code is only known here
    )

    def judge(code: str, io: dict):
        sample = {"input_output": json.dumps(io)}
        res, meta = evaluate_generations_by_problem([[code], sample, False, 6])
        results = [r if isinstance(r, (bool, int)) else bool(r) for r in res[0]]
        passed = all(r is True or (type(r) is int and r > 0) for r in results)
        return passed, results, str(meta[0].get("error_message", ""))

    how = ("lcb_runner.evaluation.compute_code_generation_metrics."
           "evaluate_generations_by_problem([[code], sample, False, 6]); passed = every "
           "test result True; run by scripts/lcb_label.py")
    return judge, how, "LiveCodeBench/LiveCodeBench"


def skywork_judge(judge_dir: Path):
    """Skywork-OR1's reward: (code, input_output) -> (passed, results, error)."""
    sys.path.insert(0, str(judge_dir))
    pkg = types.ModuleType(SKYWORK_PKG)  # its __init__.py imports the LLM runners: not run
    pkg.__path__ = [str(judge_dir / SKYWORK_PKG.replace(".", "/"))]
    pkg.lcb_compute_score = pkg.prepare_unit_test_data = None  # question_id branch only
    sys.modules[SKYWORK_PKG] = pkg
    from verl.utils.reward_score.livecodebench.compute_score import (  # noqa: E402 - only
        compute_score,  # known here
    )

    from tests.lcb_differential import fenced

    def judge(code: str, io: dict):
        score, metrics = compute_score(fenced(code), copy.deepcopy(io), timeout=6)
        results, error = [], ""
        if isinstance(metrics, list) and metrics:
            results = [r if isinstance(r, (bool, int)) else bool(r) for r in metrics[0]]
            if len(metrics) > 1 and isinstance(metrics[1], dict):
                error = str(metrics[1].get("error_message", ""))
        elif metrics is None:
            error = "no metrics (extraction, ast.parse or the conversion to Solution failed)"
        return bool(score) and score is not None, results, error

    how = ("verl.utils.reward_score.livecodebench.compute_score.compute_score("
           "tests.lcb_differential.fenced(code), input_output, timeout=6) (binary reward; "
           "the package __init__ not run); passed = a True score; run by scripts/lcb_label.py "
           "--judge skywork")
    return judge, how, "SkyworkAI/Skywork-OR1"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("judge_dir", type=Path)
    ap.add_argument("--judge", choices=("lcb", "skywork"), default="lcb")
    ap.add_argument("--commit", required=True)
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--only", default="", help="comma list of program ids (for a quick look)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    judge, how, name = (lcb_judge if args.judge == "lcb" else skywork_judge)(
        args.judge_dir.resolve())

    from tests.lcb_differential import PROGRAMS, problems

    probs = problems()
    only = {s for s in args.only.split(",") if s}
    labels = {}
    t0 = time.monotonic()
    for p in PROGRAMS:
        if only and p.id not in only:
            continue
        start = time.monotonic()
        passed, results, error = judge(p.code, probs[p.problem])
        labels[p.id] = {"passed": passed, "results": results, "error": error[:200]}
        print(f"{p.id:40s} {'PASS' if passed else 'fail'} {results} "
              f"{error[:60]} ({time.monotonic() - start:.1f} s)", file=sys.stderr)
    out = {
        "judge": name,
        "commit": args.commit,
        "how": how,
        "python": platform.python_version(),
        "seconds": round(time.monotonic() - t0, 1),
        "labels": labels,
    }
    args.output.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
