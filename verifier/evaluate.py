"""``verifier eval``: score k sampled responses per problem and report avg@k / pass@k
(docs/contracts.md 2), the way the Skywork-OR1 report does (AIME24/25 avg@32, LiveCodeBench avg@4).

Input: a JSONL of generations, one problem per line::

    {"id": "...", "domain": "math" | "code", "ground_truth": ..., "data_source": "aime24",
     "responses": ["...", "..."], "limits": {...}}

Or, drop-in (``--problems FILE[,FILE...] --generations FILE``): problems in any format the
verifier reads (verifier/problems.py: LiveCodeBench release rows, verl/Skywork parquet, plain
JSONL) and a generations file in LiveCodeBench's custom-evaluator JSON or JSONL of full outputs
(verifier/generations.py), matched by id. LiveCodeBench problems are judged under the ``lcb``
profile (``--lcb-profile``) and kept only inside the report's contest-date window
(``--lcb-start/--lcb-end``, ``--lcb-all-dates``); those outside, and problems without a
generation, are left out of every number and counted (and named) in the summary, never scored
as 0. A generation naming no problem is an error listing them.

One hostile row never ends a run: whatever a row makes the readers raise (JSON nested too deeply
included) is that row's error, named by file and line, and skipped with ``--skip-invalid``. A
problem that cannot be judged (a LiveCodeBench row whose tests inflate past
``verifier.lcb.MAX_LCB_TESTS_BYTES``, a ground truth over the verifier's cap) is never sent: its
responses become INVALID_INPUT results here, named in the summary's ``not_judged``, and like
any response the verifier could not score they fail the command unless ``--allow-errors``.

Each (problem, response j) becomes one verifier item with the wire id ``f"{line}:{j}"`` and is
scored through the same code as ``verifier check`` (in-process ``Scorer``, or a running server
through ``VerifierClient.stream``). The metrics are small pure functions (``pass_at_k``,
``avg_at_k``, ``standard_error``, ``metrics``) that callers such as the trainer can import.

All metric values in the summary are fractions in [0, 1]; the stdout table shows percentages.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Literal, Sequence

import tyro
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from verifier.bigint import MAX_INT_DIGITS, json_loads_digits
from verifier.client import ClientConfig, VerifierClient
from verifier.generations import Generation, read_generations_file
from verifier.items import (MAX_GROUND_TRUTH_CHARS, NOT_A_VERDICT, Item, Limits, Result,
                            VerifierError, invalid, item_from_dict)
from verifier.lcb import LCB_REPORT_WINDOW, LcbQuestion
from verifier.problems import DataError, Loaded, ProblemRow, load_rows
from verifier.scoring import Scorer, ScoringConfig

log = logging.getLogger(__name__)

NO_SOURCE = "-"
"""The ``by_source`` key of problems without a ``data_source``."""


# ---------------------------------------------------------------------------------------------
# Metrics (pure functions)
# ---------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate for one problem with ``n`` samples of which ``c`` are correct
    (Chen et al. 2021): ``1 - C(n-c, k) / C(n, k)``, the probability that at least one of k
    samples drawn without replacement from the n is correct.

    Computed stably as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` (no huge binomials); it is 1.0 when
    fewer than k samples are wrong. Requires ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def accuracy(correct: Sequence[bool], k: int | None = None) -> float:
    """Fraction of the first ``k`` responses (all when ``k`` is None) that are correct."""
    used = correct if k is None else correct[:k]
    if not used:
        raise ValueError("accuracy of zero responses")
    if k is not None and len(used) < k:
        raise ValueError(f"need {k} responses, got {len(used)}")
    return sum(bool(x) for x in used) / len(used)


def avg_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """avg@k (the Skywork-OR1 report's metric): the mean over problems of the accuracy of each
    problem's first ``k`` responses. ``correct[p][j]`` says whether response j of problem p is
    correct. With k = n it equals the mean of the unbiased pass@1 estimates."""
    if not correct:
        raise ValueError("avg_at_k of zero problems")
    return sum(accuracy(c, k) for c in correct) / len(correct)


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k over problems: the mean of ``pass_at_k(n_p, c_p, k)``, each problem using all of
    its ``n_p`` responses."""
    if not correct:
        raise ValueError("mean_pass_at_k of zero problems")
    return sum(pass_at_k(len(c), sum(map(bool, c)), k) for c in correct) / len(correct)


def standard_error(values: Sequence[float]) -> float | None:
    """Standard error of the mean of per-problem values: the sample standard deviation (n-1)
    divided by sqrt(number of values). None for fewer than two values (undefined)."""
    m = len(values)
    if m < 2:
        return None
    mean = sum(values) / m
    var = sum((v - mean) ** 2 for v in values) / (m - 1)
    return math.sqrt(var) / math.sqrt(m)


def metrics(correct: Sequence[Sequence[bool]], k: int) -> dict[str, Any]:
    """avg@k, pass@1, pass@k and their standard errors over problems.

    ``correct[p]`` holds problem p's verdicts in response order (at least k of them).
    avg@k uses the first k responses per problem; pass@1 and pass@k use all of a problem's
    responses (the unbiased estimator), so pass@1 equals avg@k when k = n.
    """
    per_avg = [accuracy(c, k) for c in correct]
    per_p1 = [pass_at_k(len(c), sum(map(bool, c)), 1) for c in correct]
    per_pk = [pass_at_k(len(c), sum(map(bool, c)), k) for c in correct]
    return {
        "avg@k": _mean(per_avg),
        "pass@1": _mean(per_p1),
        "pass@k": _mean(per_pk),
        "stderr": {
            "avg@k": standard_error(per_avg),
            "pass@1": standard_error(per_p1),
            "pass@k": standard_error(per_pk),
        },
    }


def _mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of zero values")
    return sum(values) / len(values)


# ---------------------------------------------------------------------------------------------
# Input
# ---------------------------------------------------------------------------------------------


@dataclass
class EvalProblem:
    """One line of a generations file."""

    line: int
    """1-based line number in the input file."""
    id: str
    domain: str
    ground_truth: Any
    data_source: str
    responses: list[str]
    limits: Limits = field(default_factory=Limits)
    profile: str = ""
    """Judging profile of every response ("" = the server's default)."""
    unjudged: str = ""
    """Why this problem cannot be judged ("" when it can): its responses are never sent and
    become INVALID_INPUT results with this reason (see :func:`mark_unjudgeable`)."""

    def wire_id(self, j: int) -> str:
        """The unique id of response j on the wire (problem ids need not be unique strings)."""
        return f"{self.line}:{j}"

    def item(self, j: int) -> Item:
        return Item(self.wire_id(j), self.domain, self.responses[j], self.ground_truth,
                    self.data_source, self.limits, self.profile)


def problem_from_dict(obj: Any, line: int) -> EvalProblem | str:
    """Build an EvalProblem from a decoded JSON line, or return why it is malformed. The item
    envelope (domain, ground truth, data_source, limits) is checked by the same code as
    ``verifier check``; each response's own checks (e.g. its size) happen in the verifier."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    pid = obj.get("id")
    if pid is None:
        return "missing 'id'"
    if isinstance(pid, bool) or not isinstance(pid, (str, int)):
        return "'id' must be a string"
    responses = obj.get("responses")
    if not isinstance(responses, list) or not responses:
        return "'responses' must be a non-empty list of strings"
    bad = [j for j, r in enumerate(responses) if not isinstance(r, str)]
    if bad:
        kind = type(responses[bad[0]]).__name__
        return f"'responses' must be strings; response {bad[0]} is {kind}"
    keys = ("id", "domain", "ground_truth", "data_source", "limits")
    envelope = {key: obj.get(key) for key in keys}
    parsed = item_from_dict({**envelope, "id": str(pid), "response": ""}, index=line)
    if isinstance(parsed, tuple):
        return parsed[1].detail
    return EvalProblem(line, parsed.id, parsed.domain, parsed.ground_truth, parsed.data_source,
                   list(responses), parsed.limits)


@dataclass
class Generations:
    """A parsed generations file: its problems, and the lines skipped with ``--skip-invalid``."""

    problems: list[EvalProblem]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    """``{"line": int, "reason": str}`` per skipped line."""


def _problem_from_line(data: bytes, line: int) -> EvalProblem | str | None:
    """The EvalProblem of one raw line, why it is malformed, or None for a blank line. Any
    exception is the line's problem: it is untrusted input, and JSON nested too deeply makes
    json (and anything that walks the result) raise RecursionError, which is no ValueError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8 text: {e}"
    if not text.strip():
        return None
    try:
        obj = json_loads_digits(text, MAX_INT_DIGITS)  # as large as any profile allows
    except RecursionError:
        return "not valid JSON: nested too deeply to decode"
    except ValueError as e:
        return f"not valid JSON: {e}"
    try:
        return problem_from_dict(obj, line)
    except RecursionError:
        return "nested too deeply to read"
    except Exception as e:  # noqa: BLE001 - whatever a hostile line makes the checks raise
        return f"cannot be read: {type(e).__name__}: {e}"


def read_generations(path: Path, skip_invalid: bool = False) -> Generations:
    """Parse a generations JSONL. A malformed line (bad JSON or UTF-8, JSON nested too deeply,
    missing fields, a duplicate problem id) raises VerifierError("invalid_argument") naming the
    file and line, or with ``skip_invalid`` is skipped and recorded. Blank lines are ignored."""
    problems: list[EvalProblem] = []
    skipped: list[dict[str, Any]] = []
    first_line: dict[str, int] = {}
    # Bytes, decoded line by line: a line that is not UTF-8 is that line's problem, where a
    # text file object would raise from the loop itself.
    with path.open("rb") as f:
        for lineno, data in enumerate(f, 1):
            parsed = _problem_from_line(data, lineno)
            if parsed is None:
                continue
            if isinstance(parsed, EvalProblem) and parsed.id in first_line:
                first = first_line[parsed.id]
                parsed = f"duplicate problem id {parsed.id!r} (first on line {first})"
            if isinstance(parsed, str):
                if not skip_invalid:
                    raise VerifierError(
                        f"{path} line {lineno}: {parsed} (use --skip-invalid to skip such lines)",
                        "invalid_argument",
                    )
                log.warning("skipping malformed line %s of %s: %s", lineno, path, parsed,
                            extra={"file": str(path), "line": lineno, "reason": parsed})
                skipped.append({"line": lineno, "reason": parsed})
                continue
            first_line[parsed.id] = lineno
            problems.append(parsed)
    return Generations(problems, skipped)


def resolve_k(problems: Sequence[EvalProblem], k: int | None) -> int:
    """The k to report: the given one, or the smallest number of responses of any problem.
    Raises VerifierError("invalid_argument") when k < 1 or some problem has fewer than k."""
    if not problems:
        raise VerifierError("no problems to evaluate", "invalid_argument")
    if k is None:
        return min(len(p.responses) for p in problems)
    if k < 1:
        raise VerifierError(f"--k must be at least 1, got {k}", "invalid_argument")
    for p in problems:
        if len(p.responses) < k:
            raise VerifierError(
                f"k={k} but problem {p.id!r} (line {p.line}) has only {len(p.responses)} "
                "responses", "invalid_argument")
    return k


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------


def mark_unjudgeable(problems: Sequence[EvalProblem]) -> None:
    """Set ``unjudged`` on problems whose ground truth is over the verifier's cap
    (``MAX_GROUND_TRUTH_CHARS`` of JSON): the verifier answers INVALID_INPUT for each of their
    responses, and the items might not even fit a message (then the client would re-send them
    until it gives up). Problems already marked are left as they are."""
    for p in problems:
        if p.unjudged:
            continue
        try:
            n = len(json.dumps(p.ground_truth))
        except (TypeError, ValueError, RecursionError) as e:
            p.unjudged = f"the ground truth cannot be sent as JSON: {type(e).__name__}: {e}"
            continue
        if n > MAX_GROUND_TRUTH_CHARS:
            p.unjudged = (f"the ground truth is {n} characters of JSON, over the verifier's "
                          f"cap of {MAX_GROUND_TRUTH_CHARS}")


def unjudged_results(problems: Sequence[EvalProblem]) -> dict[str, Result]:
    """INVALID_INPUT results, keyed by wire id, for the responses of problems that cannot be
    judged (``unjudged``), made here: those items are never sent."""
    return {p.wire_id(j): Result.from_outcome(p.wire_id(j), invalid(f"not judged: {p.unjudged}"),
                                              p.limits, 0.0, p.data_source)
            for p in problems if p.unjudged for j in range(len(p.responses))}


def score_items(
    items: Sequence[Item],
    addr: str | None = None,
    scoring: ScoringConfig | None = None,
    client: ClientConfig | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> dict[str, Result]:
    """Score items (unique ids) in-process through ``Scorer`` or, with ``addr``, through a
    running verifier's stream. Returns results keyed by item id; raises VerifierError when an
    item gets no result."""
    done: dict[str, Result] = {}

    def record(r: Result) -> None:
        done[r.id] = r
        if on_result is not None:
            on_result(r)

    if addr is None:
        with Scorer(scoring or ScoringConfig()) as scorer:
            if scorer.sandbox_problem and any(it.domain == "code" for it in items):
                log.warning("code items will get SANDBOX_ERROR: %s", scorer.sandbox_problem)
            futures = [scorer.submit(it, block_s=3600.0) for it in items]
            for fut in futures:
                record(fut.result())
    else:
        with VerifierClient(addr, client or ClientConfig()) as c:
            for r in c.stream(items):
                record(r)
    missing = [it.id for it in items if it.id not in done]
    if missing:
        raise VerifierError(f"{len(missing)} responses got no result (first: {missing[0]})",
                            "internal")
    return done


# ---------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------


def _group_summary(problems: Sequence[EvalProblem], results: dict[str, Result], k: int) -> dict:
    verdicts = [[results[p.wire_id(j)].correct for j in range(len(p.responses))] for p in problems]
    statuses = Counter(results[p.wire_id(j)].status.value
                       for p in problems for j in range(len(p.responses)))
    return {
        "n_problems": len(problems),
        "n_responses": sum(len(v) for v in verdicts),
        **metrics(verdicts, k),
        "errors": {s.value: statuses[s.value] for s in NOT_A_VERDICT if statuses[s.value]},
        "statuses": dict(sorted(statuses.items())),
    }


def summarize(
    problems: Sequence[EvalProblem],
    results: dict[str, Result],
    k: int,
    skipped: Sequence[dict[str, Any]] = (),
    allow_errors: bool = False,
) -> dict[str, Any]:
    """The summary JSON: overall metrics, ``by_source`` (the same per data source), error
    counts, how many lines were skipped, ``by_problem`` (each problem's verdicts in
    response order) and ``profiles`` (how many responses the verifier says it judged under
    each judging profile; "-" for those that never reached a scorer). Responses with an error
    status count as incorrect here; ``errors_counted_as_incorrect`` says whether any did.
    ``not_judged`` names the problems that could not be judged at all (their responses are
    INVALID_INPUT errors, made without the verifier) and why."""
    overall = _group_summary(problems, results, k)
    groups: dict[str, list[EvalProblem]] = defaultdict(list)
    for p in problems:
        groups[p.data_source or NO_SOURCE].append(p)
    ns = [len(p.responses) for p in problems]
    return {
        "k": k,
        "n_problems": overall["n_problems"],
        "n_responses": overall["n_responses"],
        "responses_per_problem": {"min": min(ns), "max": max(ns)},
        "avg@k": overall["avg@k"],
        "pass@1": overall["pass@1"],
        "pass@k": overall["pass@k"],
        "stderr": overall["stderr"],
        "by_source": {src: _group_summary(ps, results, k) for src, ps in sorted(groups.items())},
        "errors": overall["errors"],
        "errors_counted_as_incorrect": bool(overall["errors"]) and allow_errors,
        "statuses": overall["statuses"],
        "skipped_lines": len(skipped),
        "skipped": list(skipped),
        "by_problem": {p.id: [results[p.wire_id(j)].correct for j in range(len(p.responses))]
                       for p in problems},
        "profiles": dict(sorted(Counter(results[p.wire_id(j)].profile or NO_SOURCE
                                        for p in problems
                                        for j in range(len(p.responses))).items())),
        "n_not_judged": sum(1 for p in problems if p.unjudged),
        "not_judged": [{"id": p.id, "line": p.line, "n_responses": len(p.responses),
                        "reason": p.unjudged} for p in problems if p.unjudged],
    }


def error_message(
    problems: Sequence[EvalProblem], results: dict[str, Result], limit: int = 3
) -> str | None:
    """None when every response was scored; else a message with counts per error status and
    the first few failing responses."""
    failed = [(p, j, results[p.wire_id(j)]) for p in problems for j in range(len(p.responses))
              if results[p.wire_id(j)].status in NOT_A_VERDICT]
    if not failed:
        return None
    counts = Counter(r.status.value for _, _, r in failed)
    examples = "; ".join(
        f"problem {p.id!r} (line {p.line}) response {j}: {r.status.value}: {r.detail}"
        for p, j, r in failed[:limit]
    )
    total = sum(len(p.responses) for p in problems)
    unjudged = [p for p in problems if p.unjudged]
    head = ""
    if unjudged:
        named = "; ".join(f"{p.id!r}: {p.unjudged}" for p in unjudged[:limit])
        more = f" and {len(unjudged) - limit} more" if len(unjudged) > limit else ""
        head = f"{len(unjudged)} problems could not be judged ({named}{more}). "
    return (f"{head}{len(failed)} of {total} responses could not be scored "
            f"({', '.join(f'{s}: {n}' for s, n in sorted(counts.items()))}), e.g. {examples}. "
            "Pass --allow-errors to count them as incorrect (--results-output lists them all).")


def response_records(problems: Sequence[EvalProblem], results: dict[str, Result]) -> Iterable[dict]:
    """One JSON-ready record per scored response, in input order."""
    for p in problems:
        for j in range(len(p.responses)):
            r = results[p.wire_id(j)]
            yield {"id": p.id, "line": p.line, "index": j, "data_source": p.data_source,
                   "status": r.status.value, "correct": r.correct, "reward": r.reward,
                   "passed": r.passed, "total": r.total, "detail": r.detail,
                   "elapsed_ms": r.elapsed_ms, "profile": r.profile}


def _pct(v: float | None, prefix: str = "") -> str:
    return "-" if v is None else f"{prefix}{100.0 * v:.1f}"


def eval_table(summary: dict[str, Any], title: str | None = None) -> Table:
    """The paper-style table: one row per data source (plus ALL when there are several),
    avg@k and pass@k as percentages with one decimal, each with its standard error."""
    k = summary["k"]
    table = Table(title=title or f"verifier eval (k={k}, {summary['n_problems']} problems)")
    table.add_column("data_source")
    table.add_column("problems", justify="right")
    table.add_column(f"avg@{k}", justify="right")
    table.add_column("stderr", justify="right")
    table.add_column(f"pass@{k}", justify="right")
    table.add_column("stderr", justify="right")
    table.add_column("errors", justify="right")
    rows = list(summary["by_source"].items())
    if len(rows) > 1:
        rows.append(("ALL", summary))
    for name, s in rows:
        table.add_row(name, str(s["n_problems"]),
                      _pct(s["avg@k"]), _pct(s["stderr"]["avg@k"], "±"),
                      _pct(s["pass@k"]), _pct(s["stderr"]["pass@k"], "±"),
                      str(sum(s["errors"].values())))
    return table


# ---------------------------------------------------------------------------------------------
# Problems files + generations files (drop-in evaluation)
# ---------------------------------------------------------------------------------------------


@dataclass
class Joined:
    """Problems matched with their generations, and what was left out of every number."""

    problems: list[EvalProblem]
    lcb: dict[str, LcbQuestion]
    """The LiveCodeBench question of each LiveCodeBench problem, by id."""
    missing: list[str]
    """Ids of problems (inside the window) that no generation names."""
    outside_window: int
    """LiveCodeBench problems outside the contest-date window."""
    generations_outside_window: int
    """Generations whose problem lies outside the window (not scored)."""
    generations_of_skipped_rows: list[str] = field(default_factory=list)
    """Ids of generations whose problem row was skipped as invalid (``--skip-invalid``; not
    scored)."""
    unmatched_generations: list[str] = field(default_factory=list)
    """Ids of generations naming no problem, left out because rows whose id could not be read
    were skipped (they may be those rows'); otherwise such generations are an error."""


def join_generations(rows: Loaded[ProblemRow], generations: Sequence[Generation],
                     lcb_profile: str, profile: str = "") -> Joined:
    """Match each generation to its problem by id. Problems keep the problems files' order
    (rows too large to judge, ``rows.too_large``, in their place, marked ``unjudged``);
    responses keep the order given. LiveCodeBench problems are judged under ``lcb_profile``,
    the others under ``profile`` ("" = the server's default). Generations of rows skipped as
    invalid are left out and named. Raises VerifierError("invalid_argument") listing the
    generations that name no problem, unless rows whose id could not be read were skipped
    (then they are left out and named: they may be those rows')."""
    skipped_ids = {r.id for r in rows.skipped_rows if r.id is not None}
    known = ({r.id for r in rows.problems} | {r.id for r in rows.outside_window}
             | {e.problem.id for e in rows.too_large})
    unknown = [g for g in generations if g.id not in known and g.id not in skipped_ids]
    nameless_skipped = any(r.id is None for r in rows.skipped_rows)
    if unknown and not nameless_skipped:
        shown = ", ".join(f"{g.id!r} ({g.where})" for g in unknown[:20])
        more = f" and {len(unknown) - 20} more" if len(unknown) > 20 else ""
        raise VerifierError(f"{len(unknown)} generations name problems that are not in the "
                            f"problems files: {shown}{more}", "invalid_argument")
    if unknown:
        log.warning("%d generations name no problem; left out, as rows whose id could not be "
                    "read were skipped: %s", len(unknown), ", ".join(g.id for g in unknown[:10]),
                    extra={"unmatched_generations": len(unknown)})
    by_id = {g.id: g for g in generations}
    outside_ids = {r.id for r in rows.outside_window}
    unjudged = {e.problem.where: str(e) for e in rows.too_large}
    ordered = list(rows.problems)
    for e in reversed(rows.too_large):  # back in file order (positions never decrease)
        ordered.insert(e.position, e.problem)
    problems: list[EvalProblem] = []
    lcb: dict[str, LcbQuestion] = {}
    missing: list[str] = []
    for row in ordered:
        gen = by_id.get(row.id)
        if gen is None:
            missing.append(row.id)
            continue
        prof = lcb_profile if row.lcb is not None else profile
        why = unjudged.get(row.where, "")
        problems.append(EvalProblem(len(problems) + 1, row.id, row.domain, row.ground_truth,
                                    row.data_source, list(gen.responses), Limits(), prof, why))
        if row.lcb is not None:
            lcb[row.id] = row.lcb
    mark_unjudgeable(problems)
    return Joined(problems, lcb, missing, len(rows.outside_window),
                  sum(1 for g in generations if g.id in outside_ids),
                  [g.id for g in generations if g.id in skipped_ids and g.id not in known],
                  [g.id for g in unknown])


def _pass1_by(problems: Sequence[EvalProblem], results: dict[str, Result],
              key: Callable[[EvalProblem], str]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[list[bool]]] = defaultdict(list)
    for p in problems:
        groups[key(p)].append([results[p.wire_id(j)].correct for j in range(len(p.responses))])
    return {name: {"n_problems": len(v), "pass@1": mean_pass_at_k(v, 1)}
            for name, v in sorted(groups.items())}


def lcb_breakdown(joined: Joined, results: dict[str, Result], profile: str) -> dict[str, Any]:
    """LiveCodeBench's pass@1 (the mean over problems of correct/n, LiveCodeBench's
    ``compute_metrics_from_results``) over the LiveCodeBench problems, overall, by difficulty
    and by platform."""
    ps = [p for p in joined.problems if p.id in joined.lcb]
    verdicts = [[results[p.wire_id(j)].correct for j in range(len(p.responses))] for p in ps]
    return {
        "profile": profile,
        "n_problems": len(ps),
        "pass@1": mean_pass_at_k(verdicts, 1),
        "by_difficulty": _pass1_by(ps, results, lambda p: joined.lcb[p.id].difficulty or NO_SOURCE),
        "by_platform": _pass1_by(ps, results, lambda p: joined.lcb[p.id].platform or NO_SOURCE),
    }


def lcb_table(summary: dict[str, Any]) -> Table:
    """LiveCodeBench pass@1 by difficulty and by platform, as percentages."""
    lcb = summary["lcb"]
    window = summary.get("lcb_window")
    span = f"{window[0] or '..'} to {window[1] or '..'}" if window else "all dates"
    table = Table(title=f"LiveCodeBench pass@1 ({span}, profile {lcb['profile']})")
    table.add_column("group")
    table.add_column("problems", justify="right")
    table.add_column("pass@1", justify="right")
    for kind in ("difficulty", "platform"):
        for name, s in lcb[f"by_{kind}"].items():
            table.add_row(f"{kind}: {name}", str(s["n_problems"]), _pct(s["pass@1"]))
    table.add_row("ALL", str(lcb["n_problems"]), _pct(lcb["pass@1"]))
    return table


def print_report(summary: dict[str, Any], console: Console) -> None:
    """The stdout report of ``verifier eval``: the avg@k table, LiveCodeBench's table when
    there are LiveCodeBench problems, and what was left out."""
    console.print(eval_table(summary))
    if summary.get("lcb"):
        console.print(lcb_table(summary))
    for entry in summary.get("not_judged") or []:
        console.print(f"not judged: problem {entry['id']!r} ({entry['n_responses']} responses, "
                      f"counted as incorrect): {entry['reason']}", highlight=False)
    if summary.get("skipped_rows"):
        console.print(f"{summary['skipped_rows']} invalid problem rows were skipped "
                      f"({len(summary.get('generations_of_skipped_rows') or [])} of them had "
                      "generations, left out)", highlight=False)
    if summary.get("unmatched_generations"):
        console.print(f"{len(summary['unmatched_generations'])} generations name no problem "
                      "and were left out", highlight=False)
    if summary.get("outside_window"):
        console.print(f"{summary['outside_window']} LiveCodeBench problems outside the "
                      "contest-date window were left out", highlight=False)
    missing = summary.get("missing_generations") or []
    if missing:
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more"
                                           if len(missing) > 10 else "")
        console.print(f"{len(missing)} problems have no generation and were left out: {shown}",
                      highlight=False)


# ---------------------------------------------------------------------------------------------
# Command
# ---------------------------------------------------------------------------------------------


def _default_client() -> ClientConfig:
    # An evaluation is one long stream: a whole benchmark's code items can take well over the
    # library default of 600 s.
    return ClientConfig(timeout_s=24 * 3600.0)


@dataclass
class EvalConfig:
    """``verifier eval``: score k responses per problem and report avg@k / pass@k. Give either
    ``--input`` (a generations JSONL that carries its ground truths) or ``--problems`` with
    ``--generations``."""

    output: Annotated[Path, tyro.conf.arg(aliases=["-o"])]
    """Where to write the summary JSON."""
    input: Annotated[Path | None, tyro.conf.arg(aliases=["-i"])] = None
    """Generations, one problem per line: {"id", "domain", "ground_truth", "data_source"?,
    "responses": [...], "limits"?}."""
    problems: list[str] = field(default_factory=list)
    """Problems files (FILE[,FILE...]): LiveCodeBench release rows (JSONL), verl/Skywork
    parquet, or plain JSONL {"id", "domain", "ground_truth", "data_source"?}; any mix."""
    generations: Path | None = None
    """With --problems: LiveCodeBench's custom-evaluator JSON [{"question_id", "code_list"}]
    (code already extracted) or JSONL {"id", "responses": [full model outputs]}, matched to
    the problems by id (a LiveCodeBench problem's id is its question_id)."""
    lcb_start: str = LCB_REPORT_WINDOW[0]
    """First contest_date of LiveCodeBench problems kept (inclusive; the report's window).
    Problems outside the window are left out of every number and counted."""
    lcb_end: str = LCB_REPORT_WINDOW[1]
    """Last contest_date of LiveCodeBench problems kept (inclusive, at midnight)."""
    lcb_all_dates: bool = False
    """No contest-date window: keep every LiveCodeBench problem."""
    lcb_profile: Literal["default", "lcb", "skywork"] = "lcb"
    """Judging profile of LiveCodeBench problems (lcb: LiveCodeBench's own judge). The other
    problems name none: the verifier's default applies (in-process: --profile)."""
    addr: str | None = None
    """HOST:PORT of a running verifier, a comma list of them, or dns:///NAME:PORT (work is
    spread over the healthy replicas and fails over). Without it, responses are scored
    in-process through the same code the server runs."""
    k: int | None = None
    """k of avg@k / pass@k. Default: the smallest number of responses of any problem."""
    skip_invalid: bool = False
    """Skip malformed lines, rows or generations entries (named and counted in the summary,
    left out of every number) instead of failing on the first one (exit 1, naming its file
    and line). A line that cannot be decoded at all (not JSON, not UTF-8, nested too deeply)
    is malformed too."""
    allow_errors: bool = False
    """Count responses the verifier could not score (INVALID_INPUT, SANDBOX_ERROR,
    INTERNAL_ERROR) as incorrect and write the summary. That includes every response of a
    problem that cannot be judged at all, named in the summary's not_judged (LiveCodeBench
    tests that inflate past verifier.lcb.MAX_LCB_TESTS_BYTES, a ground truth over the
    verifier's cap): INVALID_INPUT, never sent. Without it such responses fail the command
    (exit 1) once the rest is scored: --results-output is written, the summary is not."""
    results_output: Path | None = None
    """Also write one JSON line per scored response (id, index, status, reward, detail)."""
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    client: ClientConfig = field(default_factory=_default_client)
    progress: Literal["auto", "on", "off"] = "auto"
    """Progress bar: "auto" shows it on a terminal only."""
    log_format: Literal["json", "text"] = "text"

    def __post_init__(self) -> None:
        if self.input is not None and (self.problems or self.generations is not None):
            raise ValueError("give either --input or --problems with --generations, not both")
        if self.input is None and not (self.problems and self.generations is not None):
            raise ValueError("give --input GENERATIONS.jsonl, or --problems FILE[,FILE...] "
                             "with --generations FILE")
        for name in ("lcb_start", "lcb_end"):
            try:
                date.fromisoformat(getattr(self, name))
            except ValueError:
                raise ValueError(f"--{name.replace('_', '-')} must be a date like 2024-08-01, "
                                 f"got {getattr(self, name)!r}") from None

    def problem_files(self) -> list[Path]:
        """``--problems`` split at commas."""
        return [Path(p) for arg in self.problems for p in arg.split(",") if p.strip()]

    def lcb_window(self) -> tuple[str, str] | None:
        return None if self.lcb_all_dates else (self.lcb_start, self.lcb_end)


def _write_json_lines(path: Path, records: Iterable[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")


def _score(cfg: EvalConfig, problems: Sequence[EvalProblem]) -> dict[str, Result]:
    """Score every response with a progress bar (the responses of problems that cannot be
    judged become INVALID_INPUT results here, unsent); write ``--results-output``; raise
    unless every response was judged (or ``allow_errors``)."""
    items = [p.item(j) for p in problems if not p.unjudged for j in range(len(p.responses))]
    console = Console(stderr=True)
    hidden = cfg.progress == "off" or (cfg.progress == "auto" and not console.is_terminal)
    with Progress(TextColumn("[bold]scoring"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, disable=hidden) as bar:
        task = bar.add_task("scoring", total=len(items))
        results = (score_items(items, cfg.addr, cfg.scoring, cfg.client,
                               on_result=lambda _r: bar.advance(task)) if items else {})
    results.update(unjudged_results(problems))
    if cfg.results_output is not None:
        _write_json_lines(cfg.results_output, response_records(problems, results))
    problem = error_message(problems, results)
    if problem is not None and not cfg.allow_errors:
        raise VerifierError(problem, "failed_precondition")
    return results


def _write_summary(cfg: EvalConfig, summary: dict[str, Any]) -> None:
    cfg.output.parent.mkdir(parents=True, exist_ok=True)
    cfg.output.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def run_eval(cfg: EvalConfig) -> dict[str, Any]:
    """Read, score, summarise; write ``cfg.output`` (and ``cfg.results_output``) and return the
    summary. Raises VerifierError for a malformed input, an impossible k, or (unless
    ``allow_errors``) responses the verifier could not score; in that last case the per-response
    results are still written but the summary is not."""
    if cfg.input is None:
        return run_problems_eval(cfg)
    gens = read_generations(cfg.input, cfg.skip_invalid)
    k = resolve_k(gens.problems, cfg.k)
    mark_unjudgeable(gens.problems)
    results = _score(cfg, gens.problems)
    summary = summarize(gens.problems, results, k, gens.skipped, cfg.allow_errors)
    summary["input"] = str(cfg.input)
    _write_summary(cfg, summary)
    return summary


def run_problems_eval(cfg: EvalConfig) -> dict[str, Any]:
    """``--problems`` + ``--generations``: read the problems (any format; LiveCodeBench rows
    inside the window), match the generations to them, score, and summarise as
    :func:`run_eval` does, plus what was left out, the profiles that applied and, for
    LiveCodeBench problems, pass@1 by difficulty and by platform."""
    assert cfg.generations is not None
    window = cfg.lcb_window()
    try:
        # keep_too_large: a row too large to judge is reported with its generations as not
        # judged (INVALID_INPUT), like a response the verifier could not score, not a bad file.
        rows = load_rows(cfg.problem_files(), date_window=window, skip_invalid=cfg.skip_invalid,
                         allow_empty=True, keep_too_large=True)
    except DataError as e:
        raise VerifierError(str(e), "invalid_argument") from None
    fmt, generations, skipped_generations = read_generations_file(cfg.generations,
                                                                  cfg.skip_invalid)
    joined = join_generations(rows, generations, cfg.lcb_profile)
    if joined.missing:
        log.warning("%d problems have no generation and are left out: %s", len(joined.missing),
                    ", ".join(joined.missing[:10]), extra={"missing": len(joined.missing)})
    if not joined.problems:
        raise VerifierError(f"no problem of {cfg.problems} has a generation in "
                            f"{cfg.generations} ({len(joined.missing)} without one, "
                            f"{joined.outside_window} outside the LiveCodeBench window, "
                            f"{rows.skipped} rows skipped as invalid)", "invalid_argument")
    k = resolve_k(joined.problems, cfg.k)
    results = _score(cfg, joined.problems)
    summary = summarize(joined.problems, results, k, skipped_generations, cfg.allow_errors)
    summary.update({
        "problems_files": [str(p) for p in cfg.problem_files()],
        "generations": str(cfg.generations),
        "generations_format": fmt,
        "skipped_rows": rows.skipped,
        "skipped_problem_rows": [{"where": r.where, "id": r.id, "reason": r.reason}
                                 for r in rows.skipped_rows],
        "generations_of_skipped_rows": joined.generations_of_skipped_rows,
        "unmatched_generations": joined.unmatched_generations,
        "lcb_window": list(window) if window else None,
        "outside_window": joined.outside_window,
        "generations_outside_window": joined.generations_outside_window,
        "missing_generations": joined.missing,
        "n_missing_generations": len(joined.missing),
    })
    if joined.lcb:
        summary["lcb"] = lcb_breakdown(joined, results, cfg.lcb_profile)
    _write_summary(cfg, summary)
    return summary
