"""The measurements a decision rests on: `Evidence` (a file's figures, with its machine), and the committed
results files the reasons quote (`Results`, `load_results`, `quote_results`), from ``results/`` (shipped in the
wheel as ``amp_backends/results``). A reason never types a figure itself.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

@dataclass(frozen=True)
class Evidence:
    """A measurement a decision rests on.

    Attributes:
        file: The results file, as ``results/<name>.json``.
        machine: The machine as the file records it (``"AMD EPYC Zen 4"``).
        figures: ``(configuration, value)`` pairs, in ``unit``.
        unit: The figures' unit (``"img/s"``); empty where they have none.
        run: How they were made, as a reason names it (``"TF 2.21.0, benchmarks/cpu_policy.py, 2026-11-23"``).
    """

    file: str
    machine: str
    figures: tuple[tuple[str, float], ...]
    unit: str = ""
    run: str = ""

    def describe(self) -> str:
        """``"measured on AMD EPYC Zen 4, TF 2.21.0, benchmarks/cpu_policy.py, 2026-11-23, results/x.json:
        mixed_bfloat16 4949 img/s, float32 2296"``."""
        figures = ", ".join(f"{c} {v:.0f}" + (f" {self.unit}" if i == 0 and self.unit else "")
                            for i, (c, v) in enumerate(self.figures))
        where = ", ".join(p for p in (self.machine, self.run, self.file) if p)
        return f"measured on {where}: {figures}"

    def to_dict(self) -> dict[str, Any]:
        """The Evidence as JSON-ready data."""
        return {"file": self.file, "machine": self.machine, "figures": dict(self.figures), "unit": self.unit,
                "run": self.run}


# The committed measurements: the repository's results/ folder, shipped in the wheel as amp_backends/results.
_HERE = Path(__file__).resolve().parent
RESULTS_DIR = next((d for d in (_HERE / "results", _HERE.parent / "results") if d.is_dir()), _HERE / "results")


@dataclass(frozen=True)
class Results:
    """One committed results file as the reasons quote it: the machine, how it was made, each configuration's figure.

    Attributes:
        file: The file's path under ``results/``.
        machine_kind: The machine as the file records it.
        tensorflow: The TensorFlow version it ran.
        command: The command that made it.
        date: When it ran (ISO 8601).
        medians: Each configuration's figure (the median of its repetitions).
    """

    file: str
    machine_kind: str
    tensorflow: str
    command: str
    date: str
    medians: Mapping[str, float]

    def has(self, *configs: str) -> bool:
        """Whether the file has a figure for every one of ``configs``.

        Args:
            *configs: Configuration names, as the file's ``results`` keys them.

        Returns:
            True when each has a median.
        """
        return all(c in self.medians for c in configs)

    def figure(self, config: str) -> str:
        """The figure of ``config`` as the reasons print it (no decimals).

        Args:
            config: A configuration name the file has (`has`).

        Returns:
            Its median, rounded.
        """
        return f"{self.medians[config]:.0f}"

    def run(self) -> str:
        """How the figures were made, as a reason names it: TensorFlow, the script or command, the date."""
        words = self.command.split()
        script = next((w for w in words if w.endswith(".py")), None)
        if script is None and "-m" in words[:-1]:
            script = "python -m " + " ".join(words[words.index("-m") + 1:words.index("-m") + 3])
        return f"TF {self.tensorflow}, {script or self.command}, {self.date[:10]}"

    def evidence(self, *configs: str, unit: str = "img/s") -> Evidence | None:
        """The figures of ``configs`` the file has, as `Evidence`.

        Args:
            *configs: Configuration names, as the file's ``results`` keys them.
            unit: The figures' unit.

        Returns:
            The evidence, or ``None`` if the file has none of them.
        """
        have = tuple((c, float(self.medians[c])) for c in configs if c in self.medians)
        return Evidence(f"results/{self.file}", self.machine_kind, have, unit, self.run()) if have else None

    def quote(self, *configs: str, unit: str = "img/s") -> str:
        """The figures of ``configs`` as a reason quotes them.

        Args:
            *configs: Configuration names, as the file's ``results`` keys them.
            unit: The figures' unit.

        Returns:
            ``"measured on <machine, run>: float32 2045 img/s, mixed_bfloat16 3537"``; configurations the file lacks
            are left out, and a file with none of them says so.
        """
        found = self.evidence(*configs, unit=unit)
        return found.describe() if found else f"not measured: results/{self.file} has no {', '.join(configs)}"

    def ratio(self, faster: str, slower: str) -> float | None:
        """How many times ``faster``'s figure is ``slower``'s.

        Args:
            faster: A configuration name.
            slower: Another.

        Returns:
            The ratio, or ``None`` where either is missing.
        """
        if not self.has(faster, slower) or not self.medians[slower]:
            return None
        return float(self.medians[faster]) / float(self.medians[slower])

    def times(self, faster: str, slower: str) -> str:
        """`ratio` as a reason says it.

        Args:
            faster: A configuration name.
            slower: Another.

        Returns:
            ``"~1.8x"`` (``"much"`` where it is not measured).
        """
        r = self.ratio(faster, slower)
        return "much" if r is None else f"~{r:.1f}x" if r < 3 else f"~{r:.0f}x"


@functools.cache
def load_results(file: str, parse: Callable[[str, Mapping[str, Any]], Results]) -> Results | None:
    """Read the committed results file ``file`` (a path under ``results/``) with a backend's parser.

    Args:
        file: The path under ``results/``.
        parse: Turns the file's name and JSON document into `Results`.

    Returns:
        The results, or ``None`` where the file is missing or unreadable (the reason then says so).
    """
    try:
        with open(RESULTS_DIR / file, encoding="utf-8") as fh:
            return parse(file, json.load(fh))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # missing, unreadable, or not the format
        return None


def quote_results(results: Results | None, file: str, *configs: str, unit: str = "img/s") -> str:
    """What a committed results file measured for ``configs``, as a reason quotes it.

    Args:
        results: The file as `load_results` read it, or ``None`` where it is missing.
        file: Its path under ``results/``, named where it is missing.
        *configs: The configurations to quote.
        unit: The unit of the first figure.

    Returns:
        `Results.quote`'s sentence, or that the file is missing.
    """
    if results is None:
        return f"the measurement results/{file} is missing from this installation"
    return results.quote(*configs, unit=unit)


def results_evidence(results: Results | None, *configs: str, unit: str = "img/s") -> tuple[Evidence, ...]:
    """The figures `quote_results` quotes, as data.

    Args:
        results: The file as `load_results` read it, or ``None`` where it is missing.
        *configs: The configurations quoted.
        unit: The unit of the figures.

    Returns:
        One `Evidence`, or none where the file or the figures are missing.
    """
    found = results.evidence(*configs, unit=unit) if results else None
    return (found,) if found else ()
