"""What the TRL and verl reward functions share: one client per process and address, the
embedded local verifier, ground truths made JSON-ready, results back in input order, and the
error for responses the verifier could not judge.

Why one process-wide client: TRL calls a reward function once per batch and verl's per-sample
managers once per response, from any thread; a new gRPC channel (and health check) per call
would cost more than scoring a math answer. ``VerifierClient`` is thread-safe, so one per
(address, settings) serves every caller of the process. A forked child (a DataLoader worker,
verl's prime manager's process pool) must not use its parent's channels, so it builds its own.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
from typing import Any, Mapping

from verifier.client import ClientConfig, VerifierClient
from verifier.items import (DOMAINS, NOT_A_VERDICT, Limits, Result, VerifierError,
                            limits_from_dict)
from verifier.client.local import LocalVerifier

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0
"""Default wait for the first health answer of a new client, seconds: long enough for a
replica that is still starting, short enough that a wrong address fails the first call soon."""

AUTO = "auto"
"""Domain choice: "code" when the ground truth is an object of test cases (a dict, or JSON text
of one, as verl/Skywork parquet stores it), "math" otherwise."""


class UnjudgedError(VerifierError):
    """Responses the verifier could not judge (INVALID_INPUT, SANDBOX_ERROR, INTERNAL_ERROR).
    Such a response has no reward at all, so it is an error rather than a 0 reward.
    ``unjudged`` holds ``(label, Result)`` for each of them; every other response of the batch
    was scored."""

    def __init__(self, message: str, unjudged: list[tuple[str, Result]]):
        super().__init__(message, "failed_precondition")
        self.unjudged = unjudged


# ---------------------------------------------------------------------------------------------
# One client per process and address; one embedded verifier per process
# ---------------------------------------------------------------------------------------------

_lock = threading.Lock()
_clients: dict[tuple[Any, ...], VerifierClient] = {}
_local: LocalVerifier | None = None
_local_pid = 0


def _after_fork_in_child() -> None:
    """A forked child drops the clients it inherited (gRPC channels do not survive a fork) and
    gets a fresh lock (another thread may have held it at the fork). An inherited embedded
    verifier keeps serving; the parent owns it."""
    global _lock
    _lock = threading.Lock()
    _clients.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def shared_client(address: str, config: ClientConfig | None = None,
                  connect_timeout_s: float = CONNECT_TIMEOUT_S) -> VerifierClient:
    """The process's client for ``address`` with these settings. A new one must see a SERVING
    replica within ``connect_timeout_s``, so an unreachable fleet is a clear error at the first
    call (naming the address) instead of a long retry loop in the middle of a training step;
    after that, retries and failover are the client's."""
    config = config or ClientConfig()
    key = (address, dataclasses.astuple(config))
    with _lock:
        client = _clients.get(key)
    if client is not None:
        return client
    client = VerifierClient(address, config)
    try:
        client.wait_ready(timeout_s=connect_timeout_s)
    except VerifierError:
        client.close()
        raise VerifierError(
            f"no verifier reachable at {address}: no replica answered a health check within "
            f"{connect_timeout_s:g} s (start one with `verifier serve`, or fix the address)",
            "unavailable") from None
    with _lock:
        kept = _clients.setdefault(key, client)
    if kept is not client:  # another thread connected first
        client.close()
    return kept


def embedded_address(workers: int | None = None) -> str:
    """The address of this process's own local verifier (``verifier serve`` on a free loopback
    port, started on the first call; ``workers`` applies to that first start; a forked child
    uses its parent's). It drains and stops when the process exits, and also dies with it
    (``--exit-with-parent``)."""
    global _local, _local_pid
    with _lock:
        # Only its owner can poll it (in a forked child, poll() finds no such child process).
        if _local is not None and _local_pid == os.getpid() and _local.proc.poll() is not None:
            raise VerifierError(
                f"the embedded verifier exited with code {_local.proc.returncode}; its last "
                f"output:\n{_local.output()[-2000:]}", "unavailable")
        if _local is None:
            _local = LocalVerifier(workers=workers)
            _local_pid = os.getpid()
            atexit.register(_stop_local)
            log.info("embedded verifier started", extra={"address": _local.address})
        return _local.address


def _stop_local() -> None:
    if _local is not None and os.getpid() == _local_pid:  # not from a forked child
        _local.stop()


# ---------------------------------------------------------------------------------------------
# Items and results
# ---------------------------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars turned into lists and Python numbers (what
    pandas and datasets hand over for parquet list and number columns), so it can travel as
    JSON. Anything else that is not JSON becomes that item's INVALID_INPUT, named."""
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy array or scalar, without importing numpy
        return plain(value.tolist())
    return value


def check_domain(domain: str) -> str:
    if domain not in (*DOMAINS, AUTO):
        raise ValueError(f"domain must be one of {', '.join((*DOMAINS, AUTO))}, got {domain!r}")
    return domain


def domain_of(domain: Any, ground_truth: Any) -> Any:
    """The item's domain; ``"auto"`` decides by the ground truth's shape. Anything else is sent
    as given (an unknown domain comes back as that item's INVALID_INPUT, named)."""
    if domain != AUTO:
        return domain
    is_tests = isinstance(ground_truth, Mapping) or (
        isinstance(ground_truth, str) and ground_truth.lstrip().startswith("{"))
    return "code" if is_tests else "math"


def limits_dict(limits: Limits | Mapping[str, Any] | None) -> dict[str, Any]:
    """Per-item limits in the item format, validated now (a typo fails at construction)."""
    if limits is None:
        return {}
    if isinstance(limits, Limits):
        return dataclasses.asdict(limits)
    limits_from_dict(dict(limits))  # raises VerifierError naming the bad field
    return dict(limits)


def score_in_order(client: VerifierClient, items: list[dict[str, Any]]) -> list[Result]:
    """Score ``items`` (unique ids) as one stream over the fleet; results in input order."""
    if not items:
        return []
    got: dict[str, Result] = {r.id: r for r in client.stream(items)}
    missing = [it["id"] for it in items if it["id"] not in got]
    if missing:  # the stream promises one result per item: a broken promise is a bug
        raise VerifierError(f"the verifier stream ended without results for items {missing[:5]}",
                            "internal")
    return [got[it["id"]] for it in items]


def is_judged(result: Result) -> bool:
    return result.status not in NOT_A_VERDICT


def unjudged_error(bad: list[tuple[str, Result]], total: int, hint: str) -> UnjudgedError:
    """The error for ``bad`` (label, Result) pairs, naming each (the first five) and why."""
    shown = "; ".join(f"{label}: {r.status.value}: {r.detail}" for label, r in bad[:5])
    more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
    return UnjudgedError(
        f"the verifier could not judge {len(bad)} of {total} responses (no verdict, so no "
        f"reward; not a 0): {shown}{more}. {hint}", bad)


def short(value: Any, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."
