"""Whether TensorFlow will run its oneDNN CPU kernels, read without importing TensorFlow.

TensorFlow decides once, at import (``IsMklEnabled``, ``tensorflow/core/util/port.cc``): ``TF_ENABLE_ONEDNN_OPTS``
wins when it reads ``0``/``false`` or ``1``/``true`` (any case); otherwise ``DefaultOneDnnPolicy`` (since 2.9):
on for Linux x86 CPUs with AVX512-VNNI, AVX512-BF16, AVX-VNNI or AMX, for Arm Neoverse V1 and for Windows x86;
off elsewhere (AMD Zen 1-3, older Intel, other Arm cores, macOS). Under TensorFlow 2.15 a loaded ITEX runs its
own oneDNN kernels whatever TensorFlow decides (``CpuFacts.itex``; the plan assumes ``TF_ENABLE_ONEDNN_OPTS=0``
does not turn them off). Once TensorFlow is imported its own answer is read instead.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

from amp_backends.hardware import CpuInfo
from amp_backends.software import minor_version

VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
# The x86 flags (Linux /proc/cpuinfo names) that make TensorFlow turn oneDNN on by default.
DEFAULT_ON_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
NEOVERSE_V1 = "Neoverse-V1"
# The x86 flags with which TensorFlow sends float16 ops to oneDNN (seen with ONEDNN_VERBOSE under TF 2.21: f16
# convolutions and matmuls on an AVX512-FP16 Xeon; on CPUs without these flags float16 stays in Eigen).
FLOAT16_FLAGS = ("avx512_fp16", "amx_fp16")
X86 = ("x86_64", "amd64")
# The architectures TensorFlow's packages are built with oneDNN for, by platform (``sys.platform``'s names).
ONEDNN_BUILDS = {"linux": (*X86, "aarch64", "arm64"), "win32": X86, "windows": X86, "darwin": X86}


@dataclass(frozen=True)
class OneDnnState:
    """Whether TensorFlow runs (or will, once imported) its oneDNN CPU kernels, and why: the outcome, TensorFlow's
    ``default`` here, ``TF_ENABLE_ONEDNN_OPTS`` (``None``: unset), and whether TensorFlow itself answered."""

    enabled: bool
    default: bool
    why: str
    variable: str | None = None
    tensorflow_imported: bool = False

    @property
    def set_by_user(self) -> bool:
        """The variable holds a value TensorFlow obeys (0/1/true/false)."""
        return parse_variable(self.variable) is not None

    @property
    def switched_off(self) -> bool:
        """Off because the user said so (``TF_ENABLE_ONEDNN_OPTS=0``), not by TensorFlow's default."""
        return not self.enabled and parse_variable(self.variable) is False


def parse_variable(value: str | None) -> bool | None:
    """``TF_ENABLE_ONEDNN_OPTS`` as TensorFlow reads it: True, False, or None (unset or not a boolean)."""
    if value is None:
        return None
    v = value.strip().lower()
    return True if v in ("1", "true") else False if v in ("0", "false") else None


def has_onednn_build(system: str, arch: str) -> bool:
    """Whether TensorFlow's packages for this platform are built with oneDNN at all."""
    return arch.lower() in ONEDNN_BUILDS.get("linux" if system.startswith("linux") else system, ())


def tensorflow_default(cpu: CpuInfo, system: str = sys.platform, tf_version: str | None = None) -> tuple[bool, str]:
    """TensorFlow's default for this CPU and platform, and why (``DefaultOneDnnPolicy``)."""
    if tf_version is not None and (2, 0) <= minor_version(tf_version) < (2, 9):
        return False, f"TensorFlow {tf_version} (before 2.9) runs oneDNN only when {VARIABLE}=1"
    if not has_onednn_build(system, cpu.arch):
        return False, f"TensorFlow's builds for {system} {cpu.arch} have no oneDNN"
    if system.startswith("linux"):
        if cpu.is_arm:
            if NEOVERSE_V1.lower() in cpu.model.lower():
                return True, "TensorFlow turns oneDNN on by default on Linux for Arm Neoverse V1 cores"
            return False, (f"TensorFlow leaves oneDNN off by default on Linux for Arm cores other than Neoverse V1 "
                           f"({cpu.model})")
        found = sorted(cpu.flags & set(DEFAULT_ON_FLAGS))
        if found:
            return True, f"TensorFlow turns oneDNN on by default on Linux for CPUs with {', '.join(found)}"
        return False, ("TensorFlow leaves oneDNN off by default on Linux for CPUs without AVX512-VNNI, AVX512-BF16, "
                       "AVX-VNNI or AMX (such as AMD Zen 1-3 and Intel Skylake-SP)")
    if system in ("win32", "windows"):
        return True, "TensorFlow turns oneDNN on by default on Windows x86"
    return False, f"TensorFlow leaves oneDNN off by default on {system}"


def onednn_state(cpu: CpuInfo, environ: Mapping[str, str], *, system: str = sys.platform, tf_version: str | None = None,
                 imported_answer: bool | None = None) -> OneDnnState:
    """Whether TensorFlow runs oneDNN here. Pure: ``imported_answer`` is TensorFlow's own answer if imported."""
    default, default_why = tensorflow_default(cpu, system, tf_version)
    raw = environ.get(VARIABLE)
    asked = parse_variable(raw)
    if imported_answer is not None:
        how = f"{VARIABLE}={raw}" if asked is not None else default_why
        return OneDnnState(imported_answer, default, f"TensorFlow is imported and reports oneDNN "
                           f"{'on' if imported_answer else 'off'} ({how})", raw, True)
    if asked is None:
        why = default_why if raw is None else (f"{VARIABLE}={raw!r} is not 0, 1, true or false: TensorFlow ignores it "
                                               f"and uses its default ({default_why})")
        return OneDnnState(default, default, why, raw)
    if asked and not has_onednn_build(system, cpu.arch):
        return OneDnnState(False, default, f"{VARIABLE}={raw}, but {default_why}", raw)
    return OneDnnState(asked, default, f"{VARIABLE}={raw}", raw)


def read_onednn_state(cpu: CpuInfo, environ: Mapping[str, str], tf_version: str | None) -> OneDnnState:
    """`onednn_state` for this process: TensorFlow's own answer if it is already imported (never imports it)."""
    answer = None
    if "tensorflow" in sys.modules:
        try:
            from tensorflow.python.util import _pywrap_util_port

            answer = bool(_pywrap_util_port.IsMklEnabled())
        except Exception:
            answer = None
    return onednn_state(cpu, environ, tf_version=tf_version, imported_answer=answer)


def onednn_takes_float16(cpu: CpuInfo, onednn: OneDnnState) -> bool:
    """Whether TensorFlow runs float16 ops through oneDNN (not Eigen) on ``cpu`` under ``onednn`` (`onednn_state`):
    where oneDNN is on and the CPU is an x86 with AVX512-FP16 or AMX-FP16."""
    return onednn.enabled and not cpu.is_arm and bool(cpu.flags & set(FLOAT16_FLAGS))
