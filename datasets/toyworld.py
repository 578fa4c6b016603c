"""The toy world: column addition that a tiny model gets right only by writing its steps.

    python datasets/toyworld.py --out runs/demo-data --train 6000 --eval 200 --levels 2,3,4 \
        --code-share 0.25 --verbose-share 0.5 --seed 0

writes ``train.jsonl`` and ``eval.jsonl`` in the trainer's plain JSONL format. A problem adds two
numbers of ``level`` digits each. Math problems ask for the sum, code problems for a function
judged in the sandbox against call-based tests::

    {"id": "toy-d3-138-905", "prompt": "Compute 905+138.", "domain": "math",
     "ground_truth": "1043", "data_source": "toy_math",
     "extra": {"level": 3, "operands": [905, 138], "style": "concise",
               "reference": "<think>5+8=13:3 0+3+1=4:43 9+1=10:1043</think>\\boxed{1043}"}}
    {"id": "toy-d2-17-64", "prompt": "Write f(x) that returns x+64+17.", "domain": "code",
     "ground_truth": {"fn_name": "f", "inputs": ["0", "5", "-13"], "outputs": ["81", "86", "68"]},
     "data_source": "toy_code", "extra": {...}}

The reference response is in R1's format: the scratchpad inside ``<think>...</think>``, digit by
digit from the units, each step ``x+y[+carry]=s:r`` with ``r`` the result so far (so the answer
is a copy of the last step, not digits read back in reverse order), then the answer:
``\\boxed{sum}`` for math, a fenced python block for code::

    <think>6+1=7:7 3+9=12:27 7+8+1=16:627 4+2+1=7:7627</think>\\boxed{7627}
    <think>4+7=11:1 6+1+1=8:81</think>
    ```python
    def f(x):
        return x+81
    ```

The verbose style (``verbose_share`` of the problems) first restates the problem, as reasoning
models like to (``<think>4736+2891: 6+1=7:7 ...``): ``2 * level + 3`` more tokens that change
nothing else, a habit a length limit can teach the policy to drop.

Reasoning pays: ``scripts/toyworld_reasoning.py`` warm-starts the demo's model (2 layers, hidden
64, one token per digit) for 1000 steps on 6000 math problems, once on these references and once
on the bare answer (an empty think block); greedy held-out accuracy at levels 2 / 3 / 4 was
79% / 69% / 41% with the steps and 4.5% / 1.5% / 0% without them (measured on a 2-core CPU).
And a response cut by the length limit has no answer: a think block that never closes, a box
or a code fence left open is NO_ANSWER for the verifier, a zero reward.

The difficulty knob is ``levels`` (digits per operand, 1-6): the scratchpad, and so the
response, grows with the level (median 27 / 41 / 53 tokens with the end token for concise math
at levels 2 / 3 / 4 with the toy world's tokenizer; code adds 15), which is what makes a stage's
length limit bind on the harder levels. Problems are unique as unordered operand pairs across
both domains (``a+b``, ``b+a`` and the code problem on the same numbers are one problem), and the
held-out split shares no pair with training. Asking for more problems than a level has, or for
training problems that could only be found among the held-out ones, is an error naming the
numbers.

Several ways (``--ways units,carry,swap,copy``; off by default, and then every row is as
without the option): each problem also gets ``extra.ways`` and ``extra.references``, one correct
response per way that applies to it, so that a policy warm-started on a uniform mix of them
(``warm_start.response_template: "{references}"``) starts spread over the ways and can collapse
onto one (the entropy story of the Skywork-OR1 report, scripts/entropy_world.py)::

    units  <think>6+1=7:7 3+9=12:27 7+8+1=16:627 4+2+1=7:7627</think>...    (the default one)
    carry  <think>6+1+0=7:7 3+9+0=12:27 7+8+1=16:627 4+2+1=7:7627</think>... (every carry, 0 too)
    swap   <think>1+6=7:7 9+3=12:27 8+7+1=16:627 2+4+1=7:7627</think>...    (second operand first)
    copy   <think>4736+2891</think> + ``return x+4736+2891`` (code only: no sum to compute)

``extra.reference`` stays the first way's response. ``copy`` applies to code problems only (a
math answer must be the number): it needs no arithmetic, so it is the way that solves code
problems reliably, while the three scratchpads are as reliable as each other.

Weights (``--way-weights units=8,copy=1``, with ``--ways``): a way of weight w appears w times in
``extra.ways`` and ``extra.references`` (the ways absent from the option weigh 1; the counts of a
row divided by their greatest common divisor), so the warm start's uniform draw from the list
trains on it w times as often as on a way of weight 1. With ``copy`` light, it is a
way the warm-started policy rarely takes; with a stage limit of 48 tokens and levels 2 and 3
(concise style), it is the only one that fits the level-3 code problems (copy 35 tokens,
the units scratchpad 50-59), which makes finding it pay (the rare-way world of
trainer/ablation/designs.py).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

MIN_LEVEL, MAX_LEVEL = 1, 6
DATA_SOURCES = {"math": "toy_math", "code": "toy_code"}
_ENUMERATE_BELOW = 500_000  # levels with fewer problems are drawn from the full list


# ---------------------------------------------------------------------------------------------
# One problem
# ---------------------------------------------------------------------------------------------

def _columns(a: int, b: int) -> list[tuple[int, int, int, int, str]]:
    """The columns of ``a + b``, units first: ``(x, y, carry in, column sum, result so far)``,
    the result being the digits found so far (the last column writes its whole sum)."""
    da, db = str(a)[::-1], str(b)[::-1]
    width = max(len(da), len(db))
    cols, carry, result = [], 0, ""
    for i in range(width):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        result = (str(s) if i == width - 1 else str(s % 10)) + result
        cols.append((x, y, carry, s, result))
        carry = s // 10
    assert int(result) == a + b
    return cols


def scratchpad(a: int, b: int) -> str:
    """The column-addition steps for ``a + b``, units first: ``x+y[+carry]=s:r`` per column,
    ``r`` the result digits found so far (the last column writes its whole sum)."""
    return " ".join(f"{x}+{y}" + (f"+{c}" if c else "") + f"={s}:{r}"
                    for x, y, c, s, r in _columns(a, b))


WAYS = ("units", "carry", "swap", "copy")
"""The ways to a correct response (``--ways``): three scratchpads and, for code, a copy of the
prompt's expression (see the module docstring)."""


def way_scratchpad(a: int, b: int, way: str) -> str:
    """The steps of ``a + b`` written the ``way`` way: ``units`` is :func:`scratchpad`,
    ``carry`` writes every column's carry (``+0`` too), ``swap`` puts ``b``'s digit first."""
    if way == "units":
        return scratchpad(a, b)
    if way not in ("carry", "swap"):
        raise ValueError(f"no scratchpad for way {way!r}; scratchpads: units, carry, swap")
    if way == "carry":
        return " ".join(f"{x}+{y}+{c}={s}:{r}" for x, y, c, s, r in _columns(a, b))
    return " ".join(f"{y}+{x}" + (f"+{c}" if c else "") + f"={s}:{r}"
                    for x, y, c, s, r in _columns(a, b))


def way_reference(a: int, b: int, domain: str, way: str, verbose: bool = False) -> str | None:
    """A correct response written the ``way`` way, or None when the way does not apply (``copy``
    to a math problem). ``verbose`` restates the problem before a scratchpad as
    :func:`reference` does; ``copy``'s think block is the restatement alone."""
    if way not in WAYS:
        raise ValueError(f"unknown way {way!r}; ways: {', '.join(WAYS)}")
    if way == "copy":
        if domain != "code":
            return None
        return f"<think>{a}+{b}</think>\n```python\ndef f(x):\n    return x+{a}+{b}\n```"
    restate = f"{a}+{b}: " if verbose else ""
    think = f"<think>{restate}{way_scratchpad(a, b, way)}</think>"
    if domain == "math":
        return think + f"\\boxed{{{a + b}}}"
    return think + f"\n```python\ndef f(x):\n    return x+{a + b}\n```"


def reference(a: int, b: int, domain: str, verbose: bool = False) -> str:
    """A correct response in R1's format: the steps in a think block, then the answer. The
    verbose style first restates the problem (``a+b: ``), as reasoning models like to: it costs
    ``2 * level + 3`` tokens and changes nothing else."""
    restate = f"{a}+{b}: " if verbose else ""
    think = f"<think>{restate}{scratchpad(a, b)}</think>"
    if domain == "math":
        return think + f"\\boxed{{{a + b}}}"
    return think + f"\n```python\ndef f(x):\n    return x+{a + b}\n```"


def make_problem(a: int, b: int, level: int, domain: str, rng: random.Random,
                 verbose: bool = False, ways: Sequence[str] | None = None,
                 way_weights: Mapping[str, int] | None = None) -> dict:
    """One JSONL row (see the module docstring). Code problems get three call-based tests of
    ``f`` (LiveCodeBench's functional format: inputs are JSON lines, outputs JSON values).
    ``verbose`` picks the style of the reference response. ``ways`` (None: off) adds
    ``extra.ways`` and ``extra.references``, one response per way that applies, and makes
    ``extra.reference`` the first of them; it draws nothing from ``rng``. ``way_weights``
    repeats a way's entry in both lists that many times (absent ways: once)."""
    if domain == "math":
        prompt, truth = f"Compute {a}+{b}.", str(a + b)
    elif domain == "code":
        xs = [0, rng.randint(1, 99), -rng.randint(1, 99)]
        prompt = f"Write f(x) that returns x+{a}+{b}."
        truth = {"fn_name": "f", "inputs": [json.dumps(x) for x in xs],
                 "outputs": [json.dumps(x + a + b) for x in xs]}
    else:
        raise ValueError(f"domain must be 'math' or 'code', got {domain!r}")
    style = "verbose" if verbose else "concise"
    extra = {"level": level, "operands": [a, b], "style": style,
             "reference": reference(a, b, domain, verbose)}
    if ways is not None:
        refs = [(w, way_reference(a, b, domain, w, verbose)) for w in ways]
        refs = [(w, r) for w, r in refs if r is not None]
        if not refs:
            raise ValueError(f"none of the ways {list(ways)} applies to a {domain} problem")
        extra["reference"] = refs[0][1]
        # Divided by their greatest common divisor over the ways that apply (a math row with
        # one way keeps one entry): the same uniform draw, with no copy that changes nothing.
        weights = {w: (way_weights or {}).get(w, 1) for w, _ in refs}
        unit = math.gcd(*weights.values())
        refs = [(w, r) for w, r in refs for _ in range(weights[w] // unit)]
        extra["ways"] = [w for w, _ in refs]
        extra["references"] = [r for _, r in refs]
    return {"id": problem_id(level, a, b), "prompt": prompt, "domain": domain,
            "ground_truth": truth, "data_source": DATA_SOURCES[domain], "extra": extra}


def problem_id(level: int, a: int, b: int) -> str:
    """The id of the unordered pair {a, b}: the same for ``a+b``, ``b+a`` and both domains."""
    lo, hi = sorted((a, b))
    return f"toy-d{level}-{lo}-{hi}"


# ---------------------------------------------------------------------------------------------
# The problem space
# ---------------------------------------------------------------------------------------------

def space(level: int) -> int:
    """Distinct problems of a level: unordered pairs of ``level``-digit numbers (with
    repetition), ``N (N + 1) / 2`` with ``N = 9 * 10**(level - 1)``."""
    _check_level(level)
    n = 9 * 10 ** (level - 1)
    return n * (n + 1) // 2


def _check_level(level: int) -> None:
    if isinstance(level, bool) or not isinstance(level, int) \
            or not MIN_LEVEL <= level <= MAX_LEVEL:
        raise ValueError(f"levels are digits per operand, {MIN_LEVEL}..{MAX_LEVEL}; "
                         f"got {level!r}")


def _split(n: int, parts: int) -> list[int]:
    """``n`` as ``parts`` near-equal counts (the first ones one larger)."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def _draw_pairs(level: int, k: int, taken: set[tuple[int, int]],
                rng: random.Random) -> list[tuple[int, int]]:
    """``k`` unordered pairs of ``level``-digit numbers, distinct and not in ``taken``
    (which is updated). The caller has checked that enough exist."""
    lo, hi = 10 ** (level - 1), 10 ** level - 1
    if space(level) < _ENUMERATE_BELOW:
        free = [(a, b) for a in range(lo, hi + 1) for b in range(a, hi + 1)
                if (a, b) not in taken]
        out = rng.sample(free, k)
    else:
        out, drawn = [], set()
        while len(out) < k:
            a, b = sorted((rng.randint(lo, hi), rng.randint(lo, hi)))
            if (a, b) not in taken and (a, b) not in drawn:
                drawn.add((a, b))
                out.append((a, b))
    taken.update(out)
    return out


def _key(row: dict) -> tuple[int, int, int]:
    """(level, smaller operand, larger operand) of a toy-world row."""
    try:
        a, b = row["extra"]["operands"]
        return int(row["extra"]["level"]), *sorted((int(a), int(b)))
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"not a toy-world row (no extra.level and extra.operands): "
                         f"{str(row)[:200]}") from None


def check_disjoint(train: Iterable[dict], held_out: Iterable[dict]) -> None:
    """Raise ValueError when a held-out problem's operand pair also occurs in training (in
    either order or domain): the held-out accuracy would then measure memory, not skill."""
    seen = {_key(r) for r in train}
    shared = sorted(k for k in {_key(r) for r in held_out} if k in seen)
    if shared:
        names = ", ".join(f"{a}+{b}" for _, a, b in shared[:5])
        raise ValueError(f"the held-out split overlaps training: {len(shared)} operand pairs "
                         f"are in both (e.g. {names})")


# ---------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------

def generate(n_train: int, n_eval: int, levels: Sequence[int] = (2, 3, 4),
             code_share: float = 0.25, seed: int = 0, verbose_share: float = 0.5,
             held_out: Sequence[dict] | None = None,
             ways: Sequence[str] | None = None,
             way_weights: Mapping[str, int] | None = None) -> tuple[list[dict], list[dict]]:
    """Unique problems, split into training and held-out sets with no operand pair in both.

    Each split holds the levels in near-equal numbers, ``code_share`` of each level's problems
    as code and ``verbose_share`` of them with a verbose reference response (both rounded). With
    ``held_out`` (rows of an existing held-out file, for example to draw a larger training set
    against a fixed evaluation set), that split is kept as it is, ``n_eval`` is ignored, and
    training avoids its pairs. ``ways`` (None: off) gives every row a reference per way
    (:func:`make_problem`), ``way_weights`` (with ``ways``) repeats them; the problems drawn are
    the same with and without either.

    Raises:
        ValueError: a level outside 1..6, a share outside [0, 1], negative counts, a level
            asked for more problems than it has, or training problems that could only come from
            the held-out pairs; every message names the numbers.
    """
    levels = list(levels)
    if not levels or len(set(levels)) != len(levels):
        raise ValueError(f"levels must be a non-empty list without repeats, got {levels}")
    for level in levels:
        _check_level(level)
    for name, share in (("code_share", code_share), ("verbose_share", verbose_share)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {share}")
    if n_train < 0 or n_eval < 0:
        raise ValueError(f"counts must be >= 0, got train={n_train}, eval={n_eval}")
    if ways is not None:
        ways = list(ways)
        bad = [w for w in ways if w not in WAYS]
        if bad or not ways or len(set(ways)) != len(ways):
            raise ValueError(f"ways must be a non-empty list without repeats of "
                             f"{', '.join(WAYS)}; got {ways}")
        if "copy" in ways and len(ways) == 1 and code_share < 1.0:
            raise ValueError("the way 'copy' applies to code problems only: add a scratchpad "
                             "way (units, carry, swap) or use code_share=1")
    if way_weights:
        if ways is None:
            raise ValueError("way_weights needs ways: they weigh the ways' references")
        for w, n in way_weights.items():
            if w not in ways:
                raise ValueError(f"way_weights names {w!r}, which is not among the ways {ways}")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"way_weights: the weight of {w!r} must be an integer >= 1, "
                                 f"got {n!r}")
    rng = random.Random(seed)
    taken: set[tuple[int, int]] = set()
    kept: dict[int, int] = {level: 0 for level in levels}
    if held_out is not None:
        for row in held_out:
            level, a, b = _key(row)
            taken.add((a, b))
            kept[level] = kept.get(level, 0) + 1
        eval_counts = [0] * len(levels)
    else:
        eval_counts = _split(n_eval, len(levels))
    train_counts = _split(n_train, len(levels))
    for level, n_tr, n_ev in zip(levels, train_counts, eval_counts, strict=True):
        total = space(level)
        if held_out is not None and n_tr > total - kept[level]:
            raise ValueError(
                f"the held-out split would overlap training: level {level} has {total} distinct "
                f"problems, {kept[level]} of them held out, and {n_tr} were asked for training")
        if n_tr + n_ev > total:
            raise ValueError(
                f"level {level} has only {total} distinct problems (unordered pairs of "
                f"{level}-digit numbers), asked for {n_tr} training + {n_ev} held-out")
    evals: list[dict] = []
    trains: list[dict] = []
    for level, n_tr, n_ev in zip(levels, train_counts, eval_counts, strict=True):
        for rows, n in ((evals, n_ev), (trains, n_tr)):
            pairs = _draw_pairs(level, n, taken, rng)
            code = set(rng.sample(range(n), round(code_share * n)))
            verbose = set(rng.sample(range(n), round(verbose_share * n)))
            for i, (a, b) in enumerate(pairs):
                if rng.random() < 0.5:
                    a, b = b, a
                rows.append(make_problem(a, b, level, "code" if i in code else "math", rng,
                                         verbose=i in verbose, ways=ways,
                                         way_weights=way_weights))
    rng.shuffle(evals)
    rng.shuffle(trains)
    check_disjoint(trains, held_out if held_out is not None else evals)
    return trains, (list(held_out) if held_out is not None else evals)


def write(out: Path, n_train: int, n_eval: int, levels: Sequence[int] = (2, 3, 4),
          code_share: float = 0.25, seed: int = 0, verbose_share: float = 0.5,
          held_out: Path | None = None,
          ways: Sequence[str] | None = None,
          way_weights: Mapping[str, int] | None = None) -> tuple[Path, Path]:
    """Write ``out/train.jsonl`` and ``out/eval.jsonl`` (with ``held_out``, that file is copied
    as ``eval.jsonl`` and training avoids its problems)."""
    fixed = None
    if held_out is not None:
        fixed = [json.loads(x) for x in Path(held_out).read_text().splitlines() if x.strip()]
    train, evals = generate(n_train, n_eval, levels, code_share, seed, verbose_share,
                            held_out=fixed, ways=ways, way_weights=way_weights)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.jsonl", out / "eval.jsonl"
    for path, rows in zip(paths, (train, evals), strict=True):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.rename(path)
    return paths


def parse_way_weights(text: str) -> dict[str, int]:
    """``"units=24,copy=1"`` -> ``{"units": 24, "copy": 1}``; a malformed item is an error
    naming it."""
    out: dict[str, int] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise ValueError(f"--way-weights: {item!r} is not way=INTEGER")
        out[name.strip()] = int(value)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("datasets/toyworld"))
    ap.add_argument("--train", type=int, default=6000, help="training problems")
    ap.add_argument("--eval", type=int, default=200, help="held-out problems")
    ap.add_argument("--levels", default="2,3,4",
                    help="comma list of difficulty levels: digits per operand, 1-6")
    ap.add_argument("--code-share", type=float, default=0.25,
                    help="share of code problems (functions judged in the sandbox), 0-1")
    ap.add_argument("--verbose-share", type=float, default=0.5,
                    help="share of reference responses that first restate the problem, 0-1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--held-out", type=Path, default=None,
                    help="keep this held-out file and draw training problems that avoid it")
    ap.add_argument("--ways", default=None,
                    help=f"comma list of ways to a correct response ({', '.join(WAYS)}): each "
                         "row gets extra.ways and extra.references, one per way that applies "
                         "(default: off, one reference)")
    ap.add_argument("--way-weights", default=None,
                    help="with --ways: comma list of way=weight (integers >= 1; absent ways "
                         "weigh 1): a way's reference appears that many times in "
                         "extra.references, so the warm start draws it that much more often")
    args = ap.parse_args(argv)
    try:
        levels = [int(x) for x in args.levels.split(",")]
        ways = args.ways.split(",") if args.ways is not None else None
        weights = parse_way_weights(args.way_weights) if args.way_weights else None
        write(args.out, args.train, args.eval, levels, args.code_share, args.seed,
              args.verbose_share, args.held_out, ways=ways, way_weights=weights)
    except ValueError as e:
        ap.exit(2, f"error: {e}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
