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
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    StoppingCriteria,
    StoppingCriteriaList,
)

from trainer.engines import EngineConfig, EngineError, check_sampling_params, eos_token_ids
from trainer.interfaces import Completion, SamplingParams

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFEngine:
    """``RolloutEngine`` over ``AutoModelForCausalLM.generate`` (KV cache): one batch of
    chunk_size x n rows per chunk, or (``config.one_batch``) one batch of every row with
    finished chunks streamed out of it (:class:`_ChunkWatcher`)."""

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
        if self.config.one_batch and prompts:
            return self._generate_one_batch([list(map(int, p)) for p in prompts], params,
                                            on_done)
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
    def _generate_one_batch(self, prompts: list[list[int]], params: SamplingParams,
                            on_done: Callable[[list[Completion]], None] | None,
                            ) -> list[Completion]:
        """Every prompt in one ``generate`` batch; each chunk of ``chunk_size`` prompts goes to
        ``on_done`` from the generating thread as soon as all its rows have emitted EOS, the
        rest (chunks with a truncated row) when the batch ends. Returns prompt order."""
        rows_per_prompt = params.n if params.temperature > 0 else 1
        size = self.config.chunk_size
        chunks = [range(s, min(s + size, len(prompts))) for s in range(0, len(prompts), size)]
        done: dict[int, list[Completion]] = {}  # chunk -> its completions, once handed over

        def finish(c: int, resp: torch.Tensor) -> None:  # resp: [rows of chunk c, t]
            first = chunks[c][0]
            comps = self._completions(resp, [prompts[i] for i in chunks[c]], first, params)
            done[c] = comps
            if on_done is not None:
                on_done(list(comps))

        L = max(len(p) for p in prompts)
        watcher = _ChunkWatcher(L, [len(r) * rows_per_prompt for r in chunks], self.eos_ids,
                                finish)
        seqs = self._generate_rows(prompts, params, params.seed, watcher)  # [B * rows, L + t]
        resp = seqs[:, L:].cpu()  # [B * rows, t]
        for c in range(len(chunks)):
            if c not in done:  # chunks with a row stopped by the length limit
                lo, hi = watcher.bounds[c]
                finish(c, resp[lo:hi])
        return [x for c in range(len(chunks)) for x in done[c]]

    def _generate_chunk(self, chunk: list[list[int]], first_index: int, params: SamplingParams,
                        seed: int | None) -> list[Completion]:
        L = max(len(p) for p in chunk)
        seqs = self._generate_rows(chunk, params, seed, None)
        return self._completions(seqs[:, L:].cpu(), chunk, first_index, params)

    def _generate_rows(self, chunk: list[list[int]], params: SamplingParams, seed: int | None,
                       watcher: "_ChunkWatcher | None") -> torch.Tensor:
        """One ``generate`` call over ``chunk`` (left-padded): ``[B * rows, L + t]`` where rows
        is n when sampling, 1 when greedy."""
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
        if watcher is not None:
            kwargs["stopping_criteria"] = StoppingCriteriaList([watcher])
        with torch.no_grad(), torch.random.fork_rng(devices=_rng_devices(self.device)), \
                _cpu_threads(self.config.cpu_threads if self.device.type == "cpu" else None):
            if seed is not None:
                torch.manual_seed(seed)
            return self.model.generate(input_ids=ids.to(self.device),
                                       attention_mask=attn.to(self.device), **kwargs)

    def _completions(self, resp: torch.Tensor, chunk: list[list[int]], first_index: int,
                     params: SamplingParams) -> list[Completion]:
        """Completions of ``chunk``'s rows ``resp`` ([B * rows, t] response tokens, padded
        after EOS), prompt-major; greedy rows (one per prompt) are repeated n times."""
        B, n = len(chunk), params.n
        if params.temperature <= 0:
            resp = resp.repeat_interleave(n, dim=0)  # [B * n, t]
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


class _ChunkWatcher(StoppingCriteria):
    """Streams finished chunks out of one ``generate`` batch: called by HF after every decoding
    step with the sequences so far, it marks rows whose newest token is an EOS (once: HF pads
    finished rows, and the pad may be an EOS id), and when every row of a chunk has stopped it
    calls ``finish(chunk, response tokens [rows, t])``. It never stops a row itself (HF's own
    EOS and length criteria do).

    Cost: one ``isin`` over the batch's last column per step; ``finish`` runs in the generating
    thread, so it must be cheap (the trainer's on_done pickles onto a socket).
    """

    def __init__(self, prompt_len: int, rows_per_chunk: list[int], eos_ids: Sequence[int],
                 finish: Callable[[int, torch.Tensor], None]) -> None:
        self.prompt_len = prompt_len
        starts = [sum(rows_per_chunk[:c]) for c in range(len(rows_per_chunk))]
        self.bounds = [(s, s + r) for s, r in zip(starts, rows_per_chunk)]
        self.eos = torch.tensor(list(eos_ids))
        self.finish = finish
        self.stopped: torch.Tensor | None = None  # [rows] bool
        self.open = set(range(len(rows_per_chunk)))  # chunks not handed over yet

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        last = input_ids[:, -1]  # [rows]
        hit = torch.isin(last, self.eos.to(last.device))  # [rows]
        self.stopped = hit if self.stopped is None else self.stopped | hit
        if hit.any():
            stopped = self.stopped.cpu()
            for c in sorted(self.open):
                lo, hi = self.bounds[c]
                if bool(stopped[lo:hi].all()):
                    self.open.discard(c)
                    self.finish(c, input_ids[lo:hi, self.prompt_len:].cpu())
        return torch.zeros_like(hit)  # [rows] never stops a row: observation only


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
