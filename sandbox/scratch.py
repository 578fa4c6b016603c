"""Host-side directories a verifier process owns, and the sweep of those its dead predecessors
left behind.

A process killed with SIGKILL (an OOM kill, a replica's forced stop) runs no cleanup: its
directories under the temporary directory stay forever. So each such directory says who owns
it: it is created as ``<tmp>/<prefix><pid>-<random>`` holding ``.owner``, a file its process
keeps open with an exclusive ``flock`` for as long as it lives. The kernel drops that lock when
the process dies, however it dies, so a directory whose lock can be taken has a dead owner and
can be removed; one whose lock is held belongs to a live process (this one, a neighbour
replica, even one in another PID namespace sharing the directory) and is kept. The pid in the
name is for people reading the directory, and covers the moment between creating a directory
and locking it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import weakref

__all__ = ["OWNER_FILE", "OwnedDir", "sweep_dead"]

OWNER_FILE = ".owner"


class OwnedDir:
    """A fresh directory ``<root>/<prefix><pid>-<random>`` with mode ``mode``, locked as this
    process's until ``remove()`` (or this object's collection, or the process's death)."""

    def __init__(self, prefix: str, mode: int = 0o700, root: str | None = None) -> None:
        self.path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root)
        os.chmod(self.path, mode)
        # O_CLOEXEC: the jails and workers this process execs must not hold the lock (it would
        # outlive us in them). A forked child without exec does hold it: it shares our files.
        fd = os.open(os.path.join(self.path, OWNER_FILE),
                     os.O_CREAT | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else has it
        self._finalizer = weakref.finalize(self, _remove, self.path, fd)

    def remove(self) -> None:
        """Remove the directory and release it (idempotent)."""
        self._finalizer()


def _remove(path: str, fd: int) -> None:
    shutil.rmtree(path, ignore_errors=True)
    os.close(fd)


def sweep_dead(prefix: str, root: str | None = None) -> list[str]:
    """Remove every ``<root>/<prefix>*`` directory (root: the temporary directory) that this
    user owns and whose owning process is dead (see the module docstring). Returns the removed
    paths. Never raises: a directory it cannot judge is kept."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(prefix)]
    except OSError:
        return removed
    for entry in entries:
        try:
            if (entry.is_dir(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_uid == os.geteuid()
                    and _remove_if_dead(entry.path, entry.name[len(prefix):])):
                removed.append(entry.path)
        except OSError:
            continue
    return removed


def _remove_if_dead(path: str, suffix: str) -> bool:
    """Take the directory's owner lock; held by someone: keep it. Without an owner file the
    pid in the name decides (alive, or a name from before owner files: keep)."""
    try:
        fd = os.open(os.path.join(path, OWNER_FILE), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        pid = suffix.split("-", 1)[0]
        if not pid.isdigit() or "-" not in suffix or _alive(int(pid)):
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live owner holds it
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
