"""Client-side fleet support: one client, many verifier replicas.

An address is a comma list of entries; each entry is a ``host:port`` (one replica) or
``dns:///name:port`` (every address the name resolves to, re-resolved every
``ClientConfig.dns_refresh_s`` and after failures: a Kubernetes headless Service or a
docker-compose service name with several replicas). Each replica gets its own channel.

Why our own balancing instead of gRPC's ``round_robin`` policy over one channel: gRPC balances
per RPC, and one stream call is pinned to one replica for its whole life, so a single
streaming client would never use more than one replica. Here one logical stream runs one gRPC
stream per healthy replica and hands each item to a replica with room in its window
(``ClientConfig.stream_window`` items in flight per replica; with equally fast replicas that
alternates, and a slow or busy replica simply takes fewer), so one client scales with the fleet.
The streams are ``ScoreBatchStream`` calls: up to ``ClientConfig.stream_batch`` items per
message (docs/verifier.md 3); a replica that answers UNIMPLEMENTED (a server from before that
call) gets ``ScoreStream``, a message per item.

Failure handling (``FleetStream``):
- a replica whose stream breaks (UNAVAILABLE, RESOURCE_EXHAUSTED, a server-side cancel, an early
  close) is marked down with exponential backoff; its unanswered items go back to the front of
  the queue and are sent to the other replicas at once;
- a down replica is health-checked (``grpc.health.v1``) before it gets items again, so a replica
  that comes back (a restarted pod, the same or a new address) is used again;
- every item yields exactly one result: results are matched to outstanding items by id and a
  late duplicate (an item answered by two replicas around a failure) is dropped;
- the call gives up (VerifierError "unavailable") only while work is outstanding and every known
  replica has failed more than ``max_retries`` times in a row without answering anything;
- unless ``ClientConfig.outage_window_s`` > 0 (``trainer run``: 600 s): then it rides out an
  outage instead. While every replica is down (each failing since its last answer, none with a
  stream open, or no address resolving) it keeps probing them with the same backoff, logs one
  line per wait (the replicas down, the items waiting, the outage's length and the window) and
  re-sends the unanswered items to the first replica back, each still answered exactly once;
  it gives up only once the outage has lasted longer than the window (timed from the last
  replica's first failure, or from the stream's start if that is later).
"""

from __future__ import annotations

import logging
import queue
import random
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from verifier.auth import AUTH_HEADER, client_credentials, client_token
from verifier.client.config import ClientConfig
from verifier.convert import RETRY_AFTER_KEY, encode_item, result_from_proto
from verifier.items import Item, Result, VerifierError
from verifier.proto import verifier_pb2 as pb
from verifier.proto import verifier_pb2_grpc as pb_grpc

log = logging.getLogger("verifier.client")

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)

BATCH_BYTES = 4 * 1024 * 1024
"""A batched stream's message takes no more items once it holds this many bytes (it always
holds one): items with big ground truths travel one or a few per message, far under the
message limit (``ClientConfig.max_message_mb``, 256 MiB), while math items still go 64 at a
time."""

getaddrinfo = socket.getaddrinfo  # the resolver (tests replace it to fake a multi-address name)


# ---------------------------------------------------------------------------------------------
# Addresses
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One entry of an address list: a fixed gRPC target, or a DNS name to resolve."""

    text: str
    dns_host: str | None = None
    port: int | None = None


def split_host_port(text: str, entry: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port); ``entry`` names it in the error."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_s = rest[1:] if rest.startswith(":") else ""
        if not sep:
            port_s = ""
    else:
        host, _, port_s = text.rpartition(":")
    if not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise VerifierError(f"verifier address {entry!r}: expected dns:///HOST:PORT",
                            "invalid_argument")
    return host, int(port_s)


def parse_address(address: str) -> list[Target]:
    """``"h1:p1,h2:p2"``, ``"dns:///name:port"`` or a mix -> targets."""
    entries = [e.strip() for e in (address or "").split(",") if e.strip()]
    if not entries:
        raise VerifierError("empty verifier address", "invalid_argument")
    targets: list[Target] = []
    for e in entries:
        if e.startswith("dns:"):
            rest = e[4:]
            if rest.startswith("//"):
                authority, slash, rest = rest[2:].partition("/")
                if authority or not slash:
                    raise VerifierError(
                        f"verifier address {e!r}: a DNS server in the address is not supported; "
                        "use dns:///HOST:PORT (the system resolver)", "invalid_argument")
            host, port = split_host_port(rest, e)
            targets.append(Target(e, host, port))
        else:
            targets.append(Target(e))
    return targets


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, as gRPC targets (``ip:port``, ``[ip6]:port``),
    de-duplicated, in resolver order."""
    out: list[str] = []
    for family, _t, _p, _c, sockaddr in getaddrinfo(host, port, type=socket.SOCK_STREAM):
        ip = sockaddr[0]
        target = f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
        if target not in out:
            out.append(target)
    return out


# ---------------------------------------------------------------------------------------------
# Replicas
# ---------------------------------------------------------------------------------------------


def backoff_s(attempt: int, cfg: ClientConfig) -> float:
    base = min(cfg.max_backoff_s, cfg.backoff_s * (2 ** min(attempt, 30)))
    return base * (0.5 + random.random() / 2)


def retry_hint_s(err: grpc.RpcError) -> float | None:
    """The server's ``retry-after-ms`` trailer on RESOURCE_EXHAUSTED, in seconds."""
    try:
        for key, value in err.trailing_metadata() or ():  # type: ignore[attr-defined]
            if key == RETRY_AFTER_KEY:
                return float(value) / 1000.0
    except Exception:  # noqa: BLE001 - no trailers on this error
        return None
    return None


def channel_options(cfg: ClientConfig, server_name: str | None = None) -> list[tuple[str, Any]]:
    n = cfg.max_message_mb * 1024 * 1024
    opts: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", n),
        ("grpc.max_send_message_length", n),
        # Reconnect quickly to a replica that comes back (gRPC's default backoff grows to 120 s).
        ("grpc.initial_reconnect_backoff_ms", max(50, int(cfg.backoff_s * 1000))),
        ("grpc.min_reconnect_backoff_ms", max(50, int(cfg.backoff_s * 1000))),
        ("grpc.max_reconnect_backoff_ms", max(100, int(cfg.max_backoff_s * 1000))),
        # Notice a replica that vanished without a TCP reset (a node gone) on a long, quiet call.
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # One connection per channel: replicas are distinct channels already.
        ("grpc.use_local_subchannel_pool", 1),
    ]
    name = cfg.tls_server_name or server_name
    if name and cfg.uses_tls:
        opts.append(("grpc.ssl_target_name_override", name))
    return opts


class Replica:
    """One server: its channel, stubs, health and counters."""

    def __init__(self, address: str, cfg: ClientConfig, server_name: str | None,
                 credentials: grpc.ChannelCredentials | None):
        self.address = address
        opts = channel_options(cfg, server_name)
        if credentials is not None:
            self.channel = grpc.secure_channel(address, credentials, options=opts)
        else:
            self.channel = grpc.insecure_channel(address, options=opts)
        self.stub = pb_grpc.VerifierStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.lock = threading.Lock()
        self.failures = 0
        """Failed attempts in a row (reset by any answer)."""
        self.retry_at = 0.0
        """time.monotonic() before which this replica gets no new attempt."""
        self.down_since: float | None = None
        """time.monotonic() of the first of its current failures in a row; None while it
        answers (the start of an outage, ``ClientConfig.outage_window_s``)."""
        self.retired = False
        """No longer in the DNS answer: finishes what it has, takes nothing new."""
        self.sent = 0
        self.answered = 0
        self.failed = 0
        self.batch_stream = True
        """Speaks ScoreBatchStream; False once it answered UNIMPLEMENTED (an older server)."""

    def record_failure(self, cfg: ClientConfig, hint_s: float | None = None) -> float:
        with self.lock:
            if self.failures == 0:
                self.down_since = time.monotonic()
            self.failures += 1
            self.failed += 1
            delay = backoff_s(self.failures - 1, cfg)
            if hint_s is not None:
                delay = max(delay, hint_s)
            self.retry_at = time.monotonic() + delay
            return delay

    def record_success(self) -> None:
        with self.lock:
            self.failures = 0
            self.retry_at = 0.0
            self.down_since = None

    def check_health(self, timeout_s: float, metadata: tuple = ()) -> bool:
        try:
            resp = self.health_stub.Check(health_pb2.HealthCheckRequest(service=""),
                                          timeout=timeout_s, metadata=metadata or None)
        except grpc.RpcError:
            return False
        return resp.status == health_pb2.HealthCheckResponse.SERVING

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"sent": self.sent, "answered": self.answered, "failed": self.failed,
                    "consecutive_failures": self.failures, "retired": self.retired}


class Fleet:
    """The replicas behind one address string (static entries and resolved DNS names)."""

    def __init__(self, address: str, cfg: ClientConfig):
        self.address = address
        self.cfg = cfg
        self.targets = parse_address(address)
        self.credentials = (client_credentials(cfg.tls_ca, cfg.tls_cert, cfg.tls_key)
                            if cfg.uses_tls else None)
        token = client_token(cfg.token_file, cfg.token_env)
        self.metadata: tuple[tuple[str, str], ...] = (
            ((AUTH_HEADER, f"Bearer {token}"),) if token else ())
        self._lock = threading.Lock()
        self._replicas: dict[str, Replica] = {}
        self._rr = 0
        self._next_resolve = 0.0
        self._closed = False
        self.refresh(force=True)

    @property
    def dynamic(self) -> bool:
        return any(t.dns_host is not None for t in self.targets)

    def refresh(self, force: bool = False) -> list[Replica]:
        """Re-resolve DNS entries when due (or ``force``; at most once a second); returns the
        active replicas."""
        now = time.monotonic()
        with self._lock:
            due = now >= self._next_resolve or (force and now >= self._next_resolve
                                                - self.cfg.dns_refresh_s + 1.0)
            if not self._replicas or (self.dynamic and due):
                self._next_resolve = now + self.cfg.dns_refresh_s
                self._resolve_locked()
            return [r for r in self._replicas.values() if not r.retired]

    def _resolve_locked(self) -> None:
        wanted: dict[str, str | None] = {}
        for t in self.targets:
            if t.dns_host is None:
                wanted.setdefault(t.text, None)
                continue
            assert t.port is not None
            try:
                for a in resolve(t.dns_host, t.port):
                    wanted.setdefault(a, t.dns_host)
            except OSError as e:
                known = [a for a in self._replicas if self._replicas[a].retired is False]
                log.warning("cannot resolve verifier address", extra={
                    "target": t.text, "error": str(e), "keeping": known})
                for a, r in self._replicas.items():  # keep the last answer for this name
                    if not r.retired:
                        wanted.setdefault(a, None)
        for a, name in wanted.items():
            rep = self._replicas.get(a)
            if rep is None:
                self._replicas[a] = Replica(a, self.cfg, name, self.credentials)
                if self.dynamic:
                    log.info("verifier replica added", extra={"replica": a})
            elif rep.retired:
                rep.retired = False
        for a, rep in self._replicas.items():
            if a not in wanted and not rep.retired:
                rep.retired = True
                log.info("verifier replica removed", extra={"replica": a})

    def active(self) -> list[Replica]:
        return self.refresh()

    def pick(self) -> tuple[Replica | None, float]:
        """Round robin over active replicas not backing off; if all are, the one free soonest
        and how long to wait for it."""
        reps = self.active()
        if not reps:
            return None, 0.0
        now = time.monotonic()
        with self._lock:
            n = len(reps)
            for k in range(n):
                r = reps[(self._rr + k) % n]
                if r.retry_at <= now:
                    self._rr = (self._rr + k + 1) % n
                    return r, 0.0
        soonest = min(reps, key=lambda r: r.retry_at)
        return soonest, max(0.0, soonest.retry_at - now)

    def stats(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            reps = list(self._replicas.values())
        return {r.address: r.stats() for r in reps}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            reps = list(self._replicas.values())
        for r in reps:
            r.channel.close()


# ---------------------------------------------------------------------------------------------
# One logical stream over the fleet
# ---------------------------------------------------------------------------------------------


class _Pending:
    """Items sent (or queued to send) but not yet answered, keyed by id (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, pb.Item] = {}
        self._answered: set[str] = set()

    def add(self, msg: pb.Item) -> None:
        with self._lock:
            if msg.id in self._items or msg.id in self._answered:
                raise VerifierError(f"duplicate item id {msg.id!r} in one stream",
                                    "invalid_argument")
            self._items[msg.id] = msg

    def answer(self, item_id: str) -> bool:
        """Mark answered; False for a duplicate or unknown id (dropped)."""
        with self._lock:
            if self._items.pop(item_id, None) is None:
                return False
            self._answered.add(item_id)
            return True

    def is_pending(self, item_id: str) -> bool:
        with self._lock:
            return item_id in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class _Attempt:
    """One gRPC stream to one replica: the items it carries that are not answered yet."""

    def __init__(self, replica: Replica, batched: bool):
        self.replica = replica
        self.batched = batched
        """ScoreBatchStream (ItemBatch / ResultBatch messages) rather than ScoreStream."""
        self.inflight: dict[str, pb.Item] = {}
        self.alive = True
        self.call: Any = None


_END = object()


class FleetStream:
    """One logical stream over every healthy replica of a fleet (``ScoreBatchStream``, or
    ``ScoreStream`` for ``stream_batch`` 1 and for a server without the batched call). Iterate
    it for the results (completion order); ``close()`` stops it from any thread."""

    def __init__(self, fleet: Fleet, items: Iterable[Item | dict[str, Any]]):
        self.fleet = fleet
        self.cfg = fleet.cfg
        self.window = max(1, self.cfg.stream_window)
        self._source = iter(items)
        self._cond = threading.Condition()
        self._ready: deque[pb.Item] = deque()
        self._requeue: deque[pb.Item] = deque()
        self._pending = _Pending()
        self._out: queue.Queue = queue.Queue(maxsize=4 * self.window)
        self._total = 0
        self._emitted = 0
        self._source_done = False
        self._closed = False
        self._cancelled = False
        self._error: BaseException | None = None
        self._attempts: set[_Attempt] = set()
        self._workers: dict[str, threading.Thread] = {}
        self._empty_rounds = 0
        self._empty_since: float | None = None
        """When this stream last found no replica at all (the outage clock of that case)."""
        self._next_empty_check = 0.0
        self._started = False
        self._started_at = 0.0

    # -- consumer -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Result]:
        self._start()
        next_housekeeping = 0.0
        try:
            while True:
                with self._cond:
                    if self._error is not None:
                        raise self._error
                    if self._closed:  # close() from another thread
                        return
                    done = self._source_done and self._emitted == self._total
                if done:
                    # The streams are half-closed with nothing in flight and end with the
                    # servers' OK; cancelling them would book CANCELLED on the servers.
                    self._finish(cancel=False)
                    return
                try:
                    kind, x = self._out.get(timeout=0.25)
                except queue.Empty:
                    kind, x = "idle", None
                now = time.monotonic()
                if now >= next_housekeeping:  # also while results flow: new replicas join
                    next_housekeeping = now + 0.25
                    self._housekeeping()
                if kind == "result":
                    with self._cond:
                        self._emitted += 1
                    yield x
        finally:
            self.close()

    def close(self) -> None:
        """Stop: cancel the open gRPC streams (unanswered items are abandoned)."""
        self._finish(cancel=True)

    def _finish(self, cancel: bool) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cancelled = cancel
            attempts = list(self._attempts)
            self._cond.notify_all()
        if not cancel:
            # Let the half-closed streams receive the servers' OK (a millisecond or so) before
            # the caller may close the channel; cancel whatever is still open after that.
            deadline = time.monotonic() + 2.0
            for t in list(self._workers.values()):
                if t is not threading.current_thread():
                    t.join(timeout=max(0.0, deadline - time.monotonic()))
            with self._cond:
                attempts = list(self._attempts)
        for att in attempts:
            if att.call is not None:
                att.call.cancel()

    @property
    def unanswered(self) -> int:
        return len(self._pending) + len(self._requeue)

    # -- internals ------------------------------------------------------------------------
    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self._started_at = time.monotonic()
        threading.Thread(target=self._feed, name="verifier-feed", daemon=True).start()
        self._ensure_workers()

    def _ensure_workers(self) -> None:
        for rep in self.fleet.active():
            t = self._workers.get(rep.address)
            if t is None or not t.is_alive():
                t = threading.Thread(target=self._work, args=(rep,), daemon=True,
                                     name=f"verifier-stream-{rep.address}")
                self._workers[rep.address] = t
                t.start()

    def _put(self, entry: tuple[str, Any]) -> bool:
        while True:
            try:
                self._out.put(entry, timeout=0.25)
                return True
            except queue.Full:
                if self._closed:
                    return False

    def _fail(self, err: BaseException) -> None:
        with self._cond:
            if self._error is None and not self._closed:
                self._error = err
            self._cond.notify_all()
        self._put(("wake", None))

    def _feed(self) -> None:
        """Pull items from the caller's iterator into the ready queue (at most one window
        ahead), turning unsendable ones into local INVALID_INPUT results."""
        try:
            while True:
                with self._cond:
                    while not self._closed and len(self._ready) >= self.window:
                        self._cond.wait(0.5)
                    if self._closed:
                        return
                nxt = next(self._source, _END)
                if nxt is _END:
                    return
                msg = encode_item(nxt)  # type: ignore[arg-type]
                if isinstance(msg, Result):
                    with self._cond:
                        self._total += 1
                    self._put(("result", msg))
                    continue
                with self._cond:
                    self._pending.add(msg)  # raises on a duplicate id
                    self._total += 1
                    self._ready.append(msg)
                    self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - the caller's iterator failed: tell it
            self._fail(e)
        finally:
            with self._cond:
                self._source_done = True
                self._cond.notify_all()
            self._put(("wake", None))

    def _has_work(self) -> bool:
        return bool(self._requeue or self._ready or not self._source_done)

    def _work(self, rep: Replica) -> None:
        """One replica's loop: open a stream when there is work and the replica is not backing
        off; after a failure, health-check it first."""
        while True:
            with self._cond:
                while True:
                    if self._closed or self._error is not None or rep.retired:
                        return
                    now = time.monotonic()
                    if self._has_work() and rep.retry_at <= now:
                        break
                    wait = rep.retry_at - now if self._has_work() else 0.5
                    self._cond.wait(min(max(wait, 0.01), 0.5))
            if rep.failures and not rep.check_health(
                    min(2.0, self.cfg.timeout_s), self.fleet.metadata):
                delay = rep.record_failure(self.cfg)
                if not self._log_outage_wait(rep, delay, "not healthy"):
                    log.info("verifier replica not healthy; backing off",
                             extra={"replica": rep.address, "delay_s": round(delay, 3),
                                    "failures": rep.failures})
                continue
            self._attempt(rep)

    def _requests(self, att: _Attempt) -> Iterator[pb.Item | pb.ItemBatch]:
        # Consumed by gRPC on its own thread. Takes re-sends first, then fresh items, while this
        # replica's window has room: a batched stream takes every item that is ready into one
        # message without waiting for more items to arrive, up to stream_batch and half the
        # window (so the replica keeps at least the other half in flight while the client
        # waits for room for the next batch); ends the stream (half-close) when nothing is
        # left to send.
        cap = min(self.cfg.stream_batch, max(1, self.window // 2)) if att.batched else 1
        while True:
            with self._cond:
                while True:
                    if self._closed or not att.alive or self._error is not None:
                        return
                    room = self.window - len(att.inflight)
                    # A batched stream waits for room for a whole batch (or for all that is
                    # ready, when that is less): sending each slot as it frees would make every
                    # message one item again.
                    ready = len(self._requeue) + len(self._ready)
                    if room > 0 and ready and room >= min(cap, ready):
                        break
                    if room > 0 and not ready and self._source_done:
                        return
                    self._cond.wait(0.5)
                batch: list[pb.Item] = []
                take, size, took_fresh = min(room, cap), 0, False
                # Re-sends first; a message stops growing past BATCH_BYTES (a code item's
                # tests can be megabytes: 64 of them would pass the message limit).
                while len(batch) < take and size < BATCH_BYTES and (self._requeue
                                                                    or self._ready):
                    if self._requeue:
                        msg = self._requeue.popleft()
                    else:
                        msg = self._ready.popleft()
                        took_fresh = True
                    batch.append(msg)
                    if att.batched:  # a message per item needs no size (one ByteSize = one encode)
                        size += msg.ByteSize()
                if took_fresh:
                    self._cond.notify_all()  # room for the feeder
                for msg in batch:
                    att.inflight[msg.id] = msg
                with att.replica.lock:
                    att.replica.sent += len(batch)
            yield pb.ItemBatch(items=batch) if att.batched else batch[0]

    def _attempt(self, rep: Replica) -> None:
        att = _Attempt(rep, batched=rep.batch_stream and self.cfg.stream_batch > 1)
        with self._cond:
            if self._closed:
                return
            self._attempts.add(att)
        err: grpc.RpcError | None = None
        try:
            method = rep.stub.ScoreBatchStream if att.batched else rep.stub.ScoreStream
            att.call = method(self._requests(att), timeout=self.cfg.timeout_s,
                              metadata=self.fleet.metadata or None, wait_for_ready=False)
            if self._cancelled:
                att.call.cancel()
            for resp in att.call:
                for msg in (resp.results if att.batched else (resp,)):
                    with self._cond:
                        if att.inflight.pop(msg.id, None) is None:
                            continue
                        self._cond.notify_all()  # window room
                    if self._pending.answer(msg.id):
                        rep.record_success()
                        with rep.lock:
                            rep.answered += 1
                        if not self._put(("result", result_from_proto(msg))):
                            return
        except grpc.RpcError as e:
            err = e
        finally:
            with self._cond:
                att.alive = False
                self._attempts.discard(att)
                leftovers = [m for i, m in att.inflight.items() if self._pending.is_pending(i)]
                # Re-sends go first, ahead of fresh items: they are the oldest.
                self._requeue.extendleft(reversed(leftovers))
                self._cond.notify_all()
            if att.call is not None:
                att.call.cancel()
        if self._closed:
            return
        if err is None:
            if leftovers:
                delay = rep.record_failure(self.cfg)
                if not self._log_outage_wait(rep, delay, "stream closed early"):
                    log.warning("verifier stream closed early; re-sending its unanswered items",
                                extra={"replica": rep.address, "unanswered": len(leftovers),
                                       "delay_s": round(delay, 3)})
            return
        code = err.code()
        if code == grpc.StatusCode.UNIMPLEMENTED and att.batched:
            # A server from before ScoreBatchStream: the same items go on ScoreStream, a
            # message each (not a failure: nothing was scored, the replica is up).
            rep.batch_stream = False
            log.warning("verifier replica has no ScoreBatchStream; streaming a message per "
                        "item to it", extra={"replica": rep.address})
            return
        if code in RETRYABLE or code in (grpc.StatusCode.CANCELLED,
                                          grpc.StatusCode.DEADLINE_EXCEEDED):
            # CANCELLED here is the server's doing (a drain past its grace), not ours;
            # DEADLINE_EXCEEDED is this attempt's timeout_s: a long stream is reopened.
            delay = rep.record_failure(self.cfg, retry_hint_s(err))
            if not self._log_outage_wait(rep, delay, f"stream broke ({code.name})"):
                log.warning("verifier stream broke; re-sending its unanswered items elsewhere",
                            extra={"replica": rep.address, "code": code.name,
                                   "unanswered": len(leftovers), "delay_s": round(delay, 3),
                                   "failures": rep.failures})
            self.fleet.refresh(force=True)
            return
        self._fail(err)

    def _housekeeping(self) -> None:
        """Every quiet quarter second: pick up new replicas, give up when none can work."""
        if self._closed or self._error is not None:
            return
        reps = self.fleet.active()
        self._ensure_workers()
        with self._cond:
            outstanding = not (self._source_done and self._emitted == self._total)
            unanswered = len(self._pending)
        if not outstanding:
            return
        if not reps:
            self._no_replica(unanswered)
            return
        self._empty_rounds, self._empty_since = 0, None
        window = self.cfg.outage_window_s
        if window > 0:
            down_for = self._outage_s(reps)
            if down_for is not None and down_for > window:
                self._fail(VerifierError(
                    f"verifier at {self.fleet.address} unreachable for {down_for:.0f} s, past "
                    f"the outage window of {window:g} s: every replica down "
                    f"({', '.join(r.address for r in reps)}); {unanswered} items unanswered",
                    "unavailable"))
        elif all(r.failures > self.cfg.max_retries for r in reps):
            self._fail(VerifierError(
                f"stream to {self.fleet.address} failed: every replica failed more than "
                f"{self.cfg.max_retries} times in a row; {unanswered} items unanswered",
                "unavailable"))

    def _no_replica(self, unanswered: int) -> None:
        """No address resolves: resolve again with backoff; give up past the outage window, or
        without one after ``max_retries`` rounds."""
        now = time.monotonic()
        window = self.cfg.outage_window_s
        if self._empty_since is None:
            self._empty_since = now
        if now >= self._next_empty_check:
            self._empty_rounds += 1
            delay = backoff_s(self._empty_rounds - 1, self.cfg)
            self._next_empty_check = now + delay
            self.fleet.refresh(force=True)
            if window > 0:
                log.warning("verifier outage: no replica found at %s; %d items waiting; %.1f s of "
                            "the %g s outage window waited; resolving again in %.1f s",
                            self.fleet.address, unanswered, now - self._empty_since, window, delay,
                            extra={"items_waiting": unanswered, "outage_window_s": window,
                                   "outage_s": round(now - self._empty_since, 3)})
        if window > 0 and now - self._empty_since > window:
            self._fail(VerifierError(
                f"no verifier replica found at {self.fleet.address} for "
                f"{now - self._empty_since:.0f} s, past the outage window of {window:g} s; "
                f"{unanswered} items unanswered", "unavailable"))
        elif window <= 0 and self._empty_rounds > self.cfg.max_retries:
            self._fail(VerifierError(
                f"no verifier replica found at {self.fleet.address}; "
                f"{unanswered} items unanswered", "unavailable"))

    def _outage_s(self, reps: list[Replica]) -> float | None:
        """How long every replica of ``reps`` has been down for this stream, seconds: since the
        last of them began failing (or since the stream began, if later: a replica that failed
        in an earlier stream does not use up this one's window); None while one is up,
        answering or with a stream open that may yet answer (a replica just back, scoring)."""
        with self._cond:
            open_on = {att.replica.address for att in self._attempts}
        since = self._started_at
        for r in reps:
            down_since = r.down_since  # one read: another thread may reset it
            if down_since is None or r.address in open_on:
                return None
            since = max(since, down_since)
        return time.monotonic() - since

    def _log_outage_wait(self, rep: Replica, delay: float, cause: str) -> bool:
        """Log this wait of ``rep`` as one outage line when ``outage_window_s`` > 0 and every
        replica is down: the replicas down, the items waiting, the outage's length so far and
        the window. False when it is no outage (the caller logs its own line)."""
        window = self.cfg.outage_window_s
        reps = self.fleet.active()
        down_for = self._outage_s(reps) if window > 0 and reps else None
        if down_for is None:
            return False
        names = [r.address for r in reps]
        waiting = len(self._pending)
        log.warning("verifier outage: every replica down (%s); %d items waiting; %.1f s of the "
                    "%g s outage window waited; %s %s, next try in %.1f s", ", ".join(names),
                    waiting, down_for, window, rep.address, cause, delay,
                    extra={"replicas_down": names, "items_waiting": waiting,
                           "outage_s": round(down_for, 3), "outage_window_s": window,
                           "replica": rep.address, "delay_s": round(delay, 3)})
        return True
