#!/usr/bin/env bash
# The wheels `make gpu-check WHEELS=DIR` installs on an offline CUDA machine whose image has
# torch, transformers, tokenizers, safetensors, numpy, sympy, aiohttp, rich, pyyaml, scipy,
# matplotlib and prometheus_client (docs/gpu.md "Running it on a CUDA machine"). Run here, with
# a network; DIR then travels with the checkout. The set that worked on an H200 image on
# 2026-11-26 (Python 3.12, torch 2.11.0), with the pins that made pip's resolve succeed:
#   - latex2sympy2_extended 1.10.2: math-verify 0.8.0 pins it;
#   - setuptools < 82: the image's torch requires it (the project's build backend comes from
#     DIR through --find-links, and is never installed);
#   - deepspeed: PyPI has only its source, so a pure-Python wheel is built (DS_BUILD_OPS=0).
#
#   bash scripts/gpu_wheels.sh [DIR] [PYTHON_VERSION]    (defaults: .whl 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PYV=${2:-3.12}
mkdir -p "$DIR"
# The target's platform, not this machine's: manylinux x86-64 builds for CPython $PYV.
PLATFORM=(--only-binary=:all: --python-version "$PYV" --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${PLATFORM[@]}" -d "$DIR" \
  hjson "pydantic==2.12.5" "pydantic-core==2.41.5" annotated-types typing-inspection \
  "math-verify==0.8.0" "latex2sympy2_extended==1.10.2" "antlr4-python3-runtime==4.13.2" \
  tyro docstring-parser typeguard shtab \
  "grpcio==1.85.1" "grpcio-health-checking==1.85.1" "grpcio-reflection==1.85.1" \
  "protobuf==7.35.1" python-json-logger "setuptools==80.9.0" wheel
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps -w "$DIR" "deepspeed==0.19.8"
# One version of each package: two would stop the whole offline install.
dups=$(ls "$DIR"/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dups" ]; then
  echo "gpu_wheels: more than one version of: $dups (remove the extra ones from $DIR)" >&2
  exit 1
fi
echo "gpu_wheels: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR"
echo "then, on the CUDA machine: make gpu-check WHEELS=$DIR"
