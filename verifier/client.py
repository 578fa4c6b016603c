"""Client library for the verifier service: sync (``VerifierClient``) and asyncio
(``AsyncVerifierClient``).

- ``score(items)``: unary batches of ``batch_size``, results in input order.
- ``stream(items)``: one bidirectional stream; results arrive in completion order while items
  are still being sent. If the connection breaks, the unanswered items are re-sent on a new
  stream, so every item yields exactly one result (results are de-duplicated by id).
- Retries with exponential backoff and jitter on UNAVAILABLE (server restarting, not yet up)
  and RESOURCE_EXHAUSTED (server busy), up to ``max_retries`` times; every call has a deadline.

Items are ``verifier.items.Item`` objects or dicts in the JSONL item format (DESIGN.md 3.1).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from verifier.convert import encode_item, result_from_proto
from verifier.items import Item, Result, VerifierError
from verifier.proto import verifier_pb2 as pb
from verifier.proto import verifier_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)


@dataclass
class ClientConfig:
    """Connection and retry settings shared by both clients."""

    timeout_s: float = 600.0
    """Deadline of one RPC, seconds (a whole batch, or a whole stream attempt)."""
    batch_size: int = 256
    """Items per unary Score call."""
    max_retries: int = 8
    """Attempts after the first on UNAVAILABLE / RESOURCE_EXHAUSTED before giving up."""
    backoff_s: float = 0.2
    """First retry delay, seconds; doubles each retry (with jitter) up to ``max_backoff_s``."""
    max_backoff_s: float = 5.0
    max_message_mb: int = 256
    """Largest message either way, MiB (must match the server's for big code batches)."""


def _backoff(attempt: int, cfg: ClientConfig) -> float:
    base = min(cfg.max_backoff_s, cfg.backoff_s * (2**attempt))
    return base * (0.5 + random.random() / 2)


def _channel_options(cfg: ClientConfig) -> list[tuple[str, Any]]:
    n = cfg.max_message_mb * 1024 * 1024
    return [("grpc.max_receive_message_length", n), ("grpc.max_send_message_length", n)]


def _encode_all(items: Iterable[Item | dict[str, Any]]) -> list[pb.Item | Result]:
    """Wire messages, with a local INVALID_INPUT Result in place of each item that cannot be
    sent (one bad item never fails the call)."""
    return [encode_item(it) for it in items]


def _merge(encoded: list[pb.Item | Result], answered: Iterator[Result]) -> list[Result]:
    """Results in input order: local results where they were, server results elsewhere."""
    return [next(answered) if isinstance(e, pb.Item) else e for e in encoded]


def _drain(local: "queue.SimpleQueue[Result]") -> Iterator[Result]:
    while True:
        try:
            yield local.get_nowait()
        except queue.Empty:
            return


class _Pending:
    """Items sent on a stream but not yet answered, keyed by id (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, pb.Item] = {}
        self._answered: set[str] = set()

    def add(self, msg: pb.Item) -> None:
        with self._lock:
            if msg.id in self._items or msg.id in self._answered:
                raise VerifierError(f"duplicate item id {msg.id!r} in one stream", "invalid_argument")
            self._items[msg.id] = msg

    def answer(self, item_id: str) -> bool:
        """Mark answered; False for a duplicate or unknown id (dropped)."""
        with self._lock:
            if self._items.pop(item_id, None) is None:
                return False
            self._answered.add(item_id)
            return True

    def snapshot(self) -> list[pb.Item]:
        with self._lock:
            return list(self._items.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class VerifierClient:
    """Blocking client. Thread-safe; reuse one per process."""

    def __init__(self, address: str, config: ClientConfig | None = None):
        self.address = address
        self.config = config or ClientConfig()
        self._channel = grpc.insecure_channel(address, options=_channel_options(self.config))
        self._stub = pb_grpc.VerifierStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def health(self, timeout_s: float = 5.0) -> bool:
        """True when the server reports SERVING."""
        try:
            resp = self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError:
            return False
        return resp.status == health_pb2.HealthCheckResponse.SERVING

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until the server answers health checks with SERVING."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.health(timeout_s=min(2.0, max(0.1, end - time.monotonic()))):
                return
            time.sleep(0.1)
        raise VerifierError(f"verifier at {self.address} not ready after {timeout_s:g} s", "unavailable")

    def _call_with_retry(self, fn: Any, request: Any) -> Any:
        attempt = 0
        while True:
            try:
                return fn(request, timeout=self.config.timeout_s, wait_for_ready=True)
            except grpc.RpcError as e:
                if e.code() not in RETRYABLE or attempt >= self.config.max_retries:
                    raise
                delay = _backoff(attempt, self.config)
                log.warning("verifier call failed; retrying",
                            extra={"code": e.code().name, "attempt": attempt + 1, "delay_s": delay})
                time.sleep(delay)
                attempt += 1

    def score(self, items: Iterable[Item | dict[str, Any]]) -> list[Result]:
        """Score items in batches; results in input order."""
        encoded = _encode_all(items)
        protos = [e for e in encoded if isinstance(e, pb.Item)]
        answered: list[Result] = []
        for i in range(0, len(protos), self.config.batch_size):
            req = pb.ScoreRequest(items=protos[i : i + self.config.batch_size])
            resp = self._call_with_retry(self._stub.Score, req)
            answered.extend(result_from_proto(r) for r in resp.results)
        return _merge(encoded, iter(answered))

    def stream(self, items: Iterable[Item | dict[str, Any]]) -> Iterator[Result]:
        """Stream items; yield results as they finish (completion order). Item ids must be
        unique within the call. On a broken stream the unanswered items are re-sent."""
        source = iter(items)
        pending = _Pending()
        local: queue.SimpleQueue[Result] = queue.SimpleQueue()  # items that cannot be sent
        source_done = threading.Event()
        source_lock = threading.Lock()

        def requests(resend: Sequence[pb.Item], alive: list[bool]) -> Iterator[pb.Item]:
            # Consumed by gRPC on its own thread: first what the last attempt left unanswered,
            # then fresh items from the caller's iterator. Once its attempt is over (alive[0]
            # is False) it takes nothing more from the source, so the re-send snapshot taken
            # after that can miss no item.
            yield from resend
            while True:
                with source_lock:
                    if not alive[0]:
                        return
                    nxt = next(source, None)
                    if nxt is None:
                        source_done.set()
                        return
                    msg = encode_item(nxt)
                    if isinstance(msg, Result):
                        local.put(msg)
                        continue
                    pending.add(msg)
                yield msg

        attempt = 0
        resend: list[pb.Item] = []
        while True:
            alive = [True]
            call = self._stub.ScoreStream(requests(resend, alive), timeout=self.config.timeout_s,
                                          wait_for_ready=True)
            try:
                for msg in call:
                    yield from _drain(local)
                    if pending.answer(msg.id):
                        attempt = 0  # progress: reset the retry budget
                        yield result_from_proto(msg)
                yield from _drain(local)
                if source_done.is_set() and len(pending) == 0:
                    return
                # The server closed the stream early without an error: re-send what is left.
                err_code = grpc.StatusCode.UNAVAILABLE
            except grpc.RpcError as e:
                err_code = e.code()
                if err_code not in RETRYABLE:
                    raise
            finally:
                with source_lock:
                    alive[0] = False
                call.cancel()
            if attempt >= self.config.max_retries:
                raise VerifierError(
                    f"stream to {self.address} failed {attempt + 1} times ({err_code.name}); "
                    f"{len(pending)} items unanswered", "unavailable")
            delay = _backoff(attempt, self.config)
            log.warning("verifier stream broke; re-sending unanswered items",
                        extra={"code": err_code.name, "unanswered": len(pending), "delay_s": delay})
            time.sleep(delay)
            attempt += 1
            resend = pending.snapshot()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "VerifierClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncVerifierClient:
    """asyncio client with the same behaviour as VerifierClient."""

    def __init__(self, address: str, config: ClientConfig | None = None):
        self.address = address
        self.config = config or ClientConfig()
        self._channel = grpc.aio.insecure_channel(address, options=_channel_options(self.config))
        self._stub = pb_grpc.VerifierStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def health(self, timeout_s: float = 5.0) -> bool:
        try:
            resp = await self._health.Check(health_pb2.HealthCheckRequest(service=""),
                                            timeout=timeout_s)
        except grpc.RpcError:
            return False
        return resp.status == health_pb2.HealthCheckResponse.SERVING

    async def score(self, items: Iterable[Item | dict[str, Any]]) -> list[Result]:
        encoded = _encode_all(items)
        protos = [e for e in encoded if isinstance(e, pb.Item)]
        answered: list[Result] = []
        for i in range(0, len(protos), self.config.batch_size):
            req = pb.ScoreRequest(items=protos[i : i + self.config.batch_size])
            attempt = 0
            while True:
                try:
                    resp = await self._stub.Score(req, timeout=self.config.timeout_s,
                                                  wait_for_ready=True)
                    break
                except grpc.RpcError as e:
                    if e.code() not in RETRYABLE or attempt >= self.config.max_retries:
                        raise
                    await asyncio.sleep(_backoff(attempt, self.config))
                    attempt += 1
            answered.extend(result_from_proto(r) for r in resp.results)
        return _merge(encoded, iter(answered))

    async def stream(
        self, items: Iterable[Item | dict[str, Any]] | AsyncIterable[Item | dict[str, Any]]
    ) -> AsyncIterator[Result]:
        """Async version of VerifierClient.stream (accepts sync or async iterables)."""
        if hasattr(items, "__aiter__"):
            source: AsyncIterator = items.__aiter__()  # type: ignore[union-attr]
        else:
            source = _aiter_sync(items)  # type: ignore[arg-type]
        pending = _Pending()
        local: queue.SimpleQueue[Result] = queue.SimpleQueue()
        state = {"source_done": False}

        async def requests(resend: Sequence[pb.Item]) -> AsyncIterator[pb.Item]:
            for m in resend:
                yield m
            async for nxt in source:
                msg = encode_item(nxt)
                if isinstance(msg, Result):
                    local.put(msg)
                    continue
                pending.add(msg)
                yield msg
            state["source_done"] = True

        attempt = 0
        resend: list[pb.Item] = []
        while True:
            call = self._stub.ScoreStream(requests(resend), timeout=self.config.timeout_s,
                                          wait_for_ready=True)
            try:
                async for msg in call:
                    for r in _drain(local):
                        yield r
                    if pending.answer(msg.id):
                        attempt = 0
                        yield result_from_proto(msg)
                for r in _drain(local):
                    yield r
                if state["source_done"] and len(pending) == 0:
                    return
                err_code = grpc.StatusCode.UNAVAILABLE
            except grpc.RpcError as e:
                err_code = e.code()
                if err_code not in RETRYABLE:
                    raise
            finally:
                call.cancel()
            if attempt >= self.config.max_retries:
                raise VerifierError(
                    f"stream to {self.address} failed {attempt + 1} times ({err_code.name}); "
                    f"{len(pending)} items unanswered", "unavailable")
            await asyncio.sleep(_backoff(attempt, self.config))
            attempt += 1
            resend = pending.snapshot()

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncVerifierClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _aiter_sync(items: Iterable[Any]) -> AsyncIterator[Any]:
    for it in items:
        yield it
