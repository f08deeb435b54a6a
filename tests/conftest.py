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


# Under pytest-xdist each worker runs its own TensorFlow: each takes its share of the cores for its thread pools
# (rather than every worker spreading over every core and all of them switching among more threads than cores).
# Subprocesses inherit the share. Numerics never depend on it: what a test compares runs under one setting.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "").isdigit() and "TF_NUM_INTRAOP_THREADS" not in os.environ:
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["TF_NUM_INTRAOP_THREADS"] = str(_share)
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(_share))

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


def _fingerprint(model) -> tuple:
    """What a test could change in a built model: its layers' dtype policies, its weights, a compiled optimizer."""
    import numpy as np

    from amp_backends.model_check._keras import policy_name, walk

    policies = tuple(policy_name(layer) for _, layer in walk(model, model.name))
    weights = tuple(float(np.sum(np.abs(v.numpy()), dtype=np.float64)) for v in model.weights)
    return policies, weights, getattr(model, "optimizer", None) is None


class ZooModels:
    """The zoo's models (:mod:`amp_backends.zoo`), built once per session under a dtype policy and shared by the
    tests that only read them (the precision check, inference); ``fresh`` builds one a test may change (train,
    compile, prepare). A shared model that a test changed fails that test at teardown."""

    def __init__(self) -> None:
        self._built: dict[tuple[str, str], tuple[object, tuple]] = {}
        self._used: set[tuple[str, str]] = set()

    @staticmethod
    def entry(name: str):
        """The zoo's entry ``name``; the test skips where it cannot be built (keras_hub missing, Keras 2)."""
        from amp_backends import zoo

        e = zoo.get(name)
        why = zoo.unavailable(e)
        if why:
            pytest.skip(f"{name}: {why}")
        return e

    def fresh(self, name: str, policy_name: str):
        """A new build of ``name`` under ``policy_name``, the test's own."""
        with policy(policy_name):
            return self.entry(name).build()

    def shared(self, name: str, policy_name: str):
        """The session's build of ``name`` under ``policy_name``: read it, never change it."""
        key = (name, policy_name)
        if key not in self._built:
            model = self.fresh(name, policy_name)
            self._built[key] = (model, _fingerprint(model))
        self._used.add(key)
        return self._built[key][0]

    def changed(self) -> list[tuple[str, str]]:
        """The shared models used since the last call that are no longer as built (dropped: rebuilt on next use)."""
        used, self._used = self._used, set()
        bad = sorted(k for k in used if _fingerprint(self._built[k][0]) != self._built[k][1])
        for key in bad:
            del self._built[key]
        return bad


@pytest.fixture(scope="session")
def _zoo_session() -> ZooModels:
    return ZooModels()


@pytest.fixture
def zoo_models(_zoo_session):
    """The session's :class:`ZooModels`; after the test, the shared models it used must be as they were built."""
    yield _zoo_session
    changed = _zoo_session.changed()
    assert not changed, (f"this test changed the shared models {changed}: build its own with zoo_models.fresh(name, "
                         "policy) to train, compile or prepare one")
