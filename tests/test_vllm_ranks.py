"""vLLM across ranks for real on CPU: two processes under ``torch.distributed.run`` (the
launcher contract DeepSpeed also follows), gloo process group first (as the DeepSpeed backend
makes it), then one ``VLLMEngine`` per rank through vLLM's external launcher.

- ``tp=2``: both ranks hold one shard of ONE engine (the 32B recipe's layout, 4 ranks there).
  They must produce identical completions, and after ``load_weights`` with the full tensors
  the sharded engine's log-probs must match the trainer's (HF) model: vLLM's loaders keep each
  rank's shard.
- ``tp=1``: two independent engines (data parallel), each weight-synced.

The worker is this file run as a script; each rank writes a JSON record the tests assert on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["What is 2+3?", "Say hi.", "Compute 7*8.", "Name a prime."]

pytestmark = pytest.mark.slow


def _launch(tmp: Path, tp: int) -> list[dict[str, Any]]:
    from tests.conftest import free_port
    from trainer.tiny import save_tiny

    model = tmp / "tiny"
    if not (model / "config.json").exists():
        save_tiny(model, heads=2, kv_heads=1, seed=0)  # head_dim 32 for vLLM's CPU kernels
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), __file__, str(model), str(tmp), str(tp)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    records = [tmp / f"tp{tp}_rank{r}.json" for r in range(2)]
    if proc.returncode != 0 or not all(p.exists() for p in records):
        pytest.fail(f"2-rank vLLM run failed (rc={proc.returncode}, "
                    f"{time.monotonic() - t0:.0f} s):\n{(proc.stdout + proc.stderr)[-6000:]}",
                    pytrace=False)
    return [json.loads(p.read_text()) for p in records]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm_ranks")


def test_two_ranks_share_one_tensor_parallel_engine(tmp: Path) -> None:
    r0, r1 = _launch(tmp, tp=2)
    assert r0["engine"] == r1["engine"] == {"tp": 2, "dp": 1, "dp_rank": 0}
    assert r0["tokens"] == r1["tokens"], "the two shards of one engine sampled differently"
    assert len(r0["tokens"]) == len(PROMPTS) * 3
    for r in (r0, r1):
        assert r["initial_max_abs_diff"] < 1e-3, r
        assert r["before_sync_max_abs_diff"] > 0.05, "the perturbation changed nothing"
        assert r["after_sync_max_abs_diff"] < 1e-3, r
    assert r0["tokens_after"] == r1["tokens_after"] != r0["tokens"]
    assert r0["shm_names"] == r1["shm_names"] == []


def test_two_ranks_with_one_engine_each(tmp: Path) -> None:
    r0, r1 = _launch(tmp, tp=1)
    assert [r["engine"] for r in (r0, r1)] == [{"tp": 1, "dp": 2, "dp_rank": 0},
                                                {"tp": 1, "dp": 2, "dp_rank": 1}]
    for r in (r0, r1):
        assert r["after_sync_max_abs_diff"] < 1e-3 < r["before_sync_max_abs_diff"], r
    # each engine generated its own prompts (rank r's are the prompts reversed for rank 1)
    assert r0["prompts"] != r1["prompts"]


# ------------------------------------------------------------------------------------------
# The worker: one rank (run by torch.distributed.run as a script).
# ------------------------------------------------------------------------------------------

def _worker(model: Path, out_dir: Path, tp: int) -> None:
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from trainer.dist import SHM_DIR
    from trainer.engines import EngineConfig, create_engine
    from trainer.hf_utils import chat_prompt_ids, load_tokenizer
    from trainer.interfaces import SamplingParams

    dist.init_process_group("gloo")  # what the DeepSpeed backend does on CPU, before the engine
    rank = dist.get_rank()
    tok = load_tokenizer(model)
    texts = PROMPTS if tp > 1 or rank == 0 else PROMPTS[::-1]  # data parallel: own prompts
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": p}]) for p in texts]
    cfg = EngineConfig(kind="vllm", dtype="float32", enforce_eager=True, kv_cache_gib=0.25,
                       tensor_parallel_size=tp, seed=0, chunk_size=2)
    engine = create_engine(cfg, model, tok)
    # vLLM's CPU collectives' shared memory, by name, while the engine is alive: none (the
    # names are removed once every rank has mapped them, so a killed run leaves nothing)
    shm_names = sorted(p.name for p in SHM_DIR.glob("*cpushm*"))
    pc = engine.llm.llm_engine.vllm_config.parallel_config
    rec: dict[str, Any] = {"engine": {"tp": pc.tensor_parallel_size, "dp": pc.data_parallel_size,
                                      "dp_rank": pc.data_parallel_rank},
                           "prompts": prompts, "shm_names": shm_names}
    params = SamplingParams(n=3, temperature=1.0, max_tokens=24, seed=7)
    rec["tokens"] = [c.token_ids for c in engine.generate(prompts, params)]

    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    prompt = prompts[0]
    response = [tok.convert_tokens_to_ids(ch) for ch in "The answer is 5."]

    def diff() -> float:
        seq = torch.tensor([prompt + response])
        with torch.no_grad():
            logits = hf(seq).logits[0, :-1]  # [L-1, V]
        lp = torch.log_softmax(logits, -1).gather(-1, seq[0, 1:, None])[:, 0][len(prompt) - 1:]
        return max(abs(a - b) for a, b in zip(lp.tolist(), engine.logprobs_of(prompt, response)))

    rec["initial_max_abs_diff"] = diff()
    gen = torch.Generator().manual_seed(1)  # the same "update" on every rank
    with torch.no_grad():
        for _, p in hf.named_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    rec["before_sync_max_abs_diff"] = diff()
    engine.load_weights(hf.named_parameters())
    rec["after_sync_max_abs_diff"] = diff()
    rec["tokens_after"] = [c.token_ids for c in engine.generate(prompts, params)]
    engine.close()
    (out_dir / f"tp{tp}_rank{rank}.json").write_text(json.dumps(rec))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
