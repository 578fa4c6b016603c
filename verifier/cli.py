"""``verifier`` command line: ``serve``, ``check``, ``eval`` and ``health`` (docs/contracts.md 2).

Each subcommand is one config dataclass of verifier/config.py; tyro turns its fields and their
docstrings into flags and help text. A command imports the module that runs it only when it runs.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterator

import tyro
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from verifier.scoring.bigint import MAX_INT_DIGITS, json_loads_digits
from verifier.client import VerifierClient
from verifier.config import CheckConfig, EvalConfig, HealthConfig, ServeConfig
from verifier.items import (NOT_A_VERDICT, Item, Limits, Outcome, Result, Status, VerifierError,
                            invalid, item_from_dict)
from verifier.logs import setup_logging

log = logging.getLogger("verifier")

EXIT_NOT_JUDGED = 3
"""``verifier check``'s exit status when the results were written but some items got no
verdict (as ``verifier eval``'s: verifier/eval/evaluate.py)."""


def read_items(path: Path) -> Iterator[Item | tuple[str, Outcome]]:
    """Yield one Item (or an ``(id, INVALID_INPUT)`` pair) per non-empty line; a malformed line
    becomes an INVALID_INPUT result naming the line instead of stopping the file. An item
    without an id gets ``#LINE`` (its line number), as every generated id is spelt."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json_loads_digits(line, MAX_INT_DIGITS)  # any profile's integers
            except RecursionError:  # json's depth bound: thousands of brackets on one line
                yield f"#{lineno}", invalid(f"{path.name} line {lineno}: JSON nested too deeply")
                continue
            except ValueError as e:
                yield f"#{lineno}", invalid(f"{path.name} line {lineno}: not valid JSON: {e}")
                continue
            parsed = item_from_dict(obj, index=lineno)
            if isinstance(parsed, tuple):
                yield parsed[0], Outcome(parsed[1].status, f"line {lineno}: {parsed[1].detail}")
            else:
                yield parsed


def _progress(mode: str, console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]scoring"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, disable=(mode == "off") or (mode == "auto" and not console.is_terminal),
        transient=False,
    )


def duplicate_ids(entries: list[Item | tuple[str, Outcome]]) -> dict[str, int]:
    """Ids given to more than one item of a file -> how many items share each."""
    counts = Counter(e[0] if isinstance(e, tuple) else e.id for e in entries)
    return {k: n for k, n in counts.items() if n > 1}


def unjudged_line(results: list[Result], output: Path) -> str | None:
    """One line counting the items that got no verdict, by status, with the first few ids;
    None when every item was judged."""
    bad = [r for r in results if r.status in NOT_A_VERDICT]
    if not bad:
        return None
    by = Counter(r.status.value for r in bad)
    ids = ", ".join(str(r.id) for r in bad[:5]) + (", ..." if len(bad) > 5 else "")
    return (f"{len(bad)} of {len(results)} items got no verdict "
            f"({', '.join(f'{k} {n}' for k, n in by.most_common())}: {ids}); their details "
            f"are in {output}; --allow-unjudged exits 0")


def run_check(cfg: CheckConfig) -> list[Result]:
    if not cfg.input.is_file():
        raise VerifierError(f"--input {cfg.input}: no such file", "invalid_argument")
    entries = list(read_items(cfg.input))
    dup = duplicate_ids(entries)
    if dup:
        shown = ", ".join(f"{k!r} x{n}" for k, n in list(dup.items())[:5])
        log.warning("%d ids are given to more than one item of %s (%s%s): results keep the "
                    "input's order, one line per item; match them by line, not by id",
                    len(dup), cfg.input, shown, ", ..." if len(dup) > 5 else "")
    console = Console(stderr=True)
    results: list[Result | None] = [None] * len(entries)
    with _progress(cfg.progress, console) as bar:
        task = bar.add_task("scoring", total=len(entries))
        if cfg.addr is None:
            # Imported here, not at the top: the scoring engine (sandbox backends, the pools,
            # sympy in the workers) is for in-process scoring only; `check --addr` and
            # `health` start without it (verifier/config.py).
            from verifier.scoring.scorer import Scorer

            with Scorer(cfg.scoring) as scorer:
                if scorer.sandbox_problem:
                    log.warning("code items will get SANDBOX_ERROR: %s", scorer.sandbox_problem)
                futures = [scorer.submit(e, block_s=3600.0) for e in entries]
                for i, fut in enumerate(futures):
                    results[i] = fut.result()
                    bar.advance(task)
        else:
            # Wire ids are line indices, so duplicate or odd ids in the file cannot collide on
            # the stream; each result gets its item's own id back below.
            wire: list[Item] = []
            for i, e in enumerate(entries):
                if isinstance(e, tuple):
                    results[i] = Result.from_outcome(e[0], e[1], Limits(), 0.0)
                    bar.advance(task)
                else:
                    wire.append(Item(str(i), e.domain, e.response, e.ground_truth,
                                     e.data_source, e.limits))
            with VerifierClient(cfg.addr, cfg.client) as client:
                for r in client.stream(wire):
                    i = int(r.id)
                    entry = entries[i]
                    assert not isinstance(entry, tuple)
                    r.id = entry.id
                    results[i] = r
                    bar.advance(task)
    done = [r for r in results if r is not None]
    if len(done) != len(results):
        raise RuntimeError(f"{len(results) - len(done)} items got no result")
    cfg.output.parent.mkdir(parents=True, exist_ok=True)
    with cfg.output.open("w", encoding="utf-8") as f:
        for r in done:
            f.write(json.dumps(r.to_dict()) + "\n")
    return done


def summary_table(results: list[Result], title: str = "verifier results") -> Table:
    """Counts by status and mean reward, overall and per data source."""
    by_source: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        by_source[r.data_source or "-"].append(r)
    statuses = [s.value for s in Status if any(r.status is s for r in results)]
    table = Table(title=title)
    table.add_column("data_source")
    table.add_column("items", justify="right")
    table.add_column("mean reward", justify="right")
    for s in statuses:
        table.add_column(s, justify="right")
    rows = sorted(by_source.items()) + ([("ALL", results)] if len(by_source) > 1 else [])
    for name, rs in rows:
        counts = Counter(r.status.value for r in rs)
        mean = sum(r.reward for r in rs) / len(rs) if rs else 0.0
        table.add_row(name, str(len(rs)), f"{mean:.3f}", *[str(counts.get(s, 0)) for s in statuses])
    return table


def run_health(cfg: HealthConfig) -> int:
    try:
        with VerifierClient(cfg.addr, cfg.client) as client:
            states = client.replica_health(timeout_s=cfg.wait_s)
    except VerifierError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for address, ok in states.items():
        print(f"{address}: {'SERVING' if ok else 'NOT SERVING'}")
    return 0 if states and all(states.values()) else 1


def main(argv: list[str] | None = None) -> int:
    try:
        config: Any = tyro.extras.subcommand_cli_from_dict(
            {"serve": ServeConfig, "check": CheckConfig, "eval": EvalConfig,
             "health": HealthConfig},
            args=argv,
            config=(tyro.conf.OmitArgPrefixes,),
        )
    except ValueError as e:  # a cross-field rule of a config dataclass
        Console(stderr=True).print(f"[red]error:[/red] {e}")
        return 2
    setup_logging(config.log_format)
    if isinstance(config, HealthConfig):
        return run_health(config)
    # Each command imports the module that runs it here, not at the top: every command builds
    # the parser of all four, and only the one that runs should pay for its engine
    # (verifier/config.py says why the start matters).
    if isinstance(config, ServeConfig):
        from verifier.service.server import serve

        try:
            serve(config)
        except VerifierError as e:  # a port in use, a bind that failed: one line, no traceback
            Console(stderr=True).print(f"[red]error:[/red] {escape(str(e))}", highlight=False,
                                      soft_wrap=True)
            return 2
        return 0
    if isinstance(config, EvalConfig):
        from verifier.eval.evaluate import exit_code, print_report, run_eval

        try:
            summary = run_eval(config)
        except VerifierError as e:
            Console(stderr=True).print(f"[red]error:[/red] {escape(str(e))}", highlight=False,
                                      soft_wrap=True)
            return 1
        print_report(summary, Console())
        return exit_code(summary)  # 3 when rows were not judged (verifier.eval.evaluate)
    try:
        results = run_check(config)
    except VerifierError as e:  # a missing input file, a verifier that cannot be reached
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(e))}", highlight=False,
                                  soft_wrap=True)
        return 2
    Console().print(summary_table(results))
    line = unjudged_line(results, config.output)
    if line is None:
        return 0
    Console(stderr=True).print(f"[yellow]warning:[/yellow] {escape(line)}" if
                               config.allow_unjudged else f"[red]error:[/red] {escape(line)}",
                               highlight=False, soft_wrap=True)
    return 0 if config.allow_unjudged else EXIT_NOT_JUDGED


if __name__ == "__main__":
    sys.exit(main())
