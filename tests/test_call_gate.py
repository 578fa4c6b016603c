"""The call gate (verifier/service/call_gate.py) against the red team's stalls, on a real server on
loopback: callers that send headers and never a body, idle streams, floods of unauthenticated
calls, probes starved by scoring calls. Each test fails on the server before the gate (a token
checked only after the body, one slot limit shared with health, no client-side deadlines)."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent import futures as cf
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import ServerProcess, math_item
from verifier.client import ClientConfig, VerifierClient
from verifier.convert import item_to_proto
from verifier.items import Status
from verifier.proto import verifier_pb2 as pb
from verifier.proto import verifier_pb2_grpc as pb_grpc
from verifier.scoring.scorer import ScoringConfig
from verifier.service.server import ServeConfig, create_server

TOKEN = "gate-test-token"
SLOTS = 4
SCORE = "/verifier.v1.Verifier/Score"
STREAM = "/verifier.v1.Verifier/ScoreStream"


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch) -> None:
    monkeypatch.delenv("VERIFIER_TOKEN", raising=False)


def _server(tmp_path: Path | None = None, **overrides) -> tuple[object, str]:
    token_file = None
    if tmp_path is not None:
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
    config = ServeConfig(scoring=ScoringConfig(workers=1), token_file=token_file,
                         max_concurrent_rpcs=SLOTS, **overrides)
    srv, port = create_server("127.0.0.1:0", config)
    return srv, f"127.0.0.1:{port}"


@contextlib.contextmanager
def _stalling_server(tmp_path: Path | None = None, **overrides):
    """A server, a channel to it, and the event that releases the stalled callers' bodies;
    all ended on the way out."""
    srv, addr = _server(tmp_path, **overrides)
    release = threading.Event()
    ch = grpc.insecure_channel(addr)
    try:
        yield srv, addr, ch, release
    finally:
        release.set()
        ch.close()
        srv.stop(0)


def _wait_for(predicate, timeout_s: float = 10.0) -> bool:
    """Polls ``predicate``: a call's slot is freed when its RPC has ended on the server, a
    little after its client saw the end."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _auth() -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKEN}"),)


def _headers_only(channel: grpc.Channel, method: str, release: threading.Event,
                  metadata=None, timeout: float = 60) -> grpc.Future:
    """A call that sends its headers and then never a message (until ``release``): the
    request iterator blocks, as a client that stalls after the headers."""
    def never() -> Iterator[bytes]:
        release.wait()
        return
        yield b""  # pragma: no cover - makes this a generator

    call = channel.stream_unary(method, request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    return call.future(never(), metadata=metadata, timeout=timeout)


def _score_one(addr: str, i: int, metadata=None) -> str:
    with grpc.insecure_channel(addr) as ch:
        req = pb.ScoreRequest(items=[item_to_proto(math_item(f"a{i}", r"\boxed{4}", "4"))])
        resp = pb_grpc.VerifierStub(ch).Score(req, metadata=metadata, timeout=15)
        return pb.Status.Name(resp.results[0].status)


def _health(addr: str) -> int:
    with grpc.insecure_channel(addr) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5).status


def test_unauthenticated_calls_that_never_send_a_body_take_no_slot(tmp_path) -> None:
    # Red team: with the token checked after the body, 30 such calls held every slot: 0 of 30
    # authenticated calls and 0 of 30 health checks served for 30 s.
    with _stalling_server(tmp_path) as (srv, addr, ch, release):
        hung = [_headers_only(ch, SCORE, release) for _ in range(4 * SLOTS)]
        # Each is refused at its headers, while its body is still to come.
        for f in hung:
            with pytest.raises(grpc.RpcError) as e:
                f.result(timeout=10)
            assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
        start = time.monotonic()
        with cf.ThreadPoolExecutor(SLOTS) as pool:  # at most SLOTS calls at once
            statuses = list(pool.map(lambda i: _score_one(addr, i, _auth()), range(2 * SLOTS)))
            probes = list(pool.map(lambda _i: _health(addr), range(2 * SLOTS)))
        assert statuses == ["CORRECT"] * (2 * SLOTS)
        assert probes == [health_pb2.HealthCheckResponse.SERVING] * (2 * SLOTS)
        assert time.monotonic() - start < 15


def test_a_refused_call_is_not_read_into_memory(tmp_path) -> None:
    # Red team: 24 unauthenticated 200 MB requests were refused only after their bodies had
    # been received and parsed: 5 GiB peak. A call refused at its headers never asks for its
    # message, so the server never assembles one; measured on a server of its own process.
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = ServerProcess(0, "--workers", "1", "--token-file", str(token_file))
    try:
        def rss_mb() -> float:
            for line in Path(f"/proc/{proc.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):  # the peak: what a flood costs at its worst
                    return int(line.split()[1]) / 1024
            raise AssertionError("no VmHWM")

        before = rss_mb()
        body = pb.ScoreRequest(items=[pb.Item(id="x", domain="math", response="y" * (64 << 20),
                                              ground_truth_json='"1"')]).SerializeToString()
        with grpc.insecure_channel(proc.address, options=[
                ("grpc.max_send_message_length", 1 << 30)]) as ch:
            call = ch.unary_unary(SCORE, request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)
            futs = [call.future(body, timeout=60) for _ in range(6)]
            for f in futs:
                with pytest.raises(grpc.RpcError) as e:
                    f.result()
                assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
        # Six 64 MiB bodies parsed would be >= 384 MiB (each message plus its decoded string).
        assert rss_mb() - before < 150, (before, rss_mb())
        assert _score_one(proc.address, 0, _auth()) == "CORRECT"
    finally:
        proc.stop()


def test_a_caller_that_never_sends_its_body_is_cancelled(tmp_path) -> None:
    with _stalling_server(tmp_path, request_timeout_s=1.0) as (srv, addr, ch, release):
        start = time.monotonic()
        f = _headers_only(ch, SCORE, release, metadata=_auth())
        with pytest.raises(grpc.RpcError) as e:
            f.result(timeout=20)
        assert e.value.code() is grpc.StatusCode.CANCELLED
        assert 0.9 < time.monotonic() - start < 10
        assert _wait_for(lambda: srv.gate.active == (0, 0))


def test_stalled_callers_give_their_slots_to_new_calls(tmp_path) -> None:
    # Authenticated callers that stall after their headers fill every slot; a new call at the
    # limit evicts the one waiting longest (after 2 s) instead of being refused.
    with _stalling_server(tmp_path) as (srv, addr, ch, release):
        hung = [_headers_only(ch, SCORE, release, metadata=_auth()) for _ in range(SLOTS)]
        assert _wait_for(lambda: srv.gate.active[0] == SLOTS)
        time.sleep(2.5)  # past EVICTABLE_AFTER_S
        assert _score_one(addr, 0, _auth()) == "CORRECT"
        # Exactly one stalled caller made room (the one waiting longest on the server).
        _wait_for(lambda: any(f.done() for f in hung))
        done = [f for f in hung if f.done()]
        assert len(done) == 1 and done[0].code() is grpc.StatusCode.CANCELLED
        assert _wait_for(lambda: srv.gate.active[0] == SLOTS - 1)
        # The next call finds a free slot and evicts nobody.
        assert _score_one(addr, 1, _auth()) == "CORRECT"
        assert sum(f.done() for f in hung) == 1


def test_busy_calls_are_not_evicted_and_the_limit_still_holds(tmp_path) -> None:
    # Streams with items being scored are not "waiting on their client": a call over the limit
    # is refused with RESOURCE_EXHAUSTED rather than taking a working caller's slot.
    srv, addr = _server(tmp_path)
    channels, streams = [], []
    try:
        for i in range(SLOTS):
            ch = grpc.insecure_channel(addr)
            channels.append(ch)
            release = threading.Event()

            def items(i=i, release=release) -> Iterator[pb.Item]:
                # A program that runs for seconds: the stream is busy with its scoring (one
                # code slot: the others wait in the queue, also being scored), not idle.
                yield item_to_proto({
                    "id": f"slow{i}", "domain": "code",
                    "response": "```python\nimport time\ntime.sleep(6)\n```",
                    "ground_truth": {"inputs": ["\n"], "outputs": ["\n"]},
                    "limits": {"test_timeout_s": 10, "timeout_s": 30}})
                release.wait()
            streams.append((release, pb_grpc.VerifierStub(ch).ScoreStream(
                items(), metadata=_auth(), timeout=60)))
        assert _wait_for(lambda: srv.gate.active[0] == SLOTS)
        time.sleep(2.5)
        with pytest.raises(grpc.RpcError) as e:
            _score_one(addr, 0, _auth())
        assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "4 calls already in progress" in e.value.details()
        assert _health(addr) == health_pb2.HealthCheckResponse.SERVING  # probes have their own
    finally:
        for release, _s in streams:
            release.set()
        for ch in channels:
            ch.close()
        srv.stop(0)


def test_idle_streams_time_out_and_do_not_lock_anyone_out() -> None:
    # Red team: 70 streams that sent one item and never read took every slot, health
    # included, with no idle timeout.
    srv, addr = _server(idle_timeout_s=1.5)
    release = threading.Event()
    channels, calls = [], []
    try:
        for i in range(2 * SLOTS):
            ch = grpc.insecure_channel(addr)
            channels.append(ch)

            def items(i=i) -> Iterator[pb.Item]:
                yield item_to_proto(math_item(f"idle{i}", r"\boxed{4}", "4"))
                release.wait()
            calls.append(pb_grpc.VerifierStub(ch).ScoreStream(items(), timeout=60))
        time.sleep(0.5)
        assert _health(addr) == health_pb2.HealthCheckResponse.SERVING
        # New callers get in (idle streams are evicted at the limit, or time out).
        with VerifierClient(addr, ClientConfig(max_retries=8)) as client:
            results = client.score([math_item(f"n{i}", r"\boxed{4}", "4") for i in range(8)])
        assert [r.status for r in results] == [Status.CORRECT] * 8
        # Past idle_timeout_s every idle stream is gone.
        assert _wait_for(lambda: srv.gate.active == (0, 0), timeout_s=15)
        codes = []
        for c in calls:
            with pytest.raises(grpc.RpcError) as e:
                list(c)
            codes.append(e.value.code())
        # SLOTS were admitted and then cancelled (evicted or idle); the rest were refused at
        # once while every slot was held by a stream less than 2 s idle.
        assert codes.count(grpc.StatusCode.CANCELLED) == SLOTS
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == SLOTS
    finally:
        release.set()
        for ch in channels:
            ch.close()
        srv.stop(0)


def test_a_fleet_client_stream_survives_an_idle_cancel() -> None:
    # A trainer's stream that pauses longer than the idle timeout between items is reopened by
    # the client, with no item lost or repeated.
    srv, addr = _server(idle_timeout_s=1.0)
    try:
        def items() -> Iterator[dict]:
            for i in range(6):
                if i == 3:
                    time.sleep(2.5)  # the stream is idle and gets cancelled meanwhile
                yield math_item(f"s{i}", r"\boxed{4}", "4")

        with VerifierClient(addr) as client:
            results = list(client.stream(items()))
        assert sorted(r.id for r in results) == [f"s{i}" for i in range(6)]
        assert all(r.status is Status.CORRECT for r in results)
    finally:
        srv.stop(0)
