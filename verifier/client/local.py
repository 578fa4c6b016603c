"""Run ``verifier serve`` as a child process on a free loopback port, for one job.

Used by ``trainer run`` without ``--verifier-addr`` (docs/contracts.md 2), by the demo, the
benchmarks and the tests. The child logs JSON; its first "verifier listening" line carries the
bound address. Stopping sends SIGTERM, so the child drains in-flight work before it exits.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]


class LocalVerifier:
    """``with LocalVerifier(workers=2) as v: VerifierClient(v.address)``."""

    def __init__(self, *args: str, port: int = 0, workers: int | None = None,
                 startup_timeout_s: float = 120.0, root: Path | None = None,
                 nofile: int | None = None):
        """``root``: run the ``verifier`` package of another checkout (the benchmarks compare
        a change against the code before it in one run); default this one. ``nofile``: the
        child's RLIMIT_NOFILE, soft and hard, set before it starts (so it cannot raise it)."""
        # Own session: a terminal's Ctrl-C reaches only the job, which still needs the verifier
        # to finish its step; --exit-with-parent: the server drains and exits if the job dies
        # without stopping it (SIGKILL), so no verifier is left behind.
        cmd = [sys.executable, "-m", "verifier.cli", "serve", "--port", str(port),
               "--log-format", "json", "--exit-with-parent", *args]
        if workers is not None:
            cmd += ["--workers", str(workers)]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=root or ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1",
                 **({"PYTHONPATH": str(root)} if root else {})},
            start_new_session=True,
            preexec_fn=None if nofile is None else (
                lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))),
        )
        self.lines: deque[str] = deque(maxlen=200)
        self.sandbox_problem: str | None = None
        self.metrics_port: int | None = None  # with "--metrics-port", the bound port
        self.listening: dict = {}  # its "verifier listening" log record (ports, settings)
        self.address = self._wait_for_address(startup_timeout_s)
        # Keep draining the child's output so it never blocks on a full pipe.
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _wait_for_address(self, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("verifier serve exited before it was ready:\n" + "".join(self.lines))
            self.lines.append(line)
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("message") == "verifier listening":
                self.listening = rec
                self.sandbox_problem = rec.get("sandbox_problem")
                self.metrics_port = rec.get("metrics_port")
                return rec["address"]
        self.proc.kill()
        raise RuntimeError(f"verifier serve not ready after {timeout_s:g} s:\n" + "".join(self.lines))

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (graceful drain), then SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.error("local verifier did not stop after SIGTERM; killing it")
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def __enter__(self) -> "LocalVerifier":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
