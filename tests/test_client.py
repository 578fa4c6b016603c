"""Client retries against a real server process that dies (SIGKILL) and comes back on the same
port: batches are retried, and a broken stream re-sends exactly its unanswered items. With an
outage window a stream rides out a time with no replica at all, and gives up only past it."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Iterator

import pytest

from tests.conftest import ServerProcess, free_port, math_item
from verifier.client import ClientConfig, VerifierClient
from verifier.items import Status, VerifierError


def items(n: int, prefix: str) -> list[dict]:
    return [math_item(f"{prefix}{i}", rf"\boxed{{{i}}}", str(i if i % 2 else i + 1)) for i in range(n)]


def expected(i: int) -> Status:
    return Status.CORRECT if i % 2 else Status.INCORRECT


def test_batch_is_retried_after_the_server_restarts() -> None:
    port = free_port()
    sp = ServerProcess(port)
    client = VerifierClient(sp.address, ClientConfig(backoff_s=0.2, max_retries=20, batch_size=2000))
    client.wait_ready()
    out: dict = {}

    def call():
        out["results"] = client.score(items(1500, "r"))

    th = threading.Thread(target=call)
    th.start()
    time.sleep(0.5)
    sp.terminate(signal.SIGKILL)  # dies mid-call: the client sees UNAVAILABLE
    time.sleep(0.5)
    sp2 = ServerProcess(port)
    try:
        th.join(timeout=180)
        results = out["results"]
        assert [r.id for r in results] == [f"r{i}" for i in range(1500)]
        assert all(r.status is expected(i) for i, r in enumerate(results))
    finally:
        sp2.terminate()


def test_stream_resends_unanswered_items_after_a_crash() -> None:
    port = free_port()
    sp = ServerProcess(port)
    client = VerifierClient(sp.address, ClientConfig(backoff_s=0.2, max_retries=20))
    client.wait_ready()
    seen: list[str] = []
    restarted: list[ServerProcess] = []

    def gen():
        for it in items(400, "s"):
            yield it
            time.sleep(0.002)

    try:
        for r in client.stream(gen()):
            seen.append(r.id)
            assert r.status is expected(int(r.id[1:]))
            if len(seen) == 100 and not restarted:
                sp.terminate(signal.SIGKILL)
                restarted.append(ServerProcess(port))
        assert len(seen) == 400 and len(set(seen)) == 400  # every item once, none twice
        assert restarted, "the server was never restarted: the test did not test a crash"
    finally:
        for p in restarted:
            p.terminate()
        sp.terminate(signal.SIGKILL)


def paced(n: int, prefix: str) -> Iterator[dict]:
    """``items(n, prefix)`` at a few hundred a second: some are still to send when the server is
    killed."""
    for it in items(n, prefix):
        yield it
        time.sleep(0.002)


def test_stream_rides_out_an_outage_until_the_replica_restarts(caplog) -> None:
    """The only replica SIGKILLed mid-stream and restarted on its port a few seconds later:
    within the outage window the stream waits (one log line per wait), then the restarted
    replica gets the unanswered items, and every item has exactly one result. max_retries=1:
    without the window the stream would have given up within a second."""
    port = free_port()
    sp = ServerProcess(port)
    cfg = ClientConfig(backoff_s=0.1, max_backoff_s=1.0, max_retries=1, outage_window_s=120.0)
    client = VerifierClient(sp.address, cfg)
    client.wait_ready()
    seen: list[str] = []
    restarted: list[ServerProcess] = []

    def restart_later() -> None:
        time.sleep(3.0)  # down for a while: several waits, more than max_retries failures
        restarted.append(ServerProcess(port))

    restarter = threading.Thread(target=restart_later)
    try:
        with caplog.at_level(logging.WARNING, logger="verifier.client"):
            for r in client.stream(paced(400, "o")):
                seen.append(r.id)
                assert r.status is expected(int(r.id[1:]))
                if len(seen) == 100:
                    sp.terminate(signal.SIGKILL)
                    restarter.start()
        restarter.join(timeout=120)
        assert restarted, "the server was never restarted: the test did not test an outage"
        assert len(seen) == 400 and len(set(seen)) == 400  # every item once, none twice
        stats = client.replica_stats()[sp.address]
        assert stats["answered"] == 400 and stats["failed"] > cfg.max_retries, stats
        waits = [r.getMessage() for r in caplog.records
                 if r.getMessage().startswith("verifier outage")]
        assert waits, "no wait was logged"
        for line in waits:
            assert f"every replica down ({sp.address})" in line, line
            assert "items waiting" in line and "of the 120 s outage window waited" in line, line
    finally:
        client.close()
        restarter.join(timeout=120)
        for p in restarted:
            p.terminate()
        sp.terminate(signal.SIGKILL)


def test_stream_gives_up_past_the_outage_window_when_no_replica_comes_back() -> None:
    """The only replica SIGKILLed mid-stream for good: the stream raises a one-line
    "unavailable" error after the 3 s window, not before (and well before the deadline); the
    results it gave are each once."""
    sp = ServerProcess()
    cfg = ClientConfig(backoff_s=0.1, max_backoff_s=0.5, max_retries=1, outage_window_s=3.0)
    client = VerifierClient(sp.address, cfg)
    client.wait_ready()
    seen: list[str] = []
    killed_at: list[float] = []
    try:
        with pytest.raises(VerifierError, match="past the outage window of 3 s") as err:
            for r in client.stream(paced(400, "g")):
                seen.append(r.id)
                if len(seen) == 100:
                    killed_at.append(time.monotonic())
                    sp.terminate(signal.SIGKILL)
        waited = time.monotonic() - killed_at[0]
        assert 3.0 <= waited < 30.0, waited
        assert err.value.code == "unavailable" and "\n" not in str(err.value)
        assert sp.address in str(err.value) and "items unanswered" in str(err.value)
        assert 100 <= len(seen) < 400 and len(set(seen)) == len(seen)
    finally:
        client.close()
        sp.terminate(signal.SIGKILL)
