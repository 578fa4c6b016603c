"""The Prometheus endpoint of a real server: after some items, the counters by domain and status,
requests by method and code, latency histograms, worker restarts and sandbox failures move."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import urllib.request
from typing import Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import math_item
from tests.conftest_sandbox import refuse_sandbox
from verifier.client import ClientConfig, VerifierClient
from verifier.items import Status
from verifier.scoring.scorer import Scorer, ScoringConfig
from verifier.service.server import ServeConfig, create_server

FENCE = "```"


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(m: dict, name: str, **labels: str) -> float:
    return m.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def metered(tmp_path_factory) -> Iterator[tuple[str, int, str]]:
    token = tmp_path_factory.mktemp("tok") / "token"
    token.write_text("metrics-test-token\n")
    srv, port = create_server("127.0.0.1:0", ServeConfig(
        scoring=ScoringConfig(workers=1), metrics_port=0, token_file=token))
    assert srv.metrics_port
    yield f"127.0.0.1:{port}", srv.metrics_port, str(token), srv
    srv.stop(1)


def test_counters_move_by_domain_and_status(metered) -> None:
    addr, mport, token, _ = metered
    before = scrape(mport)
    items = [math_item(f"ok{i}", rf"\boxed{{{i}}}", str(i)) for i in range(5)]
    items += [math_item(f"no{i}", rf"\boxed{{{i}}}", str(i + 1)) for i in range(3)]
    items += [{"id": "bad", "domain": "chemistry", "response": "x", "ground_truth": "1"}]
    items += [{"id": "code1", "domain": "code", "response": f"{FENCE}python\nprint(4)\n{FENCE}",
               "ground_truth": {"inputs": ["2\n"], "outputs": ["4\n"]}}]
    # a trig identity goes through sympy's simplify, far over 0.1 ms
    items += [math_item("slow", r"\boxed{\sin^2 x + \cos^2 x + \frac{\sqrt{8}}{2\sqrt{2}}}", "2",
                        limits={"timeout_s": 0.0001})]
    with VerifierClient(addr, ClientConfig(token_file=token)) as client:
        batch = {r.id: r for r in client.score(items)}
        streamed = list(client.stream([math_item(f"s{i}", r"\boxed{1}", "1") for i in range(4)]))
    assert batch["code1"].status is Status.CORRECT, batch["code1"].detail
    assert batch["slow"].status is Status.TIMEOUT
    assert len(streamed) == 4
    # the client has every result; the server books the stream as it closes, a moment later
    deadline = time.monotonic() + 5
    while True:
        after = scrape(mport)
        done = value(after, "verifier_requests_total", method="ScoreBatchStream", code="OK")
        if done > value(before, "verifier_requests_total", method="ScoreBatchStream", code="OK") \
                or time.monotonic() > deadline:
            break
        time.sleep(0.05)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("verifier_items_total", domain="math", status="CORRECT") == 5 + 4
    assert delta("verifier_items_total", domain="math", status="INCORRECT") == 3
    assert delta("verifier_items_total", domain="math", status="TIMEOUT") == 1
    assert delta("verifier_items_total", domain="other", status="INVALID_INPUT") == 1
    assert delta("verifier_items_total", domain="code", status="CORRECT") == 1
    assert delta("verifier_requests_total", method="Score", code="OK") == 1
    assert delta("verifier_requests_total", method="ScoreBatchStream", code="OK") == 1, \
        {k: v for k, v in after.items() if k[0] == "verifier_requests_total"}
    assert delta("verifier_item_duration_seconds_count", domain="math") == 13
    assert delta("verifier_item_duration_seconds_count", domain="code") == 1
    assert delta("verifier_request_duration_seconds_count", method="Score") == 1
    assert value(after, "verifier_queue_depth", domain="math") == 0
    assert value(after, "verifier_active_streams") == 0
    assert value(after, "verifier_sandbox_up") == 1


def test_stage_cpu_breakdown_is_exposed(metered) -> None:
    """The cost breakdown (docs/verifier.md 3): a math item that needs sympy books every server
    and worker stage, a code item the jail's stages; each count moves by the items' number and
    each sum is CPU actually measured (positive)."""
    addr, mport, token, _ = metered
    before = scrape(mport)
    items = [math_item(f"f{i}", rf"\boxed{{\sqrt{{{i + 2}}}}}", rf"\sqrt{{{i + 2}}}+0") for i in range(3)]
    items += [{"id": "c", "domain": "code", "response": f"{FENCE}python\nprint(int(input())*2)\n{FENCE}",
               "ground_truth": {"inputs": ["2\n", "3\n"], "outputs": ["4\n", "6\n"]}}]
    with VerifierClient(addr, ClientConfig(token_file=token)) as client:
        results = list(client.stream(items))
    assert [r.status for r in results] == [Status.CORRECT] * 4, [r.detail for r in results]
    deadline = time.monotonic() + 5
    while True:  # the encode stage is booked as each result is written, a moment later
        after = scrape(mport)
        enc = value(after, "verifier_stage_cpu_seconds_count", domain="code", stage="encode")
        if enc > value(before, "verifier_stage_cpu_seconds_count", domain="code", stage="encode") \
                or time.monotonic() > deadline:
            break
        time.sleep(0.05)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    for stage in ("receive", "encode", "pool_supervisor", "worker_ipc", "scoring"):
        assert delta("verifier_stage_cpu_seconds_count", domain="math", stage=stage) == 3, stage
    assert delta("verifier_stage_cpu_seconds_sum", domain="math", stage="scoring") > 0
    assert delta("verifier_queue_wait_seconds_count", domain="math") == 3
    for stage in ("receive", "encode", "judge", "jail_setup", "harness_start", "harness_tests",
                  "tests"):
        assert delta("verifier_stage_cpu_seconds_count", domain="code", stage=stage) == 1, stage
    for stage in ("judge", "jail_setup", "harness_start", "tests"):
        assert delta("verifier_stage_cpu_seconds_sum", domain="code", stage=stage) > 0, stage


def test_unauthenticated_calls_are_counted(metered) -> None:
    addr, mport, _, _ = metered
    before = value(scrape(mport), "verifier_requests_total", method="Score",
                   code="UNAUTHENTICATED")
    with VerifierClient(addr, ClientConfig(max_retries=0)) as client:
        with pytest.raises(grpc.RpcError):
            client.score([math_item("u", r"\boxed{1}", "1")])
    after = value(scrape(mport), "verifier_requests_total", method="Score",
                  code="UNAUTHENTICATED")
    assert after == before + 1


def test_worker_restarts_are_counted(metered) -> None:
    """A math worker killed mid-item is replaced and counted (the item gets INTERNAL_ERROR)."""
    addr, mport, token, srv = metered
    before = value(scrape(mport), "verifier_worker_restarts_total", reason="died")
    slow = r"\boxed{" + "x^" * 400 + "x}"  # math-verify's parser needs ~1 s for this
    (pid,) = srv.scorer._pool.pids()
    with VerifierClient(addr, ClientConfig(token_file=token)) as client:
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(r=client.score([math_item("k", slow, "5")])))
        t.start()
        time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        t.join(timeout=30)
    assert out["r"][0].status is Status.INTERNAL_ERROR
    m = scrape(mport)
    assert value(m, "verifier_worker_restarts_total", reason="died") == before + 1
    assert value(m, "verifier_items_total", domain="math", status="INTERNAL_ERROR") >= 1


def test_recycled_workers_are_counted_and_judge_alike(tmp_path) -> None:
    """--worker-max-tasks 2: math workers are replaced every two items (counted as "recycled",
    not as faults), and every verdict is the same as without recycling."""
    srv, port = create_server("127.0.0.1:0", ServeConfig(
        scoring=ScoringConfig(workers=1, worker_max_tasks=2), metrics_port=0))
    try:
        # radicals go to a worker (no fast path): sqrt(8)/2 = sqrt(2), and a wrong one
        items = [math_item(f"r{i}", r"\boxed{\frac{\sqrt{8}}{2}}", r"\sqrt{2}") for i in range(5)]
        items += [math_item(f"w{i}", r"\boxed{\sqrt{3}}", r"\sqrt{2}") for i in range(4)]
        with VerifierClient(f"127.0.0.1:{port}", ClientConfig()) as client:
            results = client.score(items)
        assert [r.status for r in results] == [Status.CORRECT] * 5 + [Status.INCORRECT] * 4
        m = scrape(srv.metrics_port)
        assert value(m, "verifier_worker_restarts_total", reason="recycled") >= 4
        assert value(m, "verifier_worker_restarts_total", reason="died") == 0
        assert value(m, "verifier_worker_restarts_total", reason="deadline") == 0
    finally:
        srv.stop(1)


def test_rejections_and_sandbox_failures_are_counted(monkeypatch) -> None:
    monkeypatch.setattr("verifier.scoring.scorer.create_sandbox", refuse_sandbox("test: nsjail missing"))
    scorer = Scorer(ScoringConfig(workers=1, max_pending=3))
    srv, port = create_server("127.0.0.1:0", ServeConfig(metrics_port=0), scorer=scorer)
    try:
        with VerifierClient(f"127.0.0.1:{port}", ClientConfig(max_retries=0)) as client:
            with pytest.raises(grpc.RpcError):  # 5 items: over this server's batch cap of 3
                client.score([math_item(str(i), r"\boxed{1}", "1") for i in range(5)])
            code = {"id": "c", "domain": "code", "response": f"{FENCE}python\nprint(1)\n{FENCE}",
                    "ground_truth": {"inputs": [""], "outputs": ["1"]}}
            (r,) = client.score([code])
        assert r.status is Status.SANDBOX_ERROR
        m = scrape(srv.metrics_port)
        assert value(m, "verifier_rejected_total", reason="batch_too_big") == 1
        assert value(m, "verifier_requests_total", method="Score", code="RESOURCE_EXHAUSTED") == 1
        assert value(m, "verifier_sandbox_failures_total") == 1
        assert value(m, "verifier_sandbox_up") == 0
    finally:
        srv.stop(1)


def test_item_errors_are_logged_as_json_with_the_item_id(caplog) -> None:
    """A result that is not a genuine verdict leaves a structured log line naming its item."""
    from pythonjsonlogger.json import JsonFormatter

    from verifier.items import Result
    from verifier.service.metered import log_item_error

    caplog.set_level(logging.WARNING, logger="verifier.service.server")
    log_item_error(Result("item-42", 0.0, False, Status.INTERNAL_ERROR, detail="worker died"),
                   "math", logging.getLogger("verifier.service.server"))
    rec = next(r for r in caplog.records if r.getMessage() == "item not scored")
    line = json.loads(JsonFormatter("%(levelname)s %(message)s").format(rec))
    assert line["item_id"] == "item-42" and line["status"] == "INTERNAL_ERROR"
    assert line["domain"] == "math"
