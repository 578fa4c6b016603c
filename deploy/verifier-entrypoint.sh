#!/bin/sh
# The verifier image's entry point, started by tini: `verifier "$@"`, with one addition. For
# `serve`, a non-empty $VERIFIER_HTTP_PORT turns on the HTTP drop-in (verifier/http/gateway.py:
# SandboxFusion's POST /run_code, OpenRLHF's POST /get_reward, POST /score, GET /health) by
# appending `--http-port $VERIFIER_HTTP_PORT`, unless the arguments already name --http-port
# (then they win). Unset or empty: no HTTP port, gRPC only. The HTTP side uses the same token
# (--token-env / --token-file) and TLS as the gRPC port. exec: tini's child is the verifier
# itself, so SIGTERM reaches it and drains both ports.
set -eu
if [ "${1-}" = serve ] && [ -n "${VERIFIER_HTTP_PORT-}" ]; then
    named=no
    for arg in "$@"; do
        case $arg in
            --http-port | --http-port=* | --http_port | --http_port=*) named=yes ;;
        esac
    done
    if [ "$named" = no ]; then
        set -- "$@" --http-port "$VERIFIER_HTTP_PORT"
    fi
fi
exec verifier "$@"
