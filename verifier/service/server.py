"""The gRPC service: a thin layer that converts messages and delegates to the Scorer.

- ``create_server(address) -> (server, port)``: tests bind ``127.0.0.1:0``.
- ``serve(config)``: the ``verifier serve`` command: health + reflection, SIGTERM drain; it
  raises the soft RLIMIT_NOFILE to the hard limit first (verifier/service/descriptors.py).

The servicer (the RPCs themselves) is verifier/service/servicer.py; VerifierError is the one domain
exception, and its ``abort`` is the one place that maps it to a gRPC status code (the call gate
of verifier/service/call_gate.py refuses calls through it too).

Access control (verifier/auth.py): TLS or mutual TLS, and/or a bearer token checked by the call
gate (verifier/service/call_gate.py) when a call's headers arrive, before its body is read; health
checks need no token (probes). The gate also admits calls (scoring and health have separate
slots) and cancels callers that stall. Metrics (verifier/service/metrics.py): a Prometheus endpoint on
its own port when ``metrics_port`` is set. HTTP (verifier/http/gateway.py): SandboxFusion's and
OpenRLHF's APIs on their own port when ``http_port`` is set, served by the same Scorer, token,
TLS and metrics, and drained with the gRPC port.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys
import threading
import time
from concurrent import futures as cf
from typing import TYPE_CHECKING, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from verifier.service.allocator import MallocTuning
from verifier.auth import TokenSource, server_credentials
from verifier.service.call_gate import CallGate
from verifier.items import VerifierError
from verifier.service.metrics import ServerMetrics
from verifier.proto import verifier_pb2 as pb
from verifier.proto import verifier_pb2_grpc as pb_grpc
from verifier.config import ServeConfig
from verifier.service.descriptors import raise_nofile_limit
from verifier.scoring.scorer import Scorer
from verifier.service.servicer import GRPC_CODES, VerifierServicer, abort, peer

if TYPE_CHECKING:
    from verifier.http.gateway import HttpGateway

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Verifier"].full_name

# Keepalive: clients ping every 30 s on a call with no data (a long code item), so a replica
# that vanished without a TCP reset (a node gone) is noticed; the server must accept that.
SERVER_KEEPALIVE_OPTIONS = [
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
]

SWITCH_INTERVAL_S = 0.0005
"""``sys.setswitchinterval`` of a serving process (see ``serve``)."""

class VerifierServer:
    """A running verification service: the gRPC server, its health service, its Scorer, and
    (when configured) the health-only probe server, the metrics endpoint and the HTTP gateway."""

    def __init__(self, grpc_server: grpc.Server, scorer: Scorer,
                 health_servicer: health.HealthServicer, metrics: ServerMetrics | None = None,
                 extra_servers: tuple[grpc.Server, ...] = (), gate: CallGate | None = None,
                 http_gateway: HttpGateway | None = None):
        self.grpc_server = grpc_server
        self.http_gateway = http_gateway
        self.gate = gate
        self.scorer = scorer
        self.health = health_servicer
        self.metrics = metrics or ServerMetrics()
        self.extra_servers = extra_servers
        self.health_port: int | None = None
        self.metrics_port: int | None = None
        self.http_port: int | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        self.grpc_server.start()
        for extra in self.extra_servers:
            extra.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_s: float | None = 5.0) -> None:
        """Drain: report NOT_SERVING, refuse new RPCs, let in-flight ones finish for up to
        ``grace_s`` seconds, then stop the workers."""
        if self._stopped.is_set():
            return
        self.health.enter_graceful_shutdown()
        deadline = time.monotonic() + (grace_s or 0.0)
        if self.http_gateway is not None:
            self.http_gateway.begin_drain()  # both ports drain at once, in one grace
        self.grpc_server.stop(grace_s).wait()
        if self.http_gateway is not None:
            self.http_gateway.stop(max(0.0, deadline - time.monotonic()))
        for extra in self.extra_servers:
            extra.stop(0).wait()
        if self.gate is not None:
            self.gate.close()
        self.scorer.close()
        self.metrics.close()
        self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)


def _bind(grpc_server: grpc.Server, address: str, config: ServeConfig) -> int:
    if config.tls_cert is not None and config.tls_key is not None:
        creds = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
        return grpc_server.add_secure_port(address, creds)
    return grpc_server.add_insecure_port(address)


def _deny(metrics: ServerMetrics) -> Callable[[grpc.ServicerContext, str, VerifierError], None]:
    """The call gate's refusal: books it, logs it, and aborts through ``abort``."""
    def deny(context: grpc.ServicerContext, method: str, err: VerifierError) -> None:
        code = GRPC_CODES.get(err.code, grpc.StatusCode.INTERNAL).name
        metrics.request_done(method.rsplit("/", 1)[-1], code, time.monotonic())
        log.warning("call refused", extra={"peer": peer(context), "method": method,
                                           "reason": str(err)})
        abort(context, err)
    return deny


def create_server(
    address: str = "127.0.0.1:0",
    config: ServeConfig | None = None,
    scorer: Scorer | None = None,
) -> tuple[VerifierServer, int]:
    """Build and start a server bound to ``address`` ("host:port"; port 0 picks one).
    Returns the server and the bound port."""
    config = config or ServeConfig()
    scorer = scorer or Scorer(config.scoring)
    metrics = ServerMetrics()
    metrics.attach_scorer(scorer)
    max_bytes = config.max_message_mb * 1024 * 1024
    tokens = (TokenSource(config.token_file, config.token_env)
              if config.token_file is not None or config.token_env is not None else None)
    gate = CallGate(
        deny=_deny(metrics), tokens=tokens, max_calls=config.max_concurrent_rpcs,
        max_probe_calls=config.max_probe_calls, request_timeout_s=config.request_timeout_s,
        idle_timeout_s=config.idle_timeout_s,
        on_refused=lambda reason: metrics.rejected.labels(reason=reason).inc())
    # The gate (verifier/service/call_gate.py) admits calls: tokens, slots, the client-side deadlines.
    # Each streaming RPC holds one pool thread (plus its own reader thread); unary calls hold
    # one while they run. gRPC's own maximum_concurrent_rpcs is only a backstop above the
    # gate's limits (refusals in flight count there too, for the microseconds they take).
    grpc_server = grpc.server(
        cf.ThreadPoolExecutor(max_workers=config.max_concurrent_rpcs + 4,
                              thread_name_prefix="verifier-rpc"),
        maximum_concurrent_rpcs=4 * (config.max_concurrent_rpcs + config.max_probe_calls),
        interceptors=[gate],
        options=[
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_send_message_length", max_bytes),
            ("grpc.so_reuseport", 0),
            *SERVER_KEEPALIVE_OPTIONS,
        ],
    )
    servicer = VerifierServicer(scorer, config.stream_inflight, scorer.config.max_pending,
                                metrics)
    pb_grpc.add_VerifierServicer_to_server(servicer, grpc_server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, grpc_server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), grpc_server
    )
    extra: list[grpc.Server] = []
    health_port = None
    gateway: HttpGateway | None = None
    try:
        port = _bind(grpc_server, address, config)
        if port == 0:
            raise VerifierError(f"could not bind {address}", "unavailable")
        host = address.rsplit(":", 1)[0]
        if config.health_port is not None:
            probe = grpc.server(cf.ThreadPoolExecutor(max_workers=2,
                                                      thread_name_prefix="verifier-health"))
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, probe)
            health_port = probe.add_insecure_port(f"{host}:{config.health_port}")
            if health_port == 0:
                raise VerifierError(f"could not bind health port {config.health_port}",
                                    "unavailable")
            extra.append(probe)
        metrics_port = None
        if config.metrics_port is not None:
            mhost = config.metrics_host or host.strip("[]")
            metrics_port = metrics.serve_http(mhost, config.metrics_port)
        if config.http_port is not None:
            # Imported here: aiohttp (0.16 s of start-up) is needed only with --http-port;
            # a server without the gateway, and every test or trainer that starts one, skips it.
            from verifier.http.gateway import HttpGateway

            gateway = HttpGateway(
                scorer, metrics, tokens, max_body_mb=config.http_max_body_mb,
                max_requests=config.http_max_requests, body_timeout_s=config.request_timeout_s,
                max_connections=config.http_max_connections,
                max_connections_per_peer=config.http_max_connections_per_peer,
                header_timeout_s=config.http_header_timeout_s,
                keepalive_s=config.http_keepalive_s,
                tls_cert=config.tls_cert, tls_key=config.tls_key,
                tls_client_ca=config.tls_client_ca)
            gateway.start(host, config.http_port)
    except BaseException:
        if gateway is not None:
            gateway.stop(0)
        gate.close()
        scorer.close()
        metrics.close()
        raise
    server = VerifierServer(grpc_server, scorer, health_servicer, metrics, tuple(extra), gate,
                            gateway)
    server.health_port = health_port
    server.metrics_port = metrics_port
    server.http_port = gateway.port if gateway is not None else None
    server.start()
    return server, port


def ports_taken(config: ServeConfig) -> list[str]:
    """The ports of ``config`` (gRPC, HTTP, metrics, health; 0 and unset left out) that
    something already listens on, as "what HOST:PORT". Probed with SO_REUSEADDR, as the
    servers bind: a port a finished server left in TIME_WAIT is free, one a live listener holds
    is not."""
    host = config.host
    wanted = [("gRPC", host, config.port), ("HTTP", host, config.http_port),
              ("metrics", config.metrics_host or host, config.metrics_port),
              ("health", host, config.health_port)]
    taken = []
    for what, h, port in wanted:
        if not port:
            continue
        try:
            infos = socket.getaddrinfo(h, port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            continue  # the bind itself says it, with the resolver's reason
        family, _type, _proto, _canon, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    taken.append(f"{what} {h}:{port}")
    return taken


def serve(config: ServeConfig) -> None:
    """``verifier serve``: run until SIGTERM or SIGINT, then drain and return. A port already
    in use is a VerifierError before anything starts (the sandbox's self-test takes seconds)."""
    taken = ports_taken(config)
    if taken:
        raise VerifierError(f"port in use: {', '.join(taken)} (another verifier, or choose "
                            "another with --port / --http-port / --metrics-port / "
                            "--health-port; 0 picks a free one)", "unavailable")
    # The parent is read before anything else: the "listening" line below tells the parent we
    # are up, and a parent killed right after reading it must still be noticed (read later,
    # getppid() would already be the reaper's pid and never change).
    parent = os.getppid()
    # The GIL hand-off interval: this process's threads (gRPC's, the stream readers, the pools'
    # supervisors) each do ~0.1 ms of Python per item and then wait on I/O. With the default
    # 5 ms interval a supervisor holding a worker's reply can wait up to 5 ms for the GIL while
    # its worker idles; 0.5 ms keeps the workers fed (docs/verifier.md 3).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # glibc malloc: two arenas, and free pages given back every minute (verifier/service/allocator.py:
    # without it the server's RSS ratchets up through fragmentation, ~16 MB/hour in a soak).
    # Before create_server: arenas are made by the threads it starts.
    malloc = MallocTuning()
    malloc.tune()
    # Descriptors: every connection, jail and pipe needs some, and the usual soft limit of
    # 1,024 is far below what the kernel allows (verifier/service/descriptors.py). Before
    # create_server: the HTTP gateway sizes its connection cap from the limit in force.
    nofile = raise_nofile_limit()
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()

    # Signal handlers run on the main thread; the drain itself happens below, not in the handler.
    # Installed before the server starts and logs "verifier listening": a caller may send
    # SIGTERM as soon as it reads that line, and one that came before the handler killed the
    # process undrained (exit -15, seen under load in tests/test_http_gateway.py).
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    host = f"[{config.host}]" if ":" in config.host else config.host
    server, port = create_server(f"{host}:{config.port}", config)
    log.info("verifier listening", extra={
        "address": f"{host}:{port}", "workers": config.scoring.workers,
        "max_output_mb": config.scoring.max_output_mb,
        "sandbox": server.scorer.sandbox.name if server.scorer.sandbox else None,
        "sandbox_problem": server.scorer.sandbox_problem,
        "tls": config.tls, "mutual_tls": config.tls_client_ca is not None,
        "token": config.token_file is not None or config.token_env is not None,
        "health_port": server.health_port, "metrics_port": server.metrics_port,
        "http_port": server.http_port, "nofile": nofile,
        **({"http_max_connections": server.http_gateway.connection_limits.max_total,
            "http_max_connections_per_peer": server.http_gateway.connection_limits.max_per_peer}
           if server.http_gateway is not None else {}),
    })
    if config.exit_with_parent:

        def watch_parent() -> None:
            # A dead parent re-parents us (to init or a subreaper): getppid() changes.
            while not stop.wait(0.5):
                if os.getppid() != parent:
                    log.warning("parent process died; draining", extra={"parent_pid": parent})
                    stop.set()

        threading.Thread(target=watch_parent, name="verifier-parent-watch", daemon=True).start()
    # Wake the main thread twice a second: Python runs a signal's handler on the main thread
    # only, and the kernel may deliver SIGTERM to one of gRPC's threads; a main thread asleep
    # in an untimed wait then never learns of it (seen under load: still serving 20 s after
    # SIGTERM).
    while not stop.wait(0.5):
        malloc.maybe_trim()
    log.info("draining", extra={"signal": received[0] if received else None,
                                "grace_s": config.grace_s})
    server.stop(config.grace_s)
    log.info("stopped")
