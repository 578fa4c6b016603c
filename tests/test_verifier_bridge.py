"""trainer/verifier_bridge.py: the verifier client that runs in a child process, against a real
verifier (a gRPC server on port 0, or `verifier serve` as a process for the failure cases)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ServerProcess, math_item
from trainer.verifier_bridge import RewardClient, RewardError
from verifier.client import ClientConfig

ROOT = Path(__file__).resolve().parents[1]


def items(prefix: str, n: int) -> list[dict]:
    """Item i answers i mod 3 to a question whose gold is 1."""
    return [math_item(f"{prefix}{i}", f"so $\\boxed{{{i % 3}}}$", "1") for i in range(n)]


def gone(pid: int, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # reap it if it is our own child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def rclient(server):
    with RewardClient(server[1]) as c:
        yield c


def test_results_of_several_submits_come_back_keyed_by_id(rclient) -> None:
    stream = rclient.stream()
    stream.submit(items("a", 5))
    stream.submit([])
    stream.submit(items("b", 4))
    results, waited = stream.wait(timeout_s=60)
    assert sorted(results) == sorted([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(4)])
    assert [results[f"a{i}"].correct for i in range(5)] == [i % 3 == 1 for i in range(5)]
    assert results["b1"].reward == 1.0 and results["b2"].reward == 0.0
    assert waited >= 0.0


def test_a_repeated_response_is_judged_once_and_its_copies_get_its_verdict(rclient,
                                                                           server) -> None:
    """verifier.dedupe: items equal but for their id (across submits too) go to the verifier
    once; every id gets a Result under its own id, the verdict of the one judged. An item
    that differs in anything but the id (here the gold) is judged on its own."""
    stream = rclient.stream()
    stream.submit(items("a", 5))  # responses 0, 1, 2, 0, 1
    stream.submit(items("b", 3) + [math_item("c", "so $\\boxed{1}$", "2")])
    results, _ = stream.wait(timeout_s=60)
    assert stream.judged == 4  # 0, 1 and 2 against gold 1; 1 against gold 2
    assert sorted(results) == sorted([f"a{i}" for i in range(5)] + ["b0", "b1", "b2", "c"])
    assert all(r.id == i for i, r in results.items())
    assert [results[f"a{i}"].reward for i in range(5)] == [0.0, 1.0, 0.0, 0.0, 1.0]
    assert results["b1"].reward == 1.0 and results["c"].reward == 0.0
    assert results["a4"].detail == results["a1"].detail
    assert stream.arrived_at["b1"] == stream.arrived_at["a1"]
    other = rclient.stream()  # equal ground truths held by two objects (two Problems)
    literal, gold = "12", "".join(["1", "2"])
    assert gold == literal and gold is not literal  # equal, not the same object
    other.submit([math_item("p", "so $\\boxed{12}$", literal),
                  math_item("q", "so $\\boxed{12}$", gold)])
    got, _ = other.wait(timeout_s=60)
    assert other.judged == 1 and got["q"].reward == got["p"].reward == 1.0
    with RewardClient(server[1], dedupe=False) as plain:
        each = plain.stream()
        each.submit(items("a", 5))
        got, _ = each.wait(timeout_s=60)
        assert each.judged == 5
        assert {i: r.reward for i, r in got.items()} == \
            {f"a{i}": results[f"a{i}"].reward for i in range(5)}


def test_two_open_streams_get_their_own_results(rclient) -> None:
    first, second = rclient.stream(), rclient.stream()
    first.submit(items("x", 3))
    second.submit(items("y", 2))
    got2, _ = second.wait(timeout_s=60)
    got1, _ = first.wait(timeout_s=60)
    assert sorted(got1) == ["x0", "x1", "x2"] and sorted(got2) == ["y0", "y1"]


def test_an_aborted_stream_leaves_the_client_usable(rclient) -> None:
    stream = rclient.stream()
    stream.submit(items("z", 3))
    stream.abort()
    with pytest.raises(RuntimeError, match="after wait"):
        stream.submit(items("z", 1))
    again = rclient.stream()
    again.submit(items("w", 2))
    assert sorted(again.wait(timeout_s=60)[0]) == ["w0", "w1"]


def test_bad_items_get_per_item_verdicts_not_a_failed_stream(rclient) -> None:
    stream = rclient.stream()
    stream.submit([{"id": "bad", "domain": "chemistry", "response": "x", "ground_truth": "1"},
                   *items("ok", 1)])
    results, _ = stream.wait(timeout_s=60)
    assert results["bad"].status.value == "INVALID_INPUT"
    assert results["ok0"].status.value == "INCORRECT"


def test_unreachable_verifier_is_an_error_naming_it() -> None:
    t0 = time.monotonic()
    with pytest.raises(RewardError, match=r"127\.0\.0\.1:1 is not reachable"):
        RewardClient("127.0.0.1:1", connect_timeout_s=1.0)
    assert time.monotonic() - t0 < 30


def test_a_hung_verifier_fails_wait_at_its_deadline_then_a_new_stream_works() -> None:
    with ServerProcess() as srv, RewardClient(srv.address) as client:
        stream = client.stream()
        os.kill(srv.proc.pid, signal.SIGSTOP)  # the verifier stops answering, stays connected
        try:
            stream.submit(items("h", 3))
            t0 = time.monotonic()
            with pytest.raises(RewardError, match="no answer from the verifier within 2 s"):
                stream.wait(timeout_s=2.0)
            assert 1.9 < time.monotonic() - t0 < 10
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        again = client.stream()  # a fresh client process
        again.submit(items("r", 2))
        assert sorted(again.wait(timeout_s=60)[0]) == ["r0", "r1"]


def test_a_verifier_gone_for_good_fails_the_stream_loudly() -> None:
    cfg = ClientConfig(max_retries=1, backoff_s=0.05, max_backoff_s=0.1)
    srv = ServerProcess()
    try:
        client = RewardClient(srv.address, cfg)
        srv.terminate(signal.SIGKILL)
        stream = client.stream()
        stream.submit(items("g", 2))
        t0 = time.monotonic()
        with pytest.raises(RewardError, match="verifier stream failed"):
            stream.wait(timeout_s=60)
        assert time.monotonic() - t0 < 30, "gave up only at the deadline, not after its retries"
        client.close()
    finally:
        srv.stop()


def test_a_killed_client_process_fails_the_step_and_is_replaced(rclient) -> None:
    stream = rclient.stream()
    stream.submit(items("k", 2))
    pid = rclient._proc.pid
    os.kill(pid, signal.SIGKILL)
    assert gone(pid, 10)
    with pytest.raises(RewardError, match="client process died"):
        stream.submit(items("k", 1))
        stream.wait(timeout_s=30)
    again = rclient.stream()
    assert rclient._proc.pid != pid
    again.submit(items("n", 2))
    assert sorted(again.wait(timeout_s=60)[0]) == ["n0", "n1"]


def test_the_client_process_does_not_outlive_a_killed_trainer(server) -> None:
    code = ("import os, signal, sys; from trainer.verifier_bridge import RewardClient; "
            f"c = RewardClient({server[1]!r}); print(c._proc.pid, flush=True); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    child = int(out.stdout.split()[0])
    assert gone(child, 10), "the verifier client process outlived its parent"


def test_close_stops_the_client_process(server) -> None:
    client = RewardClient(server[1])
    proc = client._proc
    client.close()
    assert proc.poll() is not None
    with pytest.raises(RewardError, match="closed"):
        client.stream()


def test_ctrl_c_in_the_terminal_does_not_reach_the_client_process(rclient) -> None:
    """The trainer finishes its step on Ctrl-C, which needs the client process: it sits in its
    own session and ignores SIGINT."""
    child = rclient._proc.pid
    assert os.getsid(child) != os.getsid(0)
    stream = rclient.stream()
    os.kill(child, signal.SIGINT)
    stream.submit(items("c", 2))
    assert sorted(stream.wait(timeout_s=60)[0]) == ["c0", "c1"]
    assert rclient._proc.pid == child


def test_a_stream_of_a_replaced_process_fails_without_harming_the_new_one(rclient) -> None:
    old = rclient.stream()
    os.kill(rclient._proc.pid, signal.SIGKILL)
    rclient._proc.wait()
    fresh = rclient.stream()  # starts a new client process
    with pytest.raises(RewardError, match="process this stream used is gone"):
        old.submit(items("o", 1))
    with pytest.raises(RewardError, match="process this stream used is gone"):
        old.wait(timeout_s=5)
    fresh.submit(items("f", 2))
    assert sorted(fresh.wait(timeout_s=60)[0]) == ["f0", "f1"]


def test_a_frozen_client_process_fails_submit_at_the_send_deadline(server, monkeypatch) -> None:
    import trainer.verifier_bridge as rewards

    monkeypatch.setattr(rewards, "SEND_TIMEOUT_S", 1.0)
    client = RewardClient(server[1])
    try:
        stream = client.stream()
        frozen = client._proc
        os.kill(frozen.pid, signal.SIGSTOP)  # alive, reading nothing
        # Distinct responses: a repeated one would not be sent again (verifier.dedupe).
        big = [math_item(f"big{i}", f"{i} " + "x" * 100_000 + "\\boxed{1}", "1")
               for i in range(200)]
        t0 = time.monotonic()
        with pytest.raises(RewardError, match="took no input for 1 s"):
            for i in range(0, len(big), 10):
                stream.submit(big[i:i + 10])
        assert time.monotonic() - t0 < 30
        assert gone(frozen.pid, 10), "the frozen process was not replaced"
        again = client.stream()
        again.submit(items("a", 1))
        assert list(again.wait(timeout_s=60)[0]) == ["a0"]
    finally:
        client.close()


def test_a_failed_restart_is_retried_at_the_next_stream() -> None:
    from tests.conftest import free_port

    port = free_port()
    srv = ServerProcess(port)
    client = RewardClient(srv.address, connect_timeout_s=1.0)
    try:
        srv.stop()
        os.kill(client._proc.pid, signal.SIGKILL)
        client._proc.wait()
        with pytest.raises(RewardError, match="not reachable"):
            client.stream()
        srv = ServerProcess(port)  # the verifier is back
        stream = client.stream()
        stream.submit(items("b", 2))
        assert sorted(stream.wait(timeout_s=60)[0]) == ["b0", "b1"]
    finally:
        client.close()
        srv.stop()
