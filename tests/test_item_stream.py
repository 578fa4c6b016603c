"""verifier/service/stream.py's ItemStream on its own: no gRPC server, no scorer, no jail. The submit
function hands back futures the test finishes itself, so the stream's orderings (a slot freed
only once its result is written, the call's error after the results in hand, the cancels when
the call ends) are seen directly. tests/test_batch_stream.py runs the same loop end to end."""

from __future__ import annotations

import threading
import time
from concurrent import futures as cf

import pytest

from verifier.items import Result, Status, VerifierError
from verifier.service.metrics import ServerMetrics
from verifier.proto import verifier_pb2 as pb
from verifier.service.stream import ItemStream


class Gate:
    def __init__(self) -> None:
        self.scoring = 0
        self.touched = 0

    def touch(self) -> None:
        self.touched += 1

    def item_started(self) -> None:
        self.scoring += 1

    def item_finished(self) -> None:
        self.scoring -= 1


class FakeScorer:
    """``submit`` records each item's future; the test finishes them (or ``auto`` does)."""

    def __init__(self, auto: bool = False):
        self.auto = auto
        self.futures: dict[str, cf.Future] = {}
        self.submitted = threading.Event()

    def submit(self, msg: pb.Item, block_s: float = 0.0, cpu_start: float | None = None
               ) -> cf.Future:
        fut: cf.Future = cf.Future()
        fut.domain = "math"  # type: ignore[attr-defined]
        self.futures[msg.id] = fut
        if self.auto:
            finish(fut, msg.id)
        self.submitted.set()
        return fut


def finish(fut: cf.Future, item_id: str) -> None:
    fut.set_result(Result(item_id, 1.0, True, Status.CORRECT))


def stream(scorer: FakeScorer, gate: Gate, *, inflight: int = 8, batched: bool = False,
           active=lambda: True) -> ItemStream:
    return ItemStream(submit=scorer.submit, metrics=ServerMetrics(), inflight=inflight,
                      max_batch=4, batched=batched, is_active=active, peer="test", gated=gate)


def wait_for(cond, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_every_item_answered_once_and_the_gate_told() -> None:
    scorer, gate = FakeScorer(auto=True), Gate()
    out = list(stream(scorer, gate).run(pb.Item(id=f"i{n}") for n in range(5)))
    assert sorted(r.id for r in out) == [f"i{n}" for n in range(5)]
    assert gate.scoring == 0 and gate.touched == 5


def test_a_batched_stream_answers_in_result_batches() -> None:
    scorer, gate = FakeScorer(auto=True), Gate()
    batches = [pb.ItemBatch(items=[pb.Item(id=f"b{b}i{n}") for n in range(3)]) for b in range(2)]
    out = list(stream(scorer, gate, batched=True).run(iter(batches)))
    assert all(isinstance(m, pb.ResultBatch) for m in out)
    assert sorted(r.id for m in out for r in m.results) == sorted(
        i.id for b in batches for i in b.items)


def test_a_slot_is_freed_only_when_its_result_has_been_written() -> None:
    """inflight=1: the second item is not even submitted while the first one's result, though
    computed, has not been taken by the writer's caller."""
    scorer, gate = FakeScorer(auto=True), Gate()
    results = stream(scorer, gate, inflight=1).run(pb.Item(id=i) for i in ("a", "b"))
    first = next(results)
    time.sleep(0.3)
    assert first.id == "a" and list(scorer.futures) == ["a"]
    assert [r.id for r in results] == ["b"]


def test_a_refused_batch_ends_the_call_after_the_results_in_hand() -> None:
    scorer, gate = FakeScorer(auto=True), Gate()
    batches = [pb.ItemBatch(items=[pb.Item(id="ok")]),
               pb.ItemBatch(items=[pb.Item(id=f"x{n}") for n in range(5)])]  # over max_batch
    got = []
    with pytest.raises(VerifierError) as e:
        for m in stream(scorer, gate, batched=True).run(iter(batches)):
            got += [r.id for r in m.results]
    assert e.value.code == "invalid_argument" and got == ["ok"]


def test_an_item_the_service_failed_ends_the_call_and_cancels_the_rest() -> None:
    """The results written before it stand; the items still being scored are cancelled, and
    their slots and the gate's count given back."""
    scorer, gate = FakeScorer(), Gate()
    results = stream(scorer, gate).run(pb.Item(id=i) for i in ("a", "b", "c"))
    threading.Thread(target=lambda: (wait_for(lambda: len(scorer.futures) == 3),
                                     finish(scorer.futures["a"], "a"))).start()
    assert next(results).id == "a"
    scorer.futures["b"].set_exception(VerifierError("out of descriptors", "unavailable"))
    with pytest.raises(VerifierError) as e:
        next(results)
    assert e.value.code == "unavailable"
    assert scorer.futures["c"].cancelled() and gate.scoring == 0


def test_a_reader_that_fails_ends_the_call_as_internal() -> None:
    def requests():
        yield pb.Item(id="a")
        raise RuntimeError("boom")

    scorer, gate = FakeScorer(auto=True), Gate()
    got = []
    with pytest.raises(VerifierError) as e:
        for r in stream(scorer, gate).run(requests()):
            got.append(r.id)
    assert e.value.code == "internal" and "boom" in str(e.value) and got == ["a"]


def test_a_call_that_ends_stops_the_stream_and_cancels_its_items() -> None:
    active = threading.Event()
    active.set()
    scorer, gate = FakeScorer(), Gate()
    results = stream(scorer, gate, active=active.is_set).run(iter([pb.Item(id="a")]))
    threading.Thread(target=lambda: (scorer.submitted.wait(5), active.clear())).start()
    assert list(results) == []  # the writer noticed within its poll, and wrote nothing
    assert scorer.futures["a"].cancelled() and gate.scoring == 0
