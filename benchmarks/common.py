"""What the verifier benchmarks share: stream items through a fresh local `verifier serve`."""

from __future__ import annotations

import time
from collections import Counter


def stream_rate(items: list[dict], workers: int, warmup: list[dict]) -> tuple[float, dict]:
    """Items/s of one client streaming ``items`` through a new ``verifier serve --workers N``
    (after ``warmup`` warms the connection and the workers), and the verdict counts."""
    from verifier.client import VerifierClient
    from verifier.local import LocalVerifier

    with LocalVerifier(workers=workers) as server:
        if server.sandbox_problem and any(it["domain"] == "code" for it in items):
            raise RuntimeError(f"no sandbox: {server.sandbox_problem}")
        with VerifierClient(server.address) as client:
            client.wait_ready()
            list(client.stream(warmup))
            start = time.perf_counter()
            results = list(client.stream(items))
            rate = len(items) / (time.perf_counter() - start)
    return rate, dict(Counter(r.status.value for r in results))
