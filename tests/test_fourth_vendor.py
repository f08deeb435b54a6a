"""A vendor the package does not ship, installed beside it through the entry-point group, is planned and catalogued.

The fake vendor is a distribution of its own on ``PYTHONPATH`` (a module and its ``.dist-info`` with an
``entry_points.txt``), as a third party would ship one: nothing in ``amp_backends`` names it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import NEUTRAL_CWD

pytestmark = pytest.mark.intel  # the registry and the plan, as TF 2.15's session runs them (no TensorFlow here)

VENDOR = textwrap.dedent('''
    from amp_backends.backend_api import (BF16, GB, NATIVE, UNSUPPORTED, Accelerator, Assessment, Backend,
                                          BackendProbe, KnownDevice, Support)

    NPU = KnownDevice("npu9000", ("fake-npu", "npu-9000"), "fakenpu", "Fake NPU 9000 16 GB", "the vendor's sheet",
                      device_name="Fake NPU 9000", memory_bytes=16 * GB)


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
            npu = Accelerator("fakenpu", 0, device.device_name, "NPU", None, device.memory_bytes, frozenset({BF16}))
            return BackendProbe("fakenpu", True, f"1 NPU: {npu.name}", devices=(npu,))
''')

CHECK = textwrap.dedent('''
    import amp_backends
    from amp_backends.devices import find_device

    names = amp_backends.known_devices()
    assert names[0] == "npu9000" and "h100" in names and "zen3" in names, names
    assert find_device("Fake NPU").backend == "fakenpu"
    plan = amp_backends.plan_for(device="npu-9000")
    assert plan.backend == "fakenpu" and plan.policy == "mixed_bfloat16", plan
    assert amp_backends.plan_for(device="h100").backend == "nvidia"   # the shipped vendors are unchanged
    assert amp_backends.plan_for().backend != "fakenpu"               # this machine has no Fake NPU
    print("ok", plan.summary())
''')


def test_a_fourth_vendor_from_its_own_distribution_is_catalogued_and_planned(tmp_path):
    (tmp_path / "fake_npu_vendor.py").write_text(VENDOR)
    info = tmp_path / "fake_npu_vendor-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-npu-vendor\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[amp_backends.backends]\nfakenpu = fake_npu_vendor:FakeNpuBackend\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, env=env,
                          cwd=NEUTRAL_CWD)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]
