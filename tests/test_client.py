"""Client retries against a real server process that dies (SIGKILL) and comes back on the same
port: batches are retried, and a broken stream re-sends exactly its unanswered items."""

from __future__ import annotations

import signal
import threading
import time

from tests.conftest import ServerProcess, free_port, math_item
from verifier.client import ClientConfig, VerifierClient
from verifier.items import Status


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
