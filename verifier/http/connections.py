"""The HTTP gateway's connections: how many, from whom, and how long before a request.

A connection costs the replica a file descriptor whether or not it ever sends a byte, and the
descriptors are shared with the jails and gRPC (verifier/service/descriptors.py). aiohttp bounds
neither the number of connections nor the time a new one may take over its request line and
headers (a red team held 1,000 silent connections and the server ran out of descriptors). The
``ConnectionGuard`` does, around aiohttp's own request handling:

- it is the protocol factory of the gateway's listening socket: every accepted connection is
  a ``_Connection`` that is counted, in total and per peer IP, before anything is read; one
  over a cap is closed at once and counted (``on_refused``: the gateway's
  ``verifier_rejected_total{reason}``);
- an admitted connection must deliver its first request's line and headers within
  ``header_timeout_s`` (its TLS handshake included), else it is closed; the gateway calls
  ``headers_arrived`` when a request reaches it. After each response, aiohttp's own
  ``keepalive_timeout`` bounds the wait for the next request's headers (an idle kept-alive
  connection, or one that sends the next headers slowly, is closed then);
- with TLS, the handshake starts after the connection is counted (``loop.start_tls``), so a
  client that never finishes it is bounded like a silent one.

Everything here runs on the gateway's event-loop thread (asyncio calls protocols and timers
there), so the counts need no lock. The inner protocol is aiohttp's (``web.Server`` is its
factory); ``_Connection`` forwards the transport's calls to it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

REFUSED_TOTAL = "http_connections"
REFUSED_PER_PEER = "http_connections_per_peer"
HEADER_TIMEOUT = "http_header_timeout"
"""The ``reason`` labels of what the guard refuses or closes."""
WARN_EVERY_S = 10.0
"""At most one log line per this many seconds about refused connections (a flood must not
become a flood of log lines); the metrics count every one."""


@dataclass(frozen=True)
class ConnectionLimits:
    max_total: int
    """Open connections at once (admitted; idle, reading or answering)."""
    max_per_peer: int
    """Open connections from one IP address."""
    header_timeout_s: float
    """Seconds from accept to the first request's complete headers (TLS handshake included)."""


class ConnectionGuard:
    """The protocol factory of the gateway's listening socket (module docstring).
    ``inner``: aiohttp's protocol factory (``AppRunner.server``); ``on_refused(reason)``: called
    for every connection refused or closed for its header deadline."""

    def __init__(self, inner: Callable[[], asyncio.Protocol], limits: ConnectionLimits, *,
                 ssl_context: ssl.SSLContext | None = None,
                 on_refused: Callable[[str], None] = lambda _reason: None):
        self.limits = limits
        self._inner = inner
        self._ssl = ssl_context
        self._on_refused = on_refused
        self._open: set[_Connection] = set()
        self._per_peer: Counter[str] = Counter()
        self._by_transport: dict[asyncio.BaseTransport, _Connection] = {}
        self._refused_since_warning = 0
        self._warned_at = 0.0

    def __call__(self) -> asyncio.Protocol:
        return _Connection(self)

    @property
    def open(self) -> int:
        """Connections admitted and not yet closed."""
        return len(self._open)

    def headers_arrived(self, transport: asyncio.BaseTransport | None) -> None:
        """A request's line and headers arrived on ``transport`` (the request's): its
        connection's header deadline is met."""
        conn = self._by_transport.get(transport) if transport is not None else None
        if conn is not None:
            conn.disarm()

    def close_all(self) -> None:
        """Close every connection still open (the gateway is stopping)."""
        for conn in list(self._open):
            conn.abort()

    # -- called by _Connection ----------------------------------------------------------------
    def _admit(self, conn: _Connection, peer: str) -> str | None:
        """Count ``conn`` in, or return why it is refused."""
        if len(self._open) >= self.limits.max_total:
            return REFUSED_TOTAL
        if self._per_peer[peer] >= self.limits.max_per_peer:
            return REFUSED_PER_PEER
        self._open.add(conn)
        self._per_peer[peer] += 1
        return None

    def _release(self, conn: _Connection, peer: str) -> None:
        self._open.discard(conn)
        self._per_peer[peer] -= 1
        if self._per_peer[peer] <= 0:
            del self._per_peer[peer]

    def _refused(self, reason: str, peer: str) -> None:
        self._on_refused(reason)
        self._refused_since_warning += 1
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            log.warning("http connections refused or closed", extra={
                "reason": reason, "peer": peer, "since_last_warning": self._refused_since_warning,
                "open": len(self._open), "max_total": self.limits.max_total,
                "max_per_peer": self.limits.max_per_peer})
            self._warned_at, self._refused_since_warning = now, 0


class _Connection(asyncio.Protocol):
    """One accepted connection: counted, given its header deadline, then (after the TLS
    handshake, with TLS) handed to aiohttp's protocol, to which every later call is forwarded."""

    def __init__(self, guard: ConnectionGuard):
        self._guard = guard
        self._peer = "?"
        self._tcp: asyncio.Transport | None = None
        self._transport: asyncio.BaseTransport | None = None  # aiohttp's (TLS: the app side)
        self._inner: asyncio.Protocol | None = None
        self._early: list[bytes] = []  # TLS: data decrypted before aiohttp took over
        self._timer: asyncio.TimerHandle | None = None
        self._tls: asyncio.Task | None = None
        self._admitted = False

    # -- the transport's calls ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._tcp = transport
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else str(peer)
        refused = self._guard._admit(self, self._peer)
        if refused is not None:
            # Closed before anything is read: the descriptor is free again at once.
            transport.abort()
            self._guard._refused(refused, self._peer)
            return
        self._admitted = True
        loop = asyncio.get_running_loop()
        # The deadline of the first request's line and headers, from accept: a client that
        # sends nothing, or half a request, holds its descriptor no longer than this.
        self._timer = loop.call_later(self._guard.limits.header_timeout_s, self._too_slow)
        if self._guard._ssl is None:
            self._attach(transport)
        else:
            # Nothing is read until start_tls has taken the transport (it resumes reading).
            transport.pause_reading()
            self._tls = loop.create_task(self._start_tls(loop, transport, self._guard._ssl))

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
        else:
            # TLS: the handshake's last flight may carry the request; SSLProtocol hands it over
            # before start_tls has returned the transport aiohttp is given.
            self._early.append(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if self._tls is not None and not self._tls.done():
            self._tls.cancel()
        if self._admitted:
            self._admitted = False
            self._guard._release(self, self._peer)
        if self._transport is not None:
            self._guard._by_transport.pop(self._transport, None)
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.connection_lost(exc)

    # -- the guard's ----------------------------------------------------------------------------
    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def abort(self) -> None:
        if self._tcp is not None and not self._tcp.is_closing():
            self._tcp.abort()  # connection_lost follows (and releases the count)

    def _too_slow(self) -> None:
        self._timer = None
        self._guard._refused(HEADER_TIMEOUT, self._peer)
        self.abort()

    async def _start_tls(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport,
                         ctx: ssl.SSLContext) -> None:
        try:
            tls = await loop.start_tls(transport, self, ctx, server_side=True,
                                       ssl_handshake_timeout=self._guard.limits.header_timeout_s)
        except Exception as e:  # noqa: BLE001 - a failed handshake ends only its connection
            log.debug("http: TLS handshake failed", extra={"peer": self._peer, "error": str(e)})
            self.abort()
            return
        if tls is None or tls.is_closing() or not self._admitted:
            return
        self._attach(tls)

    def _attach(self, transport: asyncio.BaseTransport) -> None:
        """Hand the connection to aiohttp."""
        self._transport = transport
        self._guard._by_transport[transport] = self
        self._inner = self._guard._inner()
        self._inner.connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)
