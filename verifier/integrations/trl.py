"""``VerifierReward``: the verifier as a reward function for TRL's ``GRPOTrainer``.

    from trl import GRPOConfig, GRPOTrainer
    from verifier.integrations.trl import VerifierReward

    trainer = GRPOTrainer(model=..., reward_funcs=VerifierReward("dns:///verifier:50051"),
                          args=GRPOConfig(...), train_dataset=dataset)

How TRL calls it (huggingface/trl, trl/trainer/grpo_trainer.py, ``_calculate_rewards``: lines
1617-1663 at commit f2cd57710ae345ea6428ae95363267fcf38a3dc8, lines 1584-1630 in the trl 1.16.0
wheel): ``reward_func(prompts=..., completions=..., completion_ids=..., **reward_kwargs)``, where
``reward_kwargs`` holds every other dataset column as a list (one entry per completion) plus
``trainer_state``, ``log_extra`` and ``log_metric``; a returned ``None`` becomes NaN, which
TRL leaves out of the reward statistics and gives a zero advantage. Completions are strings, or
for conversational data lists of messages (``[{"role": "assistant", "content": ...}]``, more
messages after tool calls; the same file, ``_generate_and_score_completions``). TRL logs a
callable under ``getattr(f, "__name__", type(f).__name__)`` (trl/trainer/utils.py,
``get_callable_name``), so the metric is ``rewards/<name>/mean``.

The dataset carries the ground truth in a ``ground_truth`` column, and optionally ``domain``
("math" or "code"; default: the ``domain`` argument), ``data_source`` and ``checker`` (a code
problem's checker, docs/contracts.md 1, put into its ground truth; or carry it in the ground
truth itself). A verl/Skywork
parquet keeps it in ``reward_model.ground_truth`` (and the domain in ``ability``): map it once,

    dataset = dataset.map(lambda row: {"ground_truth": row["reward_model"]["ground_truth"],
                                       "domain": "code" if row["ability"] in ("code", "coding")
                                                 else "math"})

One call sends its whole batch as one stream to the fleet (``VerifierClient.stream``: one gRPC
stream per healthy replica, failover, retries, deadlines). A response the verifier could not
judge (INVALID_INPUT, e.g. a ground truth that does not parse; SANDBOX_ERROR; INTERNAL_ERROR) is
never a 0: by default the call raises ``UnjudgedError`` naming each such completion after
scoring the rest, or, with ``on_unjudged="none"``, it gets ``None`` (no reward for this one).

Nothing here imports TRL or torch: the reward function is plain Python.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Sequence

from verifier.scoring.checkers import add_checker
from verifier.client import ClientConfig, VerifierClient
from verifier.integrations.common import (
    CONNECT_TIMEOUT_S,
    UnjudgedError,
    check_domain,
    domain_of,
    embedded_address,
    is_judged,
    limits_dict,
    plain,
    score_in_order,
    shared_client,
    short,
    unjudged_error,
)
from verifier.items import Limits, Result, invalid

__all__ = ["UnjudgedError", "VerifierReward", "completion_text"]

TRL_KWARGS = frozenset({"completion_ids", "trainer_state", "log_extra", "log_metric",
                        "environments"})
"""Keywords TRL adds to the dataset columns (grpo_trainer.py, ``_calculate_rewards``)."""


class VerifierReward:
    """A TRL reward function scoring with the verifier fleet at ``addr`` (``host:port``, a
    comma list, or ``dns:///name:port``); without ``addr``, with one embedded local verifier
    per process (``verifier serve`` on a free loopback port, started at the first call).

    - ``domain``: for rows without a ``domain`` column value: "math", "code" or "auto" (code
      when the ground truth is an object of test cases).
    - ``on_unjudged``: "raise" (default) or "none" (see the module docstring).
    - ``limits``: per-item limits for every item (``verifier.items.Limits`` or its dict form).
    - ``config``: client settings (TLS, token, deadlines, retries); ``connect_timeout_s``: how
      long the first call waits for a healthy replica before failing with the address named.
    - ``name``: the ``__name__`` TRL logs the reward under.

    Holds no connection itself (the client is process-wide), so it pickles.
    """

    def __init__(self, addr: str | None = None, *, domain: str = "math",
                 on_unjudged: Literal["raise", "none"] = "raise",
                 limits: Limits | Mapping[str, Any] | None = None,
                 config: ClientConfig | None = None,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 local_workers: int | None = None, name: str = "verifier"):
        if on_unjudged not in ("raise", "none"):
            raise ValueError(f"on_unjudged must be 'raise' or 'none', got {on_unjudged!r}")
        self.addr = addr
        self.domain = check_domain(domain)
        self.on_unjudged = on_unjudged
        self.limits = limits_dict(limits)
        self.config = config or ClientConfig()
        self.connect_timeout_s = connect_timeout_s
        self.local_workers = local_workers
        self.__name__ = name

    def __repr__(self) -> str:
        return f"VerifierReward(addr={self.addr!r}, name={self.__name__!r})"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 **columns: Any) -> list[float | None]:
        results = self.score(completions, **columns)
        log_metric, log_extra = columns.get("log_metric"), columns.get("log_extra")
        if callable(log_metric) and results:  # TRL averages it over the logging step
            judged = sum(is_judged(r) for r in results)
            log_metric(f"{self.__name__}/unjudged_frac", 1.0 - judged / len(results))
        if callable(log_extra):  # a column of the completions table
            log_extra(f"{self.__name__}_status", [r.status.value for r in results])
        bad = [(f"completion {i}", r) for i, r in enumerate(results) if not is_judged(r)]
        if bad and self.on_unjudged == "raise":
            raise unjudged_error(bad, len(results),
                                 "Fix the data, or pass on_unjudged='none' to VerifierReward "
                                 "to give such completions no reward (None).")
        return [r.reward if is_judged(r) else None for r in results]

    def score(self, completions: Sequence[Any], **columns: Any) -> list[Result]:
        """The verifier's Result for each completion, in order (``__call__`` without the
        reward policy): the dataset columns ``ground_truth`` and optionally ``domain`` and
        ``data_source`` as TRL passes them."""
        n = len(completions)
        if "ground_truth" not in columns:
            have = sorted(k for k in columns if k not in TRL_KWARGS)
            raise ValueError(
                f"{self.__name__}: the dataset has no 'ground_truth' column (TRL passed the "
                f"columns {have}); add one, e.g. from a verl parquet's "
                "reward_model.ground_truth")
        ground_truths = _column(columns, "ground_truth", n)
        domains = _column(columns, "domain", n)
        sources = _column(columns, "data_source", n)
        checkers = _column(columns, "checker", n)
        items: list[dict[str, Any]] = []
        local: dict[int, Result] = {}
        for i, completion in enumerate(completions):
            try:
                response = completion_text(completion)
                gt = add_checker(plain(ground_truths[i]), plain(checkers[i]))
            except ValueError as e:  # BadChecker is one: that completion's INVALID_INPUT
                local[i] = Result.from_outcome(str(i), invalid(str(e)), Limits(), 0.0)
                continue
            item: dict[str, Any] = {
                "id": str(i),
                "domain": domain_of(domains[i] if domains[i] is not None else self.domain, gt),
                "response": response, "ground_truth": gt, "limits": self.limits}
            if isinstance(sources[i], str):
                item["data_source"] = sources[i]
            items.append(item)
        scored = iter(score_in_order(self._client(), items)) if items else iter(())
        return [local[i] if i in local else next(scored) for i in range(n)]

    def _client(self) -> VerifierClient:
        addr = self.addr if self.addr is not None else embedded_address(self.local_workers)
        return shared_client(addr, self.config, self.connect_timeout_s)


def _column(columns: Mapping[str, Any], name: str, n: int) -> Sequence[Any]:
    values = columns.get(name)
    if values is None:
        return [None] * n
    if len(values) != n:
        raise ValueError(f"column {name!r} has {len(values)} values for {n} completions")
    return values


def completion_text(completion: Any) -> str:
    """The text to score: a plain completion as is; a conversational one (a list of messages)
    as its assistant messages' text joined by newlines (after tool calls the answer is in a
    later assistant message). Content given as parts keeps the ``text`` parts. ValueError
    names what is wrong with anything else."""
    if isinstance(completion, str):
        return completion
    if not isinstance(completion, list) or not all(isinstance(m, Mapping) for m in completion):
        raise ValueError(f"expected a string or a list of chat messages, got {short(completion)}")
    texts = [_content_text(m.get("content")) for m in completion if m.get("role") == "assistant"]
    if not texts:
        raise ValueError(f"no assistant message in {short(completion)}")
    return "\n".join(texts)


def _content_text(content: Any) -> str:
    if content is None:  # a message with only tool calls
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, Mapping) and p.get("type") == "text")
    raise ValueError(f"message content must be text or a list of parts, got {short(content)}")
