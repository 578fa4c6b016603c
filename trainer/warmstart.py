"""A short supervised warm start (demo): teach a random tiny model the answer format and some
of the task, so that RL starts from a policy that solves some problems but not all.

Plain next-token cross-entropy on response tokens only, AdamW, no scheduler. Not part of MAGIC;
real runs start from a pretrained checkpoint instead.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from trainer.data import Problem

log = logging.getLogger(__name__)


def warm_start(model_path: Path, tokenizer: Any, problems: Sequence[Problem], settings: Any,
               out_dir: Path, *, seed: int, prompt_ids: Callable[[Problem], list[int]]) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    for step in range(settings.steps):
        batch = [problems[rng.randrange(len(problems))] for _ in range(settings.batch_size)]
        seqs, starts = [], []
        for p in batch:
            target = settings.response_template.format(answer=p.ground_truth)
            ids = prompt_ids(p)
            resp = tokenizer(target, add_special_tokens=False)["input_ids"] + [eos]
            seqs.append(ids + resp)
            starts.append(len(ids))
        L = max(len(s) for s in seqs)
        x = torch.full((len(seqs), L), pad, dtype=torch.long)  # [B, L]
        attn = torch.zeros_like(x)  # [B, L]
        labels = torch.full_like(x, -100)  # [B, L] loss on response tokens only
        for i, (s, p0) in enumerate(zip(seqs, starts)):
            x[i, : len(s)] = torch.tensor(s)
            attn[i, : len(s)] = 1
            labels[i, p0 : len(s)] = x[i, p0 : len(s)]
        loss = model(input_ids=x, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 50 == 0 or step + 1 == settings.steps:
            log.info("warm start step %d/%d: loss %.4f", step + 1, settings.steps, loss.item())
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
