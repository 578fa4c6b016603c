"""Does reasoning pay in the toy world? Warm-start the demo's tiny model twice on the same
problems, once on the reference responses (the digit-by-digit steps) and once on the bare answer
(an empty think block), and compare held-out accuracy by level.

    python scripts/toyworld_reasoning.py [--steps 1000] [--levels 2,3,4] [--train 6000]

Math problems only, concise references (datasets/toyworld.py), the demo's model and warm-start
settings (trainer/configs/demo.yaml), greedy decoding on 200 held-out problems, answers read
with the verifier's rule (the last \\boxed{} after the last </think>). About two warm starts of
time (3 minutes on a 2-core CPU at 1000 steps).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.data import load_problems  # noqa: E402
from trainer.hf_utils import chat_prompt_ids, load_tokenizer  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.tiny import save_tiny  # noqa: E402
from trainer.warmstart import warm_start  # noqa: E402
from verifier.scoring.extract import after_think, last_boxed  # noqa: E402

TARGETS = {"steps": "{reference}", "direct": "<think></think>\\boxed{{{answer}}}"}


def _toyworld():
    spec = importlib.util.spec_from_file_location("toyworld", ROOT / "datasets" / "toyworld.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def accuracy_by_level(model_path: Path, problems, max_tokens: int) -> dict[int, float]:
    """Greedy held-out accuracy per level (the verifier's answer rule, integers compared)."""
    tok = load_tokenizer(model_path)
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    right: dict[int, list[bool]] = defaultdict(list)
    for start in range(0, len(problems), 50):
        chunk = problems[start:start + 50]
        prompts = [chat_prompt_ids(tok, p.messages) for p in chunk]
        width = max(map(len, prompts))
        ids = torch.full((len(chunk), width), tok.pad_token_id)  # [B, L] left-padded
        attn = torch.zeros_like(ids)  # [B, L]
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=attn, do_sample=False,
                                 max_new_tokens=max_tokens, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
        for p, row in zip(chunk, out[:, width:], strict=True):
            tail = after_think(tok.decode(row, skip_special_tokens=True))
            answer = last_boxed(tail) if tail is not None else None
            right[p.extra["level"]].append(answer is not None and answer.strip() == p.ground_truth)
    return {lv: sum(v) / len(v) for lv, v in sorted(right.items())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1000, help="warm-start steps for each model")
    ap.add_argument("--levels", default="2,3,4")
    ap.add_argument("--train", type=int, default=6000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(ROOT / "trainer" / "configs" / "demo.yaml")
    levels = [int(x) for x in args.levels.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _toyworld().write(root / "data", args.train, 200, levels, code_share=0.0,
                          verbose_share=0.0, seed=0)
        train, _ = load_problems([root / "data" / "train.jsonl"], instruction_suffix="")
        held_out, _ = load_problems([root / "data" / "eval.jsonl"], instruction_suffix="")
        init = save_tiny(root / "init", seed=cfg.seed, **asdict(cfg.tiny_model))
        tok = load_tokenizer(init)
        print(f"{len(train)} training and {len(held_out)} held-out math problems, levels "
              f"{levels}; {args.steps} warm-start steps each; greedy held-out accuracy:")
        for name, template in TARGETS.items():
            t0 = time.monotonic()
            settings = replace(cfg.warm_start, steps=args.steps, response_template=template)
            model = warm_start(init, tok, train, settings, root / name, seed=cfg.seed,
                               prompt_ids=lambda p: chat_prompt_ids(tok, p.messages))
            acc = accuracy_by_level(model, held_out, cfg.eval.max_tokens or 96)
            cells = "  ".join(f"level {lv}: {a:6.1%}" for lv, a in acc.items())
            print(f"  {name:>6} ({template}): {cells}  ({time.monotonic() - t0:.0f} s)",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
