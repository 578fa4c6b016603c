"""File descriptors: the one resource every connection, jail and pipe of a replica draws on.

A replica's descriptors are bounded by its soft RLIMIT_NOFILE (1,024 by default on most
hosts). Everything shares them: HTTP and gRPC connections, each jail's pipes (about 8 while it
runs), the worker pools' pipes, the uid pool's sockets, log files. When they run out, nothing
of the replica can start a jail or accept a connection (a red team held 1,000 idle HTTP
connections and a correct code item came back SANDBOX_ERROR "Too many open files").

So:

- ``raise_nofile_limit``: ``verifier serve`` raises the soft limit to the hard one at start.
- ``http_connection_cap``: the HTTP gateway holds at most half of what is left after
  ``FD_RESERVE`` (verifier/http/connections.py), whatever it is configured with.
- ``run_jail``: a jail that could not start for want of descriptors is tried again a few times
  (``FD_RETRY_DELAYS_S``), then reported as the service's fault (VerifierError "unavailable":
  gRPC UNAVAILABLE, HTTP 503), never as a verdict on the item: a shortage is the replica's
  state, not the program's doing, and another replica (or this one a moment later) can score
  the item.
"""

from __future__ import annotations

import errno
import logging
import resource
import time
from collections.abc import Callable

from sandbox import RunResult
from verifier.items import VerifierError

log = logging.getLogger(__name__)

FD_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE})
"""The errnos of a descriptor shortage: the process's limit (EMFILE) or the system's (ENFILE)."""
FD_RESERVE = 128
"""Descriptors never given to HTTP connections: the server's own files, its pools' pipes, a few
gRPC connections and the first jails."""
FD_RETRY_DELAYS_S = (0.05, 0.2, 0.5)
"""Waits before each new try of a jail that could not start for want of descriptors (then the
call fails with UNAVAILABLE): short, since other jails and connections end all the time."""
_SHORTAGE_TEXT = tuple(f"[Errno {n}]" for n in sorted(FD_SHORTAGE))
"""How a shortage reads in a sandbox's "error" result (an OSError's str in its detail: the
sandbox reports a failed start that way, e.g. "cannot start 'nsjail': [Errno 24] ...")."""


def nofile_limits() -> tuple[int, int]:
    """The process's (soft, hard) RLIMIT_NOFILE; RLIM_INFINITY as is."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (nothing needs privileges for that) and
    return the soft limit now in force. A refusal is logged and the old limit kept."""
    soft, hard = nofile_limits()
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:
            log.warning("could not raise the descriptor limit",
                        extra={"soft": soft, "hard": hard, "error": str(e)})
    return soft


def http_connection_cap(configured: int, soft_limit: int | None = None) -> int:
    """The HTTP connections a gateway may hold: ``configured``, but never more than half the
    descriptors left above ``FD_RESERVE`` (the other half is for jails and gRPC), and at least
    one. ``soft_limit``: default the process's soft RLIMIT_NOFILE."""
    if soft_limit is None:
        soft_limit = nofile_limits()[0]
    if soft_limit == resource.RLIM_INFINITY or soft_limit < 0:
        return max(1, configured)
    return max(1, min(configured, (soft_limit - FD_RESERVE) // 2))


def fd_shortage(exc: BaseException) -> bool:
    """Whether ``exc`` is a descriptor shortage (EMFILE, ENFILE)."""
    return isinstance(exc, OSError) and exc.errno in FD_SHORTAGE


def _shortage_in(result: RunResult) -> bool:
    return result.status == "error" and any(t in result.detail for t in _SHORTAGE_TEXT)


def unavailable(what: str, why: object) -> VerifierError:
    """The service fault of a descriptor shortage (gRPC UNAVAILABLE, HTTP 503)."""
    return VerifierError(f"this replica is out of file descriptors ({what}: {why}); retry, "
                         "or on another replica", "unavailable")


def run_jail(run: Callable[[], RunResult], what: str = "starting a jail",
             fresh: Callable[[], bool] = lambda: True) -> RunResult:
    """``run()`` (one sandbox run), tried again after each of ``FD_RETRY_DELAYS_S`` while it
    fails for want of descriptors (raised as OSError, or a sandbox "error" result naming the
    errno). Raises ``unavailable`` when every try failed so, or at once when ``fresh()`` says
    the failed try left state behind that a new one cannot start from (output already read);
    any other outcome or exception is ``run``'s own. Blocking: call it on a worker thread (the
    waits are short sleeps)."""
    why: object = None
    for delay in (*FD_RETRY_DELAYS_S, None):
        try:
            result = run()
        except OSError as e:
            if not fd_shortage(e):
                raise
            why = e
        else:
            if not _shortage_in(result):
                return result
            why = result.detail
        if delay is None or not fresh():
            break
        log.warning("out of file descriptors; trying again",
                    extra={"what": what, "delay_s": delay, "error": str(why)[:300]})
        time.sleep(delay)
    raise unavailable(what, why)
