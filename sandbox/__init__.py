"""Running untrusted programs: one small interface, backends nsjail (default) and docker.

    sandbox = create_sandbox("nsjail")          # runs the self-test; SandboxUnavailable says why
    result = sandbox.run([sandbox.python, "prog.py"], stdin=b"1 2\\n",
                         files={"prog.py": b"print(sum(map(int, input().split())))"},
                         limits=SandboxLimits(wall_s=5, memory_mb=512))

There is no silent fallback: when the requested backend does not work, ``create_sandbox``
raises; the verifier then keeps serving math and answers every code item with SANDBOX_ERROR
naming the reason (``verifier.scoring.scorer.open_sandbox``). ``unsafe-none`` (no isolation)
exists for development only and is announced with a loud warning. The policy is documented in
sandbox/README.md and lives in sandbox/policy/nsjail.cfg.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, get_args

from .base import (
    JailCapacity,
    JailStarts,
    MemoryAccounting,
    RunResult,
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    StdoutHook,
)
from .docker_backend import DockerSandbox
from .forkserver import PreloadedEntry
from .jails import ForkserverChoice, JailRequest, backend_options, plan_jails
from .nsjail import NsjailSandbox
from .scratch import OwnedDir, sweep_dead
from .unsafe import WARNING, UnsafeSandbox

# The sandbox's one front door: the verifier imports these names from ``sandbox`` and nothing
# from its modules (tests/test_layers.py holds it to that).
__all__ = [
    "KINDS",
    "ForkserverChoice",
    "JailCapacity",
    "JailRequest",
    "JailStarts",
    "MemoryAccounting",
    "OwnedDir",
    "RunResult",
    "Sandbox",
    "SandboxKind",
    "SandboxLimits",
    "SandboxUnavailable",
    "StdoutHook",
    "PreloadedEntry",
    "create_sandbox",
    "plan_jails",
    "sweep_dead",
]

SandboxKind = Literal["nsjail", "docker", "unsafe-none"]
"""The sandbox backends, by the name ``create_sandbox`` and ``verifier serve --sandbox`` take."""
KINDS: tuple[str, ...] = get_args(SandboxKind)
log = logging.getLogger(__name__)


def create_sandbox(
    kind: SandboxKind = "nsjail",
    *,
    self_test: bool = True,
    jails: JailRequest | None = None,
    **options: Any,
) -> Sandbox:
    """Build a sandbox backend and run its self-test (unless ``self_test=False``).

    ``jails``: what the caller wants of its jails (runs at once, forkserver, pre-started
    jails); the way to start them is chosen here (``plan_jails``: ValueError on a
    contradiction) and the sandbox's ``starts`` says what it got. Without it, nsjail takes
    ``warm`` and ``forkserver`` as given (default: cold jails).

    Options: nsjail: ``binary``, ``config``, ``python``, ``cgroup`` ("auto"/"v2"/"v1"/"off"),
    ``packages`` (a directory of extra importable packages, default ``.sandbox-packages``),
    ``uids``, ``warm``, ``forkserver``; docker: ``image``, ``python``, ``base_url``,
    ``runtime``; unsafe-none: ``python``.
    Raises SandboxUnavailable (with the reason) when it cannot run programs safely here.
    """
    if jails is not None:
        given = sorted({"warm", "forkserver"} & options.keys())
        if given:
            raise ValueError(f"give the jails' start-up as jails=JailRequest(...) or as "
                             f"options, not both ({', '.join(given)})")
        options = {**options, **backend_options(kind, plan_jails(kind, jails), jails.entry)}
    if kind == "nsjail":
        sb: Sandbox = NsjailSandbox(**options)
    elif kind == "docker":
        sb = DockerSandbox(**options)
    elif kind == "unsafe-none":
        sb = UnsafeSandbox(**options)
        bar = "!" * 100
        log.warning("%s\n%s\n%s", bar, WARNING, bar)
    else:
        raise SandboxUnavailable(
            f"unknown sandbox kind {kind!r}; expected one of {', '.join(KINDS)}"
        )
    if self_test:
        sb.self_test()
    return sb
