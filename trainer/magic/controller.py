"""Adaptive entropy control: the entropy-bonus coefficient of MAGIC (pure Python, no torch).

Skywork-OR1 (arXiv 2505.22312) §3, "Adaptive Entropy Control"; docs/magic.md, rule "Entropy".
Re-exported by :mod:`trainer.magic.rules`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trainer.magic.config import ENTROPY_MODES, EntropyMode, MagicConfig, check_entropy_settings

__all__ = ["ENTROPY_MODES", "AdaptiveEntropyController", "EntropyMode"]

_STATE_VERSION = 1


class AdaptiveEntropyController:
    """Adaptive entropy coefficient (Skywork-OR1 §3 "Adaptive Entropy Control"; docs/magic.md).

    The controller keeps an internal coefficient ``c`` (starts at ``coef_init``). After each
    training step it is shown that step's measured entropy ``e`` and does, exactly::

        if e < target: c += delta   else: c -= delta
        c = clamp(c, coef_min, coef_max)
        coefficient for the next step = c if e < target else 0

    so the entropy bonus ``-coef * H`` is switched on only while entropy is below the target
    (``e == target`` counts as "not below": c decreases and the bonus is off).
    Before the first :meth:`update` the coefficient is ``coef_init`` (0 in MAGIC, like the
    released code, whose ``entropy_loss_enabled`` starts at 1 with value ``init_ent_coef``).

    Which entropy to feed is the caller's choice: MAGIC's loss uses the token-mean entropy of the
    full next-token distribution (:func:`trainer.magic.rules.token_entropy`); the released scripts feed
    the controller ``-mean(old_logprobs)`` over response tokens
    (:func:`trainer.magic.rules.sampled_entropy`). Both measure nats per token.

    Modes, for ablations: ``"adaptive"`` (the rule above), ``"fixed"`` (always ``coef_init``,
    whatever the entropy), ``"off"`` (always 0). In every mode ``update`` validates and records
    the entropy, so state and logs look the same.

    Args (each defaults to MagicConfig's field of that name, the released value; see
    trainer/magic/config.py):
        target: target entropy in nats per token (``entropy_target``).
        delta: step added to / subtracted from ``c`` per training step (``entropy_delta``).
        coef_min, coef_max: clamp bounds of ``c`` (``entropy_coef_min``, ``entropy_coef_max``).
        coef_init: starting ``c``; the fixed coefficient in ``"fixed"`` mode
            (``entropy_coef_init``).
        mode: ``"adaptive"`` | ``"fixed"`` | ``"off"`` (``entropy_mode``).

    Raises:
        ValueError: unless ``target >= 0``, ``delta >= 0`` and
            ``0 <= coef_min <= coef_init <= coef_max``, all finite, and mode is known
            (:func:`trainer.magic.config.check_entropy_settings`, MagicConfig's own check).
    """

    def __init__(
        self,
        target: float = MagicConfig.entropy_target,
        delta: float = MagicConfig.entropy_delta,
        coef_min: float = MagicConfig.entropy_coef_min,
        coef_max: float = MagicConfig.entropy_coef_max,
        coef_init: float = MagicConfig.entropy_coef_init,
        *,
        mode: EntropyMode = MagicConfig.entropy_mode,
    ) -> None:
        check_entropy_settings(target, delta, coef_min, coef_init, coef_max, mode)
        self.target = float(target)
        self.delta = float(delta)
        self.coef_min = float(coef_min)
        self.coef_max = float(coef_max)
        self.coef_init = float(coef_init)
        self.mode: EntropyMode = mode
        self._c = self.coef_init
        self._coef = 0.0 if mode == "off" else self.coef_init
        self._last_entropy: float | None = None
        self._num_updates = 0

    @classmethod
    def from_config(cls, magic: MagicConfig) -> AdaptiveEntropyController:
        """A fresh controller with ``magic``'s entropy settings and mode."""
        return cls(target=magic.entropy_target, delta=magic.entropy_delta,
                   coef_min=magic.entropy_coef_min, coef_max=magic.entropy_coef_max,
                   coef_init=magic.entropy_coef_init, mode=magic.entropy_mode)

    @classmethod
    def fixed(cls, coef: float) -> AdaptiveEntropyController:
        """A controller that always returns ``coef`` (ablation: constant entropy bonus)."""
        return cls(coef_min=coef, coef_max=coef, coef_init=coef, mode="fixed")

    @classmethod
    def off(cls) -> AdaptiveEntropyController:
        """A controller that always returns 0 (ablation: no entropy bonus)."""
        return cls(mode="off")

    @property
    def coef(self) -> float:
        """The coefficient to use in the next step's loss ``-coef * H``."""
        return self._coef

    @property
    def c(self) -> float:
        """The internal, clamped coefficient ``c`` (kept even while the bonus is off)."""
        return self._c

    @property
    def last_entropy(self) -> float | None:
        """The entropy seen by the last :meth:`update`, or None before the first."""
        return self._last_entropy

    @property
    def num_updates(self) -> int:
        """How many times :meth:`update` has been called."""
        return self._num_updates

    def update(self, entropy: float) -> float:
        """Feed the step's measured entropy (nats/token); return the next step's coefficient.

        Accepts a Python number or anything ``float()`` takes (a 0-dim tensor).

        Raises:
            ValueError: if the entropy is NaN or infinite (a broken step must not silently
                move the coefficient).
        """
        e = float(entropy)
        if not math.isfinite(e):
            raise ValueError(f"measured entropy must be finite, got {e}")
        self._last_entropy = e
        self._num_updates += 1
        if self.mode == "off":
            self._coef = 0.0
        elif self.mode == "fixed":
            self._coef = self.coef_init
        else:
            below = e < self.target
            c = self._c + self.delta if below else self._c - self.delta
            self._c = min(max(c, self.coef_min), self.coef_max)
            self._coef = self._c if below else 0.0
        return self._coef

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state (``json.dumps`` works): the dynamic state and the mode.

        Hyperparameters (target, delta, bounds) are not stored: on resume they come from the
        config, so a run can be resumed with, say, a new target.
        """
        return {"version": _STATE_VERSION, "mode": self.mode, "c": self._c,
                "coef": self._coef, "last_entropy": self._last_entropy,
                "num_updates": self._num_updates}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            ValueError: on a missing key, another version, or a state saved in another mode.
        """
        missing = {"version", "mode", "c", "coef", "last_entropy", "num_updates"} - set(state)
        if missing:
            raise ValueError(f"entropy controller state lacks keys {sorted(missing)}")
        if state["version"] != _STATE_VERSION:
            raise ValueError(f"entropy controller state version {state['version']!r} "
                             f"is not {_STATE_VERSION}")
        if state["mode"] != self.mode:
            raise ValueError(f"entropy controller state was saved in mode {state['mode']!r}, "
                             f"this controller is in mode {self.mode!r}")
        self._c = float(state["c"])
        self._coef = float(state["coef"])
        last = state["last_entropy"]
        self._last_entropy = None if last is None else float(last)
        self._num_updates = int(state["num_updates"])

    def __repr__(self) -> str:
        return (f"AdaptiveEntropyController(target={self.target}, delta={self.delta}, "
                f"coef_min={self.coef_min}, coef_max={self.coef_max}, "
                f"coef_init={self.coef_init}, mode={self.mode!r}, c={self._c}, "
                f"coef={self._coef})")
