"""Training backends: the policy model + optimizer behind ``interfaces.TrainingBackend``.

- :class:`~trainer.backends.torch_backend.TorchBackend`: one process, plain ``torch.optim.AdamW``.
- :class:`~trainer.backends.deepspeed_backend.DeepSpeedBackend`: ``deepspeed.initialize`` with
  ZeRO stage 0-3, data parallel over the ``deepspeed``/``torchrun`` launcher's ranks.

Both load their models alike (:mod:`trainer.backends.loading`) and share one forward pass
(:mod:`trainer.backends.forward`) and one MAGIC update loop (:mod:`trainer.backends.common`), so
the loss, the global-token-count rule (docs/magic.md) and the metrics are identical by
construction.
With ``keep_reference`` both also hold a frozen KL reference policy, whose memory
:mod:`trainer.backends.reference_memory` checks before anything loads.

This module imports no torch: :class:`BackendConfig` is usable by the config layer and the CLI
without the training stack; :func:`create_backend` imports the backend it builds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from trainer.hf_utils import check_model_path
from trainer.magic.config import MagicConfig

if TYPE_CHECKING:  # pragma: no cover
    from ..interfaces import TrainingBackend

__all__ = ["BackendConfig", "BackendKind", "CompileMode", "DType", "OptimizerConfig", "ZeroStage",
           "check_model_path", "create_backend"]

BackendKind = Literal["torch", "deepspeed"]
ZeroStage = Literal[0, 1, 2, 3]
DType = Literal["float32", "bfloat16"]
CompileMode = Literal["auto", "on", "off"]

_KINDS = ("torch", "deepspeed")
_STAGES = (0, 1, 2, 3)
_DTYPES = ("float32", "bfloat16")
_COMPILE = ("auto", "on", "off")


def _need(ok: bool, rule: str) -> None:
    if not ok:
        raise ValueError(rule)


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer a backend builds (docs/magic.md "optimizer" row): AdamW with a constant
    learning rate. Not a section of the run config: a run builds it from ``magic``, the one
    home of the report's optimizer settings (:meth:`from_magic`); tests build their own.
    Frozen; each field says unit, default and why."""

    lr: float = MagicConfig.lr
    """AdamW learning rate, constant (no schedule, no warm-up), > 0. Default: magic.lr's."""
    betas: tuple[float, float] = MagicConfig.betas
    """AdamW (beta1, beta2), each in [0, 1). Default: magic.betas's."""
    eps: float = 1e-8
    """AdamW epsilon added to sqrt(v), > 0. Default 1e-8 (torch's and verl's default). Tests raise
    it to make the step linear in the gradient, which exposes gradient-scale bugs that Adam's
    scale invariance would hide."""
    weight_decay: float = MagicConfig.weight_decay
    """AdamW decoupled weight decay (p -= lr * wd * p per step), >= 0. Default:
    magic.weight_decay's."""
    grad_clip: float = MagicConfig.grad_clip
    """Max global L2 norm of the gradient before each optimizer step, >= 0; 0 disables clipping
    (DeepSpeed's convention). Default: magic.grad_clip's. The reported grad_norm is the norm
    BEFORE clipping."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        need = _need
        need(math.isfinite(self.lr) and self.lr > 0, f"lr must be finite and > 0, got {self.lr}")
        need(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
             f"betas must be two numbers in [0, 1), got {self.betas}")
        need(math.isfinite(self.eps) and self.eps > 0, f"eps must be finite and > 0, "
             f"got {self.eps}")
        need(math.isfinite(self.weight_decay) and self.weight_decay >= 0,
             f"weight_decay must be finite and >= 0, got {self.weight_decay}")
        need(self.lr * self.weight_decay < 1, "lr * weight_decay must be < 1, or one step "
             f"would flip the weights' sign, got {self.lr} * {self.weight_decay}")
        need(math.isfinite(self.grad_clip) and self.grad_clip >= 0,
             f"grad_clip must be finite and >= 0 (0 disables clipping), got {self.grad_clip}")

    @classmethod
    def from_magic(cls, magic: MagicConfig) -> "OptimizerConfig":
        """The report's optimizer settings as ``magic`` holds them (eps stays torch's)."""
        return cls(lr=magic.lr, betas=tuple(magic.betas), weight_decay=magic.weight_decay,
                   grad_clip=magic.grad_clip)


@dataclass(frozen=True)
class BackendConfig:
    """How the policy is held and computed (docs/machines.md machine facts); the optimizer is
    :class:`OptimizerConfig`, built from ``magic``. Frozen: vary a field with ``dataclasses.replace`` (re-validated). Each field's
    ``metadata["help"]`` gives unit, default and why."""

    kind: BackendKind = "torch"
    """Which backend: 'torch' (one process, plain torch AdamW) or 'deepspeed' (ZeRO, data parallel
    under the deepspeed/torchrun launcher). Default 'torch': the CPU demo and most tests need
    no process group."""
    zero_stage: ZeroStage = 0
    """DeepSpeed ZeRO stage 0-3 (0: plain data parallel, 1: optimizer states sharded, 2: +
    gradients, 3: + parameters). Default 0. Only meaningful with kind='deepspeed'."""
    dtype: DType = "float32"
    """Compute dtype. 'float32' (default: exact, the CPU choice) or 'bfloat16' (GPU production).
    Master weights and optimizer states stay float32 either way: lr 1e-6 updates vanish in
    bf16 weights. torch backend: bf16 autocast over float32 weights; deepspeed: its bf16 mode
    (bf16 weights, fp32 master copy in the optimizer)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (HF gradient checkpointing,
    non-reentrant). Default False; turn on for long contexts (16K/32K stages) to trade ~30%
    compute for activation memory."""
    compile: CompileMode = "auto"
    """torch.compile (inductor) the decoder layers and the output layer's per-chunk log-prob
    and entropy reduction, torch backend only: it fuses the memory-bound work between the
    matrix products (norms, rotary, SiLU, residuals, the float32 log-softmax over the
    vocabulary). 'auto' (default): on when the backend's device is CUDA, off on the CPU (there
    it costs ~30 s of start-up and needs a C++ compiler, for nothing at demo sizes); 'on';
    'off'. Shapes are compiled dynamic, so varying lengths do not recompile. Measured on one
    H200 (docs/gpu.md, Qwen2-1.5B shape, bf16, 4K-token responses): model FLOPs utilization of
    the update 0.25 -> 0.37 with the fused AdamW that a CUDA device always gets. The deepspeed
    backend never compiles ('auto' means off; 'on' is refused): not measured under ZeRO's
    parameter hooks."""
    entropy_chunk_size: int = 1024
    """Token positions per chunk when computing log-softmax statistics and the full-vocabulary
    entropy, >= 1. Default 1024: bounds the float32 working set to chunk x vocab (about 600
    MB for a 152K vocabulary) instead of a [b, L, V] float32 copy."""
    keep_reference: bool = False
    """Keep a frozen copy of the initial weights (after any warm start) as the reference policy of
    the KL loss, and compute its log-probs on every micro-batch of the update. Default False;
    `trainer run` sets it from magic.kl_coef > 0. Memory: one more copy of the weights per
    rank, parameters x 4 bytes (float32; 2 in DeepSpeed's bf16 mode), divided over the ranks
    under ZeRO-3, which shards it like the policy (e.g. 7B in bf16: about 14 GiB on one rank,
    1.8 GiB per rank over 8); checked against reference_memory_gib before anything is loaded
    (trainer/backends/reference_memory.py)."""
    reference_memory_gib: float | None = None
    """Memory the KL reference copy may use on one rank, GiB, > 0. Default None: the free memory at
    start-up (the CUDA device's, else the host's MemAvailable). A reference that needs more
    is refused before loading, with the numbers."""
    seed: int = 0
    """Seed for torch's RNG at backend construction, >= 0. Default 0. The MAGIC update itself is
    deterministic (no dropout in Qwen2); the seed pins any stochastic layer a model might
    have so runs are reproducible."""

    def __post_init__(self) -> None:
        need = _need
        need(self.kind in _KINDS, f"kind must be one of {_KINDS}, got {self.kind!r}")
        need(self.zero_stage in _STAGES,
             f"zero_stage must be one of {_STAGES}, got {self.zero_stage!r}")
        need(self.kind == "deepspeed" or self.zero_stage == 0,
             "zero_stage > 0 needs kind='deepspeed': the torch backend has no ZeRO sharding, "
             f"got kind={self.kind!r} with zero_stage={self.zero_stage}")
        need(self.dtype in _DTYPES, f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        need(self.compile in _COMPILE,
             f"compile must be one of {_COMPILE}, got {self.compile!r}")
        need(not (self.kind == "deepspeed" and self.compile == "on"),
             "compile='on' needs kind='torch': the deepspeed backend does not compile (not "
             "measured under ZeRO's parameter hooks); use compile='auto' or 'off'")
        need(isinstance(self.entropy_chunk_size, int) and self.entropy_chunk_size >= 1,
             f"entropy_chunk_size must be an int >= 1, got {self.entropy_chunk_size!r}")
        need(self.reference_memory_gib is None or (math.isfinite(self.reference_memory_gib)
                                                  and self.reference_memory_gib > 0),
             f"reference_memory_gib must be None or > 0, got {self.reference_memory_gib!r}")
        need(isinstance(self.seed, int) and self.seed >= 0,
             f"seed must be an int >= 0, got {self.seed!r}")


def create_backend(config: BackendConfig, model_path: str | Path,
                   optimizer: OptimizerConfig | None = None,
                   reference_path: str | Path | None = None) -> TrainingBackend:
    """Build the backend ``config.kind`` names on the checkpoint at ``model_path``, with the
    optimizer ``optimizer`` describes (default :class:`OptimizerConfig`'s defaults).

    The path is checked first (:func:`check_model_path`), before torch, transformers or
    DeepSpeed are imported. ``kind='deepspeed'`` initialises torch.distributed if needed
    (a world of 1 when not started by a launcher). With ``config.keep_reference`` the KL
    reference policy is loaded from ``reference_path`` (default: ``model_path``; a resumed run
    passes its initial weights, not the checkpoint's), after its memory check.
    """
    path = check_model_path(model_path)
    ref = check_model_path(reference_path) if reference_path is not None else None
    if config.kind == "torch":
        # lazy: keeps this config module free of torch (and of deepspeed unless asked for)
        from .torch_backend import TorchBackend

        return TorchBackend(config, path, optimizer, reference_path=ref)
    # lazy: keeps this config module free of torch (and of deepspeed unless asked for)
    from .deepspeed_backend import DeepSpeedBackend

    return DeepSpeedBackend(config, path, optimizer, reference_path=ref)
