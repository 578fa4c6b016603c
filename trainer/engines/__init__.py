"""Rollout engines: Hugging Face ``generate`` (fast on CPU for tiny models, the demo and most
tests) and vLLM (production; tested for real on CPU by tests/test_vllm.py).

Both implement :class:`trainer.interfaces.RolloutEngine`. Build one with :func:`create_engine`;
this module imports neither torch nor vLLM until an engine is created, so configs stay cheap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trainer.hf_utils import check_model_path

if TYPE_CHECKING:
    from trainer.interfaces import RolloutEngine, SamplingParams

__all__ = ["EngineConfig", "EngineError", "check_sampling_params", "create_engine", "eos_token_ids",
           "standalone_engine"]


class EngineError(RuntimeError):
    """A rollout engine that cannot be built or used as asked; the message says why."""


@dataclass
class EngineConfig:
    """How rollouts are generated. Fields are plain data (YAML ``engine:`` section)."""

    kind: Literal["hf", "vllm"] = "hf"
    """Which engine: "hf" (Hugging Face ``generate``; default, the fast choice on CPU for tiny
    models) or "vllm" (production engine; continuous batching, paged KV cache)."""
    chunk_size: int = 8
    """Prompts per chunk, count, >= 1. Default 8. ``generate`` hands each chunk's completions to
    ``on_done`` as soon as the chunk is finished, so the verifier scores them while generation
    goes on (docs/magic.md: verification must overlap generation). HF generates chunk by chunk
    (chunk_size x n rows in one batch); vLLM schedules all prompts at once and reports every
    chunk_size finished prompts. Smaller = earlier first rewards; larger = bigger HF batches."""
    one_batch: bool = False
    """HF engine only: generate ALL prompts of a call (x n rows) in one ``generate`` batch and
    hand each chunk of ``chunk_size`` prompts to ``on_done`` as soon as all its rows have
    stopped (EOS), in the order chunks finish, while the batch goes on. ``chunk_size`` then
    sets only how finely completions stream to the verifier, not the batch size (no
    speed/overlap trade-off). Seeding: one seed for the whole call. Default False: one
    ``generate`` per chunk (the behaviour before streaming)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights/compute dtype for the engine's model copy: "auto" (the checkpoint's dtype; vLLM
    may pick bfloat16 for float32 checkpoints on GPU), "float32", "bfloat16" or "float16".
    Use "float32" when rollout and trainer log-probs must agree to ~1e-6 (tests)."""
    gpu_memory_utilization: float = 0.5
    """vLLM only, fraction in (0, 1]: share of GPU memory vLLM may use for weights + KV cache.
    Default 0.5 in ``trainer run``, where the trainer (DeepSpeed) shares the GPU; 0.9 in
    ``trainer eval`` and ``trainer filter``, where nothing does (:func:`standalone_engine`).
    Ignored on CPU, where vLLM
    would read it as a share of RAM: there ``kv_cache_gib`` sizes the cache instead."""
    kv_cache_gib: float | None = None
    """vLLM only, GiB: explicit KV-cache size. None = sized by ``gpu_memory_utilization`` on
    GPU, and 1 GiB on CPU (vLLM's CPU backend otherwise reserves a fraction of all RAM)."""
    max_model_len: int | None = None
    """vLLM only, tokens: longest prompt + response. None = the model's
    ``max_position_embeddings``. Set it to max prompt + the stage's max response length to
    keep vLLM's memory planning realistic."""
    enable_sleep_mode: bool = True
    """vLLM on GPU: ``sleep()`` offloads weights and drops the KV cache between rollout
    phases so the training step has the memory; ``wake_up()`` brings them back. No-op (with a
    debug log) on CPU and for the HF engine. Default True in ``trainer run``; False in
    ``trainer eval`` and ``trainer filter`` (no training step needs the memory)."""
    tensor_parallel_size: int = 1
    """vLLM only, GPUs (ranks) per engine, >= 1. Default 1. Under a multi-rank launcher
    (``deepspeed --num_gpus N``) it must divide N: each group of this many consecutive ranks
    runs one engine with a shard each (vLLM's external launcher; the report's 32B recipe uses 4),
    tested on CPU with 2 ranks. In a single process, vLLM instead starts one worker process per
    GPU and ``load_weights`` ships the tensors to them by pickling: untested, no GPUs here."""
    enforce_eager: bool = False
    """vLLM only: disable CUDA graphs / torch.compile. Faster start-up, slower decoding.
    Default False (production); tests and CPU runs set True."""
    seed: int = 0
    """vLLM engine seed (its global RNG). Per-call reproducibility comes from
    ``SamplingParams.seed``."""
    device: str | None = None
    """HF engine only: torch device for its model copy. None = "cuda" when available, else
    "cpu"."""
    cpu_threads: int | None = 1
    """HF engine on CPU only: torch intra-op threads while it generates (the previous setting
    is restored afterwards). Default 1: a tiny model's per-token ops are too small to split,
    and OpenMP barriers then cost more than they save, worst on a busy machine (measured on
    the 2-core dev box with other jobs running: 21,000 tokens/s with 1 thread, 1,100 with 2).
    None = leave torch's setting alone (larger models)."""

    def __post_init__(self) -> None:
        if self.kind not in ("hf", "vllm"):
            raise ValueError(f"engine.kind must be 'hf' or 'vllm', got {self.kind!r}")
        if self.chunk_size < 1:
            raise ValueError(f"engine.chunk_size must be >= 1, got {self.chunk_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("engine.gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"engine.kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if self.tensor_parallel_size < 1:
            raise ValueError("engine.tensor_parallel_size must be >= 1, got "
                             f"{self.tensor_parallel_size}")
        if self.tensor_parallel_size > 1 and self.kind != "vllm":
            raise ValueError("engine.tensor_parallel_size > 1 needs engine.kind=vllm (the HF "
                             f"engine runs on one device), got kind={self.kind!r}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"engine.cpu_threads must be >= 1 or None, got {self.cpu_threads}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError("engine.dtype must be one of auto, float32, bfloat16, float16; "
                             f"got {self.dtype!r}")


def standalone_engine() -> EngineConfig:
    """The engine defaults of ``trainer eval`` and ``trainer filter``: the engine has the GPU to
    itself (no trainer beside it), so vLLM may take 0.9 of its memory and never sleeps. Every
    other field keeps :class:`EngineConfig`'s default."""
    return EngineConfig(gpu_memory_utilization=0.9, enable_sleep_mode=False)


def create_engine(config: EngineConfig, model_path: str | Path, tokenizer: Any) -> RolloutEngine:
    """Build the engine ``config.kind`` names on the checkpoint at ``model_path``.

    ``tokenizer`` (from :func:`trainer.hf_utils.load_tokenizer`) gives the EOS/pad ids and
    decodes responses; engines never build their own tokenizer, because AutoTokenizer would
    rebuild our tiny checkpoints' char tokenizer wrongly. Raises CheckpointError for a missing
    or non-checkpoint path before loading anything.
    """
    path = check_model_path(model_path)
    if config.kind == "hf":
        # lazy: keeps this config module free of torch (and of vllm unless asked for)
        from trainer.engines.hf_engine import HFEngine

        return HFEngine(path, tokenizer, config)
    if config.kind == "vllm":
        # lazy: keeps this config module free of torch (and of vllm unless asked for)
        from trainer.engines.vllm_engine import VLLMEngine

        return VLLMEngine(path, tokenizer, config)
    raise ValueError(f"unknown engine kind {config.kind!r}")


def eos_token_ids(tokenizer: Any, model_path: Path | None = None) -> list[int]:
    """Token ids that end a response: the tokenizer's EOS plus the checkpoint's
    ``generation_config.json`` eos ids (Qwen chat models list both <|im_end|> and
    <|endoftext|>). Raises EngineError when there is none."""

    ids: list[int] = []
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    if model_path is not None and (model_path / "generation_config.json").is_file():
        eos = json.loads((model_path / "generation_config.json").read_text()).get("eos_token_id")
        for e in (eos if isinstance(eos, list) else [eos]):
            if e is not None and int(e) not in ids:
                ids.append(int(e))
    if not ids:
        raise EngineError("the tokenizer has no eos_token_id and the checkpoint's "
                          "generation_config.json names none: responses could never stop")
    return ids


def check_sampling_params(params: SamplingParams) -> None:
    """ValueError for SamplingParams no engine can honour (both engines call this)."""
    if params.n < 1:
        raise ValueError(f"SamplingParams.n must be >= 1, got {params.n}")
    if params.max_tokens < 1:
        raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {params.max_tokens}")
    if params.temperature < 0:
        raise ValueError(f"SamplingParams.temperature must be >= 0, got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")
    if params.top_k != -1 and params.top_k < 1:
        raise ValueError(f"SamplingParams.top_k must be -1 or >= 1, got {params.top_k}")
