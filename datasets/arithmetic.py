"""A one-token-answer task: two-number arithmetic with answers in ``\\boxed{}`` (the trainer
tests' quick task, and the first CPU demo's; the demo now uses datasets/toyworld.py).

    python datasets/arithmetic.py --out datasets/arithmetic --train 20000 --eval 200 --seed 0

writes ``train.jsonl`` and ``eval.jsonl`` in the trainer's plain JSONL format (one problem per
line: ``{"id", "prompt", "domain": "math", "ground_truth", "data_source"}``), with no problem
shared between the two files. The gold answers are computed here; the verifier judges the model's
``\\boxed{}`` answer against them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


OPS = ("+", "-", "max", "min")


def make_problem(rng: random.Random, max_operand: int, ops: tuple[str, ...] = ("+",)) -> tuple[str, str]:
    """One problem: ``a+b``, ``a-b``, ``max(a, b)`` or ``min(a, b)`` and its gold answer."""
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    op = rng.choice(ops)
    if op in ("max", "min"):
        return f"{op}({a}, {b})", str(max(a, b) if op == "max" else min(a, b))
    return f"{a}{op}{b}", str(a + b if op == "+" else a - b)


def generate(n_train: int, n_eval: int, seed: int = 0, max_operand: int = 99,
             ops: tuple[str, ...] = ("+",)) -> tuple[list[dict], list[dict]]:
    """Unique problems split into train and held-out eval sets."""
    unknown = set(ops) - set(OPS)
    if not ops or unknown:
        raise ValueError(f"ops must be among {OPS}, got {ops!r}")
    rng = random.Random(seed)
    space = len(set(ops)) * (max_operand + 1) ** 2
    if n_train + n_eval > space:
        raise ValueError(f"only {space} distinct problems with operands <= {max_operand}")
    seen: set[str] = set()
    rows: list[dict] = []
    while len(rows) < n_train + n_eval:
        expr, answer = make_problem(rng, max_operand, ops)
        if expr in seen:
            continue
        seen.add(expr)
        rows.append({"id": f"arith-{len(rows)}", "prompt": f"Compute {expr}.", "domain": "math",
                     "ground_truth": answer, "data_source": "arithmetic", "expr": expr})
    return rows[n_eval:], rows[:n_eval]


def write(out: Path, n_train: int, n_eval: int, seed: int = 0, max_operand: int = 99,
          ops: tuple[str, ...] = ("+",)) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = generate(n_train, n_eval, seed, max_operand, ops)
    paths = out / "train.jsonl", out / "eval.jsonl"
    for path, rows in zip(paths, (train, held_out)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("datasets/arithmetic"))
    ap.add_argument("--train", type=int, default=9000)
    ap.add_argument("--eval", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-operand", type=int, default=99)
    ap.add_argument("--ops", default="+", help=f"comma list of operations among {OPS}")
    args = ap.parse_args()
    write(args.out, args.train, args.eval, args.seed, args.max_operand, tuple(args.ops.split(",")))


if __name__ == "__main__":
    main()
