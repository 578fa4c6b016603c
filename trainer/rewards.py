"""Streamed verification: completions go to the verifier as soon as each generation chunk
finishes, and rewards come back while generation continues (DESIGN.md 4: rollout dominates step
time, so verification must overlap it).

One ``RewardStream`` per step: ``submit`` is called from the engine's ``on_done`` hook (the
generating thread); a background thread owns the gRPC stream and collects results; ``wait``
blocks until every submitted item has its result and reports how long it waited.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Iterator

from verifier.client import VerifierClient
from verifier.items import Result, Status

log = logging.getLogger(__name__)

# Statuses that are not a judgement of the response: a trainer must not read them as reward 0.
NOT_A_VERDICT = (Status.INVALID_INPUT, Status.SANDBOX_ERROR, Status.INTERNAL_ERROR)


class RewardError(RuntimeError):
    """A step cannot get a genuine reward for every response: it fails loudly."""


class RewardStream:
    """Streams items to the verifier on a background thread; results keyed by item id."""

    def __init__(self, client: VerifierClient):
        self._client = client
        self._q: queue.Queue = queue.Queue()
        self._results: dict[str, Result] = {}
        self._submitted = 0
        self._error: BaseException | None = None
        self._done = object()
        # The gRPC stream runs on its own thread so the generating thread only enqueues.
        self._thread = threading.Thread(target=self._run, name="reward-stream", daemon=True)
        self._thread.start()

    def _items(self) -> Iterator[dict[str, Any]]:
        while True:
            it = self._q.get()
            if it is self._done:
                return
            yield it

    def _run(self) -> None:
        try:
            for r in self._client.stream(self._items()):
                self._results[r.id] = r
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread in wait()
            self._error = e

    def submit(self, items: list[dict[str, Any]]) -> None:
        """Queue items (thread-safe, never blocks on the network)."""
        for it in items:
            self._submitted += 1
            self._q.put(it)

    def wait(self, timeout_s: float = 3600.0) -> tuple[dict[str, Result], float]:
        """Close the stream and wait for every result. Returns (results by id, seconds waited).
        Raises RewardError if the verifier failed or some item got no result."""
        start = time.monotonic()
        self._q.put(self._done)
        # Deadline: a hung verifier must fail the step, not hang the run.
        self._thread.join(timeout=timeout_s)
        waited = time.monotonic() - start
        if self._thread.is_alive():
            raise RewardError(f"verifier did not answer within {timeout_s:g} s "
                              f"({len(self._results)}/{self._submitted} results)")
        if self._error is not None:
            raise RewardError(f"verifier stream failed: {self._error}") from self._error
        if len(self._results) != self._submitted:
            raise RewardError(f"{self._submitted - len(self._results)} of {self._submitted} "
                              "items got no result")
        return self._results, waited


def check_verdicts(results: dict[str, Result]) -> None:
    """Raise RewardError naming the items whose result is not a verdict (the verifier could
    not judge them): never turn those into silent zero rewards."""
    bad = [r for r in results.values() if r.status in NOT_A_VERDICT]
    if bad:
        examples = "; ".join(f"{r.id}: {r.status.value} ({r.detail[:120]})" for r in bad[:3])
        raise RewardError(f"{len(bad)} responses could not be judged: {examples}")
