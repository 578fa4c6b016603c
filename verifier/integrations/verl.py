"""The verifier as verl's custom reward function.

    custom_reward_function:
      path: pkg://verifier.integrations.verl
      name: compute_score            # compute_score_batch with the batch manager (below)
      reward_kwargs:
        addr: dns:///verifier.default.svc.cluster.local:50051   # or set VERIFIER_ADDR

verl's default is its reward loop (``reward_model.use_reward_loop: true``, in
``verl/trainer/config/reward_model/dp_reward_loop.yaml``), whose naive manager calls
``compute_score``. Its registry has no batch or prime manager
(``verl/experimental/reward_loop/reward_manager/``): those are the legacy managers, chosen with
``reward_model.use_reward_loop=false reward_manager.name=batch`` (or ``prime``;
``verl/trainer/ppo/reward.py`` lines 120-125; the older key ``reward_model.reward_manager`` is
deprecated, ``verl/workers/config/reward_model.py`` lines 62-69).

How verl calls it (volcengine/verl at commit b178a3cd56f58b2d502255daba591e92833930a7):
- ``verl/trainer/ppo/reward.py`` ``get_custom_reward_fn`` (lines 80-96) loads ``name`` from
  ``path`` and wraps it so that every call also gets ``custom_reward_function.reward_kwargs`` as
  keywords (``_call_with_kwargs``, lines 42-48); ``pkg://`` paths are imported as modules.
- ``verl/workers/reward_manager/naive.py`` (lines 77-100) calls, per response,
  ``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`` and
  takes ``score["score"]`` from a dict, keeping every other key as ``reward_extra_info`` (one
  list per key, so every sample returns the same keys).
- ``verl/experimental/reward_loop/reward_manager/naive.py`` (lines 58-84) makes the same call
  from executor threads, adding ``reward_router_address`` / ``reward_model_tokenizer`` when a
  reward-model router is set.
- ``verl/workers/reward_manager/prime.py`` calls it positionally,
  ``compute_score(data_source, solution_str, ground_truth, extra_info)``, in a process pool
  (lines 31-42), and reads a non-number result as ``result[0]`` (line 87): a dict does not work
  there, so set ``reward_kwargs.return_dict: false`` to get a float. The prime manager itself
  turns any exception into a 0 score (lines 40-42, 81-83): prefer naive or batch.
- ``verl/workers/reward_manager/batch.py`` (lines 62-76) calls once per batch
  ``compute_score(data_sources=..., solution_strs=..., ground_truths=..., extra_infos=...,
  **reward_kwargs)`` (here also ``reward_model.reward_kwargs``) and reads ``scores[i]`` as a
  float or a dict with ``score`` (lines 100-110): that is ``compute_score_batch``.

Each returned dict is ``{"score", "acc", "status", "detail"}``: the reward, whether the answer
is correct, and the verdict and its reason, which verl keeps in ``reward_extra_info`` for its
logs and generation dumps. The domain of a sample is ``extra_info["domain"]`` when present,
else the ``domain`` keyword ("math" by default; "auto": code when the ground truth is an object
of test cases, as in Skywork's parquet). verl's managers write every score into a float tensor
and have no "no reward" value, so a response the verifier could not judge (INVALID_INPUT, such
as a ground truth that does not parse; SANDBOX_ERROR; INTERNAL_ERROR) raises ``UnjudgedError``
naming the sample and the reason, after the rest of the batch was scored; never a 0.

The address comes from the ``addr`` keyword, else ``VERIFIER_ADDR``; one client per process
(``verifier.integrations.common.shared_client``) serves every call. Nothing here imports verl
or torch.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Mapping, Sequence

from verifier.client import ClientConfig, VerifierClient
from verifier.integrations.common import (
    CONNECT_TIMEOUT_S,
    UnjudgedError,
    check_domain,
    domain_of,
    is_judged,
    limits_dict,
    plain,
    score_in_order,
    shared_client,
    short,
    unjudged_error,
)
from verifier.items import Limits, Result, VerifierError

log = logging.getLogger(__name__)

__all__ = ["ADDR_ENV", "UnjudgedError", "compute_score", "compute_score_batch"]

ADDR_ENV = "VERIFIER_ADDR"

VERL_KWARGS = frozenset({"reward_router_address", "reward_model_tokenizer"})
"""Keywords verl's reward-loop manager adds for reward-model routing; not ours, ignored."""

_warned: set[str] = set()
_warned_lock = threading.Lock()

_HINT = "verl has no 'no reward' value, so the step stops here: fix or drop these rows."


def compute_score(data_source: Any, solution_str: str, ground_truth: Any,
                  extra_info: Mapping[str, Any] | None = None, *, addr: str | None = None,
                  domain: str = "math", limits: Limits | Mapping[str, Any] | None = None,
                  client: Mapping[str, Any] | None = None,
                  connect_timeout_s: float = CONNECT_TIMEOUT_S, return_dict: bool = True,
                  **verl_kwargs: Any) -> dict[str, Any] | float:
    """Score one response, for verl's per-sample managers (naive, reward loop, prime).

    Keywords (``custom_reward_function.reward_kwargs``): ``addr`` (else ``VERIFIER_ADDR``),
    ``domain``, ``limits`` (per-item limits), ``client`` (``ClientConfig`` fields: TLS, token
    file, deadlines), ``connect_timeout_s``, ``return_dict`` (False: the bare float, for the
    prime manager)."""
    _note_unknown(verl_kwargs)
    item = _item("0", data_source, solution_str, ground_truth, extra_info, check_domain(domain),
                 limits_dict(limits))
    result = _client(addr, client, connect_timeout_s).score([item])[0]
    if not is_judged(result):
        raise unjudged_error([(_label(None, data_source, ground_truth), result)], 1, _HINT)
    return _verl_score(result, return_dict)


def compute_score_batch(data_sources: Sequence[Any], solution_strs: Sequence[str],
                        ground_truths: Sequence[Any],
                        extra_infos: Sequence[Mapping[str, Any] | None] | None = None, *,
                        addr: str | None = None, domain: str = "math",
                        limits: Limits | Mapping[str, Any] | None = None,
                        client: Mapping[str, Any] | None = None,
                        connect_timeout_s: float = CONNECT_TIMEOUT_S, return_dict: bool = True,
                        **verl_kwargs: Any) -> list[dict[str, Any] | float]:
    """Score a batch as one stream over the fleet, for verl's batch manager; the keywords are
    ``compute_score``'s. Results in input order."""
    _note_unknown(verl_kwargs)
    n = len(solution_strs)
    if extra_infos is None:
        extra_infos = [None] * n
    if not len(data_sources) == len(ground_truths) == len(extra_infos) == n:
        raise ValueError(
            f"compute_score_batch: {len(data_sources)} data_sources, {n} solution_strs, "
            f"{len(ground_truths)} ground_truths and {len(extra_infos)} extra_infos")
    dom, lim = check_domain(domain), limits_dict(limits)
    items = [_item(str(i), data_sources[i], solution_strs[i], ground_truths[i], extra_infos[i],
                   dom, lim) for i in range(n)]
    results = score_in_order(_client(addr, client, connect_timeout_s), items)
    bad = [(_label(i, data_sources[i], ground_truths[i]), r)
           for i, r in enumerate(results) if not is_judged(r)]
    if bad:
        raise unjudged_error(bad, n, _HINT)
    return [_verl_score(r, return_dict) for r in results]


def _item(item_id: str, data_source: Any, solution_str: Any, ground_truth: Any,
          extra_info: Any, domain: str, limits: dict[str, Any]) -> dict[str, Any]:
    gt = plain(ground_truth)
    row_domain = extra_info.get("domain") if isinstance(extra_info, Mapping) else None
    return {"id": item_id, "domain": domain_of(row_domain or domain, gt),
            "response": solution_str, "ground_truth": gt, "limits": limits,
            "data_source": "" if data_source is None else str(data_source)}


def _verl_score(result: Result, return_dict: bool) -> dict[str, Any] | float:
    if not return_dict:
        return result.reward
    return {"score": result.reward, "acc": result.correct, "status": result.status.value,
            "detail": result.detail}


def _label(index: int | None, data_source: Any, ground_truth: Any) -> str:
    where = "sample" if index is None else f"sample {index}"
    return f"{where} (data_source {str(data_source)!r}, ground_truth {short(ground_truth)})"


def _client(addr: str | None, client: Mapping[str, Any] | None,
            connect_timeout_s: float) -> VerifierClient:
    address = addr or os.environ.get(ADDR_ENV)
    if not address:
        raise VerifierError(
            f"no verifier address: set custom_reward_function.reward_kwargs.addr or "
            f"${ADDR_ENV} (HOST:PORT, a comma list, or dns:///NAME:PORT)", "invalid_argument")
    return shared_client(address, ClientConfig(**dict(client or {})), connect_timeout_s)


def _note_unknown(kwargs: Mapping[str, Any]) -> None:
    """Warn once per keyword that is neither ours nor verl's own (a misspelt option would
    otherwise be ignored without a word)."""
    for key in kwargs:
        if key in VERL_KWARGS:
            continue
        with _warned_lock:
            if key in _warned:
                continue
            _warned.add(key)
        log.warning("verifier reward: ignoring unknown keyword %r", key)
