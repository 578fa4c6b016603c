"""The same SandboxFusion ``POST /run_code`` workload through this verifier's HTTP gateway and
through a SandboxFusion server, side by side (docs/integrations.md, "Use the verifier from verl's
SandboxFusion setting").

The user starts SandboxFusion (its python runtime is enough) and passes its URL; this script
starts ``verifier serve --http-port 0 --workers 2`` itself. Both get the same requests, in
interleaved rounds (one round to each server, the order alternating), so load from other jobs
on the machine hits both alike. Each round sends its requests at ``--concurrency`` at once.

Workload: a+b on stdin, a CPU loop of about 50 ms, a program that raises. A request counts as
an error when the HTTP call fails or the answer is not the expected one (status, stdout,
return code). Reported per server: runs/s (over the wall time of its own rounds), p50/p99
latency, errors, and ours/theirs measured in the same run.

Then the isolation probes, through both: a program that writes a file under /tmp (does it
appear on the host?), reads /etc/passwd (does it get the host's content?) and leaves a
``sleep`` behind (is it still running on the host after the answer? any found are killed).

    python benchmarks/bench_run_code_vs_sandboxfusion.py --sandboxfusion-url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verifier.client.local import LocalVerifier  # noqa: E402

CPU_LOOP = "s = 0\nfor i in range(600_000):\n    s += i * i\nprint(s % 1000)\n"
CPU_LOOP_OUT = f"{sum(i * i for i in range(600_000)) % 1000}\n"
KINDS = {
    # name: (request fields, check of the answer)
    "a+b": ({"code": "a, b = map(int, input().split())\nprint(a + b)\n", "stdin": "2 3\n"},
            lambda b: b["status"] == "Success" and b["run_result"]["stdout"] == "5\n"),
    "cpu-50ms": ({"code": CPU_LOOP},
                 lambda b: b["status"] == "Success" and b["run_result"]["stdout"] == CPU_LOOP_OUT),
    "raises": ({"code": "print('before')\n1 / 0\n"},
               lambda b: b["status"] == "Failed" and b["run_result"]["return_code"] == 1
               and "ZeroDivisionError" in b["run_result"]["stderr"]),
}

_local = threading.local()


def post(url: str, fields: dict, timeout: float = 60.0) -> requests.Response:
    if not hasattr(_local, "session"):
        _local.session = requests.Session()
    body = {"language": "python", "run_timeout": 10, **fields}
    return _local.session.post(f"{url}/run_code", json=body, timeout=timeout)


def one(url: str, kind: str) -> tuple[float, str | None]:
    """(latency s, None or what was wrong)."""
    fields, check = KINDS[kind]
    t0 = time.perf_counter()
    try:
        r = post(url, fields)
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            return dt, f"HTTP {r.status_code}: {r.text[:200]}"
        body = r.json()
        return dt, None if check(body) else f"{kind}: unexpected answer {json.dumps(body)[:300]}"
    except Exception as e:  # noqa: BLE001 - a failed call is an error of that server
        return time.perf_counter() - t0, f"{kind}: {type(e).__name__}: {e}"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def bench(servers: dict[str, str], n: int, round_size: int, concurrency: int) -> dict:
    kinds = list(KINDS)
    stats = {name: {"lat": [], "wall": 0.0, "errors": [], "n": 0} for name in servers}
    loads = []
    rounds = max(1, n // round_size)
    with ThreadPoolExecutor(concurrency) as pool:
        for name, url in servers.items():  # warm-up, not counted
            list(pool.map(lambda k: one(url, k), kinds * concurrency))
        for r in range(rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            batch = [kinds[i % len(kinds)] for i in range(r, r + round_size)]
            for name in order:
                url, st = servers[name], stats[name]
                t0 = time.perf_counter()
                got = list(pool.map(lambda k: one(url, k), batch))
                st["wall"] += time.perf_counter() - t0
                st["n"] += len(got)
                st["lat"] += [g[0] for g in got]
                st["errors"] += [g[1] for g in got if g[1]]
            loads.append(os.getloadavg()[0])
    out = {}
    for name, st in stats.items():
        out[name] = {"runs": st["n"], "runs_per_s": st["n"] / st["wall"],
                     "p50_ms": 1e3 * pct(st["lat"], 0.5), "p99_ms": 1e3 * pct(st["lat"], 0.99),
                     "mean_ms": 1e3 * statistics.fmean(st["lat"]),
                     "errors": len(st["errors"]), "first_errors": st["errors"][:3]}
    out["load_avg_1m"] = {"min": min(loads), "mean": statistics.fmean(loads), "max": max(loads)}
    return out


def sleepers(tag: str) -> list[int]:
    """Host pids of ``sleep <tag>`` processes."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if len(argv) >= 2 and argv[0].endswith(b"sleep") and argv[1] == tag.encode():
                pids.append(int(d.name))
    return pids


def probes(url: str) -> dict:
    """The isolation probes through one server; cleans up what got through."""
    tag = f"300.{uuid.uuid4().int % 10**9}"  # `sleep 300.<n>`: a name to find it by on the host
    marker = Path("/tmp", f"run-code-probe-{uuid.uuid4().hex}")
    code = ("import hashlib, subprocess\n"
            "try:\n    print(hashlib.sha256(open('/etc/passwd', 'rb').read()).hexdigest())\n"
            "except OSError as e:\n    print('unreadable', type(e).__name__)\n"
            f"try:\n    open({str(marker)!r}, 'w').write('x'); print('wrote')\n"
            "except OSError as e:\n    print('unwritable', type(e).__name__)\n"
            f"subprocess.Popen(['sleep', {tag!r}], start_new_session=True)\n"
            "print('spawned')\n")
    r = post(url, {"code": code})
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    lines = ((body.get("run_result") or {}).get("stdout") or "").splitlines()
    host_passwd = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    time.sleep(1.0)  # let the server finish its clean-up after answering
    left = sleepers(tag)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    out = {"http": r.status_code, "status": body.get("status"), "stdout": lines,
           "read_host_passwd": bool(lines) and lines[0] == host_passwd,
           "in_jail_write": len(lines) > 1 and lines[1] == "wrote",
           "file_on_host_tmp": marker.exists(),
           "sleep_left_behind": len(left)}
    marker.unlink(missing_ok=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sandboxfusion-url", required=True,
                    help="a running SandboxFusion server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--requests", type=int, default=300, help="timed requests per server")
    ap.add_argument("--round-size", type=int, default=30, help="requests per server per round")
    ap.add_argument("--concurrency", type=int, default=2 * (os.cpu_count() or 1),
                    help="requests in flight (default: 2x the cores)")
    ap.add_argument("--workers", type=int, default=2, help="our server's --workers")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()

    theirs = args.sandboxfusion_url.rstrip("/").removesuffix("/run_code")
    with LocalVerifier("--http-port", "0", workers=args.workers) as server:
        if server.sandbox_problem:
            raise SystemExit(f"no sandbox here: {server.sandbox_problem}")
        listening = next(json.loads(line) for line in server.lines
                         if '"verifier listening"' in line)
        ours = f"http://127.0.0.1:{listening['http_port']}"
        servers = {"verifier": ours, "sandboxfusion": theirs}
        load0 = os.getloadavg()
        res = bench(servers, args.requests, args.round_size, args.concurrency)
        res["probes"] = {name: probes(url) for name, url in servers.items()}
    res["config"] = {"requests": args.requests, "round_size": args.round_size,
                     "concurrency": args.concurrency, "workers": args.workers,
                     "cores": os.cpu_count(), "load_avg_at_start": load0,
                     "kinds": list(KINDS), "sandboxfusion_url": theirs}
    v, s = res["verifier"], res["sandboxfusion"]
    res["ratio_ours_over_theirs"] = {k: v[k] / s[k] for k in ("runs_per_s", "p50_ms", "p99_ms")}

    la = res["load_avg_1m"]
    print(f"\n/run_code, {args.requests} requests per server ({', '.join(KINDS)} in turn), "
          f"concurrency {args.concurrency}, {os.cpu_count()} cores, 1-min load average "
          f"{la['min']:.1f}-{la['max']:.1f} (mean {la['mean']:.1f})")
    print(f"  {'server':<14} {'runs/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'errors':>7}")
    for name in servers:
        r = res[name]
        print(f"  {name:<14} {r['runs_per_s']:7.1f} {r['p50_ms']:7.0f} {r['p99_ms']:7.0f} "
              f"{r['errors']:7d}")
        for e in r["first_errors"]:
            print(f"      e.g. {e}")
    q = res["ratio_ours_over_theirs"]
    print(f"  {'ours/theirs':<14} {q['runs_per_s']:7.2f} {q['p50_ms']:7.2f} {q['p99_ms']:7.2f}")
    print("\nisolation probes")
    print(f"  {'server':<14} {'host /etc/passwd read':>22} {'file on host /tmp':>18} "
          f"{'sleep left behind':>18}")
    for name, p in res["probes"].items():
        print(f"  {name:<14} {str(p['read_host_passwd']):>22} {str(p['file_on_host_tmp']):>18} "
              f"{p['sleep_left_behind']:>18}   (stdout {p['stdout']})")
    if args.out:
        args.out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
