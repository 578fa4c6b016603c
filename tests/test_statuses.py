"""Every status of the closed enum is reachable, through a real server and real nsjail."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.conftest import math_item
from tests.conftest_sandbox import refuse_sandbox
from verifier.client import VerifierClient
from verifier.items import Item, Status
from verifier.scoring.scorer import Scorer, ScoringConfig
from verifier.service.server import ServeConfig, create_server

FENCE = "```"


def code_item(item_id: str, program: str, gt: dict, **extra) -> dict:
    return {"id": item_id, "domain": "code", "response": f"{FENCE}python\n{program}\n{FENCE}",
            "ground_truth": gt, **extra}


STDIO = {"inputs": ["2\n"], "outputs": ["4\n"]}
CASES = {
    Status.CORRECT: math_item("a", r"\boxed{\frac{1}{2}}", "0.5"),
    Status.INCORRECT: math_item("b", r"\boxed{3}", "5"),
    Status.NO_ANSWER: math_item("c", "<think>never closed \\boxed{5}", "5"),
    Status.TIMEOUT: code_item("d", "while True:\n    pass", STDIO, limits={"test_timeout_s": 0.5}),
    Status.RUNTIME_ERROR: code_item("e", "raise ValueError('boom')", STDIO),
    Status.MEMORY_LIMIT: code_item("f", "x = bytearray(2 * 1024**3)", STDIO, limits={"memory_mb": 256}),
    Status.OUTPUT_LIMIT: code_item("g", "while True:\n    print('x' * 10000)", STDIO),
    Status.COMPILE_ERROR: code_item("h", "import no_such_module\ndef f(x):\n    return x",
                                    {"inputs": ["1"], "outputs": ["1"], "fn_name": "f"}),
    Status.SYNTAX_ERROR: code_item("i", "def f(:\n    pass", STDIO),
    Status.INVALID_INPUT: {"id": "j", "domain": "chemistry", "response": "x", "ground_truth": "1"},
    Status.RESPONSE_TOO_LONG: math_item("k", "x" * 1_000_001, "1"),
}


@pytest.mark.parametrize("status", list(CASES), ids=lambda s: s.value)
def test_status_reachable_over_grpc(server, status: Status) -> None:
    _, addr = server
    with VerifierClient(addr) as client:
        (result,) = client.score([CASES[status]])
    assert result.status is status, result.detail
    assert result.reward == (1.0 if status is Status.CORRECT else 0.0)


def test_sandbox_error_when_no_sandbox_works(monkeypatch) -> None:
    monkeypatch.setattr("verifier.scoring.scorer.create_sandbox", refuse_sandbox("test: nsjail missing"))
    scorer = Scorer(ScoringConfig(workers=1))
    srv, port = create_server("127.0.0.1:0", ServeConfig(), scorer=scorer)
    try:
        with VerifierClient(f"127.0.0.1:{port}") as client:
            code, math = client.score([CASES[Status.RUNTIME_ERROR], CASES[Status.CORRECT]])
        assert code.status is Status.SANDBOX_ERROR and "nsjail missing" in code.detail
        assert math.status is Status.CORRECT  # math is unaffected
    finally:
        srv.stop(1)


def test_internal_error_when_a_math_worker_dies_mid_item() -> None:
    """A worker killed from outside while scoring: the item says INTERNAL_ERROR (never a
    silent 0 reward), the worker is replaced, and the next item is scored normally."""
    slow = r"\boxed{" + "x^" * 400 + "x}"  # math-verify's parser needs ~1 s for this
    with Scorer(ScoringConfig(workers=1)) as scorer:
        (pid,) = scorer._pool.pids()
        fut = scorer.submit(Item("k", "math", slow, "5"))
        time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        result = fut.result(timeout=30)
        assert result.status is Status.INTERNAL_ERROR and "signal 9" in result.detail
        assert result.reward == 0.0 and not result.correct
        ok = scorer.submit(Item("l", "math", r"\boxed{2}", "2")).result(timeout=30)
        assert ok.status is Status.CORRECT


def test_every_status_is_covered() -> None:
    covered = set(CASES) | {Status.SANDBOX_ERROR, Status.INTERNAL_ERROR}
    assert covered == set(Status)
