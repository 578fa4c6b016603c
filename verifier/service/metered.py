"""Handing items to the Scorer the way a server does: counted in the server's metrics (queue
depth, items by domain and status, latency, the stages' CPU) and logged when not scored.

The gRPC servicer and the HTTP gateway both submit through here, so an item is counted and
logged the same whichever door it came in by.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from verifier.items import Result, Status, VerifierError
from verifier.service.metrics import ServerMetrics
from verifier.scoring.scorer import Scorer


def log_item_error(result: Result, domain: str, logger: logging.Logger) -> None:
    """A structured log line, with the item's id, for results that are not genuine verdicts."""
    if result.status is Status.INTERNAL_ERROR or (
            result.status is Status.SANDBOX_ERROR and not result.detail.startswith("no sandbox")):
        logger.warning("item not scored", extra={"item_id": result.id, "domain": domain,
                                                 "status": result.status.value,
                                                 "detail": result.detail[:500]})


def submit_metered(scorer: Scorer, metrics: ServerMetrics, entry: Any, domain: str,
                   logger: logging.Logger, *, block_s: float = 0.0,
                   cpu_start: float | None = None) -> cf.Future:
    """Submit one item; the returned future's result is the Result, and it gets a ``domain``
    attribute (for the "encode" stage). ``cpu_start``: with it, the "receive" stage is this
    thread's CPU from then to the item's dispatch. Raises what ``Scorer.submit`` raises."""
    metrics.item_started(domain)
    try:
        fut = scorer.submit(entry, block_s=block_s)
    except BaseException:
        metrics.item_finished(domain, None)
        raise
    receive = {} if cpu_start is None else {"receive": time.thread_time() - cpu_start}
    fut.domain = domain  # type: ignore[attr-defined]

    def done(f: cf.Future) -> None:
        # No result: the item was cancelled (its call went away), or the service failed it
        # (VerifierError, e.g. out of descriptors), which its call reports instead of a result.
        err = None if f.cancelled() else f.exception()
        result = None if f.cancelled() or err is not None else f.result()
        metrics.item_finished(domain, result)
        if err is not None:
            logger.warning("item not scored: the service failed", extra={
                "domain": domain, "error": f"{type(err).__name__}: {err}"[:500]})
        if result is not None:
            metrics.observe_costs(domain, {**getattr(f, "costs", {}), **receive})
            log_item_error(result, domain, logger)

    fut.add_done_callback(done)
    return fut


def submit_all(submit: Callable[[Any], cf.Future], entries: Iterable[Any],
               metrics: ServerMetrics, futures: list[cf.Future]) -> list[cf.Future]:
    """``submit`` every entry in order, appending each future to ``futures`` as it is made (a
    caller's cancel-on-disconnect callback may already hold that list). A refusal cancels what
    was submitted, counts a full queue in the metrics, and is raised: a batch is all or
    nothing."""
    try:
        for entry in entries:
            futures.append(submit(entry))
    except VerifierError as e:
        for f in futures:
            f.cancel()
        if e.code == "resource_exhausted":
            metrics.rejected.labels(reason="queue_full").inc()
        raise
    return futures
