"""What the verifier benchmarks share: stream items through a fresh local `verifier serve`, and
measure where the CPU goes (the cost breakdown of docs/verifier.md 3).

The breakdown is measured, not estimated:

- server stages: the server's ``verifier_stage_cpu_seconds{domain,stage}`` histograms (thread
  and process CPU clocks read at the stage boundaries; verifier/service/metrics.py STAGES), scraped
  from its /metrics endpoint before and after the timed run;
- server total: utime + stime of the server process and all its descendants (workers, the
  forkserver, the reaped jails) from /proc, before and after; "server other" is the total less
  the stages (gRPC's C-core threads, HTTP/2, thread switches, the metrics themselves);
- client: this process's CPU over the timed run (time.process_time: the client's Python and
  gRPC threads); its encode and decode are measured on their own over the same items.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    rate: float
    counts: dict
    wall_s: float
    n: int
    stages: dict[str, float] = field(default_factory=dict)
    """CPU seconds per item of each server stage (by stage name)."""
    server_cpu: float = 0.0
    """CPU seconds per item of the whole server process tree."""
    client_cpu: float = 0.0
    """CPU seconds per item of this (client) process."""
    client_encode: float = 0.0
    client_decode: float = 0.0
    latencies: list[float] = field(default_factory=list)
    """Seconds from the stream's start to each item's result, in item order."""
    results: list = field(default_factory=list)
    """The Results, in the order they came."""
    machine_cpu: float = 0.0
    """Busy CPU seconds per item of the whole machine over the stream (every process and the
    kernel's threads: meaningful only on an otherwise idle machine)."""


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine so far (user, nice, system, irq, softirq, steal
    from /proc/stat): what a CPU-bound machine spends, including kernel work (a network
    namespace's deferred cleanup, say) that no process is charged for."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]) / os.sysconf(
        "SC_CLK_TCK")


def _scrape(port: int) -> dict[tuple[str, str], float]:
    """(stage, "sum"|"count") -> value, summed over domains."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("verifier_stage_cpu_seconds_"):
                key = (s.labels["stage"], s.name.rsplit("_", 1)[-1])
            elif s.name in ("verifier_queue_wait_seconds_sum", "verifier_queue_wait_seconds_count"):
                key = ("queue_wait", s.name.rsplit("_", 1)[-1])
            else:
                continue
            out[key] = out.get(key, 0.0) + s.value
    return out


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and every live descendant, plus the children
    each of them has reaped (the jails, replaced workers)."""
    stats: dict[int, tuple[int, float]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:
            continue
        f = raw[raw.rindex(")") + 2:].split()
        # fields after the name: state ppid ... utime(14) stime(15) cutime(16) cstime(17)
        stats[int(d.name)] = (int(f[1]), sum(int(x) for x in f[11:15]) / _TICK)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
            todo += [p for p, (pp, _) in stats.items() if pp == pid]
    return total


def _client_codec(items: list[dict], results: list) -> tuple[float, float]:
    """Thread CPU seconds per item of the client's encode (item -> message) and decode
    (message -> Result), measured on their own over the same items."""
    from verifier.convert import encode_item, result_from_proto, result_to_proto

    t0 = time.thread_time()
    for it in items:
        encode_item(it)
    t1 = time.thread_time()
    msgs = [result_to_proto(r) for r in results]
    t2 = time.thread_time()
    for m in msgs:
        result_from_proto(m)
    t3 = time.thread_time()
    n = max(len(items), 1)
    return (t1 - t0) / n, (t3 - t2) / n


BATCHES_IN_FLIGHT = 4
"""With ``stream_run(batch=N)``: unary ``Score`` calls of N items each kept in flight at once."""


def stream_run(items: list[dict], workers: int, warmup: list[dict], *, breakdown: bool = True,
               extra_args: tuple[str, ...] = (), root: Path | None = None,
               batch: int = 0) -> Run:
    """One client streaming ``items`` through a new ``verifier serve --workers N`` (after
    ``warmup`` warms the connection and the workers): items/s, verdict counts and, with
    ``breakdown``, the measured CPU per item of each stage. ``root``: serve the verifier of
    another checkout (a "before" build). ``batch``: send the items as unary ``Score`` calls
    of that many items, ``BATCHES_IN_FLIGHT`` at a time, instead of one ``ScoreStream`` with a
    message per item (latencies are then each batch's)."""
    from verifier.client import VerifierClient
    from verifier.client.local import LocalVerifier

    args = ("--metrics-port", "0", *extra_args) if breakdown else extra_args
    with LocalVerifier(*args, workers=workers, root=root) as server:
        if server.sandbox_problem and any(it["domain"] == "code" for it in items):
            raise RuntimeError(f"no sandbox: {server.sandbox_problem}")
        with VerifierClient(server.address) as client:
            client.wait_ready()
            list(client.stream(warmup))
            if breakdown:
                # the previous stream's last results are booked a moment after they are read
                time.sleep(0.3)
                m0, s0 = _scrape(server.metrics_port), tree_cpu(server.proc.pid)
            c0, mc0 = time.process_time(), machine_cpu_s()
            start = time.perf_counter()
            order = {it["id"]: i for i, it in enumerate(items)}
            latencies = [0.0] * len(items)
            results = []
            if batch:
                def score(chunk: list[dict]) -> list:
                    out = client.score(chunk)
                    done = time.perf_counter() - start
                    for r in out:
                        latencies[order[r.id]] = done
                    return out

                chunks = [items[i:i + batch] for i in range(0, len(items), batch)]
                with ThreadPoolExecutor(BATCHES_IN_FLIGHT) as ex:
                    results = [r for out in ex.map(score, chunks) for r in out]
            else:
                for r in client.stream(items):
                    latencies[order[r.id]] = time.perf_counter() - start
                    results.append(r)
            wall = time.perf_counter() - start
            c1 = time.process_time()
            run = Run(len(items) / wall, dict(Counter(r.status.value for r in results)), wall,
                      len(items), latencies=latencies, results=results,
                      machine_cpu=(machine_cpu_s() - mc0) / len(items))
            if breakdown:
                time.sleep(0.3)
                m1, s1 = _scrape(server.metrics_port), tree_cpu(server.proc.pid)
                n = len(items)
                stages = {k[0] for k in m1}
                run.stages = {st: (m1.get((st, "sum"), 0) - m0.get((st, "sum"), 0)) / n
                              for st in sorted(stages)}
                run.server_cpu = (s1 - s0) / n
                run.client_cpu = (c1 - c0) / n
                run.client_encode, run.client_decode = _client_codec(items, results)
    return run


def stream_rate(items: list[dict], workers: int, warmup: list[dict]) -> tuple[float, dict]:
    """Items/s of one client streaming ``items`` through a new ``verifier serve --workers N``,
    and the verdict counts (no breakdown)."""
    run = stream_run(items, workers, warmup, breakdown=False)
    return run.rate, run.counts


def print_breakdown(run: Run, stage_names: list[str], title: str) -> None:
    """The breakdown table: CPU milliseconds per item of each stage."""
    from verifier.service.metrics import STAGES

    print(f"\n{title}: CPU ms per item ({run.n} items, measured; docs/verifier.md 3)")
    print(f"  {'stage':<22} {'ms/item':>8}  what")
    print(f"  {'client (whole process)':<22} {run.client_cpu * 1e3:8.3f}  this process over the "
          "run (Python + gRPC threads)")
    print(f"  {'  of which encode':<22} {run.client_encode * 1e3:8.3f}  item -> message")
    print(f"  {'  of which decode':<22} {run.client_decode * 1e3:8.3f}  message -> Result")
    known = 0.0
    for st in stage_names:
        v = run.stages.get(st, 0.0)
        known += v
        print(f"  {'server ' + st:<22} {v * 1e3:8.3f}  {STAGES[st]}")
    print(f"  {'server other':<22} {(run.server_cpu - known) * 1e3:8.3f}  the server tree's "
          "CPU not in a stage (gRPC C-core, HTTP/2, thread switches)")
    print(f"  {'server total':<22} {run.server_cpu * 1e3:8.3f}  /proc utime+stime of the "
          "server and its descendants")
    print(f"  {'queue wait (wall)':<22} {run.stages.get('queue_wait', 0.0) * 1e3:8.3f}  "
          "mean wall ms an item waited for a worker (not CPU)")
