"""Evaluation and offline filtering (trainer/evaluation.py, trainer/magic/offline_filter.py): avg@k on
generations with known right answers, the filter keeping exactly the expected problems (a fake
engine, the real verifier), resuming an interrupted filter, and ``trainer eval`` / ``trainer
filter`` end to end on the tiny CPU model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

import pytest
import torch

from tests.test_trainer import data, policy  # noqa: F401  (the warm-started tiny model fixtures)
from trainer.data import Problem, load_dataset
from trainer.evaluation import (generate_and_score, generations_records, summarize_run,
                                trainer_metrics)
from trainer.magic.offline_filter import FilterError, FilterOptions, released_filter, run_filter
from trainer.interfaces import Completion, SamplingParams
from trainer.verifier_bridge import RewardError

ROOT = Path(__file__).resolve().parents[1]
AIME = ROOT / "datasets" / "eval"
FIX = ROOT / "datasets" / "fixtures"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class FakeEngine:
    """A RolloutEngine returning crafted responses: ``respond(prompt_ids, j)`` is sample j's
    text. Chunks of ``chunk_size`` prompts go to ``on_done`` as they would from a real engine;
    ``fail_on_call`` raises on that generate() call (an interrupted run)."""

    def __init__(self, respond: Callable[[list[int], int], str], chunk_size: int = 2,
                 fail_on_call: int | None = None):
        self.respond, self.chunk_size, self.fail_on_call = respond, chunk_size, fail_on_call
        self.calls: list[tuple[int, int | None]] = []  # (prompts, seed) per call

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 on_done=None) -> list[Completion]:
        self.calls.append((len(prompts), params.seed))
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise KeyboardInterrupt("interrupted")
        out: list[Completion] = []
        for start in range(0, len(prompts), self.chunk_size):
            chunk = [Completion(i, j, list(prompts[i]), [1, 2], self.respond(list(prompts[i]), j),
                                False)
                     for i in range(start, min(start + self.chunk_size, len(prompts)))
                     for j in range(params.n)]
            if on_done is not None:
                on_done(chunk)
            out += chunk
        return out

    def load_weights(self, weights) -> None: ...
    def sleep(self) -> None: ...
    def wake_up(self) -> None: ...
    def close(self) -> None: ...


def right(answer: str) -> str:
    return f"<think>thinking</think> so the answer is $\\boxed{{{answer}}}$"


def wrong(answer: str) -> str:
    return f"<think>thinking</think> so the answer is $\\boxed{{{int(answer) + 1}}}$"


@pytest.fixture(scope="module")
def client(server):
    from trainer.verifier_bridge import RewardClient

    with RewardClient(server[1]) as c:
        yield c


# -- avg@k on known answers ------------------------------------------------------------------

def test_avg_at_k_on_generations_with_known_right_answers(client, tmp_path) -> None:
    """Problem i is answered right in exactly i of 4 samples: avg@4 = mean(i/4), pass@4 = the
    share of problems with at least one right answer; the same as `verifier eval` on the
    generations file."""
    from verifier.eval.evaluate import EvalConfig, run_eval

    sources = ["a", "a", "b", "b", ""]
    correct_of = [0, 1, 2, 4, 3]
    problems = [Problem(f"p{i}", [{"role": "user", "content": "q"}], "math", str(10 + i), src)
                for i, src in enumerate(sources)]
    engine = FakeEngine(lambda ids, j: (right if j < correct_of[ids[0]] else wrong)(
        str(10 + ids[0])))
    params = SamplingParams(n=4, temperature=0.6, max_tokens=8, seed=0)
    run = generate_and_score(engine, client, problems, [[i] for i in range(5)], params)
    assert run.correct() == [[j < c for j in range(4)] for c in correct_of]
    summary = summarize_run(run, 4)
    assert summary["avg@k"] == pytest.approx((0 + 0.25 + 0.5 + 1 + 0.75) / 5)
    assert summary["pass@1"] == pytest.approx(summary["avg@k"])
    assert summary["pass@k"] == pytest.approx(4 / 5)
    assert summary["by_source"]["a"]["avg@k"] == pytest.approx(0.125)
    assert summary["by_source"]["b"]["avg@k"] == pytest.approx(0.75)
    assert summary["profiles"] == {"default": 20}  # the summary says which rules judged them
    metrics = trainer_metrics(summary)
    assert metrics == pytest.approx({"eval/a/avg@4": 0.125, "eval/b/avg@4": 0.75,
                                     "eval/eval/avg@4": 0.75, "eval/accuracy": 0.5,
                                     "eval/pass@k": 0.8})
    # the generations file scores the same through `verifier eval`
    gens = tmp_path / "gens.jsonl"
    gens.write_text("".join(json.dumps(r) + "\n" for r in generations_records(
        problems, [c for cs in run.completions for c in cs])))
    again = run_eval(EvalConfig(input=gens, output=tmp_path / "s.json", addr=client.address,
                                progress="off"))
    assert again["avg@k"] == pytest.approx(summary["avg@k"])
    assert again["pass@k"] == pytest.approx(summary["pass@k"])


def test_responses_that_cannot_be_judged_fail_loudly(client) -> None:
    problems = [Problem("bad", [{"role": "user", "content": "q"}], "code", {"inputs": []}),
                Problem("ok", [{"role": "user", "content": "q"}], "math", "1")]
    run = generate_and_score(FakeEngine(lambda ids, j: right("1")), client, problems, [[0], [1]],
                             SamplingParams(n=2, max_tokens=4))
    with pytest.raises(RewardError, match="could not be scored.*INVALID_INPUT"):
        summarize_run(run, 2)
    summary = summarize_run(run, 2, allow_errors=True)
    assert summary["errors"] == {"INVALID_INPUT": 2} and summary["avg@k"] == 0.5


# -- offline filtering -----------------------------------------------------------------------

N, K = 17, 16  # problem i is solved in exactly i of 16 samples, i = 0..16


def _verl_rows() -> list[dict]:
    return [{"data_source": "synthetic", "prompt": [{"role": "user", "content": f"q{i}"}],
             "ability": "math", "reward_model": {"ground_truth": json.dumps([str(100 + i)]),
                                                 "style": "rule"},
             "extra_info": {"index": i, "model_difficulty": {"Other-Model": 3}}}
            for i in range(N)]


def _i_of_k(ids: list[int], j: int) -> str:
    i = ids[0]
    return right(str(100 + i)) if j < i else wrong(str(100 + i))


def _prompt(p: Problem) -> list[int]:
    return [int(p.id.rsplit("-", 1)[1])]


def test_filter_keeps_exactly_the_problems_solved_1_to_15_of_16(client, tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(_verl_rows()), src)
    opts = FilterOptions(input=src, output=tmp_path / "scored.parquet", k=K, batch_size=5,
                         model="/models/My-Base-7B")
    engine = FakeEngine(_i_of_k, chunk_size=3)
    report = run_filter(opts, engine, client, _prompt)
    assert [s for _, s in engine.calls] == [0, 1, 2, 3]  # batch b samples with seed + b
    assert report.histogram == {i: 1 for i in range(N)}
    assert (report.rows, report.scored, report.kept) == (N, N, 15)
    scored = pq.read_table(tmp_path / "scored.parquet").to_pylist()
    assert [r["pass_count"] for r in scored] == list(range(N))
    assert {r["pass_k"] for r in scored} == {K}
    # the released field, under the model's name, next to the other models' values
    assert scored[5]["extra_info"]["model_difficulty"] == {"Other-Model": 3, "My-Base-7B": 5}
    assert scored[5]["reward_model"] == _verl_rows()[5]["reward_model"]  # the rest is untouched
    kept = pq.read_table(tmp_path / "scored.kept.parquet").to_pylist()
    assert [r["extra_info"]["index"] for r in kept] == list(range(1, 16))
    # the written file filters again like the release
    again = released_filter(FilterOptions(input=tmp_path / "scored.parquet",
                                          output=tmp_path / "re.parquet", k=K), "My-Base-7B")
    assert again.kept == 15 and again.histogram == report.histogram


def test_filter_resumes_after_an_interruption(client, tmp_path) -> None:
    rows = _verl_rows()
    src = tmp_path / "train.jsonl"
    lines = [json.dumps(r) for r in rows]
    lines.insert(3, "{not json")  # skipped with skip_invalid, and written back unchanged
    src.write_text("\n".join(lines) + "\n")

    def opts(out: str, **kw) -> FilterOptions:
        return FilterOptions(input=src, output=tmp_path / out, k=K, batch_size=4,
                             skip_invalid=True, model="m", **kw)

    full = run_filter(opts("full.jsonl"), FakeEngine(_i_of_k), client, _prompt)
    assert full.batches_run == [0, 1, 2, 3, 4] and full.skipped_invalid == 1

    cut = FakeEngine(_i_of_k, fail_on_call=3)
    with pytest.raises(KeyboardInterrupt):
        run_filter(opts("cut.jsonl"), cut, client, _prompt)
    progress = tmp_path / "cut.jsonl.progress.jsonl"
    assert len(progress.read_text().splitlines()) == 1 + 8  # header + two batches of 4
    with progress.open("a") as f:
        f.write('{"batch": 2, "row": 9')  # a line cut short by a crash
    resumed_engine = FakeEngine(_i_of_k)
    resumed = run_filter(opts("cut.jsonl"), resumed_engine, client, _prompt)
    assert resumed.batches_run == [2, 3, 4] and [s for _, s in resumed_engine.calls] == [2, 3, 4]
    assert (tmp_path / "cut.jsonl").read_text() == (tmp_path / "full.jsonl").read_text()
    assert (tmp_path / "cut.kept.jsonl").read_text() == (tmp_path / "full.kept.jsonl").read_text()
    written = (tmp_path / "full.jsonl").read_text().splitlines()
    assert len(written) == N + 1 and written[3] == "{not json"
    assert [json.loads(x)["pass_count"] for i, x in enumerate(written) if i != 3] == list(range(N))
    assert len((tmp_path / "full.kept.jsonl").read_text().splitlines()) == 15

    nothing = FakeEngine(_i_of_k)
    assert run_filter(opts("cut.jsonl"), nothing, client, _prompt).batches_run == []
    assert nothing.calls == []
    # other bounds reuse every score; other sampling settings are refused
    narrow = run_filter(opts("cut.jsonl", lo=4, hi=6), nothing, client, _prompt)
    assert narrow.kept == 3 and nothing.calls == []
    with pytest.raises(FilterError, match="other settings.*'k': \\(16, 8\\)"):
        run_filter(FilterOptions(input=src, output=tmp_path / "cut.jsonl", k=8, hi=7, batch_size=4,
                                 skip_invalid=True, model="m"), nothing, client, _prompt)


def test_filter_stops_on_responses_that_cannot_be_judged(client, tmp_path) -> None:
    src = tmp_path / "m.jsonl"
    src.write_text("".join(json.dumps({"id": f"m{i}", "prompt": "p", "ground_truth": "1"}) + "\n"
                           for i in range(2)))
    # no answer at all is a verdict (0 of 2)...
    quiet = run_filter(FilterOptions(input=src, output=tmp_path / "a.jsonl", k=2, lo=0, hi=2),
                       FakeEngine(lambda ids, j: "no think block"), client, lambda p: [0])
    assert quiet.histogram == {0: 2}
    # ...and so is a runaway response (over the verifier's cap: RESPONSE_TOO_LONG, the policy's
    # own failure, a genuine zero)...
    huge = FakeEngine(lambda ids, j: "x" * 1_000_001 if ids == [1] and j == 0 else right("1"))
    runaway = run_filter(FilterOptions(input=src, output=tmp_path / "r.jsonl", k=2, hi=2,
                                       batch_size=1), huge, client, lambda p: [int(p.id[1:])])
    assert runaway.histogram == {1: 1, 2: 1} and not runaway.errors_counted_as_incorrect
    # ...but a response the verifier cannot judge (its item's gold is over the verifier's
    # 100,000-character cap: INVALID_INPUT) is not
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"id": f"m{i}", "prompt": "p",
                                       "ground_truth": "1" * 100_001 if i else "1"}) + "\n"
                           for i in range(2)))
    opts = FilterOptions(input=bad, output=tmp_path / "b.jsonl", k=2, hi=2, batch_size=1)
    engine = FakeEngine(lambda ids, j: right("1"))
    with pytest.raises(FilterError, match="problem 'm1'.*2 of 2 responses could not be judged "
                                          "\\(INVALID_INPUT"):
        run_filter(opts, engine, client, lambda p: [int(p.id[1:])])
    opts.allow_errors = True  # counted as incorrect; batch 0 comes from the progress file
    report = run_filter(opts, engine, client, lambda p: [int(p.id[1:])])
    assert report.histogram == {0: 1, 2: 1} and report.errors_counted_as_incorrect == 2
    assert report.batches_run == [1]


def test_released_difficulty_filter_via_the_cli(tmp_path, capsys) -> None:
    import pyarrow.parquet as pq

    from trainer.cli import main

    rc = main(["filter", "--released-difficulty", "DeepSeek-R1-Distill-Qwen-7B",
               "--input", str(FIX / "skywork_rl.parquet"), "--output", str(tmp_path / "o.parquet")])
    assert rc == 0
    kept = pq.read_table(tmp_path / "o.kept.parquet").to_pylist()
    assert [r["extra_info"]["index"] for r in kept] == [1, 3, 4]
    assert "kept 3" in capsys.readouterr().out
    assert main(["filter", "--input", "x", "--output", "y"]) == 2  # neither --model nor the field


# -- end to end on the tiny CPU model --------------------------------------------------------

def test_trainer_eval_end_to_end(data, policy, tmp_path) -> None:  # noqa: F811
    from verifier.eval.evaluate import EvalConfig, run_eval

    out = tmp_path / "eval"
    r = subprocess.run([sys.executable, "-m", "trainer.cli", "eval", "--model", str(policy),
                        "--dataset", str(data / "eval.jsonl"), "--k", "3", "--max-tokens", "8",
                        "--instruction-suffix", "", "--output-dir", str(out),
                        "--temperature", "0.6"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "avg@3" in r.stdout and "pass@3" in r.stdout and "trainer eval" in r.stdout
    gens = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    assert len(gens) == 16 and all(len(g["responses"]) == 3 for g in gens)
    assert set(gens[0]) == {"id", "domain", "ground_truth", "data_source", "responses"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["k"] == 3 and summary["n_problems"] == 16
    assert summary["sampling"]["temperature"] == 0.6 and summary["engine"] == "hf"
    assert 0.0 < summary["avg@k"] <= 1.0  # the warm-started policy solves some
    assert len((out / "results.jsonl").read_text().splitlines()) == 48
    again = run_eval(EvalConfig(input=out / "generations.jsonl", output=tmp_path / "v.json",
                                progress="off"))
    assert again["avg@k"] == pytest.approx(summary["avg@k"])


def test_trainer_eval_on_aime24_prints_the_report_table(policy, tmp_path, capsys) -> None:  # noqa: F811
    from trainer.cli import main

    rc = main(["eval", "--model", str(policy), "--dataset", "aime24", "--limit", "2",
               "--max-tokens", "4", "--k", "2", "--output-dir", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "test-math-aime24" in out and "avg@2" in out and "aime24" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["files"] == [str(AIME / "aime24.parquet")] and summary["n_problems"] == 2
    assert summary["avg@k"] == 0.0  # a 4-token arithmetic model does not solve AIME
    # the report's defaults, and clear errors before any model is loaded
    assert main(["eval", "--model", str(tmp_path / "none"), "--dataset", "lcb"]) == 2
    assert "--lcb-file" in capsys.readouterr().err
    assert main(["eval", "--model", str(tmp_path / "none"), "--dataset", "aime24"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_report_defaults_for_k() -> None:
    from trainer.evaluation import default_k

    math = load_dataset([FIX / "plain.jsonl"]).problems
    assert default_k("aime24", []) == 32 and default_k("aime25", []) == 32
    assert default_k("lcb", []) == 4
    assert default_k("file.jsonl", math[:2]) == 32 and default_k("file.jsonl", math) == 4


def test_trainer_filter_end_to_end_with_the_tiny_model(data, policy, tmp_path, capsys) -> None:  # noqa: F811
    from trainer.cli import main

    src = tmp_path / "few.jsonl"
    src.write_text("".join((data / "eval.jsonl").read_text().splitlines(True)[:4]))
    args = ["filter", "--model", str(policy), "--input", str(src), "--output",
            str(tmp_path / "scored.jsonl"), "--k", "4", "--lo", "1", "--hi", "3",
            "--max-tokens", "8", "--instruction-suffix", "", "--batch-size", "2"]
    assert main(args) == 0
    assert "batches run now 2/2" in capsys.readouterr().out
    rows = [json.loads(x) for x in (tmp_path / "scored.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(0 <= r["pass_count"] <= 4 and r["pass_k"] == 4 for r in rows)
    kept = (tmp_path / "scored.kept.jsonl").read_text().splitlines()
    assert len(kept) == sum(1 <= r["pass_count"] <= 3 for r in rows)
    assert main(args) == 0  # everything already scored: nothing is generated again
    assert "batches run now 0/2" in capsys.readouterr().out
