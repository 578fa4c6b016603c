"""The gRPC service: a thin layer that converts messages and delegates to the Scorer.

- ``create_server(address) -> (server, port)``: tests bind ``127.0.0.1:0``.
- ``serve(config)``: the ``verifier serve`` command: health + reflection, SIGTERM drain.

VerifierError is the one domain exception; ``_abort`` maps it to a gRPC status code, and no
other place in the service chooses status codes.
"""

from __future__ import annotations

import ipaddress
import logging
import queue
import signal
import threading
from concurrent import futures as cf
from dataclasses import dataclass, field
from typing import Iterator, Literal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from verifier.convert import item_from_proto, result_to_proto
from verifier.items import VerifierError
from verifier.proto import verifier_pb2 as pb
from verifier.proto import verifier_pb2_grpc as pb_grpc
from verifier.scoring import Scorer, ScoringConfig

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Verifier"].full_name

_GRPC_CODES = {
    "invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
    "resource_exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "deadline_exceeded": grpc.StatusCode.DEADLINE_EXCEEDED,
    "failed_precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "internal": grpc.StatusCode.INTERNAL,
}
RETRY_AFTER_KEY = "retry-after-ms"


@dataclass
class ServeConfig:
    """``verifier serve``: run the verification service."""

    host: str = "127.0.0.1"
    """Address to bind. Loopback by default: the service runs model-written code, so exposing
    it is a decision (see --insecure)."""
    port: int = 50051
    """TCP port; 0 picks a free one (the bound port is logged)."""
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    max_message_mb: int = 256
    """Largest gRPC message either way, MiB. Code rows carry ~105 KB of tests each on average,
    so a 256-item batch of them needs ~27 MiB; the default leaves room for outliers."""
    max_concurrent_rpcs: int = 64
    """RPCs served at once; more get RESOURCE_EXHAUSTED at once instead of queueing unbounded."""
    stream_inflight: int = 512
    """Items one stream may have in flight; past it the server stops reading that stream
    (gRPC flow control then slows the client), so one client cannot fill the whole queue."""
    grace_s: float = 30.0
    """On SIGTERM: seconds to let in-flight RPCs finish before cancelling them."""
    log_format: Literal["json", "text"] = "json"
    """Log lines as JSON objects (for log pipelines) or plain text."""
    insecure: bool = False
    """Allow binding a non-loopback address without TLS or a token."""
    unsafe_no_sandbox: bool = False
    """Run code WITHOUT isolation (development only; allowed on loopback only)."""

    def __post_init__(self) -> None:
        if self.unsafe_no_sandbox:
            self.scoring.sandbox = "unsafe-none"
        loopback = _is_loopback(self.host)
        if self.scoring.sandbox == "unsafe-none" and not loopback:
            raise ValueError(
                "--unsafe-no-sandbox runs model-written code without isolation and is allowed "
                f"only on a loopback address, not {self.host!r}"
            )
        if not loopback and not self.insecure:
            raise ValueError(
                f"refusing to bind non-loopback address {self.host!r} without TLS or a token; "
                "pass --insecure to do it anyway"
            )
        if self.max_message_mb < 1:
            raise ValueError("max_message_mb must be >= 1")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _abort(context: grpc.ServicerContext, err: VerifierError) -> None:
    """The one place a domain error becomes a gRPC status."""
    code = _GRPC_CODES.get(err.code, grpc.StatusCode.INTERNAL)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        context.set_trailing_metadata(((RETRY_AFTER_KEY, "500"),))
    context.abort(code, str(err))


class VerifierServicer(pb_grpc.VerifierServicer):
    def __init__(self, scorer: Scorer, stream_inflight: int, max_batch: int):
        self.scorer = scorer
        self.stream_inflight = stream_inflight
        self.max_batch = max_batch

    def Score(self, request: pb.ScoreRequest, context: grpc.ServicerContext) -> pb.ScoreResponse:
        if len(request.items) > self.max_batch:
            _abort(context, VerifierError(
                f"batch of {len(request.items)} items is over this server's limit of "
                f"{self.max_batch}; split it or use ScoreStream", "resource_exhausted"))
        submitted: list[cf.Future] = []
        # A client that goes away (cancel, deadline) must not leave its items queued.
        context.add_callback(lambda: [f.cancel() for f in submitted])
        try:
            for msg in request.items:
                submitted.append(self.scorer.submit(item_from_proto(msg)))
        except VerifierError as e:
            for f in submitted:
                f.cancel()
            _abort(context, e)
        done, not_done = cf.wait(submitted, timeout=context.time_remaining())
        if not_done:
            for f in not_done:
                f.cancel()
            _abort(context, VerifierError("the call's deadline passed before every item was "
                                          "scored", "deadline_exceeded"))
        return pb.ScoreResponse(results=[result_to_proto(f.result()) for f in submitted])

    def ScoreStream(
        self, request_iterator: Iterator[pb.Item], context: grpc.ServicerContext
    ) -> Iterator[pb.Result]:
        out: queue.Queue = queue.Queue()
        slots = threading.BoundedSemaphore(self.stream_inflight)
        live: set[cf.Future] = set()
        lock = threading.Lock()
        reader_state: dict = {"submitted": 0, "error": None}
        reader_done = object()

        def on_done(f: cf.Future) -> None:
            slots.release()
            with lock:
                live.discard(f)
            if not f.cancelled():
                out.put(f.result())

        def read() -> None:
            # Runs on its own thread so results stream back while items are still arriving.
            try:
                for msg in request_iterator:
                    # Backpressure: stop reading this stream while it has too many items in
                    # flight; gRPC's flow control then slows the sender.
                    while not slots.acquire(timeout=0.5):
                        if not context.is_active():
                            return
                    item = item_from_proto(msg)
                    while True:
                        try:
                            fut = self.scorer.submit(item, block_s=0.5)
                            break
                        except VerifierError as e:
                            if e.code != "resource_exhausted" or not context.is_active():
                                raise
                    with lock:
                        live.add(fut)
                        reader_state["submitted"] += 1
                    fut.add_done_callback(on_done)
            except VerifierError as e:
                reader_state["error"] = e
            except grpc.RpcError:
                pass  # the client went away; the writer loop notices
            except Exception as e:  # noqa: BLE001 - surface as INTERNAL, keep the server up
                log.exception("stream reader failed")
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
                        _abort(context, reader_state["error"])
                    continue
                emitted += 1
                yield result_to_proto(x)
        finally:
            with lock:
                pending = list(live)
            for f in pending:
                f.cancel()


class VerifierServer:
    """A running verification service: the gRPC server, its health service and its Scorer."""

    def __init__(self, grpc_server: grpc.Server, scorer: Scorer, health_servicer: health.HealthServicer):
        self.grpc_server = grpc_server
        self.scorer = scorer
        self.health = health_servicer
        self._stopped = threading.Event()

    def start(self) -> None:
        self.grpc_server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_s: float | None = 5.0) -> None:
        """Drain: report NOT_SERVING, refuse new RPCs, let in-flight ones finish for up to
        ``grace_s`` seconds, then stop the workers."""
        if self._stopped.is_set():
            return
        self.health.enter_graceful_shutdown()
        self.grpc_server.stop(grace_s).wait()
        self.scorer.close()
        self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)


def create_server(
    address: str = "127.0.0.1:0",
    config: ServeConfig | None = None,
    scorer: Scorer | None = None,
) -> tuple[VerifierServer, int]:
    """Build and start a server bound to ``address`` ("host:port"; port 0 picks one).
    Returns the server and the bound port."""
    config = config or ServeConfig()
    scorer = scorer or Scorer(config.scoring)
    max_bytes = config.max_message_mb * 1024 * 1024
    # Each streaming RPC holds one pool thread (plus its own reader thread); unary calls hold
    # one while they wait. maximum_concurrent_rpcs turns overload into RESOURCE_EXHAUSTED.
    grpc_server = grpc.server(
        cf.ThreadPoolExecutor(max_workers=config.max_concurrent_rpcs + 4,
                              thread_name_prefix="verifier-rpc"),
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
        options=[
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_send_message_length", max_bytes),
            ("grpc.so_reuseport", 0),
        ],
    )
    pb_grpc.add_VerifierServicer_to_server(
        VerifierServicer(scorer, config.stream_inflight, config.scoring.max_pending), grpc_server
    )
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, grpc_server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), grpc_server
    )
    port = grpc_server.add_insecure_port(address)
    if port == 0:
        scorer.close()
        raise VerifierError(f"could not bind {address}", "unavailable")
    server = VerifierServer(grpc_server, scorer, health_servicer)
    server.start()
    return server, port


def serve(config: ServeConfig) -> None:
    """``verifier serve``: run until SIGTERM or SIGINT, then drain and return."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    server, port = create_server(f"{host}:{config.port}", config)
    log.info("verifier listening", extra={
        "address": f"{host}:{port}", "workers": config.scoring.workers,
        "sandbox": server.scorer.sandbox.name if server.scorer.sandbox else None,
        "sandbox_problem": server.scorer.sandbox_problem,
    })
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()

    # Signal handlers run on the main thread; the drain itself happens below, not in the handler.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stop.wait()
    log.info("draining", extra={"signal": received[0] if received else None,
                                "grace_s": config.grace_s})
    server.stop(config.grace_s)
    log.info("stopped")
