"""Bad input and attacks, one named test each (real nsjail), each under every judging profile
(default, lcb, skywork). Every test asserts the verdict is not CORRECT (with the expected status
where it is deterministic) and, through the ``after_attack`` fixture, that no process of the
sandbox's uid is left on the host and that the next normal item is judged CORRECT. Attacks are
written so that *succeeding* at the attack would make the program print the expected answer: a
verdict other than CORRECT means the attack failed."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from tests.conftest_sandbox import (  # noqa: F401
    CHECKED,
    PROJECT_ROOT,
    after_attack,
    checker_in_use,
    forkserver_sandbox,
    nsjail_sandbox,
    respond,
)
from sandbox import SandboxLimits
from sandbox.nsjail import PACKAGES_MOUNT
from verifier.scoring.code_score import score_code
from verifier.items import PROFILES, Limits, Status
from verifier.scoring.profiles import get_profile

ONE = {"inputs": ["5\n"], "outputs": ["25\n"]}
TWO = {"inputs": ["5\n", "6\n"], "outputs": ["25\n", "36\n"]}
EMPTY = {"inputs": ["5\n"], "outputs": [""]}
SQUARE = "print(int(input()) ** 2)"


PROFILE = get_profile("default")


CHECKING = False  # the test's ground truths carry a checker (CHECKED)


@pytest.fixture(autouse=True, params=[*PROFILES, CHECKED])
def profile(request):
    """Every attack runs under every judging profile (their preambles, recursion limits,
    SystemExit rules and time budgets must not open a hole), and under the default one with
    checkers in use (a program checker in a jail of its own, or "float:EPS")."""
    global PROFILE, CHECKING
    CHECKING = request.param == CHECKED
    PROFILE = get_profile("default" if CHECKING else request.param)
    yield PROFILE
    PROFILE, CHECKING = get_profile("default"), False


def attack(sb, code, gt=ONE, may_pass=False, **limits):
    """Score an attack; it must not be judged CORRECT unless ``may_pass`` (a program whose
    answer is right and whose attack only races it)."""
    limits.setdefault("test_timeout_s", 1.5)
    gt = checker_in_use(gt) if CHECKING else gt
    o = score_code(respond(code), gt, Limits(**limits), sb, profile=PROFILE)
    if not may_pass:
        assert o.status is not Status.CORRECT, o
    return o


# -- resource exhaustion ---------------------------------------------------------------------


def test_infinite_loop_times_out(after_attack):
    o = attack(after_attack, "while True:\n    pass")
    assert o.status is Status.TIMEOUT


def test_sleep_past_deadline_times_out(after_attack):
    o = attack(after_attack, "import time\ntime.sleep(60)\n" + SQUARE)
    assert o.status is Status.TIMEOUT


def test_ignoring_sigterm_times_out(after_attack):
    code = "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass"
    o = attack(after_attack, code)
    assert o.status is Status.TIMEOUT


def test_fork_bomb_contained(after_attack):
    code = "import os\nwhile True:\n    try:\n        __import__('posix').fork()\n    except OSError:\n        pass"
    o = attack(after_attack, code)
    assert o.status is Status.TIMEOUT


# Memory bombs get a long time limit: filling 1 GiB takes 0.5-2.5 s on these VMs (first touch of
# guest memory), and the limit that must stop them is the memory limit, not the clock. The item
# asks for 1 GiB: the lcb and skywork profiles' own 4 GiB took over 20 s to fill at a load
# average of 15-20 on 2 cores (TIMEOUT, a right verdict for that clock, not what is tested).
BOMB_MB = 1024


def test_memory_bomb(after_attack):
    o = attack(
        after_attack, "x = []\nwhile True:\n    x.append(bytearray(64 << 20))", test_timeout_s=20,
        memory_mb=BOMB_MB,
    )
    assert o.status is Status.MEMORY_LIMIT


def test_memory_bomb_in_many_processes(after_attack):
    code = "import os\nfor i in range(12):\n    if __import__('posix').fork() == 0:\n        break\nx = []\nwhile True:\n    x.append(b'x' * (32 << 20))"
    o = attack(after_attack, code, memory_mb=256)
    assert o.status in (Status.MEMORY_LIMIT, Status.TIMEOUT)


def test_output_flood(after_attack):
    o = attack(after_attack, "import sys\nwhile True:\n    sys.stdout.write('25\\n' * 10000)")
    if PROFILE.harness != "default":  # no output cap there: the captured text grows until a limit
        assert o.status in (Status.OUTPUT_LIMIT, Status.TIMEOUT, Status.MEMORY_LIMIT), o
    else:
        assert o.status is Status.OUTPUT_LIMIT


def test_stderr_flood_is_harmless(after_attack):
    code = "import sys\nfor _ in range(3000):\n    sys.stderr.write('e' * 10000)\nprint(-1)"
    o = attack(after_attack, code)
    assert o.status is Status.INCORRECT


def test_disk_fill_in_scratch(after_attack):
    # Ends by itself when the scratch is full (bounded by its size): a generous per-test limit
    # keeps a loaded machine from turning that into TIMEOUT.
    code = "i = 0\nwhile True:\n    with open(f'/tmp/fill{i}', 'wb') as f:\n        f.write(b'x' * (8 << 20))\n    i += 1"
    o = attack(after_attack, code, test_timeout_s=20)
    assert o.status is Status.RUNTIME_ERROR and "No space left" in o.detail


# -- the host's files ----------------------------------------------------------------------


def test_reads_etc_shadow_denied(after_attack):
    code = "data = open('/etc/shadow').read()\nprint(25 if 'root' in data else -1)"
    o = attack(after_attack, code)
    assert o.status is Status.RUNTIME_ERROR


def test_reads_project_files_denied(after_attack):
    target = PROJECT_ROOT / "pyproject.toml"
    assert target.exists()
    code = f"data = open({str(target)!r}).read()\nprint(25 if 'magic' in data else -1)"
    o = attack(after_attack, code)
    assert o.status is Status.RUNTIME_ERROR


def test_reads_judge_files_gets_nothing_useful(after_attack):
    # The harness is visible (read-only) but holds no expected outputs; the test's expected
    # output appears in no file of the sandbox. The walk covers every place the judge could
    # have put a file: the jail's root, its scratch /tmp (the harness, the input files) and
    # every other mount, except the system trees bound from the host (/usr, /lib, /lib64,
    # /bin, /dev) and the public packages (numpy, the same files in every jail): those are
    # the host's, not the judge's, and reading their ~70 MB is what made the test's time
    # depend on the machine's load. It reports how much it read and whether it read the
    # harness, so a walk that saw nothing cannot pass. Bounded by what it reads (a few MB),
    # with a per-test limit that load cannot reach.
    code = (
        "import os\n"
        f"skip = {{'/usr', '/lib', '/lib64', '/bin', '/dev', {PACKAGES_MOUNT!r}}}\n"
        "found, files, harness = [], 0, False\n"
        "for root, dirs, names in os.walk('/'):\n"
        "    dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip]\n"
        "    for f in names:\n"
        "        try:\n"
        "            data = open(os.path.join(root, f), 'rb').read()\n"
        "        except OSError:\n"
        "            continue\n"
        "        files += 1\n"
        "        harness = harness or f.startswith('judge_harness')\n"
        "        if b'SECRET-EXPECTED-7f3' in data:\n"
        "            found.append(f)\n"
        "print('SECRET-EXPECTED-7f3' if found else f'nothing in {files} files harness={harness}')"
    )
    o = attack(after_attack, code, gt={"inputs": ["x\n"], "outputs": ["SECRET-EXPECTED-7f3\n"]},
               test_timeout_s=20)
    assert o.status is Status.INCORRECT, o
    assert "harness=True" in o.detail, o.detail  # the walk reached the judge's own files


def test_write_outside_scratch_denied(after_attack):
    marker = f"/tmp/magic-pwned-{uuid.uuid4().hex}"
    proj = PROJECT_ROOT / f"pwned-{uuid.uuid4().hex}"
    code = (
        f"open({marker!r}, 'w').write('x')  # the sandbox's own /tmp: allowed, private\n"
        "ok = 0\n"
        f"for p in [{str(proj)!r}, '/usr/pwned', '/pwned', '/etc/pwned', '/judge_harness.pyc']:\n"
        "    try:\n"
        "        open(p, 'w').write('x'); ok += 1\n"
        "    except OSError:\n"
        "        pass\n"
        "try:\n"
        "    open('judge_harness.pyc', 'wb').write(b'x'); ok += 1\n"
        "except OSError:\n"
        "    pass\n"
        "print(25 if ok else -1)"
    )
    o = attack(after_attack, code)
    assert o.status is Status.INCORRECT
    # /tmp inside the sandbox is its own tmpfs: the host's /tmp is untouched.
    assert not os.path.exists(marker) and not proj.exists()


# -- network -------------------------------------------------------------------------------


def test_network_to_internet_denied(after_attack):
    code = (
        "import socket\n"
        "for addr in [('1.1.1.1', 53), ('8.8.8.8', 53), ('example.com', 80)]:\n"
        "    try:\n"
        "        socket.create_connection(addr, timeout=1)\n"
        "        print(25)\n"
        "        break\n"
        "    except OSError:\n"
        "        pass\n"
        "else:\n"
        "    print(-1)"
    )
    o = attack(after_attack, code, test_timeout_s=5)
    assert o.status is Status.INCORRECT


def _host_addresses() -> list[str]:
    addrs = {"127.0.0.1"}
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent; picks the outgoing interface
            addrs.add(s.getsockname()[0])
    except OSError:
        pass
    return sorted(addrs)


@pytest.mark.parametrize(
    "bind", ["127.0.0.1", "0.0.0.0"], ids=["loopback", "verifier-port-all-interfaces"]
)
def test_connect_to_host_loopback_refused(after_attack, bind):
    """A real TCP listener on the host (like the verifier's own gRPC port): the program must not
    reach it through 127.0.0.1 or the host's own address."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((bind, 0))
    srv.listen(16)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    targets = [(a, port) for a in _host_addresses()]
    code = (
        "import socket\n"
        f"for addr in {targets!r}:\n"
        "    try:\n"
        "        s = socket.create_connection(tuple(addr), timeout=1)\n"
        "        s.sendall(b'pwned')\n"
        "        print(25)\n"
        "        break\n"
        "    except OSError:\n"
        "        pass\n"
        "else:\n"
        "    print(-1)"
    )
    try:
        o = attack(after_attack, code, test_timeout_s=5)
        assert o.status is Status.INCORRECT
        with pytest.raises(socket.timeout):
            srv.accept()
    finally:
        srv.close()


# -- processes -------------------------------------------------------------------------------


def test_kill_parent_and_pid1(after_attack):
    """Signals to the harness (PID 1 of the jail) are dropped by the kernel; the judge keeps
    judging the other tests. Killing would not produce a passing verdict anyway."""
    code = (
        "import os, signal\n"
        "for target in (os.getppid(), 1):\n"
        "    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP):\n"
        "        try:\n"
        "            __import__('posix').kill(target, sig)\n"
        "        except OSError:\n"
        "            pass\n"
        "try:\n"
        "    __import__('posix').kill(-1, signal.SIGKILL)\n"
        "except OSError:\n"
        "    pass\n"
        "n = int(input())\n"
        "print(n * n if n == 6 else -1)"
    )
    o = attack(after_attack, code, gt=TWO, run_all_tests=True)
    # The harness survived: the second test was still run and judged.
    assert o.status is Status.INCORRECT and (o.passed, o.total) == (1, 2)


def test_kill_evaluator_in_assert_mode(after_attack):
    code = "import os, signal\ndef add(a, b):\n    try:\n        __import__('posix').kill(-1, signal.SIGKILL)\n    except OSError:\n        pass\n    return a + b + 1"
    o = attack(after_attack, code, gt={"assert_case": ["assert add(1, 2) == 3"]})
    assert o.status in (Status.RUNTIME_ERROR, Status.INCORRECT)


def test_double_fork_daemon_does_not_outlive_sample(after_attack):
    marker = f"/tmp/magic-daemon-{uuid.uuid4().hex}"
    code = (
        "import os, time\n"
        "if __import__('posix').fork() == 0:\n"
        "    os.setsid()\n"
        "    if __import__('posix').fork() == 0:\n"
        "        for _ in range(100):\n"
        "            time.sleep(0.05)\n"
        f"            try: open({marker!r}, 'w').write('alive')\n"
        "            except OSError: pass\n"
        "    os._exit(0)\n"
        "print(-1)"
    )
    o = attack(after_attack, code)
    assert o.status is Status.INCORRECT
    assert not os.path.exists(marker)


def test_daemon_cannot_disturb_next_test(after_attack):
    # A daemon left by test 1 would print the answer of test 2 into... nothing: it is killed
    # before test 2 starts, and test 2 has its own pipes.
    code = (
        "import os, sys, time\n"
        "n = int(input())\n"
        "if n == 5 and __import__('posix').fork() == 0:\n"
        "    os.setsid()\n"
        "    time.sleep(0.3)\n"
        "    print(36, flush=True)\n"
        "    os._exit(0)\n"
        "print(25 if n == 5 else '')"
    )
    o = attack(after_attack, code, gt=TWO)
    assert o.status is Status.INCORRECT and o.passed == 1


def test_ptrace_and_process_vm_denied(after_attack):
    """The seccomp policy denies ptrace. Judged programs cannot load ctypes at all (the harness's
    audit hook), so the syscall is made by a plain program run in the same jail policy."""
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "pid = __import__('posix').fork()\n"
        "if pid == 0:\n"
        "    import time; time.sleep(5); os._exit(0)\n"
        "rc = libc.ptrace(16, pid, 0, 0)\n"  # PTRACE_ATTACH to our own child
        "print(rc, ctypes.get_errno())\n"
        "__import__('posix').kill(pid, 9)\n"
    )
    sb = after_attack
    r = sb.run([sb.python, "-I", "-S", "-c", code], limits=SandboxLimits(wall_s=20, cpu_s=10))
    assert r.status == "ok" and r.exit_code == 0, r
    rc, errno = r.stdout.decode().split()
    assert (int(rc), int(errno)) == (-1, 1)  # EPERM
    o = attack(after_attack, "import ctypes\nprint(25)")
    # lcb and skywork (its copy of the same harness): imports run when the module loads
    # (make_function hoists them): a load failure.
    want = Status.COMPILE_ERROR if PROFILE.harness != "default" else Status.RUNTIME_ERROR
    assert o.status is want and "ctypes" in o.detail


# -- forging the verdict ---------------------------------------------------------------------


def test_exit_before_tests_run(after_attack):
    o = attack(after_attack, "import os\nos._exit(0)")
    # lcb and skywork: one process runs every test, so os._exit ends it without an answer (LiveCodeBench's
    # judging process dies too: no result, a failure there).
    want = Status.RUNTIME_ERROR if PROFILE.harness != "default" else Status.INCORRECT
    assert o.status is want
    o = attack(
        after_attack,
        "import sys\nsys.exit(0)\ndef f(x):\n    return x * x",
        gt={"inputs": ["5"], "outputs": ["25"], "fn_name": "f"},
    )
    # exiting while the module loads, before any call: LiveCodeBench's "compilation error"
    assert o.status is Status.COMPILE_ERROR and "failed to load" in o.detail
    o = attack(
        after_attack,
        "import os\nos._exit(0)\ndef f(x):\n    return x * x",
        gt={"assert_case": ["assert f(5) == 25"]},
    )
    assert o.status is Status.RUNTIME_ERROR


def test_forged_verdict_on_stdout(after_attack):
    code = (
        "import json, sys\n"
        "fake = json.dumps({'type': 'test', 'i': 0, 'status': 'exited', 'exit': 0, 'raised': False, 'seq': 0, 'blobs': [3, 0]}).encode()\n"
        "sys.stdout.buffer.write(b'MGK1' + len(fake).to_bytes(4, 'big') + fake + b'25\\n' + bytes(32))\n"
        "print('CORRECT passed 1/1 tests')\n"
        "print(json.dumps({'status': 'CORRECT', 'reward': 1.0, 'passed': 1, 'total': 1}))\n"
        "import os\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        os.write(fd, b'MGK1' + len(fake).to_bytes(4, 'big') + fake)\n"
        "    except OSError:\n"
        "        pass\n"
    )
    o = attack(after_attack, code)
    # Writing into the marker pipe can only make the program fail (e.g. MEMORY_LIMIT).
    assert o.status in (Status.INCORRECT, Status.RUNTIME_ERROR, Status.MEMORY_LIMIT)


def test_forged_verdict_via_atexit(after_attack):
    """The program prints the right answer from an atexit hook after it raised, then forces exit
    code 0: a program that raises fails its test."""
    code = (
        "import atexit, os, sys\n"
        "def forge():\n"
        "    sys.stdout.write('25\\n'); sys.stdout.flush(); os._exit(0)\n"
        "atexit.register(forge)\n"
        "raise RuntimeError('the real program crashed')"
    )
    o = attack(after_attack, code)
    assert o.status is Status.RUNTIME_ERROR


def test_forged_verdict_via_atexit_in_call_mode(after_attack):
    code = "import atexit, os\natexit.register(lambda: os._exit(0))\ndef f(x):\n    raise ValueError('nope')"
    o = attack(after_attack, code, gt={"inputs": ["5"], "outputs": ["25"], "fn_name": "f"})
    assert o.status is Status.RUNTIME_ERROR


def test_raises_when_expected_output_is_empty(after_attack):
    o = attack(after_attack, "raise ValueError('boom')", gt=EMPTY)
    assert o.status is Status.RUNTIME_ERROR
    if PROFILE.stdio_exit_ok:
        # LiveCodeBench's judge swallows SystemExit and compares the output: empty is right.
        o = score_code(respond("import sys\nsys.exit(2)"), EMPTY, Limits(), after_attack, profile=PROFILE)
        assert o.status is Status.CORRECT
    else:
        o = attack(after_attack, "import sys\nsys.exit(2)", gt=EMPTY)
        assert o.status is Status.RUNTIME_ERROR


def test_rigged_eq_object(after_attack):
    rigged = (
        "class Anything(list):\n"
        "    def __eq__(self, other): return True\n"
        "    def __ne__(self, other): return False\n"
        "    __hash__ = None\n"
        "class Obj:\n"
        "    def __eq__(self, other): return True\n"
    )
    call_gt = {"inputs": ["5"], "outputs": ["[25]"], "fn_name": "f"}
    o = attack(after_attack, rigged + "def f(x):\n    return Obj()", gt=call_gt)
    assert o.status is Status.INCORRECT
    o = attack(after_attack, rigged + "def f(x):\n    return Anything()", gt=call_gt)
    assert o.status is Status.INCORRECT
    o = attack(
        after_attack,
        rigged + "def f(x):\n    return Obj()",
        gt={"assert_case": ["assert f(5) == [25]", "assert [25] == f(5)"]},
    )
    assert o.status is Status.INCORRECT
    o = attack(
        after_attack,
        rigged + "def f(x):\n    return Anything()",
        gt={"assert_case": ["assert f(5) == [25]"]},
    )
    assert o.status is Status.INCORRECT
    leet = {
        "import_prefix": "",
        "test_code": "def check(candidate):\n    assert candidate(5) == [25]\n",
        "entry_point": "Solution().f",
    }
    o = attack(
        after_attack, rigged + "class Solution:\n    def f(self, x):\n        return Obj()", gt=leet
    )
    assert o.status is Status.INCORRECT


def test_monkeypatched_builtins(after_attack):
    """Patching builtins only changes the program's own process; the asserts are evaluated
    by the evaluator process with pristine builtins."""
    code = (
        "import builtins\n"
        "builtins.bool = lambda *a: True\n"
        "builtins.isinstance = lambda *a: True\n"
        "builtins.len = lambda *a: 1\n"
        "def f(x):\n"
        "    return -1\n"
    )
    gt = {
        "assert_case": [
            "assert f(5) == 25",
            "assert bool(f(5) == 25)",
            "assert len([f(5), 1]) == 1",
        ]
    }
    o = attack(after_attack, code, gt=gt, run_all_tests=True)
    assert o.status in (Status.INCORRECT, Status.RUNTIME_ERROR) and o.passed == 0


def test_shadowed_names_and_assertion_error(after_attack):
    code = (
        "import builtins, sys, math as _m\n"
        "builtins.AssertionError = type('Nope', (Exception,), {})\n"
        "_m.isclose = lambda *a, **k: True\n"
        "class math:\n"
        "    isclose = staticmethod(lambda *a, **k: True)\n"
        "def max(*a):\n"
        "    return 25\n"
        "def sorted(*a):\n"
        "    return [1, 2, 3]\n"
        "def f(x):\n"
        "    return -1\n"
    )
    gt = {
        "assert_case": [
            "assert f(5) == 25",
            "import math\nassert math.isclose(f(5), 25)",
            "assert max(f(5), 0) == 25",
            "assert sorted([f(5), 3, 2]) == [1, 2, 3]",
        ]
    }
    o = attack(after_attack, code, gt=gt, run_all_tests=True)
    assert o.status is Status.INCORRECT and (o.passed, o.total) == (0, 4)


def test_sys_exit_inside_assert_call(after_attack):
    code = "import os\ndef f(x):\n    os._exit(0)"
    o = attack(after_attack, code, gt={"assert_case": ["assert f(5) == 25"]})
    assert o.status is Status.RUNTIME_ERROR


def test_syntax_error(after_attack):
    o = attack(after_attack, "print(25\n")
    assert o.status is Status.SYNTAX_ERROR


def test_null_bytes_and_huge_program(after_attack):
    o = attack(after_attack, "print(25)\x00")
    assert o.status is Status.SYNTAX_ERROR
    o = attack(after_attack, "x = 1\n" * 200000)
    assert o.status is Status.SYNTAX_ERROR


def test_recursion_bomb(after_attack):
    code = (
        "import sys\nsys.setrecursionlimit(10**9)\ndef f(n):\n    return f(n + 1) + 1\nprint(f(0))"
    )
    o = attack(after_attack, code)
    assert o.status in (Status.RUNTIME_ERROR, Status.MEMORY_LIMIT, Status.TIMEOUT)


def test_reads_other_tests_inputs_gains_nothing(after_attack):
    """The program can find the inputs of all tests in the harness's memory, but never the
    expected outputs: printing the right answer still requires solving the problem."""
    code = (
        "import gc\n"
        "leak = [o for o in gc.get_objects() if isinstance(o, dict) and 'outputs' in o]\n"
        "print(leak[0]['outputs'][0] if leak else -1)"
    )
    o = attack(after_attack, code)
    assert o.status is Status.INCORRECT


def test_fork_bomb_in_assert_mode(after_attack):
    code = (
        "import os, threading\n"
        "def bomb():\n"
        "    while True:\n"
        "        try:\n"
        "            __import__('posix').fork()\n"
        "        except OSError:\n"
        "            pass\n"
        "threading.Thread(target=bomb, daemon=True).start()\n"
        "def f(x):\n"
        "    return x * x\n"
    )
    o = attack(after_attack, code, gt={"assert_case": ["assert f(5) == 25"]}, may_pass=True)
    # A thread forking in the background races the assert: when the assert wins, f is right and
    # the verdict is CORRECT (seen on a loaded machine); when the bomb starves it, a failure.
    # Either is a true verdict; what the bomb must never do is make its item the sandbox's or
    # the service's fault, leave a process behind or spoil the next item (after_attack).
    assert o.status in (Status.CORRECT, Status.RUNTIME_ERROR, Status.TIMEOUT,
                        Status.MEMORY_LIMIT), o


def test_memory_bomb_in_call_mode(after_attack):
    code = "def f(x):\n    junk = []\n    while True:\n        junk.append(bytearray(64 << 20))"
    o = attack(
        after_attack,
        code,
        gt={"inputs": ["5", "6"], "outputs": ["25", "36"], "fn_name": "f"},
        test_timeout_s=20,
        memory_mb=BOMB_MB,
    )
    assert o.status is Status.MEMORY_LIMIT


def test_infinite_loop_in_call_mode_times_out(after_attack):
    code = "def f(x):\n    while True:\n        pass"
    o = attack(after_attack, code, gt={"inputs": ["5"], "outputs": ["25"], "fn_name": "f"})
    assert o.status is Status.TIMEOUT


def test_infinite_loop_in_leetcode_mode_times_out(after_attack):
    gt = {
        "import_prefix": "",
        "test_code": "def check(candidate):\n    assert candidate(5) == 25\n",
        "entry_point": "Solution().f",
    }
    o = attack(
        after_attack,
        "class Solution:\n    def f(self, x):\n        while True:\n            pass",
        gt=gt,
    )
    assert o.status is Status.TIMEOUT


def test_shadow_module_in_scratch(after_attack):
    """Modules written into the scratch directory are not importable by the evaluator (the
    interpreter runs isolated: neither the working directory nor the script's is on sys.path)."""
    code = (
        "for name in ('math', 'collections', 'typing', 'heapq'):\n"
        "    open(f'/tmp/{name}.py', 'w').write('isclose = lambda *a, **k: True\\n')\n"
        "def f(x):\n"
        "    return -1\n"
    )
    gt = {"assert_case": ["import math\nassert math.isclose(f(5), 25)"]}
    o = attack(after_attack, code, gt=gt)
    assert o.status is Status.INCORRECT
