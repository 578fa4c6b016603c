"""`make gpu-check`: does the training stack run on this machine's accelerator, and how fast?

On a CUDA machine (docs/gpu.md), in a few minutes:

1. ``install``: the project and the wheels it misses, from ``--wheels DIR`` with
   ``pip install --no-index --find-links DIR`` (no network), against the machine's own torch
   (refused if pip would change it);
2. ``numerics``: one on-policy MAGIC update (TorchBackend, the tiny model of trainer/tiny.py, the
   batch of tests/ds_worker.py) on CUDA in float32 equals the CPU update, and bf16 autocast stays
   within a looser stated tolerance of float32 (tolerances: :data:`TOLERANCES`);
3. ``backends``: the update of a Qwen2-1.5B-shaped model (random weights, bf16, responses of 1K
   and 4K tokens) on TorchBackend and DeepSpeed ZeRO-2 and ZeRO-3 on one GPU, gradient
   checkpointing on and off: tokens/s, model FLOPs utilization against the GPU's dense bf16 peak,
   peak memory;
4. ``update_lengths``: the same model's update on long-tailed response lengths (issue 48:
   lognormal, mean about 4K tokens, cut at 16K), today's row split (``micro_batch_size`` 2)
   against token-budget packing (``max_tokens_per_micro_batch``, docs/magic.md "How a step is
   split"), interleaved: MFU counting only useful (real) tokens, computed over useful tokens,
   time per useful token, and the two splits' log-probs equal on the same weights;
5. ``engine``: the HF engine's generation tokens/s (and vLLM's when it imports);
6. ``trainer_run``: ``trainer run`` end to end in the math-only toy world (datasets/toyworld.py
   with ``--code-share 0``, a local verifier), 10 steps with a checkpoint and a ``--resume``,
   once per backend (torch, deepspeed ZeRO-3);

then writes one JSON (``--out``) and its section of docs/gpu.md (``--doc``).

Without CUDA (or with ``--device cpu``) the same phases run with tiny shapes as a smoke test,
in the suite (tests/test_gpu_check.py): nothing is installed, numerics compare the CPU update
with trainer/magic/reference_step.py's and bf16 with float32, MFU is not reported (no GPU peak to
divide by), peak memory is the process's peak RSS, and the JSON (``"gpu": false``) and the doc
say that no GPU was used.

Each phase is one function; a phase that fails records its error in the JSON and the others
still run. Exit status 1 if any phase failed, 0 otherwise.

    python scripts/gpu_check.py [--device auto|cpu|cuda] [--wheels DIR] [--quick]
                                [--out runs/gpu-check/gpu_check.json] [--doc docs/gpu.md]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make trainer/, verifier/ and tests/ importable
    sys.path.insert(0, str(ROOT))

SCHEMA = "gpu_check/1"
PHASES = ("install", "numerics", "backends", "update_lengths", "engine", "trainer_run")
DOC_BEGIN = "<!-- gpu-check:{kind}:begin -->"
DOC_END = "<!-- gpu-check:{kind}:end -->"

#: Tolerances of the numerics phase. The update is taken with tests.ds_worker.LINEAR's
#: eps-dominated AdamW, whose step IS the gradient, so these bound the error of the gradient.
#: ``max_rel``: max |dW_a - dW_b| / max |dW_b| over every weight (dW: the update's change);
#: ``rel_l2``: ||dW_a - dW_b|| / ||dW_b||; ``metric_rel``: relative error of the update's entropy
#: and grad-norm metrics.
TOLERANCES: dict[str, dict[str, float]] = {
    # the same float32 arithmetic in another order (another device, another kernel):
    # float32's unit roundoff is 6e-8, summed over a few thousand terms.
    "float32": {"max_rel": 1e-4, "rel_l2": 1e-4, "metric_rel": 1e-4},
    # bf16 autocast against float32: bf16 keeps 8 significant bits (unit roundoff 3.9e-3), so
    # every matmul input is rounded at ~0.4%. Measured on the CPU: 5e-3 on both measures, 2e-3
    # on the grad norm; the limits leave 4-10x for other kernels (CUDA's) and summation orders.
    "bfloat16": {"max_rel": 0.05, "rel_l2": 0.02, "metric_rel": 0.01},
}

#: Dense (no sparsity) bf16 tensor-core peaks, TFLOPS, from the vendor's data sheets, matched as
#: substrings of torch.cuda.get_device_name() in this order (the more specific names first).
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.0), ("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0),
    ("H100", 989.0), ("H800", 989.0), ("B200", 2250.0), ("A100", 312.0), ("A800", 312.0),
    ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0),
)

#: A Qwen2-1.5B-shaped model (Qwen/Qwen2-1.5B's config.json), random weights.
QWEN2_1_5B = {"hidden_size": 1536, "layers": 28, "heads": 12, "kv_heads": 2,
              "intermediate_size": 8960, "vocab_size": 151936, "max_positions": 32768}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big each phase is. ``cuda``: the real measurement; ``cpu``: a smoke test with tiny
    shapes; ``quick``: the tiniest, for the test suite."""

    model: dict[str, int] | None  # the bench model's shape; None: trainer/tiny.py's default
    prompt: int  # prompt tokens per row of the bench batch
    lengths: tuple[int, ...]  # response lengths measured (tokens)
    tokens_per_micro_batch: int  # micro-batch rows = max(1, this // (prompt + length))
    micro_batches: int  # micro-batches per update (gradient accumulation)
    repeats: int  # timed updates after one warm-up update
    gen_prompts: int
    gen_n: int
    gen_tokens: int
    run_steps: int  # `trainer run` steps in all (a checkpoint, then --resume for the rest)
    tail_rows: int = 32  # update_lengths: rows of one update
    tail_median: int = 2900  # their response lengths: lognormal, this median, sigma 0.8 ...
    tail_cut: int = 16384  # ... cut at this limit


SIZES = {
    "cuda": Sizes(QWEN2_1_5B, prompt=256, lengths=(1024, 4096), tokens_per_micro_batch=16384,
                  micro_batches=2, repeats=2, gen_prompts=16, gen_n=4, gen_tokens=1024,
                  run_steps=10, tail_rows=32, tail_median=2900, tail_cut=16384),
    "cpu": Sizes(None, prompt=16, lengths=(32, 96), tokens_per_micro_batch=256, micro_batches=2,
                 repeats=2, gen_prompts=4, gen_n=4, gen_tokens=32, run_steps=3, tail_rows=16,
                 tail_median=48, tail_cut=160),
    "quick": Sizes({"hidden_size": 32, "layers": 1, "heads": 2, "kv_heads": 1,
                    "intermediate_size": 64},
                   prompt=8, lengths=(16,), tokens_per_micro_batch=48, micro_batches=2,
                   repeats=1, gen_prompts=2, gen_n=2, gen_tokens=8, run_steps=3, tail_rows=8,
                   tail_median=12, tail_cut=40),
}


class CheckFailed(Exception):
    """A phase ran but a check failed; ``data`` keeps what it measured."""

    def __init__(self, message: str, data: dict[str, Any]):
        super().__init__(message)
        self.data = data


class Skipped(Exception):
    """A phase that does not apply here; the message says why."""


@dataclasses.dataclass
class Context:
    args: argparse.Namespace
    cuda: bool
    sizes: Sizes
    work: Path  # scratch folder (models, data, runs)
    _tiny: Path | None = None
    _bench: Path | None = None

    @property
    def device(self) -> str:
        return "cuda" if self.cuda else "cpu"

    def tiny_model(self) -> Path:
        """trainer/tiny.py's default tiny model (the numerics model), saved once."""
        if self._tiny is None:
            from trainer.tiny import save_tiny

            self._tiny = save_tiny(self.work / "tiny")
        return self._tiny

    def bench_model(self) -> Path:
        """The bench model: the Qwen2-1.5B shape on CUDA, a tiny one on CPU; random weights,
        saved in HF format with the tiny tokenizer (ids beyond its vocabulary decode to
        nothing, which is all the engine needs)."""
        if self._bench is None:
            import torch

            from trainer.tiny import save_tiny

            shape = dict(self.sizes.model or {})
            vocab = shape.pop("vocab_size", None)
            # a real vocabulary's output layer, stored in bf16 (half the bytes to write and
            # read; the backends load float32)
            self._bench = save_tiny(self.work / "bench", vocab_size=vocab,
                                    save_dtype=torch.bfloat16 if vocab else None, **shape)
        return self._bench


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _release() -> None:
    """Between measurements: collect garbage and hand cached CUDA blocks back."""
    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _reset_peak(cuda: bool) -> None:
    import torch

    if cuda:
        torch.cuda.reset_peak_memory_stats()
        return
    # Linux: writing 5 to clear_refs resets the process's peak RSS (VmHWM) to its current RSS.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_memory(cuda: bool) -> dict[str, Any]:
    """CUDA: torch.cuda.max_memory_allocated (and reserved) since the last reset. CPU: the
    process's peak RSS (VmHWM, reset before each measurement where Linux allows it; else the
    peak since the process started, ru_maxrss)."""
    import torch

    gib = 2**30
    if cuda:
        return {"peak_memory_gib": torch.cuda.max_memory_allocated() / gib,
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / gib,
                "memory_kind": "torch.cuda.max_memory_allocated"}
    with contextlib.suppress(OSError, ValueError, StopIteration):
        line = next(x for x in Path("/proc/self/status").read_text().splitlines()
                    if x.startswith("VmHWM:"))
        return {"peak_memory_gib": int(line.split()[1]) * 1024 / gib,
                "memory_kind": "process peak RSS (VmHWM, reset per measurement)"}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"peak_memory_gib": rss / gib, "memory_kind": "process max RSS since start"}


def _weights(backend) -> dict[str, Any]:
    return {n: t.detach().to("cpu", copy=True).double() for n, t in backend.named_weights()}


def compare_updates(a_before: dict, a_after: dict, b_before: dict, b_after: dict
                    ) -> dict[str, float]:
    """How far update a's weight change is from update b's (b is the reference)."""
    import torch

    assert a_after.keys() == b_after.keys(), "the two models' parameters differ"
    diff_sq = ref_sq = 0.0
    diff_max = ref_max = 0.0
    for k in b_after:
        da = a_after[k] - a_before[k]
        db = b_after[k] - b_before[k]
        diff_sq += float(torch.sum((da - db) ** 2))
        ref_sq += float(torch.sum(db ** 2))
        diff_max = max(diff_max, float((da - db).abs().max()))
        ref_max = max(ref_max, float(db.abs().max()))
    return {"max_rel": diff_max / ref_max if ref_max else float("inf"),
            "rel_l2": (diff_sq / ref_sq) ** 0.5 if ref_sq else float("inf"),
            "update_max_abs": ref_max}


def _metric_rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def peak_tflops(device_name: str, override: float | None) -> tuple[float | None, str]:
    """(dense bf16 peak in TFLOPS, where it came from); None when unknown."""
    if override is not None:
        return override, "--peak-tflops"
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops, f"table entry {key!r} (dense bf16)"
    return None, (f"no dense bf16 peak known for {device_name!r}: pass --peak-tflops to "
                  "report MFU")


# ---------------------------------------------------------------------------------------------
# Phase 1: install
# ---------------------------------------------------------------------------------------------

#: Modules the phases import (module level of trainer.cli, verifier.cli and the backends) that
#: a CUDA machine's image may lack, with the distribution that provides each.
NEEDED_MODULES = {"deepspeed": "deepspeed", "math_verify": "math-verify", "tyro": "tyro",
                  "grpc": "grpcio", "grpc_health": "grpcio-health-checking",
                  "grpc_reflection": "grpcio-reflection", "google.protobuf": "protobuf",
                  "yaml": "pyyaml", "rich": "rich", "matplotlib": "matplotlib", "scipy": "scipy",
                  "pythonjsonlogger": "python-json-logger",
                  "prometheus_client": "prometheus_client", "aiohttp": "aiohttp"}


def _missing() -> list[str]:
    importlib.invalidate_caches()
    out = []
    for mod, pkg in NEEDED_MODULES.items():
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:  # a dotted name whose parent package is absent
            found = False
        if not found:
            out.append(pkg)
    return out


def _pip(args: list[str], constraints: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "-c", str(constraints), *args]
    env = {**os.environ, "DS_BUILD_OPS": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)


def phase_install(ctx: Context) -> dict[str, Any]:
    """CUDA only, offline: every wheel in ``--wheels DIR`` (but torch's), then the project
    itself (editable, no dependencies), with ``pip install --no-index --find-links DIR`` and
    torch pinned by a constraint to the machine's own version, so pip can never replace it.
    Then every module the phases import must be importable."""
    if not ctx.cuda:
        raise Skipped("no GPU: nothing is installed on CPU (this checkout's environment, set up "
                      "by `make setup`, is used as it is)")
    import torch

    missing = _missing()
    if ctx.args.wheels is None:
        if missing:
            raise CheckFailed(f"missing {', '.join(missing)} and no --wheels DIR to install "
                              "them from", {"missing": missing})
        raise Skipped("no --wheels DIR given, and nothing the checks import is missing")
    wheels = Path(ctx.args.wheels).resolve()
    if not wheels.is_dir():
        raise CheckFailed(f"--wheels {wheels} is not a directory", {"missing": missing})
    constraints = ctx.work / "constraints.txt"
    # The installed distribution's version, not torch.__version__: a CUDA image's torch can say
    # "2.11.0+cu130" while its metadata says "2.11.0", and pip, which resolves against the
    # metadata, then finds no torch to satisfy the pin (seen on the H200, 2026-11-26).
    constraints.write_text(f"torch=={importlib.metadata.version('torch')}\n")
    # torch's stack is the machine's; setuptools and wheel are the project's build backend, found
    # through --find-links by the build, not installed (the machine's torch pins setuptools<82,
    # and installing a newer one beside it made the whole resolve fail on the H200).
    files = sorted(str(f) for f in wheels.glob("*.whl")
                   if not f.name.lower().startswith(("torch-", "nvidia_", "triton-",
                                                     "setuptools-", "wheel-")))
    data: dict[str, Any] = {"wheels": [Path(f).name for f in files], "missing_before": missing,
                            "torch_before": torch.__version__, "steps": []}
    find = ["--find-links", str(wheels)]
    steps = ([("wheels", [*find, *files])] if files else []) + [
        # the build backend (setuptools) comes from DIR too: build isolation honours --no-index
        ("project", [*find, "--no-deps", "-e", str(ROOT)])]
    failed = []
    for name, args in steps:
        proc = _pip(args, constraints)
        data["steps"].append({"step": name, "returncode": proc.returncode,
                              "output_tail": (proc.stdout + proc.stderr)[-2000:]})
        if proc.returncode != 0:
            failed.append(f"pip install of the {name} failed (exit {proc.returncode})")
    after = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True).stdout.strip()
    data["torch_after"] = after
    data["missing_after"] = still = _missing()
    if after != torch.__version__:
        failed.append(f"torch changed from {torch.__version__} to {after}")
    if still:
        failed.append(f"still missing: {', '.join(still)}")
    if failed:
        raise CheckFailed("; ".join(failed), data)
    return data


# ---------------------------------------------------------------------------------------------
# Phase 2: numerics
# ---------------------------------------------------------------------------------------------

def _torch_update(model: Path, dtype: str, device: str) -> tuple[dict, dict, dict[str, float]]:
    """One on-policy MAGIC update of TorchBackend in ``dtype`` on ds_worker's batch, under
    ds_worker's LINEAR optimizer: (before, after, metrics)."""
    import torch

    from tests.ds_worker import LINEAR, make_batch
    from trainer.backends import BackendConfig
    from trainer.backends.torch_backend import TorchBackend
    from trainer.interfaces import LossSettings, UpdatePlan

    batch, _, adv = make_batch()
    backend = TorchBackend(BackendConfig(dtype=dtype), model, LINEAR, device=device)
    before = _weights(backend)
    metrics = backend.update(batch, None, adv, UpdatePlan([torch.arange(len(batch))], 3),
                             LossSettings(clip_low=0.2, clip_high=0.28, entropy_coef=0.01))
    after = _weights(backend)
    backend.close()
    del backend
    _release()
    return before, after, metrics


def _reference_update(model: Path, optimizer) -> tuple[dict, dict, dict[str, float]]:
    """trainer/reference_step.update (plain torch, one file) on the same batch, on the CPU."""
    import torch

    from tests.ds_worker import make_batch
    from trainer.magic import reference_step as ref
    from trainer.backends.common import adamw_kwargs
    from trainer.backends.loading import load_causal_lm

    batch, _, adv = make_batch()
    net = load_causal_lm(model)
    before = {n: p.detach().clone().double() for n, p in net.named_parameters()}
    opt = torch.optim.AdamW(net.parameters(), **adamw_kwargs(optimizer))
    s = ref.StepSettings(clip_low=0.2, clip_high=0.28, grad_clip=optimizer.grad_clip)
    metrics = ref.update(net, opt, batch.input_ids, batch.attention_mask, batch.response_mask,
                         adv, s, 0.01)
    after = {n: p.detach().clone().double() for n, p in net.named_parameters()}
    return before, after, metrics


def _check(name: str, a, b, kind: str, problems: list[str]) -> dict[str, Any]:
    """Compare update ``a`` with reference ``b`` under TOLERANCES[kind]; note violations."""
    tol = TOLERANCES[kind]
    got = compare_updates(a[0], a[1], b[0], b[1])
    for key in ("entropy", "grad_norm"):
        got[f"{key}_rel"] = _metric_rel(a[2][key], b[2][key])
    limits = {"max_rel": tol["max_rel"], "rel_l2": tol["rel_l2"],
              "entropy_rel": tol["metric_rel"], "grad_norm_rel": tol["metric_rel"]}
    bad = [f"{k} {got[k]:.3g} > {v:g}" for k, v in limits.items() if not got[k] <= v]
    if got["update_max_abs"] < 1e-3:
        bad.append(f"the reference update moved no weight (max {got['update_max_abs']:.3g})")
    if bad:
        problems.append(f"{name}: " + ", ".join(bad))
    return {**got, "tolerance": limits, "kind": kind, "passed": not bad}


def phase_numerics(ctx: Context) -> dict[str, Any]:
    """One on-policy MAGIC update (LINEAR AdamW: the step is the gradient) compared: CPU
    float32 TorchBackend with trainer/reference_step.update; on CUDA, the CUDA float32 update
    with the CPU one and CUDA bf16 autocast with CUDA float32; on CPU, CPU bf16 with CPU
    float32 (BackendConfig.dtype='bfloat16': autocast over float32 master weights)."""
    import torch

    from tests.ds_worker import LINEAR

    model = ctx.tiny_model()
    problems: list[str] = []
    checks: dict[str, Any] = {}
    cpu32 = _torch_update(model, "float32", "cpu")
    checks["cpu_fp32_vs_reference_step"] = _check(
        "cpu float32 vs reference_step", cpu32, _reference_update(model, LINEAR), "float32",
        problems)
    if ctx.cuda:
        cuda32 = _torch_update(model, "float32", "cuda")
        checks["cuda_fp32_vs_cpu_fp32"] = _check("cuda float32 vs cpu float32", cuda32, cpu32,
                                                 "float32", problems)
        checks["cuda_bf16_vs_cuda_fp32"] = _check(
            "cuda bf16 vs cuda float32", _torch_update(model, "bfloat16", "cuda"), cuda32, "bfloat16",
            problems)
    else:
        checks["cpu_bf16_vs_cpu_fp32"] = _check(
            "cpu bf16 vs cpu float32", _torch_update(model, "bfloat16", "cpu"), cpu32, "bfloat16",
            problems)
    data = {"model": "trainer/tiny.py save_tiny (default shape)",
            "batch": "tests/ds_worker.py make_batch (8 rows), one mini-batch, micro-batch 3",
            "optimizer": "tests.ds_worker.LINEAR (eps-dominated AdamW: the step is the gradient)",
            "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "compile": ("BackendConfig.compile='auto': the CUDA updates ran compiled (and with "
                        "the fused AdamW), the CPU ones not") if ctx.cuda else
                       "BackendConfig.compile='auto': off on the CPU",
            "checks": checks}
    if problems:
        raise CheckFailed("; ".join(problems), data)
    return data


# ---------------------------------------------------------------------------------------------
# Phase 3: the training backends
# ---------------------------------------------------------------------------------------------

def bench_batch(vocab: int, rows: int, prompt: int, response: int, seed: int = 0):
    """``rows`` full-length sequences (no padding) of random tokens: ``prompt`` + ``response``;
    advantages of mixed sign. Returns (TokenBatch, advantages [rows])."""
    import torch

    from trainer.interfaces import TokenBatch

    g = torch.Generator().manual_seed(seed)
    length = prompt + response
    ids = torch.randint(4, vocab, (rows, length), generator=g)  # [B, L]
    attn = torch.ones_like(ids)  # [B, L]
    resp = torch.zeros(rows, length - 1, dtype=torch.bool)  # [B, L-1]
    resp[:, prompt - 1:] = True
    adv = torch.randn(rows, generator=g)  # [B]
    return TokenBatch(ids, attn, resp), adv


def _bench_configs(ctx: Context) -> list[tuple[str, Any]]:
    from trainer.backends import BackendConfig

    dtype = "bfloat16" if ctx.cuda else "float32"
    out = []
    # torch with compile off and, on CUDA, on (BackendConfig.compile; 'auto' picks on for
    # CUDA). Not on the CPU: ~25 s of compilation per row for a smoke test, and the compiled
    # path's CPU equality is tests/test_backends_compile.py's. deepspeed never compiles.
    torch_modes = ("off", "on") if ctx.cuda else ("off",)
    for kind, stage, compile_ in (*(("torch", 0, m) for m in torch_modes),
                                  ("deepspeed", 2, "off"), ("deepspeed", 3, "off")):
        for ckpt in (False, True):
            name = (("torch" + (" +compile" if compile_ == "on" else "")) if kind == "torch"
                    else f"zero{stage}") + (" +gc" if ckpt else "")
            out.append((name, BackendConfig(kind=kind, zero_stage=stage, dtype=dtype,
                                            gradient_checkpointing=ckpt, compile=compile_)))
    return out


def _measure_backend(ctx: Context, config, model: Path, n_params: int, vocab: int,
                     peak: float | None) -> list[dict[str, Any]]:
    """Build the backend once, then per response length: a warm-up update and ``repeats``
    timed ones."""
    import torch

    from trainer.backends import create_backend
    from trainer.interfaces import LossSettings, UpdatePlan

    s = ctx.sizes
    backend = create_backend(config, model)
    rows_out = []
    try:
        for length in s.lengths:
            seq = s.prompt + length
            mbs = max(1, s.tokens_per_micro_batch // seq)
            rows = mbs * s.micro_batches
            batch, adv = bench_batch(vocab, rows, s.prompt, length)
            plan = UpdatePlan([torch.arange(rows)], micro_batch_size=mbs)
            loss = LossSettings(clip_low=0.2, clip_high=0.28, entropy_coef=0.0)
            _release()
            _reset_peak(ctx.cuda)
            backend.update(batch, None, adv, plan, loss)  # warm-up (allocator, kernels)
            _sync()
            t0 = time.perf_counter()
            for _ in range(s.repeats):
                metrics = backend.update(batch, None, adv, plan, loss)
            _sync()
            seconds = (time.perf_counter() - t0) / s.repeats
            tokens = rows * seq
            tps = tokens / seconds
            row = {"response_tokens": length, "prompt_tokens": s.prompt, "rows": rows,
                   "micro_batch_size": mbs, "tokens_per_update": tokens,
                   "seconds_per_update": seconds, "tokens_per_s": tps,
                   "grad_norm": metrics["grad_norm"], **_peak_memory(ctx.cuda)}
            if ctx.cuda and peak:
                row["mfu"] = 6.0 * n_params * tps / (peak * 1e12)
            rows_out.append(row)
    finally:
        backend.close()
        del backend
        _release()
    return rows_out


def phase_backends(ctx: Context) -> dict[str, Any]:
    """TorchBackend, DeepSpeed ZeRO-2 and ZeRO-3 (a world of one) with gradient checkpointing
    off and on: tokens/s of an on-policy update (one optimizer step, ``micro_batches``
    micro-batches), MFU = 6 x params x tokens/s / peak (CUDA only), peak memory."""
    import torch
    from transformers import AutoConfig

    model = ctx.bench_model()
    cfg = AutoConfig.from_pretrained(str(model))
    n_params = _parameters(cfg)
    data: dict[str, Any] = {
        "model": {"hidden_size": cfg.hidden_size, "layers": cfg.num_hidden_layers,
                  "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
                  "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
                  "parameters": n_params,
                  "shape": "Qwen2-1.5B" if ctx.sizes.model == QWEN2_1_5B else "tiny"},
        "dtype": "bfloat16" if ctx.cuda else "float32",
        "loss": "on-policy MAGIC update (old log-probs from the training forward), entropy "
                "as a detached metric (entropy_coef 0), one AdamW step",
    }
    peak = _mfu_peak(ctx, data)
    results: dict[str, Any] = {}
    problems = []
    for name, config in _bench_configs(ctx):
        try:
            results[name] = {"ok": True, "rows": _measure_backend(
                ctx, config, model, n_params, cfg.vocab_size, peak)}
        except Exception as e:  # one configuration's failure (say an OOM) spares the others
            _release()
            results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc()[-3000:]}
            problems.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
        if ctx.cuda:
            results[name]["allocated_after_close_gib"] = torch.cuda.memory_allocated() / 2**30
    data["results"] = results
    if problems:
        raise CheckFailed("; ".join(problems), data)
    return data


def _parameters(cfg: Any) -> int:
    """Parameters of the model ``cfg`` describes (built on the meta device: no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())


def _mfu_peak(ctx: Context, data: dict[str, Any]) -> float | None:
    """The bf16 peak MFU divides by (CUDA only; None on the CPU), with its source and the
    formula written into ``data``."""
    if not ctx.cuda:
        data["mfu"] = ("not reported: no GPU, so no bf16 tensor-core peak to divide by (a CPU "
                       "float32 MFU would say nothing about the GPU path)")
        return None
    import torch

    peak, source = peak_tflops(torch.cuda.get_device_name(), ctx.args.peak_tflops)
    data["peak_tflops"], data["peak_source"] = peak, source
    data["mfu_formula"] = ("6 x parameters x tokens/s / peak (the 6N rule: attention "
                           "scores and gradient-checkpointing recompute not counted)")
    return peak


# ---------------------------------------------------------------------------------------------
# Phase 3b: the update at real response lengths
# ---------------------------------------------------------------------------------------------

def tail_batch(vocab: int, s: Sizes, seed: int = 0):
    """``s.tail_rows`` rows of ``s.prompt`` prompt tokens and long-tailed response lengths
    (:func:`trainer.backends.packing.lognormal_lengths`: median ``s.tail_median``, sigma 0.8,
    cut at ``s.tail_cut``), right-padded; advantages of mixed sign. (TokenBatch, adv [rows])."""
    import torch

    from trainer.backends.packing import lognormal_lengths
    from trainer.interfaces import Completion, TokenBatch

    g = torch.Generator().manual_seed(seed)
    comps = [Completion(i, 0, torch.randint(4, vocab, (s.prompt,), generator=g).tolist(),
                        torch.randint(4, vocab, (n,), generator=g).tolist(), "", n >= s.tail_cut)
             for i, n in enumerate(lognormal_lengths(s.tail_rows, s.tail_median, 0.8,
                                                     s.tail_cut, seed))]
    return TokenBatch.from_completions(comps, pad_id=0), torch.randn(s.tail_rows, generator=g)


def phase_update_lengths(ctx: Context) -> dict[str, Any]:
    """One on-policy update on long-tailed response lengths (issue 48: the 1.5B shape on CUDA,
    mean about 4K tokens, cut at 16K), today's row split (``micro_batch_size`` 2) against
    token-budget packing (budget: the row split's largest micro-batch, 2 x (prompt + cut)),
    interleaved: seconds, useful tokens/s (real prompt + response tokens only), computed over
    useful tokens, and MFU counting useful tokens only (CUDA). Checks the two give the same
    update (grad norm, entropy)."""
    import torch
    from transformers import AutoConfig

    from trainer.backends import BackendConfig, create_backend
    from trainer.interfaces import LossSettings, UpdatePlan

    s = ctx.sizes
    model = ctx.bench_model()
    cfg = AutoConfig.from_pretrained(str(model))
    n_params = _parameters(cfg)
    batch, adv = tail_batch(cfg.vocab_size, s)
    useful = int(batch.attention_mask.sum())
    budget = 2 * (s.prompt + s.tail_cut)
    data: dict[str, Any] = {
        "rows": s.tail_rows, "prompt_tokens": s.prompt, "useful_tokens": useful,
        "mean_response_tokens": (useful - s.tail_rows * s.prompt) / s.tail_rows,
        "response_limit": s.tail_cut, "cut_rows": int(sum(
            int(batch.response_mask[i].sum()) >= s.tail_cut for i in range(len(batch)))),
        "row_split_micro_batch_size": 2, "max_tokens_per_micro_batch": budget,
        "dtype": "bfloat16" if ctx.cuda else "float32", "gradient_checkpointing": ctx.cuda}
    peak = _mfu_peak(ctx, data)
    config = BackendConfig(dtype=data["dtype"], gradient_checkpointing=ctx.cuda, compile="off")
    backend = create_backend(config, model)
    plans = {"row_split": UpdatePlan([torch.arange(len(batch))], 2),
             "packed": UpdatePlan([torch.arange(len(batch))], 10**6, budget)}
    loss = LossSettings(clip_low=0.2, clip_high=0.28)
    seconds: dict[str, list[float]] = {k: [] for k in plans}
    metrics: dict[str, dict[str, float]] = {}
    try:
        # Same weights, both splits: the log-probs agree (float32: to rounding; bf16: to its
        # precision, as a mean), else packing is wrong here (a row seeing another, say).
        padded = backend.logprobs(batch, 2, response_only=True)[batch.response_mask]  # [n]
        packed = backend.logprobs(batch, 2, response_only=True,
                                  max_tokens_per_micro_batch=budget)[batch.response_mask]
        diff = (packed - padded).abs()  # [n]
        data["logprob_abs_diff"] = {"max": float(diff.max()), "mean": float(diff.mean())}
        if not (float(diff.mean()) <= 0.02 if ctx.cuda else float(diff.max()) <= 1e-4):
            raise CheckFailed(f"packed and row-split log-probs differ: {data['logprob_abs_diff']}",
                              data)
        for k, plan in plans.items():  # warm-up, and the update both must equal
            metrics[k] = backend.update(batch, None, adv, plan, loss)
        for r in range(s.repeats):
            for k in (list(plans) if r % 2 == 0 else list(plans)[::-1]):  # interleaved
                _release()
                _sync()
                t0 = time.perf_counter()
                backend.update(batch, None, adv, plans[k], loss)
                _sync()
                seconds[k].append(time.perf_counter() - t0)
    finally:
        backend.close()
        del backend
        _release()
    out: dict[str, Any] = {}
    for k in plans:
        sec = statistics.median(seconds[k])
        out[k] = {"seconds_per_update": sec, "useful_tokens_per_s": useful / sec,
                  "computed_over_useful": metrics[k]["update/computed_over_real_tokens"]}
        if peak:
            out[k]["mfu_useful"] = 6.0 * n_params * useful / sec / (peak * 1e12)
    data["results"] = out
    data["time_per_useful_token_ratio"] = (out["packed"]["seconds_per_update"]
                                           / out["row_split"]["seconds_per_update"])
    return data


# ---------------------------------------------------------------------------------------------
# Phase 4: the rollout engines
# ---------------------------------------------------------------------------------------------

def _generation_rate(kind: str, model: Path, ctx: Context) -> dict[str, Any]:
    """``gen_prompts`` random prompts x ``gen_n`` samples of up to ``gen_tokens`` tokens at
    temperature 1, after a small warm-up call: generated tokens per second."""
    import torch

    from trainer.engines import EngineConfig, create_engine
    from trainer.hf_utils import load_tokenizer
    from trainer.interfaces import SamplingParams

    s = ctx.sizes
    tok = load_tokenizer(model)
    extra: dict[str, Any] = {"enforce_eager": not ctx.cuda} if kind == "vllm" else {
        "one_batch": True, "chunk_size": s.gen_prompts}
    dtype = "bfloat16" if ctx.cuda else "float32"
    engine = create_engine(EngineConfig(kind=kind, dtype=dtype, **extra), model, tok)
    try:
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(4, len(tok), (16,), generator=g).tolist()
                   for _ in range(s.gen_prompts)]
        engine.generate(prompts[:1], SamplingParams(n=1, max_tokens=4, seed=0))  # warm-up
        _sync()
        t0 = time.perf_counter()
        out = engine.generate(prompts, SamplingParams(n=s.gen_n, max_tokens=s.gen_tokens,
                                                      seed=1))
        _sync()
        seconds = time.perf_counter() - t0
    finally:
        engine.close()
        del engine
        _release()
    tokens = sum(len(c.token_ids) for c in out)
    return {"prompts": s.gen_prompts, "n": s.gen_n, "max_tokens": s.gen_tokens, "dtype": dtype,
            "completions": len(out), "generated_tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds}


def phase_engine(ctx: Context) -> dict[str, Any]:
    """The HF engine's generation rate on the bench model; vLLM's too when it imports and
    (on CPU, where its start-up takes minutes) ``--vllm`` asks for it."""
    model = ctx.bench_model()
    data: dict[str, Any] = {"hf": _generation_rate("hf", model, ctx)}
    try:
        import vllm  # noqa: F401  (only: is it there?)

        version = getattr(sys.modules["vllm"], "__version__", "?")
    except Exception as e:  # ImportError, or a broken install that fails while importing
        data["vllm"] = {"available": False,
                        "note": f"vLLM was not available: {type(e).__name__}: {e}"[:500]}
        return data
    if ctx.cuda or ctx.args.vllm:
        data["vllm"] = {"available": True, "version": version,
                        **_generation_rate("vllm", model, ctx)}
    else:
        data["vllm"] = {"available": True, "version": version,
                        "note": "not measured: vLLM's CPU start-up takes minutes (--vllm)"}
    return data


# ---------------------------------------------------------------------------------------------
# Phase 5: `trainer run` end to end
# ---------------------------------------------------------------------------------------------

def _toyworld() -> Any:
    """datasets/toyworld.py (datasets/ is no package: it would shadow Hugging Face's)."""
    spec = importlib.util.spec_from_file_location("toyworld", ROOT / "datasets" / "toyworld.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_overrides(ctx: Context, data: Path, out: Path, name: str, kind: str,
                   steps: int) -> list[str]:
    """demo.yaml made small and math-only; every step updates (no online filter, a fixed
    entropy bonus: a random policy solves nothing, so its advantages are all 0)."""
    stage = 3 if kind == "deepspeed" else 0
    kv = {
        "name": name, "output_dir": str(out), "total_steps": steps, "seed": 0,
        "checkpoint_every": steps, "keep_checkpoints": 3, "micro_batch_size": 8,
        "torch_threads": 0 if ctx.cuda else 1,
        "tiny_model.hidden_size": 32, "tiny_model.layers": 1, "tiny_model.heads": 2,
        "tiny_model.kv_heads": 1, "tiny_model.intermediate_size": 64, "warm_start.steps": 0,
        "magic.prompts_per_step": 2, "magic.group_size": 2, "magic.max_prompt_length": 64,
        "magic.online_filter": "false", "magic.entropy_mode": "fixed",
        "magic.entropy_coef_init": 0.01, "magic.entropy_coef_max": 0.01,
        "magic.stages": "[{name: a, max_response_length: 8}]",
        "eval.every_steps": 0, "log.progress": "off", "log.tensorboard": "false",
        "log.plots": "false", "log.samples_every": 0,
        "data.train_files": f"[{data / 'train.jsonl'}]",
        "data.eval_files": f"[{data / 'eval.jsonl'}]",
        "backend.kind": kind, "backend.zero_stage": stage,
        "backend.dtype": "bfloat16" if ctx.cuda else "float32",
    }
    if ctx.cuda:  # the 7B recipe's shape of a step, scaled down, on the GPU
        kv.update({"tiny_model.hidden_size": 256, "tiny_model.layers": 4,
                   "tiny_model.heads": 4, "tiny_model.kv_heads": 2,
                   "tiny_model.intermediate_size": 1024, "magic.prompts_per_step": 8,
                   "magic.group_size": 4, "micro_batch_size": 16,
                   "magic.stages": "[{name: a, max_response_length: 64}]"})
    return [f"{k}={v}" for k, v in kv.items()]


def _trainer_cli(args: list[str], in_process: bool) -> tuple[int, str]:
    """`trainer run ARGS`: in this process (the CPU form: no second start-up of torch) or as a
    child process (the CUDA form, as a user runs it). Returns (exit code, output tail)."""
    if in_process:
        from trainer import cli

        try:
            return int(cli.main(["run", *args])), ""
        except SystemExit as e:  # tyro's and cmd_run's usage errors
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 2
            return code, str(e.code)
    proc = subprocess.run([sys.executable, "-m", "trainer.cli", "run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    return proc.returncode, (proc.stdout[-1500:] + proc.stderr[-3000:])


def _one_run(ctx: Context, kind: str, data: Path, out: Path, addr: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    steps = ctx.sizes.run_steps if ctx.args.steps is None else ctx.args.steps
    first = max(1, steps * 2 // 3)
    in_process = ctx.args.trainer_in_process
    t0 = time.perf_counter()
    rc, tail = _trainer_cli(["--config", str(ROOT / "trainer" / "configs" / "demo.yaml"),
                             "--verifier-addr", addr,
                             *_run_overrides(ctx, data, out, kind, kind, first)], in_process)
    res: dict[str, Any] = {"steps": steps, "checkpoint_step": first, "first_rc": rc,
                           "first_seconds": time.perf_counter() - t0}
    if rc != 0:
        raise RuntimeError(f"`trainer run` exited {rc}: {tail[-1500:]}")
    run = out / kind
    t0 = time.perf_counter()
    rc, tail = _trainer_cli(["--resume", str(run), "--verifier-addr", addr,
                             f"total_steps={steps}"], in_process)
    res.update(resume_rc=rc, resume_seconds=time.perf_counter() - t0)
    if rc != 0:
        raise RuntimeError(f"`trainer run --resume` exited {rc}: {tail[-1500:]}")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "reward/mean" in r]
    latest = (run / "checkpoints" / "latest").read_text().strip()
    w0 = load_file(str(run / "checkpoints" / f"step_{first:06d}" / "model" / "model.safetensors"))
    w1 = load_file(str(run / "checkpoints" / latest / "model" / "model.safetensors"))
    moved = max(float((w1[k].float() - w0[k].float()).abs().max()) for k in w0)
    res.update(logged_steps=[r["step"] for r in rows], latest_checkpoint=latest,
               updates=sum(1 for r in rows if not r.get("update/skipped")),
               reward_mean=[r["reward/mean"] for r in rows],
               weights_moved_after_resume=moved,
               step_seconds=[r.get("time/step") for r in rows])
    problems = []
    if res["logged_steps"] != list(range(1, steps + 1)):
        problems.append(f"logged steps {res['logged_steps']}, want 1..{steps}")
    if latest != f"step_{steps:06d}":
        problems.append(f"latest checkpoint {latest}, want step_{steps:06d}")
    if res["updates"] != steps:
        problems.append(f"{steps - res['updates']} steps skipped their update")
    if not moved > 0:
        problems.append("the weights did not move after the resume")
    if problems:
        raise CheckFailed("; ".join(problems), res)
    return res


def phase_trainer_run(ctx: Context) -> dict[str, Any]:
    """The toy world (math only, level 2), one local verifier for all runs; per backend a run
    to 2/3 of the steps (checkpointed) and a --resume to the end."""
    from verifier.client.local import LocalVerifier

    data = ctx.work / "toyworld"
    rc = _toyworld().main(["--out", str(data), "--train", "64", "--eval", "8", "--levels", "2",
                           "--code-share", "0", "--verbose-share", "0", "--seed", "0"])
    if rc != 0:
        raise RuntimeError(f"datasets/toyworld.py exited {rc}")
    out = ctx.work / "runs"
    result: dict[str, Any] = {"data": "datasets/toyworld.py --levels 2 --code-share 0",
                              "mode": "in-process" if ctx.args.trainer_in_process
                              else "subprocess", "runs": {}}
    problems = []
    with LocalVerifier(workers=1) as verifier:
        result["verifier_sandbox_problem"] = verifier.sandbox_problem
        for kind in ("torch", "deepspeed"):
            try:
                result["runs"][kind] = {"ok": True, **_one_run(ctx, kind, data, out,
                                                                verifier.address)}
            except CheckFailed as e:
                result["runs"][kind] = {"ok": False, "error": str(e), **e.data}
                problems.append(f"{kind}: {e}")
            except Exception as e:
                result["runs"][kind] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:3000],
                                        "traceback": traceback.format_exc()[-3000:]}
                problems.append(f"{kind}: {type(e).__name__}: {str(e)[:300]}")
            _release()
    if problems:
        raise CheckFailed("; ".join(problems), result)
    return result


# ---------------------------------------------------------------------------------------------
# The report: machine, JSON, docs/gpu.md
# ---------------------------------------------------------------------------------------------

def machine_info(cuda: bool) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                            "python": platform.python_version()}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        info.update(device_name=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                    device_memory_gib=props.total_memory / 2**30,
                    capability=".".join(map(str, torch.cuda.get_device_capability(0))))
    else:
        info["device_name"] = f"CPU only ({platform.processor() or platform.machine()})"
    return info


def versions() -> dict[str, str | None]:
    import torch

    out: dict[str, str | None] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for mod in ("transformers", "deepspeed", "vllm"):
        try:
            out[mod] = importlib.import_module(mod).__version__
        except Exception:
            out[mod] = None
    with contextlib.suppress(Exception):
        out["cudnn"] = str(torch.backends.cudnn.version()) if torch.cuda.is_available() else None
    return out


def _fmt(x: Any, spec: str = ".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def doc_section(report: dict[str, Any]) -> str:
    """The Markdown section of docs/gpu.md for this run (kind ``cuda`` or ``cpu``)."""
    gpu = report["gpu"]
    m, v = report["machine"], report["versions"]
    lines = [f"### {'CUDA' if gpu else 'CPU smoke test'}: {report['date']}", ""]
    if not gpu:
        lines += ["**No GPU was used.** This is the CPU form of `make gpu-check` (tiny shapes, "
                  f"{report['sizes_name']} sizes): the numbers below are only a smoke test that "
                  "every phase runs; they say nothing about GPU speed or memory.", ""]
    lines += [f"- machine: {m['device_name']}, {m['cpu_count']} CPUs"
              + (f", {m['device_memory_gib']:.0f} GiB, compute capability {m['capability']}"
                 if gpu else ""),
              f"- versions: torch {v['torch']}, transformers {v['transformers']}, deepspeed "
              f"{v['deepspeed']}, CUDA {v['cuda'] or '- (none)'}, vLLM {v['vllm'] or '- (none)'}",
              f"- result: {'all phases passed' if report['ok'] else 'FAILED: ' + ', '.join(report['failed'])}"
              f" ({report['seconds']:.0f} s)", ""]
    lines += ["| phase | status | seconds | note |", "|---|---|---|---|"]
    for name in PHASES:
        p = report["phases"].get(name)
        if p is None:
            continue
        note = p.get("error") or p.get("reason") or ""
        note = note.replace("|", "/").replace("\n", " ")[:200]
        lines.append(f"| {name} | {p['status']} | {p['seconds']:.1f} | {note} |")
    num = report["phases"].get("numerics", {}).get("checks")
    if num:
        lines += ["", "Numerics (one on-policy MAGIC update; dW: the weights' change):", "",
                  "| comparison | max abs(dW diff) / max abs(dW) | rel. L2 | entropy rel. | "
                  "grad-norm rel. | tolerance (max / L2) |", "|---|---|---|---|---|---|"]
        for name, c in num.items():
            tol = c["tolerance"]
            lines.append(f"| {name} | {c['max_rel']:.2e} | {c['rel_l2']:.2e} | "
                         f"{c['entropy_rel']:.1e} | {c['grad_norm_rel']:.1e} | "
                         f"{tol['max_rel']:g} / {tol['rel_l2']:g} |")
    bk = report["phases"].get("backends", {})
    if bk.get("results"):
        mdl = bk["model"]
        n = mdl["parameters"]
        params = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"
        lines += ["", f"Training backends ({mdl['shape']} shape: {params} parameters, "
                      f"{bk['dtype']}, one device"
                  + (f"; MFU against {_fmt(bk.get('peak_tflops'))} TFLOPS, {bk.get('peak_source')}"
                     if gpu else f"; MFU {bk.get('mfu', '')}") + "):", "",
                  "| backend | response tokens | rows x tokens | tokens/s | MFU | peak memory GiB |",
                  "|---|---|---|---|---|---|"]
        for name, r in bk["results"].items():
            if not r.get("ok"):
                lines.append(f"| {name} | - | - | failed: {r.get('error', '')[:80]} | - | - |")
                continue
            for row in r["rows"]:
                lines.append(f"| {name} | {row['response_tokens']} | {row['rows']} x "
                             f"{row['prompt_tokens'] + row['response_tokens']} | "
                             f"{row['tokens_per_s']:,.0f} | {_fmt(row.get('mfu'), '.3f')} | "
                             f"{row['peak_memory_gib']:.2f} |")
        measured = [(row, name) for name, r in bk["results"].items() if r.get("ok")
                    for row in r["rows"]]
        if measured:
            lines.append(f"\nPeak memory: {measured[0][0].get('memory_kind', '')}.")
        longest = max((row["response_tokens"] for row, _ in measured), default=None)
        best = max(((row["mfu"], name) for row, name in measured
                    if row["response_tokens"] == longest and row.get("mfu") is not None),
                   default=None)
        if best:
            lines.append(f"Best MFU at {longest} response tokens: {best[0]:.3f} ({best[1]}; "
                         "the goal in docs/gpu.md: 0.35).")
    ul = report["phases"].get("update_lengths", {})
    if ul.get("results"):
        lines += ["", f"Update at real lengths ({ul['rows']} rows, mean response "
                      f"{ul['mean_response_tokens']:,.0f} tokens, cut at {ul['response_limit']:,}"
                      f" ({ul['cut_rows']} rows), {ul['dtype']}; useful tokens: real prompt + "
                      "response):", "",
                  "| split | seconds | useful tokens/s | computed / useful | MFU (useful) |",
                  "|---|---|---|---|---|"]
        for name, r in ul["results"].items():
            lines.append(f"| {name} | {r['seconds_per_update']:.3f} | "
                         f"{r['useful_tokens_per_s']:,.0f} | {r['computed_over_useful']:.3f} | "
                         f"{_fmt(r.get('mfu_useful'), '.3f')} |")
        lines.append(f"\nPacked over row split, time per useful token: "
                     f"{ul['time_per_useful_token_ratio']:.3f} (the goal in issue 48: 0.7 or less;"
                     " useful-token MFU 0.35, goal 0.40).")
    eng = report["phases"].get("engine", {})
    if eng.get("hf"):
        h = eng["hf"]
        lines += ["", f"Generation: HF engine {h['tokens_per_s']:,.0f} tokens/s "
                      f"({h['prompts']} prompts x {h['n']}, up to {h['max_tokens']} tokens, "
                      f"{h['dtype']}); vLLM: "
                  + (f"{eng['vllm']['tokens_per_s']:,.0f} tokens/s"
                     if "tokens_per_s" in eng.get("vllm", {}) else
                     eng.get("vllm", {}).get("note", "-")) + "."]
    tr = report["phases"].get("trainer_run", {})
    if tr.get("runs"):
        lines += ["", f"`trainer run` ({tr.get('data')}, {tr.get('mode')}):", ""]
        for kind, r in tr["runs"].items():
            if r.get("ok"):
                lines.append(f"- {kind}: steps {r['logged_steps'][0]}-{r['logged_steps'][-1]}, "
                             f"checkpoint at {r['checkpoint_step']}, resumed to "
                             f"{r['latest_checkpoint']} ({r['first_seconds']:.0f} s + "
                             f"{r['resume_seconds']:.0f} s)")
            else:
                lines.append(f"- {kind}: FAILED: {str(r.get('error'))[:200]}")
    out = Path(report["out"]).resolve()
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    lines.append(f"\nFull numbers: `{shown}` (not committed).")
    return "\n".join(lines) + "\n"


def update_doc(doc: Path, report: dict[str, Any]) -> str:
    """Replace this kind's section of ``doc`` (between its markers), or append it."""
    kind = "cuda" if report["gpu"] else "cpu"
    begin, end = DOC_BEGIN.format(kind=kind), DOC_END.format(kind=kind)
    section = f"{begin}\n{doc_section(report)}{end}"
    text = doc.read_text() if doc.exists() else "# GPU check\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return section


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def run_phase(name: str, fn: Callable[[Context], dict[str, Any]], ctx: Context,
              report: dict[str, Any]) -> None:
    print(f"gpu-check: {name} ...", flush=True)
    t0 = time.perf_counter()
    try:
        entry: dict[str, Any] = {"status": "passed", **fn(ctx)}
    except Skipped as e:
        entry = {"status": "skipped", "reason": str(e)}
    except CheckFailed as e:
        entry = {"status": "failed", "error": str(e), **e.data}
    except Exception as e:
        entry = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:3000],
                 "traceback": traceback.format_exc()[-4000:]}
    _release()
    entry["seconds"] = time.perf_counter() - t0
    report["phases"][name] = entry
    print(f"gpu-check: {name} {entry['status']} ({entry['seconds']:.1f} s)"
          + (f": {entry.get('error') or entry.get('reason')}"
             if entry["status"] != "passed" else ""), flush=True)


FUNCTIONS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "install": phase_install, "numerics": phase_numerics, "backends": phase_backends,
    "update_lengths": phase_update_lengths, "engine": phase_engine,
    "trainer_run": phase_trainer_run,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Phases: " + ", ".join(PHASES) + ". See docs/gpu.md.")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="cuda: the GPU check (fails without CUDA); cpu: the smoke test; "
                         "auto (default): cuda when available")
    ap.add_argument("--wheels", type=Path, default=None,
                    help="folder of wheels to install what is missing from, offline (CUDA only)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu-check" / "gpu_check.json",
                    help="the JSON report (default runs/gpu-check/gpu_check.json)")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "gpu.md",
                    help="Markdown file whose gpu-check section is updated (default docs/gpu.md)")
    ap.add_argument("--no-doc", action="store_true", help="do not write the doc section")
    ap.add_argument("--quick", action="store_true",
                    help="the tiniest shapes and fewest steps (the test suite's CPU form)")
    ap.add_argument("--phases", default=",".join(PHASES),
                    help=f"comma list of phases to run (default all: {','.join(PHASES)})")
    ap.add_argument("--steps", type=int, default=None,
                    help="`trainer run` steps in all (default 10 on CUDA, 3 on CPU)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the GPU's dense bf16 peak for MFU, when the built-in table lacks it")
    ap.add_argument("--vllm", action="store_true",
                    help="on CPU, measure vLLM's generation too (slow start-up)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: 1 on CPU, torch's choice on CUDA)")
    ap.add_argument("--trainer-in-process", action=argparse.BooleanOptionalAction, default=None,
                    help="run `trainer run` in this process (default on CPU) or as a child "
                         "process (default on CUDA)")
    ap.add_argument("--work", type=Path, default=None,
                    help="scratch folder (default: a temporary one, removed afterwards)")
    args = ap.parse_args(argv)
    unknown = set(args.phases.split(",")) - set(PHASES)
    if unknown:
        ap.error(f"unknown phase(s) {', '.join(sorted(unknown))}; phases: {', '.join(PHASES)}")
    if args.steps is not None and args.steps < 2:
        ap.error("--steps must be >= 2 (a checkpoint, then a resume)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: --device cuda but torch sees no CUDA device "
              f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})", file=sys.stderr)
        return 2
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.trainer_in_process is None:
        args.trainer_in_process = not cuda
    threads = args.threads if args.threads is not None else (None if cuda else 1)
    if threads:
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    sizes_name = "cuda" if cuda else ("quick" if args.quick else "cpu")
    print(f"gpu-check: {'CUDA: ' + torch.cuda.get_device_name() if cuda else 'NO GPU USED'}"
          f" ({sizes_name} sizes)", flush=True)
    started = time.perf_counter()
    report: dict[str, Any] = {
        "schema": SCHEMA, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": cuda, "device": "cuda" if cuda else "cpu", "sizes_name": sizes_name,
        "sizes": dataclasses.asdict(SIZES[sizes_name]), "tolerances": TOLERANCES,
        "note": None if cuda else "No GPU was used: tiny shapes, a smoke test only.",
        "machine": machine_info(cuda), "phases": {}, "out": str(args.out),
    }
    selected = args.phases.split(",")
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="gpu-check-")))
        work.mkdir(parents=True, exist_ok=True)
        ctx = Context(args, cuda, SIZES[sizes_name], work)
        for name in PHASES:
            if name in selected:
                run_phase(name, FUNCTIONS[name], ctx, report)
            else:
                report["phases"][name] = {"status": "skipped", "reason": "not selected",
                                          "seconds": 0.0}
    report["versions"] = versions()  # after the install phase: what ran
    report["failed"] = [n for n, p in report["phases"].items() if p["status"] == "failed"]
    report["ok"] = not report["failed"]
    report["seconds"] = time.perf_counter() - started
    if not args.no_doc:
        try:
            section = update_doc(args.doc, report)
            report["doc"] = str(args.doc)
            print(section)
        except Exception as e:
            report["doc_error"] = f"{type(e).__name__}: {e}"
            report["failed"].append("doc")
            report["ok"] = False
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"gpu-check: {'all phases passed' if report['ok'] else 'FAILED: ' + ', '.join(report['failed'])}"
          f"; {'GPU: ' + report['machine']['device_name'] if cuda else 'no GPU was used'}; "
          f"report {args.out}", flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
