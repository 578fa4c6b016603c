"""Everyday mistakes answered in one line, before anything heavy starts and leaving nothing
behind: `trainer run` with its data missing (naming the command that writes it and where
relative paths are read from), with no verifier at --verifier-addr (a warning within seconds,
then one error line, no traceback, no run directory); and the verifier client's wait saying
what it found at the address."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from verifier.client import VerifierClient, nothing_listens
from verifier.items import VerifierError

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "trainer" / "configs" / "demo.yaml"


def free_port() -> int:
    """A port nothing listens on (bound, then closed: connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_missing_data_is_one_line_naming_the_command_that_writes_it(tmp_path) -> None:
    r = trainer(tmp_path, "run", f"output_dir={tmp_path / 'runs'}", "--config", str(DEMO))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    line = lines[0]
    assert "data.train_files: runs/demo-data/train.jsonl does not exist" in line
    assert "data.eval_files: runs/demo-data/eval.jsonl does not exist" in line
    assert f"relative paths are read from {tmp_path}" in line and "`make demo`" in line
    assert not (tmp_path / "runs").exists()  # nothing half-made


def test_a_missing_model_directory_is_named(tmp_path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("")
    r = trainer(tmp_path, "run", f"output_dir={tmp_path / 'runs'}", f"data.train_files=[{data}]",
                "data.eval_files=[]", "eval.every_steps=0", "tiny_model=null",
                f"model_path={tmp_path / 'nope'}", "--config", str(DEMO))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"model_path: {tmp_path / 'nope'} does not exist" in r.stderr
    assert "make demo" not in r.stderr and "relative paths" not in r.stderr


def test_the_client_says_nothing_listens_and_why(caplog) -> None:
    port = free_port()
    assert nothing_listens(f"127.0.0.1:{port}") == f"connection refused at 127.0.0.1:{port}"
    assert "does not resolve" in nothing_listens("no-such-host.invalid:50051")
    with socket.socket() as listening:  # something accepts: not "nothing listens"
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert nothing_listens(f"127.0.0.1:{listening.getsockname()[1]},"
                               f"127.0.0.1:{port}") is None
    caplog.set_level(logging.WARNING, logger="verifier.client")
    with pytest.raises(VerifierError) as err:
        VerifierClient(f"127.0.0.1:{port}").wait_ready(timeout_s=3.0, refused_s=0.5)
    assert f"not ready after 3 s: connection refused at 127.0.0.1:{port}" in str(err.value)
    assert "verifier serve" in str(err.value)
    warned = [r.getMessage() for r in caplog.records if "no verifier at" in r.getMessage()]
    assert len(warned) == 1 and "connection refused" in warned[0]


@pytest.mark.slow
def test_trainer_run_without_a_verifier_is_one_line_and_leaves_no_run(tmp_path) -> None:
    data = subprocess.run([sys.executable, str(ROOT / "datasets" / "toyworld.py"), "--out",
                           str(tmp_path / "data"), "--train", "40", "--eval", "8", "--seed", "0"],
                          capture_output=True, text=True, check=True)
    assert data.returncode == 0
    port = free_port()
    r = trainer(tmp_path, "run", "warm_start.steps=0", "verifier.connect_timeout_s=10",
                f"output_dir={tmp_path / 'runs'}", "name=nover",
                f"data.train_files=[{tmp_path / 'data' / 'train.jsonl'}]",
                f"data.eval_files=[{tmp_path / 'data' / 'eval.jsonl'}]",
                "--config", str(DEMO), "--verifier-addr", f"127.0.0.1:{port}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"connection refused at 127.0.0.1:{port}" in errors[0]
    assert "no verifier at" in r.stderr  # the warning came first
    assert not (tmp_path / "runs" / "nover").exists()


def test_a_port_in_use_is_one_line_before_the_sandbox_self_test() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for flags, what in ((["--port", str(port)], "gRPC"),
                            (["--port", "0", "--http-port", str(port)], "HTTP")):
            r = subprocess.run([sys.executable, "-m", "verifier.cli", "serve", *flags], cwd=ROOT,
                               capture_output=True, text=True, timeout=120, check=False)
            assert r.returncode == 2, r.stderr[-2000:]
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and f"port in use: {what} 127.0.0.1:{port}" in lines[0]
            assert "self-test" not in r.stderr  # refused before the sandbox started


def test_the_text_log_says_where_it_listens_and_math_verify_stays_quiet(tmp_path) -> None:
    """The "verifier listening" line carries its address and ports in the text format too (the
    JSON format always did), and math-verify's per-worker "Timeout is disabled" warnings,
    untrue under our own deadlines, are not printed."""
    proc = subprocess.Popen([sys.executable, "-m", "verifier.cli", "serve", "--port", "0",
                             "--metrics-port", "0", "--log-format", "text"], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if "verifier listening" in line:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    listening = seen[-1]
    assert "verifier listening address=127.0.0.1:" in listening, seen
    assert "metrics_port=" in listening and "metrics_port=None" not in listening
    assert not [ln for ln in seen if "Timeout is disabled" in ln], seen
