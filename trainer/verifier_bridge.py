"""Streamed verification: completions go to the verifier as soon as each generation chunk
finishes, and rewards come back while generation continues (docs/magic.md: rollout dominates step
time, so verification must overlap it).

``RewardClient`` is the trainer's connection to the verifier. It runs a
``verifier.client.VerifierClient`` in a child process (``python -m trainer.verifier_bridge``), and one
``RewardStream`` per step (or evaluation pass) talks to it: ``submit`` is called from the
engine's ``on_done`` hook on the generating thread and only pickles the chunk onto a socket;
``wait`` ends the stream and returns every result, with how long it waited. The child's
client rides out a verifier outage for ``ClientConfig.outage_window_s`` (``trainer run``:
``verifier.outage_window_s``, under the step's ``wait`` deadline) and reports a stream it gave up
on as an error, which ``wait`` raises as RewardError (trainer/loop.py then checkpoints and stops).

Why a child process: the generating thread is bound by Python (HF ``generate``'s loop on a
tiny model, vLLM's in-process engine core on a GPU). A gRPC client in the same process runs
its feeder, stream and consumer threads for every item (about 0.14 ms of CPU per item here)
and each one takes the GIL from the generating thread between two torch ops: that cost 15-20%
of generation speed on the 2-core dev box (``benchmarks/bench_trainer.py``). In a child
process the same work runs beside generation instead of inside it.

Wire between the two (a socketpair; each message an 8-byte length and a pickle; every send
and receive in the trainer has a deadline):

    parent -> child: ("connect", address, ClientConfig, connect_timeout_s)
                     ("begin", sid) | ("items", sid, [item dicts]) | ("end", sid)
                     | ("abort", sid) | ("quit",)
    child -> parent: ("ready", None) | ("error", None, message)
                     | ("results", sid, ([Result], [arrival time])) | ("error", sid, message)

Arrival times are ``time.monotonic()`` in the child when each result came in; on Linux that
clock is system-wide, so they compare with the parent's (``RewardStream.arrived_at``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import pickle
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from verifier.client import ClientConfig, VerifierClient
from verifier.items import NOT_A_VERDICT, Result, VerifierError
from verifier.client.local import LocalVerifier

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]


class RewardError(RuntimeError):
    """A step cannot get a genuine reward for every response: it fails loudly."""


SEND_TIMEOUT_S = 60.0
"""Longest a message to the child may take to write, seconds. The child drains its socket
continuously, so a send that stalls this long means it is frozen: the step fails and the child
is replaced, instead of the generating thread blocking forever."""


_HEADER = struct.Struct("!Q")  # a message's length in bytes


def _send_msg(sock: socket.socket, obj: Any) -> None:
    """One pickled message: an 8-byte length, then the pickle (``sock``'s timeout applies to
    the whole message)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the socket")
        buf += chunk
    return bytes(buf)


def _recv_msg(sock: socket.socket) -> Any:
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return pickle.loads(_recv_exact(sock, n))


class RewardClient:
    """The trainer's connection to the verifier at ``address`` (see the module docstring).

    ``config`` is a ``verifier.client.ClientConfig`` (TLS, token, retries; None: defaults).
    Raises RewardError when the verifier does not answer health checks within
    ``connect_timeout_s``. A child that dies or misses a deadline is replaced at the next
    ``RewardStream``; the streams it served fail loudly. ``dedupe``: each stream judges a
    response identical to an earlier one of the same stream once (:class:`RewardStream`)."""

    def __init__(self, address: str, config: Any = None, connect_timeout_s: float = 30.0,
                 dedupe: bool = True):
        self.address = address
        self.dedupe = dedupe
        self.config = config if config is not None else ClientConfig()
        self.connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()  # one message at a time on the socket
        self._sids = itertools.count(1)
        self._replies: dict[int, tuple[str, Any]] = {}
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._generation = 0  # which child; a stream belongs to the one it began on
        self._closed = False
        self._start()

    # -- the child process ------------------------------------------------------------------
    def _start(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        # Process boundary: a fresh interpreter (not fork: the trainer holds torch/OpenMP and
        # maybe CUDA and gRPC threads, which do not survive a fork), given one end of the
        # socketpair. Its own session, so a terminal's Ctrl-C reaches only the trainer, which
        # still needs its rewards to finish the step. -P with PYTHONPATH instead of the
        # working directory: the launch directory's files cannot shadow our packages, and
        # relative TLS paths keep their meaning.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "trainer.verifier_bridge", str(child_sock.fileno())],
                pass_fds=[child_sock.fileno()], env=env, start_new_session=True)
        finally:
            child_sock.close()
        self._sock = parent_sock
        self._generation += 1
        self._replies.clear()
        try:
            self._send(("connect", self.address, self.config, self.connect_timeout_s))
            # Deadline: the child's own wait_ready ends within connect_timeout_s; the margin
            # covers its start-up (importing grpc).
            kind, message = self._recv(None, self.connect_timeout_s + 60.0)
        except RewardError as e:
            self._stop_child(graceful=False)
            raise RewardError(f"verifier client for {self.address} did not start: {e}") from e
        if kind != "ready":
            self._stop_child(graceful=False)  # a later stream() tries again
            raise RewardError(f"verifier at {self.address} is not reachable: {message}")

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._sock is not None

    def _send(self, msg: tuple, generation: int | None = None) -> None:
        """Send to the child (any thread). ``generation``: the child a stream began on; a
        stream of a replaced child fails instead of confusing the new one."""
        with self._lock:
            if self._closed:
                raise RewardError("the reward client is closed")
            self._check_current(generation)
            assert self._sock is not None
            try:
                # Deadline: a frozen child must fail the step, not block the generating thread.
                self._sock.settimeout(SEND_TIMEOUT_S)
                _send_msg(self._sock, msg)
            except TimeoutError:
                self._stop_child(graceful=False)
                raise RewardError(f"the verifier client process took no input for "
                                  f"{SEND_TIMEOUT_S:g} s; replaced") from None
            except OSError as e:  # BrokenPipe / ConnectionReset: the child is gone
                status = self._exit_status()
                self._stop_child(graceful=False)
                raise RewardError(f"the verifier client process died ({status})") from e

    def _recv(self, sid: int | None, timeout_s: float,
              generation: int | None = None) -> tuple[str, Any]:
        """The child's reply for stream ``sid`` (None: the connect reply), as (kind,
        payload). Replies for other streams that arrive first are kept for their own
        ``wait``. Called from the thread that waits (the step's)."""
        end = time.monotonic() + timeout_s
        while True:
            if sid in self._replies:
                return self._replies.pop(sid)  # type: ignore[arg-type]
            self._check_current(generation)
            sock = self._sock
            assert sock is not None
            try:
                # Deadline: a hung verifier (or client) must fail the step, not hang the run.
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                kind, got, payload = _recv_msg(sock)
            except TimeoutError:
                # A message may be half read: the socket is unusable, the child replaced.
                self._stop_child(graceful=False)
                raise RewardError(f"no answer from the verifier within {timeout_s:g} s") from None
            except (EOFError, OSError) as e:
                status = self._exit_status()
                self._stop_child(graceful=False)
                raise RewardError(f"the verifier client process died ({status})") from e
            if got == sid:
                return kind, payload
            self._replies[got] = (kind, payload)

    def _check_current(self, generation: int | None) -> None:
        """RewardError unless the child that ``generation`` names (None: any) still serves."""
        if self._sock is None or (generation is not None and generation != self._generation):
            raise RewardError("the verifier client process this stream used is gone "
                              f"({self._exit_status()}); the next stream starts a new one")

    def _exit_status(self) -> str:
        code = None if self._proc is None else self._proc.poll()
        return "still running" if code is None else f"exit code {code}"

    def _stop_child(self, graceful: bool) -> None:
        """Stop the child (``graceful``: ask it to quit first); streams on it fail."""
        sock, proc = self._sock, self._proc
        self._sock, self._proc = None, None
        if sock is not None:
            if graceful:
                try:
                    sock.settimeout(2.0)  # Deadline: a frozen child is killed below
                    _send_msg(sock, ("quit",))
                except OSError:
                    pass
            sock.close()
        if proc is not None:
            try:
                proc.wait(timeout=10.0 if graceful else 0.5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- public -----------------------------------------------------------------------------
    def stream(self) -> "RewardStream":
        return RewardStream(self)

    def _begin(self) -> tuple[int, int]:
        """A new stream: (its sid, the child generation it runs on)."""
        if self._closed:
            raise RewardError("the reward client is closed")
        if not self._alive():
            log.warning("starting a new verifier client process (the last one: %s)",
                        self._exit_status())
            self._stop_child(graceful=False)
            self._start()
        sid = next(self._sids)
        generation = self._generation
        self._send(("begin", sid), generation)
        return sid, generation

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._stop_child(graceful=True)

    def __enter__(self) -> "RewardClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _digest(obj: Any) -> bytes:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).digest()


class RewardStream:
    """One stream of items to the verifier; results keyed by item id (see the module
    docstring). Item ids must be unique within the stream.

    With the client's ``dedupe`` (the default), an item equal to one submitted earlier on the
    same stream but for its id is not sent: ``wait`` gives it a copy of that item's Result
    under its own id. A group of samples at low entropy repeats itself (in the rare-way world,
    2 to 4 of every 10 code samples are distinct once a run has settled), and each code sample
    costs a sandbox run. The verdict of a program that behaves differently from run to run
    (randomness, timing) is then one draw shared by its copies, not one draw each."""

    def __init__(self, client: RewardClient):
        self._client = client
        self._sid, self._generation = client._begin()
        self._submitted = 0
        self._ended = False
        self._dedupe = client.dedupe
        self._first: dict[bytes, str] = {}  # item key -> the id of the item sent for it
        self._truths: dict[int, tuple[Any, bytes]] = {}
        """id(ground truth) -> (that object, its digest): a problem's samples share one ground
        truth object, which may be large (a LiveCodeBench problem's tests), so each is
        serialized once per stream; holding the object keeps its id from being reused."""
        self._copies: dict[str, str] = {}  # id of an item not sent -> the id sent for it
        self.arrived_at: dict[str, float] = {}
        """After ``wait``: when each result reached the client (``time.monotonic()``)."""

    def _key(self, item: dict[str, Any]) -> bytes:
        """What a verdict depends on: the whole item but its id (problem, response, ground
        truth, data source, profile), as a digest."""
        truth = item.get("ground_truth")
        held = self._truths.get(id(truth))
        if held is None or held[0] is not truth:
            held = (truth, _digest(truth))
            self._truths[id(truth)] = held
        rest = {k: v for k, v in item.items() if k not in ("id", "ground_truth")}
        return _digest(rest) + held[1]

    @property
    def judged(self) -> int:
        """Items sent to the verifier so far (the others are copies of one of them)."""
        return self._submitted

    def submit(self, items: list[dict[str, Any]]) -> None:
        """Send items (one pickle per call; blocks only while the socket buffer is full, which
        the child drains continuously). Raises RewardError if the client process died."""
        if self._ended:
            raise RuntimeError("submit() after wait()/abort() on this RewardStream")
        if self._dedupe:
            fresh = []
            for item in items:
                first = self._first.setdefault(self._key(item), item["id"])
                if first == item["id"]:
                    fresh.append(item)
                else:
                    self._copies[item["id"]] = first
            items = fresh
        if items:
            self._client._send(("items", self._sid, list(items)), self._generation)
            self._submitted += len(items)

    def wait(self, timeout_s: float = 3600.0) -> tuple[dict[str, Result], float]:
        """End the stream and wait for every result. Returns (results by id, seconds waited).
        Raises RewardError if the verifier failed, missed the deadline or left an item
        without a result."""
        start = time.monotonic()
        self._ended = True
        self._client._send(("end", self._sid), self._generation)
        kind, payload = self._client._recv(self._sid, timeout_s, self._generation)
        waited = time.monotonic() - start
        if kind == "error":
            raise RewardError(f"verifier stream failed: {payload}")
        got, times = payload
        results = {r.id: r for r in got}
        self.arrived_at = {r.id: t for r, t in zip(got, times)}
        if len(results) != self._submitted:
            raise RewardError(f"{self._submitted - len(results)} of {self._submitted} "
                              "items got no result")
        for copy, first in self._copies.items():
            results[copy] = dataclasses.replace(results[first], id=copy)
            self.arrived_at[copy] = self.arrived_at[first]
        return results, waited

    def abort(self) -> None:
        """Give up on this stream (generation failed): its open gRPC calls are cancelled."""
        if self._ended:
            return
        self._ended = True
        try:
            self._client._send(("abort", self._sid), self._generation)
        except RewardError:
            pass


def check_verdicts(results: dict[str, Result]) -> None:
    """Raise RewardError naming the items whose result is not a verdict (the verifier could
    not judge them): never turn those into silent zero rewards."""
    bad = [r for r in results.values() if r.status in NOT_A_VERDICT]
    if bad:
        examples = "; ".join(f"{r.id}: {r.status.value} ({r.detail[:120]})" for r in bad[:3])
        raise RewardError(f"{len(bad)} responses could not be judged: {examples}")


class verifier_connection:  # noqa: N801 - a context manager used like a function
    """A connected RewardClient: to ``addr``, or to a local ``verifier serve`` child started
    for the job and stopped after (docs/contracts.md 2). The one way ``trainer run``, ``trainer
    eval`` and ``trainer filter`` reach a verifier. ``config``: the ClientConfig (None: one for
    an evaluation, a single long stream with a day's deadline)."""

    def __init__(self, addr: str | None, workers: int = 2, connect_timeout_s: float = 60.0,
                 config: ClientConfig | None = None, dedupe: bool = True):
        self.addr, self.workers, self.connect_timeout_s = addr, workers, connect_timeout_s
        self.dedupe = dedupe
        # An evaluation is one long stream: allow far more than the library default.
        self.config = config if config is not None else ClientConfig(timeout_s=24 * 3600.0)
        self.local: LocalVerifier | None = None
        self.client: RewardClient | None = None

    def __enter__(self) -> RewardClient:
        addr = self.addr
        if addr is None:
            self.local = LocalVerifier(workers=self.workers)
            addr = self.local.address
            if self.local.sandbox_problem:
                log.warning("the local verifier's sandbox is unavailable; code items will get "
                            "SANDBOX_ERROR: %s", self.local.sandbox_problem)
        try:
            self.client = RewardClient(addr, self.config, connect_timeout_s=self.connect_timeout_s,
                                       dedupe=self.dedupe)
        except RewardError:
            self.__exit__(None, None, None)
            raise
        return self.client

    def explain(self, error: RewardError) -> RewardError:
        """The error, with the local verifier's exit status and last output lines when it is
        the one that died (its output is otherwise only in memory)."""
        v = self.local
        if v is None or v.proc.poll() is None:
            return error
        tail = "".join(list(v.lines)[-20:])
        return RewardError(f"{error}; the local verifier exited with status "
                           f"{v.proc.returncode}, its last output:\n{tail}")

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.local is not None:
            self.local.stop()
            self.local = None


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
    sock = socket.socket(fileno=fd)
    lock = threading.Lock()

    def send(msg: tuple) -> None:
        with lock:  # stream threads and the main loop share the socket
            try:
                _send_msg(sock, msg)
            except OSError:
                pass  # the parent is gone; the main loop sees EOF and exits

    _, address, config, connect_timeout_s = _recv_msg(sock)
    client = VerifierClient(address, config)
    try:
        client.wait_ready(timeout_s=connect_timeout_s)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises
        send(("error", None, str(e) if isinstance(e, VerifierError) else
              f"{type(e).__name__}: {e}"))
        return
    send(("ready", None, None))
    streams: dict[int, _ChildStream] = {}
    try:
        while True:
            try:
                msg = _recv_msg(sock)
            except (EOFError, OSError):
                return  # the parent died: nothing left to serve
            kind = msg[0]
            if kind == "quit":
                return
            sid = msg[1]
            stream = streams.get(sid)
            if kind == "begin":
                streams[sid] = _ChildStream(client, sid, send)
            elif stream is None:  # never begun here: say so rather than die
                if kind == "end":
                    send(("error", sid, f"stream {sid} is unknown to this client process"))
            elif kind == "items":
                stream.put(msg[2])
            elif kind == "end":
                streams.pop(sid).end()
            elif kind == "abort":
                streams.pop(sid).abort()
    finally:
        for s in streams.values():
            s.abort()
        client.close()


if __name__ == "__main__":
    # Ctrl-C is the trainer's to handle (it finishes the step, which needs this process); the
    # child also sits in its own session, so a terminal's SIGINT does not reach it anyway.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s verifier-client %(levelname)s %(message)s")
    _child_main(int(sys.argv[1]))
