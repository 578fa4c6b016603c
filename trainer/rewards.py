"""Streamed verification: completions go to the verifier as soon as each generation chunk
finishes, and rewards come back while generation continues (DESIGN.md 4: rollout dominates step
time, so verification must overlap it).

``RewardClient`` is the trainer's connection to the verifier. It runs a
``verifier.client.VerifierClient`` in a child process (``python -m trainer.rewards``), and one
``RewardStream`` per step (or evaluation pass) talks to it: ``submit`` is called from the
engine's ``on_done`` hook on the generating thread and only pickles the chunk onto a socket;
``wait`` ends the stream and returns every result, with how long it waited.

Why a child process: the generating thread is bound by Python (HF ``generate``'s loop on a
tiny model, vLLM's in-process engine core on a GPU). A gRPC client in the same process runs
its feeder, stream and consumer threads for every item (about 0.14 ms of CPU per item here)
and each one takes the GIL from the generating thread between two torch ops: that cost 15-20%
of generation speed on the 2-core dev box (``benchmarks/bench_trainer.py``). In a child
process the same work runs beside generation instead of inside it.

Wire between the two (a socketpair, ``multiprocessing.connection`` framing, pickles):

    parent -> child: ("connect", address, ClientConfig, connect_timeout_s)
                     ("begin", sid) | ("items", sid, [item dicts]) | ("end", sid)
                     | ("abort", sid) | ("quit",)
    child -> parent: ("ready", None) | ("error", None, message)
                     | ("results", sid, ([Result], [arrival time])) | ("error", sid, message)

Arrival times are ``time.monotonic()`` in the child when each result came in; on Linux that
clock is system-wide, so they compare with the parent's (``RewardStream.arrived_at``).
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Iterator

from verifier.items import Result, Status

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]

# Statuses that are not a judgement of the response: a trainer must not read them as reward 0.
NOT_A_VERDICT = (Status.INVALID_INPUT, Status.SANDBOX_ERROR, Status.INTERNAL_ERROR)


class RewardError(RuntimeError):
    """A step cannot get a genuine reward for every response: it fails loudly."""


class RewardClient:
    """The trainer's connection to the verifier at ``address`` (see the module docstring).

    ``config`` is a ``verifier.client.ClientConfig`` (TLS, token, retries; None: defaults).
    Raises RewardError when the verifier does not answer health checks within
    ``connect_timeout_s``. A child that dies or misses a deadline is replaced at the next
    ``RewardStream``; the stream it served fails loudly."""

    def __init__(self, address: str, config: Any = None, connect_timeout_s: float = 30.0):
        from verifier.client import ClientConfig

        self.address = address
        self.config = config if config is not None else ClientConfig()
        self.connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()  # one message at a time on the socket
        self._sids = itertools.count(1)
        self._replies: dict[int, tuple[str, Any]] = {}
        self._conn: Connection | None = None
        self._proc: subprocess.Popen | None = None
        self._closed = False
        self._start()

    # -- the child process ------------------------------------------------------------------
    def _start(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        # Process boundary: a fresh interpreter (not fork: the trainer holds torch/OpenMP and
        # maybe CUDA and gRPC threads, which do not survive a fork), given one end of the
        # socketpair. PYTHONPATH instead of cwd, so relative TLS paths keep their meaning.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "trainer.rewards", str(child_sock.fileno())],
                pass_fds=[child_sock.fileno()], env=env)
        finally:
            child_sock.close()
        self._conn = Connection(parent_sock.detach())
        self._replies.clear()
        self._send(("connect", self.address, self.config, self.connect_timeout_s))
        # Deadline: the child's own wait_ready ends within connect_timeout_s; the margin
        # covers its start-up (importing grpc).
        kind, _, message = self._recv(None, self.connect_timeout_s + 60.0)
        if kind != "ready":
            self.close()
            raise RewardError(f"verifier at {self.address} is not reachable: {message}")

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._conn is not None

    def _send(self, msg: tuple) -> None:
        with self._lock:
            if self._conn is None:
                raise RewardError("the reward client is closed")
            try:
                self._conn.send(msg)
            except OSError as e:  # BrokenPipe / ConnectionReset: the child is gone
                raise RewardError(f"the verifier client process died ({self._exit_status()})"
                                  ) from e

    def _recv(self, sid: int | None, timeout_s: float) -> tuple[str, int | None, Any]:
        """The child's reply for stream ``sid`` (None: the connect reply). Replies for other
        streams that arrive first are kept for their own ``wait``."""
        end = time.monotonic() + timeout_s
        while True:
            if sid in self._replies:
                kind, payload = self._replies.pop(sid)  # type: ignore[arg-type]
                return kind, sid, payload
            assert self._conn is not None
            left = end - time.monotonic()
            try:
                # Deadline: a hung verifier (or client) must fail the step, not hang the run.
                if left <= 0 or not self._conn.poll(left):
                    raise TimeoutError
                kind, got, payload = self._conn.recv()
            except TimeoutError:
                self._restart_later()
                raise RewardError(f"no answer from the verifier within {timeout_s:g} s") from None
            except (EOFError, OSError) as e:
                status = self._exit_status()
                self._restart_later()
                raise RewardError(f"the verifier client process died ({status})") from e
            if got == sid:
                return kind, sid, payload
            self._replies[got] = (kind, payload)

    def _exit_status(self) -> str:
        code = None if self._proc is None else self._proc.poll()
        return "still running" if code is None else f"exit code {code}"

    def _restart_later(self) -> None:
        """Drop a child in an unknown state; the next stream starts a fresh one."""
        self._stop_child(graceful=False)

    def _stop_child(self, graceful: bool) -> None:
        conn, proc = self._conn, self._proc
        self._conn, self._proc = None, None
        if conn is not None:
            if graceful:
                try:
                    conn.send(("quit",))
                except OSError:
                    pass
            conn.close()
        if proc is not None:
            try:
                proc.wait(timeout=10.0 if graceful else 0.5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- public -----------------------------------------------------------------------------
    def stream(self) -> "RewardStream":
        return RewardStream(self)

    def _begin(self) -> int:
        if self._closed:
            raise RewardError("the reward client is closed")
        if not self._alive():
            log.warning("restarting the verifier client process (%s)", self._exit_status())
            self._start()
        sid = next(self._sids)
        self._send(("begin", sid))
        return sid

    def close(self) -> None:
        self._closed = True
        self._stop_child(graceful=True)

    def __enter__(self) -> "RewardClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RewardStream:
    """One stream of items to the verifier; results keyed by item id (see the module
    docstring). Item ids must be unique within the stream."""

    def __init__(self, client: RewardClient):
        self._client = client
        self._sid = client._begin()
        self._submitted = 0
        self._ended = False
        self.arrived_at: dict[str, float] = {}
        """After ``wait``: when each result reached the client (``time.monotonic()``)."""

    def submit(self, items: list[dict[str, Any]]) -> None:
        """Send items (one pickle per call; blocks only while the socket buffer is full, which
        the child drains continuously). Raises RewardError if the client process died."""
        if self._ended:
            raise RuntimeError("submit() after wait()/abort() on this RewardStream")
        if items:
            self._client._send(("items", self._sid, list(items)))
            self._submitted += len(items)

    def wait(self, timeout_s: float = 3600.0) -> tuple[dict[str, Result], float]:
        """End the stream and wait for every result. Returns (results by id, seconds waited).
        Raises RewardError if the verifier failed, missed the deadline or left an item
        without a result."""
        start = time.monotonic()
        self._ended = True
        self._client._send(("end", self._sid))
        kind, _, payload = self._client._recv(self._sid, timeout_s)
        waited = time.monotonic() - start
        if kind == "error":
            raise RewardError(f"verifier stream failed: {payload}")
        got, times = payload
        results = {r.id: r for r in got}
        self.arrived_at = {r.id: t for r, t in zip(got, times)}
        if len(results) != self._submitted:
            raise RewardError(f"{self._submitted - len(results)} of {self._submitted} "
                              "items got no result")
        return results, waited

    def abort(self) -> None:
        """Give up on this stream (generation failed): its open gRPC calls are cancelled."""
        if self._ended:
            return
        self._ended = True
        try:
            self._client._send(("abort", self._sid))
        except RewardError:
            pass


def check_verdicts(results: dict[str, Result]) -> None:
    """Raise RewardError naming the items whose result is not a verdict (the verifier could
    not judge them): never turn those into silent zero rewards."""
    bad = [r for r in results.values() if r.status in NOT_A_VERDICT]
    if bad:
        examples = "; ".join(f"{r.id}: {r.status.value} ({r.detail[:120]})" for r in bad[:3])
        raise RewardError(f"{len(bad)} responses could not be judged: {examples}")


# ---------------------------------------------------------------------------------------------
# The child process
# ---------------------------------------------------------------------------------------------

class _ChildStream:
    """One RewardStream's gRPC stream, run on its own thread in the child."""

    _END = object()

    def __init__(self, client: Any, sid: int, send: Any):
        self.sid, self._send = sid, send
        self._q: queue.Queue = queue.Queue()
        self._stream = client.open_stream(self._items())
        self._aborted = False
        self._thread = threading.Thread(target=self._run, name=f"reward-stream-{sid}",
                                        daemon=True)
        self._thread.start()

    def _items(self) -> Iterator[dict[str, Any]]:
        while True:
            batch = self._q.get()
            if batch is self._END:
                return
            yield from batch

    def put(self, items: list[dict[str, Any]]) -> None:
        self._q.put(items)

    def end(self) -> None:
        self._q.put(self._END)

    def abort(self) -> None:
        self._aborted = True
        self._q.put(self._END)
        self._stream.close()

    def _run(self) -> None:
        results, times = [], []
        try:
            for r in self._stream:
                results.append(r)
                times.append(time.monotonic())
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
            if not self._aborted:
                self._send(("error", self.sid, f"{type(e).__name__}: {e}"))
            return
        if not self._aborted:
            self._send(("results", self.sid, (results, times)))


def _child_main(fd: int) -> None:
    from verifier.client import VerifierClient

    conn = Connection(fd)
    lock = threading.Lock()

    def send(msg: tuple) -> None:
        with lock:  # stream threads and the main loop share the socket
            try:
                conn.send(msg)
            except OSError:
                pass  # the parent is gone; the main loop sees EOF and exits

    _, address, config, connect_timeout_s = conn.recv()
    client = VerifierClient(address, config)
    try:
        client.wait_ready(timeout_s=connect_timeout_s)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises
        send(("error", None, f"{type(e).__name__}: {e}"))
        return
    send(("ready", None, None))
    streams: dict[int, _ChildStream] = {}
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return  # the parent died: nothing left to serve
            kind = msg[0]
            if kind == "quit":
                return
            sid = msg[1]
            if kind == "begin":
                streams[sid] = _ChildStream(client, sid, send)
            elif kind == "items":
                streams[sid].put(msg[2])
            elif kind == "end":
                streams.pop(sid).end()
            elif kind == "abort":
                s = streams.pop(sid, None)
                if s is not None:
                    s.abort()
    finally:
        for s in streams.values():
            s.abort()
        client.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s verifier-client %(levelname)s %(message)s")
    _child_main(int(sys.argv[1]))
