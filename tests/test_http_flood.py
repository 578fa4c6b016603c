"""Red team, issue 45: what connections and jails a replica gives away, for real.

- (HIGH) Idle HTTP connections exhausted the server's file descriptors, token or not: 1,000
  silent TCP connections took it to its 1,024-descriptor limit, and then a correct code item
  came back SANDBOX_ERROR "Too many open files", new gRPC connections failed and /run_code
  timed out; a connection that sent half a request line was still open 90 s later. Now the
  gateway caps its connections (in total and per peer IP, under the descriptor limit) and
  closes a connection whose request line and headers do not come in time
  (verifier/http/connections.py); a descriptor shortage is the service's fault
  (UNAVAILABLE), never a verdict (verifier/service/descriptors.py).
- (LOW) /run_code had a jail pool of its own beside the code items': a server with
  --code-concurrency N ran 2N jails. Now both take the Scorer's one set of jail slots.

Each server here is ``verifier serve`` in a child process (its own descriptor table and
limit, its jails counted under its pid), started with this module's ``Serve``.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import requests

from sandbox import RunResult
from tests.conftest import math_item
from tests.certs import make_pki
from tests.conftest_sandbox import nsjail_sandbox, refuse_sandbox  # noqa: F401 - a fixture
from tests.test_server import _jails_of
from verifier.client import ClientConfig, VerifierClient
from verifier.convert import encode_item
from verifier.http.run_code import BOOTSTRAP
from verifier.client.local import LocalVerifier
from verifier.proto import verifier_pb2 as pb
from verifier.proto import verifier_pb2_grpc as pb_grpc
from verifier.scoring.scorer import Scorer, ScoringConfig
from verifier.service.server import ServeConfig, create_server

NOFILE = 256
"""The flooded server's RLIMIT_NOFILE, soft and hard (so ``verifier serve`` cannot raise it):
small, so that a flood of a few hundred connections is cheap. The gateway's cap under it is
(256 - 128) // 2 = 64 connections, 32 per peer (verifier/service/descriptors.py)."""
FLOOD = 300
SUM = "a, b = map(int, input().split())\nprint(a + b)"
SUM_ITEM = {"id": "sum", "domain": "code", "response": f"```python\n{SUM}\n```",
            "ground_truth": {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}}


class Serve(LocalVerifier):
    """``verifier serve --port 0 --http-port 0 --metrics-port 0 ARGS`` in a child process, with
    RLIMIT_NOFILE set to ``nofile`` (soft and hard) before it starts when given."""

    def __init__(self, *args: str, nofile: int | None = None):
        super().__init__("--http-port", "0", "--metrics-port", "0", *args, nofile=nofile,
                         startup_timeout_s=120.0)
        self.addr = self.address
        self.http_port = int(self.listening["http_port"])
        self.http = f"http://127.0.0.1:{self.http_port}"

    def fds(self) -> int:
        """The server's open descriptors now."""
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def rejected(self, reason: str) -> float:
        """verifier_rejected_total{reason} from its /metrics."""
        url = f"http://127.0.0.1:{self.listening['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        want = f'verifier_rejected_total{{reason="{reason}"}} '
        return sum(float(line[len(want):]) for line in text.splitlines()
                   if line.startswith(want))


@pytest.fixture
def serve() -> Iterator[Callable[..., Serve]]:
    started: list[Serve] = []

    def start(*args: str, nofile: int | None = None) -> Serve:
        started.append(Serve(*args, nofile=nofile))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def connect(port: int, source: str = "127.0.0.1") -> socket.socket | None:
    """A TCP connection to the gateway from ``source`` (any 127.x address is loopback), or
    None when the connect itself failed."""
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=10,
                                        source_address=(source, 0))
    except OSError:
        return None


def closed_by_server(s: socket.socket, within_s: float) -> float | None:
    """Seconds until the server closed ``s`` (EOF or reset), or None if it stayed open."""
    start = time.monotonic()
    s.settimeout(within_s)
    try:
        data = s.recv(65536)
        while data:  # an answer (e.g. 400) before the close is fine; the close is what counts
            data = s.recv(65536)
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        return None
    return time.monotonic() - start


class Sampler:
    """The largest of ``measure()``, sampled every 20 ms on a thread of its own."""

    def __init__(self, measure: Callable[[], int]):
        self.measure = measure
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.most = max(self.most, self.measure())
            except OSError:
                pass
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.most


def test_idle_connection_flood_leaves_descriptors_for_jails_and_grpc(serve) -> None:
    """FLOOD silent connections from one peer (127.0.0.2) to a server limited to NOFILE
    descriptors: its descriptors stay under the limit; a correct code item on a gRPC channel
    opened before the flood is CORRECT (not SANDBOX_ERROR "Too many open files"); a new gRPC
    connection works; /run_code from another peer answers. Before the fix the server reached
    its limit and all three failed."""
    srv = serve("--workers", "1", nofile=NOFILE)
    cfg = ClientConfig(timeout_s=60, max_retries=0)
    before = VerifierClient(srv.addr, cfg)
    assert before.score([math_item("m", r"\boxed{2}", "2")])[0].status.value == "CORRECT"
    fds = Sampler(srv.fds)
    flood = [connect(srv.http_port, "127.0.0.2") for _ in range(FLOOD)]
    try:
        time.sleep(2.0)  # every connection accepted (or refused) by now, even under load
        [code] = before.score([SUM_ITEM])
        assert code.status.value == "CORRECT", code.detail
        with VerifierClient(srv.addr, cfg) as fresh:
            [code] = fresh.score([{**SUM_ITEM, "id": "again"}])
            assert code.status.value == "CORRECT", code.detail
        r = requests.post(f"{srv.http}/run_code", timeout=30,
                          json={"language": "python", "code": "print(6 * 7)"})
        assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "42\n", r.text
        most = fds.stop()
        assert most < NOFILE, f"the server reached {most} of its {NOFILE} descriptors"
        assert srv.rejected("http_connections_per_peer") >= FLOOD - 32  # closed at accept
    finally:
        fds.stop()
        before.close()
        for s in flood:
            if s is not None:
                s.close()


def test_slow_or_silent_connections_are_closed_at_the_header_deadline(serve) -> None:
    """--http-max-connections 8, --http-max-connections-per-peer 4: connections past a cap are
    refused at accept (per peer, then in total, even for a new peer); with
    --http-header-timeout-s 3 the silent ones are closed then, which frees their places. A
    connection that sends half a request line, and one that sends nothing, are closed within
    seconds (before the fix: still open after 90 s)."""
    srv = serve("--workers", "1", "--http-header-timeout-s", "3",
                "--http-max-connections", "8", "--http-max-connections-per-peer", "4")
    held = [connect(srv.http_port, "127.0.0.2") for _ in range(4)]
    extra = connect(srv.http_port, "127.0.0.2")
    held += [connect(srv.http_port, "127.0.0.3") for _ in range(4)]
    other = connect(srv.http_port, "127.0.0.4")
    for s in (extra, other):  # refused: closed before anything is sent
        assert s is None or closed_by_server(s, within_s=10.0) is not None
    assert srv.rejected("http_connections_per_peer") >= 1
    assert srv.rejected("http_connections") >= 1
    for s in held:  # silent: the header deadline closes them, and frees their places
        assert s is not None and closed_by_server(s, within_s=15.0) is not None
        s.close()
    assert requests.get(f"{srv.http}/health", timeout=10).json() == {"status": "SERVING"}
    half = connect(srv.http_port)
    assert half is not None
    half.sendall(b"POST /run_code HT")
    silent = connect(srv.http_port)
    assert silent is not None
    for s, what in ((half, "half a request line"), (silent, "nothing")):
        assert closed_by_server(s, within_s=15.0) is not None, \
            f"a connection that sent {what} was still open after 15 s"
        s.close()
    assert srv.rejected("http_header_timeout") >= 10


def test_tls_handshake_and_headers_have_the_deadline_too(tmp_path) -> None:
    """With TLS the connection is counted and timed before its handshake: one that never
    starts it, and one that sends half its headers after it, are closed at the deadline; a
    request that comes in time is served."""
    pki = make_pki(tmp_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("verifier.scoring.scorer.create_sandbox", refuse_sandbox("no jails in this test"))
        srv, _ = create_server("127.0.0.1:0", ServeConfig(
            scoring=ScoringConfig(workers=1), http_port=0, tls_cert=pki.server_cert,
            tls_key=pki.server_key, http_header_timeout_s=1.0))
    try:
        port = srv.http_port
        no_handshake = connect(port)
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        half = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                               server_hostname="localhost")
        half.sendall(b"GET /health HT")
        for s in (no_handshake, half):
            assert s is not None and closed_by_server(s, within_s=15.0) is not None
            s.close()
        r = requests.get(f"https://localhost:{port}/health", verify=str(pki.ca), timeout=10)
        assert r.json() == {"status": "SERVING"}
        assert srv.metrics.registry.get_sample_value(
            "verifier_rejected_total", {"reason": "http_header_timeout"}) >= 2
    finally:
        srv.stop(grace_s=1.0)


def test_run_code_and_code_items_share_the_jail_slots(serve) -> None:
    """--code-concurrency 2: two slow code items and two slow /run_code requests at once run
    at most 2 jails at any moment (before the fix /run_code had 2 slots of its own: 4 ran)."""
    srv = serve("--workers", "1", "--code-concurrency", "2")
    # Each program sleeps 2 s in a process below the jail's first (_jails_of counts a jail
    # once its program runs: the harness's test process, or this fork).
    slow_run = ("import os, time\npid = os.fork()\ntime.sleep(2)\n"
                "if pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('ran')")
    slow_item = {"domain": "code", "response": "```python\nimport time\ntime.sleep(2)\n"
                 "print(5)\n```", "ground_truth": {"inputs": [""], "outputs": ["5\n"]}}
    jails = Sampler(lambda: len(_jails_of(srv.proc.pid)))
    start = time.monotonic()
    with VerifierClient(srv.addr, ClientConfig(timeout_s=120, max_retries=0)) as client, \
            ThreadPoolExecutor(max_workers=4) as pool:
        runs = [pool.submit(requests.post, f"{srv.http}/run_code", timeout=120,
                            json={"language": "python", "code": slow_run}) for _ in range(2)]
        items = [pool.submit(client.score, [{**slow_item, "id": f"slow{i}"}]) for i in range(2)]
        for f in runs:
            r = f.result()
            assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "ran\n", r.text
        for f in items:
            [res] = f.result()
            assert res.status.value == "CORRECT", res.detail
    elapsed = time.monotonic() - start
    most = jails.stop()
    assert most == 2, f"{most} jails ran at once under --code-concurrency 2"
    assert elapsed >= 3.5  # two rounds of 2 s: the four never ran together


class ShortOfDescriptors:
    """A sandbox whose next ``failures`` jails (harness runs and /run_code runs) cannot start:
    EMFILE, raised as the forkserver raises it, or reported as nsjail's failed start; anything
    else is the real sandbox's."""

    def __init__(self, real: object):
        self.real = real
        self.failures = 0
        self.failed = 0
        self.as_result = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def run(self, argv: list[str], **kw: object) -> RunResult:
        jail = kw.get("on_stdout") is not None or argv[-1] == BOOTSTRAP
        if jail and self.failures > 0:
            self.failures -= 1
            self.failed += 1
            err = OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            if self.as_result:
                return RunResult("error", detail=f"cannot start 'nsjail': {err}")
            raise err
        return self.real.run(argv, **kw)  # type: ignore[attr-defined]


def test_out_of_descriptors_is_the_services_fault_never_a_verdict(nsjail_sandbox) -> None:
    """A jail that cannot start for want of descriptors is tried again (a short while), then
    the call fails UNAVAILABLE (gRPC: Score and the streams; HTTP: 503), never a SANDBOX_ERROR
    verdict on the item; nothing is counted as an item's result, and the queue is left empty.
    Before the fix the item came back SANDBOX_ERROR "sandbox nsjail failed: OSError: [Errno
    24] Too many open files"."""
    short = ShortOfDescriptors(nsjail_sandbox)
    scorer = Scorer(ScoringConfig(workers=1), sandbox=short)
    srv, port = create_server("127.0.0.1:0", ServeConfig(scoring=scorer.config, http_port=0),
                              scorer=scorer)
    http = f"http://127.0.0.1:{srv.http_port}"
    value = srv.metrics.registry.get_sample_value
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.VerifierStub(channel)
            item = encode_item(SUM_ITEM)
            # A shortage that passes: retried, and the verdict is the program's.
            for as_result in (False, True):
                short.as_result, short.failures, short.failed = as_result, 2, 0
                [res] = stub.Score(pb.ScoreRequest(items=[item]), timeout=60).results
                assert pb.Status.Name(res.status) == "CORRECT", res.detail
                assert short.failed == 2
            # One that lasts: the call's UNAVAILABLE, on every door.
            short.failures = 10**6
            with pytest.raises(grpc.RpcError) as e:
                stub.Score(pb.ScoreRequest(items=[item]), timeout=60)
            assert e.value.code() is grpc.StatusCode.UNAVAILABLE
            assert "out of file descriptors" in e.value.details()
            for call, msg in ((stub.ScoreStream, item),
                              (stub.ScoreBatchStream, pb.ItemBatch(items=[item]))):
                with pytest.raises(grpc.RpcError) as e:
                    list(call(iter([msg]), timeout=60))
                assert e.value.code() is grpc.StatusCode.UNAVAILABLE, call
            r = requests.post(f"{http}/score", json={"items": [SUM_ITEM]}, timeout=60)
            assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text
            r = requests.post(f"{http}/run_code", timeout=60,
                              json={"language": "python", "code": "print(1)"})
            assert r.status_code == 503 and "out of file descriptors" in r.json()["message"]
            assert not value("verifier_items_total", {"domain": "code",
                                                      "status": "SANDBOX_ERROR"})
            assert value("verifier_sandbox_failures_total") == 0
            assert value("verifier_queue_depth", {"domain": "code"}) == 0
            # And when descriptors are back, so is the service.
            short.failures = 0
            [res] = stub.Score(pb.ScoreRequest(items=[item]), timeout=60).results
            assert pb.Status.Name(res.status) == "CORRECT", res.detail
    finally:
        srv.stop(grace_s=1.0)


def test_connection_cap_follows_the_descriptor_limit() -> None:
    from verifier.service.descriptors import http_connection_cap

    assert http_connection_cap(1024, 1024) == 448  # (1024 - 128) // 2
    assert http_connection_cap(1024, 1 << 20) == 1024  # the configured cap, when it is lower
    assert http_connection_cap(1024, NOFILE) == 64
    assert http_connection_cap(1024, 100) == 1  # never none
