"""Items, limits and results: the contract of docs/contracts.md 1 as Python dataclasses.

Scorers are pure functions ``(response, ground_truth, limits) -> Outcome``; the service wraps an
Outcome into a Result (id, reward, timing). Bad input never raises out of a batch: it becomes a
per-item ``Status.INVALID_INPUT`` Outcome with a reason.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from verifier.scoring.bigint import MAX_INT_DIGITS, json_loads_digits

DOMAINS = ("math", "code")
PROFILES = ("default", "lcb", "skywork")
"""Judging profiles: whose rules an item is judged by (verifier/scoring/profiles.py). "default" is this
project's; "lcb" reproduces LiveCodeBench's judge; "skywork" the released Skywork-OR1 reward."""

# Size caps on what one item may carry. Chosen generously: a 32K-token response is ~130 KB of
# text, and a Skywork code row's tests are ~105 KB on average (a few MB at most).
MAX_RESPONSE_CHARS = 1_000_000
MAX_GROUND_TRUTH_CHARS = 64_000_000
MAX_ID_CHARS = 1_000


class Status(str, enum.Enum):
    """Closed set of verdicts; names and numbers equal the proto's ``Status`` enum."""

    CORRECT = "CORRECT"
    INCORRECT = "INCORRECT"
    NO_ANSWER = "NO_ANSWER"
    TIMEOUT = "TIMEOUT"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    MEMORY_LIMIT = "MEMORY_LIMIT"
    OUTPUT_LIMIT = "OUTPUT_LIMIT"
    COMPILE_ERROR = "COMPILE_ERROR"
    SYNTAX_ERROR = "SYNTAX_ERROR"
    INVALID_INPUT = "INVALID_INPUT"
    SANDBOX_ERROR = "SANDBOX_ERROR"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    RESPONSE_TOO_LONG = "RESPONSE_TOO_LONG"


NOT_A_VERDICT = (Status.INVALID_INPUT, Status.SANDBOX_ERROR, Status.INTERNAL_ERROR)
"""Statuses that say "this response could not be scored", not "this response is wrong": a
trainer must not read them as reward 0, and evaluation counts them as errors."""


class VerifierError(Exception):
    """The one domain exception of the verifier. ``code`` is mapped to a gRPC status code at the
    service boundary (verifier/service/servicer.py) and nowhere else.

    codes: "invalid_argument", "resource_exhausted", "unavailable", "deadline_exceeded",
    "failed_precondition", "internal".
    """

    def __init__(self, message: str, code: str = "internal"):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Limits:
    """Per-item limits. ``None`` means "use the server's default"."""

    timeout_s: float | None = None
    """Hard wall-clock deadline for scoring the whole item, seconds (math default 5 s)."""
    test_timeout_s: float | None = None
    """Code: time limit of one test case, seconds (default 6 s, LiveCodeBench's)."""
    memory_mb: int | None = None
    """Code: address-space limit of the program, MiB (default 1024)."""
    run_all_tests: bool = False
    """Code: keep running tests after the first failure (default: stop, as released)."""
    reward_mode: Literal["binary", "fractional"] = "binary"
    """"binary": 1.0 iff every test passes (as released); "fractional": passed/total."""

    def with_defaults(self, **defaults: Any) -> "Limits":
        """Fill the ``None`` fields from ``defaults`` (server-side defaults)."""
        changes = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        return dataclasses.replace(self, **changes)


@dataclass
class Item:
    """One thing to verify (docs/contracts.md 1). ``ground_truth`` is kept as given (decoded JSON);
    each scorer validates and normalises the format of its domain."""

    id: str
    domain: str
    response: str
    ground_truth: Any
    data_source: str = ""
    limits: Limits = field(default_factory=Limits)
    profile: str = ""
    """Judging profile (one of PROFILES), or "" for the server's default."""


@dataclass
class Outcome:
    """What a scorer returns: a verdict, a reason, and test counts (code only)."""

    status: Status
    detail: str = ""
    passed: int = 0
    total: int = 0

    @property
    def correct(self) -> bool:
        return self.status is Status.CORRECT


@dataclass
class Result:
    """The JSON result of docs/contracts.md 1."""

    id: str
    reward: float
    correct: bool
    status: Status
    passed: int = 0
    total: int = 0
    detail: str = ""
    elapsed_ms: float = 0.0
    data_source: str = ""
    profile: str = ""
    """The judging profile the item was judged under ("" when it never reached a scorer)."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_outcome(
        cls,
        item_id: str,
        outcome: Outcome,
        limits: Limits,
        elapsed_ms: float,
        data_source: str = "",
        profile: str = "",
    ) -> "Result":
        return cls(
            id=item_id,
            reward=reward_of(outcome, limits.reward_mode),
            correct=outcome.correct,
            status=outcome.status,
            passed=outcome.passed,
            total=outcome.total,
            detail=outcome.detail,
            elapsed_ms=elapsed_ms,
            data_source=data_source,
            profile=profile,
        )


def reward_of(outcome: Outcome, mode: str = "binary") -> float:
    """docs/verifier.md 1: 1.0 when the item is correct, else 0.0; "fractional" gives passed/total for
    items that ran tests. INVALID_INPUT and SANDBOX_ERROR results are visible through their
    status; a trainer must not treat them as a genuine 0 reward."""
    if outcome.status is Status.CORRECT:
        return 1.0
    if mode == "fractional" and outcome.total > 0:
        return outcome.passed / outcome.total
    return 0.0


def invalid(detail: str) -> Outcome:
    return Outcome(Status.INVALID_INPUT, detail)


def unreadable(err: Exception) -> Outcome:
    """The INVALID_INPUT of an item whose reading raised ``err`` (a RecursionError on a freak
    ground truth, ...): that item's result, never its call's failure."""
    return invalid(f"the item could not be read: {type(err).__name__}: {err}"[:500])


def response_too_long(n_chars: int) -> Outcome:
    """A response over MAX_RESPONSE_CHARS: the policy's failure (a runaway generation), judged
    as a genuine zero (RESPONSE_TOO_LONG), not the item's (INVALID_INPUT), so no trainer or
    reward function ever drops or raises on something a policy wrote."""
    return Outcome(
        Status.RESPONSE_TOO_LONG,
        f"the response has {n_chars} characters, over the verifier's cap of {MAX_RESPONSE_CHARS}",
    )


def decode_ground_truth(value: Any) -> Any:
    """Undo one level of JSON-in-a-string for list/object ground truths (Skywork-OR1-RL-Data
    stores ``'["3"]'`` and code tests as JSON text). A plain answer string is returned as is:
    only text that starts with ``[`` or ``{`` and parses as JSON is decoded, and a decoded list
    must hold only strings (so an interval answer like ``"[1, 2]"`` stays a string)."""
    if isinstance(value, str):
        s = value.strip()
        if s[:1] in ("[", "{"):
            try:
                # Integers as large as any profile allows (verifier/scoring/bigint.py): the judge
                # applies the item's own profile when it parses the tests.
                decoded = json_loads_digits(s, MAX_INT_DIGITS)
            except (ValueError, RecursionError):
                # RecursionError: thousands of brackets (json's depth bound); then the text
                # is not a JSON list or object in any useful sense: judge it as written.
                return value
            if isinstance(decoded, dict):
                return decoded
            if isinstance(decoded, list) and decoded and all(isinstance(x, str) for x in decoded):
                return decoded
    return value


def item_from_dict(obj: Any, index: int | None = None) -> Item | tuple[str, Outcome]:
    """Build an Item from a decoded JSON object, or return ``(id, Outcome(INVALID_INPUT))``
    naming what is wrong. Unknown extra fields are ignored (docs/contracts.md 1)."""
    fallback_id = f"#{index}" if index is not None else ""
    if not isinstance(obj, dict):
        return fallback_id, invalid(f"item must be a JSON object, got {type(obj).__name__}")
    item_id = obj.get("id", fallback_id)
    if not isinstance(item_id, (str, int)) or isinstance(item_id, bool):
        return fallback_id, invalid("'id' must be a string")
    item_id = str(item_id)
    limits_obj = obj.get("limits") or {}
    try:
        limits = limits_from_dict(limits_obj)
    except VerifierError as e:
        return item_id, invalid(str(e))
    data_source = obj.get("data_source") or ""
    if not isinstance(data_source, str):
        return item_id, invalid("'data_source' must be a string")
    item = Item(
        id=item_id,
        domain=obj.get("domain"),  # type: ignore[arg-type]  (validated below)
        response=obj.get("response"),  # type: ignore[arg-type]
        ground_truth=obj.get("ground_truth"),
        data_source=data_source,
        limits=limits,
    )
    problem = validate_item(item)
    if problem is not None:
        return item_id, problem
    return item


def validate_item(item: Item) -> Outcome | None:
    """Envelope checks common to every domain; None when the item is well formed."""
    if len(item.id) > MAX_ID_CHARS:
        return invalid(f"'id' longer than {MAX_ID_CHARS} characters")
    if item.domain not in DOMAINS:
        return invalid(f"unknown domain {item.domain!r}; expected one of {', '.join(DOMAINS)}")
    if item.profile and item.profile not in PROFILES:
        return invalid(f"unknown profile {item.profile!r}; expected one of {', '.join(PROFILES)}")
    if not isinstance(item.response, str):
        return invalid(f"'response' must be a string, got {type(item.response).__name__}")
    if len(item.response) > MAX_RESPONSE_CHARS:
        return response_too_long(len(item.response))
    if item.ground_truth is None:
        return invalid("'ground_truth' is missing")
    return None


def limits_from_dict(obj: Any) -> Limits:
    if not isinstance(obj, dict):
        raise VerifierError("'limits' must be an object", "invalid_argument")
    known = {f.name for f in dataclasses.fields(Limits)}
    unknown = set(obj) - known
    if unknown:
        raise VerifierError(f"unknown limits {sorted(unknown)}", "invalid_argument")
    for key in ("timeout_s", "test_timeout_s"):
        v = obj.get(key)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0):
            raise VerifierError(f"limits.{key} must be a positive number of seconds", "invalid_argument")
    mem = obj.get("memory_mb")
    if mem is not None and (not isinstance(mem, int) or isinstance(mem, bool) or mem <= 0):
        raise VerifierError("limits.memory_mb must be a positive integer", "invalid_argument")
    mode = obj.get("reward_mode", "binary")
    if mode not in ("binary", "fractional"):
        raise VerifierError("limits.reward_mode must be 'binary' or 'fractional'", "invalid_argument")
    return Limits(**obj)
