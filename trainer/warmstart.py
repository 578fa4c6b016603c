"""A short supervised warm start (demo): teach a random tiny model the answer format and some
of the task, so that RL starts from a policy that solves some problems but not all.

Plain next-token cross-entropy on response tokens only, AdamW, no scheduler. Not part of MAGIC;
real runs start from a pretrained checkpoint instead.

With ``target_loss`` it stops at a skill level instead of a step count: every ``check_every``
steps it measures the mean cross-entropy per response token on a fixed probe set of training
problems (one teacher-forced forward pass, :func:`probe_scores`), and ends once that is at or
below the target (``steps`` is then the most it may run). Why: at a high learning rate the warm
start is chaotic, and the same seed ended 1,000 fixed steps anywhere between 21.6% and 46.9%
held-out accuracy depending on the CPU's kernels alone (issue 46): AVX2 kernels took the same
seed to the probe loss AVX-512 ones reached at step 1,000 only at step 1,300. The probe's loss
is smooth where a count of exactly right answers jumps by several points between checks, so
the stop lands at one skill whatever the rounding. The greedy-exact share is logged beside it.
"""

from __future__ import annotations

import json
import logging
import random
import string
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from transformers import AutoModelForCausalLM

from trainer.config import WarmStartSettings
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


def padded_batch(seqs: Sequence[list[int]], starts: Sequence[int], pad: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, attention mask and labels (response tokens only, -100 elsewhere) of
    prompt+response sequences, right-padded; ``starts[i]`` is where sequence i's response
    begins."""
    L = max(len(s) for s in seqs)
    x = torch.full((len(seqs), L), pad, dtype=torch.long)  # [B, L]
    attn = torch.zeros_like(x)  # [B, L]
    labels = torch.full_like(x, -100)  # [B, L] loss on response tokens only
    for i, (s, p0) in enumerate(zip(seqs, starts)):
        x[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        labels[i, p0 : len(s)] = x[i, p0 : len(s)]
    return x, attn, labels


@torch.no_grad()
def probe_scores(model: Any, x: torch.Tensor, attn: torch.Tensor, labels: torch.Tensor
                 ) -> tuple[float, float]:
    """(greedy_exact, loss) of a probe batch, in one teacher-forced forward pass, no
    generation: the share of sequences whose every response token (end of sequence included)
    is the model's most likely next token given the tokens before it (those greedy decoding
    would reproduce exactly), and the mean cross-entropy per response token, nats."""
    logits = model(input_ids=x, attention_mask=attn).logits  # [B, L, V]
    pred = logits[:, :-1].argmax(-1)  # [B, L-1]: the token predicted for position t+1
    target, scored = x[:, 1:], labels[:, 1:] != -100  # [B, L-1]
    exact = ((pred == target) | ~scored).all(dim=1).float().mean().item()
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:],
                                            ignore_index=-100)  # mean over response tokens
    return exact, nll.item()


def warm_start(model_path: Path, tokenizer: Any, problems: Sequence[Problem],
               settings: WarmStartSettings,
               out_dir: Path, *, seed: int, prompt_ids: Callable[[Problem], list[int]]) -> Path:
    """Train the model at ``model_path`` on the problems' target responses (module docstring)
    and save it, with the tokenizer, to ``out_dir``; returns ``out_dir``. Writes
    ``out_dir/warm_start.json``: the steps run, and each probe measurement."""
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

    def tokens(text: str) -> list[int]:
        if text not in token_cache:
            token_cache[text] = tokenizer(text, add_special_tokens=False)["input_ids"]
        return token_cache[text] + [eos]

    target = settings.target_loss
    probe = None
    if target > 0:
        # A fixed probe set of training problems, drawn by a generator of its own (the training
        # draws stay what they were), each with its first reference response.
        probe_rng = random.Random(f"{seed}-warm-start-probe")
        chosen = probe_rng.sample(list(problems), min(settings.probe_size, len(problems)))
        probe = padded_batch([prompt_ids(p) + tokens(targets[p.id]) for p in chosen],
                             [len(prompt_ids(p)) for p in chosen], pad)
    checks: list[dict[str, float]] = []
    step = 0
    for step in range(1, settings.steps + 1):
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
            seqs.append(ids + tokens(text))
            starts.append(len(ids))
        x, attn, labels = padded_batch(seqs, starts, pad)
        loss = model(input_ids=x, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == settings.steps:
            log.info("warm start step %d/%d: loss %.4f", step, settings.steps, loss.item())
        if probe is not None and step % settings.check_every == 0:
            model.eval()
            share, probe_loss = probe_scores(model, *probe)
            model.train()
            checks.append({"step": step, "greedy_exact": share, "probe_loss": probe_loss,
                           "loss": loss.item()})
            log.info("warm start step %d: probe loss %.4f (target %.4f); greedy decoding "
                     "reproduces %.1f%% of the %d probe problems", step, probe_loss, target,
                     100 * share, len(probe[0]))
            if probe_loss <= target:
                break
    reached = bool(checks) and checks[-1]["probe_loss"] <= target
    if probe is not None and not reached:
        log.warning("warm start: the probe's target loss %.4f was not reached in %d steps",
                    target, settings.steps)
    if drawn:
        log.info("warm start drew (field, index) -> times: %s", dict(sorted(picked.items())))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "warm_start.json").write_text(json.dumps(
        {"steps": step, "max_steps": settings.steps, "target_loss": target,
         "reached": reached, "checks": checks},
        indent=1) + "\n")
    return out_dir
