"""DeadlinePool: hard per-task deadlines by killing and replacing a worker process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests import pool_tasks as t
from verifier.items import VerifierError
from verifier.scoring.pool import (MP_DIR_PREFIX, DeadlineExceeded, DeadlinePool, TaskFailed,
                           WorkerDied)


@pytest.fixture
def pool():
    p = DeadlinePool(2, max_pending=8, memory_mb=512)
    yield p
    p.shutdown()


def test_runs_tasks(pool: DeadlinePool) -> None:
    assert [pool.submit(t.add, (i, 1), 5).result() for i in range(5)] == [1, 2, 3, 4, 5]


def test_overrunning_task_is_killed_and_others_proceed(pool: DeadlinePool) -> None:
    start = time.monotonic()
    slow = pool.submit(t.busy_c_loop, (), 0.5)
    quick = [pool.submit(t.add, (i, i), 5) for i in range(6)]
    assert [q.result(timeout=10) for q in quick] == [0, 2, 4, 6, 8, 10]
    with pytest.raises(DeadlineExceeded):
        slow.result(timeout=10)
    assert time.monotonic() - start < 5
    assert pool.restarts["deadline"] == 1
    # the replaced worker serves again
    assert pool.submit(t.add, (2, 3), 5).result(timeout=10) == 5


def test_killed_worker_is_replaced_by_a_new_process(pool: DeadlinePool) -> None:
    before = set(pool.pids())
    with pytest.raises(DeadlineExceeded):
        pool.submit(t.sleep_then, (30, "x"), 0.3).result(timeout=10)
    pids = {pool.submit(t.pid, (), 5).result(timeout=10) for _ in range(6)}
    assert len(pids & before) <= 1  # one of the two original workers is gone
    assert all(p > 0 for p in pids)


def test_memory_bomb_raises_memory_error_in_worker(pool: DeadlinePool) -> None:
    with pytest.raises(TaskFailed) as e:
        pool.submit(t.allocate, (2048,), 10).result(timeout=20)
    assert e.value.kind == "MemoryError"
    assert pool.submit(t.allocate, (10,), 10).result(timeout=20) == 10 * 1024 * 1024


def test_worker_death_is_reported_and_worker_replaced(pool: DeadlinePool) -> None:
    with pytest.raises(WorkerDied, match="signal 9"):
        pool.submit(t.die, (), 5).result(timeout=10)
    assert pool.restarts["died"] == 1
    assert pool.submit(t.add, (1, 1), 5).result(timeout=10) == 2


def test_exception_in_task_is_returned_not_fatal(pool: DeadlinePool) -> None:
    with pytest.raises(TaskFailed, match="ValueError: bad thing"):
        pool.submit(t.raise_value_error, (), 5).result(timeout=10)
    assert pool.submit(t.add, (1, 2), 5).result(timeout=10) == 3


def test_full_queue_is_resource_exhausted() -> None:
    with DeadlinePool(1, max_pending=2, memory_mb=None) as p:
        p.submit(t.sleep_then, (1.0, "a"), 5)
        time.sleep(0.2)  # let the worker take the first task
        p.submit(t.sleep_then, (0, "b"), 5)
        p.submit(t.sleep_then, (0, "c"), 5)
        with pytest.raises(VerifierError) as e:
            p.submit(t.add, (1, 1), 5)
        assert e.value.code == "resource_exhausted"


def test_cancelled_task_never_runs() -> None:
    with DeadlinePool(1, max_pending=4, memory_mb=None) as p:
        first = p.submit(t.sleep_then, (0.5, "a"), 5)
        second = p.submit(t.sleep_then, (0, "b"), 5)
        assert second.cancel()
        assert first.result(timeout=10) == "a"
        assert second.cancelled()


def test_a_killed_worker_is_replaced_at_once(pool: DeadlinePool) -> None:
    """The replacement starts right after the failed task is answered, not on the next task."""
    with pytest.raises(DeadlineExceeded):
        pool.submit(t.sleep_then, (30, "x"), 0.3).result(timeout=10)
    deadline = time.monotonic() + 10
    while len(pool.pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pool.pids()) == 2


def test_a_worker_is_recycled_after_max_tasks_and_no_task_is_lost() -> None:
    """--worker-max-tasks: after 3 answered tasks a worker is replaced by a fresh process; every
    task, including those queued while a replacement starts, gets its own right answer."""
    with DeadlinePool(1, max_pending=64, memory_mb=None, max_tasks=3) as p:
        pids = [p.submit(t.pid, (), 5).result(timeout=10) for _ in range(7)]
        assert pids[0] == pids[1] == pids[2] != pids[3]
        assert pids[3] == pids[4] == pids[5] != pids[6]
        assert len(set(pids)) == 3
        assert p.restarts["recycled"] == 2
        assert p.restarts["deadline"] == p.restarts["died"] == 0
        futures = [p.submit(t.add, (i, 1), 5) for i in range(40)]
        assert [f.result(timeout=30) for f in futures] == [i + 1 for i in range(40)]
        assert p.restarts["recycled"] == 2 + (7 + 40) // 3 - 2


def test_failed_tasks_count_towards_recycling_and_zero_never_recycles() -> None:
    with DeadlinePool(1, max_pending=8, memory_mb=None, max_tasks=2) as p:
        first = p.submit(t.pid, (), 5).result(timeout=10)
        with pytest.raises(TaskFailed):
            p.submit(t.raise_value_error, (), 5).result(timeout=10)
        assert p.submit(t.pid, (), 5).result(timeout=10) != first
    with DeadlinePool(1, max_pending=8, memory_mb=None) as p:
        assert len({p.submit(t.pid, (), 5).result(timeout=10) for _ in range(20)}) == 1
        assert p.restarts["recycled"] == 0
    with pytest.raises(ValueError, match="max_tasks"):
        DeadlinePool(1, max_tasks=-1)


_POOL_CHILD = """
import multiprocessing.util, sys, time
from verifier.scoring.pool import DeadlinePool
pool = DeadlinePool(1)
print(multiprocessing.util.get_temp_dir(), flush=True)
time.sleep(600)
"""


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # A unix socket's path is at most 107 bytes, and the forkserver's lives in this directory:
    # pytest's tmp_path is too long for it.
    path = Path(tempfile.mkdtemp(prefix="mp", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_killed_verifiers_multiprocessing_dir_is_removed_at_the_next_start(short_tmp) -> None:
    tmp_path = short_tmp
    # Red team: a SIGKILLed replica left its pymp-* directory (the forkserver's socket) in /tmp,
    # and nothing removed it. The pools' process now owns that directory and the next process
    # that starts a pool removes the directories of dead owners (not of live ones).
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(Path(__file__).parents[1])}

    def start() -> tuple[subprocess.Popen, Path]:
        proc = subprocess.Popen([sys.executable, "-c", _POOL_CHILD], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline().strip()
        assert line, proc.stderr.read() if proc.poll() is not None else "no line"
        return proc, Path(line)

    victim, victim_dir = start()
    live, live_dir = start()
    try:
        assert victim_dir.parent == tmp_path and victim_dir.name.startswith(MP_DIR_PREFIX)
        assert not list(tmp_path.glob("pymp-*"))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        assert victim_dir.is_dir()  # nothing ran to remove it
        third, third_dir = start()
        try:
            assert not victim_dir.exists() and live_dir.is_dir() and third_dir.is_dir()
        finally:
            third.kill()
            third.wait(timeout=30)
    finally:
        live.kill()
        live.wait(timeout=30)
        victim.kill()
