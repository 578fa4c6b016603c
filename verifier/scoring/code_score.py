"""Scoring model-written programs against test cases (docs/contracts.md 1, 5).

``score_code(response, ground_truth, limits, sandbox) -> Outcome`` never raises for bad model
output or bad ground truth and never hangs: every process has a wall deadline and the whole
item is bounded by ``limits.timeout_s``.

How one sample is judged:

1. The program is the last fenced python block after the think block (NO_ANSWER without one).
   Its text is never compiled or parsed in this process (CPython compiles some sources in
   quadratic time, and this is a server thread holding the GIL): only its length is checked
   here; the harness compiles it inside the jail, under the jail's wall limit, and reports a
   SyntaxError as SYNTAX_ERROR. Likewise the test code of a ground truth (asserts,
   LeetCode-style) is parsed through ``run_bounded``, in a worker process under a deadline.
2. ONE sandboxed process per sample runs ``verifier/harness/harness.py`` (shipped into the
   sandbox as a file). The harness compiles the program once and runs each test in a child
   forked from the pristine harness, each under its own wall limit, CPU rlimit and memory
   rlimit (fork is ~1 ms once the interpreter is up, instead of a new interpreter and sandbox
   per test as in the naive approach).
3. The harness streams one authenticated record per test back (HMAC with a fresh key per
   record, keys released to the harness one at a time on its stdin, only when no process
   holding program code can see them). The judge compares here, outside the sandbox.
4. With early stop (the default, as released) the judge stops the sandbox at the first failed
   test; tests not run count as not passed.

Unforgeability per format:

- stdin/stdout and call-based: expected outputs never enter the sandbox. The program's stdout
  (or its return value, sent as plain data: never pickled, objects become opaque) is compared
  here with LiveCodeBench's rules. A program that prints "all tests passed", exits 0 from an
  atexit hook, patches builtins or returns an object with a rigged ``__eq__`` gains nothing.
  A program that raises (uncaught exception, non-zero exit, killed) fails its test even when
  the expected output is empty: the harness's wrapper records the exception on a separate pipe
  before any atexit hook of the program can run.
- asserts and LeetCode-style ``check(candidate)``: the expected values live in code, so that
  code runs in an *evaluator* process inside the sandbox that never executes program code; it
  calls the program's functions over a pipe, arguments and results as plain data, and does the
  comparison itself with pristine builtins. The program runs in a fresh interpreter that never
  held the test code (not a fork of the harness). It cannot read or write the evaluator's
  memory (seccomp denies ptrace/process_vm_*/pidfd_getfd), cannot reach its pipes (closed
  before the program's first instruction) and cannot signal PID 1.

Nothing the program sends is trusted or decoded without bounds: the comparisons
(``verifier/scoring/output_compare.py``) never build a container whose cost the program controls, and
the scorer runs them in worker processes under the item's deadline (``run_bounded``), off the
server's threads, all but the stdin/stdout comparisons of at most ``INLINE_COMPARE_BYTES``
(linear in that size: about 0.1 ms on the judge's thread). A program can only fail as itself:
whatever it does to its pipes, its harness or its output is a program verdict; SANDBOX_ERROR,
INVALID_INPUT and INTERNAL_ERROR are left to real failures of the verifier or of the item.

Residual risks (documented in sandbox/README.md): the program sees the INPUTS of all tests of
its sample (they are in the harness's memory when it forks), and it can kill the evaluator
(a failure, never a pass). Values that are not plain data (instances of classes other than the
ground truth's own, generators, ...) compare equal to nothing.
"""

from __future__ import annotations

import hmac
import json
import logging
import marshal
import secrets
import time
from concurrent.futures import CancelledError
from typing import Any, Callable, NamedTuple

from sandbox import RunResult, Sandbox, SandboxLimits

from verifier.scoring.checker_jail import CHECK_PENDING_BYTES, Case, CheckerRecords, checker_run
from verifier.scoring.checkers import EXACT, FLOAT_PREFIX, ProgramChecker, describe
from verifier.scoring.extract import (
    after_think,
    last_code_block,
    lcb_code_block,
    skywork_code_block,
)
from verifier.service.descriptors import fd_shortage, run_jail, unavailable
from verifier.harness import framing
from verifier.data.ground_truth import BadGroundTruth, Spec, parse_ground_truth
from verifier.scoring.harness_files import PYTHON_FLAGS, harness_files
from verifier.items import Limits, Outcome, Status, VerifierError, decode_ground_truth
from verifier.scoring.output_compare import (
    canonical_return,
    compare_return,
    compare_stdout,
    outputs_match,  # noqa: F401 - part of this module's surface (tests, tools)
    stdout_identical,
)
from verifier.scoring.pool import DeadlineExceeded, TaskFailed, WorkerDied
from verifier.scoring.profiles import DEFAULT_MAX_OUTPUT_MB, PROFILE_TABLE, Profile

log = logging.getLogger(__name__)

# Runs fn(*args) within deadline_s seconds (raising DeadlineExceeded, TaskFailed or WorkerDied).
RunBounded = Callable[[Callable[..., Any], tuple, float], Any]

MAX_ITEM_TIMEOUT_S = 60.0
ITEM_SLACK_S = 3.0
MIN_COMPARE_S = 1.0  # the least time a comparison gets, even at the end of an item's time
# A stdin/stdout test whose output and expected output are together at most this long is
# compared on the judge's thread: outputs_match is linear, so this bounds its cost (about
# 0.1 ms), and it saves a worker's round trip per wrong answer (the jail then runs on into
# its next test until the verdict kills it).
INLINE_COMPARE_BYTES = 16 << 10
DEFAULT_PROFILE = PROFILE_TABLE["default"]
MAX_PROFILE_ITEM_S = 300.0  # the longest whole-sample budget a profile's rule gives
MAX_PROGRAM_CHARS = 512 * 1024
MIN_MEMORY_MB = 32
"""The smallest ``limits.memory_mb`` a server should accept (smaller: INVALID_INPUT). Below
about 18 MiB the judge's own harness cannot run: it fails (MemoryError, a .pyc it cannot load:
SANDBOX_ERROR) or the program's process dies before it answers (RUNTIME_ERROR, which reads as
a genuine zero for a correct program). Measured with real nsjail (cgroup v1, the jail's
/usr/bin/python3 3.11.2, the project's 2-core VM): the smallest limit at which a trivial correct
program was CORRECT three times in a row, by bisection over 1-512 MiB, per format under the
default / lcb / skywork profiles: stdin/stdout 13 / 17 / 17, call-based 15 / 18 / 18, asserts
15 / 18 / 16, LeetCode-style 15 / 18 / 15 (all CORRECT at 19, 20, 24 and 32). 32 is the worst
case with room for other interpreters and builds; tests/test_code_score.py checks it."""
GROUND_TRUTH_PARSE_S = 5.0
"""The longest the parse of a ground truth's test code (asserts, LeetCode-style) may take, in a
worker process (``_spec``). A real one takes milliseconds (a 1 MB test_code about 0.1 s); a
hostile one (an f-string of 170,000 fields: 16 s) is INVALID_INPUT after this long."""
CODE_FORMAT_KEYS = ("assert_case", "test_code", "entry_point")
"""The keys that make a ground truth one of the formats with test code (parse_ground_truth)."""


# ---------------------------------------------------------------------------------------------
# The record stream from the harness.


class _Stream:
    """Parses and authenticates the harness's records as they arrive (the record format:
    verifier/harness/framing.py)."""

    def __init__(self, keys: list[bytes], on_record):
        self.keys = keys
        self.buf = bytearray()
        self.on_record = on_record
        self.seq = 0
        self.error = ""

    def feed(self, chunk: bytes) -> bool:
        if self.error:
            return False
        self.buf += chunk
        while True:
            if len(self.buf) < 8:
                return True
            if self.buf[:4] != framing.MAGIC:
                self.error = "malformed record stream"
                return False
            n = int.from_bytes(self.buf[4:8], "big")
            if n > 1 << 20:
                self.error = "record header too large"
                return False
            if len(self.buf) < 8 + n:
                return True
            try:
                head = json.loads(bytes(self.buf[8 : 8 + n]))
            except (ValueError, RecursionError):
                head = None
            sizes = head.get("blobs") if isinstance(head, dict) else None
            if not (type(sizes) is list and all(type(s) is int and s >= 0 for s in sizes)):
                self.error = "malformed record header"
                return False
            total = 8 + n + sum(sizes) + framing.MAC_BYTES
            if len(self.buf) < total:
                return True
            if self.seq >= len(self.keys):
                self.error = "more records than keys"
                return False
            body = bytes(self.buf[: total - framing.MAC_BYTES])
            tag = bytes(self.buf[total - framing.MAC_BYTES : total])
            want = hmac.digest(self.keys[self.seq], body, "sha256")  # OpenSSL's one-shot
            seq_ok = type(head.get("seq")) is int and head["seq"] == self.seq
            if not hmac.compare_digest(tag, want) or not seq_ok:
                self.error = f"record {self.seq} failed authentication"
                return False
            blobs, pos = [], 8 + n
            for s in sizes:
                blobs.append(bytes(self.buf[pos : pos + s]))
                pos += s
            del self.buf[:total]
            self.seq += 1
            if self.on_record(head, blobs) is False:
                return False


_RUN_STATUS = {
    "timeout": Status.TIMEOUT,
    "memory": Status.MEMORY_LIMIT,
    "output_limit": Status.OUTPUT_LIMIT,
    "signal": Status.RUNTIME_ERROR,
    "died": Status.RUNTIME_ERROR,
    "error": Status.RUNTIME_ERROR,
    "load_error": Status.COMPILE_ERROR,
    "failed": Status.INCORRECT,
}


def run_inline(fn: Callable[..., Any], args: tuple, deadline_s: float) -> Any:
    """The default ``run_bounded`` of ``score_code``: call ``fn`` in this thread (tests and
    tools, and the judge's small stdin/stdout comparisons; the scorer passes a worker pool
    that enforces the deadline)."""
    return fn(*args)


class _Judge:
    def __init__(
        self, spec: Spec, stop_on_fail: bool, run_bounded: RunBounded, deadline: float,
        numpy_arrays: bool = False,
    ):
        self.spec = spec
        self.numpy_arrays = numpy_arrays  # the profile's numpy rule for returned arrays
        self.stop_on_fail = stop_on_fail
        self.results: dict[int, tuple[Status, str]] = {}
        self.done = False
        self.special: Outcome | None = None
        self.run_bounded = run_bounded
        self.deadline = deadline  # time.monotonic() at which the item's time is up
        # A fault of the service met while judging a record (the compare pool out of
        # descriptors): raised by ``_score`` after the run, since the sandbox reports what its
        # output hook raised as its own error (which would read as SANDBOX_ERROR).
        self.fault: VerifierError | None = None
        self._expected_bytes: dict[int, bytes] = {}
        # A checker program's tests whose outputs wait for it (verifier/scoring/checker_jail.py): their
        # results here are provisional until ``_check_outputs`` runs after the program's run.
        self.pending: dict[int, bytes] = {}
        self.pending_bytes = 0
        # The harness's own CPU and its reaped children's, at its first and last records
        # (microseconds; informational, for the cost breakdown of docs/verifier.md 3).
        self.cpu_first: tuple[int, int] | None = None
        self.cpu_last: tuple[int, int] | None = None

    def note_cpu(self, head: dict) -> None:
        h, c = head.get("hcpu_us"), head.get("ccpu_us")
        if isinstance(h, int) and isinstance(c, int):
            self.cpu_last = (h, c)
            if self.cpu_first is None:
                self.cpu_first = self.cpu_last

    def costs(self, jail_cpu_s: float) -> dict[str, float]:
        """The jail's CPU split (seconds): nsjail's own (the rest of the jail's rusage), the
        harness's start, its per-test work, and the test processes."""
        if self.cpu_first is None or self.cpu_last is None:
            return {"jail_setup": jail_cpu_s}
        start, h_last, tests = self.cpu_first[0] / 1e6, self.cpu_last[0] / 1e6, self.cpu_last[1] / 1e6
        return {
            "harness_start": start,
            "harness_tests": h_last - start,
            "tests": tests,
            "jail_setup": max(0.0, jail_cpu_s - h_last - tests),
        }

    def first_failure(self) -> tuple[int, Status, str] | None:
        fails = [(i, st, d) for i, (st, d) in self.results.items() if st is not Status.CORRECT]
        return min(fails, key=lambda f: f[0]) if fails else None

    def on_record(self, head: dict, blobs: list[bytes]) -> bool:
        """Judge one authenticated record; False stops the sandbox. A record this judge cannot
        read (a field of the wrong type, a comparison that raises on the program's output) is
        the program's failure (RUNTIME_ERROR): only program data can make the harness's
        records odd, and nothing a program sends may turn its verdict into SANDBOX_ERROR.
        Failures of the verifier's own machinery (the compare pool) still propagate."""
        why = _malformed(head)
        if why:
            return self.program_failed(head, f"the program sent a malformed record ({why})")
        try:
            return self._on_record(head, blobs)
        except VerifierError as e:
            self.fault = e
            raise
        except _VERIFIER_FAILURES:
            raise
        except Exception as e:  # the program's data broke the judging of its record
            return self.program_failed(
                head, f"the program's record is malformed ({type(e).__name__}: {e})"
            )

    def program_failed(self, head: dict, detail: str) -> bool:
        """Fail the program with RUNTIME_ERROR at the record's test (else the first test not
        judged yet); returns False (stop the sandbox)."""
        i = head.get("i")
        if type(i) is not int or not 0 <= i < self.spec.total:
            i = next((k for k in range(self.spec.total) if k not in self.results), None)
        if i is None:
            self.special = Outcome(Status.RUNTIME_ERROR, detail[:500])
        else:
            where = f"test {i + 1}/{self.spec.total}"
            self.results[i] = (Status.RUNTIME_ERROR, f"{where}: {detail}"[:500])
        return False

    def _on_record(self, head: dict, blobs: list[bytes]) -> bool:
        self.note_cpu(head)
        t = head.get("type")
        if t == "done":
            self.done = True
            return True
        if t == "syntax":
            self.special = Outcome(
                Status.SYNTAX_ERROR,
                f"the program does not compile in the sandbox: {head.get('detail', '')}",
            )
            return True
        if t == "setup_error":
            self.special = Outcome(
                Status.INVALID_INPUT, f"ground truth test code failed: {head.get('detail', '')}"
            )
            return False
        if t == "payload_error":  # sent before any program code runs: the verifier's bug
            self.special = Outcome(
                Status.INTERNAL_ERROR,
                f"the judge's payload was refused by its harness: {head.get('detail', '')}",
            )
            return False
        if t == "harness_error":
            self.special = Outcome(
                Status.SANDBOX_ERROR, f"the judge's harness failed: {head.get('detail', '')}"
            )
            return False
        if t != "test":
            return True
        i = head.get("i")
        if not isinstance(i, int) or not 0 <= i < self.spec.total:
            return True
        verdict = self.judge_test(head, blobs)
        prev = self.results.get(i)
        if prev is None or (prev[0] is Status.CORRECT and verdict[0] is not Status.CORRECT):
            self.results[i] = verdict
        if verdict[0] is not Status.CORRECT and self.stop_on_fail:
            return False
        return True

    def judge_test(self, head: dict, blobs: list[bytes]) -> tuple[Status, str]:
        i = head["i"]
        status = head.get("status")
        err = blobs[1] if len(blobs) > 1 else b""
        where = f"test {i + 1}/{self.spec.total}"
        if status != "exited":
            st = _RUN_STATUS.get(status, Status.RUNTIME_ERROR)
            detail = head.get("detail") or {
                "timeout": "time limit exceeded",
                "memory": "memory limit exceeded",
                "output_limit": "output limit exceeded",
            }.get(status, "")
            if status == "signal":
                detail = f"killed by signal {head.get('signal')}"
            if status == "load_error":
                detail = f"the program failed to load: {detail}"
            if not detail and err:
                detail = _last_line(err)
            return st, f"{where}: {detail or status}"
        if self.spec.mode == "check":
            return Status.CORRECT, ""
        if head.get("raised") or head.get("exit") not in (0, None):
            return (
                Status.RUNTIME_ERROR,
                f"{where}: {_last_line(err) or 'exit code %s' % head.get('exit')}",
            )
        out = blobs[0] if blobs else b""
        expected = self.spec.outputs[i]
        run = self.run_bounded
        # The cheap sufficient tests, and small stdin/stdout comparisons, run here; anything
        # else runs under a deadline, off this thread (the program chose this output: millions
        # of numbers, a hash-flooded set, ...).
        rule = self.spec.checker
        if self.spec.mode == "stdio":
            if isinstance(rule, ProgramChecker):
                return self.await_checker(i, out, expected, where)
            # Non-UTF-8 bytes are U+FFFD for the exact rule (LiveCodeBench's decoding), equal
            # to nothing for the others (compare_stdout). No fast path for "float:EPS": an
            # expected nan or inf matches nothing, not even itself.
            if not rule.startswith(FLOAT_PREFIX) and stdout_identical(
                    out.decode("utf-8", errors="replace" if rule == EXACT else "surrogateescape"),
                    expected):
                return Status.CORRECT, ""
            task: tuple = (compare_stdout, (out, expected, rule))
            if len(out) + len(expected) <= INLINE_COMPARE_BYTES:
                run = run_inline
        else:
            if i not in self._expected_bytes:
                self._expected_bytes[i] = canonical_return(expected)
            if rule == EXACT and out == self._expected_bytes[i]:
                return Status.CORRECT, ""
            task = (compare_return,
                    (out, expected, self.spec.taco_outputs, self.numpy_arrays, rule))
        budget = max(self.deadline - time.monotonic(), MIN_COMPARE_S)
        try:
            ok, message = run(task[0], task[1], budget)
        except DeadlineExceeded:
            return (
                Status.TIMEOUT,
                f"{where}: comparing the program's output took longer than {budget:.3g} s",
            )
        except _VERIFIER_FAILURES:
            raise
        except Exception as e:  # the comparison raised on data the program chose (in a
            # worker: TaskFailed naming the exception; inline: the exception itself)
            if isinstance(e, MemoryError) or getattr(e, "kind", None) == "MemoryError":
                return Status.MEMORY_LIMIT, f"{where}: the program's output is too big to compare"
            what = str(e) if isinstance(e, TaskFailed) else f"{type(e).__name__}: {e}"
            return Status.RUNTIME_ERROR, f"{where}: the program's output is malformed ({what})"
        return (Status.CORRECT, "") if ok else (Status.INCORRECT, f"{where}: {message}")

    def await_checker(self, i: int, out: bytes, expected: str, where: str
                      ) -> tuple[Status, str]:
        """A test of a checker program: CORRECT at once when the output is the expected one
        (equal after stripping: the expected answer is right by definition), else provisionally
        CORRECT, its output kept for the checker's jail after the program's run. Kept outputs
        are bounded (CHECK_PENDING_BYTES): the judge holds them, and the program chose them."""
        try:
            if stdout_identical(out.decode("utf-8"), expected):
                return Status.CORRECT, ""
        except UnicodeDecodeError:
            pass  # not the expected text: the checker reads the bytes as they are
        if self.pending_bytes + len(out) > CHECK_PENDING_BYTES:
            return Status.OUTPUT_LIMIT, (f"{where}: the outputs waiting for the checker exceed "
                                         f"{CHECK_PENDING_BYTES >> 20} MiB in all")
        self.pending[i] = out
        self.pending_bytes += len(out)
        return Status.CORRECT, ""


# Failures of the verifier's own machinery while judging a record: not the program's.
_VERIFIER_FAILURES = (WorkerDied, VerifierError, CancelledError)
_OPTIONAL_INT = (int, type(None))
# The header fields the judge reads and the exact types each may have (the harness's Reporter,
# verifier/harness/framing.py, writes them so; bool is not an int here).
_HEAD_TYPES: dict[str, tuple[type, ...]] = {
    "type": (str,),
    "i": (int,),
    "status": (str,),
    "detail": (str,),
    "signal": _OPTIONAL_INT,
    "exit": _OPTIONAL_INT,
    "raised": (bool,),
    "hcpu_us": (int,),
    "ccpu_us": (int,),
}
_HEAD_REQUIRED = {"test": ("i", "status")}


def _malformed(head: dict) -> str:
    """Why the record header cannot be judged ("" when it can): a field the judge reads that
    is missing or not of its type."""
    if type(head.get("type")) is not str:
        return "its type is not a string"
    for name in _HEAD_REQUIRED.get(head["type"], ()):
        if name not in head:
            return f"no {name!r}"
    for name, types in _HEAD_TYPES.items():
        if name in head and type(head[name]) not in types:
            return f"{name!r} is a {type(head[name]).__name__}"
    return ""


def _last_line(err: bytes) -> str:
    lines = [ln for ln in err.decode("utf-8", errors="replace").strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else ""


# ---------------------------------------------------------------------------------------------


def item_timeout(
    limits: Limits, n_tests: int, tt: float | None = None, budget: str = "default"
) -> float:
    """The whole item's deadline: ``limits.timeout_s``, else by the profile's sample budget:
    "default" min(n x test limit + slack, 60 s); "lcb" (test limit + 1) x n + 5 s
    (LiveCodeBench's ``check_correctness``), capped at the fixed MAX_PROFILE_ITEM_S (300 s:
    Skywork's cap, and the default of the server's ``max_timeout_s``, which bounds only an
    item's own ``timeout_s`` and does not change this cap)."""
    if limits.timeout_s is not None:
        return float(limits.timeout_s)
    tt = tt or limits.test_timeout_s or DEFAULT_PROFILE.test_timeout_s
    if budget == "lcb":
        return min((tt + 1) * n_tests + 5, MAX_PROFILE_ITEM_S)
    return min(n_tests * tt + ITEM_SLACK_S, MAX_ITEM_TIMEOUT_S)


def extract_program(response: str, profile: Profile) -> tuple[str | None, str]:
    """The program in ``response`` by the profile's extraction rule, or (None, why not)."""
    if profile.code_extraction == "lcb":
        program = lcb_code_block(response)
        return program, "no two lines holding a code fence"
    if profile.code_extraction == "skywork":
        return skywork_code_block(response), "no ```python block after the first </think>"
    answer = after_think(response)
    if answer is None:
        return None, "the think block was never closed"
    return last_code_block(answer), "no python code block after the think block"


def _spec(ground_truth: Any, run_bounded: RunBounded, int_digits: int | None = None
          ) -> Spec | Outcome:
    """The ground truth as a Spec, or INVALID_INPUT saying what is wrong with it; integers of
    call-based tests may have ``int_digits`` digits (the profile's ``int_max_str_digits``).

    The formats that carry test code (asserts, LeetCode-style: CODE_FORMAT_KEYS) are parsed
    with ``ast``, whose cost the row's author controls (CPython parses an f-string of n fields
    in O(n^2): 80,000 fields take 4 s), so they are parsed through ``run_bounded``: in a worker
    process the scorer kills at GROUND_TRUTH_PARSE_S, never on this thread. The data-only
    formats (stdin/stdout, call-based) are parsed here: JSON and type checks, linear in their
    size, and no worker round trip for the common case."""
    gt = decode_ground_truth(ground_truth)
    try:
        if isinstance(gt, dict) and any(k in gt for k in CODE_FORMAT_KEYS):
            return run_bounded(parse_ground_truth, (gt,), GROUND_TRUTH_PARSE_S)
        return parse_ground_truth(gt, int_digits)
    except BadGroundTruth as e:
        return Outcome(Status.INVALID_INPUT, str(e))
    except RecursionError:
        return Outcome(Status.INVALID_INPUT, "ground truth nested too deeply")
    except DeadlineExceeded:
        return Outcome(
            Status.INVALID_INPUT,
            f"the ground truth's test code took longer than {GROUND_TRUTH_PARSE_S:g} s to parse",
        )
    except TaskFailed as e:  # raised in the worker: its class arrives by name
        if e.kind == "BadGroundTruth":
            return Outcome(Status.INVALID_INPUT, str(e).removeprefix("BadGroundTruth: "))
        if e.kind == "RecursionError":
            return Outcome(Status.INVALID_INPUT, "ground truth nested too deeply")
        if e.kind == "MemoryError":
            return Outcome(Status.INVALID_INPUT, "the ground truth's test code is too big to parse")
        raise


def score_code(
    response: str,
    ground_truth: Any,
    limits: Limits,
    sandbox: Sandbox,
    run_bounded: RunBounded = run_inline,
    profile: Profile = DEFAULT_PROFILE,
    costs: dict[str, float] | None = None,
) -> Outcome:
    """Score one code item under ``profile``'s rules. See the module docstring.
    ``run_bounded(fn, args, deadline_s)`` runs the comparison of a program's output with the
    expected one (the scorer passes its worker pool: a deadline, and off the server's
    threads). ``costs``, when given, receives the jail's measured CPU split (seconds; the
    stages of verifier/service/metrics.py STAGES)."""
    try:
        spec = _spec(ground_truth, run_bounded, profile.int_max_str_digits)
        if isinstance(spec, Outcome):
            return spec
        note = ""
        if spec.checker != EXACT and not profile.checkers:
            # lcb and skywork reproduce their reference judges, which compare exactly.
            note = (f" (the item's checker, {describe(spec.checker)}, is not used: the "
                    f"{profile.name!r} profile judges by its reference judge's exact rule)")
            spec.checker = EXACT
        outcome = _score(response, spec, limits or Limits(), sandbox, run_bounded, profile,
                         {} if costs is None else costs)
        if note:
            outcome.detail = (outcome.detail + note)[:1000]
        return outcome
    except VerifierError:
        raise  # the service's fault (out of descriptors): the call's error, never a verdict
    except Exception as e:  # a bug here must not crash the batch; it is not the program's fault
        # nor the sandbox's: INTERNAL_ERROR, which the proto reserves for the verifier's own
        # failures (trainers treat it as a missing result, never a genuine 0). A descriptor
        # shortage is the service's fault: the call's UNAVAILABLE.
        if fd_shortage(e):
            raise unavailable("judging a code item", e) from e
        log.exception("code judge failed")
        return Outcome(
            Status.INTERNAL_ERROR, f"internal error while judging: {type(e).__name__}: {e}"
        )


def _score(
    response: str,
    spec: Spec,
    limits: Limits,
    sandbox: Sandbox,
    run_bounded: RunBounded,
    profile: Profile,
    costs: dict[str, float],
) -> Outcome:
    """One sample judged against its parsed ground truth: its program checked, the harness run
    in one jail (then a checker program's, if any, in one more), the verdict made of the
    records."""
    program = _program(response, spec.total, profile)
    if isinstance(program, Outcome):
        return program
    plan = _plan(spec, program, limits, sandbox, profile)
    if isinstance(plan, Outcome):
        return plan
    sent = _harness_stdin(plan.cfg, spec.total)
    if isinstance(sent, Outcome):
        return sent
    stdin, keys = sent
    judge = _Judge(spec, plan.stop_on_fail, run_bounded, time.monotonic() + plan.timeout,
                   profile.numpy)
    stream = _Stream(keys, judge.on_record)
    run = _run_harness(sandbox, stdin, _jail_limits(plan, spec.total), spec.total, stream)
    if judge.fault is not None:
        raise judge.fault
    if isinstance(run, Outcome):
        return run
    costs.update(judge.costs(run.cpu_s))
    if judge.pending and not stream.error and judge.special is None and run.status != "error":
        checked = _check_outputs(sandbox, spec, judge, plan, costs)
        if checked is not None:
            return checked
    return _verdict(spec, judge, stream, run, plan.timeout)


def _check_outputs(sandbox: Sandbox, spec: Spec, judge: _Judge, plan: _Plan,
                   costs: dict[str, float]) -> Outcome | None:
    """Run the checker program on the outputs that wait for it (one jail for the sample, after
    the program's run), writing its verdicts into ``judge.results``; or the item's Outcome
    when the checker is broken (INVALID_INPUT) or its jail failed (SANDBOX_ERROR). With early
    stop, only the tests before the program's first failure are checked."""
    checker = spec.checker
    if not isinstance(checker, ProgramChecker):  # only a checker program's tests wait
        raise TypeError(f"no checker program to run: {checker!r}")
    fail = judge.first_failure() if plan.stop_on_fail else None
    cases = [Case(i, spec.inputs[i], out, spec.outputs[i])
             for i, out in sorted(judge.pending.items()) if fail is None or i < fail[0]]
    if not cases:
        return None
    # Under the program's test time limit and memory limit: the same policy, a jail of its
    # own, started only now (the program's jail is gone).
    cfg, sb_limits = checker_run(checker, cases, test_timeout=float(plan.cfg["test_timeout"]),
                                 memory_mb=plan.memory_mb, stop_on_fail=plan.stop_on_fail,
                                 oom_is_memory=plan.cfg["oom_is_memory"])
    sent = _harness_stdin(cfg, len(cases))
    if isinstance(sent, Outcome):  # marshal refused bytes and str: the verifier's bug
        return Outcome(Status.INTERNAL_ERROR, f"the checker's payload: {sent.detail}", 0,
                       spec.total)
    stdin, keys = sent
    records = CheckerRecords()
    stream = _Stream(keys, records.on_record)
    run = _run_harness(sandbox, stdin, sb_limits, spec.total, stream, "the checker's jail")
    if isinstance(run, Outcome):
        return run
    costs["checker"] = costs.get("checker", 0.0) + run.cpu_s
    if stream.error:
        return Outcome(Status.SANDBOX_ERROR, f"the checker's record stream was rejected: "
                       f"{stream.error}", 0, spec.total)
    verdicts = records.verdicts(checker, cases, spec.total, plan.stop_on_fail, run.status)
    if isinstance(verdicts, Outcome):
        return Outcome(verdicts.status, verdicts.detail, 0, spec.total)
    judge.results.update(verdicts)
    return None


def _program(response: str, total: int, profile: Profile) -> str | Outcome:
    """The program to judge in ``response``, or the Outcome saying why there is none."""
    if not isinstance(response, str):
        return Outcome(Status.INVALID_INPUT, "'response' must be a string", 0, total)
    program, why_not = extract_program(response, profile)
    if program is None or not program.strip():
        return Outcome(Status.NO_ANSWER, why_not, 0, total)
    if len(program) > MAX_PROGRAM_CHARS:
        return Outcome(
            Status.SYNTAX_ERROR, f"program longer than {MAX_PROGRAM_CHARS} characters", 0, total
        )
    # No compile() here: the harness compiles the program in the jail, under its wall limit
    # (the "syntax" record). Here it would hold the GIL for as long as CPython takes, which a
    # program chooses (tens of thousands of keyword arguments in one call: quadratic).
    return program


class _Plan(NamedTuple):
    """One sample's run: the harness payload and the limits the jail is given."""

    cfg: dict[str, Any]
    timeout: float  # the whole item's
    memory_mb: int
    out_bytes: int  # a test's output cap
    stop_on_fail: bool


def _plan(
    spec: Spec, program: str, limits: Limits, sandbox: Sandbox, profile: Profile
) -> _Plan | Outcome:
    """The run of one sample by the profile's rules and the item's limits, or SANDBOX_ERROR
    when the sandbox lacks what the profile needs."""
    unit_tt = profile.unit_timeout_s if spec.mode == "check" else None
    tt = float(limits.test_timeout_s or unit_tt or profile.test_timeout_s)
    memory_mb = int(limits.memory_mb or profile.memory_mb)
    timeout = item_timeout(limits, spec.total, tt, profile.sample_budget)
    stop_on_fail = not limits.run_all_tests
    # A SIGKILL nobody sent is the memory limit only where the whole jail's memory is bounded.
    oom_is_memory = sandbox.memory_accounting == "jail"
    packages = sandbox.packages_path
    if profile.numpy and not packages:
        return Outcome(
            Status.SANDBOX_ERROR,
            f"the {profile.name!r} profile needs numpy in the sandbox, and sandbox "
            f"{sandbox.name} has none (make setup installs it into .sandbox-packages)",
            0,
            spec.total,
        )
    # A profile with no output cap of its own (lcb, skywork) gets the server's maximum (the Scorer
    # puts it in, verifier.scoring.profiles.output_cap); called directly, the default maximum.
    out_bytes = (profile.output_bytes if profile.output_bytes is not None
                 else DEFAULT_MAX_OUTPUT_MB << 20)
    cfg = harness_payload(spec, program, profile, test_timeout=tt, memory_mb=memory_mb,
                          output_bytes=out_bytes, stop_on_fail=stop_on_fail,
                          oom_is_memory=oom_is_memory, budget_s=max(0.5, timeout - 0.5),
                          packages=packages)
    return _Plan(cfg, timeout, memory_mb, out_bytes, stop_on_fail)


def _harness_stdin(cfg: dict[str, Any], total: int) -> tuple[bytes, list[bytes]] | Outcome:
    """What the harness reads on its stdin (the payload, then the records' keys) and the keys,
    or INVALID_INPUT when the ground truth cannot be sent."""
    try:
        # Judge -> harness is the trusted direction: marshal (cheap to load in the sandbox).
        payload = marshal.dumps(cfg, 4)
    except (ValueError, TypeError, RecursionError) as e:
        return Outcome(
            Status.INVALID_INPUT, f"ground truth cannot be sent to the sandbox: {e}", 0, total
        )
    # A fresh key per record, all sent up front: the harness reads key n off its stdin only
    # when it signs record n, when no process holding program code is left to see it.
    raw = secrets.token_bytes(framing.KEY_BYTES * (3 * total + 16))
    keys = [raw[i : i + framing.KEY_BYTES] for i in range(0, len(raw), framing.KEY_BYTES)]
    return len(payload).to_bytes(8, "big") + payload + b"".join(keys), keys


def _jail_limits(plan: _Plan, total: int) -> SandboxLimits:
    """The limits of a sample's jail: the item's time, the program's memory, room for every
    test's output."""
    return SandboxLimits(
        wall_s=plan.timeout,
        cpu_s=plan.timeout + 1,
        memory_mb=plan.memory_mb,
        output_bytes=total * (plan.out_bytes + framing.ERR_TAIL + 4096) + (1 << 20),
    )


def _run_harness(
    sandbox: Sandbox, stdin: bytes, sb_limits: SandboxLimits, total: int, stream: _Stream,
    what: str = "",
) -> RunResult | Outcome:
    """Run the harness in one jail under ``sb_limits``, its records fed to ``stream`` as they
    arrive, or SANDBOX_ERROR when the sandbox fails (``what``: the jail's name in the message,
    e.g. "the checker's jail"). A jail that cannot start for want of descriptors is
    tried again, then VerifierError("unavailable") (verifier/service/descriptors.py): the replica's
    state, never the item's verdict."""
    try:
        files, entry = harness_files(sandbox)
        argv = [sandbox.python, *PYTHON_FLAGS, entry]
        # A new try only while nothing of the last one reached the judge (a failed start).
        return run_jail(lambda: sandbox.run(argv, stdin=stdin, files=files, limits=sb_limits,
                                            on_stdout=stream.feed),
                        fresh=lambda: stream.seq == 0 and not stream.buf and not stream.error)
    except VerifierError:
        raise
    except Exception as e:
        if fd_shortage(e):
            raise unavailable("starting a jail", e) from e
        return Outcome(
            Status.SANDBOX_ERROR,
            f"sandbox {sandbox.name} failed{' running ' + what if what else ''}: "
            f"{type(e).__name__}: {e}",
            0,
            total,
        )


def harness_payload(
    spec: Spec, program: str, profile: Profile, *, test_timeout: float, memory_mb: int,
    output_bytes: int, stop_on_fail: bool, oom_is_memory: bool, budget_s: float,
    packages: str | None,
) -> dict[str, Any]:
    """The payload of one sample for the harness: the fields ``framing.PAYLOAD_FIELDS``
    declares (their one declaration, shared with the harness), built here only, and checked
    against that declaration (ValueError: a bug of this function; the harness checks again on
    arrival)."""
    kind = spec.units.get("kind") if spec.mode == "check" else None
    # The profile's preamble runs in the program's namespace before the program (and before
    # the evaluator's test code: both see the same names, as in the reference judges).
    preamble = {"asserts": profile.assert_preamble,
                "leetcode": profile.leetcode_preamble}.get(kind, profile.preamble)
    cfg: dict[str, Any] = {
        "mode": spec.mode,
        "source": program,
        "prefix": preamble + spec.prefix,
        "int_digits": profile.int_max_str_digits,
        "exit_ok": profile.stdio_exit_ok,
        "sys_path": packages if profile.numpy else None,
        "test_timeout": float(test_timeout),
        "memory_mb": memory_mb,
        "output_bytes": output_bytes,
        "lcb_rules": "" if profile.harness == "default" else profile.harness,
        "stop_on_fail": stop_on_fail,
        "oom_is_memory": oom_is_memory,
        "budget_s": float(budget_s),
        "n_units": spec.total,
    }
    if spec.mode == "check":
        cfg["units"] = spec.units
    else:
        cfg["inputs"] = spec.inputs
        if spec.mode == "call":
            cfg["fn_name"] = spec.fn_name
    problem = framing.payload_problem(cfg)
    if problem:
        raise ValueError(f"the harness payload does not match framing.PAYLOAD_FIELDS: {problem}")
    return cfg


def _verdict(spec: Spec, judge: _Judge, stream: _Stream, run: RunResult, timeout: float) -> Outcome:
    total = spec.total
    passed_ids = [i for i, (st, _) in judge.results.items() if st is Status.CORRECT]
    fail = judge.first_failure()
    if judge.stop_on_fail and fail is not None:
        passed = sum(1 for i in passed_ids if i < fail[0])
    else:
        passed = len(passed_ids)
    if stream.error:
        return Outcome(Status.SANDBOX_ERROR, f"verdict stream rejected: {stream.error}", 0, total)
    if judge.special is not None:
        o = judge.special
        return Outcome(o.status, o.detail, 0, total)
    if fail is not None:
        return Outcome(fail[1], fail[2], passed, total)
    if run.status == "error":
        return Outcome(Status.SANDBOX_ERROR, f"sandbox {run.detail}".strip(), passed, total)
    if judge.done and len(passed_ids) == total:
        return Outcome(Status.CORRECT, f"passed {total}/{total} tests", total, total)
    # The stream ended early without a failed test: the sandbox's own limits stopped it.
    if run.status == "timeout":
        return Outcome(
            Status.TIMEOUT,
            f"item time limit ({timeout:g} s) exceeded after {len(passed_ids)} tests",
            passed,
            total,
        )
    if run.status == "memory":
        return Outcome(Status.MEMORY_LIMIT, "memory limit exceeded", passed, total)
    if run.status == "output_limit":
        return Outcome(Status.OUTPUT_LIMIT, "output limit exceeded", passed, total)
    err = run.stderr.decode("utf-8", errors="replace")
    if "Traceback" in err:  # only the harness and the evaluator write the sandbox's stderr
        return Outcome(
            Status.SANDBOX_ERROR,
            f"judge harness failed: {err.strip().splitlines()[-1][:300]}",
            passed,
            total,
        )
    if judge.done:
        missing = [i for i in range(total) if i not in judge.results]
        return Outcome(
            Status.RUNTIME_ERROR, f"tests {missing[:5]} produced no result", passed, total
        )
    return Outcome(
        Status.RUNTIME_ERROR,
        f"the judge harness ended without a verdict ({run.status}, exit {run.exit_code}, "
        f"signal {run.signal})",
        passed,
        total,
    )
