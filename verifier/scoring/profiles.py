"""Judging profiles: whose rules an item is judged by.

A reward, or a benchmark number, is only comparable with others when it is judged by the same
rules as theirs. A profile reproduces one reference judge's program environment and rules on
top of this project's sandbox (isolation is never relaxed: where a reference has no memory
limit, the profile's is generous, and configurable per item).

- ``default``: this project's rules (the verifier's docstrings; a 6 s test limit, a whole-sample
  budget of min(6n + 3, 60) s, 1 GiB, the last python block after the last ``</think>``,
  ``\\boxed{}`` required for math).
- ``lcb``: LiveCodeBench's judge (LiveCodeBench/LiveCodeBench at 28fef95:
  ``lcb_runner/evaluation/testing_util.py``, ``import_string`` and ``grade_stdio``/
  ``grade_call_based``; ``lcb_runner/evaluation/compute_code_generation_metrics.py``,
  ``sys.set_int_max_str_digits(50000)`` and ``check_correctness`` for the sample budget, and
  ``evaluate_generations_by_problem`` for numpy results; ``lcb_runner/utils/
  extraction_utils.py`` ``extract_code`` for the code block).
- ``skywork``: the released Skywork-OR1 reward (SkyworkAI/Skywork-OR1 at 64e96af:
  ``verl/utils/reward_score/livecodebench/compute_score.py``, ``IMPORT_PROMPT``,
  ``math_verify_reward_function``, the 2 s units of assert and LeetCode tests; stdin and
  functional problems go through its bundled, older copy of LiveCodeBench's judge,
  ``livecodebench/lcb_runner/evaluation/``, so they follow ``lcb`` (its harness semantics, no
  output cap) but for that copy's plain StringIO stdin and ``compute_score``'s conversion of a
  function into a ``Solution`` method (verifier/harness/lcb_runner.py), with its
  ``check_correctness``'s min((6 + 1) n + 5, 300) s and 50 GB).

The rules are data here; ``verifier/scoring/code_score.py``, the harness and ``verifier/scoring/math_score.py``
apply them. docs/verifier-service.md has the side-by-side table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from verifier.scoring.bigint import MAX_INT_DIGITS
from verifier.items import PROFILES

ProfileName = Literal["default", "lcb", "skywork"]

# LiveCodeBench's preamble, run before every program (testing_util.py, ``import_string``).
LCB_PREAMBLE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
    "from random import *\nfrom statistics import *\nfrom itertools import *\n"
    "from functools import *\nfrom operator import *\nfrom io import *\nfrom sys import *\n"
    "from json import *\nfrom builtins import *\nfrom typing import *\nimport string\nimport re\n"
    "import datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\nimport math\n"
    "import random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)

# Skywork-OR1's import prompt, prepended to programs judged by assert cases (compute_score.py,
# ``IMPORT_PROMPT``).
SKYWORK_ASSERT_PREAMBLE = (
    "from typing import *\n\nfrom functools import *\nfrom collections import *\n"
    "from itertools import *\nfrom heapq import *\nfrom bisect import *\nfrom string import *\n"
    "from operator import *\nfrom math import *\nimport math\nimport datetime\n"
    "inf = float('inf')\n\n"
)


DEFAULT_MAX_OUTPUT_MB = 64
"""The default of the server's maximum output per test (``verifier serve --max-output-mb``,
``ScoringConfig.max_output_mb``): the cap of profiles that have none of their own (lcb,
skywork), and the most any profile's own cap may be."""


def output_cap(profile: "Profile", max_output_mb: int) -> int:
    """Bytes of output one test of ``profile`` may produce on a server whose maximum is
    ``max_output_mb``: the server's maximum for a profile with no cap of its own (lcb, skywork:
    LiveCodeBench's judge and Skywork-OR1's copy of it have none, so only the program's memory
    and the server bound it), else the
    profile's own cap, never more than the server's maximum."""
    cap = max_output_mb << 20
    return cap if profile.output_bytes is None else min(profile.output_bytes, cap)


@dataclass(frozen=True)
class Profile:
    """One judge's rules. Times in seconds, memory in MiB."""

    name: str
    # -- code ---------------------------------------------------------------------------------
    preamble: str = ""
    """Source run in the program's namespace before the program (stdin and call-based
    programs)."""
    assert_preamble: str = ""
    """Source run before a program judged by assert cases."""
    leetcode_preamble: str = ""
    """Source run before a program judged by LeetCode-format units (``import_prefix``,
    ``test_code``, ``entry_point``), before the row's own ``import_prefix``."""
    int_max_str_digits: int | None = None
    """``sys.set_int_max_str_digits`` for the program (None: Python's default, 4,300)."""
    stdio_exit_ok: bool = False
    """stdin/stdout programs: a ``SystemExit`` with any status ends the program and its output
    is compared (LiveCodeBench swallows it); else a non-zero status is RUNTIME_ERROR."""
    test_timeout_s: float = 6.0
    """Time limit of one test (a stdin/stdout or call-based test case)."""
    unit_timeout_s: float | None = None
    """Time limit of one assert or LeetCode-style unit (None: ``test_timeout_s``)."""
    sample_budget: Literal["default", "lcb"] = "default"
    """The whole sample's time: "default" min(n x test + 3, 60) s; "lcb" (test + 1) x n + 5 s,
    capped at a fixed 300 s (``code_score.MAX_PROFILE_ITEM_S``: Skywork's cap, and the default
    of the server's ``max_timeout_s``, which bounds only what an item asks for itself)."""
    memory_mb: int = 1024
    """The program's address-space limit unless the item asks for another."""
    numpy: bool = False
    """numpy importable by the program (a read-only mount of an environment holding numpy
    alone), and numpy scalars returned compared as the plain numbers they stand for."""
    harness: Literal["default", "lcb", "skywork"] = "default"
    """How stdin/stdout and call-based programs are run: "default", this project's (a fresh
    ``__main__`` per stdin test, a real stdin and stdout, a new ``Solution`` per call); "lcb",
    LiveCodeBench's harness semantics (verifier/harness/lcb_runner.py: one process per sample,
    its stdin mock and stdout capture, stdin programs wrapped as a function, its name-guard
    rule, its reliability guard, the preamble pasted as text, one ``Solution`` per sample,
    ``==`` on Fractions, Decimals and deep lists); "skywork", the same with the rules where
    Skywork-OR1's older copy of that judge differs (a plain StringIO stdin; a function without
    ``class Solution`` made a method of one)."""
    output_bytes: int | None = 8 * 1024 * 1024
    """The most stdout (or captured output) one test may produce; more is OUTPUT_LIMIT. None:
    no cap of the profile's own (LiveCodeBench has none): the server's maximum
    (``ScoringConfig.max_output_mb``, :func:`output_cap`), bounded too by the program's
    memory. A profile's own cap never exceeds the server's maximum either: only a profile
    without one (lcb, skywork) gets more than 8 MiB when the server raises its maximum."""
    checkers: bool = True
    """A ground truth's ``checker`` (docs/contracts.md 1, verifier/scoring/checkers.py) is used. False
    (lcb, skywork): their reference judges compare exactly whatever an item says; the verdict's
    detail then says that the item's checker was not used."""
    code_extraction: Literal["default", "lcb", "skywork"] = "default"
    """"default": the last python/py/python3/untagged fenced block after the last
    ``</think>``; "lcb": the lines between the last two lines that hold a fence, in the whole
    response; "skywork": the last block opened by exactly ```` ```python\\n```` after the first
    ``</think>`` (up to the next one)."""
    # -- math ---------------------------------------------------------------------------------
    math_extraction: Literal["default", "skywork"] = "default"
    """"default": the last ``\\boxed{}`` after the last ``</think>``; "skywork": math-verify's
    own extraction (LaTeX and plain expressions, no ``\\boxed`` needed) on the text after the
    first ``</think>``."""


PROFILE_TABLE: dict[str, Profile] = {
    "default": Profile("default"),
    "lcb": Profile(
        "lcb",
        preamble=LCB_PREAMBLE,
        # LiveCodeBench has no assert or LeetCode-format tests: its environment is kept.
        assert_preamble=LCB_PREAMBLE,
        leetcode_preamble=LCB_PREAMBLE,
        int_max_str_digits=50_000,
        stdio_exit_ok=True,
        test_timeout_s=6.0,
        sample_budget="lcb",
        memory_mb=4096,
        numpy=True,
        harness="lcb",
        output_bytes=None,  # no cap there: the server's maximum (output_cap)
        checkers=False,  # LiveCodeBench's judge compares exactly (testing_util.py)
        code_extraction="lcb",
    ),
    "skywork": Profile(
        "skywork",
        preamble=LCB_PREAMBLE,
        assert_preamble=SKYWORK_ASSERT_PREAMBLE,
        # LeetCode-format units get the row's import_prefix alone (compute_score.py, the
        # ``import_prefix`` branch: no IMPORT_PROMPT, no recursion limit).
        leetcode_preamble="",
        int_max_str_digits=50_000,
        stdio_exit_ok=True,
        test_timeout_s=6.0,
        unit_timeout_s=2.0,
        sample_budget="lcb",
        memory_mb=4096,
        numpy=True,
        # Its stdin and call-based problems are judged by its copy of LiveCodeBench's harness
        # (SkyworkAI/Skywork-OR1 at 64e96af, verl/utils/reward_score/livecodebench/compute_score.py
        # calls lcb_runner/evaluation/compute_code_generation_metrics.py ``check_correctness``):
        # LiveCodeBench's semantics, with that copy's differences (verifier/harness/
        # lcb_runner.py: ``skywork_stdin``, ``skywork_function_to_method``).
        harness="skywork",
        # No output cap there either (its testing_util.py ``Capturing`` keeps all): the
        # server's maximum (output_cap), as lcb.
        output_bytes=None,
        checkers=False,  # its copy of LiveCodeBench's judge compares exactly
        code_extraction="skywork",
        math_extraction="skywork",
    ),
}
assert tuple(PROFILE_TABLE) == PROFILES

assert all((p.int_max_str_digits or 0) <= MAX_INT_DIGITS for p in PROFILE_TABLE.values())


def get_profile(name: str, default: str = "default") -> Profile:
    """The profile called ``name`` ("" = ``default``). KeyError for an unknown one (items are
    validated before they get here)."""
    return PROFILE_TABLE[name or default]
