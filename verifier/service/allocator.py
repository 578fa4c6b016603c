"""glibc malloc settings of a serving process (``verifier serve``).

Why: in a 45-minute soak (benchmarks/soak.py, ``rss_growth_by_kind``) the server process's
RSS grew +16.5 MB/hour while its Python objects did not grow: under the soak's traffic and
faults, tracemalloc's traced total stayed at 29.5 -> 29.3 MB and ``gc.get_objects()`` at
65k -> 64k objects over nine minutes, while glibc's own statistics (``mallinfo2``) showed its
heaps' memory in use flat (~14 MB) and the *free* memory inside them climbing (8 -> 15 MB in
under three minutes, 16 arenas): fragmentation, not a leak. Each thread that allocates (gRPC's
pollers, a handler and a reader thread per stream, the code threads, the pools' supervisors)
gets an arena of its own, up to 8 per core; a short-lived large buffer (a 1 MB response, a
program's output) lands in its thread's arena, and the holes it leaves stay resident, reused
by no other arena; glibc gives back only the free space at the top of a heap.

Two settings, applied once at start-up (``tune``) and then every ``TRIM_EVERY_S`` (``trim``):

- ``M_ARENA_MAX`` = ``ARENA_MAX``: the threads share two arenas, so a hole one thread leaves is
  reused by the next allocation of any thread (the GIL serializes most allocations anyway,
  so there is little lock contention to lose).
- ``malloc_trim(0)``: returns every whole free page inside the heaps to the kernel
  (``madvise``), not just the top; well under a millisecond per call at this size.

Environment variables set by an operator (``MALLOC_ARENA_MAX``) win: ``tune`` leaves a setting
it finds there alone. On a C library other than glibc (musl, macOS) both are no-ops.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

ARENA_MAX = 2
"""glibc malloc arenas of a serving process (glibc's default: 8 per core)."""
TRIM_EVERY_S = 60.0
"""Seconds between two ``malloc_trim(0)`` calls of a serving process."""
_M_ARENA_MAX = -8  # <malloc.h>


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version"):  # musl, macOS: not glibc's malloc
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None
    return libc


class MallocTuning:
    """``tune()`` once, before the server starts its threads; then ``maybe_trim()`` from a
    loop that runs anyway (``serve``'s main thread wakes twice a second)."""

    def __init__(self, libc: Any = "auto", every_s: float = TRIM_EVERY_S):
        """``libc``: glibc's functions (tests pass a stand-in); "auto": this process's C
        library when it is glibc, else None (every method a no-op)."""
        self.libc = _glibc() if libc == "auto" else libc
        self.every_s = every_s
        self.arena_max: int | None = None  # the value set by tune(), if it set one
        self.trims = 0
        self._last = time.monotonic()
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self.libc is not None

    def tune(self) -> None:
        """Cap the arenas (unless ``MALLOC_ARENA_MAX`` is set in the environment). Arenas
        made before the call stay: call it before the server's threads start."""
        if self.libc is None or os.environ.get("MALLOC_ARENA_MAX"):
            return
        if self.libc.mallopt(_M_ARENA_MAX, ARENA_MAX) == 1:
            self.arena_max = ARENA_MAX
        else:
            log.warning("mallopt(M_ARENA_MAX) failed; malloc arenas not capped")

    def trim(self) -> None:
        """Give the heaps' free pages back to the kernel now."""
        if self.libc is None:
            return
        with self._lock:
            self.libc.malloc_trim(0)
            self.trims += 1
            self._last = time.monotonic()

    def maybe_trim(self) -> bool:
        """``trim()`` when ``every_s`` has passed since the last one; True when it did."""
        if self.libc is None or time.monotonic() - self._last < self.every_s:
            return False
        self.trim()
        return True
