"""One scoring stream (``ScoreStream``, ``ScoreBatchStream``) as the servicer runs it: items
read in on a thread of their own, handed to the Scorer against the stream's in-flight bound,
and their results written back on the call's thread as they finish. The servicer
(verifier/service/servicer.py) builds an ``ItemStream`` per call and turns the VerifierError it raises
into the call's status; nothing here chooses a status code.

Three kinds of thread touch a stream, and every hazard below is between them:

- the call's handler thread (gRPC's) runs ``run``: it writes the results and, when the call
  ends however it ends, cancels the items still being scored;
- the reader thread runs ``_read``: it blocks on the client's next message and on the
  in-flight bound (``_take_slot``), and submits each item;
- the scorer's threads (a pool's supervisor, a code thread, or the reader itself for an item
  judged inline) finish the futures and run ``_on_done``.

Neither blocking wait can be interrupted by gRPC when the call ends (client gone, cancelled by
the call gate, deadline passed), so both poll ``is_active`` every ``POLL_S``: a stream
notices its call is over within that time.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent import futures as cf
from typing import Any, Callable, Iterable, Iterator, Protocol

import grpc

from verifier.convert import result_to_proto
from verifier.items import VerifierError
from verifier.service.metrics import ServerMetrics
from verifier.proto import verifier_pb2 as pb

# The service's log lines keep the logger name they had before this module was split off.
log = logging.getLogger("verifier.service.server")

RESULT_BATCH_MAX = 256
"""At most this many results in one ResultBatch (ScoreBatchStream): a busy stream still pays
gRPC's per-message cost rarely."""
RESULT_BATCH_BYTES = 4 * 1024 * 1024
"""A ResultBatch takes no more results once it holds this many bytes (it always holds one), so
no message nears the send limit whatever the results' details hold."""
RESULT_LINGER_S = 0.005
"""How long a ResultBatch waits for more results while the stream has items in flight: at
most this much latency added to a result, against a message per result on a busy stream."""
POLL_S = 0.5
"""How often a blocked wait of a stream (the writer for a result, the reader for a slot or for
room in the Scorer's queue) looks whether its call is still active."""

# What the reader puts on the result queue when it stops reading, however it stops.
_READER_DONE = object()

# Submits one Item message: (message, block_s, cpu_start) -> the future of its Result, with a
# ``domain`` attribute (VerifierServicer._submit). Raises VerifierError when refused.
Submit = Callable[..., cf.Future]


class Progress(Protocol):
    """What a stream tells the call gate (verifier/service/call_gate.py: ``GatedCall``) about itself:
    the gate cancels a stream that has nothing being scored and makes no progress."""

    def touch(self) -> None: ...

    def item_started(self) -> None: ...

    def item_finished(self) -> None: ...


class ItemStream:
    """One stream call. ``batched``: the client sends ItemBatch messages (each of their items
    counts against the in-flight bound on its own) and gets ResultBatch messages holding every
    result that is ready when the writer comes round, or that finishes within RESULT_LINGER_S
    while more are in flight; otherwise a message per item and per result.

    ``run`` is used once; it raises VerifierError for the call to end with (a refused or
    malformed message, a reader that failed, an item the service failed), after the results
    already written."""

    def __init__(self, *, submit: Submit, metrics: ServerMetrics, inflight: int, max_batch: int,
                 batched: bool, is_active: Callable[[], bool], peer: str, gated: Progress):
        self._submit = submit
        self._metrics = metrics
        self._max_batch = max_batch
        self._batched = batched
        self._is_active = is_active
        self._peer = peer
        # The gate's record of this call. The servicer reads it on the handler thread: it is a
        # context variable, which the reader thread (a plain thread) would not see.
        self._gated = gated
        # Finished futures (and _READER_DONE), from the scorer's threads and the reader to the
        # writer. Unbounded, but never holds more than ``inflight`` futures: see _slots.
        self._out: queue.Queue = queue.Queue()
        # Items of this stream accepted and not yet written back. A slot is freed when its
        # result has been handed to gRPC (not when it is computed), so a client that sends but
        # never reads cannot make results pile up here: memory per stream stays bounded.
        self._slots = threading.BoundedSemaphore(inflight)
        # Futures submitted and not yet finished, for ``_cancel_pending``. Changed by the reader
        # and the scorer's threads, read by the handler thread: always under _lock.
        self._live: set[cf.Future] = set()
        self._lock = threading.Lock()
        # Written by the reader only. ``_submitted`` is also read, unlocked, by the writer (one
        # int: a read sees a whole value); ``_error`` is read by the writer only after it has
        # taken _READER_DONE off the queue, which the reader puts after setting it.
        self._submitted = 0
        self._error: VerifierError | None = None
        # The writer's own (handler thread only).
        self._emitted = 0
        self._finished_reading = False

    # -- the handler thread: writing ----------------------------------------------------------
    def run(self, requests: Iterable[Any]) -> Iterator[Any]:
        """The stream's response messages, while the reader takes ``requests`` in."""
        # Read on a thread of its own so results stream back while items are still arriving.
        # A daemon: a reader blocked on a client that neither sends nor closes never holds the
        # process at exit; it ends when gRPC ends the call (its iterator raises or stops).
        threading.Thread(target=self._read, args=(requests,), name="verifier-stream-reader",
                         daemon=True).start()
        try:
            while not (self._finished_reading and self._emitted == self._submitted):
                try:
                    x = self._out.get(timeout=POLL_S)
                except queue.Empty:
                    if not self._is_active():
                        return  # the call is over; the finally cancels what is left
                    continue
                if x is _READER_DONE:
                    self._finished_reading = True
                    self._raise_reader_error()
                    continue
                yield from self._write(x)
        finally:
            # However the call ends (done, the client gone or cancelled, a deadline, an error
            # raised here or GeneratorExit at the yield), its items must not stay queued.
            self._cancel_pending()

    def _write(self, first: cf.Future) -> Iterator[Any]:
        """One response message: ``first``'s result, and in a batched stream those collected
        with it; then the slots of its items are freed."""
        ready, protos, encode_cpu = self._collect(first)
        self._emitted += len(ready)
        # "encode" also counts gRPC serializing and writing the message on this thread before
        # it asks for the next one (the CPU clock skips waiting).
        cpu0 = time.thread_time()
        yield pb.ResultBatch(results=protos) if self._batched else protos[0]
        self._written(ready, encode_cpu + time.thread_time() - cpu0)
        if self._finished_reading:
            self._raise_reader_error()  # read while collecting: its error after these results

    def _collect(self, first: cf.Future) -> tuple[list[cf.Future], list[pb.Result], float]:
        """The futures of one message, their Result messages, and this thread's CPU spent
        converting them. A batched stream's message takes every result that is ready, and those
        that finish within RESULT_LINGER_S while more of the stream's items are in flight:
        without the wait the writer is faster than the workers and every message holds one
        result. ``result()`` raises the VerifierError of an item the service failed (out of
        descriptors: verifier/service/descriptors.py): the call ends with it (UNAVAILABLE), the results
        written so far stand, and the client sends the unanswered items again."""
        cpu0 = time.thread_time()
        ready, protos = [first], [result_to_proto(first.result())]
        size = protos[0].ByteSize() if self._batched else 0  # only a batch is bounded by it
        encode_cpu = time.thread_time() - cpu0
        linger_end = time.monotonic() + RESULT_LINGER_S
        while (self._batched and len(ready) < RESULT_BATCH_MAX and size < RESULT_BATCH_BYTES
               and not self._finished_reading):
            wait = linger_end - time.monotonic()
            if self._emitted + len(ready) >= self._submitted or wait <= 0:
                wait = 0.0  # nothing else in flight to wait for, or the linger is spent
            try:
                y = self._out.get(timeout=wait) if wait > 0 else self._out.get_nowait()
            except queue.Empty:
                break
            if y is _READER_DONE:
                self._finished_reading = True  # its error, if any, after these results
                break
            cpu0 = time.thread_time()
            ready.append(y)
            protos.append(result_to_proto(y.result()))
            size += protos[-1].ByteSize()
            encode_cpu += time.thread_time() - cpu0
        return ready, protos, encode_cpu

    def _written(self, ready: list[cf.Future], cpu: float) -> None:
        """A message has been taken by gRPC: its items' "encode" CPU (shared evenly), their
        slots freed, and the client's progress told to the gate."""
        share = cpu / len(ready)
        for f in ready:
            self._metrics.observe_costs(getattr(f, "domain", ""), {"encode": share})
            self._slots.release()
        self._gated.touch()

    def _raise_reader_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _cancel_pending(self) -> None:
        # Copied under the lock, cancelled outside it: a cancel runs _on_done, which takes it.
        with self._lock:
            pending = list(self._live)
        for f in pending:
            f.cancel()

    # -- the reader thread ----------------------------------------------------------------------
    def _read(self, requests: Iterable[Any]) -> None:
        """Every item of ``requests`` dispatched, until the client closes its side, the call
        ends, or a message or item is refused (kept in ``_error`` for the writer)."""
        try:
            # This thread's CPU per item, from the end of the previous item (so reading and
            # deserializing the message counts) to its dispatch: the "receive" stage.
            mark = time.thread_time()
            for msg in requests:
                for item in self._items_of(msg):
                    if not self._take_slot():
                        return
                    self._track(self._submit_item(item, mark))
                    mark = time.thread_time()
        except VerifierError as e:
            self._error = e
        except grpc.RpcError:
            pass  # the client went away; the writer notices
        except Exception as e:  # noqa: BLE001 - surface as INTERNAL, keep the server up
            log.exception("stream reader failed", extra={"peer": self._peer})
            self._error = VerifierError(f"stream reader failed: {e}", "internal")
        finally:
            # Always, and after ``_error`` is set: the writer waits for it to finish the call.
            self._out.put(_READER_DONE)

    def _items_of(self, msg: Any) -> Iterable[Any]:
        if not self._batched:
            return (msg,)
        if len(msg.items) > self._max_batch:
            raise VerifierError(
                f"a batch of {len(msg.items)} items is over this server's limit "
                f"of {self._max_batch}; send smaller batches", "invalid_argument")
        return msg.items

    def _take_slot(self) -> bool:
        """Wait for room under the in-flight bound; False when the call ended meanwhile.
        Backpressure: the reader stops reading this stream while it has too many items in
        flight, and gRPC's flow control then slows the sender. The wait polls: once the call is
        over the writer is gone, and the slots of results it never wrote are never freed."""
        while not self._slots.acquire(timeout=POLL_S):
            if not self._is_active():
                return False
        return True

    def _submit_item(self, item: Any, mark: float) -> cf.Future:
        """Submit one item holding a slot. A full Scorer queue is backpressure on a stream, not
        a refusal: wait for room, POLL_S at a time, while the call lasts. Any other refusal (or
        the call over) gives the slot back and is raised, ending the call."""
        self._gated.item_started()
        while True:
            try:
                return self._submit(item, block_s=POLL_S, cpu_start=mark)
            except VerifierError as e:
                if e.code != "resource_exhausted" or not self._is_active():
                    self._slots.release()
                    self._gated.item_finished()
                    raise

    def _track(self, fut: cf.Future) -> None:
        # Counted and recorded before the callback is added: a future that is already done (an
        # item judged inline) runs _on_done right here, which must find it in ``_live``, and
        # the writer must never see more results than ``_submitted``.
        with self._lock:
            self._live.add(fut)
            self._submitted += 1
        fut.add_done_callback(self._on_done)

    # -- the scorer's threads -------------------------------------------------------------------
    def _on_done(self, f: cf.Future) -> None:
        with self._lock:
            self._live.discard(f)
        self._gated.item_finished()
        if f.cancelled():
            # No result to write: the slot is freed now. It stays in ``_submitted``, so the
            # writer's loop then ends only with the call (``is_active``): items are cancelled
            # only when their call is ending (``_cancel_pending``; the Scorer's close, which a
            # drain reaches after gRPC has stopped every call).
            self._slots.release()
        else:
            self._out.put(f)
