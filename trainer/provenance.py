"""What a run's numbers depend on besides its config: the code, the CPU and the numerical
libraries. A run directory keeps one record per start (``environment.json``, a list: a resumed
run may continue on another machine).

Why: the same code, seed and data give bit-identical weights on one machine and library
build, and different ones on another. The demo's warm start reached 46.9% held-out accuracy
with AVX-512 kernels and 21.6% with AVX2 ones (issue 46): a number is reproducible only
together with the kernels it ran on.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("torch", "transformers", "vllm", "deepspeed", "numpy", "math-verify", "sympy")
"""The packages whose versions a record names (those not installed are left out)."""
CPU_FLAGS = re.compile(r"^(avx\w*|amx\w*|fma|f16c|sse4_2)$")
"""The CPU flags that choose numerical kernels (torch's and MKL's dispatch)."""
ENVIRONMENT_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS",
                         "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE",
                         "CUBLAS_WORKSPACE_CONFIG")
"""Variables that change which kernels run, or how they round."""


def code_commit(root: Path = ROOT) -> dict[str, Any]:
    """The checkout's commit and whether tracked files differ from it; ``None`` values outside
    a git checkout (an installed package)."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                 text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def cpu() -> dict[str, Any]:
    """The CPU's model name and its kernel-choosing flags (Linux ``/proc/cpuinfo``)."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        if key.strip() == "flags":
            flags = sorted(f for f in value.split() if CPU_FLAGS.match(f))
            break
    return {"model": model, "flags": flags, "cores": os.cpu_count()}


def numerics() -> dict[str, Any]:
    """torch's kernel choice on this CPU, its BLAS (MKL's version where torch has it) and its
    threads."""
    # Imported here: `trainer ablate` reads code commits through this module, and the trainer's
    # command line answers --help without torch (trainer/cli.py).
    import torch

    config = torch.__config__.show()
    mkl = re.search(r"Intel\(R\) (?:oneAPI )?Math Kernel Library Version ([\d.]+)", config)
    return {
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl": mkl.group(1) if mkl else None,
        "mkldnn": torch.backends.mkldnn.is_available(),
        "threads": torch.get_num_threads(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def libraries() -> dict[str, str]:
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def environment() -> dict[str, Any]:
    """One record of what this process's numbers depend on (module docstring)."""
    return {
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "code": code_commit(),
        "cpu": cpu(),
        "numerics": numerics(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "libraries": libraries(),
        "variables": {k: os.environ[k] for k in ENVIRONMENT_VARIABLES if k in os.environ},
    }


def environment_records(run_dir: Path) -> list[dict[str, Any]]:
    """``run_dir/environment.json``'s records, one per start; [] when there is none, or when
    it cannot be read (a record cut by a crash)."""
    try:
        records = json.loads((run_dir / "environment.json").read_text())
    except (OSError, ValueError):
        return []
    return records if isinstance(records, list) else []


def record_environment(run_dir: Path) -> dict[str, Any]:
    """Append this start's record to ``run_dir/environment.json``; returns it (a file cut by a
    crash is replaced: the new record still goes in)."""
    records = environment_records(run_dir)
    record = environment()
    records.append(record)
    (run_dir / "environment.json").write_text(json.dumps(records, indent=1) + "\n")
    return record
