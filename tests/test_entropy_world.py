"""The toy world with several ways to a correct response (datasets/toyworld.py ``--ways``): every
way's reference is CORRECT for the real verifier (real nsjail for code), the ways are what they
say, the generator is deterministic and off by default (the demo's data unchanged), and the warm
start draws the ways uniformly per problem (trainer/warmstart.py, ``{references}``)."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import logging
import random
from collections import Counter
from pathlib import Path

import pytest

from trainer.config import WarmStartSettings
from trainer.data import load_problems
from trainer.tiny import build_tokenizer, save_tiny
from trainer.warmstart import target_response, warm_start
from verifier.client import VerifierClient

ROOT = Path(__file__).resolve().parents[1]
WAYS = ("units", "carry", "swap", "copy")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tw = _load("toyworld_ways", ROOT / "datasets" / "toyworld.py")
ew = _load("entropy_world", ROOT / "scripts" / "entropy_world.py")


@pytest.fixture(scope="module")
def split():
    return tw.generate(600, 60, levels=(2, 3, 4), code_share=0.25, seed=3, ways=WAYS)


def test_every_row_has_one_reference_per_way_that_applies(split) -> None:
    for r in split[0] + split[1]:
        a, b = r["extra"]["operands"]
        ways, refs = r["extra"]["ways"], r["extra"]["references"]
        assert ways == (list(WAYS) if r["domain"] == "code" else ["units", "carry", "swap"])
        assert len(set(refs)) == len(refs) or a == b  # the ways differ (swap: unless a == b)
        assert r["extra"]["reference"] == refs[0]
        for way, ref in zip(ways, refs, strict=True):
            assert ew.way_of(r["prompt"], ref) in (way, "units|swap")  # the analysis reads it
            think = ref.split("</think>")[0][len("<think>"):]
            if way == "copy":
                assert think == f"{a}+{b}" and ref.endswith(f"return x+{a}+{b}\n```")
                continue
            steps = think.split(" ")[1:] if r["extra"]["style"] == "verbose" else think.split(" ")
            assert len(steps) == r["extra"]["level"] and steps[-1].endswith(f":{a + b}")
            for step in steps:  # each column adds up
                lhs, rhs = step.split("=")
                terms = lhs.split("+")
                assert sum(map(int, terms)) == int(rhs.split(":")[0])
                assert len(terms) == 3 if way == "carry" else len(terms) in (2, 3)
    assert tw.way_scratchpad(4736, 2891, "carry") == \
        "6+1+0=7:7 3+9+0=12:27 7+8+1=16:627 4+2+1=7:7627"
    assert tw.way_scratchpad(4736, 2891, "swap") == \
        "1+6=7:7 9+3=12:27 8+7+1=16:627 2+4+1=7:7627"
    assert tw.way_scratchpad(4736, 2891, "units") == tw.scratchpad(4736, 2891)


def test_verifier_judges_every_way_correct(server, split) -> None:
    """Real server, real nsjail: every reference of every way of a sample of both domains is
    CORRECT (code: all three call-based tests pass in the sandbox)."""
    _, addr = server
    rng = random.Random(0)
    rows = rng.sample([r for r in split[0] if r["domain"] == "math"], 12) + \
        rng.sample([r for r in split[0] if r["domain"] == "code"], 8)
    items, seen = [], Counter()
    for i, r in enumerate(rows):
        for way, ref in zip(r["extra"]["ways"], r["extra"]["references"], strict=True):
            items.append({"id": f"{i}-{way}", "domain": r["domain"], "response": ref,
                          "ground_truth": r["ground_truth"]})
            seen[(r["domain"], way)] += 1
    assert set(seen) == {("math", w) for w in WAYS[:3]} | {("code", w) for w in WAYS}
    with VerifierClient(addr) as client:
        results = list(client.score(items))
    assert len(results) == len(items)
    for res in results:
        assert res.status.value == "CORRECT" and res.reward == 1.0, (res.id, res.detail)
        if res.id.split("-")[0] in {str(i) for i, r in enumerate(rows) if r["domain"] == "code"}:
            assert (res.passed, res.total) == (3, 3)


def test_generator_is_deterministic_and_draws_the_same_problems_with_ways(split) -> None:
    assert tw.generate(600, 60, levels=(2, 3, 4), code_share=0.25, seed=3, ways=WAYS) == split
    assert tw.generate(600, 60, levels=(2, 3, 4), code_share=0.25, seed=4, ways=WAYS) != split
    plain = tw.generate(600, 60, levels=(2, 3, 4), code_share=0.25, seed=3)
    for with_ways, without in zip(split[0] + split[1], plain[0] + plain[1], strict=True):
        extra = dict(with_ways["extra"])
        del extra["ways"], extra["references"]
        assert {**with_ways, "extra": extra} == without  # units first: the same reference


def test_off_by_default_the_rows_are_as_before(tmp_path) -> None:
    """Without ``ways`` the generator writes what it wrote before the option existed (the
    digest of the previous generator's output for these arguments), so the demo's data is
    unchanged; the command line's default is off."""
    train, held_out = tw.generate(600, 60, levels=(2, 3, 4), code_share=0.25, seed=3)
    text = "".join(json.dumps(r) + "\n" for r in train + held_out)
    assert hashlib.sha256(text.encode()).hexdigest() == \
        "520ead60e17ed2975f759acdea058da89003ad37f2aac34458f8c6e8c2d00267"
    assert tw.main(["--out", str(tmp_path / "a"), "--train", "60", "--eval", "10"]) == 0
    rows = (tmp_path / "a" / "train.jsonl").read_text().splitlines()
    assert rows == [json.dumps(r) for r in tw.generate(60, 10)[0]]
    assert not any("references" in json.loads(x)["extra"] for x in rows)
    assert tw.main(["--out", str(tmp_path / "b"), "--train", "60", "--eval", "10",
                    "--ways", "units,copy"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "b" / "train.jsonl").read_text().splitlines()]
    assert {tuple(r["extra"]["ways"]) for r in rows} == {("units",), ("units", "copy")}


def test_bad_ways_are_clear_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="ways must be a non-empty list"):
        tw.generate(10, 1, ways=["units", "nope"])
    with pytest.raises(ValueError, match="ways must be a non-empty list"):
        tw.generate(10, 1, ways=["units", "units"])
    with pytest.raises(ValueError, match="applies to code problems only"):
        tw.generate(10, 1, ways=["copy"])
    assert len(tw.generate(10, 1, code_share=1.0, ways=["copy"])[0]) == 10
    with pytest.raises(SystemExit) as exc:
        tw.main(["--out", str(tmp_path), "--train", "10", "--ways", "nope"])
    assert exc.value.code == 2


def test_warm_start_draws_every_way(tmp_path, caplog) -> None:
    """``{references}``: one way drawn uniformly per problem per step (the first one without a
    generator); a real warm start on a tiny model draws more than one way and logs the draws."""
    paths = tw.write(tmp_path / "data", 40, 0, levels=(2, 3), seed=1, ways=WAYS)
    problems, _ = load_problems([paths[0]], instruction_suffix="")
    p = next(q for q in problems if q.domain == "code")
    rng = random.Random(0)
    drawn = Counter(target_response("{references}", p, rng) for _ in range(400))
    assert set(drawn) == set(p.extra["references"])
    assert min(drawn.values()) > 400 / len(WAYS) * 0.7  # about uniform
    assert target_response("{references}", p) == p.extra["reference"]
    assert target_response("{reference}", p, rng) == p.extra["reference"]  # no list: no draw

    tokenizer = build_tokenizer(digits_per_token=1)
    model = save_tiny(tmp_path / "tiny", digits_per_token=1)
    settings = WarmStartSettings(steps=3, lr=1e-3, batch_size=16,
                                 response_template="{references}")
    with caplog.at_level(logging.INFO, logger="trainer.warmstart"):
        out = warm_start(model, tokenizer, problems, settings, tmp_path / "ws", seed=0,
                         prompt_ids=lambda q: tokenizer(q.messages[-1]["content"],
                                                        add_special_tokens=False)["input_ids"])
    assert (out / "config.json").exists()
    line = next(r.getMessage() for r in caplog.records if "warm start drew" in r.getMessage())
    picks = {i for (_, i) in ast.literal_eval(line.split(": ", 1)[1])}  # the dict logged
    assert len(picks) >= 3  # 48 draws over 3-4 ways: several ways, not one


def test_the_way_of_a_response_is_read_from_its_shape_not_its_digits() -> None:
    """A response takes its way from how it begins: a copy with wrong digits is still the
    copying way (what a warm start that rarely saw it writes), a scratchpad with a wrong sum is
    still its scratchpad, and what fits no way is "other"."""
    prompt = "Write f(x) that returns x+925+783."
    code = "\n```python\ndef f(x):\n    return x+{}\n```"
    assert ew.way_of(prompt, "<think>925+783</think>" + code.format("925+783")) == "copy"
    assert ew.way_of(prompt, "<think>574+783</think>" + code.format("635+733")) == "copy"
    assert ew.way_of(prompt, "<think>5+3=9:9 2+8=10:09 9+7+1=17:1709</think>") == "units"
    assert ew.way_of(prompt, "<think>5+3+0=8:8") == "carry"
    assert ew.way_of(prompt, "<think>89+254+7=11:11</think>") == "other"
    assert ew.way_of(prompt, "no think block") == "other"
