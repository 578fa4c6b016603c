"""Schedules of MAGIC: multi-stage context lengths and the off-policy quadruple.

- Multi-stage training: Skywork-OR1 (arXiv 2505.22312) §3, "Multi-Stage Training";
  docs/magic.md, rule "Multi-stage".
- The off-policy quadruple (N_SGD, D_R, D_T, N_reuse): Skywork-OR1 §3 "On-Policy Training" and
  the off-policy-update ablation of §4 (entropy-collapse studies); docs/magic.md, rule
  "Off-policy knobs".

torch is imported lazily (only :meth:`OffPolicyConfig.minibatches` and
:func:`response_indices` need it), so configs can be built and validated without it.
Re-exported by :mod:`trainer.magic`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from trainer.config_schema import check_keys

if TYPE_CHECKING:
    import torch  # lazy: MagicConfig (the config layer) imports this module without torch

PlateauMode = Literal["max", "min"]

_STATE_VERSION = 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _build(cls: Any, kind: str, data: Mapping[str, Any]) -> Any:
    try:
        return cls(**dict(data))
    except TypeError as exc:  # a missing required key
        raise ValueError(f"{kind} {dict(data)!r}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Multi-stage schedule
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plateau:
    """End a stage when ``metric`` has not improved for ``patience`` observations of it.

    Skywork-OR1 §3 "Multi-Stage Training": move to a longer context "once the model's
    performance converged"; this makes "converged" a testable rule.

    An observation improves on the best so far when ``value > best + min_delta`` (mode
    ``"max"``) or ``value < best - min_delta`` (mode ``"min"``). The first observation sets the
    best and counts as no failure. A non-finite value counts as a failure. Steps whose metrics
    lack ``metric`` (e.g. ``eval/accuracy`` between evaluations) are not observations.
    """

    metric: str
    patience: int
    min_delta: float = 0.0
    mode: PlateauMode = "max"

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"plateau metric must be a non-empty string, got {self.metric!r}")
        if not _is_int(self.patience) or self.patience < 1:
            raise ValueError(f"plateau patience must be an int >= 1 (observations of the "
                             f"metric without improvement), got {self.patience!r}")
        if isinstance(self.min_delta, bool) or not isinstance(self.min_delta, (int, float)) \
                or not math.isfinite(self.min_delta) or self.min_delta < 0:
            raise ValueError(f"plateau min_delta must be a finite number >= 0, "
                             f"got {self.min_delta!r}")
        object.__setattr__(self, "min_delta", float(self.min_delta))
        if self.mode not in ("max", "min"):
            raise ValueError(f"plateau mode must be 'max' or 'min', got {self.mode!r}")

    def improves(self, value: float, best: float) -> bool:
        """Whether ``value`` improves on ``best`` by more than ``min_delta``."""
        if self.mode == "max":
            return value > best + self.min_delta
        return value < best - self.min_delta

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plateau:
        """Build from a plain dict; unknown keys raise ValueError naming them."""
        check_keys("plateau", data, ("metric", "patience", "min_delta", "mode"))
        return _build(cls, "plateau", data)

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "patience": self.patience,
                "min_delta": self.min_delta, "mode": self.mode}


@dataclass(frozen=True)
class Stage:
    """One training stage (Skywork-OR1 §3 "Multi-Stage Training").

    Args:
        name: unique label, logged as the ``stage`` metric.
        max_response_length: rollout length limit in tokens during this stage; a response that
            hits it is "truncated" (see :func:`trainer.magic.group_advantages`).
        steps: end after this many training steps in the stage (optional).
        plateau: end when a metric plateaus (optional). With both, whichever comes first.

    Every stage but the last needs an end condition; the last never ends on its own (the run's
    own step budget stops it), so its end condition, if any, is ignored.
    """

    name: str
    max_response_length: int
    steps: int | None = None
    plateau: Plateau | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"stage name must be a non-empty string, got {self.name!r}")
        if not _is_int(self.max_response_length) or self.max_response_length < 1:
            raise ValueError(f"stage {self.name!r}: max_response_length must be an int >= 1 "
                             f"(tokens), got {self.max_response_length!r}")
        if self.steps is not None and (not _is_int(self.steps) or self.steps < 1):
            raise ValueError(f"stage {self.name!r}: steps must be an int >= 1 or None, "
                             f"got {self.steps!r}")
        if isinstance(self.plateau, Mapping):
            object.__setattr__(self, "plateau", Plateau.from_dict(self.plateau))
        if self.plateau is not None and not isinstance(self.plateau, Plateau):
            raise ValueError(f"stage {self.name!r}: plateau must be a Plateau, a dict or None, "
                             f"got {self.plateau!r}")

    @property
    def has_end(self) -> bool:
        return self.steps is not None or self.plateau is not None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stage:
        """Build from a plain dict (``plateau`` may be a nested dict); unknown keys raise."""
        check_keys("stage", data, ("name", "max_response_length", "steps", "plateau"))
        return _build(cls, "stage", data)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "max_response_length": self.max_response_length,
                "steps": self.steps,
                "plateau": None if self.plateau is None else self.plateau.to_dict()}


def validate_stages(stages: Sequence[Stage]) -> None:
    """Check a stage list: non-empty, unique names, strictly increasing lengths, end conditions.

    Skywork-OR1 §3 "Multi-Stage Training" (the context length T only grows); docs/magic.md.

    Raises:
        ValueError: stating the broken rule.
    """
    if len(stages) == 0:
        raise ValueError("stages must hold at least one stage")
    for stage in stages:
        if not isinstance(stage, Stage):
            raise ValueError(f"stages must be Stage objects (or dicts in from_dict), "
                             f"got {stage!r}")
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ValueError(f"stage names must be unique, got {names}")
    lengths = [s.max_response_length for s in stages]
    if any(b <= a for a, b in zip(lengths, lengths[1:], strict=False)):
        raise ValueError("stages must have strictly increasing max_response_length, "
                         f"got {lengths}")
    for stage in stages[:-1]:
        if not stage.has_end:
            raise ValueError(f"stage {stage.name!r} is not the last stage and needs an end "
                             "condition (steps and/or plateau); only the last may run forever")


class StageSchedule:
    """Moves one run through its stages (Skywork-OR1 §3 "Multi-Stage Training").

    Call :meth:`observe` once after every training step with that step's metrics. A stage with
    ``steps=N`` ends after its N-th observed step; a stage with a plateau ends on the step whose
    metric observation makes ``patience`` failures in a row. Then :attr:`current` is the next
    stage and the following step uses its ``max_response_length``. The last stage never ends.
    """

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages: tuple[Stage, ...] = tuple(stages)
        validate_stages(self.stages)
        self._index = 0
        self._steps_in_stage = 0
        self._best: float | None = None
        self._bad = 0
        self._transitions: list[dict[str, Any]] = []

    @property
    def index(self) -> int:
        return self._index

    @property
    def current(self) -> Stage:
        return self.stages[self._index]

    @property
    def max_response_length(self) -> int:
        return self.current.max_response_length

    @property
    def is_last(self) -> bool:
        return self._index == len(self.stages) - 1

    @property
    def steps_in_stage(self) -> int:
        """Steps observed since the current stage began."""
        return self._steps_in_stage

    @property
    def transitions(self) -> list[dict[str, Any]]:
        """One record per stage change: ``{"from", "to", "step", "reason"}``."""
        return [dict(t) for t in self._transitions]

    def observe(self, step: int, metrics: Mapping[str, Any]) -> bool:
        """Record one finished training step; return True when this step ended the stage.

        ``step`` is the run's global step, used only for the transition record.
        """
        self._steps_in_stage += 1
        if self.is_last:
            return False
        stage = self.current
        reason = None
        plateau = stage.plateau
        if plateau is not None and plateau.metric in metrics:
            value = float(metrics[plateau.metric])
            if not math.isfinite(value):
                self._bad += 1
            elif self._best is None or plateau.improves(value, self._best):
                self._best = value
                self._bad = 0
            else:
                self._bad += 1
            if self._bad >= plateau.patience:
                reason = "plateau"
        if stage.steps is not None and self._steps_in_stage >= stage.steps:
            reason = "steps"
        if reason is None:
            return False
        self._transitions.append({"from": stage.name, "to": self.stages[self._index + 1].name,
                                  "step": int(step), "reason": reason})
        self._index += 1
        self._steps_in_stage = 0
        self._best = None
        self._bad = 0
        return True

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state (``json.dumps`` works)."""
        return {"version": _STATE_VERSION, "index": self._index, "stage": self.current.name,
                "steps_in_stage": self._steps_in_stage, "best": self._best,
                "bad_count": self._bad, "transitions": self.transitions}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            ValueError: on a missing key, another version, an index out of range, or a stage
                name that differs from this schedule's stage at that index (the stage list
                changed between save and resume).
        """
        keys = {"version", "index", "stage", "steps_in_stage", "best", "bad_count",
                "transitions"}
        missing = keys - set(state)
        if missing:
            raise ValueError(f"stage schedule state lacks keys {sorted(missing)}")
        if state["version"] != _STATE_VERSION:
            raise ValueError(f"stage schedule state version {state['version']!r} "
                             f"is not {_STATE_VERSION}")
        index = state["index"]
        if not _is_int(index) or not 0 <= index < len(self.stages):
            raise ValueError(f"stage index {index!r} out of range for "
                             f"{len(self.stages)} stages")
        if self.stages[index].name != state["stage"]:
            raise ValueError(f"saved stage {state['stage']!r} at index {index} does not match "
                             f"this schedule's {self.stages[index].name!r}")
        self._index = index
        self._steps_in_stage = int(state["steps_in_stage"])
        self._best = None if state["best"] is None else float(state["best"])
        self._bad = int(state["bad_count"])
        self._transitions = [dict(t) for t in state["transitions"]]


# ---------------------------------------------------------------------------------------------
# Off-policy quadruple
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OffPolicyConfig:
    """The quadruple (N_SGD, D_R, D_T, N_reuse) of the report's off-policy ablation.

    Units: ``rollout_batch_size`` (D_R) and ``mini_batch_size`` (D_T) count PROMPTS (groups),
    as in the report's batch sizes; a mini-batch always holds whole groups, i.e.
    ``D_T * group_size`` responses. ``n_reuse`` is the number of passes (epochs) over one
    rollout batch and ``n_sgd`` the number of optimizer steps per rollout batch, so
    ``N_SGD = (D_R / D_T) * N_reuse``. ``(1, D, D, 1)`` is on-policy (MAGIC; the report's
    (1, 64, 64, 1)): one optimizer step per rollout batch, one epoch.

    Skywork-OR1 §3 "On-Policy Training" and §4 off-policy ablation; docs/magic.md.

    Raises:
        ValueError: unless all four are ints >= 1, D_T divides D_R and
            N_SGD == (D_R / D_T) * N_reuse.
    """

    n_sgd: int = 1
    rollout_batch_size: int = 256
    mini_batch_size: int = 256
    n_reuse: int = 1

    def __post_init__(self) -> None:
        for name in ("n_sgd", "rollout_batch_size", "mini_batch_size", "n_reuse"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        d_r, d_t = self.rollout_batch_size, self.mini_batch_size
        if d_r % d_t != 0:
            raise ValueError(f"mini_batch_size (D_T={d_t}) must divide rollout_batch_size "
                             f"(D_R={d_r})")
        expected = (d_r // d_t) * self.n_reuse
        if self.n_sgd != expected:
            raise ValueError(f"N_SGD must equal (D_R / D_T) * N_reuse = ({d_r} / {d_t}) * "
                             f"{self.n_reuse} = {expected}, got n_sgd={self.n_sgd}")

    @property
    def minibatches_per_epoch(self) -> int:
        """D_R / D_T."""
        return self.rollout_batch_size // self.mini_batch_size

    @property
    def is_on_policy(self) -> bool:
        """True for N_SGD == 1: one optimizer step on data from the current policy."""
        return self.n_sgd == 1

    def minibatches(self, num_prompts: int | None = None,
                    generator: torch.Generator | None = None,
                    keep_empty: bool = False) -> list[torch.Tensor]:
        """Prompt-index mini-batches of one update, in order: N_reuse epochs x D_R/D_T each.

        ``num_prompts`` is how many prompts (groups) the rollout batch holds now, D_R unless
        online filtering dropped some (MAGIC filters without refilling). Each epoch permutes
        ``range(num_prompts)`` with ``generator`` (identity order when it is None) and splits it
        into D_R/D_T nearly equal parts (sizes differ by at most one, larger first), so the
        number of optimizer steps stays N_SGD whatever the filter kept; empty parts (fewer
        prompts than mini-batches) are skipped unless ``keep_empty`` (data-parallel ranks keep
        them, so every rank takes the same N_SGD optimizer steps: each step is a collective).
        Deterministic for a given generator state.

        Returns:
            list of int64 tensors of prompt indices, each ``[n_i]``; see
            :func:`response_indices` for the matching response rows.

        Raises:
            ValueError: if ``num_prompts`` is negative or larger than D_R.
        """
        import torch  # lazy: MagicConfig (the config layer) imports this module without torch

        n = self.rollout_batch_size if num_prompts is None else num_prompts
        if not _is_int(n) or not 0 <= n <= self.rollout_batch_size:
            raise ValueError(f"num_prompts must be an int in [0, D_R={self.rollout_batch_size}]"
                             f", got {num_prompts!r}")
        out: list[torch.Tensor] = []
        for _ in range(self.n_reuse):
            if generator is None:
                order = torch.arange(n, dtype=torch.long)  # [n]
            else:
                order = torch.randperm(n, generator=generator, dtype=torch.long)  # [n]
            out.extend(p for p in torch.tensor_split(order, self.minibatches_per_epoch)
                       if keep_empty or p.numel() > 0)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OffPolicyConfig:
        check_keys("off-policy", data,
                      ("n_sgd", "rollout_batch_size", "mini_batch_size", "n_reuse"))
        return _build(cls, "off-policy config", data)

    def to_dict(self) -> dict[str, int]:
        return {"n_sgd": self.n_sgd, "rollout_batch_size": self.rollout_batch_size,
                "mini_batch_size": self.mini_batch_size, "n_reuse": self.n_reuse}


def response_indices(prompt_indices: torch.Tensor, group_size: int) -> torch.Tensor:
    """Response rows of the given prompts when responses are stored group by group.

    Turns a prompt mini-batch of :meth:`OffPolicyConfig.minibatches` (D_T counts prompts,
    Skywork-OR1 §4 off-policy ablation) into the rows of its responses.

    Prompt ``p`` owns rows ``p * group_size .. p * group_size + group_size - 1``.
    ``[P] -> [P * group_size]``.
    """
    import torch  # lazy: MagicConfig (the config layer) imports this module without torch

    if not _is_int(group_size) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    offsets = torch.arange(group_size, dtype=torch.long, device=prompt_indices.device)  # [g]
    rows = prompt_indices.long()[:, None] * group_size + offsets[None, :]  # [P, g]
    return rows.reshape(-1)  # [P * g]
