"""Conversions between the proto messages and the Python dataclasses of verifier/items.py.

Used by both ends of the wire: the server (proto -> Item, Result -> proto) and the client
(Item/dict -> proto, proto -> Result).
"""

from __future__ import annotations

import json
from typing import Any

from verifier.items import (
    MAX_GROUND_TRUTH_CHARS,
    Item,
    Limits,
    Outcome,
    Result,
    Status,
    VerifierError,
    invalid,
    item_from_dict,
)
from verifier.proto import verifier_pb2 as pb

_REWARD_MODES = {pb.BINARY: "binary", pb.FRACTIONAL: "fractional"}


def limits_from_proto(msg: pb.Limits) -> Limits:
    return Limits(
        timeout_s=msg.timeout_s or None,
        test_timeout_s=msg.test_timeout_s or None,
        memory_mb=msg.memory_mb or None,
        run_all_tests=msg.run_all_tests,
        reward_mode=_REWARD_MODES.get(msg.reward_mode, "binary"),  # type: ignore[arg-type]
    )


def limits_to_proto(limits: Limits) -> pb.Limits:
    return pb.Limits(
        timeout_s=limits.timeout_s or 0.0,
        test_timeout_s=limits.test_timeout_s or 0.0,
        memory_mb=limits.memory_mb or 0,
        run_all_tests=limits.run_all_tests,
        reward_mode=pb.FRACTIONAL if limits.reward_mode == "fractional" else pb.BINARY,
    )


def item_from_proto(msg: pb.Item) -> Item | tuple[str, Outcome]:
    """An Item, or ``(id, INVALID_INPUT outcome)`` when the message is malformed."""
    lim = msg.limits
    for name in ("timeout_s", "test_timeout_s"):
        if getattr(lim, name) < 0:
            return msg.id, invalid(f"limits.{name} must be positive")
    if lim.memory_mb < 0:
        return msg.id, invalid("limits.memory_mb must be positive")
    if lim.reward_mode not in _REWARD_MODES:
        return msg.id, invalid(f"unknown limits.reward_mode {lim.reward_mode}")
    if len(msg.ground_truth_json) > MAX_GROUND_TRUTH_CHARS:
        return msg.id, invalid(f"ground_truth_json over the cap of {MAX_GROUND_TRUTH_CHARS} characters")
    if not msg.ground_truth_json:
        return msg.id, invalid("'ground_truth_json' is empty")
    try:
        ground_truth = json.loads(msg.ground_truth_json)
    except ValueError as e:
        return msg.id, invalid(f"ground_truth_json is not valid JSON: {e}")
    return Item(
        id=msg.id,
        domain=msg.domain,
        response=msg.response,
        ground_truth=ground_truth,
        data_source=msg.data_source,
        limits=limits_from_proto(lim),
    )


def item_to_proto(item: Item | dict[str, Any]) -> pb.Item:
    """Client side. Accepts an Item or a dict in the JSONL item format (DESIGN.md 3.1);
    a malformed dict raises VerifierError("invalid_argument") naming the problem."""
    if isinstance(item, dict):
        parsed = item_from_dict(item)
        if isinstance(parsed, tuple):
            raise VerifierError(f"item {parsed[0]!r}: {parsed[1].detail}", "invalid_argument")
        item = parsed
    return pb.Item(
        id=item.id,
        domain=item.domain,
        response=item.response,
        ground_truth_json=json.dumps(item.ground_truth),
        data_source=item.data_source,
        limits=limits_to_proto(item.limits),
    )


def result_to_proto(result: Result) -> pb.Result:
    return pb.Result(
        id=result.id,
        reward=result.reward,
        correct=result.correct,
        status=pb.Status.Value(result.status.value),
        passed=result.passed,
        total=result.total,
        detail=result.detail,
        elapsed_ms=result.elapsed_ms,
        data_source=result.data_source,
    )


def result_from_proto(msg: pb.Result) -> Result:
    return Result(
        id=msg.id,
        reward=msg.reward,
        correct=msg.correct,
        status=Status(pb.Status.Name(msg.status)),
        passed=msg.passed,
        total=msg.total,
        detail=msg.detail,
        elapsed_ms=msg.elapsed_ms,
        data_source=msg.data_source,
    )
