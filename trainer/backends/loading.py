"""Loading a causal LM for training, as both backends do: from a local Hugging Face
checkpoint, dropout off, packed attention installed; the frozen KL reference; gradient
checkpointing; weights copied into a live model in place (a resume).

The forward kernels are in trainer/backends/forward.py, the shared MAGIC update loop in
trainer/backends/common.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from ..hf_utils import CheckpointError
from .packing import use_packed_attention


def load_causal_lm(path: str | Path, dtype: torch.dtype = torch.float32) -> Any:
    """``AutoModelForCausalLM`` from a local HF checkpoint in ``dtype`` (explicit: transformers
    5 would otherwise load the checkpoint's own dtype), with the KV cache off (training)."""

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.config.use_cache = False
    disable_dropout(model)
    # Packed micro-batches (max_tokens_per_micro_batch) run row by row; unpacked ones as before.
    use_packed_attention(model)
    return model


def disable_dropout(model: torch.nn.Module) -> None:
    """Zero every dropout probability (``nn.Dropout`` modules and the float
    ``attention_dropout`` attribute HF attention layers read in training mode).

    Why: the update runs the model in training mode (HF gradient checkpointing requires it),
    and PPO's ratio must be exactly 1 for on-policy tokens before the first step; dropout
    would make pi_theta differ from the pi_old that ``logprobs`` measured in eval mode.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    if hasattr(getattr(model, "config", None), "attention_dropout"):
        model.config.attention_dropout = 0.0


def load_frozen_reference(path: str | Path, dtype: torch.dtype = torch.float32) -> Any:
    """The KL reference policy: the checkpoint at ``path`` in ``dtype``, eval mode, no grads,
    dropout off (so that it computes exactly what the policy computed at the same weights)."""
    model = load_causal_lm(path, dtype=dtype)
    model.requires_grad_(False)
    return model.eval()


def enable_gradient_checkpointing(model: Any) -> None:
    """HF per-layer activation checkpointing, non-reentrant (works with ZeRO-3 and with inputs
    that do not require grad)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def load_hf_weights_into(model: torch.nn.Module, path: Path) -> None:
    """Copy the weights of the HF checkpoint at ``path`` into ``model`` in place (the optimizer
    keeps referencing the same parameters). Loaded through transformers (any shard layout or
    key conversion it applies, tied weights re-tied); raises CheckpointError on any missing or
    unexpected key."""
    dtype = next(model.parameters()).dtype
    fresh = load_causal_lm(path, dtype=dtype)
    state = fresh.state_dict()
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys or result.missing_keys:
        raise CheckpointError(f"checkpoint {str(path)!r} does not match the model: missing "
                              f"{result.missing_keys}, unexpected {result.unexpected_keys}")
