"""The CPU measurements the plan's reasons quote, read from the committed results files.

``results/cpu-policy-<kind>.json`` (written by ``benchmarks/cpu_policy.py``, or transcribed from an earlier
run with its command) and ``results/cpu-fit-steps-zen4.json`` ship in the wheel as ``amp_backends/results``;
in a source checkout they are the repository's ``results/`` folder. A reason never types a figure itself:
it quotes one of these files, names the machine and the file, and derives ratios from the same figures.
A missing file (a broken install) makes the reason say so instead of failing the plan.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amp_backends.assessment import Evidence
from amp_backends.hardware import CpuInfo

# amp_backends/backends/cpu/measured.py (installed) or <checkout>/backends/cpu/measured.py: both two folders
# below the folder that holds results/.
RESULTS_DIR = Path(__file__).resolve().parents[2] / "results"

# Which file speaks for which kind of CPU. The "zen4" files were measured on an AMD EPYC with avx512_bf16 and no
# AMX whose CPUID says family 26, model 2 (a Zen 5); they record no family or model, so the machine they name
# ("AMD EPYC Zen 4", typed by hand) is quoted as recorded. Files written since record the probe's name.
WITH_BF16 = "cpu-policy-zen4.json"  # avx512_bf16, oneDNN on by TensorFlow's default
WITHOUT_BF16 = "cpu-policy-zen1.json"  # AMD EPYC Zen 1: AVX2 only, oneDNN off by TensorFlow's default
# An Intel Xeon with AMX and AVX512-FP16, where TensorFlow's oneDNN takes float16 (and trains it in reference kernels)
WITH_FP16 = "cpu-policy-xeon-amx.json"
FIT_STEPS = "cpu-fit-steps-zen4.json"
LAYERS = "cpu-layers-zen4.json"  # which layers train slower in bfloat16 (benchmarks/cpu_layers.py)


@dataclass(frozen=True)
class Results:
    """One committed results file: the machine, versions, command and date, and each configuration's median."""

    file: str
    machine_kind: str
    tensorflow: str
    command: str
    date: str
    medians: Mapping[str, float]

    def has(self, *configs: str) -> bool:
        return all(c in self.medians for c in configs)

    def figure(self, config: str) -> str:
        return f"{self.medians[config]:.0f}"

    def run(self) -> str:
        """How the figures were made, as a reason names it: TensorFlow, the script (the file holds the full
        command), the date."""
        script = next((w for w in self.command.split() if w.endswith(".py")), self.command)
        return f"TF {self.tensorflow}, {script}, {self.date[:10]}"

    def evidence(self, *configs: str, unit: str = "img/s") -> Evidence | None:
        """The figures of ``configs`` the file has, as :class:`Evidence` (``None`` if it has none of them)."""
        have = tuple((c, float(self.medians[c])) for c in configs if c in self.medians)
        if not have:
            return None
        return Evidence(f"results/{self.file}", self.machine_kind, have, unit, self.run())

    def quote(self, *configs: str, unit: str = "img/s") -> str:
        """``"measured on <machine, run>: float32 2045 img/s, mixed_bfloat16 3537"``; configurations the file
        lacks are left out, and a file with none of them says so."""
        found = self.evidence(*configs, unit=unit)
        return found.describe() if found else f"not measured: results/{self.file} has no {', '.join(configs)}"

    def ratio(self, faster: str, slower: str) -> float | None:
        if not self.has(faster, slower) or not self.medians[slower]:
            return None
        return float(self.medians[faster]) / float(self.medians[slower])


def recorded_machine(doc: Mapping[str, Any]) -> str:
    """The machine as a results file records it: its ``machine_kind`` (written from the probe's name, see
    :func:`~amp_backends.backends.cpu.backend.machine_record`), else the CPU its ``machine`` describes, named
    from the vendor, family and model it holds."""
    if doc.get("machine_kind"):
        return str(doc["machine_kind"])
    machine = doc.get("machine") or {}
    if not isinstance(machine, Mapping) or not machine.get("cpu"):
        return "unknown CPU"
    family, model, stepping = (n if isinstance(n, int) else None for n in
                               (machine.get("family"), machine.get("model"), machine.get("stepping")))
    return CpuInfo(str(machine.get("vendor") or machine["cpu"].split()[0]), str(machine["cpu"]), "", 0,
                   family=family, model_number=model, stepping=stepping).name


def _parse(file: str, doc: Mapping[str, Any]) -> Results:
    versions = doc.get("versions") or {}
    medians = {name: float(entry["median"]) for name, entry in (doc.get("results") or {}).items()
               if isinstance(entry, Mapping) and isinstance(entry.get("median"), (int, float))}
    return Results(file, recorded_machine(doc), str(versions.get("tensorflow") or "?"), str(doc.get("command") or "?"),
                   str(doc.get("date") or "?"), medians)


@functools.cache
def load(file: str) -> Results | None:
    """The results file ``file`` (a name in ``results/``), or ``None`` if it is missing or unreadable."""
    try:
        with open(RESULTS_DIR / file, encoding="utf-8") as fh:
            return _parse(file, json.load(fh))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def quote(file: str, *configs: str, unit: str = "img/s") -> str:
    results = load(file)
    if results is None:
        return f"the measurement results/{file} is missing from this installation"
    return results.quote(*configs, unit=unit)


def evidence(file: str, *configs: str, unit: str = "img/s") -> tuple[Evidence, ...]:
    """The figures :func:`quote` quotes, as data: one :class:`Evidence`, or none if the file or figures are missing."""
    results = load(file)
    found = results.evidence(*configs, unit=unit) if results else None
    return (found,) if found else ()


def times(file: str, faster: str, slower: str) -> str:
    """``"~8x"``: how many times ``faster`` beat ``slower`` in the file (``"much"`` if not measured)."""
    results = load(file)
    r = results.ratio(faster, slower) if results else None
    if r is None:
        return "much"
    return f"~{r:.1f}x" if r < 3 else f"~{r:.0f}x"
