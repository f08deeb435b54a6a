"""Intel Extension for TensorFlow (ITEX): whether it is usable, and its two settings.

Read without importing ITEX, because ITEX X.Y only loads into TensorFlow X.Y (a mismatch fails or aborts at
import). ``ITEX_FP32_MATH_MODE`` (``TF32`` on Xe-HPC XPUs, ``BF32`` on AMX CPUs) is read when ITEX builds its
kernels, so it is set before the first op runs (a user's value is kept); ITEX's auto mixed precision rewrites the
float32 graph (``itex.set_config``).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Mapping, MutableMapping

from amp_backends.assessment import UNSUPPORTED, Support
from amp_backends.errors import warn
from amp_backends.software import installed_version, minor_version, tensorflow_version

ITEX_DISTRIBUTION = "intel-extension-for-tensorflow"
ITEX_EOL = ("end-of-life: Intel stopped ITEX development (last release 2.15.0.3, 2025-03; no plan beyond TensorFlow "
            "2.16, Python <= 3.11)")
MATH_MODE_VARIABLE = "ITEX_FP32_MATH_MODE"
AMP_SETTING = "itex_auto_mixed_precision"
MATH_MODES = ("FP32", "TF32", "BF32")  # what ITEX reads in ITEX_FP32_MATH_MODE
AMP_VARIABLE = "ITEX_AUTO_MIXED_PRECISION"  # ITEX's graph rewrite switched on from the environment (its guide's way)
_SET_BY_PLAN: dict[str, str] = {}  # the math mode this process's plan set, which a later plan may undo


@dataclass(frozen=True)
class ItexStatus:
    """Whether Intel Extension for TensorFlow is installed, and ``compatible`` with the installed TensorFlow (which
    then loads it as a plugin when imported)."""

    version: str | None
    tf_version: str | None
    compatible: bool
    reason: str

    @property
    def installed(self) -> bool:
        """Whether ITEX is installed (its ``version`` is known), compatible or not."""
        return self.version is not None


def itex_status(itex_version: str | None = None, tf_version: str | None = None, *, look: bool = True) -> ItexStatus:
    """ITEX X.Y.* needs TensorFlow X.Y.*: a mismatch fails at import (or aborts), so it is never loaded then."""
    if look:
        itex_version = itex_version or installed_version(ITEX_DISTRIBUTION)
        tf_version = tf_version or tensorflow_version()
    if itex_version is None:
        return ItexStatus(None, tf_version, False, "Intel Extension for TensorFlow is not installed")
    if tf_version is None:
        return ItexStatus(itex_version, None, False, f"ITEX {itex_version} is installed but TensorFlow is not")
    if minor_version(itex_version) != minor_version(tf_version):
        want = ".".join(map(str, minor_version(itex_version)))
        return ItexStatus(itex_version, tf_version, False, f"ITEX {itex_version} needs TensorFlow {want}.x but "
                          f"TensorFlow {tf_version} is installed: ITEX will not load (use an environment with "
                          f"tensorflow=={want}.* for Intel GPUs)")
    return ItexStatus(itex_version, tf_version, True, f"ITEX {itex_version} matches TensorFlow {tf_version}")


def itex_software_row(status: ItexStatus) -> tuple[str, str]:
    """The report's software row for ITEX."""
    return ("ITEX", f"{status.version}: {status.reason}; {ITEX_EOL}" if status.installed else status.reason)


def itex_libraries() -> list[str]:
    """ITEX's native backends installed (``cpu``/``gpu``), read from files, without importing ITEX."""
    spec = importlib.util.find_spec("intel_extension_for_tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return []
    found = set()
    for folder in spec.submodule_search_locations:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        found |= {"cpu" for n in names if n.startswith("libitex_cpu")}
        found |= {"gpu" for n in names if n.startswith(("libitex_gpu", "libitex_xpu"))}
    return sorted(found)


def user_math_mode(environ: Mapping[str, str] | None = None) -> str | None:
    """``ITEX_FP32_MATH_MODE`` as the user set it where ITEX starts (default: this process's environment), or
    ``None``: ITEX reads it and the plan keeps it (a value this process's plan set is the plan's, not the user's)."""
    env = os.environ if environ is None else environ
    value = env.get(MATH_MODE_VARIABLE) or None
    return value if env is not os.environ or _users(value) else None


def _users(value: str | None) -> bool:
    """Whether ``ITEX_FP32_MATH_MODE``'s ``value`` is the user's: set, and not what this process's plan set."""
    return value is not None and _SET_BY_PLAN.get(MATH_MODE_VARIABLE) != value


def math_mode_support(user_mode: str | None, plan_mode: str, native: Support) -> Support:
    """The plan's ``tf32`` (ITEX's math mode ``plan_mode`` for float32 matmuls) where the user set another mode,
    which is kept: the plan then says what runs, instead of the mode it would have set.

    Args:
        user_mode: ``ITEX_FP32_MATH_MODE`` as set in the environment (`user_math_mode`), or ``None``.
        plan_mode: The mode the plan sets for ``tf32=on`` (``BF32`` on AMX CPUs, ``TF32`` on Xe-HPC XPUs).
        native: The support where the user set nothing (or ``plan_mode`` itself).

    Returns:
        ``native``, or an unsupported ``tf32`` saying which mode is kept and how to let the plan choose.
    """
    if not user_mode or user_mode.strip().upper() == plan_mode:
        return native
    if user_mode.strip().upper() not in MATH_MODES:
        return Support(UNSUPPORTED, f"{MATH_MODE_VARIABLE}={user_mode} is set in the environment, and ITEX reads "
                       f"only {', '.join(MATH_MODES)}: unset it (the plan then sets {plan_mode}), or set one of them",
                       f"{MATH_MODE_VARIABLE}={user_mode} in the environment is no mode ITEX reads")
    return Support(UNSUPPORTED, f"{MATH_MODE_VARIABLE}={user_mode} is set in the environment and is kept: float32 "
                   f"matmuls run in {user_mode.strip().upper()} (unset it to let the plan use {plan_mode})",
                   f"{MATH_MODE_VARIABLE}={user_mode} set in the environment is kept")


def apply_math_mode(mode: str | None, environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set ``ITEX_FP32_MATH_MODE`` to ``mode`` unless the user set it; with no ``mode``, unset what an earlier plan
    of this process set (ITEX reads it as it builds each kernel). A note for the log, or ``None``.

    Args:
        mode: The plan's math mode (``BF32``, ``TF32``), or ``None`` (the plan's tf32 is off).
        environ: The environment (default: this process's).

    Returns:
        What was set, kept or unset.
    """
    env = os.environ if environ is None else environ
    current = env.get(MATH_MODE_VARIABLE)
    said = (current or "").strip().upper()
    if _users(current):
        if mode is None and said in ("BF32", "TF32"):
            warn(f"{MATH_MODE_VARIABLE}={current} set in the environment is kept: float32 matmuls run in {said}, "
                 f"although the plan's tf32 is off. Fix: unset {MATH_MODE_VARIABLE} (or set it to FP32) for float32 "
                 "matmuls in float32.")
        other = f" (the plan would use {mode})" if mode is not None and said != mode.upper() else ""
        return f"{MATH_MODE_VARIABLE}={current} set by the user is kept{other}"
    if mode is None:
        if current is None:
            return None
        del env[MATH_MODE_VARIABLE], _SET_BY_PLAN[MATH_MODE_VARIABLE]
        return f"{MATH_MODE_VARIABLE} unset (tf32=off): an earlier plan of this process had set {current}"
    env[MATH_MODE_VARIABLE] = _SET_BY_PLAN[MATH_MODE_VARIABLE] = mode
    return f"{MATH_MODE_VARIABLE}={mode}"


def configure_itex_amp(data_type: str) -> str:
    """Turn on ITEX's graph-level auto mixed precision for ``data_type`` (``BFLOAT16`` or ``FLOAT16``)."""
    import intel_extension_for_tensorflow as itex

    config = itex.ConfigProto()
    config.graph_options.auto_mixed_precision = itex.ON
    config.graph_options.auto_mixed_precision_options.data_type = getattr(itex, data_type)
    itex.set_config(config)
    return f"ITEX auto mixed precision on ({data_type})"


def amp_variable_beside(policy: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The warning for ``ITEX_AUTO_MIXED_PRECISION`` left on in the environment beside a Keras mixed ``policy``
    (ITEX's guide sets it; a migrated script's job file may still), else ``None``.

    Args:
        policy: The plan's Keras dtype policy.
        environ: The environment (default: this process's).

    Returns:
        What happens and the fix, where ITEX's graph rewrite would run beside the policy.
    """
    env = os.environ if environ is None else environ
    value = env.get(AMP_VARIABLE, "")
    if not policy.startswith("mixed_") or value.strip().lower() not in ("1", "true"):
        return None
    data_type = env.get(f"{AMP_VARIABLE}_DATA_TYPE", "its default type")
    return (f"{AMP_VARIABLE}={value} is set in the environment: ITEX's graph rewrite turns float32 ops to {data_type} "
            f"beside the plan's Keras policy {policy}, so the model is cast twice and the layers the plan keeps in "
            f"float32 are rewritten too. Fix: use one of the two, not both: unset {AMP_VARIABLE} (and "
            f"{AMP_VARIABLE}_DATA_TYPE) to keep the plan's policy, or, for ITEX's rewrite instead, "
            "auto_configure(policy='float32', graph_amp='on') where the plan offers it.")
