"""How a plan scales losses: `LossScale` (none, fixed or dynamic), plain frozen data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import AmpConfigError

DEFAULT_INITIAL_SCALE = 2.0**15
DEFAULT_GROWTH_INTERVAL = 2000
FLOAT32_MAX = 3.4028234663852886e38  # the largest float32: a scale beyond it is inf in the scaler's variable


@dataclass(frozen=True)
class LossScale:
    """How the loss is scaled before differentiation.

    The loss times the scale keeps small float16 gradients from flushing to zero; the gradients are divided back.
    ``dynamic`` halves the scale when gradients overflow (skipping that step) and doubles it after
    ``growth_interval`` finite steps; ``fixed`` keeps one scale; ``none`` does not scale (float32, bfloat16).

    Attributes:
        mode: ``"dynamic"``, ``"fixed"`` or ``"none"``.
        initial: The scale to start from (``fixed``: the scale).
        growth_interval: Finite steps in a row after which ``dynamic`` doubles the scale.

    Raises:
        AmpConfigError: A mode, scale or interval out of range.
    """

    mode: str = "none"
    initial: float = DEFAULT_INITIAL_SCALE
    growth_interval: int = DEFAULT_GROWTH_INTERVAL

    def __post_init__(self) -> None:
        if self.mode not in ("dynamic", "fixed", "none"):
            raise AmpConfigError(f"LossScale mode must be 'dynamic', 'fixed' or 'none'. Received: mode={self.mode!r}.")
        if not (self.initial > 0 and self.initial <= FLOAT32_MAX):  # (a float32 variable holds it: 1e40 is inf)
            raise AmpConfigError(
                f"A loss scale must be a positive finite number a float32 holds (up to {FLOAT32_MAX:.4g}), such as "
                f"1024. Received: {self.initial!r}. Fix: pass a power of two such as 1024 or 32768, or 'dynamic'.")
        if self.growth_interval < 1:
            raise AmpConfigError(f"growth_interval must be >= 1. Received: growth_interval={self.growth_interval!r}. "
                                 "Fix: pass the steps between growths of the scale, such as 2000.")

    def __str__(self) -> str:
        if self.mode == "fixed":
            return f"fixed:{self.initial:g}"
        if self.mode == "dynamic":
            return f"dynamic (initial {self.initial:g}, growth every {self.growth_interval} steps)"
        return "none"

    def to_dict(self) -> dict[str, Any]:
        """The loss scale as JSON-ready data.

        Returns:
            ``{"mode": "none"}``, ``{"mode": "fixed", "scale": 1024.0}`` or the dynamic mode's parameters.
        """
        if self.mode == "none":
            return {"mode": "none"}
        if self.mode == "fixed":
            return {"mode": "fixed", "scale": self.initial}
        return {"mode": "dynamic", "initial": self.initial, "growth_interval": self.growth_interval}

    @classmethod
    def dynamic(cls, initial: float = DEFAULT_INITIAL_SCALE,
                growth_interval: int = DEFAULT_GROWTH_INTERVAL) -> LossScale:
        """Dynamic loss scaling: the largest safe scale, found as training goes.

        Args:
            initial: The first scale (2**15 = 32768 by default, as Keras's).
            growth_interval: Finite steps before the scale doubles (2000 by default, as Keras's).

        Returns:
            The loss scaling.
        """
        return cls("dynamic", float(initial), int(growth_interval))

    @classmethod
    def fixed(cls, scale: float) -> LossScale:
        """A fixed loss scale.

        Args:
            scale: The scale, a positive number.

        Returns:
            The loss scaling.
        """
        return cls("fixed", float(scale))

    @classmethod
    def none(cls) -> LossScale:
        """No loss scaling.

        Returns:
            The loss scaling.
        """
        return cls("none", 1.0)
