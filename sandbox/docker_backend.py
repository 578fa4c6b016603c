"""docker backend: one short-lived container per run, driven by the ``docker`` Python SDK.

Same limits as nsjail: ``network_mode=none``, read-only root filesystem, a size-capped tmpfs
at /tmp (the working directory), uid/gid 65534, all capabilities dropped, no-new-privileges,
memory (and memory+swap) limit, pids limit, one core of CPU for the container (as nsjail's
``JAIL_CPU_MS_PER_SEC``), rlimits for CPU time and file size (per run, from ``SandboxLimits``),
the fixed rlimits of nsjail's policy file read from that file (open files, core dumps, locked
memory, message queues, real-time priority: ``sandbox.policy_reader.policy_rlimits``, so the two
backends cannot drift), and the wall deadline enforced from here (the container is killed and
removed).

Input files travel on stdin in front of the program's own stdin (a small tar that a bootstrap
extracts into /tmp before it ``exec``s the command), so the backend works with a remote engine
too and needs nothing mounted from the host. The image must provide ``python3`` (default
``python:3.11-slim``); nothing else of the verifier is needed inside.

Tested against a real engine (tests/test_docker.py, with the verifier image as the sandbox
image: it has /usr/bin/python3); skipped with the reason only where no engine can be had.
"""

from __future__ import annotations

import io
import os
import select
import socket
import struct
import tarfile
import threading
import time
from collections.abc import Callable, Mapping
from signal import SIGKILL
from typing import Any

from .base import (
    CLOSED,
    JAIL_CPU_MS_PER_SEC,
    JailCapacity,
    JailStarts,
    MemoryAccounting,
    RunResult,
    SandboxLimits,
    SandboxUnavailable,
    StdoutHook,
    ceil_s,
    check_file_name,
)
from .policy_reader import policy_environment, policy_rlimits
from .process import OutputSink

_BOOT = (
    "import os,sys,tarfile,io\n"
    "n=int(sys.argv[1]);b=bytearray()\n"
    "while len(b)<n:\n"
    " c=os.read(0,n-len(b))\n"
    " if not c: break\n"
    " b+=c\n"
    "if n: tarfile.open(fileobj=io.BytesIO(bytes(b))).extractall('/tmp')\n"
    "os.execvp(sys.argv[2],sys.argv[2:])\n"
)


def _tar(files: Mapping[str, bytes]) -> bytes:
    if not files:
        return b""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(check_file_name(name))
            info.size = len(data)
            info.mode = 0o444
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def ulimits(lim: SandboxLimits) -> list[tuple[str, int, int]]:
    """The container's rlimits, ``(name, soft, hard)``: CPU time and file size from ``lim``
    (the per-run ones docker has no cgroup for), then every fixed rlimit of nsjail's policy
    file, soft = hard (nsjail's VALUE). Read per call: the file is small, and a sandbox never
    holds a stale copy."""
    cpu = ceil_s(lim.cpu_s)
    fsize = lim.file_size_mb * 1024 * 1024
    return [
        # soft < hard: SIGXCPU at the soft limit (the exit status docker reports as 128+24).
        ("cpu", cpu, cpu + 1),
        ("fsize", fsize, fsize),
        *((name, v, v) for name, v in policy_rlimits().items()),
    ]


def _kill_quietly(api: Any, cid: str) -> None:
    try:
        api.kill(cid)
    except Exception:  # already gone, or the engine refuses: the run's own cleanup removes it
        pass


def _pump(sock: socket.socket, payload: bytes, deadline: float, sink: OutputSink) -> bool:
    """Write ``payload`` to the attach stream (then half-close it) and demultiplex docker's
    8-byte framed output (1 = stdout, 2 = stderr) into ``sink`` until the stream ends, the sink
    says stop, or ``deadline`` passes (True: timed out)."""
    sock.setblocking(False)
    view, pos, buf = memoryview(payload), 0, bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return True
        want_w = [sock] if pos < len(view) else []
        r, w, _ = select.select([sock], want_w, [], min(remaining, 1.0))
        if w:
            try:
                pos += sock.send(view[pos : pos + 65536])
            except BlockingIOError:
                pass
            if pos >= len(view):
                try:
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        if not r:
            continue
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            continue
        buf += chunk
        while len(buf) >= 8:
            kind, size = struct.unpack(">BxxxL", bytes(buf[:8]))
            if len(buf) < 8 + size:
                break
            data = bytes(buf[8 : 8 + size])
            del buf[: 8 + size]
            if (sink.stdout(data) if kind == 1 else sink.stderr(data) if kind == 2 else False):
                return False
        if not chunk:
            return False


OOM_FLAG_GRACE_S = 2.0
"""How long a container killed by SIGKILL (that we did not send) is re-inspected for the
engine's OOMKilled flag before the kill is reported as a plain signal."""


def _await_oom_flag(api: Any, cid: str, state: dict) -> dict:
    """The container's state once the engine has set OOMKilled, or as it is after
    ``OOM_FLAG_GRACE_S``.

    Why wait: containerd delivers a container's OOM event and its exit event independently, and
    before containerd 2.2 (containerd/containerd#12714, "We should always send oom event before
    exit event"; also #8180) the exit could be recorded first: a memory bomb then read as
    "killed by signal 9" under load, not as the memory limit. Only SIGKILL deaths pay this, and
    only those that were not the OOM killer's pay all of it."""
    deadline = time.monotonic() + OOM_FLAG_GRACE_S
    while not state.get("OOMKilled") and time.monotonic() < deadline:
        time.sleep(0.05)
        state = api.inspect_container(cid).get("State", {})
    return state


def _end(api: Any, cid: str, early: tuple[str, str] | None, deadline: float,
         closed: Callable[[], bool]) -> tuple[str, str, int | None, int | None]:
    """(status, detail, exit code, signal) of a container whose stream has ended; one stopped
    ``early`` (a limit, the caller) is killed first and keeps that status. ``closed()``: the
    sandbox killed it while closing (then no OOM flag is waited for)."""
    if early is not None:
        try:
            api.kill(cid)
        except Exception:
            pass
    try:
        waited = api.wait(cid, timeout=max(1.0, deadline - time.monotonic() + 5))
        code = int(waited.get("StatusCode", -1))
    except Exception:
        code = None
    state = api.inspect_container(cid).get("State", {})
    if early is not None:
        return early[0], early[1], None, None
    if code == 128 + SIGKILL and not state.get("OOMKilled") and not closed():
        state = _await_oom_flag(api, cid, state)
    if state.get("OOMKilled"):
        return "memory", "killed by the container memory limit", None, None
    if code is not None and code >= 128:
        sig = code - 128
        return ("timeout" if sig == 24 else "signal"), f"killed by signal {sig}", None, sig  # 24 = SIGXCPU
    return "ok", "", code, None


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already shut or reset by the engine: nothing left to shut
        pass


class DockerSandbox:
    name = "docker"
    isolated = True
    packages_path: str | None = None  # the image's own packages only
    # The container's memory limit bounds the whole jail: an OOM kill inside is that limit.
    memory_accounting: MemoryAccounting = "jail"
    capacity = JailCapacity()  # no identities of its own to run out of: the engine's limits
    starts = JailStarts()  # a container per run, started when the run arrives

    def __init__(
        self,
        image: str = "python:3.11-slim",
        python: str = "python3",
        base_url: str | None = None,
        runtime: str | None = None,
    ) -> None:
        self.image = image
        self.python = python
        self.base_url = base_url
        self.runtime = runtime
        self._client_obj: Any = None
        self._lock = threading.Lock()
        self._containers: set[str] = set()  # ids of the containers of runs in progress
        self._killed: set[str] = set()  # those close() killed
        self._closed = False

    def describe(self) -> str:
        return (
            f"docker ({self._where()}), image {self.image}: network none, read-only root, "
            "uid 65534, no capabilities, memory/pids/cpu limits"
        )

    def _where(self) -> str:
        return self.base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"

    def _client(self):
        if self._client_obj is None:
            try:
                # lazy: an optional dependency (the docker extra)
                import docker  # type: ignore[import-not-found]
            except ImportError as e:
                raise SandboxUnavailable(
                    "the docker Python SDK is not installed (pip install docker)"
                ) from e
            try:
                self._client_obj = (
                    docker.DockerClient(base_url=self.base_url, timeout=30)
                    if self.base_url
                    else docker.from_env(timeout=30)
                )
            except Exception as e:
                raise SandboxUnavailable(f"no Docker engine answers at {self._where()}: {e}") from e
        return self._client_obj

    def self_test(self) -> None:
        client = self._client()
        try:
            client.ping()
        except Exception as e:
            raise SandboxUnavailable(f"no Docker engine answers at {self._where()}: {e}") from e
        try:
            client.images.get(self.image)
        except Exception as e:
            raise SandboxUnavailable(
                f"docker image {self.image} is not present (docker pull {self.image}): {e}"
            ) from e
        probe = (
            "import os,socket\n"
            "assert os.getuid()==65534, os.getuid()\n"
            "try:\n socket.create_connection(('1.1.1.1',53),timeout=2); print('NET')\n"
            "except OSError: pass\n"
            "try:\n open('/probe','w'); print('ROOTRW')\n"
            "except OSError: pass\n"
            "open('/tmp/x','w').write('x'); print('ok')\n"
        )
        res = self.run([self.python, "-I", "-S", "-c", probe], limits=SandboxLimits(wall_s=60))
        if res.status != "ok" or res.exit_code != 0 or res.stdout.split() != [b"ok"]:
            raise SandboxUnavailable(
                f"docker self-test failed: {res.status} {res.detail} {res.stdout[-200:]!r} {res.stderr[-300:]!r}"
            )

    def close(self) -> None:
        """Kill the containers of the runs still in progress (each ``run`` then returns with
        status "error", detail CLOSED, and removes its container as usual) and refuse later
        runs. Idempotent, callable from any thread."""
        with self._lock:
            self._closed = True
            running = list(self._containers)
            self._killed.update(running)
        if running:
            api = self._client().api
            for cid in running:
                _kill_quietly(api, cid)

    def _track(self, cid: str) -> bool:
        """Count a created container as running; False (not started) once closed."""
        with self._lock:
            if self._closed:
                return False
            self._containers.add(cid)
            return True

    def _was_killed(self, container: Any) -> bool:
        with self._lock:
            return container is not None and container["Id"] in self._killed

    def run(
        self,
        argv: list[str],
        *,
        stdin: bytes = b"",
        files: Mapping[str, bytes] = {},
        limits: SandboxLimits | None = None,
        on_stdout: StdoutHook | None = None,
    ) -> RunResult:
        """One container: created with the limits (``_host_config``), the files and stdin
        written through the attach stream and the output read from it (``_pump``, into the
        same OutputSink as nsjail's runs), then its end classified (``_end``) and the
        container removed."""
        lim = limits or SandboxLimits()
        if self._closed:
            return RunResult("error", detail=CLOSED)
        start = time.monotonic()
        deadline = start + lim.wall_s
        try:
            tar = _tar(files)
            api = self._client().api
        except (SandboxUnavailable, ValueError) as e:
            return RunResult("error", detail=str(e))
        container = None
        sock: socket.socket | None = None
        sink = OutputSink(lim.output_bytes, on_stdout)
        exit_code = sig = None
        try:
            config = self._container_config(api, argv, len(tar), self._host_config(api, lim))
            container = api.create_container_from_config(config)
            cid = container["Id"]
            if not self._track(cid):
                return RunResult("error", detail=CLOSED)  # closed meanwhile: never started
            sock_obj = api.attach_socket(
                cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            sock = getattr(sock_obj, "_sock", sock_obj)
            api.start(cid)
            timed_out = _pump(sock, tar + stdin, deadline, sink)
            # Shut the attach stream down before anything else: an engine that cannot write a
            # flood to it holds the container and every call about it (kill, inspect, remove)
            # stalls until the client's timeout. (shutdown, not close: the SDK's file object
            # holds a reference, and close() alone leaves the connection open.)
            _shut(sock)
            early = (("timeout", f"wall time over {lim.wall_s:g} s") if timed_out
                     else sink.stop_reason())
            status, detail, exit_code, sig = _end(api, cid, early, deadline,
                                                  lambda: self._was_killed(container))
        except SandboxUnavailable as e:
            return RunResult("error", detail=str(e))
        except Exception as e:  # the engine failed: not the program's fault
            if self._was_killed(container):  # close() killed it under the calls about it
                return RunResult("error", detail=CLOSED)
            return RunResult("error", detail=f"docker: {type(e).__name__}: {e}")
        finally:
            if sock is not None:
                _shut(sock)
                sock.close()
            if container is not None:
                with self._lock:
                    self._containers.discard(container["Id"])
                try:
                    api.remove_container(container["Id"], force=True)
                except Exception:
                    pass
        if self._was_killed(container) and (exit_code is None or sig is not None):
            return RunResult("error", detail=CLOSED)  # killed by close(), not ended by itself
        return RunResult(
            status=status,  # type: ignore[arg-type]
            exit_code=exit_code,
            signal=sig,
            stdout=bytes(sink.out),
            stderr=bytes(sink.err),
            wall_s=time.monotonic() - start,
            cpu_s=0.0,
            peak_memory_mb=None,
            detail=detail,
            stdout_truncated=sink.stdout_truncated,
            stderr_truncated=sink.stderr_truncated,
        )

    def _host_config(self, api: Any, lim: SandboxLimits) -> Any:
        """The container's limits and isolation (the policy's, as nsjail's jails have them)."""
        # lazy: an optional dependency (the docker extra)
        import docker  # type: ignore[import-not-found]

        return api.create_host_config(
            network_mode="none",
            mem_limit=lim.memory_mb * 1024 * 1024,
            memswap_limit=lim.memory_mb * 1024 * 1024,
            pids_limit=lim.max_procs,
            # One core for all the container's processes, as nsjail's JAIL_CPU_MS_PER_SEC.
            nano_cpus=JAIL_CPU_MS_PER_SEC * 1_000_000,
            read_only=True,
            tmpfs={
                "/tmp": f"rw,exec,nosuid,nodev,size={lim.scratch_mb}m,"
                f"nr_inodes={lim.scratch_files},mode=1777"
            },
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=[
                docker.types.Ulimit(name=name, soft=soft, hard=hard)
                for name, soft, hard in ulimits(lim)
            ],
            runtime=self.runtime,
            # An init (the engine's docker-init) as PID 1: the kernel ignores signals without a
            # handler for PID 1, so a program that were PID 1 would survive SIGXCPU and SIGXFSZ
            # (the CPU and file-size rlimits). Its exit status is 128 + the program's signal.
            init=True,
        )

    def _container_config(self, api: Any, argv: list[str], tar_bytes: int,
                          host_config: Any) -> dict:
        # The bootstrap is the entrypoint, not just the command: an image's own ENTRYPOINT
        # (the verifier image's is `tini -- verifier-entrypoint`) would otherwise run with it as
        # arguments.
        config = api.create_container_config(
            self.image,
            entrypoint=[self.python, "-I", "-S", "-c", _BOOT],
            command=[str(tar_bytes), *argv],
            user="65534:65534",
            working_dir="/tmp",
            environment=policy_environment(),  # the policy file's, as nsjail's jails get
            network_disabled=True,
            stdin_open=True,
            tty=False,
            host_config=host_config,
            labels={"magic-rlvr.sandbox": "1"},
        )
        # StdinOnce: the program's stdin ends when we close our side of the attach stream
        # (else it would wait forever for more input). The SDK sets it with stdin_open (its
        # create_container has no argument for it); asserted so a change there is loud.
        assert config["StdinOnce"] is True and config["AttachStdin"] is True
        return config
