"""The verifier image and the docker sandbox backend on a real Docker engine (tests/conftest_docker.py
finds or starts it and builds ``magic-rlvr/verifier`` once per run).

- the image, run with the documented flags: HEALTHCHECK and ``verifier health`` answer; math and
  code items are judged right with nsjail working inside the container (start-up self-test
  passes, no SANDBOX_ERROR); the service runs as the non-root user; a non-loopback bind without
  token or TLS is refused; the token is required; SIGTERM drains in-flight work and exits 0;
- two verifier containers behind the fleet client, one ``docker kill``ed mid-stream: every
  item answered exactly once, and right;
- the docker sandbox backend (the verifier image as its image): stdin and files, no network,
  read-only root, uid 65534, memory, processes, output cap, wall and CPU time, file size, and no
  container left behind, even one killed from outside; ``verifier serve --sandbox docker``;
- compose: deploy/docker-compose.yml with 2 replicas, scored through (where docker-compose is
  installed).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

# The SDK is the `docker` extra, which `make setup` installs; an older environment gets a skip
# that says so instead of a collection error (hence the imports below this line: E402).
# ruff: noqa: E402
pytest.importorskip("docker", reason="the docker Python SDK is not installed (make setup)")

from sandbox import SandboxLimits, SandboxUnavailable, create_sandbox
from sandbox.policy_reader import policy_environment, policy_rlimits
from scripts import docker_engine as de
from tests.conftest import ServerProcess, math_item
from tests.conftest_docker import (  # noqa: F401 - docker_env is a fixture
    TOKEN, VerifierContainer, docker_env, last_logs,
)
from tests.conftest_sandbox import SUM_GT, SUM_OK, respond
from verifier.client import ClientConfig, VerifierClient
from verifier.scoring.code_score import score_code
from verifier.items import Limits, Status

ROOT = Path(__file__).resolve().parents[1]
VERIFIER_UID = 10001
SANDBOX_LABEL = "magic-rlvr.sandbox"

# The first test also starts the engine and, on a first run, makes the base image and builds
# the image (4 min measured under load): past pytest-timeout's 300 s default on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def token_client(address: str, token: str | None = TOKEN, **cfg) -> VerifierClient:
    """A client that sends ``token`` (through a variable of its own: the test process's
    VERIFIER_TOKEN is not touched)."""
    var = f"TEST_TOKEN_{uuid.uuid4().hex[:8]}"
    if token is not None:
        os.environ[var] = token
    return VerifierClient(address, ClientConfig(token_env=var, **cfg))


def math_items(prefix: str, n: int) -> list[dict]:
    """Every third answer is wrong."""
    return [math_item(f"{prefix}-{i}", f"so $\\boxed{{{i + 1 if i % 3 else i + 2}}}$", str(i + 1))
            for i in range(n)]


def expected(item_id: str) -> Status:
    return Status.CORRECT if int(item_id.rsplit("-", 1)[1]) % 3 else Status.INCORRECT


def code_item(item_id: str, code: str) -> dict:
    return {"id": item_id, "domain": "code", "response": respond(code), "ground_truth": SUM_GT}


@pytest.fixture(scope="module")
def verifier(docker_env):
    """One verifier container with the image's own command (0.0.0.0, token from the
    environment, metrics on 9090, grace 30 s), healthy."""
    vc = VerifierContainer(docker_env)
    try:
        vc.listening_record()
        yield vc
    finally:
        vc.remove()


# ---------------------------------------------------------------------------------------------
# The verifier image
# ---------------------------------------------------------------------------------------------


def test_image_starts_with_nsjail_self_test_passing_and_reports_healthy(verifier) -> None:
    rec = verifier.listening_record()
    assert rec["sandbox"] == "nsjail" and rec["sandbox_problem"] is None, rec
    assert rec["token"] is True and rec["address"] == "0.0.0.0:50051"
    # Docker's own HEALTHCHECK (the image's `verifier health`) and the command run by hand.
    verifier.wait_healthy()
    code, out = verifier.container.exec_run(
        ["verifier", "health", "--addr", "127.0.0.1:50051", "--wait-s", "10"])
    assert code == 0, out.decode()
    # What the jail enforces in this container, as the service's user sees it (here: no
    # cgroup the non-root service can write, so rlimits only; deploy/README.md).
    code, out = verifier.container.exec_run(
        ["python3", "-c", "from sandbox import create_sandbox; "
                          "print(create_sandbox('nsjail').describe())"], stderr=False)
    said = out.decode().strip()
    assert code == 0 and said.startswith("nsjail"), said
    assert "uid 65534, no network, read-only root" in said, said
    # The non-root nsjail's file capabilities (CAP_SETUID/SETGID) map any outside uid: each
    # jail gets its own from the pool here too, not the single-uid mode.
    assert "outside uid per jail from 1900000000-1900001023" in said, said
    print(f"\nin the container: {said}")
    # Prometheus: the sandbox is up.
    with urllib.request.urlopen(verifier.metrics_url, timeout=10) as r:
        text = r.read().decode()
    up = [s.value for f in text_string_to_metric_families(text) for s in f.samples
          if s.name == "verifier_sandbox_up"]
    assert up == [1.0], up


def test_service_runs_as_the_non_root_user(verifier) -> None:
    # Every process of the container (tini, the server, its workers) as seen from inside.
    probe = ("import os\nfor p in os.listdir('/proc'):\n"
             " if not p.isdigit() or int(p) == os.getpid(): continue\n"
             " try:\n  s=open(f'/proc/{p}/status').read(); c=open(f'/proc/{p}/cmdline','rb').read()\n"
             " except OSError: continue\n"
             " uid=[l.split()[1] for l in s.splitlines() if l.startswith('Uid:')][0]\n"
             " print(uid, c.replace(b'\\0',b' ').decode()[:80].replace('\\n',' '))\n")
    code, out = verifier.container.exec_run(["python3", "-c", probe], user="0")
    assert code == 0, out.decode()
    procs = [line.split(" ", 1) for line in out.decode().splitlines()]
    assert any("verifier serve" in cmd for _, cmd in procs), procs
    assert len(procs) >= 3, procs  # tini, the server, its workers
    assert all(uid == str(VERIFIER_UID) for uid, _ in procs), procs
    assert verifier.container.attrs["Config"]["User"] == f"{VERIFIER_UID}:{VERIFIER_UID}"


def test_math_and_code_are_judged_right_by_nsjail_inside_the_container(verifier) -> None:
    items = math_items("m", 12) + [
        code_item("c-ok", SUM_OK),
        code_item("c-wrong", "a, b = map(int, input().split())\nprint(a * b)"),
        # inside the jail: no network, no secrets, and the verdict is still a verdict
        code_item("c-net", "import socket\nsocket.create_connection(('1.1.1.1', 53), 2)\n"
                           "a, b = map(int, input().split())\nprint(a + b)"),
        code_item("c-shadow", "print(open('/etc/shadow').read())"),
        code_item("c-loop", "while True: pass"),
    ]
    with token_client(verifier.address) as client:
        client.wait_ready(timeout_s=60)
        results = {r.id: r for r in client.score(items)}
    assert set(results) == {it["id"] for it in items}
    for it in items[:12]:
        assert results[it["id"]].status is expected(it["id"]), results[it["id"]]
    assert results["c-ok"].status is Status.CORRECT, results["c-ok"]
    assert (results["c-ok"].passed, results["c-ok"].total) == (3, 3)
    assert results["c-wrong"].status is Status.INCORRECT, results["c-wrong"]
    for bad in ("c-net", "c-shadow"):
        assert results[bad].status in (Status.INCORRECT, Status.RUNTIME_ERROR), results[bad]
    assert results["c-loop"].status is Status.TIMEOUT, results["c-loop"]
    assert not [r for r in results.values() if r.status is Status.SANDBOX_ERROR]


def test_the_token_is_required(verifier) -> None:
    items = math_items("t", 2)
    for token in (None, "wrong-token"):
        with token_client(verifier.address, token, max_retries=0) as client:
            with pytest.raises(grpc.RpcError) as e:
                client.score(items)
            assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED, token
    with token_client(verifier.address) as client:
        assert [r.status for r in client.score(items)] == [Status.INCORRECT, Status.CORRECT]


def test_non_loopback_bind_without_token_or_tls_is_refused(docker_env) -> None:
    # The image's command (--token-env VERIFIER_TOKEN) with the variable unset, and a command
    # with no token option at all: neither starts.
    for name, command, says in [
        ("notoken", None, "VERIFIER_TOKEN holds no token"),
        ("noauth", ["serve", "--host", "0.0.0.0", "--port", "50051"], "--insecure"),
    ]:
        vc = VerifierContainer(docker_env, token=None, command=command, name=name)
        try:
            code = vc.wait_exit(timeout_s=120)
            logs = " ".join(vc.logs().replace("│", " ").split())  # the CLI's box, unwrapped
            assert code != 0, logs
            assert says in logs, logs
            assert "verifier listening" not in logs
        finally:
            vc.remove()


def de_tail(text: str) -> str:
    return "\n".join(text.splitlines()[-15:])


def test_sigterm_drains_in_flight_work_and_the_container_exits_0(docker_env) -> None:
    vc = VerifierContainer(docker_env, name="drain")
    try:
        vc.listening_record()
        sent = [0]
        n = 120

        def slow_items():
            for it in math_items("d", n):
                sent[0] += 1
                yield it
                time.sleep(0.05)  # ~6 s of sending: the signal lands mid-stream

        out: dict = {}

        def call() -> None:
            try:
                with token_client(vc.address) as client:
                    client.wait_ready(timeout_s=60)
                    out["results"] = list(client.stream(slow_items()))
            except Exception as e:  # noqa: BLE001 - recorded for the assertion below
                out["error"] = e

        th = threading.Thread(target=call)
        th.start()
        deadline = time.monotonic() + 60
        while sent[0] < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sent[0] >= 20, "the stream never started"
        # What `docker stop` sends first (STOPSIGNAL SIGTERM): tini must forward it.
        vc.container.kill(signal="SIGTERM")
        assert sent[0] < n, "the stream finished before SIGTERM: nothing was in flight"
        t0 = time.monotonic()
        code = vc.wait_exit(timeout_s=90)
        took = time.monotonic() - t0
        th.join(timeout=60)
        assert not th.is_alive()
        assert "error" not in out, out.get("error")
        ids = [r.id for r in out["results"]]
        assert sorted(ids) == sorted(f"d-{i}" for i in range(n))
        assert all(r.status is expected(r.id) for r in out["results"])
        assert code == 0, last_logs(vc.container)
        assert took < 30 + 10, f"drain took {took:.0f} s, past the 30 s grace"
        logs = vc.logs()
        assert "draining" in logs and "stopped" in logs, de_tail(logs)
    finally:
        vc.remove()


def test_two_containers_one_docker_killed_mid_stream(docker_env) -> None:
    victim = VerifierContainer(docker_env, name="victim")
    survivor = VerifierContainer(docker_env, name="survivor")
    try:
        victim.listening_record()
        survivor.listening_record()
        n = 1200
        addr = f"{victim.address},{survivor.address}"
        with token_client(addr, max_backoff_s=1.0) as client:
            client.wait_ready(timeout_s=60, all_replicas=True)
            seen: list[str] = []
            wrong: list[str] = []
            at_kill: dict = {}
            for r in client.stream(iter(math_items("k", n))):
                seen.append(r.id)
                if r.status is not expected(r.id):
                    wrong.append(f"{r.id}: {r.status.value} {r.detail}")
                if len(seen) == 200:
                    at_kill = client.replica_stats()[victim.address]
                    victim.container.kill()  # SIGKILL: no drain
            stats = client.replica_stats()
        assert at_kill, "the replica was never killed"
        assert at_kill["sent"] > at_kill["answered"], "nothing was in flight on the victim"
        assert not wrong, wrong[:5]
        assert len(seen) == n and len(set(seen)) == n  # every item once, none twice
        assert stats[victim.address]["failed"] >= 1
        assert stats[survivor.address]["answered"] + stats[victim.address]["answered"] == n
    finally:
        victim.remove()
        survivor.remove()


# ---------------------------------------------------------------------------------------------
# The docker sandbox backend
# ---------------------------------------------------------------------------------------------


def sandbox_containers(env) -> list:
    return env.client.containers.list(all=True, filters={"label": SANDBOX_LABEL})


@pytest.fixture(scope="module")
def docker_sandbox(docker_env):
    # The verifier image has /usr/bin/python3 (no registry here for python:3.11-slim).
    return create_sandbox("docker", image=docker_env.image, python="/usr/bin/python3",
                          base_url=docker_env.engine.url)


@pytest.fixture
def sb(docker_sandbox, docker_env):
    """The backend; afterwards no sandbox container is left on the engine."""
    yield docker_sandbox
    left = sandbox_containers(docker_env)
    assert not left, f"sandbox containers left behind: {[c.name for c in left]}"


def py(sb, code: str, **kw):
    return sb.run([sb.python, "-I", "-S", "-c", code], **kw)


def test_docker_backend_describes_itself_and_passes_its_self_test(sb) -> None:
    assert sb.name == "docker" and sb.isolated
    assert "network none" in sb.describe()
    sb.self_test()


def test_docker_backend_stdin_files_and_exit_code(sb) -> None:
    r = sb.run([sb.python, "-I", "prog.py"], stdin=b"2 3\n",
               files={"prog.py": b"import sys\nprint(sum(map(int, input().split())))\n"
                                 b"print(open('data/x.txt').read())\nsys.exit(3)",
                      "data/x.txt": b"hello"})
    assert r.status == "ok", r
    assert (r.exit_code, r.stdout) == (3, b"5\nhello\n")


def test_docker_backend_isolation(sb) -> None:
    r = py(sb, "import os, socket\nprint(os.getuid(), os.getgid())\n"
               "try:\n socket.create_connection(('1.1.1.1', 53), timeout=2); print('NET')\n"
               "except OSError: print('nonet')\n"
               "try:\n open('/x', 'w'); print('rw')\nexcept OSError: print('ro')\n"
               "try:\n open('/etc/shadow').read(); print('shadow')\n"
               "except OSError: print('noshadow')\n"
               "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])")
    assert r.status == "ok", r
    assert r.stdout.split() == [b"65534", b"65534", b"nonet", b"ro", b"noshadow",
                                b"0000000000000000"], r


def test_docker_backend_fixed_rlimits_are_the_policy_files(sb) -> None:
    """The fixed rlimits come from nsjail's policy file (sandbox.policy_reader.policy_rlimits), as
    nsjail's jails have them (tests/test_sandbox.py)."""
    fixed = policy_rlimits()
    probe = "import resource as r\nprint({n: r.getrlimit(getattr(r, 'RLIMIT_' + n.upper())) " \
            f"for n in {sorted(fixed)!r}}})"
    r = py(sb, probe)
    assert r.status == "ok" and r.exit_code == 0, r
    assert ast.literal_eval(r.stdout.decode()) == {n: (v, v) for n, v in fixed.items()}


def test_docker_backend_environment_is_the_policy_files(sb) -> None:
    """The program's environment is the policy file's envar lines, as in nsjail's jails (the
    image's own ENV aside: PATH and the rest are set, nothing of the host's passes)."""
    r = py(sb, "import os; print(repr(dict(os.environ)))")
    assert r.status == "ok" and r.exit_code == 0, r
    env = ast.literal_eval(r.stdout.decode())
    assert {k: env.get(k) for k in policy_environment()} == policy_environment()


def test_docker_backend_memory_limit(sb) -> None:
    r = py(sb, "b = bytearray(600 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); print('big')",
           limits=SandboxLimits(memory_mb=128, wall_s=60))
    assert r.status == "memory", r  # the container was OOM-killed (cgroup memory limit)
    assert b"big" not in r.stdout


class _LateOomEngine:
    """A stand-in for the engine's API in one respect the real engine shows only at random
    (under load): the container's exit is recorded before its OOM event, so the first inspects
    read OOMKilled false (containerd before 2.2; sandbox/docker_backend.py _await_oom_flag).
    The real-engine path is test_docker_backend_memory_limit above."""

    def __init__(self, flag_after: int):
        self.inspects, self.flag_after = 0, flag_after

    def wait(self, cid, timeout):
        return {"StatusCode": 137}

    def inspect_container(self, cid):
        self.inspects += 1
        return {"State": {"OOMKilled": self.inspects > self.flag_after}}


def test_docker_backend_waits_for_a_late_oom_flag() -> None:
    from sandbox.docker_backend import OOM_FLAG_GRACE_S, _end

    late = _LateOomEngine(flag_after=3)
    status, detail, _, _ = _end(late, "c", None, time.monotonic() + 10, lambda: False)
    assert status == "memory" and "memory limit" in detail and late.inspects == 4
    # A SIGKILL that is not the OOM killer's stays a signal, after the grace.
    never = _LateOomEngine(flag_after=10**9)
    t = time.monotonic()
    assert _end(never, "c", None, time.monotonic() + 10, lambda: False)[0] == "signal"
    assert time.monotonic() - t >= OOM_FLAG_GRACE_S
    # One the sandbox killed while closing is not waited for.
    closing = _LateOomEngine(flag_after=10**9)
    assert _end(closing, "c", None, time.monotonic() + 10, lambda: True)[0] == "signal"
    assert closing.inspects == 1


def test_docker_backend_process_limit(sb) -> None:
    r = py(sb, "import os, time\nn = 0\n"
               "try:\n for _ in range(200):\n  if os.fork() == 0:\n   time.sleep(5); os._exit(0)\n"
               "  n += 1\nexcept OSError as e: print('refused', n)\n",
           limits=SandboxLimits(max_procs=16, wall_s=60))
    assert r.status == "ok", r
    assert r.stdout.startswith(b"refused"), r
    assert int(r.stdout.split()[1]) < 16


def test_docker_backend_output_cap(sb) -> None:
    r = py(sb, "import sys\nwhile True: sys.stdout.write('x' * 65536)",
           limits=SandboxLimits(output_bytes=1 << 20, wall_s=60))
    assert r.status == "output_limit", r
    assert len(r.stdout) <= 1 << 20
    assert r.stdout_truncated and not r.stderr_truncated  # as nsjail's runs say it


def test_docker_backend_stdout_hook_as_nsjail(sb) -> None:
    # The same output sink as nsjail's runs (sandbox/process.py OutputSink): a hook that stops
    # the run, and a hook that raises, end the same way in both backends.
    def stop(chunk: bytes) -> bool:
        return False

    r = sb.run([sb.python, "-c", "print('hello', flush=True)\nimport time; time.sleep(60)"],
               limits=SandboxLimits(wall_s=60), on_stdout=stop)
    assert r.status == "stopped" and r.wall_s < 30, r

    def broken(chunk: bytes) -> bool:
        raise ValueError("hook bug")

    r = sb.run([sb.python, "-c", "print('hello', flush=True)\nimport time; time.sleep(60)"],
               limits=SandboxLimits(wall_s=60), on_stdout=broken)
    assert r.status == "error" and r.detail == "stdout hook failed: ValueError: hook bug", r


def test_docker_backend_wall_and_cpu_time(sb) -> None:
    t0 = time.monotonic()
    r = py(sb, "import time; time.sleep(60)", limits=SandboxLimits(wall_s=3))
    assert r.status == "timeout", r
    assert time.monotonic() - t0 < 30
    r = py(sb, "while True: pass", limits=SandboxLimits(wall_s=60, cpu_s=2))
    assert r.status == "timeout" and r.signal == 24, r  # SIGXCPU at the soft limit


def test_docker_backend_file_size_limit(sb) -> None:
    r = py(sb, "f = open('/tmp/big', 'wb')\ntry:\n f.write(b'x' * (8 << 20)); f.flush(); print('wrote')\n"
               "except OSError as e: print('efbig')",
           limits=SandboxLimits(file_size_mb=1, wall_s=60))
    # RLIMIT_FSIZE: SIGXFSZ (25) kills it, or the write fails where the signal is ignored
    assert (r.status == "signal" and r.signal == 25) or r.stdout == b"efbig\n", r


def test_docker_backend_container_killed_from_outside_is_removed(sb, docker_env) -> None:
    out: dict = {}
    th = threading.Thread(target=lambda: out.setdefault(
        "r", py(sb, "import time; print('up', flush=True); time.sleep(60)",
                limits=SandboxLimits(wall_s=90))))
    th.start()
    deadline = time.monotonic() + 60
    running: list = []
    while not running and time.monotonic() < deadline:
        running = [c for c in sandbox_containers(docker_env) if c.status == "running"]
        time.sleep(0.2)
    assert running, "the sandbox container never ran"
    running[0].kill()
    th.join(timeout=60)
    assert not th.is_alive()
    assert out["r"].status == "signal" and out["r"].signal == 9, out["r"]


def test_code_scoring_through_the_docker_backend(sb) -> None:
    ok = score_code(respond(SUM_OK), SUM_GT, Limits(), sb)
    assert ok.status is Status.CORRECT and (ok.passed, ok.total) == (3, 3), ok
    wrong = score_code(respond("a, b = map(int, input().split())\nprint(a - b)"), SUM_GT,
                       Limits(), sb)
    assert wrong.status is Status.INCORRECT, wrong


def test_verifier_serve_with_the_docker_sandbox(docker_sandbox, docker_env, monkeypatch) -> None:
    """`verifier serve --sandbox docker` on the host: code items judged in containers on the
    engine, over real gRPC; none of them left behind."""
    monkeypatch.setenv("DOCKER_HOST", docker_env.engine.url)
    sp = ServerProcess(0, "--workers", "2", "--sandbox", "docker",
                       "--docker-image", docker_env.image)
    try:
        rec = next(json.loads(line) for line in sp.lines if '"verifier listening"' in line)
        assert rec["sandbox"] == "docker" and rec["sandbox_problem"] is None, rec
        items = [code_item("ok", SUM_OK),
                 code_item("wrong", "a, b = map(int, input().split())\nprint(a * b)"),
                 code_item("loop", "while True: pass")]
        with VerifierClient(sp.address) as client:
            results = {r.id: r for r in client.score(items)}
        assert results["ok"].status is Status.CORRECT, results["ok"]
        assert results["wrong"].status is Status.INCORRECT, results["wrong"]
        assert results["loop"].status is Status.TIMEOUT, results["loop"]
    finally:
        sp.terminate(signal.SIGKILL)
    assert not sandbox_containers(docker_env)


def test_docker_backend_missing_image_is_an_error_not_a_fallback(docker_env) -> None:
    with pytest.raises(SandboxUnavailable, match="not present"):
        create_sandbox("docker", image="magic-rlvr/no-such-image:0",
                       base_url=docker_env.engine.url)


# ---------------------------------------------------------------------------------------------
# Compose
# ---------------------------------------------------------------------------------------------


def test_compose_two_replicas_score_through(docker_env, tmp_path) -> None:
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.skip("docker-compose is not installed (Debian: apt-get install docker-compose)")
    project = f"magic-rlvr-test-{uuid.uuid4().hex[:6]}"
    # Debian's docker-compose runs on the system python3 with Debian's docker SDK: a
    # PYTHONPATH that puts a newer SDK first breaks it (kwargs_from_env(ssl_version=...)).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(DOCKER_HOST=docker_env.engine.url, VERIFIER_TOKEN=TOKEN, VERIFIER_REPLICAS="2")
    # Compose v1 applies `deploy:` (replicas, limits) only with --compatibility.
    base = [compose, "--compatibility", "-p", project, "-f", str(ROOT / "deploy/docker-compose.yml")]

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *args], env=env, capture_output=True, text=True,
                              timeout=timeout)

    try:
        up = run("up", "-d", "--no-build", "verifier")
        assert up.returncode == 0, f"compose up failed:\n{up.stdout}\n{up.stderr}"
        ids = run("ps", "-q", "verifier").stdout.split()
        assert len(ids) == 2, ids
        containers = [docker_env.client.containers.get(i) for i in ids]
        net = f"{project}_fleet"
        addrs = []
        for c in containers:
            c.reload()
            addrs.append(f"{c.attrs['NetworkSettings']['Networks'][net]['IPAddress']}:50051")
        with token_client(",".join(addrs)) as client:
            client.wait_ready(timeout_s=120, all_replicas=True)
            results = list(client.stream(iter(math_items("cp", 300))))
            stats = client.replica_stats()
        assert sorted(r.id for r in results) == sorted(f"cp-{i}" for i in range(300))
        assert all(r.status is expected(r.id) for r in results)
        assert all(s["answered"] > 0 for s in stats.values()), stats
    finally:
        down = run("down", "-v", "--remove-orphans", timeout=180)
        assert down.returncode == 0, down.stderr


# ---------------------------------------------------------------------------------------------
# Bad input: each failure names its step, and leaves nothing of ours behind
# ---------------------------------------------------------------------------------------------


def test_an_engine_that_does_not_answer_is_named(tmp_path, monkeypatch) -> None:
    # DOCKER_HOST names a dead engine: an error naming it; no engine of ours instead.
    where = f"unix://{tmp_path}/nothing.sock"
    monkeypatch.setenv("DOCKER_HOST", where)
    with pytest.raises(de.EngineError, match=f"connect: DOCKER_HOST={where} does not answer"):
        de.connect(start=True, engine_dir=tmp_path / "engine", log=print)
    assert not (tmp_path / "engine").exists()
    # None named and none answering, not allowed to start one: both places tried are named.
    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.setattr(de, "DEFAULT_SOCKET", f"unix://{tmp_path}/default.sock")
    with pytest.raises(de.EngineUnavailable, match="no Docker engine answers") as e:
        de.connect(start=False, engine_dir=tmp_path / "engine")
    assert f"{tmp_path}/default.sock" in str(e.value)
    assert str(tmp_path / "engine" / "docker.sock") in str(e.value)


def processes_mentioning(text: str) -> list[str]:
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmd:
                found.append(f"{d}: {cmd[:120]}")
    return found


def test_an_engine_that_fails_to_start_names_the_step_and_leaves_no_process() -> None:
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.skip("needs root and dockerd to start an engine")
    # A short path: the engine's sockets live under it (unix socket paths max 108 bytes).
    engine_dir = Path(tempfile.mkdtemp(prefix="mr-bad-", dir="/tmp"))
    try:
        (engine_dir / "data").write_text("a file where dockerd wants its data root")
        with pytest.raises(de.EngineError, match="start engine: dockerd exited") as e:
            de.start_engine(engine_dir, log=print)
        assert "data" in str(e.value).split("\n", 1)[1], str(e.value)  # the engine's log
        assert not processes_mentioning(str(engine_dir))
    finally:
        shutil.rmtree(engine_dir)


def test_a_failing_build_names_the_step_and_leaves_no_image(docker_env, tmp_path) -> None:
    client = docker_env.client
    base = de.base_image(client)
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base}\nRUN echo one > /one\nRUN echo 'about to fail' && exit 3\n")
    images = {i.id for i in client.images.list(all=True)}
    containers = {c.id for c in client.containers.list(all=True)}
    with pytest.raises(de.EngineError) as e:
        de.build(docker_env.engine, "Dockerfile", "magic-rlvr/test-broken:0", {},
                 log=print, root=tmp_path)
    msg = str(e.value)
    assert "build magic-rlvr/test-broken:0 failed at Step 3/3 : RUN echo 'about to fail'" in msg
    assert "returned a non-zero code: 3" in msg
    assert "about to fail" in msg.split("last lines of the build:")[1]
    # the intermediate image of step 2 and the step containers are gone
    assert {i.id for i in client.images.list(all=True)} == images
    assert {c.id for c in client.containers.list(all=True)} == containers


def test_a_container_that_never_becomes_healthy_is_reported_with_its_logs(docker_env) -> None:
    vc = VerifierContainer(docker_env, token=None, name="unhealthy")
    try:
        with pytest.raises(AssertionError, match="never became healthy") as e:
            vc.wait_healthy(timeout_s=120)
        assert "VERIFIER_TOKEN holds no token" in " ".join(str(e.value).replace("│", " ").split())
    finally:
        vc.remove()
