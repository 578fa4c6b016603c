"""The toy world (datasets/toyworld.py): unique problems, a held-out split that shares nothing with
training, right gold answers, reference responses that the real verifier (real nsjail for the
code share) judges CORRECT and that are NO_ANSWER once cut by a length limit, the generator's
errors, and the demo config's stage limits against the world's response lengths."""

from __future__ import annotations

import importlib.util
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from trainer.config import load_config
from trainer.data import load_problems
from trainer.tiny import build_tokenizer
from trainer.warmstart import target_response
from verifier.client import VerifierClient

ROOT = Path(__file__).resolve().parents[1]


def _toyworld():
    """datasets/toyworld.py (datasets/ is not a package: it would shadow Hugging Face's)."""
    spec = importlib.util.spec_from_file_location("toyworld", ROOT / "datasets" / "toyworld.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tw = _toyworld()


@pytest.fixture(scope="module")
def split():
    return tw.generate(600, 60, levels=(2, 3, 4), code_share=0.25, seed=3)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(digits_per_token=1)


def key(row: dict) -> tuple[int, int]:
    a, b = row["extra"]["operands"]
    return tuple(sorted((a, b)))


# -- the problems ------------------------------------------------------------------------------

def test_problems_are_unique_and_the_held_out_split_shares_no_pair(split) -> None:
    train, held_out = split
    assert len(train) == 600 and len(held_out) == 60
    train_keys = [key(r) for r in train]
    assert len(set(train_keys)) == 600  # unique as unordered pairs, across both domains
    assert len({key(r) for r in held_out}) == 60
    assert not set(train_keys) & {key(r) for r in held_out}
    assert len({r["id"] for r in train + held_out}) == 660
    # a+b and b+a are the same problem: both orders occur, and one id names both
    assert any(r["extra"]["operands"][0] > r["extra"]["operands"][1] for r in train)
    assert tw.problem_id(3, 905, 138) == tw.problem_id(3, 138, 905)


def test_levels_code_share_and_styles_are_exact_knobs(split) -> None:
    train, held_out = split
    counts = Counter((r["extra"]["level"], r["domain"]) for r in train)
    assert counts == ({(lv, "math"): 150 for lv in (2, 3, 4)}
                      | {(lv, "code"): 50 for lv in (2, 3, 4)})
    assert Counter(r["extra"]["style"] for r in train) == {"verbose": 300, "concise": 300}
    for r in train + held_out:
        a, b = r["extra"]["operands"]
        level = r["extra"]["level"]
        assert len(str(a)) == len(str(b)) == level
    only = tw.generate(30, 0, levels=(1,), code_share=0.0, verbose_share=0.0, seed=0)[0]
    assert {r["domain"] for r in only} == {"math"}
    assert {r["extra"]["style"] for r in only} == {"concise"}
    again = tw.generate(600, 60, levels=(2, 3, 4), code_share=0.25, seed=3)
    assert again == split  # the seed decides everything
    assert tw.generate(600, 60, levels=(2, 3, 4), code_share=0.25, seed=4) != split


def test_gold_answers_and_references_are_right(split) -> None:
    for r in split[0] + split[1]:
        a, b = r["extra"]["operands"]
        ref = r["extra"]["reference"]
        think, answer = ref.split("</think>")
        assert think.startswith("<think>")
        steps = think[len("<think>"):].split(" ")
        if r["extra"]["style"] == "verbose":
            assert steps[0] == f"{a}+{b}:"
            steps = steps[1:]
        assert len(steps) == r["extra"]["level"]
        assert steps[-1].endswith(f":{a + b}")  # the running result ends as the sum
        for step in steps:  # each column: the digits and the carry add up
            lhs, rhs = step.split("=")
            assert sum(map(int, lhs.split("+"))) == int(rhs.split(":")[0])
        if r["domain"] == "math":
            assert r["ground_truth"] == str(a + b) and answer == f"\\boxed{{{a + b}}}"
            assert r["prompt"] == f"Compute {a}+{b}."
        else:
            gt = r["ground_truth"]
            assert gt["fn_name"] == "f" and len(gt["inputs"]) == 3
            for x, y in zip(gt["inputs"], gt["outputs"], strict=True):
                assert json.loads(y) == json.loads(x) + a + b
            assert answer == f"\n```python\ndef f(x):\n    return x+{a + b}\n```"
    assert tw.scratchpad(4736, 2891) == "6+1=7:7 3+9=12:27 7+8+1=16:627 4+2+1=7:7627"
    assert tw.scratchpad(99, 1) == "9+1=10:0 9+0+1=10:100"


def test_rows_load_as_problems_with_their_reference(tmp_path) -> None:
    paths = tw.write(tmp_path, 60, 10, levels=(2, 3), seed=1)
    problems, skipped = load_problems([paths[0]], instruction_suffix="")
    assert skipped == 0 and len(problems) == 60
    p = problems[0]
    assert p.extra["reference"] and p.data_source in ("toy_math", "toy_code")
    assert target_response("{reference}", p) == p.extra["reference"]  # the warm start's target
    with pytest.raises(ValueError, match="needs 'nope'"):
        target_response("{nope}", p)


# -- the verifier's judgement -------------------------------------------------------------------

def _cut(tokenizer, text: str, n_tokens: int) -> str:
    """What the engine returns when a response hits a limit of ``n_tokens``."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids[:n_tokens])


def test_verifier_judges_references_correct_and_cut_ones_no_answer(server, split,
                                                                    tokenizer) -> None:
    """Real server, real nsjail: every reference of a sample of both domains is CORRECT (code:
    all three call-based tests pass in the sandbox); the same responses cut inside the think
    block, inside the box or inside the code fence have no answer."""
    _, addr = server
    rng = random.Random(0)
    rows = rng.sample([r for r in split[0] if r["domain"] == "math"], 12) + \
        rng.sample([r for r in split[0] if r["domain"] == "code"], 6)
    items, expect = [], {}
    for i, r in enumerate(rows):
        ref = r["extra"]["reference"]
        n = len(tokenizer(ref, add_special_tokens=False)["input_ids"])
        n_think = len(tokenizer(ref.split("</think>")[0], add_special_tokens=False)["input_ids"])
        cuts = {"whole": ref,
                "in_think": _cut(tokenizer, ref, n_think // 2),
                "before_close": _cut(tokenizer, ref, n_think),  # all but </think> and after
                "in_answer": _cut(tokenizer, ref, n - 1)}  # box or code fence left open
        assert "</think>" not in cuts["before_close"] and "</think>" in cuts["in_answer"]
        for name, text in cuts.items():
            item_id = f"{i}-{name}"
            items.append({"id": item_id, "domain": r["domain"], "response": text,
                          "ground_truth": r["ground_truth"]})
            expect[item_id] = (r["domain"], name)
    with VerifierClient(addr) as client:
        results = {res.id: res for res in client.score(items)}
    for item_id, (domain, name) in expect.items():
        res = results[item_id]
        if name == "whole":
            assert res.status.value == "CORRECT" and res.reward == 1.0, (item_id, res.detail)
            if domain == "code":
                assert (res.passed, res.total) == (3, 3)
        else:
            assert res.status.value == "NO_ANSWER" and res.reward == 0.0, (item_id, res.detail)


# -- bad input ---------------------------------------------------------------------------------

def test_more_problems_than_exist_is_a_clear_error() -> None:
    assert tw.space(1) == 45 and tw.space(2) == 4095
    with pytest.raises(ValueError, match=r"level 1 has only 45 distinct problems .* asked for "
                                         r"40 training \+ 10 held-out"):
        tw.generate(40, 10, levels=(1,))
    with pytest.raises(ValueError, match="level 2 has only 4095"):
        tw.generate(8200, 100, levels=(2, 3))  # 4100 + 50 of level 2
    assert len(tw.generate(35, 10, levels=(1,))[0]) == 35  # exactly the whole space is fine
    with pytest.raises(ValueError, match="levels are digits per operand, 1..6"):
        tw.generate(10, 1, levels=(7,))
    with pytest.raises(ValueError, match="code_share must be in"):
        tw.generate(10, 1, code_share=1.5)


def test_held_out_split_that_would_overlap_training_is_a_clear_error(tmp_path) -> None:
    _, held_out = tw.generate(0, 20, levels=(1,), seed=0)
    with pytest.raises(ValueError, match=r"would overlap training: level 1 has 45 distinct "
                                         r"problems, 20 of them held out, and 30 were asked"):
        tw.generate(30, 0, levels=(1,), held_out=held_out)
    train, kept = tw.generate(25, 999, levels=(1,), held_out=held_out)  # all that is left
    assert kept == held_out and not {key(r) for r in train} & {key(r) for r in held_out}
    with pytest.raises(ValueError, match=r"overlaps training: 1 operand pairs are in both"):
        tw.check_disjoint(train, [train[0]])
    # the command line: an existing held-out file is kept, and the error is a clean exit
    (tmp_path / "fixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held_out))
    assert tw.main(["--out", str(tmp_path / "a"), "--train", "25", "--levels", "1",
                    "--held-out", str(tmp_path / "fixed.jsonl")]) == 0
    assert (tmp_path / "a" / "eval.jsonl").read_text() == (tmp_path / "fixed.jsonl").read_text()
    with pytest.raises(SystemExit) as exc:
        tw.main(["--out", str(tmp_path / "b"), "--train", "26", "--levels", "1",
                 "--held-out", str(tmp_path / "fixed.jsonl")])
    assert exc.value.code == 2 and not (tmp_path / "b" / "train.jsonl").exists()


# -- the demo's stages against the world's lengths ---------------------------------------------

def test_demo_stage_limits_bind_in_stage_one_and_fit_in_stage_two(tokenizer) -> None:
    """With the demo's data settings, the first stage's limit cuts a real share of the warm
    start's reference responses (the 4-digit and long code ones), the second stage's fits them
    all, and evaluation runs at the last stage's limit."""
    cfg = load_config(ROOT / "trainer" / "configs" / "demo.yaml")
    short, long_ = (s.max_response_length for s in cfg.magic.stages)
    assert cfg.eval.max_tokens == long_ and cfg.tiny_model.digits_per_token == 1
    train, _ = tw.generate(900, 0, levels=(2, 3, 4), code_share=0.25, verbose_share=0.5, seed=0)
    lengths = [len(tokenizer(r["extra"]["reference"], add_special_tokens=False)["input_ids"]) + 1
               for r in train]  # + EOS
    over_short = sum(n > short for n in lengths) / len(lengths)
    assert 0.3 < over_short < 0.7
    assert max(lengths) <= long_
    by_level = {lv: max(n for n, r in zip(lengths, train) if r["extra"]["level"] == lv
                        and r["domain"] == "math" and r["extra"]["style"] == "concise")
                for lv in (2, 3)}
    assert all(n <= short for n in by_level.values())  # concise 2-3 digit math fits stage 1


# -- the demo's report against its goals (scripts/demo.py) -------------------------------------

def _demo_script():
    spec = importlib.util.spec_from_file_location("demo_script", ROOT / "scripts" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_run(run: Path, evals: list[tuple[int, float]], truncated: list[float],
              samples: dict[int, list[str]] | None) -> Path:
    """A run directory shaped like `trainer run`'s: metrics.jsonl (evaluation rows and step
    rows) and samples/step_NNNNNN.jsonl."""
    rows = [{"step": s, "stage": 0, "eval/accuracy": a} for s, a in evals if s == 0]
    for i, t in enumerate(truncated, start=1):
        rows.append({"step": i, "stage": 0, "truncated/frac": t, "reward/no_answer_frac": t / 2})
        rows += [{"step": s, "stage": 0, "eval/accuracy": a} for s, a in evals if s == i]
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for step, responses in (samples or {}).items():
        path = run / "samples" / f"step_{step:06d}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(json.dumps({"step": step, "prompt": "Compute 1+2.",
                                            "response": x, "reward": 0.0, "status": "NO_ANSWER",
                                            "truncated": "</think>" not in x}) + "\n"
                                for x in responses))
    return run


def test_demo_summary_checks_the_goals_from_the_run_directory(tmp_path) -> None:
    """`make demo`'s closing report: the held-out gain from the first to the last evaluation,
    the truncated and no-answer fractions averaged over exactly the last 10 steps, closed think
    blocks in the last two sample files, the time; each against its goal (``GOALS``)."""
    demo = _demo_script()
    assert demo.GOALS == {"gain_points": 15.0, "truncated_last10": 0.25, "seconds": 600.0}
    done = "<think>2+1=3:3</think>\\boxed{3}"
    good = _fake_run(tmp_path / "good", [(0, 0.469), (10, 0.7), (20, 0.829)],
                     [1.0] * 10 + [0.2] * 10,  # step 10's 1.0 is outside the last 10
                     {10: ["<think>2+1=3", done], 20: [done, done]})
    text = "\n".join(demo.summary(good, 568.0))
    assert "step 0: 46.9%  step 10: 70.0%  step 20: 82.9%" in text
    assert "step 0 -> 20: +36.0 points (meets the goal: >= +15)" in text
    assert "last 10 steps: truncated 0.200 (meets the goal: <= 0.25)" in text
    assert "no answer (NO_ANSWER) 0.100" in text
    assert "think block closed in 3/4 sampled responses (samples of steps 10, 20)" in text
    assert "time: 568 s for data, warm start, 20 RL steps, 3 evaluations" in text
    assert "(meets the goal: <= 600 s)" in text and "MISSES" not in text

    bad = _fake_run(tmp_path / "bad", [(0, 0.469), (20, 0.60)], [0.3] * 20,
                    {20: ["<think>2+1=3"]})
    text = "\n".join(demo.summary(bad, 700.0))
    assert "+13.1 points (MISSES the goal: >= +15)" in text
    assert "truncated 0.300 (MISSES the goal: <= 0.25)" in text
    assert "closed in 0/1" in text and "(MISSES the goal: <= 600 s)" in text


def test_demo_summary_without_evaluations_or_samples_says_so(tmp_path) -> None:
    """Overrides for `make demo` (eval.every_steps=0, log.samples_every=0, total_steps=3): the
    report gives the numbers there are instead of a traceback after a finished run."""
    demo = _demo_script()
    run = _fake_run(tmp_path / "short", [], [0.5, 0.0, 0.25], None)
    text = "\n".join(demo.summary(run, 12.0))
    assert "no evaluation ran" in text
    assert "last 3 steps: truncated 0.250" in text
    assert "no sample completions kept" in text
    assert "3 RL steps, 0 evaluations" in text
    empty = _fake_run(tmp_path / "empty", [(0, 0.4)], [], None)
    text = "\n".join(demo.summary(empty, 5.0))
    assert "step 0 -> 0: +0.0 points" in text and "no RL step ran" in text
