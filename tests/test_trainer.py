"""`trainer run` for real: a tiny model, the HF engine, the torch backend and a local verifier
process. Config errors, the run directory contract (docs/contracts.md 3), streamed verification,
exact resume after a SIGKILL, Ctrl-C checkpoints, and the vLLM and DeepSpeed paths."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainer.hf_utils import CheckpointError
from trainer.verifier_bridge import RewardError
from trainer.config import load_config

ROOT = Path(__file__).resolve().parents[1]
AIME = ROOT / "datasets" / "eval"

REQUIRED_KEYS = ["step", "stage", "reward/mean", "reward/by_source/arithmetic", "entropy",
                 "entropy/coef", "response_length/mean", "truncated/frac", "filtered/frac",
                 "losses/policy", "losses/clipfrac", "time/generate", "time/verify_wait",
                 "time/update", "time/sync", "time/step"]


def _arithmetic():
    """datasets/arithmetic.py (datasets/ is not a package: it would shadow Hugging Face's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("arithmetic", ROOT / "datasets" / "arithmetic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("arith")
    _arithmetic().write(out, 300, 16, seed=1, ops=("max",))
    return out


@pytest.fixture(scope="module")
def policy(data, tmp_path_factory) -> Path:
    """A warm-started tiny policy (the demo's recipe) that solves some problems but not all,
    so that steps have non-trivial groups and real updates. heads=2: vLLM's CPU kernels need
    a head dimension of 32."""
    from trainer.data import load_problems
    from trainer.hf_utils import chat_prompt_ids, load_tokenizer
    from trainer.config import WarmStartSettings
    from trainer.tiny import save_tiny
    from trainer.warmstart import warm_start

    root = tmp_path_factory.mktemp("policy")
    init = save_tiny(root / "init", hidden_size=64, layers=2, heads=2, kv_heads=1, seed=0)
    tok = load_tokenizer(init)
    problems, _ = load_problems([data / "train.jsonl"], instruction_suffix="")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return warm_start(init, tok, problems, WarmStartSettings(steps=150, lr=3e-3),
                          root / "ws", seed=0, prompt_ids=lambda p: chat_prompt_ids(tok, p.messages))
    finally:
        torch.set_num_threads(threads)


def overrides(data: Path, out: Path, model: Path | None = None, **extra: object) -> list[str]:
    base = {
        "name": "t", "output_dir": str(out), "total_steps": 3, "seed": 3,
        "micro_batch_size": 16, "torch_threads": 1,
        "magic.prompts_per_step": 4, "magic.group_size": 4, "magic.max_prompt_length": 64,
        "magic.lr": 1e-3, "checkpoint_every": 2, "eval.every_steps": 2, "eval.n_samples": 2,
        "data.train_files": f"[{data}/train.jsonl]", "data.eval_files": f"[{data}/eval.jsonl]",
        "data.instruction_suffix": "", "log.progress": "off", "engine.chunk_size": 1,
        "magic.stages": "[{name: a, max_response_length: 6, steps: 2}, {name: b, max_response_length: 8}]",
    }
    if model is None:  # a tiny random model (enough for the error paths)
        base.update({"tiny_model.hidden_size": 32, "tiny_model.layers": 1,
                     "tiny_model.heads": 2, "tiny_model.kv_heads": 1, "warm_start.steps": 0})
    else:
        base.update({"tiny_model": "null", "model_path": str(model), "warm_start.steps": 0})
    base.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in base.items()]


def demo_config(data: Path, out: Path, model: Path | None = None, **extra: object):
    return load_config(ROOT / "trainer" / "configs" / "demo.yaml",
                       overrides(data, out, model, **extra))


def run_cli(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.cli", "run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, **kw)


# -- bad input: clear errors before any model is loaded --------------------------------------

@pytest.mark.parametrize("extra, message", [
    ({"magic__group_size": 1}, "group_size must be >= 2"),
    ({"magic__mini_batch_size": 3}, "divide"),
    ({"magic__stages": "[{name: a, max_response_length: 8, steps: 2}, {name: b, max_response_length: 6}]"},
     "increasing"),
    ({"magic__nonsense": 1}, "unknown magic key 'nonsense'"),
    ({"log__progress": "sometimes"}, "log.progress must be one of"),
    ({"verifier__profile": "leetcode"}, "verifier.profile must be one of"),
    ({"verifier__outage_window_s": 3600}, r"outage_window_s must be >= 0 and under verifier"),
    ({"verifier__outage_window_s": -1}, r"outage_window_s must be >= 0"),
    ({"verifier__client": "{outage_window_s: 5}"}, "set verifier.outage_window_s"),
])
def test_impossible_configs_are_refused_with_the_rule(data, tmp_path, extra, message) -> None:
    with pytest.raises(ValueError, match=message):
        demo_config(data, tmp_path, **extra)


def test_missing_model_path_is_a_clear_error(data, tmp_path) -> None:
    from trainer.loop import Trainer

    cfg = demo_config(data, tmp_path, model=tmp_path / "nope")
    with pytest.raises(CheckpointError, match="not a Hugging Face checkpoint"):
        Trainer(cfg)


def test_tokenizer_without_chat_template_is_a_clear_error(data, tmp_path) -> None:
    from trainer.loop import Trainer
    from trainer.tiny import save_tiny

    model = save_tiny(tmp_path / "m", hidden_size=32, layers=1, heads=2, kv_heads=1)
    cfg_file = model / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.pop("chat_template", None)
    cfg_file.write_text(json.dumps(cfg))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    run_cfg = demo_config(data, tmp_path, model=model)
    with pytest.raises(CheckpointError, match="no chat template"):
        Trainer(run_cfg)


def test_long_prompts_are_dropped_before_training_or_refused_for_evaluation(data, tmp_path,
                                                                          caplog) -> None:
    """magic.max_prompt_length: a training prompt over it leaves the training set when the run
    starts (counted in the log), never mid-run; a held-out prompt over it is an error naming
    the problem, before any model loads."""
    from trainer.loop import Trainer

    train = tmp_path / "train.jsonl"
    rows = [{"id": "short", "prompt": "Compute max(1, 2).", "domain": "math",
             "ground_truth": "2"},
            {"id": "long", "prompt": "Compute max(1, 2). " * 40, "domain": "math",
             "ground_truth": "2"}]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = demo_config(data, tmp_path, eval__every_steps=0, data__eval_files="[]",
                      data__train_files=f"[{train}]", magic__max_prompt_length=64)
    trainer = Trainer(cfg)
    try:
        assert [p.id for p in trainer.train] == ["short"] and trainer.dropped_long_prompts == 1
        assert "dropped 1 of 2 training problems" in caplog.text and "long" in caplog.text
    finally:
        trainer.close()
    cfg = demo_config(data, tmp_path, data__eval_files=f"[{train}]",
                      magic__max_prompt_length=64)
    with pytest.raises(ValueError, match="problem long .*over magic.max_prompt_length=64"):
        Trainer(cfg)
    cfg = demo_config(data, tmp_path, eval__every_steps=0, data__eval_files="[]",
                      data__train_files=f"[{train}]", magic__max_prompt_length=4)
    with pytest.raises(ValueError, match="every training prompt is over"):
        Trainer(cfg)


def test_unreachable_verifier_fails_before_models_load(data, tmp_path) -> None:
    from trainer.loop import Trainer

    cfg = demo_config(data, tmp_path, verifier__addr="127.0.0.1:1",
                      verifier__connect_timeout_s=1.0)
    with pytest.raises(RewardError, match="not reachable"):
        Trainer(cfg)
    assert not (tmp_path / "t" / "warm_start").exists()  # nothing heavy happened


def test_a_reused_run_name_is_refused_and_overwrite_moves_the_old_run_aside(data, tmp_path) -> None:
    """A run directory that holds a run is never reused without --resume or --overwrite: the
    refusal is one line naming both and touches nothing; --overwrite moves the old run aside
    (never deletes it); and a start that then fails (no verifier) leaves no half-made run
    directory behind."""
    old = tmp_path / "t"
    (old / "checkpoints" / "step_000035").mkdir(parents=True)
    (old / "config.yaml").write_text("name: t\n")
    rows = "".join(json.dumps({"step": i}) + "\n" for i in range(1, 36))
    (old / "metrics.jsonl").write_text(rows)
    args = ["--config", "trainer/configs/demo.yaml",
            *overrides(data, tmp_path, verifier__connect_timeout_s=1.0)]
    r = run_cli(args)
    assert r.returncode == 2, r.stderr[-2000:]
    message = r.stderr.strip().splitlines()
    assert len(message) == 1 and "holds a run already" in message[0], r.stderr
    assert f"--resume {old}" in message[0] and "--overwrite" in message[0]
    assert (old / "metrics.jsonl").read_text() == rows  # nothing lost

    r = run_cli([*args, "--overwrite", "--verifier-addr", "127.0.0.1:1"])
    assert r.returncode != 0
    assert "moved aside" in r.stderr and "not reachable" in r.stderr, r.stderr[-2000:]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("t.replaced-")]
    assert len(aside) == 1 and (aside[0] / "metrics.jsonl").read_text() == rows
    assert (aside[0] / "checkpoints" / "step_000035").is_dir()
    assert not old.exists()  # the failed start left nothing behind


# -- a real run ------------------------------------------------------------------------------

def test_run_writes_the_run_directory_contract(data, policy, tmp_path) -> None:
    r = run_cli(["--config", "trainer/configs/demo.yaml",
                 *overrides(data, tmp_path, policy, log__samples_every=2, log__samples_prompts=2)])
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "t"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for row in rows[1:]:
        missing = [k for k in REQUIRED_KEYS if k not in row]
        assert not missing, missing
    assert "eval/accuracy" in rows[0] and "eval/arithmetic/avg@2" in rows[2]
    assert [r["stage"] for r in rows[1:]] == [0, 0, 1]  # stage a ends after 2 steps
    assert [r["stage/max_response_length"] for r in rows[1:]] == [6, 6, 8]
    assert (run / "config.yaml").exists()
    for png in ("reward.png", "entropy.png", "length.png", "time.png"):
        assert (run / "plots" / png).stat().st_size > 1000
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == "step_000003"
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / latest / "model")
    assert sum(p.numel() for p in model.parameters()) > 0
    assert "run t" in r.stdout  # the summary table
    # which rules judged the rewards: the demo's rows name no profile, so the server's default
    assert "judging profiles of the rewards: the verifier's default" in r.stdout + r.stderr
    # sample completions every 2 steps: 2 prompts x their group of 4, with the verdicts
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["step_000002.jsonl"]
    lines = (run / "samples" / "step_000002.jsonl").read_text().splitlines()
    samples = [json.loads(x) for x in lines]
    assert len(samples) == 8 and len({x["id"] for x in samples}) == 2
    assert sorted(x["sample"] for x in samples) == [0, 0, 1, 1, 2, 2, 3, 3]
    for x in samples:
        assert x["step"] == 2 and x["prompt"].startswith("Compute max(")
        assert isinstance(x["response"], str) and x["reward"] in (0.0, 1.0)
        assert x["status"] in ("CORRECT", "INCORRECT", "NO_ANSWER")
        assert isinstance(x["truncated"], bool) and 1 <= x["tokens"] <= 6
        assert not x["truncated"] or x["tokens"] == 6  # cut only at stage a's limit
        assert x["ground_truth"].isdigit()
    assert 0.0 <= rows[2]["reward/no_answer_frac"] <= 1.0


def test_verification_overlaps_generation(data, policy, tmp_path) -> None:
    """Each finished chunk goes to the verifier at once: rewards of early chunks are back
    before generation ends."""
    import trainer.loop as loop_mod
    from trainer.loop import Trainer

    arrivals: list[float] = []

    class RecordingStream(loop_mod.RewardStream):
        def wait(self, timeout_s: float = 3600.0):
            out = super().wait(timeout_s)
            arrivals.extend(self.arrived_at.values())  # when each result reached the client
            return out

    cfg = demo_config(data, tmp_path, policy, eval__every_steps=0)
    trainer = Trainer(cfg)
    original = trainer.engine.generate
    gen_end: list[float] = []

    def slow_generate(prompts, params, on_done=None):
        def slowly(chunk):
            on_done(chunk)
            time.sleep(0.2)  # a slow engine: later chunks are still generating

        out = original(prompts, params, on_done=slowly)
        gen_end.append(time.monotonic())
        return out

    trainer.engine.generate = slow_generate
    loop_mod.RewardStream = RecordingStream
    try:
        metrics = trainer.train_step()
    finally:
        loop_mod.RewardStream = RecordingStream.__mro__[1]
        trainer.close()
    assert len(arrivals) == 16
    assert sum(t < gen_end[0] for t in arrivals) >= 8  # most rewards were back before the end
    assert metrics["time/verify_wait"] < metrics["time/generate"]


@pytest.mark.parametrize("mini_batch_size, old_forwards", [(None, 0), (2, 1)])
def test_on_policy_steps_skip_the_old_logprob_forward(data, policy, tmp_path, mini_batch_size,
                                                      old_forwards) -> None:
    """With N_SGD = 1 (MAGIC's default) a step runs no separate no-grad forward for
    the old log-probs (the update's own forward gives them); two mini-batches (N_SGD = 2) keep
    the recomputation, over the response positions only."""
    from trainer.loop import Trainer

    extra = {} if mini_batch_size is None else {"magic__mini_batch_size": mini_batch_size}
    cfg = demo_config(data, tmp_path, policy, eval__every_steps=0, magic__online_filter=False,
                      **extra)
    trainer = Trainer(cfg)
    calls: list[dict] = []
    original_logprobs, original_update = trainer.backend.logprobs, trainer.backend.update
    updates: list[object] = []

    def logprobs(batch, micro_batch_size, **kw):
        calls.append(kw)
        return original_logprobs(batch, micro_batch_size, **kw)

    def update(batch, old_logprobs, *args, **kw):
        updates.append(old_logprobs)
        return original_update(batch, old_logprobs, *args, **kw)

    trainer.backend.logprobs, trainer.backend.update = logprobs, update
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert len(updates) == 1 and metrics["optimizer_steps"] == (1 if mini_batch_size is None
                                                                else 2)
    assert calls == [{"response_only": True, "temperature": cfg.magic.temperature,
                      "max_tokens_per_micro_batch": cfg.max_tokens_per_micro_batch}] * old_forwards
    assert (updates[0] is None) == (old_forwards == 0)
    if old_forwards == 0:
        assert metrics["losses/ratio_mean"] == 1.0 and metrics["losses/clipfrac"] == 0.0


@pytest.mark.slow
def test_judging_a_repeated_response_once_changes_no_number(data, policy, tmp_path) -> None:
    """verifier.dedupe (the default) sends each distinct response of a step once: the run's
    numbers are the ones a run that judges every sample gets; only rollout/judged (and time)
    differ."""
    rows = {}
    for dedupe in (True, False):
        r = run_cli(["--config", str(ROOT / "trainer" / "configs" / "demo.yaml"),
                     *overrides(data, tmp_path, policy, name=f"d{dedupe}",
                                verifier__dedupe=dedupe, checkpoint_every=0)])
        assert r.returncode == 0, r.stderr[-3000:]
        rows[dedupe] = [json.loads(x) for x in
                        (tmp_path / f"d{dedupe}" / "metrics.jsonl").read_text().splitlines()]
    steps = {d: [row for row in rs if "rollout/responses" in row] for d, rs in rows.items()}
    assert len(steps[True]) == 3
    assert all(row["rollout/judged"] == row["rollout/responses"] for row in steps[False])
    assert all(row["rollout/judged"] <= row["rollout/responses"] for row in steps[True])
    assert sum(row["rollout/judged"] for row in steps[True]) < \
        sum(row["rollout/responses"] for row in steps[True])  # this policy repeats itself

    def numbers(rs: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if not k.startswith("time/")
                 and k != "rollout/judged"} for row in rs]

    assert numbers(rows[True]) == numbers(rows[False])


def test_the_update_works_on_the_rollout_temperature(data, policy, tmp_path) -> None:
    """docs/magic.md "Temperature": a step that sampled at tau hands tau to the old log-probs'
    forward and to the update (tests/test_backends.py checks what the backend does with it)."""
    from trainer.loop import Trainer

    cfg = demo_config(data, tmp_path, policy, eval__every_steps=0, magic__online_filter=False,
                      magic__temperature=0.7, magic__mini_batch_size=2)
    trainer = Trainer(cfg)
    seen: list[tuple[str, float]] = []
    original_logprobs, original_update = trainer.backend.logprobs, trainer.backend.update

    def logprobs(batch, micro_batch_size, **kw):
        seen.append(("logprobs", kw["temperature"]))
        return original_logprobs(batch, micro_batch_size, **kw)

    def update(batch, old_logprobs, advantages, plan, loss, *args, **kw):
        seen.append(("update", loss.temperature))
        return original_update(batch, old_logprobs, advantages, plan, loss, *args, **kw)

    trainer.backend.logprobs, trainer.backend.update = logprobs, update
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert seen == [("logprobs", 0.7), ("update", 0.7)]
    assert metrics["optimizer_steps"] == 2


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_resume_after_sigkill_is_exact(data, policy, tmp_path) -> None:
    """Kill a run mid-way (SIGKILL after its step-2 checkpoint), resume it, and compare with an
    uninterrupted run: same metrics for every step, same final weights."""
    args = overrides(data, tmp_path, policy, total_steps=5, eval__every_steps=0, checkpoint_every=2,
                     keep_checkpoints=5)
    full = run_cli(["--config", "trainer/configs/demo.yaml", *args, "name=full"])
    assert full.returncode == 0, full.stderr[-3000:]
    # Without a terminal: a log line per step (its stage 1-based and named, as the docs name
    # it), the stage's end, and each checkpoint with its step and path.
    for step, stage in ((1, "stage 1/2 (a)"), (3, "stage 2/2 (b)")):
        assert re.search(rf"step {step}/5  {re.escape(stage)}  reward \d\.\d{{3}}.*  \d+\.\d s",
                         full.stderr), full.stderr[-3000:]
    assert "stage 1/2 (a) ended at step 2; next: stage 2/2 (b)" in full.stderr
    ckpt = tmp_path / "full" / "checkpoints" / "step_000002"
    assert f"checkpoint of step 2 saved: {ckpt}" in full.stderr

    proc = subprocess.Popen([sys.executable, "-m", "trainer.cli", "run", "--config",
                             "trainer/configs/demo.yaml", *args, "name=cut"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = tmp_path / "cut" / "checkpoints" / "latest"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (latest.exists() and latest.read_text() == "step_000002"):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert latest.read_text() == "step_000002"
    resumed = run_cli(["--resume", str(tmp_path / "cut")])
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    def rows(name):
        return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    a, b = rows("full"), rows("cut")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    assert sum(1 for r in a if not r["update/skipped"]) >= 2  # the comparison covers updates
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            if k.startswith("time/"):
                continue
            if isinstance(ra[k], float):
                assert ra[k] == pytest.approx(rb[k], abs=1e-6), (ra["step"], k)
            else:
                assert ra[k] == rb[k], (ra["step"], k)
    wa = _weights(tmp_path / "full" / "checkpoints" / "step_000005" / "model")
    wb = _weights(tmp_path / "cut" / "checkpoints" / "step_000005" / "model")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k


def test_ctrl_c_writes_a_resumable_checkpoint(data, policy, tmp_path) -> None:
    args = overrides(data, tmp_path, policy, total_steps=200, eval__every_steps=0, checkpoint_every=0)
    proc = subprocess.Popen([sys.executable, "-m", "trainer.cli", "run", "--config",
                             "trainer/configs/demo.yaml", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "t" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    latest = (tmp_path / "t" / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{steps[-1]:06d}" and steps[-1] < 200
    assert "interrupted" in out and "True" in out


def run_against(srv_address: str, args: list[str]) -> subprocess.Popen:
    """``trainer run`` (the demo config plus ``args``) against the verifier at ``srv_address``,
    its output piped."""
    return subprocess.Popen([sys.executable, "-m", "trainer.cli", "run", "--config",
                             "trainer/configs/demo.yaml", "--verifier-addr", srv_address, *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_steps(metrics: Path, n: int, proc: subprocess.Popen) -> None:
    """Until ``metrics`` has ``n`` rows (the run is still going), within 300 s."""
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().count("\n") >= n):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.05)


def outage_overrides(data: Path, out: Path, window_s: float, steps: int) -> list[str]:
    """A tiny random model, one stage and no periodic checkpoint or evaluation: the only
    checkpoint a stopped run can have is the one written on the way out."""
    return overrides(data, out, total_steps=steps, eval__every_steps=0, checkpoint_every=0,
                     magic__stages="[{name: a, max_response_length: 6}]",
                     verifier__outage_window_s=window_s,
                     verifier__client="{backoff_s: 0.1, max_backoff_s: 1.0}")


def test_a_verifier_gone_for_good_stops_the_run_after_a_checkpoint(data, tmp_path) -> None:
    """The run's only verifier SIGKILLed after step 2 and never back: past the 3 s outage
    window the run checkpoints its last finished step and exits 1 with a one-line error."""
    from tests.conftest import ServerProcess

    srv = ServerProcess()
    try:
        proc = run_against(srv.address, outage_overrides(data, tmp_path, 3.0, steps=500))
        metrics = tmp_path / "t" / "metrics.jsonl"
        wait_for_steps(metrics, 2, proc)
        srv.terminate(signal.SIGKILL)
        _, err = proc.communicate(timeout=240)
    finally:
        srv.terminate(signal.SIGKILL)
    assert proc.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: run stopped: verifier stream failed"), last
    assert "past the outage window of 3 s" in last and srv.address in last, last
    assert "verifier outage: every replica down" in err  # each wait was logged
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1)) and 2 <= steps[-1] < 500
    latest = (tmp_path / "t" / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{steps[-1]:06d}" and f"resume from {latest}" in last
    state = json.loads((tmp_path / "t" / "checkpoints" / latest / "trainer_state.json").read_text())
    assert state["step"] == steps[-1]
    # the failed step's prompts are not used up: a resumed run draws them again
    assert (state["sampler"]["epoch"], state["sampler"]["pos"]) == (0, 4 * steps[-1])
    assert (tmp_path / "t" / "checkpoints" / latest / "model" / "model.safetensors").exists()
    print(f"\n{last}")


def test_a_run_rides_out_a_verifier_restart(data, tmp_path) -> None:
    """The run's only verifier SIGKILLed after step 2 and restarted on its port 3 s later:
    the run waits (logging each wait), then finishes every step with every reward."""
    from tests.conftest import ServerProcess, free_port

    port = free_port()
    servers = [ServerProcess(port)]
    try:
        proc = run_against(servers[0].address, outage_overrides(data, tmp_path, 120.0, steps=6))
        metrics = tmp_path / "t" / "metrics.jsonl"
        wait_for_steps(metrics, 2, proc)
        servers[0].terminate(signal.SIGKILL)
        time.sleep(3.0)
        servers.append(ServerProcess(port))
        _, err = proc.communicate(timeout=240)
    finally:
        for srv in servers:
            srv.terminate(signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "verifier outage: every replica down" in err  # it did wait
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert (tmp_path / "t" / "checkpoints" / "latest").read_text().strip() == "step_000006"


def test_run_with_vllm_engine_and_deepspeed_backend(data, policy, tmp_path) -> None:
    """The production pieces on CPU: vLLM generates and receives the weights after each update;
    DeepSpeed (ZeRO-2, a world of one) applies the update."""
    r = run_cli(["--config", "trainer/configs/demo.yaml",
                 *overrides(data, tmp_path, policy, total_steps=2, eval__every_steps=0,
                            engine__kind="vllm", engine__chunk_size=2,
                            backend__kind="deepspeed", backend__zero_stage=2)],
                env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [1, 2]
    assert all(x["time/sync"] > 0 for x in rows if x["filtered/frac"] < 1.0)


def test_plot_means_stay_within_a_stage() -> None:
    from trainer.plot import stage_starts, trailing_mean

    assert trailing_mean([1, 2, 3, 4, 5], 2) == [1, 1.5, 2.5, 3.5, 4.5]
    assert trailing_mean([1, 1, 1, 5, 5], 10, starts=[3]) == [1, 1, 1, 5, 5]
    rows = [{"step": 0, "stage": 0, "eval/accuracy": 0.1}] + [
        {"step": s, "stage": int(s > 2), "reward/mean": 0.0,
         "stage/max_response_length": 6 if s <= 2 else 8} for s in range(1, 5)]
    assert stage_starts(rows) == [(1, 0, 6), (3, 1, 8)]


# -- the KL reference policy ---------------------------------------------------------------

@pytest.mark.parametrize("backend,kl", [("torch", {"magic__kl_coef": 0.05}),
                                        ("deepspeed", {"magic__kl_coef": 0.05}),
                                        ("torch", {"magic__log_kl": True})])
def test_kl_loss_trains_with_a_reference_policy(data, policy, tmp_path, backend, kl) -> None:
    """magic.kl_coef > 0 on both backends (DeepSpeed: ZeRO-3, a world of one), or
    magic.log_kl at kl_coef 0: the backend keeps the initial policy, losses/kl is logged every
    step, exactly 0 on the first update (the policy is still the reference) and positive on
    every later one."""
    extra = ({"backend__kind": "deepspeed", "backend__zero_stage": 3}
             if backend == "deepspeed" else {})
    r = run_cli(["--config", "trainer/configs/demo.yaml",
                 *overrides(data, tmp_path, policy, total_steps=5, eval__every_steps=0,
                            checkpoint_every=0, **kl, **extra)],
                env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert all("losses/kl" in x for x in rows)
    updated = [x for x in rows if not x["update/skipped"]]
    assert len(updated) >= 2, [x["filtered/frac"] for x in rows]
    assert updated[0]["losses/kl"] == 0.0
    assert all(x["losses/kl"] > 0 for x in updated[1:])
    assert all(x["losses/kl"] is None for x in rows if x["update/skipped"])
    assert (tmp_path / "t" / "plots" / "kl.png").stat().st_size > 1000


def test_kl_reference_too_large_for_the_memory_is_refused_before_loading(data, tmp_path) -> None:
    from trainer.loop import Trainer

    cfg = demo_config(data, tmp_path, magic__kl_coef=0.1, backend__reference_memory_gib=1e-6,
                      warm_start__steps=5)
    with pytest.raises(ValueError, match=r"needs [\d,]+ parameters x 4 bytes = .* per rank "
                                         r"\(a full copy\), more than "
                                         r"backend.reference_memory_gib = 1e-06 GiB"):
        Trainer(cfg)
    assert not (tmp_path / "t" / "warm_start").exists()  # refused before the warm start


# -- data ------------------------------------------------------------------------------------

def test_aime_parquet_loads_with_the_report_suffix_once() -> None:
    from trainer.data import DEFAULT_SUFFIX, load_problems

    problems, skipped = load_problems([AIME / "aime24.parquet", AIME / "aime25.parquet"])
    assert len(problems) == 60 and skipped == 0
    assert {p.domain for p in problems} == {"math"}
    for p in problems:
        text = p.messages[-1]["content"]
        assert text.count(DEFAULT_SUFFIX.strip()) == 1  # already there: not appended twice
    assert problems[0].ground_truth == "204"


def test_malformed_rows_name_file_and_line_or_are_counted(tmp_path) -> None:
    from trainer.data import DataError, load_problems

    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": "a", "prompt": "1+1?", "ground_truth": "2"}\n{oops\n'
                 '{"id": "b", "prompt": "2+2?"}\n{"id": "c", "prompt": "3+3?", "ground_truth": "6"}\n')
    with pytest.raises(DataError, match="bad.jsonl: line 2"):
        load_problems([f])
    problems, skipped = load_problems([f], skip_invalid=True)
    assert [p.id for p in problems] == ["a", "c"] and skipped == 2


def test_sampler_resumes_exactly() -> None:
    from trainer.data import PromptSampler

    a = PromptSampler(10, seed=4)
    first = a.next(7)
    state = a.state_dict()
    rest = a.next(9)  # crosses into epoch 1
    b = PromptSampler(10, seed=4)
    b.load_state_dict(state)
    assert b.next(9) == rest and sorted(first + rest[:3]) == list(range(10))


@pytest.mark.parametrize("name", ["skywork_or1_7b", "skywork_or1_32b"])
def test_report_recipes_load_with_the_released_values(name) -> None:
    """docs/magic.md's table, as the shipped recipe configs state it."""
    cfg = load_config(ROOT / "trainer" / "configs" / f"{name}.yaml", ["data.train_files=[x.parquet]"])
    m = cfg.magic
    assert (m.prompts_per_step, m.group_size) == (256, 16)
    assert (m.temperature, m.top_p, m.top_k, m.max_prompt_length) == (1.0, 1.0, -1, 2048)
    assert [s.max_response_length for s in m.stages] == [8192, 16384, 32768]
    assert (m.lr, tuple(m.betas), m.weight_decay, m.grad_clip) == (1e-6, (0.9, 0.999), 0.01, 1.0)
    assert m.kl_coef == 0.0 and m.off_policy().is_on_policy
    assert (m.entropy_mode, m.entropy_target, m.entropy_delta) == ("adaptive", 0.2, 1e-4)
    assert (m.entropy_coef_min, m.entropy_coef_max, m.entropy_coef_init) == (0.0, 0.005, 0.0)
    assert (m.clip_low, m.clip_high, m.mask_mode, m.online_filter) == (0.2, 0.2, "none", True)
    assert (cfg.eval.n_samples, cfg.eval.temperature, cfg.eval.max_tokens) == (32, 0.6, 32768)
    assert cfg.engine.kind == "vllm" and cfg.backend.kind == "deepspeed"
    assert cfg.verifier.profile == "skywork"  # rewards judged by the released reward's rules


def deepspeed_launch(*args: str, ranks: int = 2) -> subprocess.CompletedProcess:
    """`deepspeed --num_gpus RANKS --module trainer.cli run ARGS` (CPU: one process per rank).
    A run that succeeds must leave none of DeepSpeed's shm all-reduce buffers behind (they are
    RAM: leaked launches once filled /dev/shm until a rank was OOM-killed)."""
    import shutil as sh

    from tests.conftest import deepspeed_shm_buffers, free_port

    exe = sh.which("deepspeed", path=str(Path(sys.executable).parent))
    assert exe is not None, "the deepspeed launcher is not installed next to this Python"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    port = free_port()
    cmd = [exe, "--num_gpus", str(ranks), "--master_port", str(port), "--module",
           "trainer.cli", "run", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    if proc.returncode == 0:
        assert deepspeed_shm_buffers(port) == []
    return proc


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_data_parallel_ranks_under_the_deepspeed_launcher(data, policy, tmp_path) -> None:
    """`trainer run` under `deepspeed --num_gpus 2`: each rank generates and verifies its half
    of the prompts, the DeepSpeed update averages over both, both engines receive the same
    weights, rank 0 alone writes the run directory, and a resume continues from the shared
    checkpoint."""
    args = overrides(data, tmp_path, policy, total_steps=3, eval__every_steps=2,
                     checkpoint_every=2, backend__kind="deepspeed", backend__zero_stage=2,
                     magic__prompts_per_step=4, magic__mini_batch_size=2)
    launch = deepspeed_launch
    r = launch("--config", "trainer/configs/demo.yaml", *args)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    run = tmp_path / "t"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [0, 1, 2, 3]  # one writer: no duplicate rows
    assert all(x["filtered/frac"] <= 1.0 for x in rows[1:])
    assert "eval/accuracy" in rows[2]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000003"
    # resume from the 3-step run to 4 steps, still with two ranks
    r2 = launch("--resume", str(run), "total_steps=4")
    assert r2.returncode == 0, r2.stdout[-4000:] + r2.stderr[-4000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_two_ranks_share_one_tensor_parallel_vllm_engine(data, policy, tmp_path) -> None:
    """The 32B recipe's layout on CPU, scaled down: `deepspeed --num_gpus 2` with
    engine.tensor_parallel_size=2, so both ranks run ONE vLLM engine (a shard each, vLLM's
    external launcher). The engine generates every prompt; each rank verifies and trains on its
    half (every response judged once), DeepSpeed ZeRO-3 updates, the full weights go back into
    both shards, and evaluation runs through the same engine."""
    P, G = 4, 4
    r = deepspeed_launch("--config", "trainer/configs/demo.yaml", *overrides(
        data, tmp_path, policy, total_steps=2, eval__every_steps=2, checkpoint_every=0,
        backend__kind="deepspeed", backend__zero_stage=3, engine__kind="vllm",
        engine__tensor_parallel_size=2, engine__chunk_size=2, magic__prompts_per_step=P,
        magic__group_size=G, magic__mini_batch_size=2))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [0, 1, 2]
    assert all(x["rollout/responses"] == P * G and x["reward/unjudged"] == 0 for x in rows[1:])
    assert any(x["update/skipped"] == 0 and x["time/sync"] > 0 for x in rows[1:])
    assert "eval/accuracy" in rows[2]
    assert (tmp_path / "t" / "checkpoints" / "latest").read_text().strip() == "step_000002"


def test_tensor_parallel_size_must_divide_the_ranks(data, tmp_path, monkeypatch) -> None:
    from trainer.loop import Trainer

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = demo_config(data, tmp_path, tmp_path / "m", engine__kind="vllm",
                      engine__tensor_parallel_size=4)
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(4\) must divide the number "
                                         r"of ranks \(2\)"):
        Trainer(cfg)


def test_verifier_client_options_reach_the_client_config(data, tmp_path) -> None:
    cfg = demo_config(data, tmp_path, **{"verifier__client": "{token_file: /run/token, max_retries: 3}"})
    cc = cfg.verifier_client_config()
    assert (str(cc.token_file), cc.max_retries) == ("/run/token", 3)
    assert cc.outage_window_s == 0.0  # the local verifier is never restarted: nothing to wait for
    fleet = demo_config(data, tmp_path, verifier__addr="10.0.0.1:50051",
                        verifier__outage_window_s=42).verifier_client_config()
    assert fleet.outage_window_s == 42.0
    assert demo_config(data, tmp_path, verifier__addr="10.0.0.1:50051").verifier_client_config() \
        .outage_window_s == 600.0
    with pytest.raises(ValueError, match="verifier.client"):
        demo_config(data, tmp_path, **{"verifier__client": "{no_such_option: 1}"})


def test_unlink_shared_memory_keeps_mappings_and_frees_the_name() -> None:
    """What the DeepSpeed and vLLM engines do once every rank has mapped the CPU collectives'
    buffers: the names go (nothing for a later or killed run to leak), the mapped memory stays
    usable, and names already gone are skipped."""
    import mmap

    from trainer.dist import SHM_DIR, unlink_shared_memory

    name = f"magic_test_{os.getpid()}_{time.monotonic_ns()}"
    fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)  # as shm_open does
    os.ftruncate(fd, 4096)
    buf = mmap.mmap(fd, 4096)
    os.close(fd)
    try:
        buf[:3] = b"abc"
        assert unlink_shared_memory([f"/{name}", "magic_test_never_made"]) == [f"/{name}"]
        assert not (SHM_DIR / name).exists()
        buf[3:6] = b"def"  # the mapping outlives the name
        assert buf[:6] == b"abcdef"
        assert unlink_shared_memory([name]) == []
    finally:
        buf.close()
        (SHM_DIR / name).unlink(missing_ok=True)


def test_a_step_line_names_what_the_step_has_and_nothing_else() -> None:
    """The per-step log line: the stage 1-based with its name; a metric the step does not have
    (entropy when every group was filtered out: nan) is left out, never printed as nan."""
    from trainer.metrics_log import step_line

    line = step_line({"step": 7, "stage": 1, "reward/mean": 0.25, "entropy": float("nan"),
                      "truncated/frac": 0.125, "response_length/mean": 41.26, "time/step": 2.04,
                      "eval/accuracy": 0.6}, 160, ["short", "long"])
    assert line == ("step 7/160  stage 2/2 (long)  reward 0.250  eval 60.0%  truncated 12.5%  "
                    "length 41.3  2.0 s")
    assert step_line({"step": 0, "stage": 0, "eval/accuracy": 0.5}, 10) == (
        "step 0/10  stage 1  eval 50.0%")
