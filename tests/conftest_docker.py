"""The real Docker engine for tests/test_docker.py: found or started once per run (then stopped
by its PID), the verifier image built once per run on it (the base image, the wheelhouse and the
build cache persist in the engine's data root, so a second run only checks them), and verifier
containers started with the documented flags (ports published on 127.0.0.1).

Skipped with the reason only where no engine can be had (no engine answers, and we are not root
or dockerd is not installed); an engine that will not start or an image that will not build is
an error naming the step."""

from __future__ import annotations

import functools
import json
import time
import uuid
from dataclasses import dataclass

import docker
import docker.errors
import pytest

from scripts import docker_engine as de

TEST_LABEL = "magic-rlvr.test"
TOKEN = "test-token-" + uuid.uuid4().hex[:8]
# The flags deploy/README.md, sandbox/README.md and the Dockerfile's header document.
NSJAIL_CAPS = ["SYS_ADMIN", "SETUID", "SETGID", "DAC_OVERRIDE"]
NSJAIL_SECURITY = ["seccomp=unconfined", "apparmor=unconfined"]


@dataclass
class DockerEnv:
    engine: de.Engine
    client: docker.DockerClient
    image: str
    build_s: float


def _remove_ours(client: docker.DockerClient) -> None:
    for c in client.containers.list(all=True, filters={"label": TEST_LABEL}):
        c.remove(force=True)


@pytest.fixture(scope="session")
def docker_env():
    try:
        engine = de.connect(log=lambda m: print(f"\n[docker] {m}"))
    except de.EngineUnavailable as e:
        pytest.skip(str(e))
    client = engine.client()
    try:
        build_s = de.build_verifier(engine, log=lambda m: print(f"\n[docker] {m}"))
        _remove_ours(client)  # left by a run that was itself killed
        yield DockerEnv(engine, client, de.VERIFIER_IMAGE, build_s)
    finally:
        try:
            _remove_ours(client)
        finally:
            engine.stop()  # only an engine this run started (by its PID)


def last_logs(container, n: int = 30) -> str:
    try:
        return de.tail(container.logs().decode(errors="replace"), n)
    except docker.errors.APIError as e:
        return f"(no logs: {e})"


class VerifierContainer:
    """``docker run`` of the verifier image as documented: the nsjail capabilities, seccomp and
    AppArmor unconfined, the gRPC and metrics ports published (on 127.0.0.1, host ports picked
    by the engine), the image's own entrypoint and command unless ``command`` is given."""

    def __init__(self, env: DockerEnv, *, token: str | None = TOKEN,
                 command: list[str] | None = None, name: str = "verifier"):
        self.env = env
        environment = {"VERIFIER_TOKEN": token} if token is not None else {}
        self.container = env.client.containers.run(
            env.image, command=command, detach=True, environment=environment,
            name=f"magic-rlvr-test-{name}-{uuid.uuid4().hex[:6]}",
            cap_add=NSJAIL_CAPS, security_opt=NSJAIL_SECURITY,
            ports={"50051/tcp": ("127.0.0.1", None), "9090/tcp": ("127.0.0.1", None)},
            labels={TEST_LABEL: "1"},
        )

    @functools.cached_property
    def _ports(self) -> dict[str, int]:
        """The host ports (kept: a killed container no longer reports them)."""
        self.container.reload()
        published = self.container.attrs["NetworkSettings"]["Ports"] or {}
        try:
            return {k: int(published[k][0]["HostPort"]) for k in ("50051/tcp", "9090/tcp")}
        except (KeyError, TypeError, IndexError):
            raise AssertionError(f"the container's ports are not published ({published}):\n"
                                 f"{last_logs(self.container)}") from None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._ports['50051/tcp']}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self._ports['9090/tcp']}/metrics"

    def logs(self) -> str:
        return self.container.logs().decode(errors="replace")

    def listening_record(self, timeout_s: float = 120) -> dict:
        """The server's 'verifier listening' log line (it is up); fails with the container's
        last log lines if it exits or never gets there."""
        deadline = time.monotonic() + timeout_s
        while True:
            for line in self.logs().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("message") == "verifier listening":
                    return rec
            self.container.reload()
            if self.container.status == "exited":
                raise AssertionError(f"start verifier container: it exited "
                                     f"({self.container.attrs['State']['ExitCode']}):\n"
                                     f"{last_logs(self.container)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"start verifier container: not listening after "
                                     f"{timeout_s:.0f} s:\n{last_logs(self.container)}")
            time.sleep(0.5)

    def wait_healthy(self, timeout_s: float = 180) -> None:
        """Docker's own HEALTHCHECK (the image's `verifier health`) reports healthy."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.container.reload()
            state = self.container.attrs["State"]
            if state.get("Health", {}).get("Status") == "healthy":
                return
            if state["Status"] == "exited" or time.monotonic() > deadline:
                raise AssertionError(
                    f"verifier container never became healthy (state {state['Status']}, "
                    f"health {json.dumps(state.get('Health', {}))[-600:]}):\n"
                    f"{last_logs(self.container)}")
            time.sleep(1.0)

    def wait_exit(self, timeout_s: float = 120) -> int:
        try:
            return int(self.container.wait(timeout=timeout_s)["StatusCode"])
        except Exception as e:  # noqa: BLE001 - requests' timeout types vary; re-raised
            raise AssertionError(f"verifier container did not exit within {timeout_s:.0f} s "
                                 f"({type(e).__name__}):\n{last_logs(self.container)}") from e

    def remove(self) -> None:
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass
