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
from transformers import AutoModelForCausalLM

from trainer.data import Problem

log = logging.getLogger(__name__)


def target_response(template: str, problem: Problem) -> str:
    """The warm start's target for ``problem``: ``template`` formatted with ``answer`` (the
    ground truth) and the problem's string ``extra`` fields (e.g. ``{reference}``).

    Raises:
        ValueError: the template names a field the problem does not have.
    """
    fields = {k: v for k, v in problem.extra.items() if isinstance(v, str)}
    try:
        return template.format(**{**fields, "answer": problem.ground_truth})
    except (KeyError, IndexError) as e:
        raise ValueError(f"warm_start.response_template {template!r} needs {e}, which problem "
                         f"{problem.id} does not have (its string extra fields: "
                         f"{sorted(fields)})") from None


def warm_start(model_path: Path, tokenizer: Any, problems: Sequence[Problem], settings: Any,
               out_dir: Path, *, seed: int, prompt_ids: Callable[[Problem], list[int]]) -> Path:
    targets = {p.id: target_response(settings.response_template, p) for p in problems}
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
            ids = prompt_ids(p)
            resp = tokenizer(targets[p.id], add_special_tokens=False)["input_ids"] + [eos]
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
