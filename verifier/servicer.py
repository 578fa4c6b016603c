"""The gRPC servicer: ``Score``, ``ScoreStream`` and ``ScoreBatchStream`` convert messages and
delegate to the Scorer (verifier/scoring.py); the server around it (ports, the call gate,
health, drain) is verifier/server.py.

VerifierError is the one domain exception; ``abort`` maps it to a gRPC status code, and no
other place in the service chooses status codes (the call gate of verifier/call_gate.py refuses
calls through it too).

The streams: a reader thread per stream takes items (one per ``Item`` message, or each item of
an ``ItemBatch``) against the stream's in-flight bound, counted in items; the call's own thread
writes results back as they finish (one per ``Result`` message, or those ready together in a
``ResultBatch``). A slot is freed when its result is handed to gRPC, so a client that never
reads cannot make results pile up.

An item whose future fails with a VerifierError (the service's own fault: the replica out of
file descriptors, verifier/descriptors.py) is no result: its call ends with that error's code
(UNAVAILABLE); a stream's results written before it stand, and the client re-sends the rest.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent import futures as cf
from typing import Any, Iterator

import grpc

from verifier.call_gate import current_call
from verifier.convert import RETRY_AFTER_KEY, item_from_proto, result_to_proto
from verifier.items import VerifierError, unreadable
from verifier.metered import submit_all, submit_metered
from verifier.metrics import ServerMetrics
from verifier.proto import verifier_pb2 as pb
from verifier.proto import verifier_pb2_grpc as pb_grpc
from verifier.scoring import Scorer

# The service's log lines keep the logger name they had before this module was split off.
log = logging.getLogger("verifier.server")

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
RESULT_BATCH_MAX = 256
"""At most this many results in one ResultBatch (ScoreBatchStream): a busy stream still pays
gRPC's per-message cost rarely."""
RESULT_BATCH_BYTES = 4 * 1024 * 1024
"""A ResultBatch takes no more results once it holds this many bytes (it always holds one), so
no message nears the send limit whatever the results' details hold."""
RESULT_LINGER_S = 0.005
"""How long a ResultBatch waits for more results while the stream has items in flight: at
most this much latency added to a result, against a message per result on a busy stream."""

# The longest a call waits for its items, seconds. A call without a deadline (grpcurl, Node's
# grpc-js) reports ~3.6e11 s remaining, and a timeout that large overflows time_t inside
# concurrent.futures.wait; past a day the wait is unbounded in every practical sense.
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
        """Both streams: ``batched`` reads ItemBatch messages (each item of one counts against
        the in-flight bound on its own) and writes ResultBatch messages holding every result
        that is ready when the writer comes round, or that finishes within RESULT_LINGER_S
        while more are in flight; otherwise a message per item and per result."""
        out: queue.Queue = queue.Queue()
        # Items of this stream accepted and not yet written back. A slot is freed when its
        # result has been handed to gRPC (not when it is computed), so a client that sends but
        # never reads cannot make results pile up here: memory per stream stays bounded.
        slots = threading.BoundedSemaphore(self.stream_inflight)
        live: set[cf.Future] = set()
        lock = threading.Lock()
        reader_state: dict = {"submitted": 0, "error": None}
        reader_done = object()

        # The call gate's record of this stream: it cancels a stream that has nothing being
        # scored and makes no progress (verifier/call_gate.py).
        gated = current_call()

        def on_done(f: cf.Future) -> None:
            with lock:
                live.discard(f)
            gated.item_finished()
            if f.cancelled():
                slots.release()
            else:
                out.put(f)

        def read() -> None:
            # Runs on its own thread so results stream back while items are still arriving.
            try:
                # This thread's CPU per item, from the end of the previous item (so reading
                # and deserializing the message counts) to its dispatch: the "receive" stage.
                mark = time.thread_time()
                for msg in request_iterator:
                    if batched and len(msg.items) > self.max_batch:
                        raise VerifierError(
                            f"a batch of {len(msg.items)} items is over this server's limit "
                            f"of {self.max_batch}; send smaller batches", "invalid_argument")
                    for item in (msg.items if batched else (msg,)):
                        # Backpressure: stop reading this stream while it has too many items
                        # in flight; gRPC's flow control then slows the sender.
                        while not slots.acquire(timeout=0.5):
                            if not context.is_active():
                                return
                        gated.item_started()
                        while True:
                            try:
                                fut = self._submit(item, block_s=0.5, cpu_start=mark)
                                break
                            except VerifierError as e:
                                if e.code != "resource_exhausted" or not context.is_active():
                                    slots.release()
                                    gated.item_finished()
                                    raise
                        with lock:
                            live.add(fut)
                            reader_state["submitted"] += 1
                        fut.add_done_callback(on_done)
                        mark = time.thread_time()
            except VerifierError as e:
                reader_state["error"] = e
            except grpc.RpcError:
                pass  # the client went away; the writer loop notices
            except Exception as e:  # noqa: BLE001 - surface as INTERNAL, keep the server up
                log.exception("stream reader failed", extra={"peer": peer(context)})
                reader_state["error"] = VerifierError(f"stream reader failed: {e}", "internal")
            finally:
                out.put(reader_done)

        threading.Thread(target=read, name="verifier-stream-reader", daemon=True).start()
        emitted = 0
        finished_reading = False
        try:
            while not (finished_reading and emitted == reader_state["submitted"]):
                try:
                    x = out.get(timeout=0.5)
                except queue.Empty:
                    if not context.is_active():
                        return
                    continue
                if x is reader_done:
                    finished_reading = True
                    if reader_state["error"] is not None:
                        abort(context, reader_state["error"])
                    continue
                # "encode": converting the results, and gRPC serializing and writing them on
                # this thread before it asks for the next one (the CPU clock skips waiting);
                # a batch's CPU is shared evenly among its items.
                cpu0 = time.thread_time()
                ready, protos = [x], [result_to_proto(x.result())]
                size = protos[0].ByteSize() if batched else 0  # only a batch is bounded by it
                encode_cpu = time.thread_time() - cpu0
                # A batched stream's message takes every result that is ready, and those that
                # finish within RESULT_LINGER_S while more of the stream's items are in flight:
                # without the wait the writer is faster than the workers and every message
                # holds one result.
                linger_end = time.monotonic() + RESULT_LINGER_S
                while (batched and len(ready) < RESULT_BATCH_MAX and size < RESULT_BATCH_BYTES
                       and not finished_reading):
                    wait = linger_end - time.monotonic()
                    if emitted + len(ready) >= reader_state["submitted"] or wait <= 0:
                        wait = 0.0
                    try:
                        y = out.get(timeout=wait) if wait > 0 else out.get_nowait()
                    except queue.Empty:
                        break
                    if y is reader_done:
                        finished_reading = True  # its error, if any, after these results
                        break
                    cpu0 = time.thread_time()
                    ready.append(y)
                    protos.append(result_to_proto(y.result()))
                    size += protos[-1].ByteSize()
                    encode_cpu += time.thread_time() - cpu0
                emitted += len(ready)
                cpu0 = time.thread_time()
                yield pb.ResultBatch(results=protos) if batched else protos[0]
                share = (encode_cpu + time.thread_time() - cpu0) / len(ready)
                for f in ready:
                    self.metrics.observe_costs(getattr(f, "domain", ""), {"encode": share})
                    slots.release()
                gated.touch()
                if finished_reading and reader_state["error"] is not None:
                    abort(context, reader_state["error"])
        except VerifierError as e:
            # An item the service failed (out of descriptors: verifier/descriptors.py; raised
            # by its ``result()`` above) ends the call with that code (UNAVAILABLE): the
            # results written so far stand, and the client sends the unanswered items again.
            abort(context, e)
        finally:
            with lock:
                pending = list(live)
            for f in pending:
                f.cancel()
