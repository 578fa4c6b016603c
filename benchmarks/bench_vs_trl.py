"""Our `trainer run` step against Hugging Face TRL's GRPOTrainer (trl 1.16.0) on the same work.

Both start from the same warm-started tiny model (the demo's recipe: trainer/configs/demo.yaml,
scripts/demo.py's toy world: column addition with \\boxed{} answers, a quarter of it as code
judged in the sandbox), score with the same verifier server (2 workers), and run N steps of
32 prompts x 8 samples at temperature 1.0, clip 0.2/0.28, no KL, token-mean ("dapo") loss,
group-scaled rewards, lr 2e-4 constant, AdamW betas (0.9, 0.999), no weight decay, grad clip
1.0, one optimizer step per rollout batch, responses up to 48 tokens, 64 rows per forward,
float32, no vLLM, no gradient checkpointing, 1 torch thread (``--threads``). The runs are
interleaved (ours, TRL, ours, TRL, ... one per seed each) because the machine is shared: each
pair sees similar load. Printed: median step time of each and the ratio ours/TRL,
completions/s, the held-out accuracy gain of each (avg@4 on 200 held-out problems,
temperature 0.6, 88 tokens, scored by the same code for all three models: start, ours, TRL),
and the phase breakdown.

Step time: the wall time of one optimizer step including its rollout (ours: ``train_step``;
TRL: between consecutive ``on_step_end`` callbacks). Phases, ours: time/generate,
time/verify_wait, time/update, time/sync (metrics of train_step); TRL (no timers of its own):
``model.generate``, the reward function (the verifier, after generation), and the rest of the
step (old-logprob/forward/backward/optimizer and its bookkeeping).

Differences that remain (neither can be configured like the other):
- Online filter: ours drops groups whose rewards are all equal (MAGIC; no update on them,
  and they leave the token-mean denominator); TRL trains on them with advantage 0 (their tokens
  still count in the "dapo" denominator and cost forward/backward). ``--no-filter`` turns ours
  off for a like-for-like check.
- Entropy: ours runs MAGIC's adaptive entropy control (coefficient 0 until the entropy falls
  under the demo's target 0.06; the entropy is computed every step as the controller's input);
  TRL has no entropy bonus.
- Verification: ours streams each finished prompt group to the verifier while generation goes
  on (engine.one_batch: one generate batch of 256 rows); TRL generates 256 rows in one call,
  then calls the reward function on all of them.
- Prompt order: each samples prompts with its own seeded sampler (same data, different order).
- Generation: both use HF ``generate`` on an engine copy (ours) / the policy itself (TRL).
  TRL decodes completions and builds chat messages; ours detokenises once per completion.
- Advantage std: both use the group's std; ours adds 1e-6 (docs/magic.md), TRL 1e-4.
- Stages: ours runs one stage of 48 tokens here (the demo has a second at 88 after step 60);
  TRL has no stages.

    .venv/bin/python benchmarks/bench_vs_trl.py [--steps 30] [--seeds 0 1] [--no-filter]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trainer.config import load_config  # noqa: E402

DEMO = ROOT / "trainer" / "configs" / "demo.yaml"
DATA_ARGS = ["--train", "6000", "--eval", "200", "--levels", "2,3,4", "--code-share", "0.25",
             "--verbose-share", "0.5", "--seed", "0"]
PROMPTS, GROUP, MAX_TOKENS, MICRO = 32, 8, 48, 64


def prepare(work: Path) -> Path:
    """Toy-world data and the warm-started policy (the demo's 1000 steps), cached in ``work``."""
    from trainer.data import load_problems
    from trainer.hf_utils import load_tokenizer, problem_prompt_ids
    from trainer.tiny import save_tiny
    from trainer.warmstart import warm_start

    data, warm = work / "data", work / "warm_start"
    if not (data / "eval.jsonl").exists():
        subprocess.run([sys.executable, str(ROOT / "datasets" / "toyworld.py"), "--out",
                        str(data), *DATA_ARGS], check=True)
    if not (warm / "config.json").exists():
        cfg = load_config(DEMO, [f"output_dir={work}", f"data.train_files=[{data}/train.jsonl]"])
        init = save_tiny(work / "init", seed=cfg.seed, **asdict(cfg.tiny_model))
        tok = load_tokenizer(init)
        problems, _ = load_problems([data / "train.jsonl"], instruction_suffix="")
        warm_start(init, tok, problems, cfg.warm_start, warm, seed=cfg.seed,
                   prompt_ids=lambda p: problem_prompt_ids(tok, p))
    return warm


def our_config(work: Path, warm: Path, addr: str, seed: int, steps: int, name: str,
               online_filter: bool = True, eval_every: int = 0):
    data = work / "data"
    return load_config(DEMO, [
        f"output_dir={work}/runs", f"name={name}", f"seed={seed}", f"total_steps={steps}",
        "tiny_model=null", f"model_path={warm}", "warm_start.steps=0",
        f"magic.prompts_per_step={PROMPTS}", f"magic.group_size={GROUP}",
        f"magic.online_filter={str(online_filter).lower()}",
        f"magic.stages=[{{name: s, max_response_length: {MAX_TOKENS}}}]",
        f"micro_batch_size={MICRO}", f"eval.every_steps={eval_every}", "checkpoint_every=0",
        "log.plots=false", "log.tensorboard=false", "log.progress=off", "log.samples_every=0",
        f"verifier.addr={addr}", f"data.train_files=[{data}/train.jsonl]",
        f"data.eval_files=[{data}/eval.jsonl]", f"torch_threads={torch.get_num_threads()}",
    ])


def run_ours(work: Path, warm: Path, addr: str, seed: int, steps: int,
             online_filter: bool) -> dict[str, Any]:
    from trainer.loop import Trainer

    trainer = Trainer(our_config(work, warm, addr, seed, steps, f"ours-{seed}-{time.time_ns()}",
                                 online_filter))
    try:
        times, rows = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            rows.append(trainer.train_step())
            times.append(time.perf_counter() - t0)
        weights = {n: t.detach().cpu().clone() for n, t in trainer.backend.named_weights()}
    finally:
        trainer.close()
    phases = {k: statistics.median(r[k] for r in rows)
              for k in ("time/generate", "time/verify_wait", "time/update", "time/sync")}
    return {"times": times, "phases": phases, "weights": weights,
            "length": statistics.mean(r["response_length/mean"] for r in rows)}


def run_trl(work: Path, warm: Path, addr: str, seed: int, steps: int) -> dict[str, Any]:
    # lazy: TRL and datasets are only needed by this half of the benchmark
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trainer.data import load_problems
    from trainer.hf_utils import load_tokenizer
    from verifier.integrations.trl import VerifierReward

    problems, _ = load_problems([work / "data" / "train.jsonl"], instruction_suffix="")
    # Code problems carry their tests as an object: one string column for Arrow (the
    # verifier parses either form).
    dataset = Dataset.from_list([{"prompt": p.messages, "domain": p.domain,
                                  "ground_truth": p.ground_truth if isinstance(
                                      p.ground_truth, str) else json.dumps(p.ground_truth),
                                  "data_source": p.data_source} for p in problems])
    timers: dict[str, float] = {"generate": 0.0, "reward": 0.0}
    marks: list[dict[str, float]] = []

    class TimedReward(VerifierReward):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super().__call__(*args, **kwargs)
            finally:
                timers["reward"] += time.perf_counter() - t0

    class StepClock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            marks.append({"t": time.perf_counter(), **timers})

    args = GRPOConfig(
        output_dir=str(work / "trl"), max_steps=steps, seed=seed, report_to="none",
        per_device_train_batch_size=MICRO, gradient_accumulation_steps=PROMPTS * GROUP // MICRO,
        num_generations=GROUP, max_completion_length=MAX_TOKENS, temperature=1.0, top_p=1.0,
        top_k=0, epsilon=0.2, epsilon_high=0.28, beta=0.0, loss_type="dapo",
        scale_rewards="group", num_iterations=1, mask_truncated_completions=False,
        learning_rate=2e-4, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, gradient_checkpointing=False,
        bf16=False, use_cpu=True, use_vllm=False, logging_steps=1, save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0)
    model = AutoModelForCausalLM.from_pretrained(str(warm), dtype=torch.float32)
    generate = model.generate

    def timed_generate(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            timers["generate"] += time.perf_counter() - t0

    model.generate = timed_generate
    trainer = GRPOTrainer(model=model, processing_class=load_tokenizer(warm),
                          reward_funcs=TimedReward(addr, domain="math"), args=args,
                          train_dataset=dataset, callbacks=[StepClock()])
    start = {"t": time.perf_counter(), "generate": 0.0, "reward": 0.0}
    trainer.train()
    prev, times, gen, rew = start, [], [], []
    for m in marks:
        times.append(m["t"] - prev["t"])
        gen.append(m["generate"] - prev["generate"])
        rew.append(m["reward"] - prev["reward"])
        prev = m
    rest = [t - g - r for t, g, r in zip(times, gen, rew, strict=True)]
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history
               if "completions/mean_length" in h]
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return {"times": times, "weights": weights, "length": statistics.mean(lengths),
            "phases": {"generate": statistics.median(gen), "reward (after generate)":
                       statistics.median(rew), "rest (forward, backward, step)":
                       statistics.median(rest)}}


def accuracy(evaluator: Any, weights: dict[str, torch.Tensor] | None) -> float:
    """avg@4 of ``weights`` (None: the evaluator's own, the warm start) on the held-out set,
    with the same seeds for every model."""
    if weights is not None:
        evaluator.engine.load_weights(weights.items())
    return float(evaluator.evaluate()["eval/accuracy"])


def main() -> None:
    from trainer.loop import Trainer
    from verifier.client.local import LocalVerifier

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30,
                    help="steps per run (100 for the full-length comparison)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both")
    ap.add_argument("--no-filter", action="store_true", help="ours without the online filter")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench_vs_trl")
    ap.add_argument("--json", type=Path, help="write the raw numbers here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    warm = prepare(args.work)
    results: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
    with LocalVerifier(workers=2) as server:
        addr = server.address
        for seed in args.seeds:  # interleaved: ours, TRL, ours, TRL, ...
            results["ours"].append(run_ours(args.work, warm, addr, seed, args.steps,
                                            not args.no_filter))
            print(f"seed {seed} ours: median step "
                  f"{statistics.median(results['ours'][-1]['times']):.3f} s", flush=True)
            results["trl"].append(run_trl(args.work, warm, addr, seed, args.steps))
            print(f"seed {seed} TRL:  median step "
                  f"{statistics.median(results['trl'][-1]['times']):.3f} s", flush=True)
        evaluator = Trainer(our_config(args.work, warm, addr, 0, 1, "eval", eval_every=1))
        try:
            base = accuracy(evaluator, None)
            gains = {k: [accuracy(evaluator, r["weights"]) - base for r in rs]
                     for k, rs in results.items()}
        finally:
            evaluator.close()
    med = {k: statistics.median(t for r in rs for t in r["times"]) for k, rs in results.items()}
    n = PROMPTS * GROUP
    print(f"\n{args.steps} steps x seeds {args.seeds} each, interleaved; {PROMPTS} prompts x "
          f"{GROUP} samples, <= {MAX_TOKENS} tokens; torch threads {args.threads}; "
          f"ours online filter {'off' if args.no_filter else 'on'}")
    for k, label in (("ours", "ours"), ("trl", "TRL ")):
        per_seed = " ".join(f"{statistics.median(r['times']):.3f}" for r in results[k])
        print(f"{label}: median step {med[k]:.3f} s (per seed {per_seed}), {n / med[k]:.0f} "
              f"completions/s, mean length {statistics.mean(r['length'] for r in results[k]):.1f}"
              f", accuracy gain {statistics.mean(gains[k]):+.3f} "
              f"(per seed {' '.join(f'{g:+.3f}' for g in gains[k])}; start {base:.3f})")
    print(f"ratio ours/TRL (median step time): {med['ours'] / med['trl']:.2f}  (goal <= 0.8)")
    for k, label in (("ours", "ours"), ("trl", "TRL ")):
        phases = {p: statistics.median(r["phases"][p] for r in results[k])
                  for p in results[k][0]["phases"]}
        print(f"{label} phases (median s): " + ", ".join(f"{p} {v:.3f}" for p, v in phases.items()))
    if args.json:
        args.json.write_text(json.dumps({
            "median_step": med, "gains": gains, "base": base,
            "times": {k: [r["times"] for r in rs] for k, rs in results.items()},
            "phases": {k: [r["phases"] for r in rs] for k, rs in results.items()}}, indent=1))


if __name__ == "__main__":
    main()
