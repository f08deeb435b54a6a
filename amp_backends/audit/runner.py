"""Run the audit's child process and turn what it printed into an `Audit`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from .build import from_onednn, from_trace
from .child import BEGIN, END
from .nvidia import read_trace
from .report import Audit

XPU_REASON = ("not measured on XPU: what ran on an Intel GPU is not read. ITEX routes its matmuls and convolutions "
              "through oneDNN's GPU engine and TensorFlow's profiler, but no Intel GPU was at hand to check what "
              "either prints there, and ITEX is end-of-life (TensorFlow <= 2.16); "
              "`amp-backends check` still reads the graph")


def overrides_env(plan: Any = None, **overrides: Any) -> dict[str, str]:
    """The ``AMP_*`` variables that make the child plan as ``plan`` (its backend, policy, XLA) and ``overrides`` say."""
    from ..request import ENV_VARS

    env: dict[str, str] = {}
    if plan is not None:
        env[ENV_VARS["backend"]] = str(plan.backend)
        env[ENV_VARS["policy"]] = str(plan.policy)
        env[ENV_VARS["xla"]] = "on" if plan.xla else "off"
    for name, value in overrides.items():
        if value is None or value is False:
            continue
        if name not in ENV_VARS:
            raise TypeError(f"unknown plan override {name!r}; expected one of {', '.join(ENV_VARS)}")
        env[ENV_VARS[name]] = "1" if value is True else str(value)
    return env


def split_output(stdout: str) -> tuple[list[str], list[str]]:
    """(header lines before the measured steps, the measured steps' lines)."""
    lines = stdout.splitlines()
    if BEGIN not in lines or END not in lines:
        return lines, []
    begin, end = lines.index(BEGIN), lines.index(END)
    return lines[:begin], lines[begin + 1:end]


def run_child(target: str, *, batch_size: int, steps: int, warmup: int, env: Mapping[str, str],
              timeout: float = 600.0) -> Audit:
    """Run ``target`` (``MODULE:FACTORY``) in a child with oneDNN's verbose mode on; RuntimeError if it fails."""
    with tempfile.TemporaryDirectory(prefix="amp_audit_") as tmp:
        out = os.path.join(tmp, "audit.json")
        child_env = {**os.environ, **env, "ONEDNN_VERBOSE": "1"}
        cmd = [sys.executable, "-m", "amp_backends.audit.child", target, out, str(batch_size), str(steps), str(warmup)]
        try:
            proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=timeout, check=False,
                                  cwd=os.getcwd())
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"the audit of {target} ran past {timeout:.0f} s. Fix: fewer --steps or a smaller "
                               "--batch-size") from exc
        if proc.returncode != 0 or not os.path.exists(out):
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"the audit's child process for {target} failed (exit {proc.returncode}). "
                               f"Expected it to build the model and train {warmup + steps} steps. "
                               f"Its last lines:\n{tail}")
        with open(out, encoding="utf-8") as f:
            doc = json.load(f)
        header, measured = split_output(proc.stdout)
        if doc.get("gpu") and doc.get("profile_dir"):
            audit = from_trace(read_trace(doc["profile_dir"]), doc.get("plan", {}), doc.get("model", "?"),
                               doc.get("steps"), doc.get("findings", []), doc.get("layers", []))
            audit.batch_size, audit.step_time_ms = doc.get("batch_size"), doc.get("step_time_ms")
            return audit
        return from_onednn(measured, doc, header)


def not_measured_on_xpu(model: str, plan: Any) -> Audit:
    audit = Audit(model=model, device="xpu", plan={"backend": plan.backend, "policy": plan.policy,
                                                   "compute_dtype": plan.compute_dtype, "xla": bool(plan.xla)},
                  measured=False, source=None)
    audit.notes.append(XPU_REASON)
    return audit
