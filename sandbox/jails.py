"""How a sandbox starts its jails, chosen from what its caller asks: the judge's harness forked
from a warm zygote (sandbox/forkserver.py), jails pre-started per jail command while earlier
runs work (sandbox/warm.py), or each jail started when its run arrives.

The caller (the verifier) says what it wants in a :class:`JailRequest` (how many runs it will
have in flight at once, its forkserver preference, its pre-started jails, the entry the
forkserver serves); :func:`plan_jails` turns it into a :class:`JailStarts`, refusing a
contradiction with a message that names the options; ``create_sandbox(kind, jails=request)``
builds the backend that way, and the sandbox's ``starts`` says what it got.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from .base import JailStarts
from .forkserver import PreloadedEntry

__all__ = ["ForkserverChoice", "JailRequest", "JailStarts", "backend_options", "plan_jails"]

ForkserverChoice = Literal["auto", "on", "off"]
"""Whether the harness's jails are forked from a zygote: "auto" is on with nsjail, as root,
unless pre-started jails are asked for; "on" is refused where it cannot be; "off" never."""


@dataclass(frozen=True)
class JailRequest:
    """What a caller asks of a sandbox's jails.

    - ``at_once``: runs it will have in flight at once (the verifier's code concurrency); the
      default count of pre-started jails per command (one ready for each).
    - ``forkserver``: :data:`ForkserverChoice`.
    - ``warm``: pre-started jails per jail command; None: ``at_once`` unless the forkserver is
      on (the two are two ways to the same end); 0: none.
    - ``entry``: the runs the forkserver serves (the judge's harness); without one there is
      nothing to fork, so no forkserver.
    """

    at_once: int = 1
    forkserver: ForkserverChoice = "off"
    warm: int | None = None
    entry: PreloadedEntry | None = None


def plan_jails(kind: str, request: JailRequest) -> JailStarts:
    """How a ``kind`` sandbox starts its jails for ``request``. Only nsjail has a forkserver or
    pre-started jails; the other backends start each jail when its run arrives. Raises
    ValueError naming the options (the verifier's flags alike) when the request contradicts
    itself or cannot be met here."""
    if request.warm is not None and request.warm < 0:
        raise ValueError(f"warm_jails must be 0 or more (or None), got {request.warm}")
    forkserver = _use_forkserver(kind, request)
    if kind != "nsjail":
        return JailStarts()
    if forkserver:
        return JailStarts(forkserver=True)
    return JailStarts(warm_per_key=request.at_once if request.warm is None else request.warm)


def backend_options(kind: str, starts: JailStarts, entry: PreloadedEntry | None) -> dict[str, object]:
    """The backend's constructor options that start its jails as ``starts`` says."""
    if kind != "nsjail":
        return {}
    return {"warm": starts.warm_per_key, "forkserver": entry if starts.forkserver else None}


def _use_forkserver(kind: str, request: JailRequest) -> bool:
    choice = request.forkserver
    if choice == "on":
        if kind != "nsjail":
            raise ValueError(f"--forkserver on needs --sandbox nsjail, not {kind}")
        if request.warm:
            raise ValueError("--forkserver on replaces the pre-started jails: "
                             "give no --warm-jails (or --forkserver off)")
        if os.geteuid() != 0:
            raise ValueError("--forkserver on needs a service running as root (the zygote "
                             "makes its jails' namespaces and uid changes itself); without "
                             "root, --forkserver off (nsjail's file capabilities)")
        if request.entry is None:
            raise ValueError("--forkserver on: the request names no entry for it to serve")
        return True
    if choice == "off":
        return False
    if choice != "auto":
        raise ValueError(f"--forkserver is auto, on or off, not {choice!r}")
    # The zygote makes its jails' namespaces, mounts, cgroups and uid changes itself, and reads
    # nsjail's seccomp filter with ptrace: root's work. A service without root (the verifier
    # image's user) has nsjail's file capabilities only, and pre-started jails.
    return (kind == "nsjail" and request.warm is None and request.entry is not None
            and os.geteuid() == 0)
