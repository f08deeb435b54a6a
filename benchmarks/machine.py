"""How the benchmark scripts of this folder name the machine in their results files."""

from __future__ import annotations

import platform
from typing import Any

from amp_backends.backends.cpu.backend import FLAGS_THAT_MATTER, CpuInfo, probe_cpu


def machine_record(cpu: CpuInfo | None = None) -> dict[str, Any]:
    """The machine as a results file records it: ``machine_kind`` (named by the probe, never by hand) and
    ``machine`` (the CPU's identity, cores and the flags that matter). ``cpu`` defaults to this machine's."""
    cpu = cpu or probe_cpu()
    return {"machine_kind": cpu.name,
            "machine": {"cpu": cpu.model, "vendor": cpu.vendor, "family": cpu.family, "model": cpu.model_number,
                        "stepping": cpu.stepping, "microarchitecture": cpu.microarchitecture, "arch": cpu.arch,
                        "logical_cores": cpu.logical_cores, "flags": sorted(cpu.flags & (FLAGS_THAT_MATTER | {"fma"})),
                        "os": platform.platform()}}
