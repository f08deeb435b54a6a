"""The CPU measurements the plan's reasons quote, read from the committed results files.

``results/cpu-policy-<kind>.json`` (``benchmarks/cpu_policy.py``) and ``results/cpu-fit-steps-zen4.json``. A reason
quotes a file with its machine, never a typed figure; a missing file makes it say so instead of failing the plan.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from amp_backends.backend_api import (RESULTS_DIR, Evidence, Results, load_results, quote_results,
                                      results_evidence)
from amp_backends.hardware import CpuInfo

__all__ = ["RESULTS_DIR", "Results", "ZooModel", "recorded_machine", "load", "quote", "evidence", "times",
           "policy_file", "zoo_results"]

# Which file speaks for which kind of CPU. The "zen4" files were measured on an AMD EPYC with avx512_bf16 and no
# AMX whose CPUID says family 26, model 2 (a Zen 5); they record no family or model, so the machine they name
# ("AMD EPYC Zen 4", typed by hand) is quoted as recorded. Files written since record the probe's name.
WITH_BF16 = "cpu-policy-zen4.json"  # avx512_bf16, oneDNN on by TensorFlow's default
WITHOUT_BF16 = "cpu-policy-zen1.json"  # AMD EPYC Zen 1: AVX2 only, oneDNN off by TensorFlow's default
# An Intel Xeon with AMX and AVX512-FP16, where TensorFlow's oneDNN takes float16 (and trains it in reference kernels)
WITH_FP16 = "cpu-policy-xeon-amx.json"
FIT_STEPS = "cpu-fit-steps-zen4.json"
LAYERS = "cpu-layers-zen4.json"  # which layers train slower in bfloat16 (benchmarks/cpu_layers.py)


def recorded_machine(doc: Mapping[str, Any]) -> str:
    """The machine as a results file records it: its ``machine_kind`` (the probe's name, written by the benchmark
    scripts' ``machine_record``), else the CPU its ``machine`` describes."""
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


def load(file: str) -> Results | None:
    """The CPU results file ``file`` (a name in ``results/``), or ``None`` if it is missing or unreadable."""
    return load_results(file, _parse)


def quote(file: str, *configs: str, unit: str = "img/s") -> str:
    """What the CPU results file ``file`` measured for ``configs``, as a reason quotes it (`quote_results`)."""
    return quote_results(load(file), file, *configs, unit=unit)


def evidence(file: str, *configs: str, unit: str = "img/s") -> tuple[Evidence, ...]:
    """The figures `quote` quotes, as data: one `Evidence`, or none if the file or figures are missing."""
    return results_evidence(load(file), *configs, unit=unit)


def times(file: str, faster: str, slower: str) -> str:
    """``"~8x"``: how many times ``faster`` beat ``slower`` in the file (``"much"`` if not measured)."""
    results = load(file)
    return results.times(faster, slower) if results else "much"


@functools.cache
def _policy_files() -> tuple[str, ...]:
    return tuple(sorted(p.name for p in RESULTS_DIR.glob("cpu-policy-*.json")))


def policy_file(cpu_name: str, default: str, *configs: str) -> str:
    """The policy results file to quote for a CPU the probe names ``cpu_name``.

    Args:
        cpu_name: The probe's name for the CPU (`CpuInfo.name`): a file measured on a CPU so named, holding every
            one of ``configs``, speaks for it.
        default: The file that speaks for this kind of CPU where none of its name was measured.
        *configs: The configurations the reason quotes.

    Returns:
        A file name under ``results/``.
    """
    for file in _policy_files():
        results = load(file)
        if results is not None and results.machine_kind == cpu_name and results.has(*configs):
            return file
    return default


def _cpu_name(recorded: str) -> str:
    """A zoo report's ``environment.cpu`` (``"Intel(R) Xeon(R) ..., 2 logical cores"``) as the probe names it."""
    name = re.sub(r",\s*\d+ logical cores?$", "", recorded)
    return " ".join(re.sub(r"\((R|TM)\)", "", name, flags=re.I).split())


@dataclass(frozen=True)
class ZooModel:
    """One model of a committed zoo run: each configuration's samples/s per repetition, and how it was made.

    Attributes:
        model: The zoo model's name.
        reps: Each configuration's samples/s, one per interleaved repetition.
        loss_ok: Each configuration's loss parity with float32 (within the float32 seed spread).
        source: The results file and the run (`Results`), for the reason to quote.
    """

    model: str
    reps: Mapping[str, tuple[float, ...]]
    loss_ok: Mapping[str, bool]
    source: Results


@functools.cache
def zoo_results(cpu_name: str) -> tuple[ZooModel, ...]:
    """The models of every committed zoo run planned for a CPU the probe names ``cpu_name`` (not a GPU plan of the
    same host).

    Args:
        cpu_name: The probe's name for the CPU.

    Returns:
        The measured models, none where no such run is committed.
    """
    found: list[ZooModel] = []
    for path in sorted(RESULTS_DIR.glob("zoo-*/**/zoo.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            env = doc["environment"]
            if env.get("backend") != "cpu" or _cpu_name(str(env.get("cpu") or "")) != cpu_name:
                continue  # a run on an accelerator of this host, or another kind of CPU
            file = path.relative_to(RESULTS_DIR).as_posix()
            for m in doc["models"]:
                configs = m["configs"]
                medians = {n: float(c["samples_per_s"]["median"]) for n, c in configs.items()}
                source = Results(file, cpu_name, str(env.get("tensorflow") or "?"), str(doc.get("command") or "?"),
                                 str(doc.get("date") or "?"), medians)
                found.append(ZooModel(str(m["model"]), {n: tuple(float(r) for r in c["samples_per_s"]["reps"])
                                                        for n, c in configs.items()},
                                      {n: bool(c.get("loss_within_spread")) for n, c in configs.items()}, source))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):  # unreadable: not evidence
            continue
    return tuple(found)
