"""The scoring requests of the HTTP gateway as items, and their results as answers: OpenRLHF's
remote reward (``POST /get_reward``) and this project's JSON items (``POST /score``). Pure:
no I/O; the gateway (verifier/http/gateway.py) submits the items to the Scorer.

OpenRLHF's remote reward, as its public source describes it (OpenRLHF/OpenRLHF):

- the request is ``{"query": [...], "prompts": [...], "labels": [...]}``: each query is the
  prompt and the response decoded together (``skip_special_tokens=False``), each label the
  row's ground truth (``--label_key``). 0.8.2 and earlier ``openrlhf/utils/remote_rm_utils.py``
  (``request_api_wrapper``, ``remote_rm_fn``) read ``response["rewards"]`` (``score_key``);
  0.8.3 to 0.9.x read the whole answer: ``rewards``, and ``scores`` and ``extra_logs`` when
  present (``openrlhf/trainer/ppo_utils/experience_maker.py``, ``update_samples_with_rewards``:
  every ``extra_logs`` value is a list of numbers, one per query); 0.10 and later send one
  query per request from ``SingleTurnAgentExecutor._fetch_rewards_via_http``
  (``openrlhf/utils/agent.py``) and read the same three keys. Its example server
  ``openrlhf/cli/serve_rm.py`` answers ``{"rewards", "scores", "extra_logs"}``.

Our rules: the response is the query after its prompt (the first place the prompt's text occurs;
the whole query when it does not occur); the item's domain comes from the label: an object
(or JSON text of one) of test cases is code, anything else is a math answer, and a label object
with a ``"ground_truth"`` key is an item of its own (``domain``, ``ground_truth``,
``data_source``, ``limits`` as in docs/contracts.md 1). A reward must be a number for OpenRLHF,
and a response the verifier could not judge has none (docs/verifier.md 1), so such a request is
refused as a whole (``unjudged``): SANDBOX_ERROR or INTERNAL_ERROR as "unavailable" (503; the
client retries), INVALID_INPUT as "unprocessable" (422), each naming the first few.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verifier.integrations.common import AUTO, domain_of, is_judged
from verifier.items import (
    Item,
    Outcome,
    Result,
    Status,
    VerifierError,
    decode_ground_truth,
    invalid,
    item_from_dict,
)

Entry = Item | tuple[str, Outcome]


def _bad(message: str) -> VerifierError:
    return VerifierError(message, "invalid_argument")


def _check_size(n: int, max_items: int) -> None:
    if n > max_items:
        raise VerifierError(f"{n} items in one request is over this server's limit of "
                            f"{max_items}; split it", "payload_too_large")


def score_items(body: Any, max_items: int) -> list[Entry]:
    """``POST /score``: ``{"items": [item, ...]}`` (docs/contracts.md 1). A malformed item is
    that item's INVALID_INPUT result, never the request's failure."""
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise _bad('the request must be a JSON object {"items": [item, ...]}')
    items = body["items"]
    _check_size(len(items), max_items)
    return [item_from_dict(obj, index=i) for i, obj in enumerate(items)]


def response_of(query: str, prompt: Any) -> str:
    """The response in ``query``: what follows the first occurrence of ``prompt``."""
    if not isinstance(prompt, str) or not prompt:
        return query
    at = query.find(prompt)
    return query if at < 0 else query[at + len(prompt):]


def _list(body: Mapping[str, Any], key: str, n: int | None) -> list:
    v = body.get(key)
    if not isinstance(v, list):
        raise _bad(f"'{key}' must be a list, got {type(v).__name__}")
    if n is not None and len(v) != n:
        raise _bad(f"'{key}' has {len(v)} entries but 'query' has {n}")
    return v


def _reward_item(i: int, query: Any, prompt: Any, label: Any) -> Entry:
    item_id = str(i)
    if not isinstance(query, str):
        return item_id, invalid(f"query {i} must be a string, got {type(query).__name__}")
    if prompt is not None and not isinstance(prompt, str):
        return item_id, invalid(f"prompt {i} must be a string, got {type(prompt).__name__}")
    response = response_of(query, prompt)
    decoded = decode_ground_truth(label)
    if isinstance(decoded, dict) and "ground_truth" in decoded:  # an item of its own
        obj = {**decoded, "id": item_id, "response": response}
        obj["domain"] = domain_of(obj.get("domain", AUTO), obj["ground_truth"])
        return item_from_dict(obj)
    return item_from_dict({"id": item_id, "domain": domain_of(AUTO, label),
                           "response": response, "ground_truth": label})


def reward_items(body: Any, max_items: int) -> list[Entry]:
    """``POST /get_reward``: OpenRLHF's request (module docstring) as items, ids "0", "1", ..."""
    if not isinstance(body, dict):
        raise _bad(f"the request must be a JSON object, got {type(body).__name__}")
    queries = _list(body, "query", None)
    _check_size(len(queries), max_items)
    labels = _list(body, "labels", len(queries))
    prompts = _list(body, "prompts", len(queries)) if body.get("prompts") is not None \
        else [None] * len(queries)
    return [_reward_item(i, q, p, lab) for i, (q, p, lab) in
            enumerate(zip(queries, prompts, labels))]


def _named(bad: list[Result]) -> str:
    shown = "; ".join(f"query {r.id}: {r.status.value}: {r.detail}"[:300] for r in bad[:5])
    return shown + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")


def reward_answer(results: list[Result]) -> dict[str, Any]:
    """The answer OpenRLHF reads, plus ``results`` (ours, in query order). Raises
    VerifierError when a response could not be judged (module docstring)."""
    unjudged = [r for r in results if not is_judged(r)]
    if unjudged:
        broken = [r for r in unjudged if r.status is not Status.INVALID_INPUT]
        if broken:
            raise VerifierError(
                f"the verifier could not judge {len(broken)} of {len(results)} responses "
                f"(no reward, not a 0; retry): {_named(broken)}", "unavailable")
        raise VerifierError(
            f"{len(unjudged)} of {len(results)} queries cannot be judged (no reward, not a 0): "
            f"{_named(unjudged)}", "unprocessable")
    rewards = [r.reward for r in results]
    return {
        "rewards": rewards,
        "scores": rewards,
        "extra_logs": {"verifier_correct": [1.0 if r.correct else 0.0 for r in results]},
        "results": [r.to_dict() for r in results],
    }


def score_answer(results: list[Result]) -> dict[str, Any]:
    """``POST /score``'s answer: every result, in item order."""
    return {"results": [r.to_dict() for r in results]}
