"""Trainer benchmarks on the CPU demo setup (the demo's config and toy world, written as
scripts/demo.py writes it; a warm-started tiny policy, the HF engine, the torch backend, a local
verifier with 2 workers):

1. Overlap: ``time/verify_wait`` as a fraction of ``time/step`` with streamed verification
   (completions sent as each generation chunk finishes) vs verification after generation,
   same steps, same seed. Goal: <= 5% streamed.
2. Engine overhead: generation tokens/s inside a training step (on_done hook, verifier
   streaming and scoring alongside) vs the bare engine on the same prompts and seeds. Goal >= 0.9.

    .venv/bin/python benchmarks/bench_trainer.py [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_config(tmp: Path, steps: int, stream: bool, chunk: int):
    from trainer.config import load_config

    return load_config(ROOT / "trainer" / "configs" / "demo.yaml", [
        f"output_dir={tmp}", f"name=bench-{'stream' if stream else 'after'}",
        f"total_steps={steps}", "eval.every_steps=0", "checkpoint_every=0", "log.plots=false",
        "log.tensorboard=false", "log.progress=off", f"verifier.service.stream={stream}",
        f"engine.chunk_size={chunk}", f"data.train_files=[{tmp}/data/train.jsonl]",
        f"data.eval_files=[{tmp}/data/eval.jsonl]",
    ])


def run(cfg, data_dir: Path) -> tuple[list[dict], object]:
    from trainer.loop import Trainer

    trainer = Trainer(cfg)
    rows = [trainer.train_step() for _ in range(cfg.total_steps)]
    return rows, trainer


def main() -> None:
    import importlib.util

    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=1, help="prompts per generation chunk (default 1, as the demo)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("demo", ROOT / "scripts" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        subprocess.run([sys.executable, str(ROOT / "datasets" / "toyworld.py"), "--out",
                        str(tmp / "data"), *demo.DATA_ARGS], check=True)
        out = {}
        trainers = {}
        for stream in (True, False):
            rows, trainer = run(make_config(tmp, args.steps, stream, args.chunk), tmp)
            out[stream] = rows
            trainers[stream] = trainer
        # Engine overhead: the same prompts and seeds through the bare engine of the streamed
        # run (its weights are the final ones: time the in-step rate of that trainer too).
        from trainer.interfaces import SamplingParams

        t = trainers[True]
        m = t.cfg.magic
        in_step, bare = [], []
        for step in range(5):
            problems = [t.train[i] for i in range(step * m.prompts_per_step, (step + 1) * m.prompts_per_step)]
            prompts = [t.prompt_ids(p) for p in problems]
            params = SamplingParams(n=m.group_size, temperature=m.temperature, top_p=m.top_p,
                                    top_k=m.top_k,
                                    max_tokens=t.schedule.current.max_response_length,
                                    seed=1000 + step)
            t0 = time.perf_counter()
            comps = t.engine.generate(prompts, params)
            bare.append(sum(len(c.token_ids) for c in comps) / (time.perf_counter() - t0))
            rs = t.client.stream()

            def on_done(chunk, rs=rs, step=step, problems=problems):
                rs.submit([problems[c.prompt_index].verifier_item(f"b{step}:{c.prompt_index}:{c.sample_index}", c.text) for c in chunk])

            t0 = time.perf_counter()
            comps = t.engine.generate(prompts, params, on_done=on_done)
            in_step.append(sum(len(c.token_ids) for c in comps) / (time.perf_counter() - t0))
            rs.wait()
        for tr in trainers.values():
            tr.close()

    def frac(rows):
        return sum(r["time/verify_wait"] for r in rows) / sum(r["time/step"] for r in rows)

    s, a = out[True], out[False]
    m = trainers[True].cfg.magic
    print(f"steps: {args.steps} each; chunk {args.chunk} prompts; {m.prompts_per_step} prompts x "
          f"{m.group_size} samples per step")
    print(f"streamed:                verify_wait/step = {frac(s):6.1%}  "
          f"(mean step {statistics.mean(r['time/step'] for r in s):.3f} s)")
    print(f"verify after generation: verify_wait/step = {frac(a):6.1%}  "
          f"(mean step {statistics.mean(r['time/step'] for r in a):.3f} s)   goal: streamed <= 5%")
    ratio = statistics.median(in_step) / statistics.median(bare)
    print(f"engine tokens/s: in a step {statistics.median(in_step):.0f}, bare {statistics.median(bare):.0f}: "
          f"ratio {ratio:.2f}  (goal >= 0.9)")


if __name__ == "__main__":
    main()
