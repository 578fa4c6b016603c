"""Fleet benchmark: one streaming client against 1 and 2 ``verifier serve`` replicas (items/s
and the scaling ratio), then latency percentiles under 8 concurrent streaming clients against
2 replicas.

Same realistic math items as bench_math.py (chain-of-thought text, a boxed answer in one of many
forms, half of them wrong), unique per phase. Replicas are real child processes on loopback
ports; the client is ``VerifierClient`` given a comma list of their addresses, so one logical
stream runs one gRPC stream per replica (verifier/client/fleet.py).

    .venv/bin/python benchmarks/bench_fleet.py [--n 3000] [--workers 1] [--clients 8] \
        [--per-client 2000]

On a machine with C cores, give the replicas C cores in total (here: 2 cores, 1 worker each):
the ratio then shows how much of the second replica's capacity one client can use.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_math import make_items  # noqa: E402  (the same unique, realistic math items)


def relabel(items: list[dict], prefix: str) -> list[dict]:
    return [{**it, "id": f"{prefix}{i}"} for i, it in enumerate(items)]


def one_client(address: str, items: list[dict]) -> float:
    from verifier.client import VerifierClient

    with VerifierClient(address) as client:
        client.wait_ready(all_replicas=True)
        list(client.stream(relabel(make_items(100, seed=99), "warm")))
        start = time.perf_counter()
        n = sum(1 for _ in client.stream(items))
        rate = n / (time.perf_counter() - start)
    assert n == len(items)
    return rate


def many_clients(address: str, clients: int, per_client: int) -> dict:
    from verifier.client import VerifierClient

    lat: list[list[float]] = [[] for _ in range(clients)]
    counts = [0] * clients

    def run(c: int) -> None:
        sent: dict[str, float] = {}
        items = relabel(make_items(per_client, seed=1000 + c), f"c{c}-")

        def source() -> Iterator[dict]:
            for it in items:
                sent[it["id"]] = time.perf_counter()
                yield it

        with VerifierClient(address) as client:
            for r in client.stream(source()):
                lat[c].append(time.perf_counter() - sent[r.id])
                counts[c] += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total_s = time.perf_counter() - start
    flat = sorted(x for xs in lat for x in xs)
    assert sum(counts) == clients * per_client, counts
    return {"total_s": total_s, "items_per_s": len(flat) / total_s,
            "p50_ms": statistics.median(flat) * 1000,
            "p99_ms": flat[int(0.99 * (len(flat) - 1))] * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="items for the 1-client runs")
    ap.add_argument("--workers", type=int, default=1, help="math workers per replica")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=2000)
    args = ap.parse_args()

    from verifier.client.local import LocalVerifier

    replicas = [LocalVerifier(workers=args.workers), LocalVerifier(workers=args.workers)]
    try:
        one = one_client(replicas[0].address, relabel(make_items(args.n, seed=1), "a"))
        both = ",".join(r.address for r in replicas)
        two = one_client(both, relabel(make_items(args.n, seed=2), "b"))
        load = many_clients(both, args.clients, args.per_client)
    finally:
        for r in replicas:
            r.stop()
    print(f"one client, {args.n} unique math items, {args.workers} worker(s) per replica, "
          f"{os.cpu_count()} CPU cores")
    print(f"  1 replica : {one:8.1f} items/s")
    print(f"  2 replicas: {two:8.1f} items/s")
    print(f"  scaling ratio 2/1 = {two / one:.2f}")
    print(f"{args.clients} clients x {args.per_client} items against 2 replicas: "
          f"{load['total_s']:.1f} s, {load['items_per_s']:.0f} items/s, "
          f"latency p50 {load['p50_ms']:.0f} ms, p99 {load['p99_ms']:.0f} ms")


if __name__ == "__main__":
    main()
