"""Running untrusted programs: one small interface, backends nsjail (default) and docker.

    sandbox = create_sandbox("nsjail")          # runs the self-test; SandboxUnavailable says why
    result = sandbox.run([sandbox.python, "prog.py"], stdin=b"1 2\\n",
                         files={"prog.py": b"print(sum(map(int, input().split())))"},
                         limits=SandboxLimits(wall_s=5, memory_mb=512))

There is no silent fallback: when the requested backend does not work, ``create_sandbox``
raises; the verifier then keeps serving math and answers every code item with SANDBOX_ERROR
naming the reason (``verifier.scoring.open_sandbox``). ``unsafe-none`` (no isolation)
exists for development only and is announced with a loud warning. The policy is documented in
sandbox/README.md and lives in sandbox/policy/nsjail.cfg.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, get_args

from .base import (
    RunResult,
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    StdoutHook,
)
from .docker_backend import DockerSandbox
from .nsjail import NsjailSandbox
from .unsafe import WARNING, UnsafeSandbox

__all__ = [
    "KINDS",
    "RunResult",
    "Sandbox",
    "SandboxKind",
    "SandboxLimits",
    "SandboxUnavailable",
    "StdoutHook",
    "create_sandbox",
]

SandboxKind = Literal["nsjail", "docker", "unsafe-none"]
"""The sandbox backends, by the name ``create_sandbox`` and ``verifier serve --sandbox`` take."""
KINDS: tuple[str, ...] = get_args(SandboxKind)
log = logging.getLogger(__name__)


def create_sandbox(
    kind: SandboxKind = "nsjail",
    *,
    self_test: bool = True,
    **options: Any,
) -> Sandbox:
    """Build a sandbox backend and run its self-test (unless ``self_test=False``).

    Options: nsjail: ``binary``, ``config``, ``python``, ``cgroup`` ("auto"/"v2"/"v1"/"off"),
    ``packages`` (a directory of extra importable packages, default ``.sandbox-packages``);
    docker: ``image``, ``python``, ``base_url``, ``runtime``; unsafe-none: ``python``.
    Raises SandboxUnavailable (with the reason) when it cannot run programs safely here.
    """
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
