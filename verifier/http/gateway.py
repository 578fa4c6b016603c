"""The HTTP gateway (``verifier serve --http-port N``): the verifier for trainers that speak
HTTP, beside the gRPC port, served by the same Scorer, sandbox, limits, token, TLS, metrics and
drain.

- ``POST /run_code``: SandboxFusion's API for ``language: python`` (verl's
  ``reward_model.sandbox_fusion.url``): verifier/http/run_code.py.
- ``POST /get_reward``: OpenRLHF's remote reward (``--remote_rm_url``), and ``POST /score``:
  this project's JSON items (docs/contracts.md 1): verifier/http/rewards.py.
- ``GET /health`` (and SandboxFusion's ``GET /v1/ping``): no token, 503 while draining.

A thin layer: each handler reads and decodes JSON, converts it with the pure functions of those
modules and delegates to the Scorer (items) or the CodeRunner (runs). VerifierError is the one
domain exception; ``_error_response`` maps its code to an HTTP status (``HTTP_STATUS``: the
gRPC mapping of verifier/service/servicer.py, in HTTP terms) and no other place chooses a status code.

What a caller cannot do (the gRPC call gate's rules, verifier/service/call_gate.py, for HTTP): the token
(``Authorization: Bearer``, or RFC 6750's ``access_token`` query parameter for clients that
cannot send headers) and the request limit are checked on the headers, before the body is read;
a body over ``max_body_mb`` is refused on its Content-Length (or when it passes the limit while
being read), a body that has not arrived ``body_timeout_s`` after the headers gets 408, and every
refusal closes its connection. Each request is a coroutine on the gateway's own event loop
thread: a slow or stalled client holds no thread, and JSON of more than ``INLINE_JSON_BYTES`` is
decoded on a worker thread, so other requests go on. A client that disconnects cancels its
request and its queued items. No URL is ever logged (it may carry a token).

Connections (verifier/http/connections.py, the listening socket's protocol factory):
each costs a file descriptor whatever it sends, and jails and gRPC need them too, so at most
``max_connections`` are open at once (never more than half the descriptors above a reserve:
verifier/service/descriptors.py), at most ``max_connections_per_peer`` (and half of the total) from
one IP; one more is closed as soon as it is accepted, before anything is read. A connection's
first request line and headers (and TLS handshake) must arrive within ``header_timeout_s`` of
its accept (the gate tells the guard when they did), and after a response the next request's
within ``keepalive_s`` (aiohttp's ``keepalive_timeout``); else it is closed.

Jails: ``/run_code`` runs take the code items' slots (``Scorer.submit_run``), so the one
``--code-concurrency`` bounds every jail of the replica. A replica out of descriptors answers
503 (VerifierError "unavailable"), never a verdict.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent import futures as cf
from pathlib import Path
from typing import Any

from aiohttp import web

from verifier.auth import TokenSource
from verifier.scoring.bigint import MAX_INT_DIGITS, json_loads_digits
from verifier.service.descriptors import http_connection_cap
from verifier.http.rewards import (
    Entry,
    reward_answer,
    reward_items,
    score_answer,
    score_items,
)
from verifier.http.connections import ConnectionGuard, ConnectionLimits
from verifier.http.run_code import CodeRunner, parse_run_code, run_code_response
from verifier.items import Item, Result, VerifierError
from verifier.service.metered import submit_all, submit_metered
from verifier.service.metrics import ServerMetrics
from verifier.scoring.scorer import Scorer

log = logging.getLogger(__name__)

HTTP_STATUS = {
    "invalid_argument": 400,
    "failed_precondition": 400,
    "unauthenticated": 401,
    "not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "payload_too_large": 413,
    "unprocessable": 422,
    "resource_exhausted": 429,
    "internal": 500,
    "unavailable": 503,
    "deadline_exceeded": 504,
}
"""VerifierError codes as HTTP statuses (an unknown code is 500)."""
RETRY_AFTER_S = 1
"""The Retry-After header of 429 and 503 answers, seconds."""
PROBE_PATHS = ("/health", "/v1/ping")
"""Served without a token, outside the request limit (probes)."""
SCORING_PATHS = ("/run_code", "/get_reward", "/score")
INLINE_JSON_BYTES = 256 * 1024
"""Bodies up to this size are decoded on the event loop; larger ones on a worker thread."""
CANCEL_AFTER_DRAIN_S = 1.0
"""When a drain's grace is over: how long aiohttp lets the requests left finish before it
cancels them (their queued items are cancelled with them)."""
WORKER_THREADS = 4
"""Threads that decode large bodies and submit items to the Scorer (both are CPU work that
must not hold the event loop)."""


def server_ssl_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """TLS for the gateway from the gRPC port's files; with ``client_ca``, mutual TLS."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    if client_ca is not None:
        ctx.load_verify_locations(cafile=str(client_ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _presented_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None
    return request.query.get("access_token")


def _error_response(err: VerifierError, close: bool) -> web.Response:
    """The one place a domain error becomes an HTTP status."""
    status = HTTP_STATUS.get(err.code, 500)
    resp = web.json_response({"error": err.code, "message": str(err)}, status=status)
    if status in (429, 503):
        resp.headers["Retry-After"] = str(RETRY_AFTER_S)
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="verifier"'
    if close:
        resp.force_close()
    return resp


def _from_aiohttp(exc: web.HTTPException) -> VerifierError:
    """aiohttp's own refusals (routing, body size) as domain errors."""
    code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
        exc.status, "invalid_argument" if exc.status < 500 else "internal")
    return VerifierError(exc.reason or str(exc), code)


def _decode_json(body: bytes) -> Any:
    if not body:
        raise VerifierError("the request has no body; expected JSON", "invalid_argument")
    try:
        return json_loads_digits(body, MAX_INT_DIGITS)  # any profile's integers (bigint.py)
    except RecursionError:
        raise VerifierError("the body's JSON is nested too deeply", "invalid_argument") from None
    except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError
        raise VerifierError(f"the body is not valid JSON: {e}"[:300], "invalid_argument") from None


class HttpGateway:
    """The gateway of one server (module docstring). ``start`` binds and serves on a thread of
    its own; ``begin_drain`` refuses new requests (503); ``stop`` waits for the requests in
    progress up to a grace, then stops listening and closes everything."""

    def __init__(self, scorer: Scorer, metrics: ServerMetrics, tokens: TokenSource | None, *,
                 max_body_mb: int, max_requests: int, body_timeout_s: float,
                 max_connections: int = 1024, max_connections_per_peer: int = 256,
                 header_timeout_s: float = 10.0, keepalive_s: float = 30.0,
                 tls_cert: Path | None = None, tls_key: Path | None = None,
                 tls_client_ca: Path | None = None):
        self.scorer = scorer
        self.metrics = metrics
        self.tokens = tokens
        self.max_body_bytes = max_body_mb * 1024 * 1024
        self.max_requests = max_requests
        self.body_timeout_s = body_timeout_s
        # Connections are bounded by the descriptors too (verifier/service/descriptors.py): whatever
        # is configured, at most half of those above the reserve kept for jails and gRPC.
        # No one peer may take more than half of them.
        total = http_connection_cap(max_connections)
        self.connection_limits = ConnectionLimits(
            max_total=total, max_per_peer=max(1, min(max_connections_per_peer, total // 2)),
            header_timeout_s=header_timeout_s)
        self.keepalive_s = keepalive_s
        self._ssl = (server_ssl_context(tls_cert, tls_key, tls_client_ca)
                     if tls_cert is not None and tls_key is not None else None)
        # /run_code runs take the code items' jail slots (Scorer.submit_run): one bound,
        # --code-concurrency, on every jail of the replica.
        self.code_runner = CodeRunner(scorer.sandbox, scorer.sandbox_problem, scorer.submit_run)
        self._workers = cf.ThreadPoolExecutor(max_workers=WORKER_THREADS,
                                              thread_name_prefix="verifier-http")
        self.port: int | None = None
        self._inflight = 0  # scoring requests in progress (changed on the loop thread only)
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._guard: ConnectionGuard | None = None
        self._server: asyncio.AbstractServer | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0 picks a port) and serve; returns the bound port. Raises
        VerifierError("unavailable") when the port cannot be bound."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="verifier-http",
                                        daemon=True)
        self._thread.start()
        try:
            self.port = asyncio.run_coroutine_threadsafe(
                self._serve(host.strip("[]"), port), self._loop).result(timeout=30)
        except OSError as e:
            self.stop(0)
            raise VerifierError(f"could not bind HTTP port {port}: {e}", "unavailable") from e
        except BaseException:
            self.stop(0)
            raise
        return self.port

    async def _serve(self, host: str, port: int) -> int:
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._gate])
        app.router.add_post("/run_code", self._run_code)
        app.router.add_post("/get_reward", self._get_reward)
        app.router.add_post("/score", self._score)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/ping", self._ping)
        # handler_cancellation: a client that goes away cancels its request (and its items).
        # lingering_time=0: after a refusal, the rest of an unread body is not read (aiohttp
        # would read and discard it for up to 10 s); the connection is closed instead.
        # keepalive_timeout: after a response, the next request's headers must come within it.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=CANCEL_AFTER_DRAIN_S, lingering_time=0,
                                     keepalive_timeout=self.keepalive_s)
        await self._runner.setup()
        assert self._runner.server is not None
        # Not a web.TCPSite: the listening socket's protocol factory is the ConnectionGuard,
        # which counts and times every connection before aiohttp sees it (and does TLS).
        self._guard = ConnectionGuard(
            self._runner.server, self.connection_limits, ssl_context=self._ssl,
            on_refused=lambda reason: self.metrics.rejected.labels(reason=reason).inc())
        self.metrics.http_connections.set_function(lambda: self._guard.open if self._guard else 0)
        self._server = await asyncio.get_running_loop().create_server(self._guard, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        """Stop listening, let aiohttp finish its connections (cancelling what is left after
        CANCEL_AFTER_DRAIN_S), then close whatever the guard still holds (a TLS handshake)."""
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._guard is not None:
            self._guard.close_all()

    def _call(self, coro: Coroutine[Any, Any, Any], timeout: float) -> None:
        assert self._loop is not None
        try:
            asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)
        except Exception as e:  # noqa: BLE001 - closing must go on
            log.warning("http gateway: closing step failed", extra={"error": repr(e)})

    def begin_drain(self) -> None:
        """From now on, new requests get 503 (with Retry-After; an unread body closes its
        connection) and health checks say NOT_SERVING. The port keeps listening until
        ``stop``: a client that connects gets that answer at once instead of a refusal (and
        Python 3.11's asyncio can leave a connection accepted while its server closes
        unanswered, which would hang a client until its own timeout)."""
        self._draining = True

    def stop(self, grace_s: float = 5.0) -> None:
        """Drain: let requests in progress finish for up to ``grace_s`` seconds, then cancel
        the rest, close the connections and stop the loop. Idempotent."""
        if self._loop is None:
            return
        self.begin_drain()
        deadline = time.monotonic() + max(0.0, grace_s)
        while self._inflight > 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._thread is not None and self._thread.is_alive():
            self._call(self._close(), CANCEL_AFTER_DRAIN_S + 10.0)
        loop, self._loop = self._loop, None
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if not loop.is_running():
            loop.close()
        self._workers.shutdown(wait=False, cancel_futures=True)

    # -- the gate: token, limit, errors, metrics ----------------------------------------------
    @web.middleware
    async def _gate(self, request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        start = time.monotonic()
        path = request.path
        known = path in SCORING_PATHS or path in PROBE_PATHS
        method = f"{request.method} {path}" if known else "HTTP other"  # bounded label values
        counted = False
        if self._guard is not None:
            self._guard.headers_arrived(request.transport)  # its header deadline is met
        try:
            if path not in PROBE_PATHS:
                if self._draining:
                    raise VerifierError("the verifier is draining; retry on another replica",
                                        "unavailable")
                if self.tokens is not None:
                    token = _presented_token(request)
                    if not self.tokens.accepts(token):
                        raise VerifierError("missing bearer token" if not token
                                            else "invalid bearer token", "unauthenticated")
                if self._inflight >= self.max_requests:
                    self.metrics.rejected.labels(reason="too_many_calls").inc()
                    raise VerifierError(f"verifier busy: {self.max_requests} HTTP requests "
                                        "already in progress; retry later", "resource_exhausted")
                self._inflight += 1
                counted = True
            resp = await handler(request)
        except asyncio.CancelledError:
            self.metrics.request_done(method, "cancelled", start)
            raise
        except Exception as e:  # noqa: BLE001 - VerifierError, aiohttp's refusals, bugs
            resp = self._refusal(request, method, e)
        finally:
            if counted:
                self._inflight -= 1
        self.metrics.request_done(method, str(resp.status), start)
        return resp

    def _refusal(self, request: web.Request, method: str, exc: Exception) -> web.Response:
        if isinstance(exc, web.HTTPException):
            err = _from_aiohttp(exc)
        elif isinstance(exc, VerifierError):
            err = exc
        else:
            log.exception("http gateway: request failed", extra={"method": method})
            err = VerifierError(f"internal error: {type(exc).__name__}: {exc}"[:300], "internal")
        log.info("http request refused", extra={"peer": request.remote, "method": method,
                                                "reason": str(err)[:300]})
        # A refusal whose body was not read closes the connection: nothing of it is read.
        return _error_response(err, close=not request.content.is_eof())

    async def _json(self, request: web.Request) -> Any:
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            raise VerifierError(f"the body of {length} bytes is over this server's limit of "
                                f"{self.max_body_bytes >> 20} MiB", "payload_too_large")
        try:
            body = await asyncio.wait_for(request.read(), self.body_timeout_s)
        except TimeoutError:
            raise VerifierError(f"the request body did not arrive within "
                                f"{self.body_timeout_s:g} s of its headers",
                                "request_timeout") from None
        except web.HTTPRequestEntityTooLarge:
            raise VerifierError(f"the body is over this server's limit of "
                                f"{self.max_body_bytes >> 20} MiB", "payload_too_large") from None
        if len(body) <= INLINE_JSON_BYTES:
            return _decode_json(body)
        return await asyncio.get_running_loop().run_in_executor(self._workers, _decode_json, body)

    # -- handlers -------------------------------------------------------------------------------
    async def _health(self, _request: web.Request) -> web.Response:
        if self._draining:
            return web.json_response({"status": "NOT_SERVING"}, status=503)
        return web.json_response({"status": "SERVING"})

    async def _ping(self, _request: web.Request) -> web.Response:
        if self._draining:
            return web.json_response("draining", status=503)
        return web.json_response("pong")

    async def _run_code(self, request: web.Request) -> web.Response:
        cfg = self.scorer.config
        run_request = parse_run_code(await self._json(request), cfg.max_timeout_s,
                                     cfg.max_memory_mb)
        try:
            fut = self.code_runner.submit(run_request)
        except VerifierError as e:
            if e.code == "resource_exhausted":
                self.metrics.rejected.labels(reason="queue_full").inc()
            raise
        run = await asyncio.wrap_future(fut)
        if run.status == "error":
            self.metrics.sandbox_failures.inc()
        return web.json_response(run_code_response(run))

    async def _get_reward(self, request: web.Request) -> web.Response:
        entries = reward_items(await self._json(request), self.scorer.config.max_pending)
        return web.json_response(reward_answer(await self._scored(entries)))

    async def _score(self, request: web.Request) -> web.Response:
        entries = score_items(await self._json(request), self.scorer.config.max_pending)
        return web.json_response(score_answer(await self._scored(entries)))

    # -- items ----------------------------------------------------------------------------------
    async def _scored(self, entries: list[Entry]) -> list[Result]:
        """Every entry's Result, in order. A full queue refuses the whole request (429)."""
        loop = asyncio.get_running_loop()
        futures = await loop.run_in_executor(self._workers, self._submit_all, entries)
        try:
            return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
        finally:
            for f in futures:
                f.cancel()  # no-op for the finished; frees the queue of a request gone away

    def _submit_all(self, entries: list[Entry]) -> list[cf.Future]:
        return submit_all(self._submit, entries, self.metrics, [])

    def _submit(self, entry: Entry) -> cf.Future:
        """One item to the Scorer, counted in the metrics as the gRPC servicer counts it."""
        domain = entry.domain if isinstance(entry, Item) and isinstance(entry.domain, str) else ""
        return submit_metered(self.scorer, self.metrics, entry, domain, log)
