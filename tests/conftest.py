"""Shared fixtures: the real registry, and Keras/TensorFlow global state restored after each test."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
from pathlib import Path
import sys
import tempfile

import pytest

from amp_backends import configure, keras_compat, request
from amp_backends.backends.cpu.rules import GRAPPLER_BF16
from amp_backends.registry import default_registry


# ----------------------------------------------------------------------------- the CPU the tests plan for
# Our machines are not one CPU generation: a test that depends on this machine's plan either takes ``cpu_plan``
# (it then runs under a float32 CPU plan and a bfloat16 CPU plan on every machine) or reads the plan and asserts
# what that plan implies. ``--as-cpu NAME`` (or AMP_TEST_AS_CPU=NAME) runs the whole suite as if on the
# catalogue's CPU NAME (zen1, zen3, zen5, sapphire-rapids, ...): the probes of the tests' own process see that CPU,
# and TensorFlow's kernels follow it as far as one variable can (TF_ENABLE_ONEDNN_OPTS=0 where TensorFlow leaves
# oneDNN off on that CPU). Programs the tests start probe the real CPU (under that variable): those tests read
# the plan the program prints.
# The catalogue's CPU whose plan has each policy, for the plan this machine does not make.
CPU_OF_POLICY = {"float32": "zen3", "mixed_bfloat16": "zen5"}


def _real_probe_cpu():
    from amp_backends.backends.cpu import backend

    return backend.probe_cpu()


# The CPU probe that reads this machine, whatever --as-cpu makes the others see (the test of the probe itself).
REAL_PROBE_CPU = _real_probe_cpu


def pytest_addoption(parser):
    parser.addoption("--as-cpu", default=os.environ.get("AMP_TEST_AS_CPU") or None, metavar="NAME",
                     help="run the tests as if on the device catalogue's CPU NAME (zen1, zen3, zen5, "
                          "sapphire-rapids, ...): this process's CPU probe sees that CPU")


def _as_cpu(name: str):
    """The catalogue CPU ``name``'s CpuInfo; TF_ENABLE_ONEDNN_OPTS set as TensorFlow would decide on it."""
    from amp_backends.backends.cpu.onednn import tensorflow_default
    from amp_backends.devices import device_hardware, find_device

    from amp_backends.errors import AmpConfigError

    try:
        device = find_device(name)
    except AmpConfigError as exc:
        raise pytest.UsageError(f"--as-cpu: {exc}") from None
    if device.backend != "cpu":
        raise pytest.UsageError(f"--as-cpu takes a CPU of the device catalogue, such as zen3 or zen5. Received: "
                                f"{name!r} (a {device.backend} device).")
    cpu = device_hardware(device).cpu
    onednn_on, _ = tensorflow_default(cpu, "linux", "2.21.0")
    if not onednn_on and "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    return cpu


def pytest_configure(config):
    name = config.getoption("--as-cpu")
    if name:
        import amp_backends.backends.cpu as cpu_package
        from amp_backends.backends.cpu import backend as cpu_backend

        cpu = _as_cpu(name)
        global REAL_PROBE_CPU
        REAL_PROBE_CPU = cpu_backend.probe_cpu
        cpu_package.probe_cpu = cpu_backend.probe_cpu = lambda: cpu  # type: ignore[assignment]
        os.environ["AMP_TEST_AS_CPU"] = name  # xdist's workers configure themselves from it too


def pytest_report_header(config):
    name = config.getoption("--as-cpu")
    from amp_backends.backends.cpu import probe_cpu

    return f"CPU the tests plan for: {probe_cpu().name}" + (f" (--as-cpu {name})" if name else " (this machine)")


def float16_reaches_onednn() -> bool:
    """Whether this process's TensorFlow sends float16 to oneDNN, whose float16 training kernels are reference code
    (an AVX512-FP16 CPU with oneDNN on: a float16 training step a hundred times slower than float32's). A test that
    forces float16 for its numerics then runs its program with :data:`EIGEN_FLOAT16` in the environment."""
    from amp_backends.backends.cpu import probe_cpu
    from amp_backends.backends.cpu.onednn import onednn_takes_float16, read_onednn_state
    from amp_backends.software import tensorflow_version

    cpu = probe_cpu()
    return onednn_takes_float16(cpu, read_onednn_state(cpu, os.environ, tensorflow_version()))


# TensorFlow's Eigen kernels for every dtype (read once, when TensorFlow is imported): float16 as on CPUs without
# fp16 instructions
EIGEN_FLOAT16 = {"TF_ENABLE_ONEDNN_OPTS": "0"}


@pytest.fixture(params=["float32", "mixed_bfloat16"], ids=["float32-cpu", "bf16-cpu"])
def cpu_plan(request):
    """A CPU plan of each kind, on every machine: this machine's own plan, applied by ``auto_configure()``, where
    it has that policy; otherwise the plan for the catalogue's CPU that makes it (a Zen 3 for float32, a Zen 5 for
    bfloat16), with only its Keras policy set here (``configure_for_device``: ``current_plan()`` stays None).
    Models built in the test follow the plan's policy; pass the plan to what takes one. On a CPU without bf16
    instructions the bfloat16 plan computes correctly but in emulated kernels: what it shows is the library's
    logic, not this CPU's kernels."""
    import amp_backends

    here = amp_backends.plan_for(environ={})
    if here.backend == "cpu" and here.policy == request.param:
        return amp_backends.auto_configure(verbose=False)
    return amp_backends.configure_for_device(CPU_OF_POLICY[request.param], environ={})


@pytest.fixture
def registry():
    return default_registry()


VENDOR_VARIABLES = ("ITEX_FP32_MATH_MODE",)

# The grappler rewrites a plan may turn on (the CPU backend's graph_amp): each test finds them as it left them.
GRAPPLER_OPTIONS = (GRAPPLER_BF16,)


def _grappler_options(tf) -> dict[str, bool]:
    """The `GRAPPLER_OPTIONS` as TensorFlow has them now (off where never set: TensorFlow's default)."""
    current = tf.config.optimizer.get_experimental_options()
    return {name: bool(current.get(name, False)) for name in GRAPPLER_OPTIONS}


@contextlib.contextmanager
def global_state_kept(monkeypatch):
    """The Keras dtype policy, TF32, JIT setting, the grappler rewrites a plan turns on (`GRAPPLER_OPTIONS`) and
    the applied plan as they were on entry, on exit; no ``AMP_*`` variable inside (`restore_global_state`)."""
    for var in (*request.ENV_VARS.values(), *request.RENAMED_ENV_VARS.values()):
        monkeypatch.delenv(var, raising=False)
    # answers cached by one test (a measured layer plan, an autotune choice) are not another test's
    monkeypatch.setenv("AMP_CACHE_DIR", tempfile.mkdtemp(prefix="amp_cache_", dir=CACHE_ROOT))
    # the vendor variables a plan applies (ITEX's math mode on an AMX CPU): no test sees another's
    for var in VENDOR_VARIABLES:
        if var in os.environ:
            monkeypatch.setenv(var, os.environ[var])
        else:  # (set, then deleted: the teardown deletes what the test set)
            monkeypatch.setenv(var, "")
            monkeypatch.delenv(var)
    tf = sys.modules.get("tensorflow")
    saved = None
    if tf is not None:
        saved = (keras_compat.global_policy_name(tf),
                 tf.config.experimental.tensor_float_32_execution_enabled(),
                 tf.config.optimizer.get_jit(), _grappler_options(tf))
    configure.reset()
    try:
        yield
    finally:
        configure.reset()
        tf = sys.modules.get("tensorflow")
        if tf is not None:
            policy, tf32, jit, rewrites = saved if saved else ("float32", True, "",
                                                                dict.fromkeys(GRAPPLER_OPTIONS, False))
            keras_compat.set_global_policy(policy, tf)
            tf.config.experimental.enable_tensor_float_32_execution(tf32)
            tf.config.optimizer.set_jit(jit or False)
            if _grappler_options(tf) != rewrites:
                tf.config.optimizer.set_experimental_options(rewrites)


@pytest.fixture(autouse=True)
def restore_global_state(monkeypatch):
    """Every test leaves the Keras dtype policy, TF32, JIT setting, the grappler rewrites a plan turns on and the
    applied plan as it found them (`global_state_kept`)."""
    with global_state_kept(monkeypatch):
        yield


@pytest.fixture(autouse=True)
def survivors_frozen():
    """After each test, its garbage is collected and what it left alive (the session's zoo models, TensorFlow's
    function caches) is moved out of the cyclic garbage collector's reach (`gc.freeze`), so that no later
    collection walks it again: a worker that had built the reference models held 1.5 million objects, every full
    collection walked them all (~1.8 s each) and one small in-process test spent 42 s of its 43 in 23 of them."""
    yield
    gc.collect()
    gc.freeze()


# Under pytest-xdist each worker runs its own TensorFlow: each takes its share of the cores for its thread pools
# (rather than every worker spreading over every core and all of them switching among more threads than cores).
# Subprocesses inherit the share. Numerics never depend on it: what a test compares runs under one setting.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "").isdigit() and "TF_NUM_INTRAOP_THREADS" not in os.environ:
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["TF_NUM_INTRAOP_THREADS"] = str(_share)
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(_share))

# The repository and the tests' own folders, for tests at any depth of tests/
REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
DATA = TESTS / "data"  # recorded inputs (oneDNN verbose records, profiler kernels)
SCRIPTS = TESTS / "scripts"  # the programs tests start in processes of their own

# Caches of this test session, never the user's (subprocesses inherit it; each test gets a folder of its own).
CACHE_ROOT = tempfile.mkdtemp(prefix="amp_backends_cache_")
os.environ["AMP_CACHE_DIR"] = CACHE_ROOT

# Subprocesses start here, not in the repository root, so that they import the installed package
# (a wheel in the nox 'tests' session) rather than the checkout beside them.
NEUTRAL_CWD = tempfile.mkdtemp(prefix="amp_backends_tests_")
for _made in (CACHE_ROOT, NEUTRAL_CWD):  # removed when this process (the session, or an xdist worker) ends
    atexit.register(shutil.rmtree, _made, ignore_errors=True)


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

    from amp_backends.keras_compat import policy_name, walk

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


def tensorflow_blocked(folder) -> dict[str, str]:
    """Environment variables under which importing TensorFlow fails loudly (a ``tensorflow`` package of its own
    first on ``PYTHONPATH``): a command that refuses its input before TensorFlow starts exits with its own error."""
    shadow = Path(folder) / "no_tensorflow"
    (shadow / "tensorflow").mkdir(parents=True, exist_ok=True)
    (shadow / "tensorflow" / "__init__.py").write_text(
        'raise ImportError("TensorFlow was imported before the input was refused")\n')
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")]))}
