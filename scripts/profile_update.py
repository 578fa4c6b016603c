"""Where one training update's time goes: torch.profiler over TorchBackend's update of the
bench model of `make gpu-check` (scripts/gpu_check.py: the Qwen2-1.5B shape on CUDA, the tiny
model on CPU), one response length.

Prints the ops with the most device time (self time, so nothing is counted twice) and the
update's wall time split into forward+backward and optimizer step; writes the table as JSON
(``--out``). This is the tool that explains a low MFU in docs/gpu.md; it asserts nothing.

    python scripts/profile_update.py [--length 4096] [--gc] [--rows N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: trainer/ and scripts/ importable
    sys.path.insert(0, str(ROOT))

from scripts import gpu_check as gc  # noqa: E402  (after the sys.path line above)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=None,
                    help="response tokens (default: the longest of the sizes' lengths)")
    ap.add_argument("--gc", action="store_true", help="gradient checkpointing on")
    ap.add_argument("--top", type=int, default=30, help="ops to print")
    ap.add_argument("--out", type=Path, default=None, help="JSON of the table")
    ap.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                    help="BackendConfig.compile (auto: on for CUDA); CUDA always gets the fused "
                         "AdamW")
    ap.add_argument("--no-profile", action="store_true", help="time only (3 updates)")
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from trainer.backends import BackendConfig, create_backend
    from trainer.interfaces import LossSettings, UpdatePlan

    cuda = torch.cuda.is_available()
    sizes = gc.SIZES["cuda" if cuda else "quick"]
    length = args.length or max(sizes.lengths)
    with tempfile.TemporaryDirectory(prefix="profile-update-") as work:
        ctx = gc.Context(argparse.Namespace(), cuda, sizes, Path(work))
        model = ctx.bench_model()
        config = BackendConfig(kind="torch", dtype="bfloat16" if cuda else "float32",
                               gradient_checkpointing=args.gc, compile=args.compile)
        backend = create_backend(config, model)
        seq = sizes.prompt + length
        mbs = max(1, sizes.tokens_per_micro_batch // seq)
        rows = mbs * sizes.micro_batches
        vocab = backend.module.config.vocab_size
        batch, adv = gc.bench_batch(vocab, rows, sizes.prompt, length)
        plan = UpdatePlan([torch.arange(rows)], micro_batch_size=mbs)
        loss = LossSettings(clip_low=0.2, clip_high=0.28, entropy_coef=0.0)
        attn = getattr(backend.module.config, "_attn_implementation", None)
        t0 = time.perf_counter()
        backend.update(batch, None, adv, plan, loss)  # warm-up (and compilation)
        gc._sync()
        warm = time.perf_counter() - t0
        times = []
        for _ in range(1 if not args.no_profile else 3):
            t0 = time.perf_counter()
            backend.update(batch, None, adv, plan, loss)
            gc._sync()
            times.append(time.perf_counter() - t0)
        wall = min(times)
        # the optimizer step alone, timed apart (its share of the update)
        step = backend._optimizer_step
        timed = {}

        def timed_step() -> float:
            gc._sync()
            t = time.perf_counter()
            out = step()
            gc._sync()
            timed["optimizer_s"] = time.perf_counter() - t
            return out

        backend._optimizer_step = timed_step
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        prof = None
        if not args.no_profile:
            with profile(activities=acts) as prof, record_function("update"):
                backend.update(batch, None, adv, plan, loss)
                gc._sync()
        else:
            backend.update(batch, None, adv, plan, loss)
        backend.close()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [] if prof is None else sorted(prof.key_averages(),
                                            key=lambda e: getattr(e, key, 0), reverse=True)
    total = sum(getattr(e, key, 0) for e in events) or 1
    table = [{"op": e.key, "calls": e.count, "self_ms": getattr(e, key, 0) / 1e3,
              "share": getattr(e, key, 0) / total} for e in events[:args.top]]
    tokens = rows * seq
    n_params = sum(p.numel() for p in backend.module.parameters())
    summary = {"device": torch.cuda.get_device_name() if cuda else "cpu", "attn": attn,
               "length": length, "rows": rows, "micro_batch_size": mbs,
               "gradient_checkpointing": args.gc, "compiled": backend.compiled,
               "warmup_s": warm, "tokens": tokens, "update_s": wall,
               "tokens_per_s": tokens / wall, "optimizer_s": timed.get("optimizer_s"),
               "params": n_params, "device_total_ms": total / 1e3}
    if cuda:
        peak, _ = gc.peak_tflops(summary["device"], None)
        if peak:
            summary["mfu"] = 6.0 * n_params * tokens / wall / (peak * 1e12)
    print(json.dumps(summary, indent=1))
    for r in table:
        print(f"{r['self_ms']:10.1f} ms {100 * r['share']:5.1f}% {r['calls']:6d}  {r['op'][:90]}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": summary, "top": table}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
