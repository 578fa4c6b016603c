"""MAGIC's multi-stage schedule of context lengths: Skywork-OR1 (arXiv 2505.22312) §3,
"Multi-Stage Training"; docs/magic.md, rule "Multi-stage". (The off-policy quadruple is
trainer/magic/off_policy.py.) No torch. Re-exported by :mod:`trainer.magic.rules`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from trainer.config_schema import build, is_int

PlateauMode = Literal["max", "min"]

_STATE_VERSION = 1


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
        if not is_int(self.patience) or self.patience < 1:
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
        return build(cls, data, "plateau")

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "patience": self.patience,
                "min_delta": self.min_delta, "mode": self.mode}


@dataclass(frozen=True)
class Stage:
    """One training stage (Skywork-OR1 §3 "Multi-Stage Training").

    Args:
        name: unique label, logged as the ``stage`` metric.
        max_response_length: rollout length limit in tokens during this stage; a response that
            hits it is "truncated" (see :func:`trainer.magic.rules.group_advantages`).
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
        if not is_int(self.max_response_length) or self.max_response_length < 1:
            raise ValueError(f"stage {self.name!r}: max_response_length must be an int >= 1 "
                             f"(tokens), got {self.max_response_length!r}")
        if self.steps is not None and (not is_int(self.steps) or self.steps < 1):
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
        return build(cls, data, "stage")

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
        if not is_int(index) or not 0 <= index < len(self.stages):
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
