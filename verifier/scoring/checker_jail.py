"""Program checkers (docs/contracts.md 1): a ground truth's ``{"language": "python", "source":
...}`` judging a sample's stdin/stdout outputs in testlib's convention, in a jail of its own.

The checker is dataset code, not trusted code. It runs under the same sandbox policy as the
programs, in a jail started for it (never the jail of the program it judges), by the judge's
harness in mode "checker" (verifier/harness/checker.py), so the forkserver and pre-started jails
serve it as they serve the programs' harness. The program reaches it only through its stdout
(capped as every test's), written to the checker's OUTPUT_FILE; the test's input and the
expected output are INPUT_FILE and ANSWER_FILE.

Cost: one checker jail per sample, started after the program's run, for the tests whose output
is not already the expected one (equal after stripping the whole text: the expected answer is
right by definition); it checks them in order and, as the program's run, stops at the first one
not accepted (unless ``run_all_tests``).

Verdicts (testlib.h's exit codes, MikeMirzayanov/testlib: ``_ok`` 0, ``_wa`` 1, ``_pe`` 2,
``_fail`` 3): 0 accepted; 1 and 2 the program's wrong answer; 3, the checker's own failure, the
item's INVALID_INPUT naming it. A checker that crashes on a program's output (an exception, a
signal, its time or memory limit, too much printed, another exit code) counts as that program's
wrong answer only if the same checker accepts the expected answer as the output: checked once
per checker, input and answer (the "self-check", cached here by content), else the item is
INVALID_INPUT. The program never makes its item SANDBOX_ERROR or INTERNAL_ERROR through a
checker: those are left to the checker's jail failing (the sandbox's fault) and the verifier's
own bugs.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from typing import Any, NamedTuple

from sandbox import SandboxLimits
from verifier.scoring.checkers import ProgramChecker
from verifier.harness import framing
from verifier.items import Outcome, Status
from verifier.scoring.output_compare import SHORT, short

CHECK_PENDING_BYTES = 64 << 20
"""The most program output of one sample that may wait for its checker (the judge holds it
until the program's run ends); past it the sample is OUTPUT_LIMIT."""
CHECKER_OUTPUT_BYTES = 64 << 10
"""What one run of a checker may print (stdout); more is a crash of the checker's."""
MAX_CHECK_BUDGET_S = 60.0
"""The longest the checks of one sample may take together (each check has the item's test
time limit); past it the test at hand counts as a checker timeout (then the self-check
decides). The self-check gets its own test time limit beyond it."""
CHECKER_SLACK_S = 3.0  # the checker jail's start and its harness, beyond the checks' time
SELF_CHECK_CACHE = 65536  # self-check results kept (by content), oldest dropped first

_VERDICT_TEXT = {"wrong": "wrong answer", "presentation": "presentation error"}


class Case(NamedTuple):
    """One test for the checker: its index in the item, input, the program's stdout and the
    expected output."""

    i: int
    input: str
    output: bytes
    answer: str


# -- self-checks, by content -------------------------------------------------------------------

# Key: sha256 of the checker's digest, the input and the answer. Value: "" (the checker
# accepts the expected answer) or why not. Only definite results are kept: a self-check that
# timed out or was killed may have been the machine's load, and is run again next time.
_self_checks: OrderedDict[bytes, str] = OrderedDict()
# Guards _self_checks; the judge's code threads share it. Held only to read or write it.
_self_check_lock = threading.Lock()


def _self_check_key(checker: ProgramChecker, case: Case) -> bytes:
    h = hashlib.sha256(checker.digest)
    for text in (case.input, case.answer):
        data = text.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.digest()


def cached_self_check(checker: ProgramChecker, case: Case) -> str | None:
    """"" (accepted), the reason it was not, or None when not known."""
    key = _self_check_key(checker, case)
    with _self_check_lock:
        found = _self_checks.get(key)
        if found is not None:
            _self_checks.move_to_end(key)
        return found


def _remember_self_check(checker: ProgramChecker, case: Case, result: str) -> None:
    key = _self_check_key(checker, case)
    with _self_check_lock:
        _self_checks[key] = result
        _self_checks.move_to_end(key)
        while len(_self_checks) > SELF_CHECK_CACHE:
            _self_checks.popitem(last=False)


# -- the checker's jail ------------------------------------------------------------------------


def checker_run(checker: ProgramChecker, cases: list[Case], *, test_timeout: float,
                memory_mb: int, stop_on_fail: bool, oom_is_memory: bool
                ) -> tuple[dict[str, Any], SandboxLimits]:
    """The harness payload of one sample's checks (mode "checker": verifier/harness/checker.py)
    and the limits of its jail: the checks' budget, the self-check's time and the start-up;
    the program's memory limit; a scratch large enough for the biggest test's three files."""
    tt = float(test_timeout)
    budget = min(len(cases) * tt, MAX_CHECK_BUDGET_S)
    tests = []
    biggest_file = biggest_case = 0
    for case in cases:
        files = [case.input.encode("utf-8", "surrogatepass"), case.output,
                 case.answer.encode("utf-8", "surrogatepass")]
        biggest_file = max(biggest_file, *(len(f) for f in files))
        biggest_case = max(biggest_case, sum(len(f) for f in files))
        need_self_check = cached_self_check(checker, case) is None
        tests.append([*files, need_self_check])
    cfg: dict[str, Any] = {
        "mode": "checker",
        "source": checker.source,
        "prefix": "",
        "int_digits": None,
        "exit_ok": False,  # the exit code is the checker's verdict
        "sys_path": None,
        "test_timeout": tt,
        "memory_mb": int(memory_mb),
        "output_bytes": CHECKER_OUTPUT_BYTES,
        "lcb_rules": "",
        "stop_on_fail": stop_on_fail,
        "oom_is_memory": oom_is_memory,
        "budget_s": float(budget),
        "n_units": len(cases),
        "tests": tests,
    }
    problem = framing.payload_problem(cfg)
    if problem:
        raise ValueError(f"the checker payload does not match framing.PAYLOAD_FIELDS: {problem}")
    # The jail's limits depend on the test time limit alone for all but huge samples: a
    # pre-started jail serves only a run with exactly its command and limits (sandbox/warm.py),
    # so they do not follow the number of tests. The wall is a backstop: the harness keeps the
    # checks to ``budget`` and gives the self-check ``tt`` more.
    wall = MAX_CHECK_BUDGET_S + tt + CHECKER_SLACK_S
    mib = 1 << 20
    limits = SandboxLimits(
        wall_s=wall,
        cpu_s=wall + 1,
        memory_mb=int(memory_mb),
        # The three files of one test at a time (each test's are removed after its check).
        scratch_mb=max(64, math.ceil(biggest_case / mib) + 16),
        file_size_mb=max(16, math.ceil(biggest_file / mib) + 1),
        # Two records per test at most (its check and a self-check), each with two tails.
        output_bytes=max(16 * mib, 2 * len(cases) * (2 * framing.ERR_TAIL + 4096) + mib),
    )
    return cfg, limits


class CheckerRecords:
    """The records of one checker jail (``on_record`` is the record stream's hook), turned into
    the verdicts of its tests by :meth:`verdicts`."""

    def __init__(self) -> None:
        self.tests: dict[int, tuple[dict, list[bytes]]] = {}
        self.self_checks: dict[int, tuple[dict, list[bytes]]] = {}
        self.special: Outcome | None = None
        self.done = False

    def on_record(self, head: dict, blobs: list[bytes]) -> bool:
        t, i = head.get("type"), head.get("i")
        if t == "done":
            self.done = True
        elif t == "syntax":
            self.special = Outcome(Status.INVALID_INPUT,
                                   f"the checker does not compile: {head.get('detail', '')}")
            return False
        elif t == "payload_error":  # before any checker code ran: the verifier's bug
            self.special = Outcome(Status.INTERNAL_ERROR, "the checker's payload was refused by "
                                   f"its harness: {head.get('detail', '')}")
            return False
        elif t == "harness_error":
            self.special = Outcome(Status.SANDBOX_ERROR,
                                   f"the checker's harness failed: {head.get('detail', '')}")
            return False
        elif t in ("test", "selfcheck") and type(i) is int and type(head.get("verdict")) is str:
            (self.tests if t == "test" else self.self_checks)[i] = (head, blobs)
        return True

    def verdicts(self, checker: ProgramChecker, cases: list[Case], total: int,
                 stop_on_fail: bool, run_status: str) -> dict[int, tuple[Status, str]] | Outcome:
        """Each case's verdict by the item's test index, or the Outcome of the whole item (the
        checker failed or is broken: INVALID_INPUT; its jail failed: SANDBOX_ERROR)."""
        if self.special is not None:
            return self.special
        out: dict[int, tuple[Status, str]] = {}
        failed = False
        for k, case in enumerate(cases):
            where = f"test {case.i + 1}/{total}"
            if failed and stop_on_fail:
                out[case.i] = (Status.INCORRECT, f"{where}: not checked (an earlier test failed)")
                continue
            rec = self.tests.get(k)
            if rec is None and failed:  # run_all_tests: the checks' time ran out earlier
                out[case.i] = (Status.INCORRECT, f"{where}: not checked (an earlier test failed "
                               "and the checker's time ran out)")
                continue
            if rec is None:
                return Outcome(Status.SANDBOX_ERROR, f"the checker's jail ended ({run_status}) "
                               f"before it judged {where}")
            head, blobs = rec
            verdict = head["verdict"]
            if verdict == "accepted":
                out[case.i] = (Status.CORRECT, "")
                continue
            failed = True
            if verdict in _VERDICT_TEXT:
                out[case.i] = (Status.INCORRECT, f"{where}: {_VERDICT_TEXT[verdict]} "
                               f"({_said(blobs)}; got {_got(case)})"[:500])
            elif verdict == "failed":
                return Outcome(Status.INVALID_INPUT, f"the checker failed (exit 3, testlib's "
                               f"_fail) on {where}: {_said(blobs)}"[:500])
            else:
                crash = self._crash(checker, case, k, where, head, blobs)
                if isinstance(crash, Outcome):
                    return crash
                out[case.i] = crash
        return out

    def _crash(self, checker: ProgramChecker, case: Case, k: int, where: str, head: dict,
               blobs: list[bytes]) -> tuple[Status, str] | Outcome:
        """A checker that gave no verdict on the program's output: the program's wrong answer
        if the checker accepts the expected answer, else the item's INVALID_INPUT."""
        how = _crash_text(head, blobs)
        own = cached_self_check(checker, case)
        if own is None and k in self.self_checks:
            own_head, own_blobs = self.self_checks[k]
            v = own_head["verdict"]
            own = "" if v == "accepted" else (
                _crash_text(own_head, own_blobs) if v == "crashed"
                else f"exit {own_head.get('exit')}: {_said(own_blobs)}")
            definite = v != "crashed" or own_head.get("status") == "exited"
            if definite:
                _remember_self_check(checker, case, own)
        if own is None:  # a later crash of a run_all sample: its first crash was self-checked
            return (Status.INCORRECT, f"{where}: the checker {how} on the program's output "
                    f"{_got(case)}"[:500])
        if own == "":
            return (Status.INCORRECT, f"{where}: the checker {how} on the program's output "
                    f"{_got(case)} (it accepts the expected answer, so the output is "
                    "wrong)"[:500])
        return Outcome(Status.INVALID_INPUT, f"the checker {how} on the program's output of "
                       f"{where} and does not accept the expected answer either ({own})"[:500])


def _said(blobs: list[bytes]) -> str:
    """What the checker said: the last line of its stderr, else of its stdout."""
    for blob in reversed(blobs[:2]):
        lines = [ln.strip() for ln in blob.decode("utf-8", "replace").splitlines() if ln.strip()]
        if lines:
            return f"checker: {lines[-1][:200]}"
    return "the checker said nothing"


def _got(case: Case) -> str:
    """The program's output, described in a few characters (as the exact rule's messages)."""
    return short(case.output[:SHORT * 4].decode("utf-8", errors="replace"))


def _crash_text(head: dict, blobs: list[bytes]) -> str:
    status = head.get("status")
    if status == "timeout":
        return head.get("detail") or "exceeded its time limit"
    if status == "error":
        return str(head.get("detail"))
    if status == "memory":
        return "ran out of memory"
    if status == "output_limit":
        return f"printed more than {CHECKER_OUTPUT_BYTES >> 10} KiB"
    if status == "signal":
        return f"was killed by signal {head.get('signal')}"
    if head.get("raised") and head.get("exit") == 1:
        return f"crashed ({_said(blobs).removeprefix('checker: ')})"
    return f"exited with code {head.get('exit')}, not a testlib verdict"
