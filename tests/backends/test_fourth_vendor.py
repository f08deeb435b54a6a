"""A vendor the package does not ship, installed beside it through the entry-point group, is planned, catalogued
and audited.

The fake vendor is a distribution of its own on ``PYTHONPATH`` (a module and its ``.dist-info`` with an
``entry_points.txt``), as a third party would ship one: nothing in ``amp_backends`` names it. Its kernel audit
(``Backend.kernel_audit``) asks for a variable in the audited process's environment, records what it saw there
in ``begin``/``end`` and ``facts``, and reads a fixed set of kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import NEUTRAL_CWD

pytestmark = pytest.mark.intel  # the registry, the plan and the audit, as TF 2.15's session runs them

VENDOR = textwrap.dedent('''
    import os

    from amp_backends.backend_api import (BF16, GB, MATMUL, NATIVE, UNSUPPORTED, Accelerator, Assessment, Backend,
                                          BackendProbe, DeviceFact, KernelAudit, KernelReading, KernelRecord,
                                          KnownDevice, Support)

    NPU = KnownDevice("npu9000", ("fake-npu", "npu-9000"), "fakenpu", "Fake NPU 9000 16 GB", "the vendor's sheet",
                      device_name="Fake NPU 9000", memory_bytes=16 * GB,
                      facts=(DeviceFact("npu_generation", "2", "NPU gen 2"),))


    class FakeNpuBackend(Backend):
        name, priority, tf_device_type = "fakenpu", 400, "NPU"

        def probe(self, *, use_tensorflow=False):
            return BackendProbe("fakenpu", False, "no Fake NPU in this machine")

        def assess(self, probe, hardware):
            fast, slow = Support(NATIVE, "bfloat16 units"), Support(NATIVE, "float32 runs")
            half = Support(UNSUPPORTED, "no float16 on this NPU")
            return Assessment("fakenpu", ("/NPU:0",), {"float32": slow, "mixed_float16": half,
                                                       "mixed_bfloat16": fast},
                              ("mixed_bfloat16", "float32", "mixed_float16"), Support(UNSUPPORTED, "no TF32"),
                              Support(NATIVE, "XLA"), True)

        def catalogue(self):
            return (NPU,)

        def describe(self, device):
            npu = Accelerator("fakenpu", 0, device.device_name, "NPU", device.facts, device.memory_bytes,
                              frozenset({BF16}))
            return BackendProbe("fakenpu", True, f"1 NPU: {npu.name}", devices=(npu,))

        def kernel_audit(self):
            return FakeNpuKernelAudit()


    class FakeNpuKernelAudit(KernelAudit):
        device, environment = "npu", (("FAKE_NPU_LOG", "kernels"),)

        def begin(self, workdir):
            self.workdir = workdir
            with open(os.path.join(workdir, "begin"), "w") as f:
                f.write(os.environ.get("FAKE_NPU_LOG", "unset"))
            print("fakenpu: begin", flush=True)  # before the measured steps: a header line

        def end(self):
            with open(os.path.join(self.workdir, "end"), "w") as f:
                f.write("ended")

        def facts(self):
            return {"log": os.environ.get("FAKE_NPU_LOG")}

        def read(self, capture):
            with open(os.path.join(capture.workdir, "begin")) as f:
                began = f.read()
            ended = os.path.exists(os.path.join(capture.workdir, "end"))
            records = (KernelRecord("npu_gemm", "bfloat16", "NPU matrix", 3.0, True, matrix_unit=True, problem=MATMUL),
                       KernelRecord("npu_gemm", "float32", "NPU vector", 1.0, True, problem=MATMUL),
                       KernelRecord("npu_copy", "bfloat16", "NPU DMA", 0.5, False))
            source = (f"fake NPU log (begin saw FAKE_NPU_LOG={began}, ended {ended}, facts {capture.doc['facts']}, "
                      f"header {capture.header[-1]!r})")
            return KernelReading("npu", records, source=source, notes=("the fake NPU's note",))
''')

CHECK = textwrap.dedent('''
    import amp_backends
    from amp_backends.devices import device_hardware, find_device

    names = amp_backends.known_devices()
    assert names[0] == "npu9000" and "h100" in names and "zen3" in names, names
    assert find_device("Fake NPU").backend == "fakenpu"
    plan = amp_backends.plan_for(device="npu-9000")
    assert plan.backend == "fakenpu" and plan.policy == "mixed_bfloat16", plan
    assert amp_backends.plan_for(device="h100").backend == "nvidia"   # the shipped vendors are unchanged
    assert amp_backends.plan_for().backend != "fakenpu"               # this machine has no Fake NPU
    described = device_hardware("npu9000").get("fakenpu")             # describe() cites nothing: the catalogue does
    assert described.reason.endswith("[catalogue: the vendor's sheet]"), described.reason
    npu = described.devices[0]                                        # the vendor's own facts, carried as they are
    assert npu.fact("npu_generation") == "2" and npu.label == "Fake NPU 9000 (NPU gen 2)", npu
    assert npu.signature == "Fake NPU 9000/2" and npu.to_dict()["compute_capability"] is None
    assert "npu_generation" not in npu.to_dict()                      # the report's schema has no such key
    print("ok", plan.summary())
''')


AUDIT = textwrap.dedent('''
    import os
    import warnings

    import amp_backends
    from amp_backends.registry import default_registry

    # the child starts with every backend's variables (it plans only once it runs): the fake's among them
    assert default_registry().audit_environment() == {"FAKE_NPU_LOG": "kernels", "ONEDNN_VERBOSE": "1"}
    assert "FAKE_NPU_LOG" not in os.environ
    plan = amp_backends.plan_for(device="npu-9000")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = amp_backends.audit("npu_models:tiny", plan, batch_size=8, steps=1, warmup=1)
    d = result.to_dict()
    assert d["device"] == "npu" and d["measured"] and d["plan"]["backend"] == "fakenpu", d
    assert d["source"] == ("fake NPU log (begin saw FAKE_NPU_LOG=kernels, ended True, facts {'log': 'kernels'}, "
                           "header 'fakenpu: begin')"), d["source"]
    assert d["time_share_by_dtype"] == {"bfloat16": 0.75, "float32": 0.25}, d
    assert d["time_share_by_unit"] == {"NPU matrix": 0.75, "NPU vector": 0.25} and d["matrix_unit_share"] == 0.75
    assert d["compute_time_ms"] == 4.0 and d["other_time_ms"] == 0.5 and d["outside_onednn"] is None
    assert d["by_kind"]["npu_gemm"]["dtypes"] == {"bfloat16": 0.75, "float32": 0.25}
    assert d["notes"][0] == "the fake NPU's note"
    assert "the plan's fakenpu backend is not available here" in d["notes"][1], d["notes"]
    assert d["steps"] == 1 and d["batch_size"] == 8 and d["step_time_ms"] > 0
    assert "on matrix units (NPU matrix): 75.0%" in str(result), str(result)  # its unit, not AMX or Tensor Cores
    print("ok", d["source"])
    print("JSON", result.to_json(indent=None))
''')

MODELS = textwrap.dedent('''
    import tensorflow as tf


    def tiny():
        inputs = tf.keras.Input((16,))
        return tf.keras.Model(inputs, tf.keras.layers.Dense(4, name="head")(inputs), name="tiny")
''')


def install_fake_vendor(path) -> dict[str, str]:
    """The fake vendor as a distribution of its own in ``path``; the environment that puts it on the path."""
    (path / "fake_npu_vendor.py").write_text(VENDOR)
    info = path / "fake_npu_vendor-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-npu-vendor\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[amp_backends.backends]\nfakenpu = fake_npu_vendor:FakeNpuBackend\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")]))}


def test_a_fourth_vendor_from_its_own_distribution_is_catalogued_and_planned(tmp_path):
    env = install_fake_vendor(tmp_path)
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, env=env,
                          cwd=NEUTRAL_CWD)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]


@pytest.mark.tensorflow
@pytest.mark.slow
def test_a_fourth_vendor_reads_what_ran_under_its_plan(tmp_path):
    """``audit(factory, plan_for(device="npu-9000"))``: the child starts with the fake's variable, calls its
    ``begin``/``end`` around the measured steps, records its facts, and the audit is built from its reading —
    though no Fake NPU is here (the model computes on the CPU, and a note says so)."""
    env = install_fake_vendor(tmp_path)
    (tmp_path / "npu_models.py").write_text(MODELS)
    env.pop("FAKE_NPU_LOG", None)
    done = subprocess.run([sys.executable, "-c", AUDIT], capture_output=True, text=True, timeout=400, env=env,
                          cwd=NEUTRAL_CWD)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]
    from schema_check import assert_valid  # the audit of a vendor the package does not ship fits its schema

    assert_valid("audit", json.loads(done.stdout.split("JSON ", 1)[1]))


@pytest.mark.parametrize("devices, device", [(("/NPU:0",), "/device:NPU:0"), (("/XPU:1", "/XPU:2"), "/device:XPU:1"),
                                             (("/GPU:0",), "/GPU:0"), ((), "/CPU:0"),
                                             (("/job:localhost/replica:0/task:0/device:NPU:0",),
                                              "/job:localhost/replica:0/task:0/device:NPU:0")])
def test_a_plan_names_its_device_as_tf_device_takes_it(devices, device):
    """A vendor's device kind other than CPU or GPU is named in the full form, which ``tf.device`` reads for any
    kind; the short ``/NPU:0`` (the trainer's device, from `Accelerator.tf_name`) was a ValueError there."""
    import dataclasses

    import amp_backends

    tf = pytest.importorskip("tensorflow")
    plan = dataclasses.replace(amp_backends.plan_for(device="h100", environ={}), devices=devices)
    assert plan.device == device
    with tf.device(plan.device):  # soft placement: a kind this machine lacks runs on the CPU
        assert float(tf.constant(2.0) * 3.0) == 6.0
