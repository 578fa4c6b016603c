"""The scoring engine behind the gRPC service and the embedded ``verifier check``.

It routes each item to its domain's pure scorer and turns whatever happens into exactly one
Result per item: math runs in the DeadlinePool's worker processes (a hard deadline per item),
code runs in sandboxed processes started from a bounded thread pool (the sandbox enforces the
program's limits), the one set of jail slots of the replica (the HTTP gateway's ``/run_code``
runs take them too, through ``submit_run``). One item's failure never touches another item's
result. A fault of the service itself (out of file descriptors: verifier/service/descriptors.py) is no
item's result: the item's future fails with VerifierError("unavailable") and its call says so.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import CancelledError, Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Iterable, TypeVar

from sandbox import (JailRequest, Sandbox, SandboxKind, SandboxUnavailable, PreloadedEntry,
                     create_sandbox, plan_jails)
from verifier.items import (Item, Limits, Outcome, Result, Status, VerifierError, unreadable,
                            validate_item)
from verifier.scoring.code_score import MIN_MEMORY_MB, score_code
from verifier.harness import harness_source
from verifier.scoring.harness_files import HARNESS_FILE, HARNESS_PYC
from verifier.scoring.math_score import quick_verdict, score_math
from verifier.scoring.pool import TASK_CPU, DeadlineExceeded, DeadlinePool, TaskFailed, WorkerDied
from verifier.config import ScoringConfig
from verifier.scoring.profiles import Profile, get_profile, output_cap

log = logging.getLogger(__name__)
T = TypeVar("T")

def _preload_modules() -> tuple[str, ...]:
    # Imported once in the forkserver so each (re)started worker begins warm. (One forkserver
    # serves both pools: multiprocessing keeps one per process.)
    return ("verifier.scoring.math_worker", "verifier.scoring.output_compare", "verifier.data.ground_truth")


def _math_task(response: str, ground_truth: Any, limits: Limits, profile: str) -> Outcome:
    return score_math(response, ground_truth, limits, get_profile(profile))


def jail_request(config: ScoringConfig, at_once: int) -> JailRequest:
    """What the service asks of its sandbox's jails: ``at_once`` runs in flight (its code
    slots), ``--forkserver`` serving the judge's harness, ``--warm-jails``. The sandbox chooses
    how to start them (``sandbox.plan_jails``)."""
    return JailRequest(at_once=at_once, forkserver=config.forkserver, warm=config.warm_jails,
                       entry=PreloadedEntry((HARNESS_PYC, HARNESS_FILE), harness_source()))


def use_forkserver(config: ScoringConfig) -> bool:
    """Whether the harness's jails are forked from a zygote (``--forkserver``): "auto" is on
    with nsjail, as root, unless pre-started jails are asked for (``--warm-jails``). A
    contradiction is refused, naming the options (``sandbox.plan_jails`` decides)."""
    return plan_jails(config.sandbox, jail_request(config, 1)).forkserver


class Scorer:
    """Scores items; ``submit`` returns a Future[Result] and never raises for a bad item.

    The returned future carries ``costs``: a dict of the item's measured costs (seconds, the
    stages of verifier/service/metrics.py STAGES and ``queue_wait``), complete when the result is set
    (docs/verifier.md 3). It is a side channel for metrics and benchmarks: never part of the
    Result."""

    def __init__(self, config: ScoringConfig, sandbox: Sandbox | None = None):
        if config.max_output_mb < 1:
            raise ValueError(f"max_output_mb must be at least 1, got {config.max_output_mb}")
        self.config = config
        self._profiles: dict[str, Profile] = {}
        self._pool = DeadlinePool(
            config.workers,
            max_pending=config.max_pending,
            memory_mb=config.worker_memory_mb,
            preload=_preload_modules(),
            max_tasks=config.worker_max_tasks,
        )
        # Comparing a program's output with the expected one: in worker processes under a
        # deadline, never on the server's threads (a program chooses its output: a hash-flooded
        # set, millions of numbers). One per code thread, so a comparison never queues.
        code_slots = config.code_concurrency or config.workers
        # How the jails start (forkserver, pre-started, cold) is the sandbox's choice; a
        # contradiction in the options is refused here, before the sandbox starts, and with a
        # sandbox passed in alike (``plan_jails``, ValueError naming the options).
        request = jail_request(config, code_slots)
        planned = plan_jails(config.sandbox, request)
        self._compare_pool = DeadlinePool(
            code_slots,
            max_pending=code_slots,
            memory_mb=config.worker_memory_mb,
            preload=_preload_modules(),
            max_tasks=config.worker_max_tasks,
        )
        # The replica's jail slots: each code item and each /run_code run (``submit_run``)
        # holds one thread while its jail runs, so no more than code_slots jails run at once.
        self._code_threads = ThreadPoolExecutor(
            max_workers=code_slots, thread_name_prefix="verifier-code"
        )
        # Bounds the code items and runs accepted but not finished, like the math pool's queue.
        self._code_slots = threading.BoundedSemaphore(config.max_pending + code_slots)
        self.sandbox = sandbox
        self.sandbox_problem: str | None = None
        # A sandbox this Scorer opened is its to close (close() kills its running jails); one
        # passed in (tests share one) is the caller's.
        self._owns_sandbox = sandbox is None
        if sandbox is None:
            options: dict[str, Any] = {}
            if config.sandbox == "docker":
                options["image"] = config.docker_image
            self.sandbox, self.sandbox_problem = open_sandbox(config.sandbox, jails=request,
                                                              **options)
        # What the sandbox got (one passed in was set up by its caller).
        starts = self.sandbox.starts if self.sandbox is not None else planned
        self.forkserver, self.warm_per_key = starts.forkserver, starts.warm_per_key
        self._closed = False
        shortfall = self.sandbox.capacity.shortfall(code_slots) if self.sandbox else None
        if shortfall is not None:
            # Every concurrent jail needs what the sandbox has a bounded number of (nsjail: an
            # outside uid, sandbox/uidpool.py): with fewer, runs would wait for one and then
            # fail with SANDBOX_ERROR.
            self.close()
            raise ValueError(f"code concurrency {shortfall} or lower --code-concurrency / "
                             "--warm-jails")
        self._closed = False

    # -- public -------------------------------------------------------------------------
    def submit(self, item: Item | tuple[str, Outcome], block_s: float = 0.0) -> Future:
        """Start scoring one item. ``item`` may be an ``(id, Outcome)`` pair for an item that
        already failed validation. Raises VerifierError("resource_exhausted") only when the
        queue is full (after waiting up to ``block_s``)."""
        start = time.monotonic()
        if isinstance(item, tuple):
            item_id, outcome = item
            return _done(Result.from_outcome(item_id, outcome, Limits(), 0.0))
        try:
            problem = validate_item(item) or self._check_limits(item.limits)
            if problem is not None:
                return _done(Result.from_outcome(item.id, problem, item.limits, 0.0,
                                                 item.data_source))
            profile = self._profile(item.profile)
            if item.domain == "math":
                return self._submit_math(item, profile, start, block_s)
            return self._submit_code(item, profile, start, block_s)
        except VerifierError:
            raise  # the queue is full: the caller's to handle (backpressure), not the item's
        except Exception as e:  # noqa: BLE001 - one item must never sink its batch or stream
            # Everything above runs on the caller's thread (a gRPC handler) before the item is
            # queued; an exception here (a RecursionError on a freak ground truth, ...) would
            # otherwise fail the whole call. It is this item's INVALID_INPUT.
            log.warning("item could not be read", extra={"item_id": item.id,
                                                         "error": f"{type(e).__name__}: {e}"})
            return _done(Result.from_outcome(item.id, unreadable(e), Limits(), 0.0,
                                             getattr(item, "data_source", "")))

    def score(self, items: Iterable[Item | tuple[str, Outcome]]) -> list[Result]:
        """Score a batch in order (blocking; waits for queue room instead of failing)."""
        futures = [self.submit(it, block_s=3600.0) for it in items]
        return [f.result() for f in futures]

    @property
    def pending(self) -> int:
        return self._pool.pending

    @property
    def worker_restarts(self) -> dict[str, int]:
        """Worker processes killed and replaced, by reason, over both pools."""
        return {k: n + self._compare_pool.restarts.get(k, 0) for k, n in self._pool.restarts.items()}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_sandbox and self.sandbox is not None:
            # First: SIGKILL the jails still running (a drain past its grace), so the code
            # threads below return at once instead of after a program's whole budget (up to
            # 300 s under lcb); their items end as SANDBOX_ERROR for calls already gone.
            self.sandbox.close()
        self._pool.shutdown()
        self._compare_pool.shutdown()
        self._code_threads.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------
    def _run_compare(self, fn: Any, args: tuple, deadline_s: float) -> Any:
        """``score_code``'s ``run_bounded``: one comparison in the compare pool. Called from a
        code thread, which only waits (the GIL stays with the server's threads)."""
        return self._compare_pool.submit(fn, args, deadline_s, block_s=deadline_s).result()

    def _check_limits(self, limits: Limits) -> Outcome | None:
        """Server-side upper bounds of the per-item limits (the lower ones are the item's
        validation)."""
        for name in ("timeout_s", "test_timeout_s"):
            v = getattr(limits, name)
            # NaN passes every comparison (the wire's "< 0" and the "> maximum" below alike):
            # it reached the sandbox and the math pool as a deadline and came back as
            # SANDBOX_ERROR / INTERNAL_ERROR, the verifier blamed for a bad item.
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                return Outcome(
                    Status.INVALID_INPUT,
                    f"limits.{name}={v!r} must be a finite positive number of seconds",
                )
            if v is not None and v > self.config.max_timeout_s:
                return Outcome(
                    Status.INVALID_INPUT,
                    f"limits.{name}={v:g} s is over this server's maximum of "
                    f"{self.config.max_timeout_s:g} s",
                )
        if limits.memory_mb is not None and limits.memory_mb < MIN_MEMORY_MB:
            # Below it the judge's own harness cannot start, and a correct program would get
            # RUNTIME_ERROR: a genuine-looking zero for what is the caller's mistake.
            return Outcome(
                Status.INVALID_INPUT,
                f"limits.memory_mb={limits.memory_mb} MiB is under this server's minimum of "
                f"{MIN_MEMORY_MB} MiB (the judge's harness needs it)",
            )
        if limits.memory_mb is not None and limits.memory_mb > self.config.max_memory_mb:
            return Outcome(
                Status.INVALID_INPUT,
                f"limits.memory_mb={limits.memory_mb} MiB is over this server's maximum of "
                f"{self.config.max_memory_mb} MiB",
            )
        return None

    def _submit_math(self, item: Item, profile: Profile, start: float, block_s: float) -> Future:
        limits = item.limits.with_defaults(timeout_s=self.config.math_timeout_s)
        # Items that need no sympy (no answer, bad gold, integer vs integer: most RL math) are
        # judged here, by the same code score_math starts with: it is bounded and parser-free,
        # so it is safe on this thread, and it spares the item a worker round trip.
        quick = quick_verdict(item.response, item.ground_truth, profile)
        if quick is not None:
            return _done(_result(item, quick, limits, start, profile))
        out: Future = Future()
        out.costs = {}  # type: ignore[attr-defined]
        inner = self._pool.submit(
            _math_task,
            (item.response, item.ground_truth, limits, profile.name),
            limits.timeout_s,
            block_s,
        )

        def finish(f: Future) -> None:
            c = f.costs  # type: ignore[attr-defined]
            out.costs.update(  # type: ignore[attr-defined]
                {"scoring": c[TASK_CPU], "worker_ipc": c["worker_ipc"],
                 "pool_supervisor": c["supervisor"], "queue_wait": c["queue_wait"]}
                if TASK_CPU in c else {k: v for k, v in c.items() if k == "queue_wait"})
            try:
                outcome = f.result()
            except CancelledError:
                out.cancel()
                return
            except VerifierError as e:
                # The service's fault (no worker could start: out of descriptors): the
                # caller's error (UNAVAILABLE), never a verdict on the item.
                _fail(out, e)
                return
            except DeadlineExceeded as e:
                outcome = Outcome(Status.TIMEOUT, str(e))
            except TaskFailed as e:
                if e.kind == "MemoryError":
                    outcome = Outcome(Status.MEMORY_LIMIT, f"evaluating the answer: {e}")
                else:
                    log.error("math scorer failed", extra={"item_id": item.id, "error": str(e)})
                    outcome = Outcome(Status.INTERNAL_ERROR, f"math scorer failed: {e}")
            except WorkerDied as e:
                log.error("math worker died", extra={"item_id": item.id, "error": str(e)})
                outcome = Outcome(Status.INTERNAL_ERROR, str(e))
            except Exception as e:  # noqa: BLE001 - one result per item, whatever happened
                outcome = Outcome(Status.INTERNAL_ERROR, f"{type(e).__name__}: {e}")
            try:
                out.set_result(_result(item, outcome, limits, start, profile))
            except InvalidStateError:
                pass  # the call went away and cancelled ``out`` while the worker finished

        # Cancelling the outer future (an RPC that went away) cancels the queued inner task.
        out.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)
        inner.add_done_callback(finish)
        return out

    def _profile(self, name: str) -> Profile:
        """The profile an item names ("" = the server's default), with its output cap as this
        server allows (:func:`verifier.scoring.profiles.output_cap`). KeyError for an unknown name."""
        profile = get_profile(name, self.config.profile)
        capped = self._profiles.get(profile.name)
        if capped is None:
            cap = output_cap(profile, self.config.max_output_mb)
            capped = self._profiles[profile.name] = replace(profile, output_bytes=cap)
        return capped

    def _submit_code(self, item: Item, profile: Profile, start: float, block_s: float) -> Future:
        if self.sandbox is None:
            return _done(
                _result(
                    item,
                    Outcome(Status.SANDBOX_ERROR, f"no sandbox: {self.sandbox_problem}"),
                    item.limits,
                    start,
                    profile,
                )
            )
        self._take_code_slot(block_s, "code items")
        sandbox = self.sandbox
        costs: dict[str, float] = {}
        queued_at = time.monotonic()

        def run() -> Result:
            costs["queue_wait"] = time.monotonic() - queued_at
            cpu0 = time.thread_time()
            try:
                outcome = score_code(
                    item.response,
                    item.ground_truth,
                    item.limits,
                    sandbox,
                    self._run_compare,
                    profile,
                    costs,
                )
            except VerifierError:
                # The service's fault (out of descriptors: verifier/service/descriptors.py): the
                # future fails with it and the call reports it (UNAVAILABLE, HTTP 503); it is
                # never this item's verdict.
                raise
            except Exception as e:  # noqa: BLE001 - score_code should not raise; if it does,
                # the item says so instead of the whole batch failing.
                log.exception("code scorer failed", extra={"item_id": item.id})
                outcome = Outcome(Status.INTERNAL_ERROR, f"code scorer failed: {type(e).__name__}: {e}")
            costs["judge"] = time.thread_time() - cpu0
            return _result(item, outcome, item.limits, start, profile)

        fut = self._on_code_thread(run)
        fut.costs = costs  # type: ignore[attr-defined]
        return fut

    def _take_code_slot(self, block_s: float, what: str) -> None:
        """A place in the code queue (waiting up to ``block_s``), or
        VerifierError("resource_exhausted") naming ``what`` is queued."""
        if block_s > 0:
            acquired = self._code_slots.acquire(timeout=block_s)
        else:
            acquired = self._code_slots.acquire(blocking=False)
        if not acquired:
            raise VerifierError(
                f"verifier busy: {self.config.max_pending} {what} already queued; retry later",
                "resource_exhausted",
            )

    def _on_code_thread(self, fn: Callable[..., T], *args: Any) -> "Future[T]":
        """``fn(*args)`` on a code thread, after ``_take_code_slot``: the place is given back
        when it ends (or at once, when the executor refuses it)."""
        try:
            fut = self._code_threads.submit(fn, *args)
        except BaseException:
            self._code_slots.release()
            raise
        fut.add_done_callback(lambda _f: self._code_slots.release())
        return fut

    def submit_run(self, fn: Callable[..., T], *args: Any) -> "Future[T]":
        """Run ``fn(*args)``, one jail's work, on a code thread: in the same slots as the code
        items (``--code-concurrency``) and counted in the same queue bound, so every jail of
        this replica is bounded by that one number (the HTTP gateway's ``/run_code`` comes
        here). Raises VerifierError("resource_exhausted") when the queue is full and
        VerifierError("unavailable") once the Scorer is closed."""
        self._take_code_slot(0.0, "code items and runs")
        try:
            return self._on_code_thread(fn, *args)
        except RuntimeError:  # shut down: the server is stopping
            raise VerifierError("the verifier is stopping", "unavailable") from None


def _result(
    item: Item, outcome: Outcome, limits: Limits, start: float, profile: Profile
) -> Result:
    elapsed_ms = (time.monotonic() - start) * 1000.0
    return Result.from_outcome(
        item.id, outcome, limits, elapsed_ms, item.data_source, profile.name
    )


def _fail(out: Future, err: Exception) -> None:
    try:
        out.set_exception(err)
    except InvalidStateError:
        pass  # the call went away and cancelled ``out`` meanwhile


def _done(result: Result) -> Future:
    f: Future = Future()
    f.costs = {}  # type: ignore[attr-defined]
    f.set_result(result)
    return f


def open_sandbox(kind: SandboxKind, **options: Any) -> tuple[Sandbox | None, str | None]:
    """Create the sandbox and run its self-test. Returns ``(sandbox, None)`` or
    ``(None, why)``: with no working sandbox the service still scores math and answers every
    code item with SANDBOX_ERROR naming the reason (never an unsandboxed run)."""
    try:
        sb = create_sandbox(kind, **options)  # runs the self-test, once
    except SandboxUnavailable as e:
        log.error("sandbox self-test failed; code items will get SANDBOX_ERROR",
                  extra={"sandbox": kind, "reason": str(e)})
        return None, f"{kind} sandbox failed its self-test: {e}"
    return sb, None
