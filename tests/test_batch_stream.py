"""``ScoreBatchStream``, for real: a server on a loopback port, items sent several to a message
and results coming back the same way; the in-flight bound counted in items; the batch limit;
the fleet client's batching, its ``stream_batch`` 1, and a server without the call (one built
from the older method table, as a server before it answers: UNIMPLEMENTED)."""

from __future__ import annotations

import logging
import threading
from concurrent import futures as cf
from typing import Any, Iterator

import grpc
import pytest

from tests.conftest import math_item
from verifier.client import ClientConfig, VerifierClient
from verifier.convert import encode_item, result_from_proto
from verifier.items import Status
from verifier.proto import verifier_pb2 as pb
from verifier.proto import verifier_pb2_grpc as pb_grpc
from verifier.scoring.scorer import Scorer, ScoringConfig
from verifier.service.server import ServeConfig, create_server
from verifier.service.servicer import VerifierServicer


def item(i: int, prefix: str = "b") -> dict:
    """Every third answer wrong; every fifth has no boxed answer (judged inline, no worker)."""
    gold = str(i * 7 + 3)
    if i % 5 == 0:
        return math_item(f"{prefix}{i}", "<think>work</think> no final answer here", gold)
    answer = gold if i % 3 else str(i * 7 + 4)
    return math_item(f"{prefix}{i}", f"<think>work</think> so \\boxed{{{answer}}}", gold)


def expected(i: int) -> Status:
    if i % 5 == 0:
        return Status.NO_ANSWER
    return Status.CORRECT if i % 3 else Status.INCORRECT


def wire(items: list[dict]) -> list[pb.Item]:
    out = [encode_item(it) for it in items]
    assert all(isinstance(m, pb.Item) for m in out)
    return out  # type: ignore[return-value]


@pytest.fixture(scope="module")
def small_server() -> Iterator[str]:
    """In-flight bound 4 items per stream, batches of at most 50 items (--max-pending)."""
    srv, port = create_server("127.0.0.1:0", ServeConfig(
        stream_inflight=4, scoring=ScoringConfig(workers=2, max_pending=50)))
    yield f"127.0.0.1:{port}"
    srv.stop(grace_s=1.0)


def test_batches_in_every_item_answered_once_results_batched_out(server) -> None:
    _, addr = server
    items = [item(i) for i in range(90)]
    msgs = wire(items)
    batches = [pb.ItemBatch(items=msgs[:50]), pb.ItemBatch(items=msgs[50:51]),
               pb.ItemBatch(items=[]), pb.ItemBatch(items=msgs[51:])]
    with grpc.insecure_channel(addr) as ch:
        out = list(pb_grpc.VerifierStub(ch).ScoreBatchStream(iter(batches), timeout=120))
    assert all(isinstance(m, pb.ResultBatch) for m in out)
    got = [r for m in out for r in m.results]
    assert sorted(r.id for r in got) == sorted(f"b{i}" for i in range(90))
    by_id = {r.id: result_from_proto(r) for r in got}
    assert all(by_id[f"b{i}"].status is expected(i) for i in range(90)), \
        [(r.id, r.status, r.detail) for r in by_id.values()]
    # 18 of the items are judged on the reader thread as it reads them: the results ready
    # together go back in one message, not one each.
    assert len(out) < len(got), [len(m.results) for m in out]


def test_a_batch_bigger_than_the_in_flight_bound_is_read_item_by_item(small_server) -> None:
    """The bound counts items, not messages: a 40-item message on a stream allowed 4 in flight
    is taken 4 at a time as results go back, and every item is answered."""
    msgs = wire([item(i, "big") for i in range(40)])
    with grpc.insecure_channel(small_server) as ch:
        out = list(pb_grpc.VerifierStub(ch).ScoreBatchStream(
            iter([pb.ItemBatch(items=msgs)]), timeout=120))
    got = [r for m in out for r in m.results]
    assert sorted(r.id for r in got) == sorted(f"big{i}" for i in range(40))
    assert all(len(m.results) <= 4 for m in out)


def test_a_batch_over_the_servers_limit_is_refused_by_name(small_server) -> None:
    msgs = wire([item(i, "over") for i in range(51)])
    with grpc.insecure_channel(small_server) as ch:
        with pytest.raises(grpc.RpcError) as e:
            list(pb_grpc.VerifierStub(ch).ScoreBatchStream(
                iter([pb.ItemBatch(items=msgs)]), timeout=60))
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "a batch of 51 items is over this server's limit of 50" in e.value.details()


class _Recorder(grpc.StreamStreamClientInterceptor):
    """Records, per method, the size of every message each way (it only watches the real
    calls: the requests and responses pass through unchanged)."""

    def __init__(self) -> None:
        self.sent: dict[str, list[int]] = {}
        self.sent_bytes: dict[str, list[int]] = {}
        self.received: dict[str, list[int]] = {}
        self.lock = threading.Lock()

    def _note(self, where: dict[str, list[int]], method: str, n: int) -> None:
        with self.lock:
            where.setdefault(method, []).append(n)

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any
                                ) -> Any:
        method = details.method.rsplit("/", 1)[1]

        def requests() -> Iterator[Any]:
            for msg in request_iterator:
                self._note(self.sent, method, len(msg.items) if hasattr(msg, "items") else 1)
                self._note(self.sent_bytes, method, msg.ByteSize())
                yield msg

        return _Watched(continuation(details, requests()), self, method)


class _Watched:
    def __init__(self, call: Any, rec: _Recorder, method: str):
        self.call, self.rec, self.method = call, rec, method

    def __iter__(self) -> Iterator[Any]:
        for msg in self.call:
            self.rec._note(self.rec.received, self.method,
                           len(msg.results) if hasattr(msg, "results") else 1)
            yield msg

    def cancel(self) -> bool:
        return self.call.cancel()


def _watch(client: VerifierClient) -> _Recorder:
    rec = _Recorder()
    for rep in client.fleet.active():
        rep.stub = pb_grpc.VerifierStub(grpc.intercept_channel(rep.channel, rec))
    return rec


def test_the_client_streams_batches_of_at_most_stream_batch(server) -> None:
    _, addr = server
    with VerifierClient(addr, ClientConfig(stream_window=64, stream_batch=16)) as client:
        rec = _watch(client)
        results = list(client.stream(item(i, "c") for i in range(400)))
    assert sorted(r.id for r in results) == sorted(f"c{i}" for i in range(400))
    by_id = {r.id: r for r in results}
    assert all(by_id[f"c{i}"].status is expected(i) for i in range(400))
    sent = rec.sent["ScoreBatchStream"]
    print(f"{len(sent)} messages: {sent}")
    assert sum(sent) == 400 and max(sent) <= 16, sent
    # the items travel several to a message (25 messages of 16 on an idle machine; while the
    # window first fills they may go one or two at a time)
    assert len(sent) < 400 / 2, sent
    assert "ScoreStream" not in rec.sent
    assert sum(rec.received["ScoreBatchStream"]) == 400


def test_a_message_holds_at_most_half_the_window(server) -> None:
    """A window of 8 sends batches of at most 4, so the replica always has work while the
    client waits for room for the next batch."""
    _, addr = server
    with VerifierClient(addr, ClientConfig(stream_window=8)) as client:
        rec = _watch(client)
        results = list(client.stream(item(i, "h") for i in range(100)))
    assert sorted(r.id for r in results) == sorted(f"h{i}" for i in range(100))
    sent = rec.sent["ScoreBatchStream"]
    assert sum(sent) == 100 and max(sent) == 4, sent


def test_big_items_go_a_few_per_message_under_the_message_limit() -> None:
    """24 items of 0.9 MB each (22 MB in all) through a server and client whose messages are
    limited to 8 MiB: a message stops growing past 4 MiB (fleet.BATCH_BYTES), so none is
    refused for its size, and every item is answered."""
    srv, port = create_server("127.0.0.1:0", ServeConfig(
        max_message_mb=8, scoring=ScoringConfig(workers=2)))
    filler = "Carry the one, then add the next column. " * 22_000  # ~0.9 MB
    try:
        with VerifierClient(f"127.0.0.1:{port}", ClientConfig(max_message_mb=8)) as client:
            rec = _watch(client)
            results = list(client.stream(
                math_item(f"big{i}", f"<think>{filler}</think> so \\boxed{{{i}}}", str(i))
                for i in range(24)))
    finally:
        srv.stop(grace_s=1.0)
    assert sorted(r.id for r in results) == sorted(f"big{i}" for i in range(24))
    assert all(r.status is Status.CORRECT for r in results), [r.detail for r in results]
    sent, sizes = rec.sent["ScoreBatchStream"], rec.sent_bytes["ScoreBatchStream"]
    assert sum(sent) == 24 and 1 < max(sent) <= 5, sent
    assert max(sizes) < 5 * 1024 * 1024, sizes


def test_stream_batch_1_is_a_message_per_item_on_score_stream(server) -> None:
    _, addr = server
    with VerifierClient(addr, ClientConfig(stream_batch=1)) as client:
        rec = _watch(client)
        results = list(client.stream(item(i, "one") for i in range(30)))
    assert sorted(r.id for r in results) == sorted(f"one{i}" for i in range(30))
    assert rec.sent == {"ScoreStream": [1] * 30}
    assert "ScoreBatchStream" not in rec.received


@pytest.fixture()
def older_server() -> Iterator[str]:
    """A real server with the method table of a release before ScoreBatchStream: Score and
    ScoreStream only, so gRPC itself answers the batched call with UNIMPLEMENTED."""
    scorer = Scorer(ScoringConfig(workers=1))
    servicer = VerifierServicer(scorer, stream_inflight=512, max_batch=1000)
    handlers = {
        "Score": grpc.unary_unary_rpc_method_handler(
            servicer.Score, pb.ScoreRequest.FromString, pb.ScoreResponse.SerializeToString),
        "ScoreStream": grpc.stream_stream_rpc_method_handler(
            servicer.ScoreStream, pb.Item.FromString, pb.Result.SerializeToString),
    }
    srv = grpc.server(cf.ThreadPoolExecutor(max_workers=8))
    srv.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("verifier.v1.Verifier", handlers),))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield f"127.0.0.1:{port}"
    srv.stop(1).wait()
    scorer.close()


def test_a_server_without_the_batched_call_gets_score_stream(older_server, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="verifier.client")
    with VerifierClient(older_server) as client:
        rec = _watch(client)
        results = list(client.stream(item(i, "old") for i in range(50)))
        second = list(client.stream(item(i, "again") for i in range(5)))
        stats = client.replica_stats()
    assert sorted(r.id for r in results) == sorted(f"old{i}" for i in range(50))
    assert all({r.id: r for r in results}[f"old{i}"].status is expected(i) for i in range(50))
    assert len(second) == 5
    assert sum(rec.sent["ScoreStream"]) == 55
    # one refused attempt, then a message per item; the replica is not counted as failing
    assert rec.received.get("ScoreBatchStream", []) == []
    assert sum(1 for r in caplog.records if "no ScoreBatchStream" in r.getMessage()) == 1
    assert list(stats.values())[0]["failed"] == 0
