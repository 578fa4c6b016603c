"""Prometheus metrics of one verifier server (``verifier serve --metrics-port``).

Every server owns its own ``CollectorRegistry`` (tests run several servers in one process), and
the HTTP endpoint is a separate port from gRPC so scraping needs neither TLS nor a token: the
endpoint shows counts only, never items. Metric names:

- ``verifier_requests_total{method,code}``: finished RPCs by gRPC status code (UNAUTHENTICATED
  ones included).
- ``verifier_request_duration_seconds{method}``: RPC latency (a stream's whole life).
- ``verifier_items_total{domain,status}``: results produced; ``domain`` is math / code / other.
- ``verifier_item_duration_seconds{domain}``: time from accepting an item to its result
  (queueing included).
- ``verifier_queue_depth{domain}``: items accepted and not finished (queued or running).
- ``verifier_active_streams``: open ScoreStream and ScoreBatchStream calls.
- ``verifier_rejected_total{reason}``: work refused before scoring (queue_full, batch_too_big,
  too_many_calls; the HTTP gateway's connections: http_connections and
  http_connections_per_peer (over a cap, closed at accept), http_header_timeout (closed for
  not sending a request's headers in time)).
- ``verifier_http_connections``: open connections of the HTTP gateway.
- ``verifier_worker_restarts_total{reason}``: math workers replaced (deadline, died; recycled after ``--worker-max-tasks``).
- ``verifier_sandbox_failures_total``: results with SANDBOX_ERROR.
- ``verifier_sandbox_up``: 1 when the sandbox passed its start-up self-test.
- ``verifier_stage_cpu_seconds{domain,stage}``: CPU seconds one item spent in one stage of its
  path (the cost breakdown of docs/verifier.md 3, STAGES), measured with thread/process CPU
  clocks at the stage boundaries; ``_sum / _count`` is the mean CPU per item of a stage.
- ``verifier_queue_wait_seconds{domain}``: wall time an item waited for a worker.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from verifier.items import DOMAINS, Result, Status

STAGES = {
    "receive": "server: decoding the item message and dispatching it (validation, the inline "
               "verdict of items that need no worker)",
    "encode": "server: encoding the result message",
    "pool_supervisor": "server: the pool's supervisor thread sending the task and reading the reply",
    "worker_ipc": "math worker: receiving the task and sending the reply (pickling)",
    "scoring": "math worker: scoring proper (math-verify / sympy)",
    "judge": "code: the scorer thread (ground truth, starting the jail, reading and "
             "authenticating records, comparing outputs)",
    "jail_setup": "code: nsjail's own CPU (namespaces, mounts, rlimits) and what the harness "
                  "did after its last record",
    "harness_start": "code: the jail's interpreter start and harness up to its first record "
                     "(including the first test's fork)",
    "harness_tests": "code: the harness between its first and last records (forks, pipes)",
    "tests": "code: the forked test processes (the program itself)",
    "checker": "code: the jail of a ground truth's checker program, all of it (nsjail, its "
               "harness, the checker's runs; docs/contracts.md 1)",
}
"""The stages of the cost breakdown (docs/verifier.md 3)."""
_CPU_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                0.1, 0.25, 0.5, 1.0, 5.0, 30.0)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0, 300.0)


def domain_label(domain: str) -> str:
    """A bounded label value: a client cannot create new time series by inventing domains."""
    return domain if domain in DOMAINS else "other"


class _Restarts(Collector):
    def __init__(self, source: Callable[[], dict[str, int]]):
        self._source = source

    def collect(self) -> Iterator[CounterMetricFamily]:
        fam = CounterMetricFamily("verifier_worker_restarts",
                                  "Math worker processes replaced: killed at a deadline, died, or recycled", labels=["reason"])
        for reason, n in sorted(self._source().items()):
            fam.add_metric([reason], n)
        yield fam


class ServerMetrics:
    """The counters of one server; ``serve_http`` exposes them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("verifier_requests", "Finished RPCs", ["method", "code"],
                                registry=r)
        self.request_seconds = Histogram("verifier_request_duration_seconds", "RPC latency",
                                         ["method"], buckets=_LATENCY_BUCKETS, registry=r)
        self.items = Counter("verifier_items", "Results produced", ["domain", "status"],
                             registry=r)
        self.item_seconds = Histogram("verifier_item_duration_seconds",
                                      "Time from accepting an item to its result", ["domain"],
                                      buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("verifier_queue_depth", "Items accepted and not finished",
                                 ["domain"], registry=r)
        self.active_streams = Gauge("verifier_active_streams",
                                    "Open ScoreStream and ScoreBatchStream calls",
                                    registry=r)
        self.rejected = Counter("verifier_rejected", "Work refused before scoring", ["reason"],
                                registry=r)
        self.http_connections = Gauge("verifier_http_connections",
                                      "Open connections of the HTTP gateway", registry=r)
        self.sandbox_failures = Counter("verifier_sandbox_failures",
                                        "Results with status SANDBOX_ERROR", registry=r)
        self.sandbox_up = Gauge("verifier_sandbox_up",
                                "1 when the sandbox passed its start-up self-test", registry=r)
        self.stage_cpu = Histogram("verifier_stage_cpu_seconds",
                                   "CPU seconds of one item in one stage", ["domain", "stage"],
                                   buckets=_CPU_BUCKETS, registry=r)
        self.queue_wait = Histogram("verifier_queue_wait_seconds",
                                    "Wall time an item waited for a worker", ["domain"],
                                    buckets=_LATENCY_BUCKETS, registry=r)
        for d in (*DOMAINS, "other"):
            self.item_seconds.labels(domain=d)
        self._inflight = {d: 0 for d in DOMAINS}
        self._lock = threading.Lock()
        for d in DOMAINS:
            self.queue_depth.labels(domain=d).set_function(lambda d=d: self._inflight[d])
        self._http: Any = None

    def attach_scorer(self, scorer: Any) -> None:
        works = scorer.sandbox is not None and scorer.sandbox_problem is None
        self.sandbox_up.set(1 if works else 0)
        self.registry.register(_Restarts(lambda: scorer.worker_restarts))

    # -- items ------------------------------------------------------------------------------
    def item_started(self, domain: str) -> None:
        if domain in self._inflight:
            with self._lock:
                self._inflight[domain] += 1

    def item_finished(self, domain: str, result: Result | None) -> None:
        """``result`` None: the item was cancelled (its RPC went away)."""
        if domain in self._inflight:
            with self._lock:
                self._inflight[domain] -= 1
        if result is None:
            return
        d = domain_label(domain)
        self.items.labels(domain=d, status=result.status.value).inc()
        self.item_seconds.labels(domain=d).observe(result.elapsed_ms / 1000.0)
        if result.status is Status.SANDBOX_ERROR:
            self.sandbox_failures.inc()

    def observe_costs(self, domain: str, costs: dict[str, float]) -> None:
        """One item's measured costs (seconds): the STAGES' CPU, and ``queue_wait``."""
        d = domain_label(domain)
        for stage, seconds in costs.items():
            if stage == "queue_wait":
                self.queue_wait.labels(domain=d).observe(seconds)
            elif stage in STAGES:
                self.stage_cpu.labels(domain=d, stage=stage).observe(max(seconds, 0.0))

    # -- requests ---------------------------------------------------------------------------
    def request_done(self, method: str, code: str, start: float) -> None:
        self.requests.labels(method=method, code=code).inc()
        self.request_seconds.labels(method=method).observe(time.monotonic() - start)

    # -- endpoint ---------------------------------------------------------------------------
    def serve_http(self, host: str, port: int) -> int:
        """Start the /metrics endpoint; returns the bound port (``port`` 0 picks one)."""
        httpd, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = httpd
        return int(httpd.server_port)

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
