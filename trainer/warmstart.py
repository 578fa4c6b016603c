"""A short supervised warm start (demo): teach a random tiny model the answer format and some
of the task, so that RL starts from a policy that solves some problems but not all.

Plain next-token cross-entropy on response tokens only, AdamW, no scheduler. Not part of MAGIC;
real runs start from a pretrained checkpoint instead.
"""

from __future__ import annotations

import logging
import random
import string
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from transformers import AutoModelForCausalLM

from trainer.data import Problem

log = logging.getLogger(__name__)


def template_fields(template: str) -> set[str]:
    """The field names a response template formats (``"{a}x{b[0]}"`` -> ``{"a", "b"}``)."""
    names = set()
    for _, name, _, _ in string.Formatter().parse(template):
        if name:
            names.add(name.split(".")[0].split("[")[0])
    return names


def choice_fields(template: str, problem: Problem) -> dict[str, list[str]]:
    """The fields of ``template`` that are lists of strings in the problem's ``extra`` (e.g.
    the toy world's ``references``, one correct response per way): the warm start draws one
    element of each, uniformly, per problem per step."""
    names = template_fields(template)  # once, not once per extra field
    return {k: v for k, v in problem.extra.items()
            if k in names and isinstance(v, list) and v
            and all(isinstance(x, str) for x in v)}


def target_response(template: str, problem: Problem, rng: random.Random | None = None,
                    picks: dict[str, int] | None = None) -> str:
    """The warm start's target for ``problem``: ``template`` formatted with ``answer`` (the
    ground truth) and the problem's string ``extra`` fields (e.g. ``{reference}``). A field that
    is a list of strings in ``extra`` (``{references}``) is one element of it: drawn uniformly
    with ``rng``, the first without; ``picks`` (when given) gets each such field's index.

    Raises:
        ValueError: the template names a field the problem does not have.
    """
    fields = {k: v for k, v in problem.extra.items() if isinstance(v, str)}
    for name, options in sorted(choice_fields(template, problem).items()):
        i = rng.randrange(len(options)) if rng is not None else 0
        fields[name] = options[i]
        if picks is not None:
            picks[name] = i
    try:
        return template.format(**{**fields, "answer": problem.ground_truth})
    except (KeyError, IndexError) as e:
        raise ValueError(f"warm_start.response_template {template!r} needs {e}, which problem "
                         f"{problem.id} does not have (its string extra fields: "
                         f"{sorted(fields)})") from None


def warm_start(model_path: Path, tokenizer: Any, problems: Sequence[Problem], settings: Any,
               out_dir: Path, *, seed: int, prompt_ids: Callable[[Problem], list[int]]) -> Path:
    template = settings.response_template
    targets = {p.id: target_response(template, p) for p in problems}  # checks every problem
    # A list field (``{references}``: several correct responses) is drawn per problem per step,
    # from its own generator: without one, the warm start is what it was.
    drawn = any(choice_fields(template, p) for p in problems)
    pick_rng = random.Random(f"{seed}-warm-start-picks")
    picked: Counter = Counter()  # (field, index) -> draws
    token_cache: dict[str, list[int]] = {}
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
            if drawn:
                picks: dict[str, int] = {}
                text = target_response(template, p, pick_rng, picks)
                picked.update(picks.items())
            else:
                text = targets[p.id]
            if text not in token_cache:
                token_cache[text] = tokenizer(text, add_special_tokens=False)["input_ids"]
            resp = token_cache[text] + [eos]
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
    if drawn:
        log.info("warm start drew (field, index) -> times: %s", dict(sorted(picked.items())))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
