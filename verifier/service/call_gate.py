"""The call gate: what happens to a call between its headers and its handler.

A server interceptor, because gRPC Python runs interceptors on its polling thread as soon as a
call's headers arrive, before any request body is read, while a unary handler runs only once its
whole request message has arrived and been deserialized (on a pool thread that waits for it).
Everything that must not wait for, or read, a caller's body therefore happens here:

- **Authentication first.** On a server with tokens (verifier/auth.py), a call without a valid
  bearer token is refused with UNAUTHENTICATED at once, by a handler that never asks for the
  request message: its body is never read into memory (HTTP/2 flow control holds the sender
  back) and it takes no call slot. Health checks need no token (probes).
- **Two kinds of slot.** Scoring and reflection calls share ``max_calls`` slots; health checks
  have ``max_probe_calls`` slots and a thread pool of their own, so no number of scoring calls,
  slow or fast, can starve the probes, nor probes the scoring calls. A call over its limit gets
  RESOURCE_EXHAUSTED at once (with the server's retry hint), after the gate tried to make room
  by evicting a call that is only waiting on its client (below).
- **Deadlines on the client's side of a call.** A unary call must deliver its request message
  within ``request_timeout_s`` of its headers, and a stream that has nothing being scored and
  neither sends an item nor takes a result for ``idle_timeout_s`` is idle: both are cancelled
  (the fleet client reopens a stream the server cancelled). At the limit, a call that has been
  waiting on its client for ``EVICTABLE_AFTER_S`` gives its slot to a new call.

Cancelling is the only way to end a call from outside its handler thread (``abort`` must run
on that thread, which is blocked reading the client); the client sees CANCELLED.

The servicer tells the gate what a stream is doing through ``current_call()`` (a context
variable: gRPC runs each call's handler in a context of its own): ``item_started``,
``item_finished`` and ``touch``. Without a gate (tests that build the servicer alone) those
reports go nowhere.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from concurrent import futures as cf
from typing import Any, Callable

import grpc

from verifier.auth import UNAUTHENTICATED_PREFIXES, TokenSource, bearer_from_metadata
from verifier.items import VerifierError

log = logging.getLogger(__name__)

PROBE_PREFIXES = UNAUTHENTICATED_PREFIXES
"""Methods in the probe bucket (their own slots and threads, no token): health checks."""
WATCH_PERIOD_S = 0.25
"""How often the watchdog looks for calls past their deadlines."""
EVICTABLE_AFTER_S = 2.0
"""At the call limit, a call that has waited this long on its client (a request body that has
not come, an idle stream) gives its slot to a new call."""
REFUSAL_THREADS = 2
"""Threads that send refusals: each refusal is one status sent, no body read."""

# Deny: the server's refusal, given the call's context, its method and the error to send: it
# books the metric, logs, and aborts the call through the server's one error mapping.
Deny = Callable[[grpc.ServicerContext, str, VerifierError], None]

_CURRENT: contextvars.ContextVar["GatedCall | None"] = contextvars.ContextVar(
    "verifier_gated_call", default=None)


def current_call() -> "GatedCall | _Untracked":
    """The gate's record of the call whose handler is running on this thread, or a record
    that keeps nothing (a servicer run without a gate, as some tests do)."""
    return _CURRENT.get() or UNTRACKED


class _Untracked:
    """The reports of a call no gate watches: accepted and dropped."""

    def touch(self) -> None:
        pass

    def item_started(self) -> None:
        pass

    def item_finished(self) -> None:
        pass


UNTRACKED = _Untracked()


class GatedCall:
    """One admitted call, as the gate's watchdog sees it. The counters are changed from the
    call's handler thread, its reader thread and the scorer's callbacks, and read by the
    watchdog: each change is one assignment under the gate's lock."""

    def __init__(self, gate: "CallGate", method: str, probe: bool, now: float):
        self.gate = gate
        self.method = method
        self.probe = probe
        self.admitted_at = now
        self.context: grpc.ServicerContext | None = None
        self.awaiting_body = True  # a unary call whose request message has not arrived
        self.streaming = False
        self.scoring = 0  # items of this stream being scored (results not yet computed)
        self.last_progress = now  # the last item received or result written
        self.released = False
        self.cancelled_why = ""

    # -- what the servicer reports ------------------------------------------------------------
    def touch(self) -> None:
        """The client sent an item or took a result."""
        self.last_progress = time.monotonic()

    def item_started(self) -> None:
        with self.gate.lock:
            self.scoring += 1
            self.last_progress = time.monotonic()

    def item_finished(self) -> None:
        with self.gate.lock:
            self.scoring -= 1

    # -- the gate's view ----------------------------------------------------------------------
    def waiting_since(self) -> float | None:
        """Since when this call has been waiting on its client alone, or None when it has
        work of ours under way (a unary call past its body, a stream scoring items)."""
        if self.awaiting_body:
            return self.admitted_at
        if self.streaming and self.scoring <= 0:
            return self.last_progress
        return None


class CallGate(grpc.ServerInterceptor):
    """Authentication, admission and the client-side deadlines of every call (module doc)."""

    def __init__(self, *, deny: Deny, max_calls: int, max_probe_calls: int,
                 request_timeout_s: float, idle_timeout_s: float,
                 tokens: TokenSource | None = None,
                 on_refused: Callable[[str], None] | None = None):
        self.tokens = tokens
        self._deny = deny
        self._on_refused = on_refused or (lambda _reason: None)
        self.max_calls = max_calls
        self.max_probe_calls = max_probe_calls
        self.request_timeout_s = request_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.lock = threading.Lock()
        self._calls: set[GatedCall] = set()
        # Why separate pools: a probe must never queue behind scoring calls that hold every
        # thread of the server's pool, and a refusal must not either (it is one status sent).
        self._probe_pool = cf.ThreadPoolExecutor(max_workers=max_probe_calls,
                                                 thread_name_prefix="verifier-probe")
        self._refusal_pool = cf.ThreadPoolExecutor(max_workers=REFUSAL_THREADS,
                                                   thread_name_prefix="verifier-refuse")
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="verifier-call-gate",
                                          daemon=True)
        self._watchdog.start()

    # -- the interceptor ----------------------------------------------------------------------
    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        # On gRPC's polling thread, under its server lock: no I/O, no waiting here.
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # an unknown method: gRPC answers UNIMPLEMENTED
        method = handler_call_details.method
        probe = method.startswith(PROBE_PREFIXES)
        if not probe and self.tokens is not None:
            token = bearer_from_metadata(handler_call_details.invocation_metadata)
            if not self.tokens.accepts(token):
                why = "missing bearer token" if not token else "invalid bearer token"
                return self._refusal(handler, method, VerifierError(why, "unauthenticated"))
        call = self._admit(method, probe)
        if call is None:
            self._on_refused("too_many_probes" if probe else "too_many_calls")
            limit = self.max_probe_calls if probe else self.max_calls
            kind = "health checks" if probe else "calls"
            return self._refusal(handler, method, VerifierError(
                f"verifier busy: {limit} {kind} already in progress; retry later",
                "resource_exhausted"))
        return self._admitted(handler, call)

    def _admit(self, method: str, probe: bool) -> GatedCall | None:
        now = time.monotonic()
        limit = self.max_probe_calls if probe else self.max_calls
        evict = None
        with self.lock:
            mine = [c for c in self._calls if c.probe == probe]
            if len(mine) >= limit:
                evict = _longest_waiting(mine, now - EVICTABLE_AFTER_S)
                if evict is None:
                    return None
                self._release_locked(evict)
            call = GatedCall(self, method, probe, now)
            self._calls.add(call)
        if evict is not None:
            self._cancel(evict, "evicted: it was waiting on its client while the server was "
                                "at its call limit")
        return call

    def _admitted(self, handler: grpc.RpcMethodHandler, call: GatedCall) -> grpc.RpcMethodHandler:
        """The handler as the gate runs it: every form is served as a request-streaming
        handler, so the gate's code runs at once (not after a body has arrived) and can put a
        deadline on the request message."""
        gate = self
        unary_request = not handler.request_streaming
        inner = (handler.unary_unary or handler.unary_stream if unary_request
                 else handler.stream_unary or handler.stream_stream)

        def behavior(request_iterator: Any, context: grpc.ServicerContext) -> Any:
            gate._attach(call, context)
            _CURRENT.set(call)  # gRPC gives each call a fresh context: nothing to reset
            if not unary_request:
                call.awaiting_body = False
                call.streaming = True
                return inner(request_iterator, context)
            try:
                request = next(request_iterator)
            except StopIteration:
                if context.is_active():
                    gate._deny(context, call.method, VerifierError(
                        f"{call.method} needs exactly one request message", "invalid_argument"))
                context.abort(grpc.StatusCode.CANCELLED, call.cancelled_why or "cancelled")
            except grpc.RpcError:
                # Cancelled while the body was awaited (the gate's deadline, or the client):
                # no status can reach anyone; abort only ends the handler without a
                # traceback in the log (the one status code not chosen by server._abort).
                context.abort(grpc.StatusCode.CANCELLED, call.cancelled_why or "cancelled")
            call.awaiting_body = False
            return inner(request, context)

        if call.probe:
            behavior.experimental_thread_pool = self._probe_pool  # type: ignore[attr-defined]
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                behavior, handler.request_deserializer, handler.response_serializer)
        return grpc.stream_unary_rpc_method_handler(
            behavior, handler.request_deserializer, handler.response_serializer)

    def _refusal(self, handler: grpc.RpcMethodHandler, method: str,
                 err: VerifierError) -> grpc.RpcMethodHandler:
        """A handler that sends ``err`` without reading the request: request-streaming, so
        gRPC starts it at once instead of waiting for (and deserializing) a body."""
        deny = self._deny

        def refuse(_request_iterator: Any, context: grpc.ServicerContext) -> Any:
            deny(context, method, err)

        refuse.experimental_thread_pool = self._refusal_pool  # type: ignore[attr-defined]
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        return grpc.stream_unary_rpc_method_handler(refuse)

    # -- bookkeeping ----------------------------------------------------------------------------
    def _attach(self, call: GatedCall, context: grpc.ServicerContext) -> None:
        call.context = context
        if not context.add_callback(lambda: self._release(call)):
            self._release(call)  # the call already ended
        if call.released:
            # Evicted or timed out between admission and now: end it (cancel is idempotent).
            context.cancel()

    def _release(self, call: GatedCall) -> None:
        with self.lock:
            self._release_locked(call)

    def _release_locked(self, call: GatedCall) -> None:
        if not call.released:
            call.released = True
            self._calls.discard(call)

    def _cancel(self, call: GatedCall, why: str) -> None:
        call.cancelled_why = why
        log.warning("call cancelled", extra={"method": call.method, "reason": why})
        if call.context is not None:
            call.context.cancel()

    @property
    def active(self) -> tuple[int, int]:
        """(scoring calls, probes) holding a slot now."""
        with self.lock:
            probes = sum(1 for c in self._calls if c.probe)
            return len(self._calls) - probes, probes

    def _overdue(self, now: float) -> list[tuple[GatedCall, str]]:
        out = []
        with self.lock:
            for c in list(self._calls):
                if c.awaiting_body and now - c.admitted_at > self.request_timeout_s:
                    why = (f"no request message within {self.request_timeout_s:g} s of the "
                           "call's headers")
                elif (c.streaming and c.scoring <= 0
                      and now - c.last_progress > self.idle_timeout_s):
                    why = (f"stream idle for {self.idle_timeout_s:g} s (no item sent, no result "
                           "taken, nothing being scored)")
                else:
                    continue
                self._release_locked(c)
                out.append((c, why))
        return out

    def _watch(self) -> None:
        # Its own thread: the deadlines must fire while every handler thread is blocked on a
        # client; it only cancels calls (non-blocking) and never takes a lock gRPC holds.
        while not self._stop.wait(WATCH_PERIOD_S):
            for call, why in self._overdue(time.monotonic()):
                self._cancel(call, why)

    def close(self) -> None:
        self._stop.set()
        self._probe_pool.shutdown(wait=False, cancel_futures=True)
        self._refusal_pool.shutdown(wait=False, cancel_futures=True)


def _longest_waiting(calls: list[GatedCall], before: float) -> GatedCall | None:
    """The call that has waited on its client the longest, if since before ``before``."""
    best, best_t = None, before
    for c in calls:
        t = c.waiting_since()
        if t is not None and t <= best_t:
            best, best_t = c, t
    return best
