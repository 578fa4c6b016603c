"""``verifier eval``: score k sampled responses per problem and report avg@k / pass@k
(docs/contracts.md 2), the way the Skywork-OR1 report does (AIME24/25 avg@32, LiveCodeBench avg@4).

Input: a JSONL of generations, one problem per line::

    {"id": "...", "domain": "math" | "code", "ground_truth": ..., "data_source": "aime24",
     "responses": ["...", "..."], "limits": {...}}

Or, drop-in (``--problems FILE[,FILE...] --generations FILE``): problems in any format the
verifier reads (verifier/data/problems.py: LiveCodeBench release rows, verl/Skywork parquet, plain
JSONL) and a generations file in LiveCodeBench's custom-evaluator JSON or JSONL of full outputs
(verifier/data/generations.py), matched by id. LiveCodeBench problems are judged under the ``lcb``
profile (``--lcb-profile``) and kept only inside the report's contest-date window
(``--lcb-start/--lcb-end``, ``--lcb-all-dates``); those outside, and problems without a
generation, are left out of every number and counted (and named) in the summary, never scored
as 0. A generation naming no problem is an error listing them.

One row never ends a run. A row that cannot be judged (malformed: bad JSON or UTF-8, JSON
nested too deeply, a bad field or ground truth; a LiveCodeBench row whose tests inflate past
``verifier.data.lcb.MAX_LCB_TESTS_BYTES``; a ground truth over the verifier's cap) is NOT JUDGED: it
is never sent, its generations (found by the id the row names) become INVALID_INPUT results
here, and the summary names it in ``not_judged`` with its file and line, its number of
responses and the reason, counts it (``n_not_judged``) and leaves it out of every number
(``--allow-errors`` counts its responses as incorrect instead). The rest is scored and the
summary written; the command then exits :data:`EXIT_NOT_JUDGED` (3), distinct from success (0),
an error that stops the run (1: unreadable generations file, responses the verifier could not
score without ``--allow-errors``, a crash) and bad flags (2). ``--skip-invalid`` keeps the
older behaviour for malformed rows: skipped, named apart (``skipped``,
``skipped_problem_rows``, ``generations_of_skipped_rows``), left out, exit 0.

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
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from verifier.scoring.bigint import MAX_INT_DIGITS, json_dumps_digits, json_loads_digits
from verifier.scoring.checkers import CHECKERS_AGAINST, has_checker, without_checker
from verifier.client import ClientConfig, VerifierClient
from verifier.config import EvalConfig, ScoringConfig
from verifier.data.generations import Generation, read_generations_file
from verifier.items import (MAX_GROUND_TRUTH_CHARS, NOT_A_VERDICT, Item, Limits, Result,
                            VerifierError, invalid, item_from_dict)
from verifier.data.lcb import LcbQuestion
from verifier.data.problems import DataError, Loaded, ProblemRow, load_rows
from verifier.scoring.scorer import Scorer

log = logging.getLogger(__name__)

NO_SOURCE = "-"
"""The ``by_source`` key of problems without a ``data_source``."""

EXIT_NOT_JUDGED = 3
"""``verifier eval``'s exit status when the run finished and wrote its summary but some rows
were not judged (``n_not_judged`` > 0). 0: everything judged; 1: an error that stopped the run
(no summary), also Python's status for a crash; 2: bad flags."""


def exit_code(summary: dict[str, Any]) -> int:
    """The exit status of a finished ``verifier eval``: 0, or :data:`EXIT_NOT_JUDGED` when the
    summary counts rows that were not judged."""
    return EXIT_NOT_JUDGED if summary.get("n_not_judged") else 0


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
    where: str = ""
    """``"FILE: line N"`` / ``"FILE: row N"`` of the problem ("" when built elsewhere)."""
    unjudged: str = ""
    """Why this problem cannot be judged ("" when it can): its responses are never sent and
    become INVALID_INPUT results with this reason (see :func:`mark_unjudgeable`); it is left
    out of every number unless errors are counted as incorrect (``--allow-errors``)."""

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
    """A parsed generations file: its problems (those that cannot be judged marked
    ``unjudged``), the lines skipped with ``--skip-invalid``, and the malformed lines that name
    no problem that could be kept."""

    problems: list[EvalProblem]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    """``{"line": int, "reason": str}`` per skipped line."""
    not_judged: list[dict[str, Any]] = field(default_factory=list)
    """``{"id": str | None, "line": int, "n_responses": int, "reason": str}`` per malformed
    line that is no problem of its own (no readable id or responses, a duplicate id); without
    ``--skip-invalid`` only."""


def _salvage(data: bytes, line: int, reason: str) -> EvalProblem | dict[str, Any]:
    """A malformed line as a problem that is not judged (its id and responses readable), or
    as a not-judged entry naming what it can. Never raises."""
    pid: str | None = None
    responses: list[str] | None = None
    obj: Any = None
    try:
        obj = json_loads_digits(data.decode("utf-8"), MAX_INT_DIGITS)
        if isinstance(obj, dict):
            raw = obj.get("id")
            if isinstance(raw, (str, int)) and not isinstance(raw, bool):
                pid = str(raw)
            rs = obj.get("responses")
            if isinstance(rs, list) and rs and all(isinstance(r, str) for r in rs):
                responses = list(rs)
    except Exception:  # noqa: BLE001 - whatever the line is, it names nothing more
        pass
    if pid is None or responses is None:
        n = len(responses) if responses is not None else 0
        return {"id": pid, "line": line, "n_responses": n, "reason": reason}
    assert isinstance(obj, dict)
    domain = obj.get("domain") if obj.get("domain") in ("math", "code") else "math"
    source = obj.get("data_source") if isinstance(obj.get("data_source"), str) else ""
    return EvalProblem(line, pid, str(domain), None, source, responses, unjudged=reason)


def _where(path: Path, line: int) -> str:
    return f"{path}: line {line}"


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
    missing fields, a duplicate problem id) is not judged: a problem marked ``unjudged`` when
    its id (not a duplicate) and responses can be read, else an entry of
    ``Generations.not_judged``; with ``skip_invalid`` it is skipped and recorded instead.
    Blank lines are ignored."""
    problems: list[EvalProblem] = []
    skipped: list[dict[str, Any]] = []
    not_judged: list[dict[str, Any]] = []
    first_line: dict[str, int] = {}
    # Bytes, decoded line by line: a line that is not UTF-8 is that line's problem, where a
    # text file object would raise from the loop itself.
    try:
        f = path.open("rb")
    except OSError as e:
        raise VerifierError(f"cannot read {path}: {e.strerror or e}", "invalid_argument") from None
    with f:
        for lineno, data in enumerate(f, 1):
            parsed = _problem_from_line(data, lineno)
            if parsed is None:
                continue
            if isinstance(parsed, EvalProblem) and parsed.id in first_line:
                first = first_line[parsed.id]
                parsed = f"duplicate problem id {parsed.id!r} (first on line {first})"
            if isinstance(parsed, str) and not skip_invalid:
                log.warning("line %s of %s is not judged: %s", lineno, path, parsed,
                            extra={"file": str(path), "line": lineno, "reason": parsed})
                salvaged = _salvage(data, lineno, f"{path} line {lineno}: {parsed}")
                if isinstance(salvaged, EvalProblem) and salvaged.id not in first_line:
                    salvaged.where = _where(path, lineno)
                    first_line[salvaged.id] = lineno
                    problems.append(salvaged)
                elif isinstance(salvaged, EvalProblem):
                    not_judged.append({"id": salvaged.id, "line": lineno,
                                       "where": _where(path, lineno),
                                       "n_responses": len(salvaged.responses),
                                       "reason": salvaged.unjudged})
                else:
                    not_judged.append({**salvaged, "where": _where(path, lineno)})
                continue
            if isinstance(parsed, str):
                log.warning("skipping malformed line %s of %s: %s", lineno, path, parsed,
                            extra={"file": str(path), "line": lineno, "reason": parsed})
                skipped.append({"line": lineno, "reason": parsed})
                continue
            first_line[parsed.id] = lineno
            parsed.where = _where(path, lineno)
            problems.append(parsed)
    return Generations(problems, skipped, not_judged)


def counted(problems: Sequence[EvalProblem], allow_errors: bool) -> list[EvalProblem]:
    """The problems the numbers are over: all that can be judged, and those that cannot too
    when errors count as incorrect (``allow_errors``)."""
    return [p for p in problems if allow_errors or not p.unjudged]


def resolve_k(problems: Sequence[EvalProblem], k: int | None, allow_empty: bool = False) -> int:
    """The k to report: the given one, or the smallest number of responses of any problem.
    Raises VerifierError("invalid_argument") when k < 1 or some problem has fewer than k, and
    for no problems at all unless ``allow_empty`` (then k, or 1)."""
    if not problems and allow_empty and (k is None or k >= 1):
        return k or 1
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
            n = len(json_dumps_digits(p.ground_truth, MAX_INT_DIGITS))  # as the client sends it
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
    none = {"avg@k": None, "pass@1": None, "pass@k": None,
            "stderr": {"avg@k": None, "pass@1": None, "pass@k": None}}
    return {
        "n_problems": len(problems),
        "n_responses": sum(len(v) for v in verdicts),
        **(metrics(verdicts, k) if verdicts else none),
        "errors": {s.value: statuses[s.value] for s in NOT_A_VERDICT if statuses[s.value]},
        "statuses": dict(sorted(statuses.items())),
    }


def summarize(
    problems: Sequence[EvalProblem],
    results: dict[str, Result],
    k: int,
    skipped: Sequence[dict[str, Any]] = (),
    allow_errors: bool = False,
    not_judged_rows: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The summary JSON: overall metrics, ``by_source`` (the same per data source), error
    counts, how many lines were skipped, ``by_problem`` (each problem's verdicts in
    response order) and ``profiles`` (how many responses the verifier says it judged under
    each judging profile; "-" for those that never reached a scorer). Responses with an error
    status count as incorrect here; ``errors_counted_as_incorrect`` says whether any did.
    ``not_judged`` names the problems that could not be judged at all (their responses are
    INVALID_INPUT errors, made without the verifier), then ``not_judged_rows`` (rows that are
    no problem of their own), each with why; ``n_not_judged`` counts them all and
    ``n_not_judged_responses`` their responses. Problems not judged are left out of every
    number unless ``allow_errors`` (:func:`counted`; ``not_judged_counted_as_incorrect``)."""
    unjudged = [p for p in problems if p.unjudged]
    problems = counted(problems, allow_errors)
    overall = _group_summary(problems, results, k)
    groups: dict[str, list[EvalProblem]] = defaultdict(list)
    for p in problems:
        groups[p.data_source or NO_SOURCE].append(p)
    ns = [len(p.responses) for p in problems] or [0]
    not_judged = [{"id": p.id, "line": p.line, "where": p.where, "n_responses": len(p.responses),
                   "reason": p.unjudged} for p in unjudged] + list(not_judged_rows)
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
        "n_not_judged": len(not_judged),
        "n_not_judged_responses": sum(e["n_responses"] for e in not_judged),
        "not_judged": not_judged,
        "not_judged_counted_as_incorrect": bool(unjudged) and allow_errors,
    }


def error_message(
    problems: Sequence[EvalProblem], results: dict[str, Result], limit: int = 3
) -> str | None:
    """None when every response was scored; else a message with counts per error status and
    the first few failing responses. Problems not judged at all (``unjudged``) are not counted
    here: the summary reports them (``not_judged``) and the exit status says so."""
    problems = [p for p in problems if not p.unjudged]
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
    return (f"{len(failed)} of {total} responses could not be scored "
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
    not_judged_rows: list[dict[str, Any]] = field(default_factory=list)
    """Rows that cannot be judged and are no problem here (no generation names them), as
    ``summarize``'s ``not_judged_rows`` entries."""


def join_generations(rows: Loaded[ProblemRow], generations: Sequence[Generation],
                     lcb_profile: str, profile: str = "") -> Joined:
    """Match each generation to its problem by id. Problems keep the problems files' order
    (rows that cannot be judged, ``rows.unjudged``, in their place, marked ``unjudged``; those
    that no generation names in ``Joined.not_judged_rows``);
    responses keep the order given. LiveCodeBench problems are judged under ``lcb_profile``,
    the others under ``profile`` ("" = the server's default). Generations of rows skipped as
    invalid are left out and named. Raises VerifierError("invalid_argument") listing the
    generations that name no problem, unless rows whose id could not be read were skipped
    (then they are left out and named: they may be those rows')."""
    skipped_ids = {r.id for r in rows.skipped_rows if r.id is not None}
    known = ({r.id for r in rows.problems} | {r.id for r in rows.outside_window}
             | {e.problem.id for e in rows.unjudged})
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
    unjudged = {e.problem.where: str(e) for e in rows.unjudged}
    ordered = list(rows.problems)
    for e in reversed(rows.unjudged):  # back in file order (positions never decrease)
        ordered.insert(e.position, e.problem)
    problems: list[EvalProblem] = []
    lcb: dict[str, LcbQuestion] = {}
    missing: list[str] = []
    not_judged_rows: list[dict[str, Any]] = []
    for row in ordered:
        gen = by_id.get(row.id)
        why = unjudged.get(row.where, "")
        if gen is None and why:
            not_judged_rows.append({"id": row.id, "line": None, "where": row.where,
                                    "n_responses": 0, "reason": why})
            continue
        if gen is None:
            missing.append(row.id)
            continue
        prof = lcb_profile if row.lcb is not None else profile
        problems.append(EvalProblem(len(problems) + 1, row.id, row.domain, row.ground_truth,
                                    row.data_source, list(gen.responses), Limits(), prof,
                                    row.where, why))
        if row.lcb is not None:
            lcb[row.id] = row.lcb
    mark_unjudgeable(problems)
    return Joined(problems, lcb, missing, len(rows.outside_window),
                  sum(1 for g in generations if g.id in outside_ids),
                  [g.id for g in generations if g.id in skipped_ids and g.id not in known],
                  [g.id for g in unknown], not_judged_rows)


def _pass1_by(problems: Sequence[EvalProblem], results: dict[str, Result],
              key: Callable[[EvalProblem], str]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[list[bool]]] = defaultdict(list)
    for p in problems:
        groups[key(p)].append([results[p.wire_id(j)].correct for j in range(len(p.responses))])
    return {name: {"n_problems": len(v), "pass@1": mean_pass_at_k(v, 1)}
            for name, v in sorted(groups.items())}


def lcb_breakdown(joined: Joined, results: dict[str, Result], profile: str,
                  allow_errors: bool = False) -> dict[str, Any]:
    """LiveCodeBench's pass@1 (the mean over problems of correct/n, LiveCodeBench's
    ``compute_metrics_from_results``) over the LiveCodeBench problems, overall, by difficulty
    and by platform (those not judged only when ``allow_errors``, as :func:`counted`)."""
    ps = [p for p in counted(joined.problems, allow_errors) if p.id in joined.lcb]
    verdicts = [[results[p.wire_id(j)].correct for j in range(len(p.responses))] for p in ps]
    return {
        "profile": profile,
        "n_problems": len(ps),
        "pass@1": mean_pass_at_k(verdicts, 1) if verdicts else None,
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
    if summary.get("explain"):
        _print_explain(summary, console)
    fate = ("counted as incorrect" if summary.get("not_judged_counted_as_incorrect")
            else "left out of every number")
    for entry in summary.get("not_judged") or []:
        what = (f"problem {entry['id']!r}" if entry["id"] is not None
                else f"a row naming no problem ({entry.get('where') or entry.get('line')})")
        console.print(f"not judged: {what} ({entry['n_responses']} responses, {fate}): "
                      f"{entry['reason']}", highlight=False, soft_wrap=True)
    if summary.get("n_not_judged"):
        console.print(f"{summary['n_not_judged']} rows were not judged "
                      f"({summary['n_not_judged_responses']} responses); exit status "
                      f"{EXIT_NOT_JUDGED}", highlight=False)
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


def _write_json_lines(path: Path, records: Iterable[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")


def _score(cfg: EvalConfig, problems: Sequence[EvalProblem]) -> dict[str, Result]:
    """Score every response with a progress bar (the responses of problems that cannot be
    judged become INVALID_INPUT results here, unsent); write ``--results-output``; raise
    unless every response sent was judged (or ``allow_errors``)."""
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


def _explain(cfg: EvalConfig, joined: Joined, results: dict[str, Result]) -> dict[str, Any]:
    """``--explain``: the judged LiveCodeBench problems' responses judged again under
    ``cfg.explain``, and where the two profiles disagree (verifier/eval/explain.py)."""
    from verifier.eval.explain import explain, explain_checkers  # lazy: only --explain needs it

    assert cfg.explain is not None
    if cfg.explain == CHECKERS_AGAINST:
        ps = [p for p in joined.problems if not p.unjudged and has_checker(p.ground_truth)]
        items = [Item(f"explain:{p.wire_id(j)}", p.domain, p.responses[j],
                      without_checker(p.ground_truth), p.data_source, p.limits, p.profile)
                 for p in ps for j in range(len(p.responses))]
    else:
        ps = [p for p in joined.problems if p.id in joined.lcb and not p.unjudged]
        items = [Item(f"explain:{p.wire_id(j)}", p.domain, p.responses[j], p.ground_truth,
                      p.data_source, p.limits, cfg.explain)
                 for p in ps for j in range(len(p.responses))]
    console = Console(stderr=True)
    hidden = cfg.progress == "off" or (cfg.progress == "auto" and not console.is_terminal)
    with Progress(TextColumn(f"[bold]judging again under {cfg.explain}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  disable=hidden) as bar:
        task = bar.add_task("explain", total=len(items))
        done = (score_items(items, cfg.addr, cfg.scoring, cfg.client,
                            on_result=lambda _r: bar.advance(task)) if items else {})
    other = {key.removeprefix("explain:"): r for key, r in done.items()}
    if cfg.explain == CHECKERS_AGAINST:
        return explain_checkers(ps, results, other)
    return explain(ps, results, other, cfg.lcb_profile, cfg.explain)


def explain_table(summary: dict[str, Any]) -> Table:
    """``--explain``: disagreements by rule class."""
    ex = summary["explain"]
    a, b = ex["profile"], ex["against"]
    table = Table(title=f"where {a} and {b} disagree ({ex['n_disagree']} of "
                        f"{ex['n_responses']} responses)")
    table.add_column("rule class")
    table.add_column(f"{a} fails, {b} passes", justify="right")
    table.add_column(f"{a} passes, {b} fails", justify="right")
    table.add_column("why")
    for rule, c in ex["by_class"].items():
        table.add_row(rule, str(c[f"{a}_fails"]), str(c[f"{a}_passes"]), c["why"])
    return table


def _print_explain(summary: dict[str, Any], console: Console) -> None:
    ex = summary["explain"]
    if ex["against"] == CHECKERS_AGAINST:
        console.print(f"the checkers of {ex['n_problems']} problems changed "
                      f"{ex['n_changed']} of {ex['n_responses']} verdicts against the exact "
                      f"rule: {ex['checker_passes_exact_fails']} pass only with the checker, "
                      f"{ex['checker_fails_exact_passes']} only without it", highlight=False,
                      soft_wrap=True)
        return
    a, b = ex["profile"], ex["against"]
    console.print(explain_table(summary))
    share = ex["harness_share_of_failures"]
    console.print(f"pass@1 over {ex['n_problems']} LiveCodeBench problems: {a} "
                  f"{_pct(ex['pass@1'][a])}, {b} {_pct(ex['pass@1'][b])}; "
                  f"{ex[f'{a}_fails_{b}_passes']} of {ex[f'{a}_failures']} responses {a} fails "
                  f"pass under {b} ({_pct(share)}% of the failures are the rules' doing)",
                  highlight=False, soft_wrap=True)
    for pid, entry in list(ex["by_problem"].items())[:20]:
        shown = ", ".join(f"{d['index']} ({d['class']}: {a} {d[a]}, {b} {d[b]})"
                          for d in entry["disagree"][:5])
        more = f" and {len(entry['disagree']) - 5} more" if len(entry["disagree"]) > 5 else ""
        console.print(f"  problem {pid!r}: responses {shown}{more}", highlight=False,
                      soft_wrap=True)
    if len(ex["by_problem"]) > 20:
        console.print(f"  and {len(ex['by_problem']) - 20} more problems (the summary's "
                      "explain.by_problem)", highlight=False)


def _write_summary(cfg: EvalConfig, summary: dict[str, Any]) -> None:
    cfg.output.parent.mkdir(parents=True, exist_ok=True)
    cfg.output.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def run_eval(cfg: EvalConfig) -> dict[str, Any]:
    """Read, score, summarise; write ``cfg.output`` (and ``cfg.results_output``) and return the
    summary (:func:`exit_code` gives the command's status). Raises VerifierError for an
    unreadable generations file, an impossible k, or (unless ``allow_errors``) responses the
    verifier could not score; in that last case the per-response results are still written but
    the summary is not. Rows that cannot be judged never raise: ``not_judged``."""
    if cfg.input is None:
        return run_problems_eval(cfg)
    gens = read_generations(cfg.input, cfg.skip_invalid)
    mark_unjudgeable(gens.problems)
    k = resolve_k(counted(gens.problems, cfg.allow_errors), cfg.k,
                  allow_empty=bool(gens.problems or gens.not_judged))
    results = _score(cfg, gens.problems)
    summary = summarize(gens.problems, results, k, gens.skipped, cfg.allow_errors,
                        gens.not_judged)
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
        # judged (INVALID_INPUT), never a bad file; keep_unjudged (without --skip-invalid):
        # so is every malformed row, and those naming no problem are listed (skipped_rows).
        rows = load_rows(cfg.problem_files(), date_window=window, skip_invalid=cfg.skip_invalid,
                         allow_empty=True, keep_too_large=True,
                         keep_unjudged=not cfg.skip_invalid)
    except DataError as e:
        raise VerifierError(str(e), "invalid_argument") from None
    fmt, generations, skipped_generations = read_generations_file(cfg.generations,
                                                                  cfg.skip_invalid)
    joined = join_generations(rows, generations, cfg.lcb_profile)
    if joined.missing:
        log.warning("%d problems have no generation and are left out: %s", len(joined.missing),
                    ", ".join(joined.missing[:10]), extra={"missing": len(joined.missing)})
    # Without --skip-invalid, rows that name no problem (or a duplicate id) are not judged too.
    unnamed = [] if cfg.skip_invalid else [
        {"id": r.id, "line": None, "where": r.where, "n_responses": 0, "reason": r.reason}
        for r in rows.skipped_rows]
    not_judged_rows = joined.not_judged_rows + unnamed
    if not joined.problems and not not_judged_rows:
        raise VerifierError(f"no problem of {cfg.problems} has a generation in "
                            f"{cfg.generations} ({len(joined.missing)} without one, "
                            f"{joined.outside_window} outside the LiveCodeBench window, "
                            f"{rows.skipped} rows skipped as invalid)", "invalid_argument")
    k = resolve_k(counted(joined.problems, cfg.allow_errors), cfg.k, allow_empty=True)
    results = _score(cfg, joined.problems)
    summary = summarize(joined.problems, results, k, skipped_generations, cfg.allow_errors,
                        not_judged_rows)
    if not cfg.skip_invalid:
        rows.skipped, rows.skipped_rows = 0, []   # reported in not_judged instead
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
        summary["lcb"] = lcb_breakdown(joined, results, cfg.lcb_profile, cfg.allow_errors)
    if cfg.explain is not None:
        summary["explain"] = _explain(cfg, joined, results)
    _write_summary(cfg, summary)
    return summary
