"""Shared fixtures: a real verifier server on a loopback port, and a way to run
``verifier serve`` as a separate process (for signal and restart tests)."""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Iterator

import pytest

from verifier.client.local import LocalVerifier
from verifier.scoring.scorer import ScoringConfig
from verifier.service.server import ServeConfig, create_server

ROOT = Path(__file__).resolve().parents[1]


def math_item(item_id: str, response: str, gold, **extra) -> dict:
    return {"id": item_id, "domain": "math", "response": response, "ground_truth": gold, **extra}


def deepspeed_shm_buffers(port: int) -> list[str]:
    """DeepSpeed's CPU all-reduce buffers in /dev/shm named after the launch on ``port``
    (``deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>``)."""
    from trainer.dist import SHM_DIR  # here, not at the top: verifier-only tests need no torch

    return sorted(p.name for p in SHM_DIR.glob(f"deepspeed_allreduce_buffer_*_{port}_*"))


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


class ServerProcess(LocalVerifier):
    """``verifier serve`` in a child process (verifier.client.local.LocalVerifier: its address read
    from its first log line), plus what the signal and restart tests need."""

    def __init__(self, port: int = 0, *args: str):
        super().__init__(*args, port=port, startup_timeout_s=60)

    def rest_of_output(self) -> str:
        """Everything it printed; call after it exited (the reader thread then ends)."""
        self._reader.join(timeout=5)
        return self.output()

    def terminate(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout_s)
