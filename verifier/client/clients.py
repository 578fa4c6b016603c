"""Client library for the verifier service: sync (``VerifierClient``) and asyncio
(``AsyncVerifierClient``).

- ``address``: one ``host:port``, a comma list of them, or ``dns:///name:port`` (every address
  the name resolves to; a Kubernetes headless Service), or a mix (verifier/client/fleet.py).
- ``score(items)``: unary batches of ``batch_size``, results in input order; with several
  replicas the batches run on all of them at once, and a failed batch is retried on another.
- ``stream(items)``: one logical stream; results arrive in completion order while items are
  still being sent. With several replicas it runs one gRPC stream per healthy replica. If a
  replica dies, its unanswered items are re-sent to the others; a replica that comes back is
  used again; every item yields exactly one result (results are de-duplicated by id).
- Retries with exponential backoff and jitter on UNAVAILABLE (server restarting, not yet up)
  and RESOURCE_EXHAUSTED (server busy; its ``retry-after-ms`` hint is honoured), up to
  ``max_retries`` times in a row per replica; every call has a deadline. A stream with
  ``outage_window_s`` > 0 (the trainer's: 600 s) instead rides out a time when every replica is
  down: it keeps retrying its unanswered items, logs each wait, and fails only once the outage
  has lasted that long (verifier/client/fleet.py).
- Access control: TLS / mutual TLS (``tls_ca``, ``tls_cert``, ``tls_key``) and a bearer token
  (``token_file`` / ``token_env``), sent on every call.

Items are ``verifier.items.Item`` objects or dicts in the JSONL item format (docs/contracts.md 1).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterable, AsyncIterator, Iterable, Iterator

import grpc

from verifier.client.config import ClientConfig
from verifier.convert import encode_item, result_from_proto
from verifier.client.fleet import (
    RETRYABLE,
    Fleet,
    FleetStream,
    backoff_s,
    parse_address,
    retry_hint_s,
    split_host_port,
)
from verifier.items import Item, Result, VerifierError
from verifier.proto import verifier_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["AsyncVerifierClient", "ClientConfig", "RETRYABLE", "VerifierClient"]


def _encode_all(items: Iterable[Item | dict[str, Any]]) -> list[pb.Item | Result]:
    """Wire messages, with a local INVALID_INPUT Result in place of each item that cannot be
    sent (one bad item never fails the call)."""
    return [encode_item(it) for it in items]


def _merge(encoded: list[pb.Item | Result], answered: Iterator[Result]) -> list[Result]:
    """Results in input order: local results where they were, server results elsewhere."""
    return [next(answered) if isinstance(e, pb.Item) else e for e in encoded]


REFUSED_S = 3.0
"""How long :meth:`VerifierClient.wait_ready` lets every address refuse connections before it
warns that nothing listens there."""


def nothing_listens(address: str, connect_s: float = 1.0) -> str | None:
    """Why nothing can be listening at ``address`` ("connection refused at HOST:PORT", "HOST
    does not resolve"), or None when some address accepts a TCP connection, stays silent
    (a network that drops packets may still lead to a verifier) or is not a HOST:PORT this can
    probe (a unix socket: gRPC's own wait decides)."""
    reasons = []
    for target in parse_address(address):
        try:
            if target.dns_host is not None:
                host, port = target.dns_host, target.port
            else:
                host, port = split_host_port(target.text, target.text)
        except VerifierError:
            return None
        try:
            with socket.create_connection((host, port), timeout=connect_s):
                return None
        except socket.gaierror:
            reasons.append(f"{host} does not resolve")
        except ConnectionRefusedError:
            reasons.append(f"connection refused at {host}:{port}")
        except OSError:  # a timeout, an unreachable network: not a sure "nothing there"
            return None
    return "; ".join(reasons)


class VerifierClient:
    """Blocking client. Thread-safe; reuse one per process."""

    def __init__(self, address: str, config: ClientConfig | None = None):
        self.address = address
        self.config = config or ClientConfig()
        self.fleet = Fleet(address, self.config)

    # -- health -----------------------------------------------------------------------------
    def replica_health(self, timeout_s: float = 5.0) -> dict[str, bool]:
        """SERVING or not, per replica address (DNS names resolved)."""
        reps = self.fleet.active()
        if not reps:
            return {}
        with ThreadPoolExecutor(max_workers=min(16, len(reps))) as ex:
            ok = list(ex.map(lambda r: r.check_health(timeout_s, self.fleet.metadata), reps))
        return {r.address: o for r, o in zip(reps, ok)}

    def health(self, timeout_s: float = 5.0) -> bool:
        """True when at least one replica reports SERVING."""
        return any(self.replica_health(timeout_s).values())

    def wait_ready(self, timeout_s: float = 30.0, all_replicas: bool = False,
                   refused_s: float = REFUSED_S) -> None:
        """Block until one replica (or, with ``all_replicas``, every one) reports SERVING.

        When nothing listens at any address (every connection refused, or no name resolves)
        for ``refused_s``, it says so at once in a warning, and the error at ``timeout_s`` says
        why: a mistyped port or a verifier that is not running is named within seconds. It
        still waits the whole ``timeout_s``: a verifier started at the same moment (a compose
        file, a Kubernetes pod still pulling its image) may bind its port late."""
        start = time.monotonic()
        end = start + timeout_s
        heard_at, why, warned = start, None, False
        while time.monotonic() < end:
            states = self.replica_health(timeout_s=min(2.0, max(0.1, end - time.monotonic())))
            if states and (all(states.values()) if all_replicas else any(states.values())):
                return
            why = nothing_listens(self.address)
            if why is None:
                heard_at = time.monotonic()
            elif not warned and time.monotonic() - heard_at >= refused_s:
                log.warning("no verifier at %s yet: %s; waiting up to %g s (is `verifier serve` "
                            "running there?)", self.address, why, timeout_s)
                warned = True
            time.sleep(0.1)
        raise VerifierError(f"verifier at {self.address} not ready after {timeout_s:g} s"
                            + (f": {why} (is `verifier serve` running there?)" if why else ""),
                            "unavailable")

    def replica_stats(self) -> dict[str, dict[str, Any]]:
        """Per replica: items sent and answered, failed attempts, whether it left DNS."""
        return self.fleet.stats()

    # -- unary ------------------------------------------------------------------------------
    def _score_batch(self, req: pb.ScoreRequest) -> pb.ScoreResponse:
        attempt = 0
        while True:
            rep, wait = self.fleet.pick()
            if rep is None:
                self.fleet.refresh(force=True)
                if attempt >= self.config.max_retries:
                    raise VerifierError(f"no verifier replica found at {self.address}",
                                        "unavailable")
                time.sleep(backoff_s(attempt, self.config))
                attempt += 1
                continue
            if wait > 0:
                time.sleep(wait)
            try:
                resp = rep.stub.Score(req, timeout=self.config.timeout_s,
                                      metadata=self.fleet.metadata or None,
                                      wait_for_ready=False)
            except grpc.RpcError as e:
                if e.code() not in RETRYABLE or attempt >= self.config.max_retries:
                    raise
                delay = rep.record_failure(self.config, retry_hint_s(e))
                log.warning("verifier call failed; retrying",
                            extra={"replica": rep.address, "code": e.code().name,
                                   "attempt": attempt + 1, "delay_s": round(delay, 3)})
                attempt += 1
                continue
            rep.record_success()
            with rep.lock:
                rep.sent += len(req.items)
                rep.answered += len(resp.results)
            return resp

    def score(self, items: Iterable[Item | dict[str, Any]]) -> list[Result]:
        """Score items in batches; results in input order."""
        encoded = _encode_all(items)
        protos = [e for e in encoded if isinstance(e, pb.Item)]
        bs = self.config.batch_size
        reqs = [pb.ScoreRequest(items=protos[i : i + bs]) for i in range(0, len(protos), bs)]
        n = len(self.fleet.active())
        if len(reqs) > 1 and n > 1:
            with ThreadPoolExecutor(max_workers=min(len(reqs), n, 16)) as ex:
                responses = list(ex.map(self._score_batch, reqs))
        else:
            responses = [self._score_batch(r) for r in reqs]
        answered = [result_from_proto(r) for resp in responses for r in resp.results]
        return _merge(encoded, iter(answered))

    # -- streaming --------------------------------------------------------------------------
    def open_stream(self, items: Iterable[Item | dict[str, Any]]) -> FleetStream:
        """The stream object behind ``stream``: iterate it; ``close()`` stops it from any
        thread."""
        return FleetStream(self.fleet, items)

    def stream(self, items: Iterable[Item | dict[str, Any]]) -> Iterator[Result]:
        """Stream items; yield results as they finish (completion order). Item ids must be
        unique within the call. Unanswered items of a replica that fails are re-sent."""
        yield from self.open_stream(items)

    def close(self) -> None:
        self.fleet.close()

    def __enter__(self) -> "VerifierClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncVerifierClient:
    """asyncio client with the same behaviour as VerifierClient: it drives the same fleet
    logic (one implementation of failover and exactly-once) from worker threads, so awaiting
    never blocks the event loop."""

    def __init__(self, address: str, config: ClientConfig | None = None):
        self.address = address
        self.config = config or ClientConfig()
        self._client = VerifierClient(address, self.config)

    async def health(self, timeout_s: float = 5.0) -> bool:
        return await asyncio.to_thread(self._client.health, timeout_s)

    async def wait_ready(self, timeout_s: float = 30.0, all_replicas: bool = False) -> None:
        await asyncio.to_thread(self._client.wait_ready, timeout_s, all_replicas)

    def replica_stats(self) -> dict[str, dict[str, Any]]:
        return self._client.replica_stats()

    async def score(self, items: Iterable[Item | dict[str, Any]]) -> list[Result]:
        batch = list(items)
        return await asyncio.to_thread(self._client.score, batch)

    async def stream(
        self, items: Iterable[Item | dict[str, Any]] | AsyncIterable[Item | dict[str, Any]]
    ) -> AsyncIterator[Result]:
        """Async version of VerifierClient.stream (accepts sync or async iterables)."""
        loop = asyncio.get_running_loop()
        if hasattr(items, "__aiter__"):
            source: Iterable[Any] = _SyncFromAsync(items, loop)  # type: ignore[arg-type]
        else:
            source = items  # type: ignore[assignment]
        engine = self._client.open_stream(source)
        results: asyncio.Queue = asyncio.Queue()
        room = threading.Semaphore(max(1, self.config.stream_window))  # bounds the hand-off
        stop = threading.Event()

        def post(entry: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(results.put_nowait, entry)
            except RuntimeError:  # the event loop is gone
                stop.set()

        def pump() -> None:
            try:
                for r in engine:
                    while not room.acquire(timeout=0.25):
                        if stop.is_set():
                            return
                    post(("result", r))
                post(("end", None))
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's task
                post(("error", e))

        threading.Thread(target=pump, name="verifier-async-stream", daemon=True).start()
        try:
            while True:
                kind, x = await results.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise x
                room.release()
                yield x
        finally:
            stop.set()
            engine.close()

    async def close(self) -> None:
        self._client.close()

    async def __aenter__(self) -> "AsyncVerifierClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _SyncFromAsync:
    """A blocking iterator over an async iterable, for a worker thread: each ``next`` runs one
    ``__anext__`` on the event loop."""

    def __init__(self, items: AsyncIterable[Any], loop: asyncio.AbstractEventLoop):
        self._it = items.__aiter__()
        self._loop = loop

    def __iter__(self) -> "_SyncFromAsync":
        return self

    async def _step(self) -> tuple[bool, Any]:
        try:
            return True, await self._it.__anext__()
        except StopAsyncIteration:
            return False, None

    def __next__(self) -> Any:
        ok, value = asyncio.run_coroutine_threadsafe(self._step(), self._loop).result()
        if not ok:
            raise StopIteration
        return value
