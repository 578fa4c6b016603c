"""Sample completions kept in the run directory: ``runs/NAME/samples/step_NNNNNN.jsonl``.

Every ``log.samples_every`` steps the loop writes, for the first ``log.samples_prompts`` prompts
of the step (rank 0's share), every response of their groups: what the policy actually writes,
next to what the verifier made of it. One JSON object per response::

    {"step": 40, "id": "toy-d3-138-905", "data_source": "toy_math", "sample": 0,
     "prompt": "Compute 905+138.", "response": "<think>5+8=13:3 ...</think>\\\\boxed{1043}",
     "reward": 1.0, "status": "CORRECT", "truncated": false, "tokens": 38,
     "ground_truth": "1043"}

``ground_truth`` is written for math problems only (code test cases can be large).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainer.data import Problem
from trainer.interfaces import Completion


def sample_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "samples" / f"step_{step:06d}.jsonl"


def sample_rows(step: int, problems: Sequence[Problem], completions: Sequence[Completion],
                results: Mapping[str, Any], ids: Sequence[str],
                n_prompts: int) -> list[dict[str, Any]]:
    """The rows for the first ``n_prompts`` prompts: ``completions[i]`` is the response whose
    verifier result is ``results[ids[i]]`` (a result with ``reward`` and ``status``)."""
    rows = []
    for c, item_id in zip(completions, ids, strict=True):
        if c.prompt_index >= n_prompts:
            continue
        p = problems[c.prompt_index]
        user = [m["content"] for m in p.messages if m.get("role") == "user"]
        res = results[item_id]
        row = {"step": step, "id": p.id, "data_source": p.data_source,
               "sample": c.sample_index, "prompt": user[-1] if user else "",
               "response": c.text, "reward": float(res.reward),
               "status": getattr(res.status, "value", str(res.status)),
               "truncated": bool(c.truncated), "tokens": len(c.token_ids)}
        if p.domain == "math":
            row["ground_truth"] = p.ground_truth
        rows.append(row)
    return rows


def write_samples(run_dir: Path, step: int, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``samples/step_NNNNNN.jsonl`` atomically (a resumed run rewrites its steps)."""
    path = sample_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(path)
    return path
