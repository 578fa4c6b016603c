"""Rollouts with Hugging Face ``generate``: the fast engine on CPU for tiny models (the demo
and most tests; docs/machines.md measured it ~30x faster than vLLM's CPU backend there).

The engine keeps its own copy of the model (the trainer's copy has grads and an optimizer);
the loop pushes the trainer's weights into it after every update with ``load_weights``.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from trainer.engines import EngineConfig, EngineError, check_sampling_params, eos_token_ids
from trainer.interfaces import Completion, SamplingParams

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFEngine:
    """``RolloutEngine`` over ``AutoModelForCausalLM.generate`` (KV cache, one batch of
    chunk_size x n rows per chunk)."""

    def __init__(self, model_path: str | Path, tokenizer: Any,
                 config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.model_path = Path(model_path)
        self.tokenizer = tokenizer
        device = self.config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(device)
        dtype = "auto" if self.config.dtype == "auto" else _DTYPES[self.config.dtype]
        model = AutoModelForCausalLM.from_pretrained(str(self.model_path), dtype=dtype)
        self.model = model.to(self.device).eval()
        self.model.requires_grad_(False)
        self.eos_ids = eos_token_ids(tokenizer, self.model_path)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else self.eos_ids[0]
        # Replace the checkpoint's generation defaults (Qwen ships top_k=20, top_p=0.8,
        # repetition_penalty=1.05, ...): generate() fills every unset knob from them, and
        # rollouts must follow SamplingParams exactly (docs/magic.md: 1.0 / 1.0 / -1).
        self.model.generation_config = GenerationConfig(
            eos_token_id=self.eos_ids, pad_token_id=self.pad_id, bos_token_id=None)
        # Names the trainer may send: the full state dict (includes a tied lm_head.weight).
        self._params = dict(self.model.state_dict(keep_vars=True))

    # -- RolloutEngine -----------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 on_done: Callable[[list[Completion]], None] | None = None) -> list[Completion]:
        """``params.n`` samples per prompt, chunk by chunk; see RolloutEngine.generate.

        Seeding: with ``params.seed`` set, chunk ``c`` samples from ``seed + c`` in a forked
        RNG (the global torch RNG is left as it was), so a call is reproducible for a given
        chunk_size."""
        check_sampling_params(params)
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        out: list[Completion] = []
        size = self.config.chunk_size
        for c, start in enumerate(range(0, len(prompts), size)):
            chunk = [list(map(int, p)) for p in prompts[start:start + size]]
            seed = None if params.seed is None else params.seed + c
            done = self._generate_chunk(chunk, start, params, seed)
            if on_done is not None:
                on_done(list(done))
            out.extend(done)
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy named tensors (HF names, full shapes) into the engine's model. Strict: an
        unknown name or a wrong shape raises KeyError/ValueError (names are checked as they
        come; a partial update is allowed)."""
        with torch.no_grad():
            for name, tensor in weights:
                target = self._params.get(name)
                if target is None:
                    raise KeyError(f"load_weights: unknown parameter {name!r} (not in the "
                                   f"engine's {type(self.model).__name__})")
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(f"load_weights: {name!r} has shape {tuple(tensor.shape)}, "
                                     f"the model's is {tuple(target.shape)}")
                target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))

    def sleep(self) -> None:
        """No-op: the HF engine keeps its model resident."""

    def wake_up(self) -> None:
        """No-op (see sleep)."""

    def close(self) -> None:
        """Drop the model copy."""
        self.model = None  # type: ignore[assignment]
        self._params = {}

    # -- internals ---------------------------------------------------------------------------
    def _generate_chunk(self, chunk: list[list[int]], first_index: int, params: SamplingParams,
                        seed: int | None) -> list[Completion]:
        if self.model is None:
            raise EngineError("generate() on a closed HFEngine")
        B, n = len(chunk), params.n
        L = max(len(p) for p in chunk)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)  # [B, L], left-padded
        attn = torch.zeros((B, L), dtype=torch.long)  # [B, L]
        for i, p in enumerate(chunk):
            ids[i, L - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[i, L - len(p):] = 1
        sample = params.temperature > 0
        kwargs: dict[str, Any] = dict(
            max_new_tokens=params.max_tokens, min_new_tokens=0, do_sample=sample,
            eos_token_id=self.eos_ids, pad_token_id=self.pad_id, use_cache=True,
            # Greedy decoding gives n identical rows: decode once and repeat.
            num_return_sequences=n if sample else 1,
        )
        if sample:
            kwargs.update(temperature=params.temperature, top_p=params.top_p,
                          # top_k=0 disables top-k (None would fall back to HF's default 50)
                          top_k=0 if params.top_k == -1 else params.top_k)
        with torch.no_grad(), torch.random.fork_rng(devices=_rng_devices(self.device)), \
                _cpu_threads(self.config.cpu_threads if self.device.type == "cpu" else None):
            if seed is not None:
                torch.manual_seed(seed)
            seqs = self.model.generate(input_ids=ids.to(self.device),
                                       attention_mask=attn.to(self.device), **kwargs)
        resp = seqs[:, L:].cpu()  # [B * n_rows, <= max_tokens]
        if not sample:
            resp = resp.repeat_interleave(n, dim=0)  # [B * n, T]
        eos = torch.tensor(self.eos_ids)
        out: list[Completion] = []
        for row in range(B * n):
            i, j = divmod(row, n)
            toks = resp[row].tolist()
            hits = torch.isin(resp[row], eos).nonzero()
            if hits.numel() > 0:  # stopped by itself: keep the EOS, drop the padding after it
                toks = toks[: int(hits[0]) + 1]
            truncated = len(toks) >= params.max_tokens and toks[-1] not in self.eos_ids
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            out.append(Completion(prompt_index=first_index + i, sample_index=j,
                                  prompt_ids=list(chunk[i]), token_ids=toks, text=text,
                                  truncated=truncated))
        return out


@contextmanager
def _cpu_threads(n: int | None) -> Iterator[None]:
    """torch intra-op threads set to ``n`` inside the block (EngineConfig.cpu_threads)."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _rng_devices(device: torch.device) -> list[Any]:
    """Devices whose RNG fork_rng must save/restore (only ours: forking every GPU is slow)."""
    if device.type == "cuda":
        return [device.index if device.index is not None else torch.cuda.current_device()]
    return []
