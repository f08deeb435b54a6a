"""Shared fixtures: the real registry, and Keras/TensorFlow global state restored after each test."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

import pytest

from amp_backends import configure, keras_compat, request
from amp_backends.registry import default_registry


@pytest.fixture
def registry():
    return default_registry()


@pytest.fixture(autouse=True)
def restore_global_state(monkeypatch):
    """Every test leaves the Keras dtype policy, TF32, JIT setting and applied plan as it found them."""
    for var in request.ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    # answers cached by one test (a measured layer plan, an autotune choice) are not another test's
    monkeypatch.setenv("AMP_CACHE_DIR", tempfile.mkdtemp(prefix="amp_cache_", dir=CACHE_ROOT))
    tf = sys.modules.get("tensorflow")
    saved = None
    if tf is not None:
        saved = (keras_compat.global_policy_name(tf),
                 tf.config.experimental.tensor_float_32_execution_enabled(),
                 tf.config.optimizer.get_jit())
    configure.reset()
    yield
    configure.reset()
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        policy, tf32, jit = saved if saved else ("float32", True, "")
        keras_compat.set_global_policy(policy, tf)
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
        tf.config.optimizer.set_jit(jit or False)


# Caches of this test session, never the user's (subprocesses inherit it; each test gets a folder of its own).
CACHE_ROOT = tempfile.mkdtemp(prefix="amp_backends_cache_")
os.environ["AMP_CACHE_DIR"] = CACHE_ROOT

# Subprocesses start here, not in the repository root, so that they import the installed package
# (a wheel in the nox 'tests' session) rather than the checkout beside them.
NEUTRAL_CWD = tempfile.mkdtemp(prefix="amp_backends_tests_")


@contextlib.contextmanager
def policy(name):
    """Build under the Keras dtype policy ``name`` inside the block; the policy before it is restored after."""
    import tensorflow as tf

    before = keras_compat.global_policy_name(tf)
    keras_compat.set_global_policy(name, tf)
    try:
        yield
    finally:
        keras_compat.set_global_policy(before, tf)
