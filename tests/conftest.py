"""Shared fixtures: the real registry, and Keras/TensorFlow global state restored after each test."""

from __future__ import annotations

import sys
import tempfile

import pytest

from amp_backends import configure
from amp_backends.registry import default_registry


@pytest.fixture
def registry():
    return default_registry()


@pytest.fixture(autouse=True)
def restore_global_state(monkeypatch):
    """Every test leaves the Keras dtype policy, TF32, JIT setting and applied plan as it found them."""
    for var in ("AMP_BACKEND", "AMP_POLICY", "AMP_XLA", "AMP_TF32", "AMP_LOSS_SCALE", "AMP_ITEX_AMP", "AMP_STRICT", "AMP_FORCE"):
        monkeypatch.delenv(var, raising=False)
    tf = sys.modules.get("tensorflow")
    saved = None
    if tf is not None:
        saved = (tf.keras.mixed_precision.global_policy().name,
                 tf.config.experimental.tensor_float_32_execution_enabled(),
                 tf.config.optimizer.get_jit())
    configure._state.reset()
    yield
    configure._state.reset()
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        policy, tf32, jit = saved if saved else ("float32", True, "")
        tf.keras.mixed_precision.set_global_policy(policy)
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
        tf.config.optimizer.set_jit(jit or False)


# Subprocesses start here, not in the repository root, so that they import the installed package
# (a wheel in the nox 'tests' session) rather than the checkout beside them.
NEUTRAL_CWD = tempfile.mkdtemp(prefix="amp_backends_tests_")
