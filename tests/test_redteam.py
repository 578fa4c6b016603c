"""The red-team findings, one named test each (real nsjail; the server-level ones against a real
``verifier serve`` process). Each finding's test is written from its description: the attack
must not earn CORRECT, must end in a verdict of the program (never SANDBOX_ERROR, INVALID_INPUT
or INTERNAL_ERROR, which would stop a training step), in bounded time, without leaving a process
behind (the ``after_attack`` fixture also checks that the next normal item is judged CORRECT);
the server-level ones also check that the server stays healthy and that a neighbour's item is
judged right meanwhile."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox import SandboxLimits
from tests.conftest import ServerProcess
from tests.conftest_sandbox import (  # noqa: F401
    CHECKED,
    SUM_GT,
    SUM_OK,
    after_attack,
    assert_no_leftovers,
    checker_in_use,
    forkserver_sandbox,
    nsjail_sandbox,
    respond,
    sandbox_pids,
)
from verifier.scoring import code_score
from verifier.client import VerifierClient
from verifier.scoring.code_score import score_code
from verifier.items import PROFILES, Item, Limits, Status
from verifier.scoring.math_score import quick_verdict
from verifier.scoring.pool import DeadlinePool
from verifier.scoring.profiles import get_profile
from verifier.scoring.scorer import Scorer, ScoringConfig

ROOT = Path(__file__).resolve().parents[1]
UNJUDGED = (Status.SANDBOX_ERROR, Status.INVALID_INPUT, Status.INTERNAL_ERROR)
EMPTY = {"inputs": ["5\n"], "outputs": [""]}


PROFILE = get_profile("default")


def pytest_generate_tests(metafunc):
    """Every finding judged in a sandbox (the tests that use ``after_attack``) runs under every
    judging profile: their preambles, recursion limits, SystemExit rules, numpy and time
    budgets must not reopen a hole. The server-level findings run once."""
    if "after_attack" in metafunc.fixturenames:
        # CHECKED: the default profile with checkers in use (conftest_sandbox.checker_in_use).
        metafunc.parametrize("profile_name", [*PROFILES, CHECKED])


@pytest.fixture()
def profile_name():
    return "default"


CHECKING = False  # the finding's ground truths carry a checker (CHECKED)


@pytest.fixture(autouse=True)
def _judging_profile(profile_name):
    global PROFILE, CHECKING
    CHECKING = profile_name == CHECKED
    PROFILE = get_profile("default" if CHECKING else profile_name)
    yield PROFILE
    PROFILE, CHECKING = get_profile("default"), False


def judged(sb, code, gt, max_s=60, **limits):
    """Score ``code`` under the test's profile; the verdict must be the program's own and not
    CORRECT, within ``max_s`` (generous: a bound for a loaded machine, far below the findings'
    30 s to 12 minutes)."""
    limits.setdefault("test_timeout_s", 3)
    gt = checker_in_use(gt) if CHECKING else gt
    t = time.monotonic()
    o = score_code(respond(code), gt, Limits(**limits), sb, profile=PROFILE)
    assert o.status is not Status.CORRECT, o
    assert o.status not in UNJUDGED, o
    assert time.monotonic() - t < max_s, (o, time.monotonic() - t)
    return o


def call_gt(n=1, out="[1]"):
    return {"inputs": [str(i) for i in range(n)], "outputs": [out] * n, "fn_name": "f"}


# A helper the attacks below share: write one message straight onto the program process's
# answer pipe (fd 4 of the call-based program process), bypassing the harness's encoder.
WRITE_ANSWER = (
    "import os\n"
    "def _send(data):\n"
    "    view = memoryview(data)\n"
    "    while view:\n"
    "        view = view[os.write(4, view):]\n"
)


# -- 1. no secret in the program's reach -----------------------------------------------------

# Walks every frame up from its own and every object the garbage collector knows, looking for
# the harness's test code; parses the asserts it finds and answers from a lookup table.
HARVEST = """
import ast, gc, sys
table = {}
def _harvest():
    found = []
    f = sys._getframe()
    while f is not None:
        for v in list(f.f_locals.values()) + list(f.f_globals.values()):
            if isinstance(v, dict):
                found.append(v)
        f = f.f_back
    found += [o for o in gc.get_objects() if isinstance(o, dict)]
    texts = []
    for d in found:
        for key in ("units", "cases", "test_code", "call"):
            v = d.get(key) if isinstance(d, dict) else None
            if isinstance(v, str):
                texts.append(v)
            elif isinstance(v, list):
                texts += [t for t in v if isinstance(t, str)]
            elif isinstance(v, dict):
                texts += [t for t in v.values() if isinstance(t, str)]
                texts += [t for t in v.get("cases", []) if isinstance(t, str)]
    texts += [o for o in gc.get_objects() if isinstance(o, str) and "==" in o]
    for t in texts:
        try:
            tree = ast.parse(t)
        except Exception:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):
                try:
                    args = tuple(ast.literal_eval(a) for a in node.left.args)
                    kw = tuple(sorted((k.arg, ast.literal_eval(k.value)) for k in node.left.keywords))
                    table[(args, kw)] = ast.literal_eval(node.comparators[0])
                except Exception:
                    pass
_harvest()
def secret(*a, **k):
    return table.get((a, tuple(sorted(k.items()))), -1)
class Solution:
    def secret(self, *a, **k):
        return table.get((a, tuple(sorted(k.items()))), -1)
"""


SECRET_ASSERTS = {
    "assert_case": [
        "assert secret(3) == 91872364",
        "assert secret(4) == 1234567",
        "assert secret(5) == 7654321",
        "assert secret(6) == 42424242",
    ]
}
SECRET_LEETCODE = {
    "import_prefix": "",
    "test_code": (
        "def check(candidate):\n"
        "    assert candidate(x=3) == 918723\n"
        "    assert candidate(x=4) == 111\n"
        "    assert candidate(x=5) == 222\n"
    ),
    "entry_point": "Solution().secret",
}


def test_assert_tests_hold_no_expected_value_in_reach(after_attack):
    o = judged(after_attack, HARVEST, SECRET_ASSERTS, run_all_tests=True)
    assert o.status is Status.INCORRECT and o.passed == 0


def test_leetcode_tests_hold_no_expected_value_in_reach(after_attack):
    o = judged(after_attack, HARVEST, SECRET_LEETCODE, run_all_tests=True)
    assert o.status is Status.INCORRECT and o.passed == 0


def test_program_process_memory_holds_no_test_code(after_attack):
    """Stronger than a lookup of live objects: every string in the program's process (its
    own, the interpreter's, anything left from a fork) is searched for the expected value."""
    code = (
        "import gc, sys\n"
        "def f(x):\n"
        "    hits = [o for o in gc.get_objects() if isinstance(o, (str, bytes)) and '8675309' in str(o)]\n"
        "    for m in list(sys.modules.values()):\n"
        "        for v in list(vars(m).values()):\n"
        "            if isinstance(v, (str, bytes)) and '8675309' in str(v):\n"
        "                hits.append(v)\n"
        "    return 8675309 if hits else -1\n"
    )
    o = judged(after_attack, code, {"assert_case": ["assert f(1) == 8675309"]})
    assert o.status is Status.INCORRECT


# -- 2. and 10.: nothing the program sends is decoded without bounds -------------------------


@pytest.fixture(scope="module")
def verifier_process():
    """A real ``verifier serve`` process with 2 workers (health checks from this process then
    measure the server, not this test's own GIL). Without pre-started jails: from outside its
    process, a jail waiting for the next sample looks like a leftover to ``under_attack``'s
    check (the attacks run in jails that waited in tests/test_code_score_attacks.py, whose
    sandbox is in this process)."""
    proc = ServerProcess(0, "--workers", "2", "--warm-jails", "0")
    yield proc.address
    proc.terminate()


def code_item(item_id, code, gt, **limits):
    return {
        "id": item_id,
        "domain": "code",
        "response": respond(code),
        "ground_truth": gt,
        "limits": limits,
    }


def under_attack(addr, attack_items, probe_s=0.25):
    """Score ``attack_items`` while probing the server's health every ``probe_s`` (each probe
    must answer within 2 s) and scoring a neighbour's normal item. Checks that the neighbour is
    judged CORRECT and that no process of the sandbox's uid is left behind. Returns (results,
    neighbour result, failed probes, probes, seconds the attack took)."""
    baseline = sandbox_pids()
    stop = threading.Event()
    failed, probes = [], [0]
    neighbour: list = []

    def probe():
        channel = grpc.insecure_channel(addr)
        stub = health_pb2_grpc.HealthStub(channel)
        while not stop.is_set():
            t = time.monotonic()
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
                if r.status != health_pb2.HealthCheckResponse.SERVING:
                    failed.append(f"status {r.status}")
            except grpc.RpcError as e:
                failed.append(f"{e.code()} after {time.monotonic() - t:.1f} s")
            probes[0] += 1
            stop.wait(probe_s)
        channel.close()

    def neighbour_item():
        time.sleep(0.5)  # while the attack is being judged
        with VerifierClient(addr) as c:
            neighbour.extend(c.score([code_item("neighbour", SUM_OK, SUM_GT)]))

    threads = [threading.Thread(target=probe), threading.Thread(target=neighbour_item)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    try:
        with VerifierClient(addr) as c:
            results = c.score(attack_items)
    finally:
        elapsed = time.monotonic() - t0
        threads[1].join(timeout=60)
        stop.set()
        threads[0].join(timeout=10)
    assert neighbour and neighbour[0].status is Status.CORRECT, neighbour
    assert_no_leftovers(baseline, timeout=10.0)
    return results, neighbour[0], failed, probes[0], elapsed


P61 = "(2 ** 61 - 1)"


def test_hash_flooded_return_value_cannot_freeze_the_server(verifier_process):
    # Integers that all hash to 0: a set of them costs quadratic time to build. One program
    # writes the set straight onto its answer pipe; another returns a dict of them.
    forged = WRITE_ANSWER + (
        "import json\n"
        "def f(x):\n"
        f"    P = {P61}\n"
        "    data = json.dumps({'v': {'$': 'set', 'v': [j * P for j in range(100000)]}, 'objs': []}).encode()\n"
        "    _send(len(data).to_bytes(4, 'big') + data)\n"
        "    import time; time.sleep(30)\n"
    )
    plain = f"def f(x):\n    P = {P61}\n    return {{j * P: 0 for j in range(12000)}}\n"
    items = [
        code_item("forged", forged, call_gt(), test_timeout_s=10),
        code_item("plain", plain, call_gt(), test_timeout_s=10),
    ]
    results, _, failed, probes, elapsed = under_attack(verifier_process, items)
    by_id = {r.id: r for r in results}
    assert by_id["forged"].status is Status.INCORRECT, by_id["forged"]
    assert by_id["plain"].status in (Status.INCORRECT, Status.TIMEOUT), by_id["plain"]
    assert not failed, f"{len(failed)} of {probes} health checks failed: {failed[:3]}"
    assert elapsed < 40  # each item's own deadline is 13 s; judging adds milliseconds


def test_backtick_flood_response_cannot_freeze_the_server(verifier_process):
    """1,000,000 backticks and no code (the response cap): the block extraction is linear."""
    item = {"id": "ticks", "domain": "code", "response": "`" * 1_000_000, "ground_truth": SUM_GT}
    results, _, failed, probes, elapsed = under_attack(verifier_process, [item])
    assert results[0].status is Status.NO_ANSWER, results[0]
    assert not failed, f"{len(failed)} of {probes} health checks failed: {failed[:3]}"
    assert elapsed < 20  # was 12 minutes of one server thread holding the GIL


def test_huge_numeric_output_is_compared_off_the_server_threads(verifier_process):
    """8 MiB lines of numbers that differ from the expected text only in form (1.0 vs 1): a
    decimal comparison of millions of tokens, in the compare workers, under a deadline."""
    n = 2_000_000
    gt = {"inputs": ["\n", "\n"], "outputs": ["1 " * n, "1 " * n]}
    right = f"import sys\nsys.stdout.write('1.0 ' * {n})"
    wrong = f"import sys\nsys.stdout.write('1.0 ' * {n - 1} + '2.0')"
    items = [
        code_item("right", right, gt, run_all_tests=True, test_timeout_s=10),
        code_item("wrong", wrong, gt, run_all_tests=True, test_timeout_s=10),
    ]
    results, _, failed, probes, elapsed = under_attack(verifier_process, items)
    by_id = {r.id: r for r in results}
    assert by_id["right"].status is Status.CORRECT, by_id["right"]
    assert by_id["wrong"].status is Status.INCORRECT and by_id["wrong"].passed == 0
    assert not failed, f"{len(failed)} of {probes} health checks failed: {failed[:3]}"
    assert elapsed < 60


# -- 3. (the extraction itself, without a server) ---------------------------------------------


def test_code_block_extraction_is_linear():
    from verifier.scoring.extract import last_code_block

    t = time.monotonic()
    for text in ("`" * 1_000_000, "```\n" * 250_000, "```python" * 100_000):
        last_code_block(text)
    assert time.monotonic() - t < 5


# The same class in the math path: the quick verdict runs on the server's thread, so the answer
# extraction and normalisation must be linear too. Each of these 1,000,000-character responses
# held that thread: "\\fbox $" repeated for 3 s (a copy of the rest of the response per box),
# "^" and a run of spaces for hours (quadratic backtracking in the degree-sign pattern: 6.5 s
# at 32,000 spaces).
DEGENERATE_MATH = {
    "fbox": "\\fbox $" * 142_857,
    "degree": "\\boxed{^" + " " * 999_990 + "x}",
    "degree-braces": "\\boxed{" + "^{ " * 333_330 + "x}",
    "spaced-carets": "\\boxed{" + "^ " * 499_990 + "x}",
}


def test_math_answer_extraction_is_linear():
    t = time.monotonic()
    for response in DEGENERATE_MATH.values():
        quick_verdict(response, "5")
    assert time.monotonic() - t < 10


def test_degenerate_math_response_cannot_freeze_the_server(verifier_process):
    items = [
        {"id": k, "domain": "math", "response": v, "ground_truth": "5"}
        for k, v in DEGENERATE_MATH.items()
    ]
    results, _, failed, probes, elapsed = under_attack(verifier_process, items)
    for r in results:
        assert r.status in (Status.NO_ANSWER, Status.INCORRECT), r
    assert not failed, f"{len(failed)} of {probes} health checks failed: {failed[:3]}"
    assert elapsed < 30


# -- 4. a program can only fail as itself ----------------------------------------------------


GARBAGE_ANSWER = WRITE_ANSWER + "def f(x):\n    _send(b'\\x00\\x00\\x00\\x05{{{{{')\n    return 1\n"
OVER_CAP_ANSWER = WRITE_ANSWER + "def f(x):\n    _send(b'\\xff\\xff\\xff\\xff')\n    return 1\n"
DEEP_JSON_ANSWER = WRITE_ANSWER + (
    "def f(x):\n"
    "    body = b'{\"v\": ' + b'[' * 100000 + b']' * 100000 + b', \"objs\": []}'\n"
    "    _send(len(body).to_bytes(4, 'big') + body)\n"
    "    return 1\n"
)
HUGE_INT = "def f(x):\n    return 3 ** 20000\n"
FORGED_PREFIX = WRITE_ANSWER + (
    "import json\n"
    "msg = json.dumps({'fatal': 'import_prefix failed: forged', 'phase': 'prefix'}).encode()\n"
    "_send(len(msg).to_bytes(4, 'big') + msg)\n"
    "import os; os._exit(0)\n"
)
ONE_ASSERT = {"assert_case": ["assert f(1) == 1"]}


def test_garbage_on_the_answer_pipe_is_the_programs_failure(after_attack):
    o = judged(after_attack, GARBAGE_ANSWER, call_gt())
    assert o.status is Status.RUNTIME_ERROR and "malformed" in o.detail
    code = WRITE_ANSWER + "def f(x):\n    _send(b'\\x00\\x00\\x00\\x02[]')\n    return 1\n"
    o = judged(after_attack, code, call_gt())  # valid JSON, not a message
    assert o.status is Status.RUNTIME_ERROR and "malformed" in o.detail


def test_over_cap_length_prefix_is_the_programs_failure(after_attack):
    o = judged(after_attack, OVER_CAP_ANSWER, call_gt())
    assert o.status is Status.RUNTIME_ERROR and "malformed" in o.detail
    # The same onto the evaluator's channel in assert mode.
    o = judged(after_attack, OVER_CAP_ANSWER, ONE_ASSERT)
    assert o.status is Status.RUNTIME_ERROR and "malformed" in o.detail


def test_deeply_nested_json_answer_is_the_programs_failure(after_attack):
    o = judged(after_attack, DEEP_JSON_ANSWER, call_gt())
    assert o.status is Status.RUNTIME_ERROR and "malformed" in o.detail


def test_huge_integer_return_is_a_wrong_answer(after_attack):
    """3 ** 20000 has 9,543 digits: past Python's 4,300-digit limit for printing it."""
    o = judged(after_attack, HUGE_INT, call_gt())
    assert o.status is Status.INCORRECT and "integer of about 9543 digits" in o.detail


FORGED_PREFIX_LEETCODE = {
    "import_prefix": "import math",
    "test_code": "def check(candidate):\n    assert candidate(1) == 1\n",
    "entry_point": "Solution().f",
}


def test_forged_prefix_failure_is_the_programs_failure(after_attack):
    o = judged(after_attack, FORGED_PREFIX, ONE_ASSERT)
    assert o.status is Status.COMPILE_ERROR, o
    o = judged(after_attack, FORGED_PREFIX, FORGED_PREFIX_LEETCODE)
    assert o.status is Status.COMPILE_ERROR, o


def test_a_real_prefix_failure_is_still_invalid_input(after_attack):
    gt = {
        "import_prefix": "import no_such_module_anywhere",
        "test_code": "def check(candidate):\n    assert candidate(1) == 1\n",
        "entry_point": "Solution().f",
    }
    o = score_code(respond("class Solution:\n    def f(self, x):\n        return x"), gt, Limits(),
                   after_attack, profile=PROFILE)
    assert o.status is Status.INVALID_INPUT and "no_such_module_anywhere" in o.detail


def test_test_code_calling_a_failing_program_is_the_programs_failure(after_attack):
    """Test code whose module level calls the program: the program's exception there is its
    failure, not a broken ground truth."""
    gt = {
        "import_prefix": "",
        "test_code": "table = Solution().build()\ndef check(candidate):\n    assert candidate(1) == 1\n",
        "entry_point": "Solution().f",
    }
    code = "class Solution:\n    def build(self):\n        raise ValueError('no')\n    def f(self, x):\n        return x\n"
    o = judged(after_attack, code, gt)
    assert o.status is Status.RUNTIME_ERROR and "ValueError" in o.detail


THREE_ASSERTS = {"assert_case": ["assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3"]}
HARNESS_DELETE = (
    "import os\n"
    "for name in os.listdir('/tmp'):\n"
    "    p = os.path.join('/tmp', name)\n"
    "    for op in (os.remove, lambda p: os.rename(p, p + '.x'), lambda p: open(p, 'wb').write(b'x')):\n"
    "        try:\n"
    "            op(p)\n"
    "        except OSError:\n"
    "            pass\n"
    "def f(x):\n"
    "    os._exit(3)\n"
)


def test_deleting_the_harness_cannot_break_the_next_program_process(after_attack):
    """Assert tests start a fresh interpreter for each program process, from the harness file
    in the scratch directory: the program cannot remove or replace it."""
    o = judged(after_attack, HARNESS_DELETE, THREE_ASSERTS, run_all_tests=True)
    assert o.status is Status.RUNTIME_ERROR and (o.passed, o.total) == (0, 3)


# -- 5. and 6.: the kernel's side doors ------------------------------------------------------


def jail(sb, code: str) -> str:
    """Run a plain program in a jail of the same policy; its stdout."""
    r = sb.run([sb.python, "-I", "-S", "-c", code], limits=SandboxLimits(wall_s=20, cpu_s=10))
    assert r.status == "ok" and r.exit_code == 0, r
    return r.stdout.decode()


def test_vsock_and_unneeded_socket_families_are_denied(nsjail_sandbox):
    code = (
        "import socket\n"
        "for fam in (40, 16, 17, 38, 1, 2, 10):\n"  # VSOCK NETLINK PACKET ALG UNIX INET INET6
        "    try:\n"
        "        socket.socket(fam, socket.SOCK_DGRAM if fam != 17 else socket.SOCK_RAW).close()\n"
        "        print(fam, 0)\n"
        "    except OSError as e:\n"
        "        print(fam, e.errno)\n"
        "a, b = socket.socketpair(); print('pair', 0)\n"
    )
    got = dict(line.split() for line in jail(nsjail_sandbox, code).split("\n") if line)
    assert got == {"40": "97", "16": "97", "17": "97", "38": "97", "1": "0", "2": "0", "10": "0", "pair": "0"}


def test_inotify_is_denied_and_the_hosts_quota_untouched(nsjail_sandbox):
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fds = [libc.inotify_init1(0) for _ in range(200)]\n"
        "print(sum(fd >= 0 for fd in fds), ctypes.get_errno())\n"
        "print(libc.fanotify_init(0, 0), ctypes.get_errno())\n"  # FAN_CLASS_NOTIF: unprivileged since 5.13
        "import time; time.sleep(0.5)\n"
    )
    stop = threading.Event()
    host_errors = []

    def host_inotify():  # root on the host keeps creating inotify instances meanwhile
        libc = ctypes.CDLL(None, use_errno=True)
        while not stop.is_set():
            fd = libc.inotify_init1(0)
            if fd < 0:
                host_errors.append(ctypes.get_errno())
            else:
                os.close(fd)
            time.sleep(0.01)

    t = threading.Thread(target=host_inotify)
    t.start()
    try:
        out = jail(nsjail_sandbox, code).split()
    finally:
        stop.set()
        t.join()
    assert out == ["0", "38", "-1", "38"]  # ENOSYS, not one instance; fanotify alike
    assert not host_errors


def test_message_queue_memlock_and_signal_limits_are_in_force(nsjail_sandbox):
    code = (
        "import resource as r\n"
        "print(r.getrlimit(r.RLIMIT_MSGQUEUE)[1], r.getrlimit(r.RLIMIT_MEMLOCK)[1])\n"
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.mq_open.restype = ctypes.c_int\n"
        "ok = sum(libc.mq_open(f'/q{i}'.encode(), os.O_CREAT | os.O_RDWR, 0o600, None) >= 0 for i in range(9))\n"
        "print(ok, libc.mlockall(1))\n"
    )
    assert jail(nsjail_sandbox, code).split() == ["0", "0", "0", "-1"]
    # Pending signals per jail: set by the harness for judged programs.
    probe = "import resource as r\nprint(r.getrlimit(r.RLIMIT_SIGPENDING)[1])"
    o = score_code(respond(probe), {"inputs": [""], "outputs": ["256"]}, Limits(), nsjail_sandbox)
    assert o.status is Status.CORRECT, o


# Four processes: three hold 29 pipes each grown to 1 MiB (87 x 256 pages: past the default
# fs.pipe-user-pages-soft of 16,384), one holds descriptors in flight on a unix socket (past
# its RLIMIT_NOFILE of 64, the kernel's bound on in-flight descriptors per user).
QUOTA_HOG = """
import os, socket, fcntl, time
for k in range(4):
    if os.fork() == 0:
        break
else:
    time.sleep(12)
    os._exit(0)
held = []
if k < 3:
    for i in range(29):
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ; EPERM once the user is over its limit
        except OSError:
            pass
        held += [r, w]
    r, w = os.pipe()
    got = fcntl.fcntl(w, 1032)  # a fresh pipe: 8192 once this jail's user is over its limit
else:
    a, b = socket.socketpair()
    got = "sent"
    try:
        for i in range(40):  # until the kernel refuses: more than RLIMIT_NOFILE in flight
            r, w = os.pipe()
            socket.send_fds(a, [b"x"], [r, w])
            os.close(r); os.close(w)
    except OSError as e:
        got = f"errno{e.errno}"
print("ready", got, flush=True)
time.sleep(10)
"""
QUOTA_VICTIM = """
import os, socket, fcntl
r, w = os.pipe()
print(fcntl.fcntl(w, 1032))  # F_GETPIPE_SZ: 65536 unless the user is over its soft limit
a, b = socket.socketpair()
try:
    socket.send_fds(a, [b"x"], [r])
    print("sent")
except OSError as e:
    print("errno", e.errno)  # ETOOMANYREFS: the user has too many descriptors in flight
"""


def test_pipe_and_fd_passing_quotas_are_not_shared_between_jails(nsjail_sandbox):
    """Pipe buffer pages and descriptors in flight are counted per outside uid (the kernel's
    user_struct); each concurrent jail has its own (sandbox/uidpool.py), so a jail that
    exhausts both (and sees it: its own fresh pipe is 8 KiB, its own send refused) leaves a
    neighbour's 64 KiB pipes and descriptor passing alone."""
    seen = bytearray()
    ready = threading.Event()

    def on_stdout(chunk: bytes):
        seen.extend(chunk)
        if seen.count(b"ready") == 4:
            ready.set()
        return True

    hog = threading.Thread(target=lambda: nsjail_sandbox.run(
        [nsjail_sandbox.python, "-I", "-S", "-c", QUOTA_HOG],
        limits=SandboxLimits(wall_s=30, cpu_s=10), on_stdout=on_stdout))
    hog.start()
    try:
        assert ready.wait(20), bytes(seen)
        got = jail(nsjail_sandbox, QUOTA_VICTIM).split("\n")
    finally:
        hog.join()
    assert got[:2] == ["65536", "sent"], got
    # Not vacuous: the hog did exhaust its own uid's quotas (the last of its pipe holders to
    # finish saw 8 KiB pipes; the descriptor sender was refused with ETOOMANYREFS).
    lines = [ln.split() for ln in bytes(seen).decode().splitlines() if ln.startswith("ready")]
    assert ["ready", "8192"] in lines and ["ready", "errno109"] in lines, lines


INODE_FLOOD = "i = 0\nwhile True:\n    open(f'/tmp/e{i}', 'w').close()\n    i += 1\n"
ZERO = {"inputs": ["\n"], "outputs": ["0\n"]}


def test_many_empty_files_hit_the_scratch_inode_cap(after_attack):
    o = judged(after_attack, INODE_FLOOD, ZERO, test_timeout_s=10)
    assert o.status is Status.RUNTIME_ERROR and "No space left" in o.detail


# -- 7. and 8.: raising always fails ---------------------------------------------------------


SNEAKY_STR = (
    "import os\n"
    "class Sneaky(Exception):\n"
    "    def __str__(self):\n"
    "        os._exit(0)\n"
    "    __repr__ = __str__\n"
    "raise Sneaky()\n"
)


def test_exception_whose_str_exits_zero_still_fails(after_attack):
    o = judged(after_attack, SNEAKY_STR, EMPTY)
    assert o.status is Status.RUNTIME_ERROR


PATCHED_EXIT = (
    "import os, sys\n"
    "real_exit = os._exit\n"
    "os.write = lambda fd, data: len(data)\n"
    "os._exit = lambda code: real_exit(0)\n"
    "sys.exit = lambda *a: real_exit(0)\n"
    "main = sys.modules['__main__']\n"  # the harness's own globals
    "for name in ('BaseException', 'SystemExit', 'MemoryError', 'type', 'int', 'finish_like_interpreter'):\n"
    "    setattr(main, name, lambda *a, **k: real_exit(0))\n"
    "raise ValueError('boom')\n"
)


def test_patched_os_write_and_exit_cannot_hide_an_exception(after_attack):
    o = judged(after_attack, PATCHED_EXIT, EMPTY)
    assert o.status is Status.RUNTIME_ERROR


def trace_attack(install: str) -> str:
    """A program that installs a hook (``install``) meant to rewrite the harness's locals or
    exit 0 when its exception is raised, then raises."""
    return (
        "import os, sys\n"
        "def hook(frame, event, arg):\n"
        "    if event == 'exception':\n"
        "        os._exit(0)\n"
        "    frame.f_locals['marker'] = b''\n"
        "    return hook\n"
        "try:\n"
        f"    {install}\n"
        "except RuntimeError as e:\n"
        "    print('refused', e, file=sys.stderr)\n"
        "raise ValueError('boom')\n"
    )


def test_trace_and_profile_hooks_are_refused(after_attack):
    for install in (
        "sys.settrace(hook)",
        "sys.setprofile(hook)",
        "sys._getframe().f_back.f_trace = hook; sys.settrace(hook)",
        "import threading; threading.settrace(hook); threading.Thread(target=lambda: 1).start()",
    ):
        o = judged(after_attack, trace_attack(install), EMPTY)
        assert o.status is Status.RUNTIME_ERROR, (install, o)


CTYPES_MEMMOVE = (
    "import os\n"
    "import _ctypes\n"
    "class P(_ctypes._SimpleCData):\n"
    "    _type_ = 'P'\n"
    "class F(_ctypes.CFuncPtr):\n"
    "    _flags_ = _ctypes.FUNCFLAG_CDECL\n"
    "    _restype_ = P\n"
    "    _argtypes_ = (P, P, P)\n"
    "F(_ctypes._memmove_addr)(id(1), id(2), 1)\n"
    "raise ValueError('boom')\n"
)


def test_ctypes_c_module_cannot_write_memory(after_attack):
    """ctypes' C module alone makes a callable from memmove's address (no audit event for the
    call): importing it is refused, as if it were not installed."""
    o = judged(after_attack, CTYPES_MEMMOVE, EMPTY)
    # lcb and skywork: LiveCodeBench counts a program that fails to load as a compile error
    want = Status.COMPILE_ERROR if PROFILE.harness != "default" else Status.RUNTIME_ERROR
    assert o.status is want and "_ctypes is not available" in o.detail


STOP_ITERATION = "def f(x):\n    raise StopIteration\n"
ALL_MAP = {"assert_case": ["assert all(map(f, [1, 2, 3]))"]}


def test_stop_iteration_from_the_tested_function_fails_the_assert(after_attack):
    o = judged(after_attack, STOP_ITERATION, ALL_MAP)
    assert o.status is Status.RUNTIME_ERROR and "StopIteration" in o.detail
    leet = {
        "import_prefix": "",
        "test_code": "def check(candidate):\n    assert all(map(candidate, [1, 2, 3]))\n",
        "entry_point": "Solution().f",
    }
    code = "class Solution:\n    def f(self, x):\n        raise StopIteration\n"
    o = judged(after_attack, code, leet)
    assert o.status is Status.RUNTIME_ERROR


# -- 9. the LeetCode restart loop -------------------------------------------------------------


DIES_BETWEEN = {
    "import_prefix": "",
    "test_code": (
        "def check(candidate):\n"
        "    assert candidate(1) == 1\n"
        "    x = candidate(2)\n"  # outside any assert: prepares the second
        "    assert x == 2\n"
        "    assert candidate(3) == 3\n"
    ),
    "entry_point": "Solution().f",
}
DIES_AT_2 = "import os\nclass Solution:\n    def f(self, x):\n        if x == 2:\n            os._exit(1)\n        return x\n"


def test_leetcode_program_dying_between_asserts_fails_only_the_next_assert(after_attack):
    t = time.monotonic()
    o = judged(after_attack, DIES_AT_2, DIES_BETWEEN, run_all_tests=True, reward_mode="fractional")
    assert o.status is Status.RUNTIME_ERROR and "test 2/3" in o.detail, o
    assert (o.passed, o.total) == (2, 3)
    assert time.monotonic() - t < 10


# -- 11. the small ones ------------------------------------------------------------------------


DEEP_TUPLE = "def f(x):\n    v = 1\n    for _ in range(390):\n        v = (v,)\n    return v\n"


def test_deeply_nested_tuple_return_is_a_wrong_answer(after_attack):
    o = judged(after_attack, DEEP_TUPLE, call_gt())
    assert o.status is Status.INCORRECT
    o = judged(after_attack, DEEP_TUPLE, ONE_ASSERT)
    assert o.status in (Status.INCORRECT, Status.RUNTIME_ERROR)


def test_per_item_limits_have_server_side_maximums():
    with Scorer(ScoringConfig(workers=1, max_memory_mb=4096, max_timeout_s=60)) as s:
        item = Item("m", "code", respond(SUM_OK), SUM_GT, limits=Limits(memory_mb=10**6))
        (r,) = s.score([item])
        assert r.status is Status.INVALID_INPUT and "4096 MiB" in r.detail
        item = Item("t", "code", respond(SUM_OK), SUM_GT, limits=Limits(test_timeout_s=3600))
        (r,) = s.score([item])
        assert r.status is Status.INVALID_INPUT and "60 s" in r.detail
        (r,) = s.score([Item("ok", "code", respond(SUM_OK), SUM_GT, limits=Limits(memory_mb=2048))])
        assert r.status is Status.CORRECT
        # NaN passes every comparison, the "> maximum" one included: it used to reach the
        # sandbox and the math pool as a deadline (SANDBOX_ERROR, INTERNAL_ERROR). A double on
        # the wire and JSON's NaN both carry it.
        for domain, gt in (("code", SUM_GT), ("math", "5")):
            for name in ("timeout_s", "test_timeout_s"):
                for bad in (float("nan"), float("inf")):
                    item = Item("n", domain, respond(SUM_OK) + r"\boxed{5}", gt,
                                limits=Limits(**{name: bad}))
                    (r,) = s.score([item])
                    assert r.status is Status.INVALID_INPUT and "finite" in r.detail, (name, r)


# -- 12. nothing of the program's is compiled or parsed in the judge's process ---------------

# One call with 24,000 distinct keyword arguments (290 KB, under MAX_PROGRAM_CHARS): CPython
# compiles it in quadratic time, about 3.5 s on this 2-core VM (10,000: 0.6 s; 20,000: 2.4 s),
# all of it holding the GIL. It used to be compiled on the code thread before any deadline
# (health checks stalled 38 s, a neighbour's 1 ms math item took 37 s).
SLOW_COMPILE = "f(" + ",".join(f"a{i}={i}" for i in range(24_000)) + ")\n"
SLOW_VERDICTS = (Status.TIMEOUT, Status.SYNTAX_ERROR, Status.RUNTIME_ERROR)
# An assert holding an f-string of 60,000 fields: CPython 3.11 parses it (ast.parse, as the
# ground truth's rewrite does) in quadratic time, about 2 s here.
SLOW_PARSE_GT = {"assert_case": ["assert f(1) == f'" + "{x}" * 60_000 + "'"]}


class GilWatch:
    """A thread that ticks every 5 ms; ``longest`` is the longest gap between two ticks (how
    long something held this process's GIL)."""

    def __enter__(self) -> "GilWatch":
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()
        return self

    def _tick(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            time.sleep(0.005)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_slow_to_compile_program_does_not_hold_the_judges_gil(nsjail_sandbox):
    """The program is compiled only in the jail, under the item's wall limit: the judging
    thread waits (GIL released) and the verdict comes within the item's budget."""
    baseline = sandbox_pids()
    t = time.monotonic()
    with GilWatch() as gil:
        o = score_code(respond(SLOW_COMPILE), SUM_GT, Limits(timeout_s=2), nsjail_sandbox)
    elapsed = time.monotonic() - t
    assert gil.longest < 1.0, f"the judging process's GIL was held for {gil.longest:.2f} s"
    assert o.status in SLOW_VERDICTS, o
    assert elapsed < 2 + 3, elapsed  # the item's 2 s, plus the jail's start and stop
    assert_no_leftovers(baseline)


@pytest.fixture()
def parse_pool():
    """A worker pool like the scorer's compare pool: ``run_bounded`` with a real deadline."""
    pool = DeadlinePool(1, preload=("verifier.data.ground_truth",))
    yield lambda fn, args, deadline_s: pool.submit(fn, args, deadline_s).result()
    pool.shutdown()


def test_slow_to_parse_ground_truth_is_parsed_under_a_deadline(nsjail_sandbox, parse_pool,
                                                               monkeypatch):
    """A ground truth's test code is parsed through ``run_bounded`` (a worker process the
    scorer kills at its deadline), never on the judging thread: a hostile row is INVALID_INPUT
    when the parse overruns, and the judging process's GIL stays free meanwhile."""
    monkeypatch.setattr(code_score, "GROUND_TRUTH_PARSE_S", 0.5, raising=False)
    t = time.monotonic()
    with GilWatch() as gil:
        o = score_code(respond("def f(x):\n    return x"), SLOW_PARSE_GT, Limits(),
                       nsjail_sandbox, parse_pool)
    assert gil.longest < 1.0, f"the judging process's GIL was held for {gil.longest:.2f} s"
    assert o.status is Status.INVALID_INPUT and "to parse" in o.detail, o
    assert time.monotonic() - t < 3
    # A normal ground truth with test code still goes through the worker and is judged.
    o = score_code(respond("def f(x):\n    return x"), ONE_ASSERT, Limits(), nsjail_sandbox,
                   parse_pool)
    assert o.status is Status.CORRECT, o


# -- 13. a malformed record is the program's failure, never SANDBOX_ERROR ----------------------

# Answers written straight onto the call-based program process's answer pipe. A "$" type tag
# that is a list (unhashable) made the judge's description of the wrong answer raise TypeError
# (SANDBOX_ERROR); an "exc" or "fatal" text of 2 MB made the harness write a record header
# over the judge's 1 MiB cap (SANDBOX_ERROR).
UNHASHABLE_TAG = WRITE_ANSWER + (
    "import json\n"
    "def f(x):\n"
    "    for tag in (['tuple'], {'dict': 1}):\n"
    "        data = json.dumps({'v': {'$': tag, 'v': []}, 'objs': []}).encode()\n"
    "        _send(len(data).to_bytes(4, 'big') + data)\n"
    "    import time; time.sleep(30)\n"
)
HUGE_EXCEPTION = WRITE_ANSWER + (
    "import json\n"
    "def f(x):\n"
    "    data = json.dumps({'exc': 'E' * 2_000_000, 'msg': [[1, 2], {'a': 1}]}).encode()\n"
    "    _send(len(data).to_bytes(4, 'big') + data)\n"
    "    import time; time.sleep(30)\n"
)
HUGE_FATAL = WRITE_ANSWER + (
    "import json\n"
    "data = json.dumps({'fatal': 'F' * 2_000_000, 'phase': ['module']}).encode()\n"
    "_send(len(data).to_bytes(4, 'big') + data)\n"
    "import time; time.sleep(30)\n"
)


def test_unhashable_type_tag_in_the_answer_is_the_programs_failure(after_attack):
    o = judged(after_attack, UNHASHABLE_TAG, call_gt(n=2), run_all_tests=True)
    if PROFILE.harness != "default":
        # LiveCodeBench's runner reads the return value, not a channel the program can write
        # to: the forged records go nowhere and f's own answer (None) is wrong
        assert o.status is Status.INCORRECT and "got None" in o.detail, o
    else:
        assert o.status is Status.RUNTIME_ERROR and "malformed" in o.detail, o
    assert (o.passed, o.total) == (0, 2)


def test_oversized_texts_in_the_programs_messages_are_its_failure(after_attack):
    o = judged(after_attack, HUGE_EXCEPTION, call_gt())
    assert o.status is Status.RUNTIME_ERROR and o.detail.startswith("test 1/1: EEEE"), o
    assert len(o.detail) < 1000
    o = judged(after_attack, HUGE_FATAL, call_gt())
    # skywork makes the top-level f a Solution method before anything runs (its
    # compute_score.py): without one the program fails there, and its message is never read.
    cut = "no top-level function 'f'" if PROFILE.harness == "skywork" else "FFFF"
    assert o.status is Status.COMPILE_ERROR and cut in o.detail, o
    assert len(o.detail) < 1000
    o = judged(after_attack, HUGE_FATAL, ONE_ASSERT)
    assert o.status is Status.COMPILE_ERROR and "FFFF" in o.detail, o


# -- every finding above through the server ---------------------------------------------------

VSOCK_ERRNO = (
    "import socket\n"
    "try:\n"
    "    socket.socket(40, socket.SOCK_STREAM).close()\n"  # AF_VSOCK
    "    print(0)\n"
    "except OSError as e:\n"
    "    print(e.errno)\n"
)
E = (Status.RUNTIME_ERROR,)
# (id, program, ground truth, limits, the verdicts it may get): the programs of the findings
# judged in-process above.
REPLAY = [
    ("1-asserts", HARVEST, SECRET_ASSERTS, {"run_all_tests": True}, (Status.INCORRECT,)),
    ("1-leetcode", HARVEST, SECRET_LEETCODE, {"run_all_tests": True}, (Status.INCORRECT,)),
    ("4-garbage", GARBAGE_ANSWER, call_gt(), {}, E),
    ("4-over-cap", OVER_CAP_ANSWER, ONE_ASSERT, {}, E),
    ("4-deep-json", DEEP_JSON_ANSWER, call_gt(), {}, E),
    ("4-huge-int", HUGE_INT, call_gt(), {}, (Status.INCORRECT,)),
    ("4-forged-prefix", FORGED_PREFIX, FORGED_PREFIX_LEETCODE, {}, (Status.COMPILE_ERROR,)),
    ("4-harness-deleted", HARNESS_DELETE, THREE_ASSERTS, {"run_all_tests": True}, E),
    ("5-vsock", VSOCK_ERRNO, {"inputs": [""], "outputs": ["97"]}, {}, (Status.CORRECT,)),
    ("7-str-exits", SNEAKY_STR, EMPTY, {}, E),
    ("7-patched-exit", PATCHED_EXIT, EMPTY, {}, E),
    ("7-trace", trace_attack("sys.settrace(hook)"), EMPTY, {}, E),
    ("7-ctypes", CTYPES_MEMMOVE, EMPTY, {}, E),
    ("8-stop-iteration", STOP_ITERATION, ALL_MAP, {}, E),
    ("9-dies-between", DIES_AT_2, DIES_BETWEEN, {"run_all_tests": True, "reward_mode": "fractional"}, E),
    ("11-deep-tuple", DEEP_TUPLE, call_gt(), {}, (Status.INCORRECT,)),
    ("11-inodes", INODE_FLOOD, ZERO, {"test_timeout_s": 10}, E),
    ("12-slow-compile", SLOW_COMPILE, SUM_GT, {"timeout_s": 4}, SLOW_VERDICTS),
    ("13-unhashable-tag", UNHASHABLE_TAG, call_gt(), {}, E),
    ("13-huge-exception", HUGE_EXCEPTION, call_gt(), {}, E),
    ("13-huge-fatal", HUGE_FATAL, call_gt(), {}, (Status.COMPILE_ERROR,)),
]


def test_every_finding_through_the_server(verifier_process):
    """The findings judged in-process above (1, 4, 5, 7, 8, 9, 11, 12, 13), all in one batch
    through a real ``verifier serve --workers 2`` while its health is probed and a neighbour's
    item is judged: each gets its own verdict, the server stays healthy, nothing is left
    behind."""
    items = [code_item(name, code, gt, **{"test_timeout_s": 3, **lim})
             for name, code, gt, lim, _ in REPLAY]
    results, _, failed, probes, elapsed = under_attack(verifier_process, items)
    by_id = {r.id: r for r in results}
    for name, *_, allowed in REPLAY:
        assert by_id[name].status in allowed, by_id[name]
    assert (by_id["9-dies-between"].passed, by_id["9-dies-between"].total) == (2, 3)
    assert not failed, f"{len(failed)} of {probes} health checks failed: {failed[:3]}"
    assert elapsed < 120  # 21 items of at most a few seconds each, two at a time


# -- calls without a deadline, from a non-Python client ---------------------------------------


@pytest.mark.parametrize("deadline", ["none", "3.59999e11"])
def test_node_grpc_js_client_without_a_deadline(verifier_process, deadline):
    """@grpc/grpc-js (installed by make setup into tests/node) calls Score with no deadline, and
    with the largest one it can send (99999999H): both used to fail with "timestamp out of range
    for platform time_t". The fraction needs a worker, so the server really waits."""
    items = [
        {"id": "a", "domain": "math", "response": r"\boxed{\frac{1}{2}}", "ground_truth_json": json.dumps("0.5")},
        {"id": "b", "domain": "math", "response": r"\boxed{3}", "ground_truth_json": json.dumps("4")},
    ]
    r = subprocess.run(
        ["node", str(ROOT / "tests/node/score.js"), verifier_process,
         str(ROOT / "protos/verifier.proto"), json.dumps(items), deadline],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    resp = json.loads(r.stdout)
    assert [x["status"] for x in resp["results"]] == ["CORRECT", "INCORRECT"], resp
