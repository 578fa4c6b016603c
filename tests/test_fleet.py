"""The verifier fleet on loopback: real ``verifier serve`` replicas (child processes) and
in-process servers, clients given a comma list or a ``dns:///`` address.

- load: 8 concurrent streaming clients x 2,000 math items against 2 replicas; nothing lost or
  duplicated, every verdict right, latency percentiles printed;
- SIGKILL one replica mid-stream: every item still answered exactly once, and right;
- a replica that comes back (restarted on its port) is used again;
- dns:/// targets (the real resolver on localhost, and a faked multi-address name that changes);
- per-stream client window, and the server's retry hint.

Every loop is bounded in items and time; all traffic stays on 127.0.0.0/8.
"""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServerProcess, free_port, math_item
from verifier.client import fleet
from verifier.client import AsyncVerifierClient, ClientConfig, VerifierClient
from verifier.items import Status, VerifierError
from verifier.scoring.scorer import ScoringConfig
from verifier.service.server import ServeConfig, create_server

ANSWER_FORMS = [
    (r"\frac{{{a}}}{{2}}", "{a}/2"),
    ("{a}", "{a}"),
    (r"{a}\sqrt{{2}}", r"{a}\sqrt{{2}}"),
    ("x = {a}", "{a}"),
]


def item(prefix: str, i: int) -> dict:
    """Varied forms; every third answer is wrong."""
    resp_t, gold_t = ANSWER_FORMS[i % len(ANSWER_FORMS)]
    a = i + 1
    answer = resp_t.format(a=a if i % 3 else a + 1)
    return math_item(f"{prefix}{i}", f"<think>step {i}</think> so $\\boxed{{{answer}}}$",
                     gold_t.format(a=a))


def expected(i: int) -> Status:
    return Status.CORRECT if i % 3 else Status.INCORRECT


def index(item_id: str) -> int:
    return int(item_id.rsplit("-", 1)[1])


def start_replicas(n: int, *args: str, ports: list[int] | None = None) -> list[ServerProcess]:
    """``n`` ``verifier serve`` processes started at once (start-up is mostly imports)."""
    ports = ports or [0] * n
    with ThreadPoolExecutor(n) as ex:
        futs = [ex.submit(ServerProcess, ports[k], "--workers", "1", "--metrics-port", "0",
                          *args) for k in range(n)]
        return [f.result() for f in futs]


def stop_all(procs: list[ServerProcess]) -> None:
    for p in procs:
        p.terminate(signal.SIGKILL)


def listening_record(sp: ServerProcess) -> dict:
    for line in sp.lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("message") == "verifier listening":
            return rec
    raise AssertionError("no 'verifier listening' line")


def scrape(metrics_port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[tuple[str, tuple], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def items_scored(metrics_port: int) -> float:
    return sum(v for (name, _), v in scrape(metrics_port).items()
               if name == "verifier_items_total")


# ---------------------------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------------------------

N_CLIENTS = 8
N_ITEMS = 2000


def test_load_8_clients_x_2000_items_against_2_replicas() -> None:
    procs = start_replicas(2)
    try:
        addr = ",".join(p.address for p in procs)
        with VerifierClient(addr) as probe:
            probe.wait_ready(all_replicas=True)
        outcomes: dict[int, dict] = {}

        def run_client(c: int) -> None:
            sent_at: dict[str, float] = {}
            latencies: list[float] = []
            ids: list[str] = []
            wrong: list[str] = []

            def source() -> Iterator[dict]:
                for i in range(N_ITEMS):
                    it = item(f"c{c}-", i)
                    sent_at[it["id"]] = time.perf_counter()
                    yield it

            with VerifierClient(addr) as client:
                for r in client.stream(source()):
                    latencies.append(time.perf_counter() - sent_at[r.id])
                    ids.append(r.id)
                    if r.status is not expected(index(r.id)):
                        wrong.append(f"{r.id}: {r.status.value} {r.detail}")
                stats = client.replica_stats()
            outcomes[c] = {"ids": ids, "lat": latencies, "wrong": wrong, "stats": stats}

        start = time.perf_counter()
        threads = [threading.Thread(target=run_client, args=(c,)) for c in range(N_CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
        total_s = time.perf_counter() - start
        assert len(outcomes) == N_CLIENTS, "a client did not finish"
        per_replica = {p.address: 0 for p in procs}
        for c, o in outcomes.items():
            assert len(o["ids"]) == N_ITEMS, f"client {c}: {len(o['ids'])} results"
            assert sorted(o["ids"]) == sorted(f"c{c}-{i}" for i in range(N_ITEMS)), \
                f"client {c}: lost or duplicated results"
            assert not o["wrong"], o["wrong"][:5]
            for a, s in o["stats"].items():
                per_replica[a] += s["answered"]
        # Both replicas did real work; per-server counters agree with what clients saw.
        served = {p.address: items_scored(listening_record(p)["metrics_port"]) for p in procs}
        assert all(n > N_CLIENTS * N_ITEMS * 0.2 for n in per_replica.values()), per_replica
        assert sum(served.values()) == N_CLIENTS * N_ITEMS, served
        lat = sorted(x for o in outcomes.values() for x in o["lat"])
        p50 = statistics.median(lat)
        p99 = lat[int(0.99 * (len(lat) - 1))]
        print(f"\nfleet load: {N_CLIENTS} clients x {N_ITEMS} items vs 2 replicas in "
              f"{total_s:.1f} s ({N_CLIENTS * N_ITEMS / total_s:.0f} items/s); "
              f"latency p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; "
              f"per replica {per_replica}")
    finally:
        stop_all(procs)


# ---------------------------------------------------------------------------------------------
# Failures
# ---------------------------------------------------------------------------------------------


def test_sigkill_one_replica_mid_stream_every_item_once_and_right() -> None:
    procs = start_replicas(2)
    victim, survivor = procs
    n = 1500
    try:
        with VerifierClient(",".join(p.address for p in procs),
                            ClientConfig(max_backoff_s=1.0)) as client:
            client.wait_ready(all_replicas=True)
            seen: list[str] = []
            at_kill: dict = {}
            for r in client.stream(item("k-", i) for i in range(n)):
                seen.append(r.id)
                assert r.status is expected(index(r.id)), (r.id, r.status, r.detail)
                if len(seen) == 300:
                    at_kill = client.replica_stats()[victim.address]
                    victim.terminate(signal.SIGKILL)
            stats = client.replica_stats()
        assert at_kill, "the replica was never killed"
        assert at_kill["sent"] > at_kill["answered"], "nothing was in flight on the victim"
        assert len(seen) == n and len(set(seen)) == n  # every item once, none twice
        assert stats[victim.address]["failed"] >= 1
        in_flight_at_kill = at_kill["sent"] - at_kill["answered"]
        # the victim's unanswered items were re-sent to (and answered by) the survivor
        assert stats[survivor.address]["answered"] + stats[victim.address]["answered"] == n
        print(f"\nSIGKILL: {in_flight_at_kill} items in flight on the victim were re-sent")
    finally:
        stop_all(procs)


def test_restarted_replica_is_used_again() -> None:
    port = free_port()
    procs = start_replicas(2, ports=[port, 0])
    victim = procs[0]
    restarted: list[ServerProcess] = []
    cfg = ClientConfig(backoff_s=0.1, max_backoff_s=0.5)
    deadline = time.monotonic() + 90
    try:
        with VerifierClient(",".join(p.address for p in procs), cfg) as client:
            client.wait_ready(all_replicas=True)
            answered_before_restart: list[int] = []

            def source() -> Iterator[dict]:
                # Keeps sending until the restarted replica has answered items (bounded).
                i = 0
                while time.monotonic() < deadline and i < 40_000:
                    if i == 500:
                        victim.terminate(signal.SIGKILL)
                        threading.Thread(target=lambda: restarted.append(
                            start_replicas(1, ports=[port])[0])).start()
                    if restarted and not answered_before_restart:
                        answered_before_restart.append(
                            client.replica_stats()[victim.address]["answered"])
                    if answered_before_restart and (
                            client.replica_stats()[victim.address]["answered"]
                            > answered_before_restart[0] + 100):
                        return
                    yield item("r-", i)
                    i += 1
                    if i % 50 == 0:
                        time.sleep(0.02)

            results = list(client.stream(source()))
            stats = client.replica_stats()
        ids = [r.id for r in results]
        assert len(ids) == len(set(ids))
        assert all(r.status is expected(index(r.id)) for r in results)
        assert restarted, "the replica was not restarted in time"
        assert stats[victim.address]["answered"] > answered_before_restart[0] + 100, stats
        # the new process itself scored items (its own counters started at zero)
        assert items_scored(listening_record(restarted[0])["metrics_port"]) >= 100
    finally:
        stop_all(procs + restarted)


# ---------------------------------------------------------------------------------------------
# Addresses
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_servers() -> Iterator[tuple[str, str]]:
    """Two in-process servers on the same port of 127.0.0.1 and 127.0.0.2, as two pods behind
    one DNS name would be."""
    a, port = create_server("127.0.0.1:0", ServeConfig(scoring=ScoringConfig(workers=1)))
    b, _ = create_server(f"127.0.0.2:{port}", ServeConfig(scoring=ScoringConfig(workers=1)))
    yield f"127.0.0.1:{port}", f"127.0.0.2:{port}"
    a.stop(1)
    b.stop(1)


def test_dns_target_to_localhost(two_servers) -> None:
    port = two_servers[0].rsplit(":", 1)[1]
    with VerifierClient(f"dns:///localhost:{port}") as client:
        client.wait_ready()
        streamed = list(client.stream(item("d-", i) for i in range(200)))
        batch = client.score([item("e-", i) for i in range(50)])
        assert f"127.0.0.1:{port}" in client.replica_stats()
    assert sorted(index(r.id) for r in streamed) == list(range(200))
    assert all(r.status is expected(index(r.id)) for r in streamed)
    assert [r.status for r in batch] == [expected(i) for i in range(50)]


def test_dns_name_with_several_addresses_is_spread_and_re_resolved(two_servers,
                                                                   monkeypatch) -> None:
    a, b = two_servers
    port = int(a.rsplit(":", 1)[1])
    answer = {"ips": ["127.0.0.1", "127.0.0.2"]}
    real = fleet.getaddrinfo

    def fake_getaddrinfo(host, p, *args, **kw):
        if host != "verifier.test":
            return real(host, p, *args, **kw)
        import socket
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, p)) for ip in answer["ips"]]

    monkeypatch.setattr(fleet, "getaddrinfo", fake_getaddrinfo)
    cfg = ClientConfig(dns_refresh_s=0.2)
    with VerifierClient(f"dns:///verifier.test:{port}", cfg) as client:
        client.wait_ready(all_replicas=True)
        results = list(client.stream(item("m-", i) for i in range(600)))
        stats = client.replica_stats()
        assert set(stats) == {a, b}
        assert all(s["answered"] > 50 for s in stats.values()), stats
        # the name now points at one pod only: the other is retired, all work goes there
        answer["ips"] = ["127.0.0.2"]
        time.sleep(0.3)
        later = list(client.stream(item("n-", i) for i in range(200)))
        stats2 = client.replica_stats()
        assert stats2[a]["retired"] and not stats2[b]["retired"]
        assert stats2[a]["answered"] == stats[a]["answered"]
        assert stats2[b]["answered"] == stats[b]["answered"] + 200
    for rs, n in ((results, 600), (later, 200)):
        assert sorted(index(r.id) for r in rs) == list(range(n))
        assert all(r.status is expected(index(r.id)) for r in rs)


def test_a_name_that_never_resolves_is_waited_out_for_the_outage_window(monkeypatch) -> None:
    """No replica at all (a headless Service with no ready pod): with an outage window the
    stream keeps resolving until the window has passed, then gives up naming the address."""
    import socket

    def no_answer(host, port, *args, **kw):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(fleet, "getaddrinfo", no_answer)
    cfg = ClientConfig(backoff_s=0.05, max_backoff_s=0.2, max_retries=1, outage_window_s=1.5)
    with VerifierClient("dns:///verifier.test:50051", cfg) as client:
        start = time.monotonic()
        with pytest.raises(VerifierError, match="past the outage window of 1.5 s") as err:
            list(client.stream(item("z-", i) for i in range(5)))
        waited = time.monotonic() - start
    assert 1.5 <= waited < 20, waited
    assert "no verifier replica found at dns:///verifier.test:50051" in str(err.value)
    assert err.value.code == "unavailable"


def test_comma_list_with_a_dead_replica(two_servers) -> None:
    dead = f"127.0.0.1:{free_port()}"
    addr = f"{dead},{two_servers[0]}, {two_servers[1]}"
    with VerifierClient(addr, ClientConfig(max_backoff_s=0.5)) as client:
        streamed = list(client.stream(item("x-", i) for i in range(300)))
        batch = client.score([item("y-", i) for i in range(700)])
        stats = client.replica_stats()
    assert sorted(index(r.id) for r in streamed) == list(range(300))
    assert [r.status for r in batch] == [expected(i) for i in range(700)]
    assert stats[dead]["answered"] == 0 and stats[dead]["failed"] >= 1


def test_async_client_over_the_fleet(two_servers) -> None:
    addr = ",".join(two_servers)

    async def source():
        for i in range(300):
            yield item("as-", i)
            if i % 100 == 0:
                await asyncio.sleep(0)

    async def go():
        async with AsyncVerifierClient(addr) as client:
            await client.wait_ready(all_replicas=True)
            streamed = [r async for r in client.stream(source())]
            batch = await client.score([item("ab-", i) for i in range(20)])
            return streamed, batch, client.replica_stats()

    streamed, batch, stats = asyncio.run(go())
    assert sorted(index(r.id) for r in streamed) == list(range(300))
    assert all(r.status is expected(index(r.id)) for r in streamed)
    assert [r.status for r in batch] == [expected(i) for i in range(20)]
    assert all(s["answered"] > 0 for s in stats.values())


def test_bad_addresses_are_refused() -> None:
    from verifier.items import VerifierError

    for bad in ("", " , ", "dns://8.8.8.8/name:1", "dns:///name", "dns:///name:0"):
        with pytest.raises(VerifierError):
            VerifierClient(bad)


# ---------------------------------------------------------------------------------------------
# Bounds
# ---------------------------------------------------------------------------------------------


def test_client_window_bounds_items_in_flight_per_replica(two_servers) -> None:
    window = 8
    addr = ",".join(two_servers)
    with VerifierClient(addr, ClientConfig(stream_window=window)) as client:
        worst = [0]

        def source() -> Iterator[dict]:
            for i in range(400):
                for s in client.replica_stats().values():
                    worst[0] = max(worst[0], s["sent"] - s["answered"])
                yield item("w-", i)

        results = list(client.stream(source()))
    assert sorted(index(r.id) for r in results) == list(range(400))
    assert 0 < worst[0] <= window, worst


def test_resource_exhausted_honours_the_retry_hint() -> None:
    srv, port = create_server("127.0.0.1:0", ServeConfig(
        scoring=ScoringConfig(workers=1, max_pending=3)))
    try:
        cfg = ClientConfig(max_retries=1, backoff_s=0.01, batch_size=10)
        with VerifierClient(f"127.0.0.1:{port}", cfg) as client:
            start = time.monotonic()
            with pytest.raises(grpc.RpcError) as e:
                client.score([item("h-", i) for i in range(10)])  # over the server's batch cap
            elapsed = time.monotonic() - start
        assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert elapsed >= 0.45, elapsed  # waited the server's 500 ms, not the 10 ms backoff
    finally:
        srv.stop(1)


def test_a_stream_longer_than_the_rpc_deadline_is_reopened(two_servers) -> None:
    """timeout_s bounds one gRPC stream, not the logical stream: past it, the stream is
    reopened and its unanswered items re-sent (a trainer's stream may outlive any deadline)."""
    cfg = ClientConfig(timeout_s=0.6, backoff_s=0.05, max_backoff_s=0.2)

    def slow() -> Iterator[dict]:
        for i in range(150):
            yield item("t-", i)
            if i % 10 == 9:
                time.sleep(0.1)  # ~1.5 s of sending: several deadlines pass

    with VerifierClient(",".join(two_servers), cfg) as client:
        results = list(client.stream(slow()))
        failed = sum(s["failed"] for s in client.replica_stats().values())
    assert sorted(index(r.id) for r in results) == list(range(150))
    assert all(r.status is expected(index(r.id)) for r in results)
    assert failed >= 2, "no stream reached its deadline: the test did not test a reopen"
