"""The README's quickstart, run as it is written (a verifier served on its own, `verifier check`
on the bundled sample, `trainer run --config trainer/configs/quickstart.yaml --verifier-addr`
against it): every command exits as the README says, and the tiny model learns. The README's
figures (24.0% -> 61.0% held-out at steps 0 and 30 here) depend on the CPU's kernels (the warm
start is chaotic: docs/demo.md), so the guard is a gain, not the figures. About 3 minutes of
CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.plot import read_metrics
from verifier.client.local import LocalVerifier

ROOT = Path(__file__).resolve().parents[1]


def cli(cwd: Path, module: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_quickstart_runs_as_written_and_learns(tmp_path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import demo  # scripts/demo.py: what `make demo-data` runs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    demo.write_data(tmp_path / "runs" / "demo-data")
    with LocalVerifier(workers=2) as verifier:
        check = cli(ROOT, "verifier.cli", "check", "--addr", verifier.address, "--input",
                    "verifier/samples/demo.jsonl", "--output", str(tmp_path / "check.jsonl"),
                    "--allow-unjudged", "--progress", "off", timeout=600)
        assert check.returncode == 0, check.stderr[-2000:]
        assert len((tmp_path / "check.jsonl").read_text().splitlines()) == \
            len([x for x in (ROOT / "verifier/samples/demo.jsonl").read_text().splitlines()
                 if x.strip()])
        run = cli(tmp_path, "trainer.cli", "run", "--config",
                  str(ROOT / "trainer/configs/quickstart.yaml"), "--verifier-addr",
                  verifier.address, timeout=1700)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    rows = read_metrics(tmp_path / "runs" / "quickstart")
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    assert sorted(evals) == [0, 10, 20, 30], evals
    assert evals[30] - evals[0] >= 0.10, evals  # learns: +37 points on the machine it was made
    assert (tmp_path / "runs/quickstart/checkpoints/step_000030/model/config.json").exists()
    assert json.loads((tmp_path / "runs/quickstart/environment.json").read_text())
