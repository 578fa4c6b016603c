"""``DeepSpeedBackend``: the policy under ``deepspeed.initialize`` (ZeRO 0-3, data parallel).

Launch: under the ``deepspeed`` launcher (or ``torchrun``) each rank builds one backend on its
share of the batch. Constructed in a plain process, it initialises a world of 1 itself (env
vars MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK), which :meth:`DeepSpeedBackend.close`
tears down again. On a machine without GPUs DeepSpeed falls back to its CPU accelerator and the
gloo backend (``DS_ACCELERATOR=cpu`` forces it).

Loss scaling and accumulation (how the global-token-count rule of docs/magic.md is kept exact):
the DeepSpeed config says ``gradient_accumulation_steps = 1``, so ``engine.backward`` does not
rescale the loss (``engine_loss_divisor = 1``), and the backend owns the accumulation boundary:
before every micro-batch it calls ``engine.set_gradient_accumulation_boundary(last)``, and after
the mini-batch's last backward it calls ``engine.step()`` once. Why not GAS = number of
micro-batches: that number changes from mini-batch to mini-batch (the last one is often
smaller), while DeepSpeed fixes GAS at initialisation and would divide every loss by it. So
each micro-batch loss is ``sum over its response tokens / (global_tokens / world_size)``;
DeepSpeed then averages gradients over the ``world_size`` ranks, which gives exactly the
token mean over the whole mini-batch on every rank. ZeRO 2/3 reduce gradients on every
backward, so ranks with fewer micro-batches run token-free padding micro-batches to keep the
collectives in lockstep (trainer.backends.common).

The optimizer is ``torch.optim.AdamW`` chosen through the config (``torch_adam: true``): the same
update rule as TorchBackend, and no DeepSpeed op to compile (DS_BUILD_OPS=0 installs).

The KL reference policy (``config.keep_reference``) is held like the policy: under ZeRO-3 an
optimizer-less engine with the same ZeRO settings (partitioned the same way), otherwise a plain
frozen module on every rank (:meth:`DeepSpeedBackend._load_reference`).
"""

from __future__ import annotations

import inspect
import os
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator
from deepspeed.comm import comm as ds_comm

from ..dist import unlink_shared_memory
from ..hf_utils import CheckpointError
from . import BackendConfig, OptimizerConfig, check_model_path
from .common import PolicyBackendBase, adamw_kwargs
from .forward import SplitForward, logits_forward
from .loading import enable_gradient_checkpointing, load_causal_lm, load_frozen_reference
from .reference_memory import check_reference_memory

#: Sub-folder of a checkpoint directory holding DeepSpeed's own state (partitioned optimizer
#: states, per rank); the HF model files sit next to it.
DS_STATE_DIR = "deepspeed"
_DS_TAG = "state"

# The world of 1 this module created (not a launcher's): torn down by the last close().
_owned_world: dict[str, Any] = {"users": 0, "env": None}


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_distributed() -> bool:
    """Initialise torch.distributed through DeepSpeed if nothing did yet. Returns True when
    this call created a world of 1 (no launcher env vars: MASTER_ADDR=127.0.0.1, a free
    MASTER_PORT, RANK=0, WORLD_SIZE=1, LOCAL_RANK=0). DeepSpeed needs these env vars (its
    engine reads LOCAL_RANK) and would otherwise try MPI discovery."""

    if torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
        _unlink_shm_allreduce_buffers()
        return False
    created = "WORLD_SIZE" not in os.environ and "RANK" not in os.environ
    if created:
        single = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                  "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
        _owned_world["env"] = {k: os.environ.get(k) for k in single}
        os.environ.update(single)
    # gloo on the CPU accelerator (ccl if oneCCL is installed), nccl on CUDA.
    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    _unlink_shm_allreduce_buffers()
    return created


_shm_names_removed = False


def _unlink_shm_allreduce_buffers() -> None:
    """Remove the names of DeepSpeed's CPU all-reduce buffers in /dev/shm, once per process.

    On the CPU accelerator, when the launcher says all ranks are local (``LOCAL_SIZE`` equal to
    the world size), DeepSpeed's shm comm op creates one 69 MB buffer per rank, named
    ``deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>``, maps every
    peer's, and never removes them (deepspeed 0.19.8, csrc/cpu/comm/shm.cpp ``shm_initialize``
    and shm_interface.cpp ``initialize``). Each launch leaked 138 MB of RAM on two ranks; see
    :func:`trainer.dist.unlink_shared_memory`.

    Sync point: every rank calls this right after ``init_distributed``. A rank returns from
    ``shm_initialize`` only once it has mapped every peer's buffer, so after the barrier no rank
    needs a name any more and each removes its own.
    """
    global _shm_names_removed
    if _shm_names_removed or getattr(ds_comm.cdb, "shm_comm_op", None) is None:
        return
    world = torch.distributed.get_world_size()
    if os.environ.get("LOCAL_SIZE") != str(world):
        return  # DeepSpeed made no buffers (ranks on several machines, or no launcher)
    torch.distributed.barrier()
    rank = torch.distributed.get_rank()
    prefix = "_".join(["deepspeed_allreduce_buffer", str(os.getuid()),
                       os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")])
    unlink_shared_memory([f"{prefix}_{rank}"])
    _shm_names_removed = True


def _acquire_world() -> bool:
    """:func:`ensure_distributed`, counting the users of a world of 1 this module created.
    Returns True when the caller holds such a reference (to give back in ``close``)."""
    if ensure_distributed():
        _owned_world["users"] = 1
        return True
    if _owned_world["env"] is None:  # a launcher's (or the user's) world: not ours to destroy
        return False
    _owned_world["users"] += 1
    return True


def _release_owned_world() -> None:
    """Destroy the world of 1 created by :func:`ensure_distributed` and restore the env."""

    if torch.distributed.is_initialized():
        deepspeed.comm.destroy_process_group()
    for key, value in (_owned_world["env"] or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _owned_world["env"] = None


def deepspeed_config(config: BackendConfig, optimizer: OptimizerConfig,
                     world_size: int) -> dict[str, Any]:
    """The DeepSpeed config dict for ``config`` and ``optimizer`` (see the module docstring for
    GAS = 1).

    ``train_micro_batch_size_per_gpu`` is nominal (1): batches never go through DeepSpeed's
    data loader; it only feeds DeepSpeed's sample counters.
    """
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "gradient_clipping": optimizer.grad_clip,
        "optimizer": {"type": "AdamW",
                      "params": {**adamw_kwargs(optimizer), "betas": list(optimizer.betas),
                                 "torch_adam": True}},
        "zero_optimization": {"stage": config.zero_stage},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": config.dtype == "bfloat16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if config.zero_stage == 3:
        # save() gathers full weights itself (named_weights); keep partitions at save time.
        cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = False
    return cfg


class DeepSpeedBackend(PolicyBackendBase):
    """``TrainingBackend`` on a DeepSpeed engine. ``rank``/``world_size``: the data-parallel
    world. Every public method except ``close`` is collective: all ranks call it, in the same
    order, each with its own share of the rollout batch."""

    def __init__(self, config: BackendConfig, model_path: str | Path,
                 optimizer: OptimizerConfig | None = None,
                 reference_path: str | Path | None = None):
        path = check_model_path(model_path)
        ref_path = check_model_path(reference_path) if reference_path is not None else path
        if config.kind != "deepspeed":
            raise ValueError(f"DeepSpeedBackend needs config.kind='deepspeed', got "
                             f"{config.kind!r}")

        self.config = config
        self._owns_world = _acquire_world()
        self._closed = False
        self.reference: Any = None
        try:
            self.rank = torch.distributed.get_rank()
            self.world_size = torch.distributed.get_world_size()
            if config.keep_reference:  # before anything loads
                check_reference_memory(ref_path, config, self.world_size)
            torch.manual_seed(config.seed)
            ds_config = deepspeed_config(
                config, optimizer if optimizer is not None else OptimizerConfig(),
                self.world_size)
            model = self._load_model(path, ds_config)
            if config.gradient_checkpointing:
                enable_gradient_checkpointing(model)
            self.engine, *_ = deepspeed.initialize(
                model=model, model_parameters=model.parameters(), config=ds_config)
            self.device = torch.device(get_accelerator().current_device_name())
            if config.keep_reference:
                self.reference = self._load_reference(ref_path, ds_config)
                self.has_reference = True
        except BaseException:
            self.close()  # do not leak the world of 1 this constructor created
            raise
        self.engine.module.eval()

    @staticmethod
    def _load_model(path: Path, ds_config: dict[str, Any]) -> Any:
        """float32 weights; DeepSpeed casts to bf16 itself in bf16 mode and, under ZeRO-3,
        partitions them in ``deepspeed.initialize``. Each rank therefore holds the full model
        in host memory while loading (transformers' ``HfDeepSpeedConfig`` route, which builds
        it inside ``zero.Init``, needs ``accelerate``, not a dependency here)."""
        return load_causal_lm(path, dtype=torch.float32)

    def _load_reference(self, path: Path, ds_config: dict[str, Any]) -> Any:
        """The frozen KL reference policy, held like the policy: under ZeRO-3 an optimizer-less
        DeepSpeed engine with the policy's ZeRO settings, so its parameters are partitioned
        over the ranks exactly as the policy's are and gathered layer by layer in forward;
        under ZeRO 0-2 (which shard only optimizer states and gradients, which a frozen model
        has none of) a plain module on the device, in the engine's dtype (bf16 in bf16 mode)."""

        dtype = torch.bfloat16 if self.config.dtype == "bfloat16" else torch.float32
        if self.config.zero_stage == 3:
            frozen = load_frozen_reference(path, torch.float32)
            ref_config = {k: v for k, v in ds_config.items()
                          if k not in ("optimizer", "gradient_clipping")}
            engine, *_ = deepspeed.initialize(model=frozen, config=ref_config)
            engine.module.eval()
            return engine
        return load_frozen_reference(path, torch.float32).to(device=self.device, dtype=dtype)

    # -- hooks ---------------------------------------------------------------------------------
    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    @property
    def _distributed(self) -> bool:
        return True

    @property
    def _grad_average_world(self) -> int:
        return self.world_size  # DeepSpeed averages gradients over the data-parallel ranks

    def _all_reduce(self, values: Sequence[float], op: str = "sum") -> list[float]:
        if self.world_size == 1:
            return [float(v) for v in values]
        ops = {"sum": torch.distributed.ReduceOp.SUM, "max": torch.distributed.ReduceOp.MAX}
        t = torch.tensor([float(v) for v in values], dtype=torch.float64,
                         device=self._comm_device())  # [n]
        # Collective: every rank contributes the same-length vector, in the same order.
        torch.distributed.all_reduce(t, op=ops[op])
        return [float(v) for v in t.cpu()]

    def _comm_device(self) -> torch.device:
        return self.device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")

    def _forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        **kwargs: Any) -> torch.Tensor:
        # Through the engine: under ZeRO-3 its hooks gather each layer's parameters
        # (collective), and its output hooks run DeepSpeed's backward prologue.
        return self.engine(input_ids=input_ids, attention_mask=attention_mask,
                           use_cache=False, **kwargs).logits  # [b, l, V]

    def _ref_forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                            **kwargs: Any) -> torch.Tensor:
        # ZeRO-3: through the reference engine, whose hooks gather each layer (collective).
        return self.reference(input_ids=input_ids, attention_mask=attention_mask,
                              use_cache=False, **kwargs).logits  # [b, l, V]

    def _policy_forward(self) -> SplitForward:
        return _suffix_logits(self.module, self._forward_logits)

    def _reference_forward(self) -> SplitForward:
        module = self.reference.module if hasattr(self.reference, "module") else self.reference
        return _suffix_logits(module, self._ref_forward_logits)

    def _before_micro_batch(self, boundary: bool) -> None:
        # Reductions of ZeRO 0/1 happen only at the boundary; ZeRO 2/3 reduce every backward
        # but finalise (average into the optimizer's partition) at the boundary.
        self.engine.set_gradient_accumulation_boundary(boundary)

    def _backward(self, loss: torch.Tensor, boundary: bool) -> None:
        # GAS = 1: engine.backward divides by 1, the global-token denominator is the only scale.
        self.engine.backward(loss)

    def _optimizer_step(self) -> float:
        """engine.step() at the boundary set for the last micro-batch: DeepSpeed clips the
        global grad norm to ``gradient_clipping`` and applies AdamW. Returns the pre-clip norm
        (DeepSpeed's, or computed here where its optimizer does not record one)."""
        local_norm = None
        if not self.engine.zero_optimization():
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
            # Stage 0: gradients are already all-reduced (averaged) at the boundary backward.
            local_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        if norm is None:
            return local_norm if local_norm is not None else float("nan")
        return float(norm)

    def _current_lr(self) -> float:
        return float(self.engine.get_lr()[0])

    # -- weights and checkpoints ---------------------------------------------------------------
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full detached contiguous tensor), one parameter at a time.

        ZeRO-3: each parameter is gathered from all ranks (``deepspeed.zero.GatheredParameters``)
        and a copy is yielded, so peak memory is one full parameter. This is a distributed sync
        point: EVERY rank must iterate the generator to the end, in the same order, or the
        gather deadlocks. Other stages hold full parameters on every rank (no communication).
        """

        for name, param in self.module.named_parameters():
            if hasattr(param, "ds_id"):  # a ZeRO-3 partitioned parameter
                # Collective all-gather of this parameter (all ranks, same order).
                with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                    full = param.detach().clone()
                yield name, full
            else:
                yield name, param.detach().contiguous()

    def save(self, path: Path) -> None:
        """``path``: HF model files (safetensors in the module's dtype: float32, or bf16 in bf16
        mode; rank 0 writes them) + ``deepspeed/`` (DeepSpeed's checkpoint: module, fp32 master
        weights and the partitioned optimizer states of every rank). Collective: all ranks
        must call it."""
        path = Path(path)
        if self.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
        # Every rank takes part in the ZeRO-3 gathers; only rank 0 keeps the tensors.
        state = {n: t.cpu() for n, t in self.named_weights() if self.rank == 0}
        if self.rank == 0:
            self.module.save_pretrained(str(path), state_dict=state)  # safetensors
        del state
        # Collective: each rank writes its own optimizer partition.
        self.engine.save_checkpoint(str(path / DS_STATE_DIR), tag=_DS_TAG)
        # Sync point: nobody returns (and, e.g., copies the folder) before all files exist.
        torch.distributed.barrier()

    def load(self, path: Path) -> None:
        """Restore the module weights and optimizer states from ``save``'s ``deepspeed/``
        folder (same world size and ZeRO stage). Collective."""
        path = check_model_path(path)
        state_dir = path / DS_STATE_DIR
        if not (state_dir / _DS_TAG).is_dir():
            raise CheckpointError(f"{str(path)!r} has no {DS_STATE_DIR}/{_DS_TAG}: not a "
                                  "DeepSpeedBackend checkpoint (TorchBackend writes optimizer.pt)")
        load_path, _ = self.engine.load_checkpoint(
            str(state_dir), tag=_DS_TAG, load_optimizer_states=True,
            load_lr_scheduler_states=False, load_module_strict=True)
        if load_path is None:
            raise CheckpointError(f"DeepSpeed could not load the checkpoint in {str(state_dir)!r}")
        self.engine.module.eval()

    def close(self) -> None:
        """Drop the engine; when this process created its world of 1 (no launcher) and no
        other backend uses it, destroy the process group and restore the env vars."""
        if self._closed:
            return
        self._closed = True
        self.engine = None  # type: ignore[assignment]  # frees the engine with its last ref
        self.reference = None
        self.has_reference = False
        if self._owns_world:
            _owned_world["users"] -= 1
            if _owned_world["users"] <= 0:
                _owned_world["users"] = 0
                _release_owned_world()


def _suffix_logits(module: torch.nn.Module, call: Any) -> SplitForward:
    """The model called whole (through the engine: DeepSpeed's hooks must see the call), with
    HF's ``logits_to_keep`` so that its output layer runs only on the last ``keep`` positions
    (token_stats asks for those from the first response target on) or, packed, on the
    index tensor ``keep`` of the response positions (packed_token_stats). Models without that
    argument give full logits, sliced."""
    if "logits_to_keep" not in inspect.signature(module.forward).parameters:
        return logits_forward(call)
    return SplitForward(lambda ids, attn, keep, **model_kwargs: call(
        ids, attn, logits_to_keep=keep, **model_kwargs))
