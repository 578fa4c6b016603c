"""Conversions between the proto messages and the Python dataclasses of verifier/items.py.

Used by both ends of the wire: the server (proto -> Item, Result -> proto) and the client
(Item/dict -> proto, proto -> Result).
"""

from __future__ import annotations

import json
from typing import Any

from verifier.scoring.bigint import MAX_INT_DIGITS, json_dumps_digits, json_loads_digits
from verifier.items import (
    MAX_GROUND_TRUTH_CHARS,
    Item,
    Limits,
    Outcome,
    Result,
    Status,
    VerifierError,
    invalid,
    limits_from_dict,
)
from verifier.proto import verifier_pb2 as pb

RETRY_AFTER_KEY = "retry-after-ms"
"""Trailing-metadata key of a RESOURCE_EXHAUSTED answer: how long the server asks the client to
wait before retrying, milliseconds (docs/contracts.md). The server sets it, the fleet reads it."""

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
        # Integers as large as any profile allows (verifier/scoring/bigint.py).
        ground_truth = json_loads_digits(msg.ground_truth_json, MAX_INT_DIGITS)
    except RecursionError:
        # json's C decoder bounds its depth by the interpreter's recursion limit and raises
        # RecursionError, not ValueError: a few thousand brackets are the item's problem.
        return msg.id, invalid("ground_truth_json is nested too deeply")
    except ValueError as e:
        return msg.id, invalid(f"ground_truth_json is not valid JSON: {e}")
    return Item(
        id=msg.id,
        domain=msg.domain,
        response=msg.response,
        ground_truth=ground_truth,
        data_source=msg.data_source,
        limits=limits_from_proto(lim),
        profile=msg.profile,
    )


def item_to_proto(item: Item | dict[str, Any]) -> pb.Item:
    """Client side. Accepts an Item or a dict in the JSONL item format (docs/contracts.md 1).
    Raises VerifierError("invalid_argument") naming the problem when the item cannot be put on
    the wire at all (a non-string response, a ground truth that is not JSON, bad limits).
    Domain and ground-truth checks are the server's: they come back as INVALID_INPUT."""
    if isinstance(item, dict):
        item = _wire_item(item)
    if not isinstance(item.response, str) or not isinstance(item.domain, str):
        raise VerifierError(f"item {item.id!r}: 'domain' and 'response' must be strings",
                            "invalid_argument")
    try:
        # Integers as large as any profile allows, written without raising the interpreter's
        # limit (verifier/scoring/bigint.py): the server reads them back with json_loads_digits.
        gt_json = json_dumps_digits(item.ground_truth, MAX_INT_DIGITS)
    except (TypeError, ValueError, RecursionError) as e:
        raise VerifierError(f"item {item.id!r}: ground_truth is not JSON: {e}",
                            "invalid_argument") from None
    return pb.Item(
        id=item.id,
        domain=item.domain,
        response=item.response,
        ground_truth_json=gt_json,
        data_source=item.data_source,
        limits=limits_to_proto(item.limits),
        profile=item.profile,
    )


def _wire_item(obj: dict[str, Any]) -> Item:
    item_id = obj.get("id", "")
    if not isinstance(item_id, (str, int)) or isinstance(item_id, bool):
        raise VerifierError(f"item id {item_id!r} must be a string", "invalid_argument")
    data_source = obj.get("data_source") or ""
    if not isinstance(data_source, str):
        raise VerifierError(f"item {item_id!r}: 'data_source' must be a string", "invalid_argument")
    try:
        limits = limits_from_dict(obj.get("limits") or {})
    except VerifierError as e:
        raise VerifierError(f"item {item_id!r}: {e}", "invalid_argument") from None
    profile = obj.get("profile") or ""
    if not isinstance(profile, str):
        raise VerifierError(f"item {item_id!r}: 'profile' must be a string", "invalid_argument")
    return Item(id=str(item_id), domain=obj.get("domain"), response=obj.get("response"),  # type: ignore[arg-type]
                ground_truth=obj.get("ground_truth"), data_source=data_source, limits=limits,
                profile=profile)


def encode_item(item: Item | dict[str, Any]) -> pb.Item | Result:
    """Like item_to_proto, but an item that cannot be sent becomes its own INVALID_INPUT
    Result (so one bad item never fails a whole client call)."""
    try:
        return item_to_proto(item)
    except VerifierError as e:
        item_id = item.get("id", "") if isinstance(item, dict) else item.id
        return Result.from_outcome(str(item_id), invalid(str(e)), Limits(), 0.0)


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
        profile=result.profile,
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
        profile=msg.profile,
    )
