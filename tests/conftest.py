"""Shared fixtures: a real verifier server on a loopback port, and a way to run
``verifier serve`` as a separate process (for signal and restart tests)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from verifier.scoring import ScoringConfig
from verifier.server import ServeConfig, create_server

ROOT = Path(__file__).resolve().parents[1]


def math_item(item_id: str, response: str, gold, **extra) -> dict:
    return {"id": item_id, "domain": "math", "response": response, "ground_truth": gold, **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[object, str]]:
    """A real server in this process on 127.0.0.1:<free port>, 2 workers, nsjail sandbox."""
    srv, port = create_server("127.0.0.1:0", ServeConfig(scoring=ScoringConfig(workers=2)))
    yield srv, f"127.0.0.1:{port}"
    srv.stop(grace_s=1.0)


class ServerProcess:
    """``verifier serve`` in a child process; ``address`` is read from its first log line."""

    def __init__(self, port: int = 0, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "verifier.cli", "serve", "--port", str(port), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self.address = self._wait_for_address(timeout_s=60)

    def _wait_for_address(self, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("verifier serve exited early:\n" + "".join(self.lines))
            self.lines.append(line)
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("message") == "verifier listening":
                return rec["address"]
        raise RuntimeError("verifier serve did not report its address:\n" + "".join(self.lines))

    def rest_of_output(self) -> str:
        assert self.proc.stdout is not None
        return "".join(self.lines) + self.proc.stdout.read()

    def terminate(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout_s)
