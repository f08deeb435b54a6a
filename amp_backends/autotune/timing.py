"""One interleaved timing harness: every comparison of configurations in the package runs through it.

Speeds vary between machines and over minutes, so configurations are only compared inside one run, interleaved: each
round times every variant once, in a rotating order, and a variant *wins* only when it beats every other in every
round by the margin (`Timings.winner`, `MARGIN`); anything less is within noise. No framework here: a variant is a
callable, ``sync(result)`` waits for its work, and ``clock`` is injectable for tests.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from ..errors import AmpConfigError

__all__ = ["MARGIN", "ROUNDS", "Sample", "Timings", "interleaved"]

MARGIN = 1.05  # a winner is this much faster in every round: closer than that is noise on these machines
ROUNDS = 5  # rounds of a timing, unless asked otherwise


@dataclass(frozen=True)
class Timings:
    """Rates (``units`` per second) of each variant, one per round, in the rounds' order.

    Attributes:
        rates: By variant name, its rates, one per round it ran (fewer where it failed: `interleaved`'s
            ``on_error``).
        steps: Calls of a variant timed together per round.
        units: What one call processes (samples, images): the rates count these.
    """

    rates: Mapping[str, tuple[float, ...]]
    steps: int = 1
    units: float = 1.0

    @property
    def rounds(self) -> int:
        """The rounds every variant ran (a variant that failed ran fewer than the others)."""
        return min((len(r) for r in self.rates.values()), default=0)

    def median(self, name: str) -> float:
        """A variant's median rate.

        Args:
            name: The variant.

        Returns:
            The median of its rates, 0.0 where it has none.
        """
        return statistics.median(self.rates[name]) if self.rates[name] else 0.0

    def spread(self, name: str) -> tuple[float, float]:
        """A variant's slowest and fastest rates.

        Args:
            name: The variant.

        Returns:
            ``(min, max)`` of its rates, ``(0.0, 0.0)`` where it has none.
        """
        values = self.rates[name]
        return (min(values), max(values)) if values else (0.0, 0.0)

    def ratio(self, name: str, over: str) -> float:
        """The median of ``name`` over the median of ``over`` (0 when ``over`` has none).

        Args:
            name: The variant whose median is divided.
            over: The variant whose median divides it.

        Returns:
            The ratio of their median rates (above 1: ``name`` was faster), 0.0 where ``over`` has no rate.
        """
        base = self.median(over)
        return self.median(name) / base if base else 0.0

    def wins(self, name: str, over: str, margin: float) -> bool:
        """Whether ``name`` was faster than ``over`` by more than ``margin`` (1.05: 5%) in every round.

        Args:
            name: The variant that must be faster.
            over: The variant it is compared with.
            margin: The factor its rate must exceed the other's by in each round (1.05: 5%; the package uses
                `MARGIN`).

        Returns:
            True where ``name``'s rate exceeded ``over``'s times ``margin`` in every round both ran (the rounds
            compared in order, as many as the shorter of the two has); False where they share no round.
        """
        pairs = list(zip(self.rates[name], self.rates[over], strict=False))
        return bool(pairs) and all(a > b * margin for a, b in pairs)

    def winner(self, margin: float) -> str | None:
        """The variant that beat every other one in every round by ``margin``, or ``None`` (within noise).

        Args:
            margin: The factor the winner's rate must exceed each other's by in every round (the package uses
                `MARGIN`).

        Returns:
            The winner's name (`wins` over every other variant), or ``None`` where no variant won them all.
        """
        return next((name for name in self.rates
                     if all(self.wins(name, other, margin) for other in self.rates if other != name)), None)

    def to_dict(self) -> dict[str, Any]:
        """The timings as JSON data, rounded to 3 decimals.

        Returns:
            By variant: its ``median``, ``min``, ``max`` and ``rates`` (one per round).
        """
        return {name: {"median": round(self.median(name), 3), "min": round(self.spread(name)[0], 3),
                       "max": round(self.spread(name)[1], 3), "rates": [round(r, 3) for r in values]}
                for name, values in self.rates.items()}


@dataclass(frozen=True)
class Sample:
    """What a variant that times itself returns (``units`` processed in ``seconds``), taken instead of the clock.

    Attributes:
        units: What the variant processed (samples, images): its rate for the round is ``units / seconds``.
        seconds: The time that took, as the variant measured it (used instead of the time `interleaved`'s ``clock``
            gives).
    """

    units: float
    seconds: float


def interleaved(variants: Mapping[str, Callable[[], Any]], *, rounds: int = ROUNDS, steps: int = 1,
                units: float = 1.0, sync: Callable[[Any], Any] | None = None,
                clock: Callable[[], float] = time.perf_counter, between: Callable[[str], Any] | None = None,
                on_error: Callable[[str, Exception], Any] | None = None,
                after_round: Callable[[int, Timings], Any] | None = None) -> Timings:
    """Time each variant ``steps`` times per round for ``rounds`` rounds, interleaved, round ``r`` starting at variant
    ``r mod n``. A variant that returns a `Sample` times itself.

    Args:
        variants: Each variant's name and the call to time.
        rounds: How many rounds.
        steps: Calls of a variant per round, timed together.
        units: What one call processes (samples, images): the rates are units per second.
        sync: Applied to the last call's result before the clock stops (``float`` for a TensorFlow step).
        clock: The clock, in seconds.
        between: Run untimed before each variant's turn, with its name (switching a model's layer policies, say).
        on_error: Told ``(name, exception)`` when a variant raises; the variant then sits out the remaining
            rounds, its rates so far kept. ``None``: the exception ends the timing.
        after_round: Run after each round with its index and the timings so far.

    Returns:
        The `Timings`: each variant's rates, one per round it ran.

    Raises:
        AmpConfigError: ``rounds`` or ``steps`` is below 1.
    """
    if rounds < 1 or steps < 1:
        raise AmpConfigError(
            f"interleaved() needs rounds >= 1 and steps >= 1. Received: rounds={rounds}, steps={steps}.")
    names, live = list(variants), list(variants)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name not in live:
                continue
            if between is not None:
                between(name)
            start, result = clock(), None
            try:
                for _ in range(steps):
                    result = variants[name]()
                if sync is not None:
                    sync(result)
            except Exception as exc:
                if on_error is None:
                    raise
                on_error(name, exc)
                live.remove(name)
                continue
            sample = result if isinstance(result, Sample) else Sample(units * steps, clock() - start)
            rates[name].append(sample.units / max(sample.seconds, 1e-12))
        if after_round is not None:
            after_round(r, Timings({n: tuple(v) for n, v in rates.items()}, steps, units))
    return Timings({name: tuple(values) for name, values in rates.items()}, steps, units)
