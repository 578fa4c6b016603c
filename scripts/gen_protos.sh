#!/usr/bin/env bash
# Regenerate the Python stubs from protos/verifier.proto. Run from anywhere:
#   scripts/gen_protos.sh [OUT_DIR]   (default: verifier/proto)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/verifier/proto}"
py="${PYTHON:-$root/.venv/bin/python}"
mkdir -p "$out"
"$py" -m grpc_tools.protoc -I "$root/protos" \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" "$root/protos/verifier.proto"
# grpc_tools writes an absolute-style import; make it package-relative.
sed -i 's/^import verifier_pb2 as verifier__pb2/from . import verifier_pb2 as verifier__pb2/' \
  "$out/verifier_pb2_grpc.py"
