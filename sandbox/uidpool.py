"""An outside uid (and gid) of its own for every concurrently running jail.

Why: inside every jail the program is uid/gid 65534, but the kernel charges some per-user
quotas to the jail's uid *outside* (its ``user_struct``): pipe buffer pages
(``fs.pipe-user-pages-soft``: past it a user's new pipes get 8 KiB and ``F_SETPIPE_SZ`` is
refused) and file descriptors in flight on unix sockets (past RLIMIT_NOFILE: ETOOMANYREFS). When
every jail is the same outside uid, one jail can starve its neighbours of both. So each run
leases an outside uid from a pool, and nsjail maps 65534 inside to it (``-u/-g
65534:OUTSIDE:1`` per run; the policy file keeps everything else).

The pool (``DEFAULT_UIDS``, or ``MAGIC_SANDBOX_UIDS=BASE:COUNT``, or ``single``):

- **Range**: 1,900,000,000 + 1,024 by default: above the 16-bit range (system and regular
  users, ``nobody``), outside the blocks ``useradd`` hands out in ``/etc/subuid``
  (100000 + 65536 k, for a few hundred users) and systemd's container range
  (524288-1879048191), below 2^31 (signed-uid bugs), in what systemd documents as unused.
  ``check_range`` refuses a range that holds any uid of ``/etc/passwd``, gid of ``/etc/group``,
  or range of ``/etc/subuid``/``/etc/subgid``, with the entry that collides.
- **Between processes**: a process leases a uid by binding the abstract unix socket
  ``magic-rlvr-sandbox-uid-<uid>`` and keeps it for its lifetime. Only one socket can hold a
  name, and the kernel frees it when the process dies (no lock files to go stale), so two
  verifiers (or two test suites) on one host never hand out the same uid. The name space is
  the network namespace's: verifiers in different containers that share a kernel should be
  given disjoint ranges.
- **Within a process**: a leased uid is *busy* while a run uses it, then *draining*; it is
  handed out again only after a scan of ``/proc`` saw no process with that uid (real,
  effective, saved or filesystem) since its run ended. nsjail's PID namespace kills the jail's
  other processes when its PID 1 ends, but when nsjail itself is killed (SIGKILL after a stop
  grace) the jail dies asynchronously, after ``run`` has returned. The scan is done for all
  draining uids at once when no verified uid is left, and draining uids are reused oldest
  first, so the cost is one ``/proc`` scan per many runs.
- **single**: every jail is outside uid 65534 (the previous behaviour; the per-user quotas
  above are shared by all jails). Only for hosts where nsjail cannot map other uids; chosen
  explicitly, announced by ``describe()``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass

from .base import SandboxUnavailable

__all__ = [
    "DEFAULT_UIDS",
    "ENV_VAR",
    "SINGLE_UID",
    "PoolExhausted",
    "UidPool",
    "UidRange",
    "check_range",
    "parse_spec",
    "uids_in_use",
]

ENV_VAR = "MAGIC_SANDBOX_UIDS"
DEFAULT_UIDS = "1900000000:1024"
SINGLE_UID = 65534
_MAX_UID = 2**31 - 1
_LEASE_PREFIX = b"\0magic-rlvr-sandbox-uid-"
# How many uids a process leases at once when it has none verified free: more runs between
# /proc scans, at the price of holding a few uids it may not need.
_BATCH = 8


@dataclass(frozen=True)
class UidRange:
    base: int
    count: int

    @property
    def last(self) -> int:
        return self.base + self.count - 1

    def __contains__(self, uid: int) -> bool:
        return self.base <= uid <= self.last

    def __str__(self) -> str:
        return f"{self.base}-{self.last}"


def parse_spec(spec: str) -> UidRange | None:
    """``BASE:COUNT`` -> the range; ``single`` -> None (every jail is outside uid 65534).
    Raises SandboxUnavailable naming what is wrong."""
    s = spec.strip()
    if s == "single":
        return None
    try:
        base_s, count_s = s.split(":")
        base, count = int(base_s), int(count_s)
    except ValueError:
        raise SandboxUnavailable(
            f"sandbox uid pool {spec!r} is not BASE:COUNT (e.g. {DEFAULT_UIDS}) or 'single' "
            f"(set by {ENV_VAR} or the nsjail 'uids' option)"
        ) from None
    if count < 1:
        raise SandboxUnavailable(f"sandbox uid pool {spec!r}: COUNT must be at least 1")
    # Below 65536: system and regular users, nobody, 16-bit (uid_t)-1; above 2^31-1: tools that
    # keep uids in signed ints.
    if base < 65536 or base + count - 1 > _MAX_UID:
        raise SandboxUnavailable(
            f"sandbox uid pool {spec!r} must lie within 65536-{_MAX_UID} (got "
            f"{base}-{base + count - 1})"
        )
    return UidRange(base, count)


def _id_file_collisions(rng: UidRange, path: str, kind: str) -> list[str]:
    """Entries of a passwd/group (``name:x:id:...``) or subuid/subgid (``name:start:count``)
    file whose id or id range overlaps ``rng``."""
    out = []
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return out
    except OSError as e:
        return [f"{path} unreadable ({e})"]
    for line in lines:
        parts = line.split(":")
        try:
            if kind == "db" and len(parts) >= 3:
                lo = hi = int(parts[2])
            elif kind == "sub" and len(parts) == 3:
                lo, hi = int(parts[1]), int(parts[1]) + int(parts[2]) - 1
            else:
                continue
        except ValueError:
            continue
        if lo <= rng.last and hi >= rng.base:
            out.append(f"{path}: {line.strip()}")
    return out


def check_range(rng: UidRange, etc: str = "/etc") -> None:
    """Refuse a pool that overlaps a real user or group, or a subordinate id range (a rootless
    container's users): a jail must never share an identity, files or quotas with them."""
    hits = (
        _id_file_collisions(rng, f"{etc}/passwd", "db")
        + _id_file_collisions(rng, f"{etc}/group", "db")
        + _id_file_collisions(rng, f"{etc}/subuid", "sub")
        + _id_file_collisions(rng, f"{etc}/subgid", "sub")
    )
    if hits:
        raise SandboxUnavailable(
            f"sandbox uid pool {rng} overlaps ids of this host: {'; '.join(hits[:5])}; pick "
            f"another range with {ENV_VAR}=BASE:COUNT"
        )


def uids_in_use(lo: int, hi: int) -> dict[int, list[int]]:
    """uid -> pids of the processes on this host (this PID namespace) any of whose uids (real,
    effective, saved, filesystem) is within ``lo..hi``. Reads /proc/PID/status: the owner of
    /proc/PID is not enough (a process that made itself non-dumpable shows as root there)."""
    found: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        for u in {int(x) for x in line.split()[1:]}:
                            if lo <= u <= hi:
                                found.setdefault(u, []).append(int(d))
                        break
        except (OSError, ValueError):
            continue  # gone meanwhile
    return found


class PoolExhausted(Exception):
    """No outside uid could be handed out in time (the message says why)."""


class UidPool:
    """Hands out outside uids of ``rng`` to runs; thread-safe. ``acquire()`` -> uid,
    ``release(uid)`` when the run is over (its processes may still be dying: the uid is
    verified gone from /proc before it is handed out again)."""

    def __init__(self, rng: UidRange) -> None:
        self.range = rng
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._leases: dict[int, socket.socket] = {}
        self._free: deque[int] = deque()  # leased, verified without processes, not in use
        self._draining: deque[int] = deque()  # leased, not in use, not verified yet (oldest first)
        self._busy: set[int] = set()
        self._next = self.range.base
        self._pid = os.getpid()

    @property
    def busy(self) -> frozenset[int]:
        with self._cond:
            return frozenset(self._busy)

    def acquire(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        if os.getpid() != self._pid:
            # A forked child inherits the parent's lease sockets (harmless: they only keep
            # those uids leased) and its bookkeeping, which would hand out uids the parent's
            # jails are using: start over with leases of its own.
            self._reset()
        with self._cond:
            while True:
                if self._free:
                    uid = self._free.popleft()
                    self._busy.add(uid)
                    return uid
                self._refill()
                if self._free:
                    continue
                if time.monotonic() > deadline:
                    raise PoolExhausted(
                        f"no free sandbox uid in {self.range} after {timeout_s:g} s: this "
                        f"process runs {len(self._busy)} jails, {len(self._draining)} uids "
                        "still have processes, the rest are leased by other processes; give "
                        f"the pool more uids ({ENV_VAR}=BASE:COUNT) or run fewer jails at once"
                    )
                # Waiting for a release, or for a killed jail's processes to finish dying:
                # poll (the kernel tells no one when the last process of a uid is gone).
                self._cond.wait(0.05)

    def close(self) -> None:
        """Give up every lease (other processes may then use these uids)."""
        with self._cond:
            for s in self._leases.values():
                s.close()
            self._leases.clear()
            self._free.clear()
            self._draining.clear()

    def release(self, uid: int, *, no_processes: bool = False) -> None:
        """``uid``'s run is over. Its processes may still be dying, so it is verified gone
        from /proc before it is handed out again, unless the caller knows that none is left
        (``no_processes``: a forked jail whose PID 1 was reaped, which the kernel reaps only
        after every other process of its PID namespace, the only place that uid ran)."""
        with self._cond:
            if uid in self._busy:
                self._busy.discard(uid)
                (self._free if no_processes else self._draining).append(uid)
                self._cond.notify()

    def _refill(self) -> None:
        """Verify the draining uids (one /proc scan) after leasing a few more when few are
        draining. Called with the lock held and nothing free."""
        if len(self._draining) < _BATCH:
            self._lease_more(_BATCH)
        if not self._draining:
            return
        in_use = uids_in_use(self.range.base, self.range.last)
        still = deque()
        for uid in self._draining:
            (still if uid in in_use else self._free).append(uid)
        self._draining = still

    def _lease_more(self, n: int) -> None:
        tried = 0
        while n > 0 and tried < self.range.count:
            uid = self._next
            self._next = uid + 1 if uid < self.range.last else self.range.base
            tried += 1
            if uid in self._leases:
                continue
            try:
                # Close-on-exec (Python's default): no jail ever holds a lease.
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            except OSError:
                return  # out of descriptors: no new leases now; acquire() waits and says so
            try:
                s.bind(_LEASE_PREFIX + str(uid).encode())
            except OSError:
                s.close()  # leased by another process
                continue
            self._leases[uid] = s
            # A freshly leased uid may have been another process's until just now, and that
            # process's last jail may still be dying: verified like a released one.
            self._draining.append(uid)
            n -= 1
