"""benchmarks/soak.py for half a minute: three real ``verifier serve`` replicas (one SIGKILLed
every 10 s, one drained with SIGTERM once), mixed traffic from one client, sampled every
second. Every item must come back exactly once with its expected verdict, nothing may be left
on the host, and the JSON report must have its documented shape. Throughput, growth and the
scratch of SIGKILLed replicas are reported, not gated (``--goals correctness``): 30 s on a
busy machine measures none of them. ``--grace-s 10`` keeps the drain (an open stream is an
in-flight call, served through the grace) and the drained replica's restart inside the run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"math_right", "math_wrong", "code_stdin_right", "code_stdin_wrong", "code_call_right",
         "code_call_wrong", "attack_loop", "attack_fork", "attack_memory", "attack_flood",
         "math_bomb", "overlong"}


@pytest.mark.slow
def test_soak_half_a_minute(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--minutes", "0.5",
           "--kill-every-s", "10", "--sample-s", "1", "--warmup-s", "3", "--grace-s", "10",
           "--settle-s", "10", "--goals", "correctness", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    rep = json.loads(out.read_text())

    counts = rep["counts"]
    for what in ("lost", "duplicated", "wrong", "unjudged", "unexpected"):
        assert counts[what] == 0, (what, rep["examples"])
    assert counts["sent"] == counts["answered"] > 100

    # every kind under every profile was sent and judged
    seen = {tuple(k.split("/")) for k in rep["by_kind"]}
    assert {k for k, _ in seen} == KINDS
    assert {p for _, p in seen} == {"default", "lcb", "skywork"}

    # the faults happened: the victim killed and back, the drained one drained once
    kills = [f for f in rep["faults"] if f["role"] == "victim" and f["signal"] == "SIGKILL"]
    drains = [f for f in rep["faults"] if f["role"] == "drained" and f["signal"] == "SIGTERM"]
    assert kills and all(f["exit_code"] == -9 for f in kills)
    assert len(drains) == 1 and drains[0]["exit_code"] == 0
    assert len(rep["replicas"]["victim"]["incarnations"]) == len(kills) + 1
    assert len(rep["replicas"]["steady"]["incarnations"]) == 1

    assert len(rep["windows"]) == 6
    for w in rep["windows"]:
        assert {"start_s", "end_s", "results", "items_per_s", "faults", "undisturbed_s",
                "steady_items_per_s", "p50_ms", "p99_ms", "load"} <= set(w)
    assert len(rep["samples"]) >= 10
    s = rep["samples"][-1]
    for role in ("victim", "drained", "steady"):
        assert role in s
    assert s["steady"]["alive"] and s["steady"]["rss_mb"] > 0 and s["steady"]["fds"] > 0
    for key in ("orphans", "shm_entries", "shm_bytes", "scratch_entries", "client_outstanding",
                "client_unanswered", "latency_p50_ms"):
        assert key in s
    for key in ("rss_mb", "fds"):
        assert {"samples", "span_s", "pct_per_hour"} <= set(rep["growth"][key])
    # Per kind of process: the server and a forkserver with its worker always run; together
    # they are the replica's RSS.
    kinds = s["steady"]["rss_mb_by_kind"]
    assert set(kinds) == {"server", "forkserver", "workers", "other"}
    assert kinds["server"] > 0 and kinds["forkserver"] > 0 and kinds["workers"] > 0, kinds
    assert abs(sum(kinds.values()) - s["steady"]["rss_mb"]) <= 0.05 * s["steady"]["rss_mb"]
    assert set(rep["rss_growth_by_kind"]) == set(kinds)

    left = rep["leftovers"]
    for key in ("processes", "shm", "cgroups", "scratch_clean_stop"):
        assert not left[key], (key, left[key])
    assert isinstance(left["scratch_after_sigkill"], list)
    results = {g["goal"]: g["result"] for g in rep["goals"]}
    assert len(results) == 9 and "FAIL" not in results.values()
