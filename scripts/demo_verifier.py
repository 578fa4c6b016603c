"""`make demo-verifier`: start a real verifier service, score the bundled sample items over gRPC, print
the verdicts and a summary table, then stop the service with SIGTERM (graceful drain).

It shows math equivalence, the known math-verify weak spots, an expression bomb, bad input, and
sandboxed code verdicts.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verifier.cli import run_check, summary_table  # noqa: E402
from verifier.config import CheckConfig  # noqa: E402
from verifier.client.local import LocalVerifier  # noqa: E402


def main() -> None:
    console = Console(width=max(140, Console().width))
    started = time.monotonic()
    server = LocalVerifier(workers=2)
    if server.sandbox_problem:
        console.print(f"[yellow]sandbox problem:[/yellow] {server.sandbox_problem}")
    console.print(f"verifier serving on [bold]{server.address}[/bold] "
                  f"(started in {time.monotonic() - started:.1f} s)")
    out = ROOT / "runs" / "demo-verifier" / "results.jsonl"
    try:
        results = run_check(CheckConfig(input=ROOT / "verifier" / "samples" / "demo.jsonl",
                                        output=out, addr=server.address, progress="off"))
    finally:
        code = server.stop()
    table = Table(title="verdicts")
    for col in ("id", "domain", "status", "reward", "tests", "ms"):
        table.add_column(col, no_wrap=True)
    table.add_column("detail", overflow="fold")
    items = [json.loads(x) for x in (ROOT / "verifier" / "samples" / "demo.jsonl").read_text().splitlines()]
    for item, r in zip(items, results):
        tests = f"{r.passed}/{r.total}" if r.total else ""
        color = "green" if r.correct else "red"
        table.add_row(r.id, str(item.get("domain")), f"[{color}]{r.status.value}[/{color}]",
                      f"{r.reward:.1f}", tests, f"{r.elapsed_ms:.0f}", r.detail[:80])
    console.print(table)
    console.print(summary_table(results, title="summary by data source"))
    console.print(f"results written to {out.relative_to(ROOT)}; server drained and exited "
                  f"with code {code}")


if __name__ == "__main__":
    main()
