"""docker backend: one short-lived container per run, driven by the ``docker`` Python SDK.

Same limits as nsjail: ``network_mode=none``, read-only root filesystem, a size-capped tmpfs
at /tmp (the working directory), uid/gid 65534, all capabilities dropped, no-new-privileges,
memory (and memory+swap) limit, pids limit, one core of CPU for the container (as nsjail's
``JAIL_CPU_MS_PER_SEC``), rlimits for CPU time and file size (per run, from ``SandboxLimits``),
the fixed rlimits of nsjail's policy file read from that file (open files, core dumps, locked
memory, message queues, real-time priority: ``sandbox.base.policy_rlimits``, so the two
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
from collections.abc import Mapping
from typing import Any

from .base import (
    CLOSED,
    JAIL_CPU_MS_PER_SEC,
    RunResult,
    SandboxLimits,
    SandboxUnavailable,
    StdoutHook,
    ceil_s,
    check_file_name,
    policy_rlimits,
)
from .process import append_capped

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


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already shut or reset by the engine: nothing left to shut
        pass


class DockerSandbox:
    name = "docker"
    isolated = True

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
        # lazy: an optional dependency (the docker extra)
        import docker  # type: ignore[import-not-found]

        host_config = api.create_host_config(
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
        # The bootstrap is the entrypoint, not just the command: an image's own ENTRYPOINT
        # (the verifier image's is `tini -- verifier`) would otherwise run with it as arguments.
        entrypoint = [self.python, "-I", "-S", "-c", _BOOT]
        cmd = [str(len(tar)), *argv]
        container = None
        sock: socket.socket | None = None
        out, err = bytearray(), bytearray()
        status = "ok"
        detail = ""
        exit_code = None
        sig = None
        streamed = 0
        try:
            config = api.create_container_config(
                self.image,
                entrypoint=entrypoint,
                command=cmd,
                user="65534:65534",
                working_dir="/tmp",
                environment={
                    "PATH": "/usr/local/bin:/usr/bin:/bin",
                    "HOME": "/tmp",
                    "LANG": "C.UTF-8",
                    "PYTHONIOENCODING": "utf-8",
                },
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
            container = api.create_container_from_config(config)
            cid = container["Id"]
            if not self._track(cid):
                return RunResult("error", detail=CLOSED)  # closed meanwhile: never started
            sock_obj = api.attach_socket(
                cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            sock = getattr(sock_obj, "_sock", sock_obj)
            api.start(cid)
            sock.setblocking(False)
            payload = memoryview(tar + stdin)
            pos = 0
            buf = bytearray()
            eof = False
            while not eof:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    status, detail = "timeout", f"wall time over {lim.wall_s:g} s"
                    break
                want_w = [sock] if pos < len(payload) else []
                r, w, _ = select.select([sock], want_w, [], min(remaining, 1.0))
                if w:
                    try:
                        pos += sock.send(payload[pos : pos + 65536])
                    except BlockingIOError:
                        pass
                    if pos >= len(payload):
                        try:
                            sock.shutdown(socket.SHUT_WR)
                        except OSError:
                            pass
                if r:
                    try:
                        chunk = sock.recv(65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        eof = True
                    buf += chunk
                    # Demultiplex docker's 8-byte framed stream (1 = stdout, 2 = stderr).
                    while len(buf) >= 8:
                        kind, size = struct.unpack(">BxxxL", bytes(buf[:8]))
                        if len(buf) < 8 + size:
                            break
                        data = bytes(buf[8 : 8 + size])
                        del buf[: 8 + size]
                        if kind == 1:
                            if on_stdout is not None:
                                streamed += len(data)
                                if streamed > lim.output_bytes:
                                    status, detail = (
                                        "output_limit",
                                        f"output over {lim.output_bytes} bytes",
                                    )
                                    eof = True
                                    break
                                if on_stdout(data) is False:
                                    status, eof = "stopped", True
                                    break
                            elif append_capped(out, data, lim.output_bytes):
                                status, detail = (
                                    "output_limit",
                                    f"output over {lim.output_bytes} bytes",
                                )
                                eof = True
                                break
                        elif kind == 2 and append_capped(err, data, lim.output_bytes):
                            status, detail = (
                                "output_limit",
                                f"output over {lim.output_bytes} bytes",
                            )
                            eof = True
                            break
            # Shut the attach stream down before anything else: an engine that cannot write a
            # flood to it holds the container and every call about it (kill, inspect, remove)
            # stalls until the client's timeout. (shutdown, not close: the SDK's file object
            # holds a reference, and close() alone leaves the connection open.)
            _shut(sock)
            if status != "ok":
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
            if status == "ok":
                if state.get("OOMKilled"):
                    status, detail = "memory", "killed by the container memory limit"
                elif code is not None and code >= 128:
                    sig = code - 128
                    status = "timeout" if sig == 24 else "signal"  # 24 = SIGXCPU
                    detail = f"killed by signal {sig}"
                else:
                    exit_code = code
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
            stdout=bytes(out),
            stderr=bytes(err),
            wall_s=time.monotonic() - start,
            cpu_s=0.0,
            peak_memory_mb=None,
            detail=detail,
        )
