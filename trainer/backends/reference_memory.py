"""The KL reference policy's memory: what it needs, what there is, and the check before loading.

With ``magic.kl_coef > 0`` a backend keeps a frozen copy of the initial policy beside the
trained one (``BackendConfig.keep_reference``). That copy costs one more set of weights per
rank: ``parameters x bytes`` in the dtype it is kept in (float32: 4; DeepSpeed's bf16 mode: 2),
divided over the ranks under ZeRO-3 (which shards it like the policy; parameters at or below
DeepSpeed's persistence threshold stay whole on every rank, as the policy's do). The count comes
from the checkpoint's safetensors headers, so the check runs before any weights are read.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from ..hf_utils import CheckpointError
from . import BackendConfig

#: DeepSpeed's default ``stage3_param_persistence_threshold`` (elements): smaller parameters are
#: kept whole on every rank under ZeRO-3. The backends do not change it.
ZERO3_PERSISTENCE_THRESHOLD = 100_000

GIB = 1024**3


@dataclass(frozen=True)
class ReferenceMemory:
    """What the reference copy needs on one rank."""

    parameters: int
    """Parameters of the model (tied weights once)."""
    bytes_per_parameter: int
    bytes_per_rank: int

    def describe(self) -> str:
        return (f"{self.parameters:,} parameters x {self.bytes_per_parameter} bytes = "
                f"{_human(self.bytes_per_rank)} per rank")


def tensor_sizes(model_path: str | Path) -> list[int]:
    """Element counts of every tensor in the checkpoint's ``*.safetensors`` files, read from
    their headers (8-byte little-endian length, then JSON); no weights are loaded.

    Raises:
        CheckpointError: no safetensors file, or a header that cannot be read.
    """
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{str(model_path)!r} has no *.safetensors file: cannot size the "
                              "KL reference policy")
    sizes = []
    for f in files:
        try:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
        except (OSError, struct.error, ValueError) as e:
            raise CheckpointError(f"{f}: unreadable safetensors header: {e}") from None
        for name, meta in header.items():
            if name != "__metadata__":
                sizes.append(math.prod(meta["shape"]))
    return sizes


def reference_memory(model_path: str | Path, config: BackendConfig,
                     world_size: int = 1) -> ReferenceMemory:
    """Bytes one rank needs for the reference copy of the checkpoint at ``model_path``."""
    sizes = tensor_sizes(model_path)
    per_param = 2 if (config.kind == "deepspeed" and config.dtype == "bfloat16") else 4
    if config.kind == "deepspeed" and config.zero_stage == 3 and world_size > 1:
        elements = sum(n if n <= ZERO3_PERSISTENCE_THRESHOLD else -(-n // world_size)
                       for n in sizes)
    else:
        elements = sum(sizes)
    return ReferenceMemory(sum(sizes), per_param, elements * per_param)


def free_memory_bytes() -> int:
    """Free memory where the reference will live: the current CUDA device's free memory, else
    the host's available memory (``MemAvailable``)."""
    if torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_reference_memory(model_path: str | Path, config: BackendConfig,
                           world_size: int = 1) -> ReferenceMemory:
    """Refuse a reference copy that does not fit, before anything is loaded.

    The budget is ``config.reference_memory_gib`` when set, else the free memory now
    (:func:`free_memory_bytes`). Returns the need when it fits.

    Raises:
        ValueError: naming the parameters, bytes per parameter, the need per rank and the budget.
    """
    need = reference_memory(model_path, config, world_size)
    if config.reference_memory_gib is not None:
        budget = int(config.reference_memory_gib * GIB)
        where = f"backend.reference_memory_gib = {config.reference_memory_gib:g} GiB"
    else:
        budget = free_memory_bytes()
        where = f"the free memory ({_human(budget)})"
    if need.bytes_per_rank > budget:
        sharded = config.kind == "deepspeed" and config.zero_stage == 3 and world_size > 1
        layout = f"sharded over {world_size} ranks by ZeRO-3" if sharded else "a full copy"
        raise ValueError(
            f"magic.kl_coef > 0 keeps a frozen reference copy of the policy, which needs "
            f"{need.describe()} ({layout}), more than {where}. Shard it with "
            "backend.kind=deepspeed backend.zero_stage=3 over more ranks, raise "
            "backend.reference_memory_gib if the memory is there, or set magic.kl_coef=0")
    return need


def _human(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} bytes"
