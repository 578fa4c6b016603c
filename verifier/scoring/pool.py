"""Worker processes that run one task at a time under a hard wall-clock deadline.

Why processes, and why not ``concurrent.futures.ProcessPoolExecutor``: math-verify's own timeouts
use SIGALRM, which works only on a process's main thread, and a big-integer power or factorial in
C code ignores signals until it returns. The only deadline that always holds is killing the
process. ProcessPoolExecutor cannot kill one worker (a dead worker breaks the whole executor), so
this pool gives every worker its own supervisor thread: the thread sends a task down a pipe,
waits on the pipe with the task's deadline, and on overrun SIGKILLs and replaces that one worker.
Other items keep flowing through the other workers meanwhile.

Workers start from a ``forkserver`` that has already imported (and warmed up) the scoring
modules, so replacing a killed worker costs a fork, not a fresh interpreter and sympy import.
The forkserver is a clean process started by exec: the gRPC server's threads are never forked.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import resource
import signal
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable

from sandbox import OwnedDir, sweep_dead
from verifier.service.descriptors import fd_shortage, unavailable
from verifier.items import VerifierError

log = logging.getLogger(__name__)


class DeadlineExceeded(Exception):
    """The task ran past its deadline; its worker was killed and replaced."""

    def __init__(self, deadline_s: float):
        super().__init__(f"scoring took longer than its {deadline_s:g} s deadline; worker killed")
        self.deadline_s = deadline_s


class WorkerDied(Exception):
    """The worker process died while running the task (killed by a signal, or crashed)."""


class TaskFailed(Exception):
    """The task raised inside the worker. ``kind`` is the exception's class name."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass
class _Task:
    fn: Callable[..., Any]
    args: tuple
    deadline_s: float
    future: Future
    queued_at: float = 0.0


TASK_CPU = "task"
"""Keys of a finished future's ``costs`` (seconds): ``task``, the worker's CPU in the task
itself; ``worker_ipc``, the worker's CPU receiving and sending it (unpickling, pickling);
``supervisor``, the supervisor thread's CPU sending it and reading the reply; ``queue_wait``,
wall time between ``submit`` and a worker taking it (docs/verifier.md 3)."""


_STOP = object()


def _worker_main(conn: Connection, memory_mb: int | None) -> None:
    """Body of a worker process: receive ``(fn, args)``, send back ``("ok", value)`` or
    ``("err", kind, message)``. Runs on the process's main thread, so SIGALRM-based timeouts
    inside the scoring libraries work."""
    # Ctrl-C in a terminal reaches the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if memory_mb:
        # A memory bomb (a 10^8-digit integer, say) must fail here with MemoryError, not take
        # the machine's memory from the other workers and the server.
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    loop_start = time.thread_time()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, args = msg
        # The cost breakdown (docs/verifier.md 3): CPU of the task itself, and of this loop's
        # receive/send around it, carried back after the reply (one small extra message).
        t0 = time.thread_time()
        try:
            reply: tuple = ("ok", fn(*args))
        except MemoryError:
            reply = ("err", "MemoryError", f"worker memory limit of {memory_mb} MiB exceeded")
        except BaseException as e:  # noqa: BLE001 - report every failure to the parent
            reply = ("err", type(e).__name__, str(e)[:500])
        t1 = time.thread_time()
        task_s, loop_s, loop_start = t1 - t0, t1 - loop_start, t1  # this send counts next time
        try:
            conn.send(reply + (task_s, loop_s - task_s))
        except (BrokenPipeError, OSError):
            return


class _Slot:
    """One worker process and the supervisor thread that owns it."""

    def __init__(self, pool: "DeadlinePool", index: int):
        self.pool = pool
        self.index = index
        self.proc: multiprocessing.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self.tasks_done = 0  # tasks the current process has answered
        self.thread = threading.Thread(
            target=self._supervise, name=f"verifier-worker-{index}", daemon=True
        )

    def start_process(self) -> None:
        parent, child = self.pool._ctx.Pipe(duplex=True)
        proc = self.pool._ctx.Process(
            target=_worker_main,
            args=(child, self.pool.memory_mb),
            name=f"verifier-worker-{self.index}",
            daemon=True,
        )
        proc.start()
        child.close()
        self.proc, self.conn = proc, parent
        self.tasks_done = 0

    def kill_process(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(timeout=5)
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn = None, None

    def _replace(self) -> None:
        """Start the replacement worker now, after the failed task's caller has its answer, so
        the slot is warm for the next task (and pids() lists it)."""
        if self.pool._closed:
            return
        try:
            self.start_process()
        except OSError as e:  # retried lazily when the next task arrives
            log.error("could not start a replacement worker", extra={"error": str(e)})

    def _supervise(self) -> None:
        while True:
            task = self.pool._queue.get()
            if task is _STOP:
                break
            assert isinstance(task, _Task)
            if not task.future.set_running_or_notify_cancel():
                continue  # the caller gave up on it (a cancelled RPC) before it started
            self._run(task)
        self.stop_process()

    def stop_process(self) -> None:
        if self.conn is not None:
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        if self.proc is not None:
            self.proc.join(timeout=2)
        self.kill_process()

    def _run(self, task: _Task) -> None:
        costs = task.future.costs  # type: ignore[attr-defined]
        costs["queue_wait"] = time.monotonic() - task.queued_at
        cpu0 = time.thread_time()
        try:
            if self.proc is None or not self.proc.is_alive():
                try:
                    self.start_process()
                except OSError as e:
                    if not fd_shortage(e):
                        raise
                    # Out of descriptors: the replica's state, not the task's; its caller
                    # reports it as the service's fault (verifier/service/descriptors.py).
                    self.kill_process()
                    task.future.set_exception(unavailable("starting a worker process", e))
                    return
            assert self.conn is not None
            self.conn.send((task.fn, task.args))
            # The hard deadline: wait on the pipe for at most deadline_s, measured from the
            # moment the worker got the task (queueing time does not count against the item).
            if self.conn.poll(task.deadline_s):
                reply = self.conn.recv()
            else:
                self.pool._count_restart("deadline")
                self.kill_process()
                task.future.set_exception(DeadlineExceeded(task.deadline_s))
                self._replace()
                return
        except (EOFError, OSError) as e:
            code = None
            if self.proc is not None:
                self.proc.join(timeout=2)  # reap it, so its exit code says how it died
                code = self.proc.exitcode
            self.pool._count_restart("died")
            self.kill_process()
            if code is None or code == 0:
                why = f"worker process lost ({type(e).__name__})"
            elif code < 0:
                why = f"worker process killed by signal {-code}"
            else:
                why = f"worker process exited with code {code}"
            task.future.set_exception(WorkerDied(why))
            self._replace()
            return
        except Exception as e:  # noqa: BLE001 - e.g. an unpicklable task: fail it, keep serving
            task.future.set_exception(e)
            return
        costs["supervisor"] = time.thread_time() - cpu0
        costs[TASK_CPU], costs["worker_ipc"] = reply[-2], reply[-1]
        if reply[0] == "ok":
            task.future.set_result(reply[1])
        else:
            task.future.set_exception(TaskFailed(reply[1], reply[2]))
        self.tasks_done += 1
        if self.pool.max_tasks and self.tasks_done >= self.pool.max_tasks:
            self._recycle()

    def _recycle(self) -> None:
        """Replace a worker that has run ``max_tasks`` tasks by a fresh fork of the forkserver,
        after its last caller has the answer. Why: a worker lives as long as the server and
        accumulates what no task frees (sympy's and the parsers' caches, holes in glibc's heap):
        the 60-minute soak saw the workers grow +4.5 MB/hour while the server's own process,
        after verifier/service/allocator.py, grew +2.1. A fork costs milliseconds, once per
        ``max_tasks`` tasks; the new worker starts from the forkserver's warm imports."""
        self.pool._count_restart("recycled")
        self.stop_process()
        self._replace()


MP_DIR_PREFIX = "magic-verifier-mp-"
"""multiprocessing's temporary directory of a verifier process (its forkserver's socket)."""
_mp_dir: OwnedDir | None = None
_mp_dir_lock = threading.Lock()


def _own_multiprocessing_tempdir() -> None:
    """Point multiprocessing's temporary directory (``pymp-*`` by default, where the
    forkserver's socket lives) at a directory this process owns (sandbox/scratch.py), once per
    process, after removing those of dead predecessors: a SIGKILLed replica runs no cleanup,
    and its ``pymp-*`` directory would stay in /tmp forever. ``util.get_temp_dir`` reads the
    process's ``_config["tempdir"]`` (CPython 3.8-3.13); where that is missing, multiprocessing
    keeps its own directory."""
    global _mp_dir
    with _mp_dir_lock:
        if _mp_dir is not None:
            return
        config = getattr(multiprocessing.process.current_process(), "_config", None)
        if not isinstance(config, dict):
            return
        sweep_dead(MP_DIR_PREFIX)
        owned = OwnedDir(MP_DIR_PREFIX)
        # The forkserver's socket is <dir>/listener-XXXXXXXX, and a unix socket's path has at
        # most 107 bytes: under a long TMPDIR keep multiprocessing's shorter pymp-* name.
        if len(owned.path.encode()) + len("/listener-XXXXXXXX") > 100:
            owned.remove()
            return
        _mp_dir = owned
        config["tempdir"] = owned.path


class DeadlinePool:
    """A fixed number of worker processes; each task runs under a hard deadline.

    ``submit`` never blocks the caller for long: the queue of waiting tasks is bounded, and a
    full queue raises ``VerifierError(code="resource_exhausted")`` (or waits up to
    ``block_s`` when asked, for streaming callers that apply backpressure instead).
    """

    def __init__(
        self,
        workers: int,
        *,
        max_pending: int = 4096,
        memory_mb: int | None = 2048,
        preload: tuple[str, ...] = (),
        max_tasks: int = 0,
    ):
        """``max_tasks``: tasks a worker process answers before it is replaced by a fresh one
        (0: never)."""
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if max_tasks < 0:
            raise ValueError(f"max_tasks must be 0 (never recycle) or more, got {max_tasks}")
        self.workers = workers
        self.max_tasks = max_tasks
        self.memory_mb = memory_mb
        _own_multiprocessing_tempdir()
        self._ctx = multiprocessing.get_context("forkserver")
        if preload:
            self._ctx.set_forkserver_preload(list(preload))
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._lock = threading.Lock()
        self.restarts: dict[str, int] = {"deadline": 0, "died": 0, "recycled": 0}
        self._closed = False
        self._slots = [_Slot(self, i) for i in range(workers)]
        for slot in self._slots:
            slot.start_process()
            slot.thread.start()

    def _count_restart(self, why: str) -> None:
        with self._lock:
            self.restarts[why] += 1
        if why == "recycled":  # routine, not a fault
            log.debug("recycling a worker process", extra={"reason": why})
        else:
            log.warning("replacing a worker process", extra={"reason": why})

    @property
    def pending(self) -> int:
        """Tasks waiting for a worker (not counting those running)."""
        return self._queue.qsize()

    def submit(
        self, fn: Callable[..., Any], args: tuple, deadline_s: float, block_s: float = 0.0
    ) -> Future:
        """Queue ``fn(*args)`` (a picklable top-level function) to run in a worker within
        ``deadline_s`` seconds of starting. The future raises DeadlineExceeded, WorkerDied or
        TaskFailed on failure. Its ``costs`` dict holds the task's measured costs (TASK_CPU) once it is done."""
        if self._closed:
            raise VerifierError("the scoring pool is shut down", "unavailable")
        fut: Future = Future()
        fut.costs = {}  # type: ignore[attr-defined]  # filled before the result is set
        task = _Task(fn, args, float(deadline_s), fut, time.monotonic())
        try:
            if block_s > 0:
                self._queue.put(task, timeout=block_s)
            else:
                self._queue.put_nowait(task)
        except queue.Full:
            raise VerifierError(
                f"verifier busy: {self._queue.maxsize} items already queued; retry later",
                "resource_exhausted",
            ) from None
        return fut

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop accepting tasks, let running ones finish (each is bounded by its deadline),
        cancel those still queued, and stop the worker processes."""
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                task = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(task, _Task):
                task.future.cancel()
        for _ in self._slots:
            self._queue.put(_STOP)
        end = time.monotonic() + timeout_s
        for slot in self._slots:
            slot.thread.join(timeout=max(0.0, end - time.monotonic()))
            if slot.thread.is_alive():
                slot.kill_process()

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self._slots if s.proc is not None and s.proc.pid is not None]

    def __enter__(self) -> "DeadlinePool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

