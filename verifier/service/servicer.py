"""The gRPC servicer: ``Score``, ``ScoreStream`` and ``ScoreBatchStream`` convert messages and
delegate to the Scorer (verifier/scoring/scorer.py); the server around it (ports, the call gate,
health, drain) is verifier/service/server.py.

VerifierError is the one domain exception; ``abort`` maps it to a gRPC status code, and no
other place in the service chooses status codes (the call gate of verifier/service/call_gate.py refuses
calls through it too).

The streams (verifier/service/stream.py, ``ItemStream``): a reader thread per stream takes items (one
per ``Item`` message, or each item of an ``ItemBatch``) against the stream's in-flight bound,
counted in items; the call's own thread writes results back as they finish (one per ``Result``
message, or those ready together in a ``ResultBatch``). A slot is freed when its result is
handed to gRPC, so a client that never reads cannot make results pile up.

An item whose future fails with a VerifierError (the service's own fault: the replica out of
file descriptors, verifier/service/descriptors.py) is no result: its call ends with that error's code
(UNAVAILABLE); a stream's results written before it stand, and the client re-sends the rest.
"""

from __future__ import annotations

import logging
import time
from concurrent import futures as cf
from typing import Any, Iterator

import grpc

from verifier.service.call_gate import current_call
from verifier.convert import RETRY_AFTER_KEY, item_from_proto, result_to_proto
from verifier.items import VerifierError, unreadable
from verifier.service.metered import submit_all, submit_metered
from verifier.service.metrics import ServerMetrics
from verifier.proto import verifier_pb2 as pb
from verifier.proto import verifier_pb2_grpc as pb_grpc
from verifier.scoring.scorer import Scorer
from verifier.service.stream import ItemStream

# The service's log lines keep the logger name they had before this module was split off.
log = logging.getLogger("verifier.service.server")

GRPC_CODES = {
    "invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
    "resource_exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "deadline_exceeded": grpc.StatusCode.DEADLINE_EXCEEDED,
    "failed_precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "internal": grpc.StatusCode.INTERNAL,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
}
RETRY_AFTER_MS = 500
"""The retry hint sent with RESOURCE_EXHAUSTED: about the time a 2-worker server needs to
work through a few hundred queued math items."""

# The longest a Score call waits for its items, seconds. A call without a deadline (grpcurl,
# Node's grpc-js) reports ~3.6e11 s remaining, and a timeout that large overflows time_t inside
# concurrent.futures.wait; past a day the wait is unbounded in every practical sense. (A stream
# never waits on its deadline: it polls whether its call is still active, verifier/service/stream.py.)
MAX_CALL_WAIT_S = 86400.0


def _wait_budget(context: grpc.ServicerContext) -> float:
    """The call's remaining time, clamped to what the waiting primitives accept."""
    remaining = context.time_remaining()
    if remaining is None or remaining != remaining:
        return MAX_CALL_WAIT_S
    return max(0.0, min(float(remaining), MAX_CALL_WAIT_S))


def abort(context: grpc.ServicerContext, err: VerifierError) -> None:
    """The one place a domain error becomes a gRPC status."""
    code = GRPC_CODES.get(err.code, grpc.StatusCode.INTERNAL)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        context.set_trailing_metadata(((RETRY_AFTER_KEY, str(RETRY_AFTER_MS)),))
    context.abort(code, str(err))


def _code_name(context: grpc.ServicerContext, default: str) -> str:
    try:
        code = context.code()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - an older grpc without ServicerContext.code()
        code = None
    return code.name if isinstance(code, grpc.StatusCode) else default


def peer(context: grpc.ServicerContext) -> str:
    try:
        return context.peer()
    except Exception:  # noqa: BLE001
        return "?"


class VerifierServicer(pb_grpc.VerifierServicer):
    def __init__(self, scorer: Scorer, stream_inflight: int, max_batch: int,
                 metrics: ServerMetrics | None = None):
        self.scorer = scorer
        self.stream_inflight = stream_inflight
        self.max_batch = max_batch
        self.metrics = metrics or ServerMetrics()

    def _submit(self, msg: pb.Item, block_s: float = 0.0, cpu_start: float | None = None
                ) -> cf.Future:
        """Submit one item; the returned future's result is the Result. Counts it in the
        metrics (queue depth, items by domain and status, latency, the stages' CPU). The
        "receive" stage is this thread's CPU from ``cpu_start`` (default: now) to the item's
        dispatch; the future gets a ``domain`` attribute (for the "encode" stage)."""
        if cpu_start is None:
            cpu_start = time.thread_time()
        try:
            item = item_from_proto(msg)
        except Exception as e:  # noqa: BLE001 - one item never sinks its call
            item = (msg.id, unreadable(e))
        fut = submit_metered(self.scorer, self.metrics, item, msg.domain, log, block_s=block_s,
                             cpu_start=cpu_start)
        return fut

    def _encode(self, fut: cf.Future) -> pb.Result:
        cpu0 = time.thread_time()
        msg = result_to_proto(fut.result())
        self.metrics.observe_costs(getattr(fut, "domain", ""),
                                   {"encode": time.thread_time() - cpu0})
        return msg

    def Score(self, request: pb.ScoreRequest, context: grpc.ServicerContext) -> pb.ScoreResponse:
        start = time.monotonic()
        code = "OK"
        try:
            return self._score(request, context)
        except BaseException:
            code = _code_name(context, "UNKNOWN")
            raise
        finally:
            self.metrics.request_done("Score", code, start)

    def _score(self, request: pb.ScoreRequest, context: grpc.ServicerContext) -> pb.ScoreResponse:
        if len(request.items) > self.max_batch:
            self.metrics.rejected.labels(reason="batch_too_big").inc()
            abort(context, VerifierError(
                f"batch of {len(request.items)} items is over this server's limit of "
                f"{self.max_batch}; split it or use ScoreStream", "resource_exhausted"))
        submitted: list[cf.Future] = []
        # A client that goes away (cancel, deadline) must not leave its items queued.
        context.add_callback(lambda: [f.cancel() for f in submitted])
        try:
            submit_all(self._submit, request.items, self.metrics, submitted)
        except VerifierError as e:
            log.info("batch refused", extra={"peer": peer(context), "items": len(request.items),
                                             "reason": str(e)})
            abort(context, e)
        done, not_done = cf.wait(submitted, timeout=_wait_budget(context))
        if not_done:
            for f in not_done:
                f.cancel()
            abort(context, VerifierError("the call's deadline passed before every item was "
                                          "scored", "deadline_exceeded"))
        try:
            return pb.ScoreResponse(results=[self._encode(f) for f in submitted])
        except VerifierError as e:  # an item the service failed (e.g. out of descriptors)
            abort(context, e)
            raise  # not reached: abort raises

    def ScoreStream(
        self, request_iterator: Iterator[pb.Item], context: grpc.ServicerContext
    ) -> Iterator[pb.Result]:
        yield from self._stream_call("ScoreStream", request_iterator, context, batched=False)

    def ScoreBatchStream(
        self, request_iterator: Iterator[pb.ItemBatch], context: grpc.ServicerContext
    ) -> Iterator[pb.ResultBatch]:
        yield from self._stream_call("ScoreBatchStream", request_iterator, context, batched=True)

    def _stream_call(self, method: str, request_iterator: Iterator[Any],
                     context: grpc.ServicerContext, batched: bool) -> Iterator[Any]:
        start = time.monotonic()
        code = "OK"
        self.metrics.active_streams.inc()
        try:
            yield from self._score_stream(request_iterator, context, batched)
        except GeneratorExit:
            code = "CANCELLED"
            raise
        except BaseException:
            code = _code_name(context, "UNKNOWN")
            raise
        finally:
            self.metrics.active_streams.dec()
            if code == "OK" and not context.is_active():
                code = "CANCELLED"
            self.metrics.request_done(method, code, start)

    def _score_stream(
        self, request_iterator: Iterator[Any], context: grpc.ServicerContext, batched: bool
    ) -> Iterator[Any]:
        """Both streams: the loop is verifier/service/stream.py's ItemStream; here it gets the call's
        parts, and the VerifierError that ends it becomes the call's status."""
        stream = ItemStream(
            submit=self._submit, metrics=self.metrics, inflight=self.stream_inflight,
            max_batch=self.max_batch, batched=batched, is_active=context.is_active,
            peer=peer(context),
            # Read on this, the handler thread: the gate's record of the call is a context
            # variable, which the stream's reader thread would not see.
            gated=current_call())
        try:
            yield from stream.run(request_iterator)
        except VerifierError as e:
            abort(context, e)
