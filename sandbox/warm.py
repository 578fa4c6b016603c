"""Pre-started jails: each sample still gets a fresh jail of its own, started before it arrives.

A jail's fixed cost (nsjail building its namespaces, mounts, cgroups and seccomp filter, the
kernel's own work for them, the interpreter's start and the harness loading) used to sit on the
sample's critical path: with two samples in flight on two cores, the cores waited on that setup
about a quarter of the time (docs/benchmarks.md "Code throughput"). Here a jail is started for the NEXT
sample while the current ones run, and waits, blocked reading its stdin, until a sample is
handed to it; the sample's deadline starts at the hand-over.

What is shared between samples: nothing that was not shared before. A pre-started jail is the
same fresh jail a cold start makes (its own user, PID, mount, network, IPC, UTS and cgroup
namespaces, its own outside uid from the pool, its own scratch tmpfs, the same policy file and
command line), used for exactly one sample and then destroyed; no process, file or memory of one
sample can reach another's jail. Nothing in it runs untrusted code before the hand-over: the
harness only starts and blocks reading the sample from stdin. This is the "pre-started jails
whose setup overlaps other samples' work" design, not a forkserver (sandbox2's ForkServer or a
zygote would share one process image between samples; see sandbox/README.md).

How the pool is kept (``WarmJails``):

- keyed by everything the jail's command line depends on (argv, limits, input files): a sample
  takes a jail only of exactly its own key, so no limit differs from a cold start's;
- demand-driven: a key is warmed only after samples asked for it twice (``WARM_AFTER``), with
  ``per_key`` jails (the code concurrency: one ready for each slot); each hand-over starts a
  replacement;
- bounded: at most ``max_keys`` keys (the least recently used is dropped with its jails); a
  jail that waited ``max_idle_s`` is destroyed (its nsjail time limit includes that wait, so
  nsjail never kills a waiting jail), and a key nobody asked for in that time is forgotten;
- a jail found dead at hand-over (it failed to start, or something killed it) is destroyed and
  the next is tried; with none ready the sample starts its own jail, as before.

The starter runs on ONE daemon thread (why a thread: starting a jail is a fork/exec plus a wait
for a free outside uid; it must not sit on a scoring thread's critical path, and a single thread
bounds how many jails are being started at once).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

MAX_IDLE_S = 20.0
"""How long a pre-started jail may wait for its sample before it is destroyed (and how long a
key stays warm without being asked for)."""
MAX_KEYS = 4
"""At most this many different jail commands are kept warm at once."""
WARM_AFTER = 2
"""A key is warmed once it has been asked for this many times: a one-off command (the
sandbox's self-test, compiling the harness) never gets jails that nobody will use."""
_SWEEP_S = 2.0
"""How often the starter looks for jails that waited too long when nothing else wakes it."""


@dataclass
class WarmJail:
    """One pre-started jail: ``handle`` is the backend's (the started process and its uid)."""

    key: Hashable
    handle: Any
    started_at: float


@dataclass
class _Key:
    ready: collections.deque = field(default_factory=collections.deque)  # of WarmJail, oldest first
    starting: int = 0
    last_asked: float = 0.0
    asks: int = 0


class WarmJails:
    """Keeps up to ``per_key`` pre-started jails ready for each recently asked-for key.

    ``start(key)`` starts one jail for ``key`` and returns its handle (or None when it cannot:
    no free uid, a closed sandbox); ``alive(handle)`` says whether it is still waiting;
    ``discard(handle)`` stops and reaps one that will not be used. All three are the backend's;
    ``start`` and ``discard`` are called on the starter thread only."""

    def __init__(self, start: Callable[[Hashable], Any | None], alive: Callable[[Any], bool],
                 discard: Callable[[Any], None], *, per_key: int, max_idle_s: float = MAX_IDLE_S,
                 max_keys: int = MAX_KEYS) -> None:
        if per_key < 1:
            raise ValueError(f"per_key must be at least 1, got {per_key}")
        self._start, self._alive, self._discard = start, alive, discard
        self.per_key, self.max_idle_s, self.max_keys = per_key, max_idle_s, max_keys
        self._keys: collections.OrderedDict[Hashable, _Key] = collections.OrderedDict()
        self._cond = threading.Condition()
        self._dropped: list[WarmJail] = []  # to discard, on the starter thread
        self._closed = False
        self.hits = self.misses = 0
        self._thread = threading.Thread(target=self._starter, name="warm-jails", daemon=True)
        self._thread.start()

    def take(self, key: Hashable) -> WarmJail | None:
        """A live pre-started jail for ``key`` (the caller now owns it), or None (the caller
        starts its own). Either way the key is (re)warmed for the next samples."""
        now = time.monotonic()
        with self._cond:
            if self._closed:
                return None
            k = self._keys.get(key)
            if k is None:
                k = self._keys[key] = _Key()
                while len(self._keys) > self.max_keys:
                    _, old = self._keys.popitem(last=False)
                    self._dropped.extend(old.ready)
            self._keys.move_to_end(key)
            k.last_asked = now
            k.asks += 1
            found = None
            while k.ready:
                w = k.ready.popleft()
                if now - w.started_at < self.max_idle_s and self._alive(w.handle):
                    found = w
                    break
                self._dropped.append(w)
            if found is None:
                self.misses += 1
            else:
                self.hits += 1
            self._cond.notify()
            return found

    def close(self) -> None:
        """Stop the starter and destroy every waiting jail (before returning)."""
        with self._cond:
            self._closed = True
            for k in self._keys.values():
                self._dropped.extend(k.ready)
                k.ready.clear()
            self._cond.notify()
        self._thread.join(timeout=30)

    def ready_count(self) -> int:
        with self._cond:
            return sum(len(k.ready) for k in self._keys.values())

    def waiting(self) -> list[Any]:
        """The handles of the jails waiting for a sample now (nothing untrusted runs in them)."""
        with self._cond:
            return [w.handle for k in self._keys.values() for w in k.ready]

    # -- the starter thread --------------------------------------------------------------

    def _starter(self) -> None:
        while True:
            with self._cond:
                todo = self._next_key_locked()
                if todo is None and not self._dropped and not self._closed:
                    self._cond.wait(_SWEEP_S)
                    self._expire_locked()
                    todo = self._next_key_locked()
                dropped, self._dropped = self._dropped, []
                closed = self._closed
                if todo is not None and not closed:
                    self._keys[todo].starting += 1
            for w in dropped:
                self._discard_quietly(w.handle)
            if closed:
                with self._cond:  # a take() racing close() may have dropped more
                    dropped, self._dropped = self._dropped, []
                for w in dropped:
                    self._discard_quietly(w.handle)
                return
            if todo is None:
                continue
            handle = None
            try:
                handle = self._start(todo)
            except Exception:  # a bug in the backend must not stop the starter
                log.exception("warm jails: starting a jail failed")
            with self._cond:
                k = self._keys.get(todo)
                if k is not None:
                    k.starting -= 1
                if handle is None:
                    # Nothing to start with now (no free uid, closed): wait for the next ask
                    # rather than spinning.
                    if k is not None:
                        k.last_asked = 0.0
                    continue
                if k is None or self._closed:
                    self._dropped.append(WarmJail(todo, handle, time.monotonic()))
                else:
                    k.ready.append(WarmJail(todo, handle, time.monotonic()))

    def _next_key_locked(self) -> Hashable | None:
        """The most recently asked-for key short of ``per_key`` jails, if any."""
        now = time.monotonic()
        for key in reversed(self._keys):
            k = self._keys[key]
            if (k.asks >= WARM_AFTER and now - k.last_asked < self.max_idle_s
                    and len(k.ready) + k.starting < self.per_key):
                return key
        return None

    def _expire_locked(self) -> None:
        now = time.monotonic()
        for key in list(self._keys):
            k = self._keys[key]
            while k.ready and now - k.ready[0].started_at >= self.max_idle_s:
                self._dropped.append(k.ready.popleft())
            if not k.ready and not k.starting and now - k.last_asked >= self.max_idle_s:
                del self._keys[key]

    def _discard_quietly(self, handle: Any) -> None:
        try:
            self._discard(handle)
        except Exception:
            log.exception("warm jails: destroying a jail failed")
