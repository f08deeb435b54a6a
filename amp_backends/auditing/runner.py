"""Run the audit's child process and build an `Audit` from what its backend reads of the run.

Ctrl-C, and SIGTERM where it has its default action (`amp_backends.errors.TrainingInterrupted`, exit code 143), stop
the child before the interruption goes on; a SIGINT this process was started ignoring stays ignored.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import AmpConfigError, FactoryError, ModelCallError, TrainingInterrupted, warn
from ..kernel_audit import Capture
from .build import from_reading, not_measured, read_kernels
from .child import BEGIN, END
from .audit_result import Audit


def overrides_env(plan: Any = None, **overrides: Any) -> dict[str, str]:
    """The ``AMP_*`` variables that make the child plan as ``plan`` says (its backend, policy, XLA, TF32, graph
    rewrite and float8) and as ``overrides`` say; an old option name (``itex_amp``) warns and counts as its new
    one."""
    from ..request import ENV_VARS, RENAMED, renamed_message

    env: dict[str, str] = {}
    if plan is not None:
        env[ENV_VARS["backend"]] = str(plan.backend)
        env[ENV_VARS["policy"]] = str(plan.policy)
        for name in ("xla", "tf32", "fp8", "graph_amp"):
            env[ENV_VARS[name]] = "on" if getattr(plan, name) else "off"
    for name, value in overrides.items():
        if value is None or value is False:
            continue
        if name in RENAMED:
            warn(renamed_message(name), DeprecationWarning)  # audit() -> here
            name = RENAMED[name]
        if name not in ENV_VARS:
            raise AmpConfigError(f"audit() got the unknown plan override {name}={value!r}: expected one of "
                                 f"{', '.join(ENV_VARS)}. Fix: pass the overrides auto_configure() takes, such as "
                                 "policy='float32'")
        env[ENV_VARS[name]] = "1" if value is True else str(value)
    return env


def split_output(stdout: str) -> tuple[list[str], list[str]]:
    """(header lines before the measured steps, the measured steps' lines)."""
    lines = stdout.splitlines()
    if BEGIN not in lines or END not in lines:
        return lines, []
    begin, end = lines.index(BEGIN), lines.index(END)
    return lines[:begin], lines[begin + 1:end]


def _run_to_end(cmd: list[str], env: Mapping[str, str], timeout: float) -> tuple[int, str, str]:
    """``cmd``'s exit code, standard output and standard error, run with ``env`` to its end; past ``timeout``
    (``subprocess.TimeoutExpired``) or when this process is interrupted (SIGTERM in the main thread; a handler of
    the program's own, or an ignored SIGTERM, is left as it is), it is stopped first."""
    def interrupt(signum: int, frame: Any) -> None:
        raise TrainingInterrupted(signum, 0, None, f"stopped by {signal.Signals(signum).name}")

    catch = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    if catch:
        signal.signal(signal.SIGTERM, interrupt)
    try:
        with subprocess.Popen(cmd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=os.getcwd()) as proc:
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except BaseException:  # a timeout, Ctrl-C, SIGTERM: the child is stopped (SIGKILL after 5 s) first
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                proc.wait()
                raise
    finally:
        if catch:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return proc.returncode, stdout, stderr


def run_child(target: str, *, batch_size: int, steps: int, warmup: int, env: Mapping[str, str],
              timeout: float = 600.0, inputs: Mapping[str, Any] | None = None) -> Audit:
    """Run ``target`` (``MODULE:FACTORY``) in a child started with ``env`` (beyond this process's) for ``warmup`` and
    ``steps`` steps of ``batch_size`` (at the shapes ``inputs`` gives: `child.input_shapes`); the plan's backend reads
    what ran. The errors are `audit`'s."""
    from ..registry import default_registry

    with tempfile.TemporaryDirectory(prefix="amp_audit_") as tmp:
        out = os.path.join(tmp, "audit.json")
        cmd = [sys.executable, "-m", "amp_backends.auditing.child", target, out, str(batch_size), str(steps),
               str(warmup), json.dumps(dict(inputs or {}))]
        try:
            returncode, stdout, stderr = _run_to_end(cmd, {**os.environ, **env}, timeout)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"the audit of {target} ran past {timeout:.0f} s. Fix: fewer --steps or a smaller "
                               "--batch-size") from exc
        if returncode != 0 or not os.path.exists(out):
            tail = "\n".join(stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"the audit's child process for {target} failed (exit {returncode}). "
                               f"Expected it to build the model and train {warmup + steps} steps. "
                               f"Its last lines:\n{tail}")
        with open(out, encoding="utf-8") as f:
            doc = json.load(f)
        if "factory_error" in doc:
            tail = "\n".join((doc.get("traceback") or "").strip().splitlines()[-15:])
            raise FactoryError(doc["factory_error"] + (f"\nThe child's last lines:\n{tail}" if tail else ""))
        if "input_error" in doc:  # shapes that do not fit the model, found once it was built
            raise AmpConfigError(doc["input_error"])
        if "model_call_error" in doc:  # a model that does not run at those shapes, the layer named
            raise ModelCallError(doc["model_call_error"])
        plan = doc.get("plan") or {}
        kernel_audit = default_registry().kernel_audit(str(plan.get("backend")))
        if kernel_audit is None or kernel_audit.unavailable or doc.get("measured") is False:
            return not_measured(target, plan, kernel_audit)
        header, measured = split_output(stdout)
        capture = Capture(tuple(measured), tuple(header), doc, doc.get("workdir"))
        return from_reading(read_kernels(kernel_audit, capture, str(plan.get("backend"))), doc)
