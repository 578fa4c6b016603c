"""``TorchBackend``: the policy and a plain ``torch.optim.AdamW`` in one process.

The reference implementation of ``interfaces.TrainingBackend``: no process group, no
wrapper, so what it computes is easy to check; DeepSpeedBackend is tested against it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..hf_utils import CheckpointError
from . import BackendConfig, OptimizerConfig, check_model_path
from .common import PolicyBackendBase, torch_adamw
from .forward import SplitForward, compile_decoder_layers, logits_forward, split_causal_lm
from .loading import (
    enable_gradient_checkpointing,
    load_causal_lm,
    load_frozen_reference,
    load_hf_weights_into,
)
from .reference_memory import check_reference_memory

OPTIMIZER_FILE = "optimizer.pt"
_FORMAT = "trainer.backends.torch/1"


class TorchBackend(PolicyBackendBase):
    """One process: float32 master weights, AdamW exactly per docs/magic.md (constant lr,
    betas, eps, decoupled weight decay on every parameter, global grad-norm clipping). With
    ``config.keep_reference``, a frozen float32 copy of ``reference_path`` (default: the
    starting weights) is the KL reference policy.

    ``dtype="bfloat16"`` runs forward/backward under bf16 autocast over the float32 weights
    (the weights and Adam states stay float32: an lr 1e-6 step would vanish in bf16).
    """

    rank = 0
    world_size = 1

    def __init__(self, config: BackendConfig, model_path: str | Path,
                 optimizer: OptimizerConfig | None = None,
                 device: str | torch.device | None = None,
                 reference_path: str | Path | None = None):
        path = check_model_path(model_path)
        ref_path = check_model_path(reference_path) if reference_path is not None else path
        if config.kind != "torch":
            raise ValueError(f"TorchBackend needs config.kind='torch', got {config.kind!r}")
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise ValueError("TorchBackend is single-process (it does not synchronise "
                             "gradients); with a world of "
                             f"{dist.get_world_size()} ranks use kind='deepspeed'")
        if config.keep_reference:
            check_reference_memory(ref_path, config, world_size=1)  # before anything loads
        self.config = config
        self.optimizer_config = optimizer if optimizer is not None else OptimizerConfig()
        self.device = torch.device(device if device is not None else
                                   ("cuda" if torch.cuda.is_available() else "cpu"))
        torch.manual_seed(config.seed)
        self.model = load_causal_lm(path, dtype=torch.float32).to(self.device)
        # The KL reference: float32 like the policy's weights (under bf16 autocast both compute
        # in bf16 the same way), so the two agree exactly until the first update.
        self.reference = (load_frozen_reference(ref_path).to(self.device)
                          if config.keep_reference else None)
        self.has_reference = self.reference is not None
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        # BackendConfig.compile: 'auto' compiles on CUDA only. The reference policy is not
        # compiled (it runs once per micro-batch under no_grad, and only with a KL loss).
        self.compiled = (config.compile == "on"
                         or (config.compile == "auto" and self.device.type == "cuda"))
        if self.compiled:
            compile_decoder_layers(self.model)
        self.model.eval()
        self.optimizer = torch_adamw(self._trainable(), self.optimizer_config, self.device)
        # The decoder and the output layer apart: the output layer then runs only on the
        # response positions (trainer.backends.forward.token_stats).
        self._split = (split_causal_lm(self.model, self._autocast)
                       or logits_forward(self._forward_logits))
        self._ref_split = None if self.reference is None else (
            split_causal_lm(self.reference, self._autocast)
            or logits_forward(self._ref_forward_logits))

    # -- hooks ---------------------------------------------------------------------------------
    @property
    def module(self) -> torch.nn.Module:
        return self.model

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.config.dtype == "bfloat16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                        **kwargs: Any) -> torch.Tensor:
        with self._autocast():
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              use_cache=False, **kwargs).logits  # [b, l, V]

    def _ref_forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                            **kwargs: Any) -> torch.Tensor:
        assert self.reference is not None
        with self._autocast():
            return self.reference(input_ids=input_ids, attention_mask=attention_mask,
                                  use_cache=False, **kwargs).logits  # [b, l, V]

    def _policy_forward(self) -> SplitForward:
        return self._split

    def _reference_forward(self) -> SplitForward:
        assert self._ref_split is not None
        return self._ref_split

    def _backward(self, loss: torch.Tensor, boundary: bool) -> None:
        loss.backward()  # gradients accumulate (SUM) over the mini-batch's micro-batches

    def _optimizer_step(self) -> float:
        """Clip the global grad norm to ``grad_clip`` (0: no clipping), one AdamW step, zero the
        gradients. Returns the norm before clipping."""
        params = [p for p in self._trainable() if p.grad is not None]
        if not params:
            norm = torch.zeros(())
        elif self.optimizer_config.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.optimizer_config.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # -- weights and checkpoints ---------------------------------------------------------------
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF parameter name, detached contiguous tensor) on the backend's device; a tied
        parameter appears once, under its first name (as in the saved safetensors)."""
        for name, param in self.model.named_parameters():
            yield name, param.detach().contiguous()

    def save(self, path: Path) -> None:
        """``path``: the model in HF format (safetensors, loadable by transformers and vLLM)
        and ``optimizer.pt`` (AdamW state: step counts and both moments). The tokenizer is the
        training loop's to save."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(path))  # safetensors (transformers' default)
        torch.save({"format": _FORMAT, "optimizer": self.optimizer.state_dict()},
                   path / OPTIMIZER_FILE)

    def load(self, path: Path) -> None:
        """Restore the weights and the optimizer state saved by :meth:`save`, exactly: the
        next update continues as if the run had not stopped."""
        path = check_model_path(path)
        opt_file = path / OPTIMIZER_FILE
        if not opt_file.is_file():
            raise CheckpointError(f"{str(path)!r} has no {OPTIMIZER_FILE}: not a TorchBackend "
                                  "checkpoint (a DeepSpeed checkpoint has a 'deepspeed' folder)")
        state: dict[str, Any] = torch.load(opt_file, map_location=self.device, weights_only=True)
        if state.get("format") != _FORMAT:
            raise CheckpointError(f"{str(opt_file)!r} has format {state.get('format')!r}, "
                                  f"expected {_FORMAT!r}")
        load_hf_weights_into(self.model, path)
        self.optimizer.load_state_dict(state["optimizer"])

    def close(self) -> None:
        """Drop the reference copy; the rest is freed by garbage collection (symmetry with
        DeepSpeedBackend.close)."""
        self.reference = None
        self._ref_split = None
        self.has_reference = False
