"""Shared fixtures and helpers for the sandbox and code-scoring tests (imported explicitly by
tests/test_sandbox*.py and tests/test_code_score*.py; real nsjail, no mocks)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandbox import SandboxUnavailable, create_sandbox, uidpool
from sandbox.forkserver import PreloadedEntry
from sandbox.nsjail import SANDBOX_UID
from verifier.scoring.code_score import score_code
from verifier.harness import harness_source
from verifier.scoring.harness_files import HARNESS_FILE, HARNESS_PYC
from verifier.items import Limits, Status

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# The outside uids a jail of this suite may run as: the pool's (one per concurrent jail) and
# 65534 (single-uid mode, and the docker backend's containers).
POOL = uidpool.parse_spec(os.environ.get(uidpool.ENV_VAR) or uidpool.DEFAULT_UIDS)


SUM_GT = {"inputs": ["1 2\n", "3 4\n", "10 20\n"], "outputs": ["3\n", "7\n", "30\n"]}
SUM_OK = "a, b = map(int, input().split())\nprint(a + b)"


def respond(code: str, think: bool = True) -> str:
    """A model response whose last python block is ``code``."""
    head = "<think>\nLet me think.\n```python\nprint('draft')\n```\n</think>\n" if think else ""
    return f"{head}Here is my solution:\n```python\n{code}\n```\n"


def refuse_sandbox(reason: str):
    """A ``create_sandbox`` stand-in whose self-test fails with ``reason`` (monkeypatch it over
    ``verifier.scoring.scorer.create_sandbox`` to get a scorer with no working sandbox)."""

    def create(*_args, **_kwargs):
        raise SandboxUnavailable(reason)

    return create


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process on the host (/proc/PID/stat)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after
        # its LAST closing parenthesis.
        out[int(d)] = int(stat[stat.rindex(b")") + 2:].split()[1])
    return out


def _ours(pid: int, parents: dict[int, int], me: int, waiting: set[int] = frozenset()) -> bool:
    """``pid`` descends from this test process, or is an orphan (re-parented to init), which
    could be a jail's escapee. Sandboxed processes of another test suite on the same machine
    (same uid) descend from that suite and are not ours to count, nor are those of a
    pre-started jail that still waits for its sample (``waiting``: nsjail pids)."""
    if parents.get(pid) in (0, 1):
        return True
    seen: set[int] = set()
    while pid in parents and pid not in seen:
        seen.add(pid)
        pid = parents[pid]
        if pid in waiting:
            return False
        if pid == me:
            return True
    return False


WARM_SANDBOXES: list = []
"""Sandboxes with pre-started jails that this test process holds (their waiting jails are not
leftovers: ``sandbox_pids``)."""


def sandbox_pids() -> set[int]:
    """Processes on the host running as a sandbox uid (any of the pool's, or 65534; real,
    effective, saved or filesystem uid) that this test process started (directly, through
    nsjail, or through a verifier it runs), or that were orphaned."""
    # The project's own /proc scan (real, effective, saved and filesystem uids): 65534, then
    # the pool's range.
    ranges = [(SANDBOX_UID, SANDBOX_UID)] + ([(POOL.base, POOL.last)] if POOL else [])
    uids = {pid for lo, hi in ranges for pids in uidpool.uids_in_use(lo, hi).values()
            for pid in pids}
    parents, me = _parents(), os.getpid()
    # After the scan: a jail that started waiting later is not in it, and one handed over
    # since is done with by the time a test checks for leftovers.
    waiting = {pid for sb in WARM_SANDBOXES for pid in sb.waiting_jail_pids()}
    return {p for p in uids if _ours(p, parents, me, waiting)}


def assert_no_leftovers(baseline: set[int], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        left = sandbox_pids() - baseline
        if not left:
            return
        if time.monotonic() > deadline:
            cmds = {}
            for p in left:
                try:
                    cmds[p] = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ")[:100]
                except OSError:
                    pass
            raise AssertionError(f"processes of a sandbox uid ({SANDBOX_UID} or pool {POOL}) "
                                 f"left behind: {cmds}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def nsjail_sandbox():
    """The nsjail sandbox of the code and attack tests, with pre-started jails as
    ``verifier serve`` has them (two per command): attacks run in jails that waited for them."""
    sb = create_sandbox("nsjail", warm=2)
    WARM_SANDBOXES.append(sb)
    yield sb
    WARM_SANDBOXES.remove(sb)
    sb.close()


def new_forkserver_sandbox():
    """A new nsjail sandbox with a forkserver (sandbox/forkserver.py): the harness's jails are
    forked from a zygote, as ``verifier serve --forkserver`` has them. Its zygote starts at its
    first run."""
    return create_sandbox("nsjail", forkserver=PreloadedEntry((HARNESS_PYC, HARNESS_FILE),
                                                         harness_source()))


@pytest.fixture(scope="session")
def forkserver_sandbox():
    """The forkserver sandbox of the code and attack tests (``new_forkserver_sandbox``)."""
    sb = new_forkserver_sandbox()
    yield sb
    sb.close()


@pytest.fixture(params=["nsjail", "forkserver"])
def after_attack(request):
    """Checks after an attack, in jails nsjail starts and in jails forked from a zygote: no
    process of a sandbox uid is left, and the next normal item is judged right."""
    sb = request.getfixturevalue(f"{request.param}_sandbox")
    baseline = sandbox_pids()
    yield sb
    assert_no_leftovers(baseline)
    nxt = score_code(respond(SUM_OK), SUM_GT, Limits(), sb)
    assert nxt.status is Status.CORRECT, nxt
    assert (nxt.passed, nxt.total) == (3, 3)


CHECKED = "default+checker"
"""A pseudo-profile of the attack and red-team suites: the default profile, with a checker in
use on every ground truth that can carry one (``checker_in_use``)."""
# A testlib-style checker (docs/contracts.md 1) that accepts what the exact rule accepts, token
# by token on the raw bytes: the attacks must fare no better with it than without.
TOKENS_CHECKER = {"language": "python", "source": (
    "import sys\n"
    "out = open(sys.argv[2], 'rb').read().split()\n"
    "ans = open(sys.argv[3], 'rb').read().split()\n"
    "sys.exit(0 if out == ans else 1)\n")}


def checker_in_use(gt):
    """``gt`` with a checker: the program checker on stdin/stdout tests, "float:1e-9" on
    call-based ones; other formats (and JSON strings) as they are."""
    if not isinstance(gt, dict) or "inputs" not in gt or "checker" in gt:
        return gt
    return {**gt, "checker": "float:1e-9" if gt.get("fn_name") else TOKENS_CHECKER}
