"""`make gpu-check` (scripts/gpu_check.py) in its CPU form, so that it cannot rot before a CUDA
machine runs it: the tiniest shapes (``--quick``), every phase, one JSON that says no GPU was
used, and a docs/gpu.md section (here a copy in tmp_path) that says the same. The CUDA form's
numbers are in docs/gpu.md once a CUDA machine has run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import gpu_check

pytest.importorskip("deepspeed")  # the backends and trainer_run phases run DeepSpeed

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory) -> tuple[dict, Path, subprocess.CompletedProcess]:
    """The script's CPU form once (about 25 s alone on 2 cores): (report, doc, process)."""
    tmp = tmp_path_factory.mktemp("gpu-check")
    doc = tmp / "gpu.md"
    doc.write_text("# GPU check\n\nhand-written text that must survive\n")
    out = tmp / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu", "--quick",
         "--out", str(out), "--doc", str(doc), "--work", str(tmp / "work")],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), doc, proc


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_cpu_form_runs_every_phase_and_says_no_gpu_was_used(cpu_check) -> None:
    report, doc, proc = cpu_check
    failed = {n: p.get("error") for n, p in report["phases"].items() if p["status"] == "failed"}
    assert proc.returncode == 0 and report["ok"], (failed, proc.stderr[-3000:])
    assert report["gpu"] is False and report["device"] == "cpu"
    assert report["sizes_name"] == "quick"
    assert "no gpu was used" in proc.stdout.lower()
    phases = report["phases"]
    assert set(phases) == set(gpu_check.PHASES)
    assert phases["install"]["status"] == "skipped" and "no GPU" in phases["install"]["reason"]
    for name in ("numerics", "backends", "update_lengths", "engine", "trainer_run"):
        assert phases[name]["status"] == "passed", (name, phases[name].get("error"))

    # numerics: fp32 against trainer/magic/reference_step.py, bf16 against fp32, within tolerance
    checks = phases["numerics"]["checks"]
    assert set(checks) == {"cpu_fp32_vs_reference_step", "cpu_bf16_vs_cpu_fp32"}
    for name, c in checks.items():
        tol = gpu_check.TOLERANCES[c["kind"]]
        assert c["passed"] and c["max_rel"] <= tol["max_rel"] and c["rel_l2"] <= tol["rel_l2"]
        assert c["update_max_abs"] > 1e-3, name  # the compared update moved the weights
    assert checks["cpu_fp32_vs_reference_step"]["kind"] == "float32"
    assert checks["cpu_bf16_vs_cpu_fp32"]["kind"] == "bfloat16"
    # bf16 really computed in bf16: not bit-equal to float32
    assert checks["cpu_bf16_vs_cpu_fp32"]["rel_l2"] > 1e-5

    # backends: torch, ZeRO-2, ZeRO-3, checkpointing off and on; no MFU without a GPU
    results = phases["backends"]["results"]
    assert set(results) == {"torch", "torch +gc", "zero2", "zero2 +gc", "zero3", "zero3 +gc"}
    for name, r in results.items():
        assert r["ok"], (name, r.get("error"))
        for row in r["rows"]:
            assert row["tokens_per_s"] > 0 and row["peak_memory_gib"] > 0
            assert "mfu" not in row
    assert "not reported" in phases["backends"]["mfu"]

    # update_lengths: long-tailed rows, packed against the row split on the same weights
    ul = phases["update_lengths"]
    assert ul["status"] == "passed", ul.get("error")
    assert ul["logprob_abs_diff"]["max"] <= 1e-4 and ul["cut_rows"] >= 1
    assert ul["results"]["packed"]["computed_over_useful"] == 1.0
    assert ul["results"]["row_split"]["computed_over_useful"] > 1.0
    assert ul["time_per_useful_token_ratio"] > 0 and "mfu_useful" not in ul["results"]["packed"]
    assert "Update at real lengths" in doc.read_text()

    engine = phases["engine"]
    assert engine["hf"]["tokens_per_s"] > 0 and engine["hf"]["generated_tokens"] > 0
    assert "vllm" in engine and ("note" in engine["vllm"] or "tokens_per_s" in engine["vllm"])

    runs = phases["trainer_run"]["runs"]
    for kind in ("torch", "deepspeed"):
        r = runs[kind]
        assert r["ok"] and r["logged_steps"] == [1, 2, 3] and r["checkpoint_step"] == 2
        assert r["latest_checkpoint"] == "step_000003" and r["weights_moved_after_resume"] > 0

    text = doc.read_text()
    assert text.startswith("# GPU check\n\nhand-written text that must survive\n")
    assert "No GPU was used" in text and "only a smoke test" in text
    assert text.count("<!-- gpu-check:cpu:begin -->") == 1
    assert report["versions"]["torch"] in text and report["machine"]["cpu_count"] is not None


def test_doc_section_is_replaced_in_place_per_kind(cpu_check, tmp_path) -> None:
    """A second CPU run replaces the CPU section; a CUDA report gets its own section, and the
    text around both stays."""
    report = cpu_check[0]
    doc = tmp_path / "gpu.md"
    doc.write_text("# GPU check\n\nintro\n")
    gpu_check.update_doc(doc, report)
    gpu_check.update_doc(doc, {**report, "date": "2099-01-01T00:00:00+00:00"})
    cuda = {**report, "gpu": True, "machine": {**report["machine"], "device_name": "NVIDIA H200",
                                               "device_memory_gib": 140.0, "capability": "9.0"}}
    gpu_check.update_doc(doc, cuda)
    text = doc.read_text()
    assert text.startswith("# GPU check\n\nintro\n")
    assert text.count("<!-- gpu-check:cpu:begin -->") == 1 and "2099-01-01" in text
    assert text.count("<!-- gpu-check:cuda:begin -->") == 1 and "NVIDIA H200" in text
    cuda_part = text.split("<!-- gpu-check:cuda:begin -->")[1]
    assert "No GPU was used" not in cuda_part


def test_peak_table_and_mfu_inputs() -> None:
    assert gpu_check.peak_tflops("NVIDIA H200", None)[0] == 989.0
    assert gpu_check.peak_tflops("NVIDIA H100 80GB HBM3", None)[0] == 989.0
    assert gpu_check.peak_tflops("NVIDIA H100 PCIe", None)[0] == 756.0
    assert gpu_check.peak_tflops("NVIDIA A100-SXM4-80GB", None)[0] == 312.0
    peak, why = gpu_check.peak_tflops("Some Future GPU", None)
    assert peak is None and "--peak-tflops" in why
    assert gpu_check.peak_tflops("Some Future GPU", 500.0) == (500.0, "--peak-tflops")
    assert gpu_check.SIZES["cuda"].model == gpu_check.QWEN2_1_5B
    assert max(gpu_check.SIZES["cuda"].lengths) >= 4096 and gpu_check.SIZES["cuda"].run_steps >= 10
    cuda = gpu_check.SIZES["cuda"]  # issue 48: mean about 4K, cut at 16K
    assert cuda.tail_cut == 16384 and 3500 <= cuda.tail_median * 1.377 <= 4500


def test_committed_doc_says_where_its_numbers_come_from() -> None:
    """docs/gpu.md: its CPU section (written by `make gpu-check` here) says no GPU was used."""
    text = (ROOT / "docs" / "gpu.md").read_text()
    cpu = text.split("<!-- gpu-check:cpu:begin -->")[1].split("<!-- gpu-check:cpu:end -->")[0]
    assert "No GPU was used" in cpu
