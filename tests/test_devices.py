"""The device catalogue: a plan for hardware this machine does not have, by name."""

from __future__ import annotations

import pytest

from amp_backends.configure import known_devices, plan_for
from amp_backends.devices import CATALOGUE, device_hardware, find_device
from amp_backends.errors import AmpConfigError
from amp_backends.software import KerasInfo

pytestmark = pytest.mark.intel

KERAS3 = KerasInfo("3.15.1", 3, "keras")

# device, backend, policy, loss scale, tf32, xla, vendor settings — as the decision table (docs/concepts.md) says
EXPECTED = [
    ("v100", "nvidia", "mixed_float16", "dynamic", False, True, {}),
    ("t4", "nvidia", "mixed_float16", "dynamic", False, True, {}),
    ("a100", "nvidia", "mixed_float16", "dynamic", True, True, {}),
    ("a100-40gb", "nvidia", "mixed_float16", "dynamic", True, True, {}),
    ("l4", "nvidia", "mixed_float16", "dynamic", True, True, {}),
    ("rtx4090", "nvidia", "mixed_float16", "dynamic", True, True, {}),
    ("h100", "nvidia", "mixed_float16", "dynamic", True, True, {}),
    ("h200", "nvidia", "mixed_float16", "dynamic", True, True, {}),
    ("b200", "nvidia", "mixed_float16", "dynamic", True, True, {}),
    ("max1550", "intel", "mixed_bfloat16", "none", True, False, {"ITEX_FP32_MATH_MODE": "TF32"}),
    ("flex170", "intel", "mixed_bfloat16", "none", False, False, {}),
    ("arc-a770", "intel", "mixed_bfloat16", "none", False, False, {}),
    ("sapphire-rapids", "cpu", "mixed_bfloat16", "none", False, False, {}),
    ("zen1", "cpu", "float32", "none", False, False, {}),
    ("zen3", "cpu", "float32", "none", False, False, {}),
    ("zen4", "cpu", "mixed_bfloat16", "none", False, False, {}),
    ("zen5", "cpu", "mixed_bfloat16", "none", False, False, {}),
    ("graviton3", "cpu", "mixed_bfloat16", "none", False, False, {}),
]


def test_the_catalogue_holds_the_devices_users_ask_for():
    assert set(known_devices()) == {e[0] for e in EXPECTED}
    assert len(set(known_devices())) == len(CATALOGUE)


@pytest.mark.parametrize("name,backend,policy,loss,tf32,xla,settings", EXPECTED, ids=[e[0] for e in EXPECTED])
def test_a_plan_for_each_catalogue_device(registry, name, backend, policy, loss, tf32, xla, settings):
    p = plan_for(device=name, registry=registry, environ={}, keras=KERAS3)
    assert (p.backend, p.policy, p.loss_scale.mode, p.tf32, p.xla) == (backend, policy, loss, tf32, xla)
    assert {s.name: s.value for s in p.vendor_settings} == settings
    assert p.warnings == () and p.fp8 is False and all(p.reasons.values())
    chosen = next(b for b in p.backends if b.selected)
    assert chosen.name == backend and "catalogue" in chosen.reason


def test_fp8_is_native_where_the_catalogue_says_cc_8_9_or_more(registry):
    for name in ("l4", "rtx4090", "h100", "h200", "b200"):
        assert plan_for(device=name, registry=registry, environ={}, keras=KERAS3, fp8="on").fp8 is True, name
    for name in ("v100", "t4", "a100"):
        p = plan_for(device=name, registry=registry, environ={}, keras=KERAS3, fp8="on")
        assert p.fp8 is False and "fp8=on" in p.warnings[0], name


def test_every_device_says_where_its_figures_come_from():
    for device in CATALOGUE:
        assert "https://" in device.source, device.name
        hw = device_hardware(device.name)
        probe = hw.get(device.backend)
        assert probe is not None and probe.available and probe.detail("catalogue") == device.source
        assert device.to_dict()["source"] == device.source


def test_catalogue_devices_carry_the_vendor_figures():
    from amp_backends.backends.nvidia import compute_capability

    h100 = device_hardware("h100").get("nvidia").devices[0]
    assert (h100.name, compute_capability(h100), h100.memory_bytes) == ("NVIDIA H100 80GB HBM3", (9, 0), 80 * 2**30)
    assert compute_capability(find_device("h100")) == (9, 0)
    assert "fp8" in h100.capabilities and "tf32" in h100.capabilities
    assert "tensor_cores" in device_hardware("t4").get("nvidia").devices[0].capabilities
    spr = device_hardware("sapphire-rapids").cpu
    assert spr is not None and spr.amx and spr.native_bf16 and spr.native_fp16
    assert device_hardware("graviton3").cpu.is_arm
    assert "xmx" in device_hardware("arc-a770").get("intel").devices[0].capabilities


def test_an_arm_cpus_bf16_reason_quotes_no_x86_figure():
    """A Graviton3's plan said '~2.2x float32's speed where measured': the figure of an x86 CPU (AVX512-BF16)."""
    import amp_backends

    arm = amp_backends.plan_for(device="graviton3", environ={})
    line = next(x for x in arm.brief().splitlines() if x.startswith("  policy: "))
    assert line == "  policy: mixed_bfloat16 - bf16 instructions (bf16) with oneDNN; no Arm CPU measured"
    x86 = amp_backends.plan_for(device="zen5", environ={})
    assert "float32's speed where measured" in next(x for x in x86.brief().splitlines() if x.startswith("  policy: "))


def test_the_compute_capability_is_a_fact_the_nvidia_backend_states_and_reads(registry):
    """The generic devices carry NVIDIA's compute capability as a `DeviceFact`; the JSON, the labels and the cache key
    read as before: ``"compute_capability": "9.0"``, ``"NVIDIA H100 80GB HBM3 (CC 9.0)"``, ``".../9.0"``."""
    from amp_backends.autotune import device_signature
    from amp_backends.backends.nvidia import COMPUTE_CAPABILITY, capability_facts, compute_capability
    from amp_backends.commands.bench.output import environment
    from amp_backends.commands.capability_report import collect

    hw = device_hardware("h100")
    h100 = hw.get("nvidia").devices[0]
    assert h100.facts == capability_facts((9, 0)) == find_device("h100").facts and capability_facts(None) == ()
    assert h100.fact(COMPUTE_CAPABILITY) == "9.0" and compute_capability(h100) == (9, 0)
    assert list(h100.to_dict()) == ["vendor", "index", "name", "kind", "compute_capability", "memory_bytes",
                                    "capabilities", "pci_bus_id"] and h100.to_dict()["compute_capability"] == "9.0"
    assert h100.label == "NVIDIA H100 80GB HBM3 (CC 9.0)" and h100.description == "CC 9.0"
    plan = plan_for(device="h100", registry=registry, environ={}, keras=KERAS3)
    assert device_signature(plan, hw).split("|")[:2] == ["nvidia", "NVIDIA H100 80GB HBM3/9.0"]
    report = collect(use_tensorflow=False, environ={}, device="h100")
    assert environment(report)["devices"] == ["NVIDIA H100 80GB HBM3 (CC 9.0)"]
    xpu = device_hardware("max1550").get("intel").devices[0]
    assert xpu.facts == () and xpu.fact(COMPUTE_CAPABILITY) is None and compute_capability(xpu) is None
    assert xpu.to_dict()["compute_capability"] is None and xpu.label == xpu.name and xpu.signature == f"{xpu.name}/-"


def test_the_old_compute_capability_attributes_work_for_a_release_with_a_deprecation_warning():
    from amp_backends.backends.nvidia import capability_facts, gpu_device
    from amp_backends.hardware import Accelerator, KnownDevice

    a100 = gpu_device(0, "NVIDIA A100-SXM4-40GB", (8, 0))
    with pytest.warns(DeprecationWarning, match=r"\.compute_capability is deprecated") as caught:
        assert a100.compute_capability == (8, 0) and find_device("h100").compute_capability == (9, 0)
        assert gpu_device(0, "GPU of unknown CC", None).compute_capability is None
    assert len(caught) == 3 and {w.filename for w in caught} == {__file__}  # the warning names the caller's line
    with pytest.warns(DeprecationWarning, match="cc_str is deprecated"):
        assert a100.cc_str == "8.0"
    # a compute capability (or None) where the facts now go: the old positional form, turned into the facts
    with pytest.warns(DeprecationWarning, match="not its compute capability") as caught:
        assert Accelerator("nvidia", 0, a100.name, "GPU", (8, 0), None, a100.capabilities) == a100
        xpu = Accelerator("intel", 0, "Intel(R) Arc(TM) A770 Graphics", "XPU", None, 16)
        entry = KnownDevice("p100", (), "nvidia", "P100", "its sheet", "Tesla P100-PCIE-16GB", (6, 0), 16)
    assert {w.filename for w in caught} == {__file__}
    assert xpu.facts == () and xpu.memory_bytes == 16
    assert entry.facts == capability_facts((6, 0)) and entry.memory_bytes == 16
    with pytest.raises(AmpConfigError, match="facts must be a tuple of DeviceFact. Received: '9.0'"):
        Accelerator("nvidia", 0, a100.name, "GPU", "9.0")


@pytest.mark.parametrize("alias,name", [
    ("H100", "h100"), ("NVIDIA H100", "h100"), ("a100-80gb", "a100"), ("A100_80GB", "a100"), ("A100-40GB", "a100-40gb"),
    ("rtx 4090", "rtx4090"), ("RTX-4090", "rtx4090"), ("SPR", "sapphire-rapids"), ("Max 1550", "max1550"),
    ("arc a770", "arc-a770"), ("Graviton-3", "graviton3"),
])
def test_names_are_case_insensitive_with_aliases(alias, name):
    assert find_device(alias).name == name


def test_an_unknown_device_lists_the_known_ones(registry):
    with pytest.raises(AmpConfigError, match="Unknown device 'h800'") as err:
        plan_for(device="h800", registry=registry, environ={})
    assert all(name in str(err.value) for name in known_devices())
    with pytest.raises(AmpConfigError, match="Known devices: v100"):
        find_device("")


def test_hardware_and_device_together_are_refused(registry):
    with pytest.raises(AmpConfigError, match="hardware or device, not both"):
        plan_for(device_hardware("t4"), device="h100", registry=registry, environ={})


def test_overrides_apply_to_a_catalogue_plan(registry):
    p = plan_for(device="h100", registry=registry, environ={}, policy="bf16")
    assert p.policy == "mixed_bfloat16" and p.loss_scale.mode == "none" and p.warnings == ()
    v100 = plan_for(device="v100", registry=registry, environ={}, policy="bf16")
    assert v100.policy == "mixed_float16" and "CC >= 8.0" in v100.warnings[0]


@pytest.mark.tensorflow
def test_configure_for_device_sets_only_the_devices_dtype_policy(registry):
    tf = pytest.importorskip("tensorflow")
    from amp_backends import keras_compat
    from amp_backends.configure import configure_for_device, current_plan

    tf32_before, jit_before = tf.config.experimental.tensor_float_32_execution_enabled(), tf.config.optimizer.get_jit()
    plan = configure_for_device("H100", registry=registry, environ={})
    assert plan.policy == "mixed_float16" and keras_compat.global_policy_name(tf) == "mixed_float16"
    layer = tf.keras.layers.Dense(2)
    layer.build((None, 3))
    assert layer.compute_dtype == "float16"  # built as on an H100
    assert tf.config.experimental.tensor_float_32_execution_enabled() == tf32_before  # this machine's settings stay
    assert tf.config.optimizer.get_jit() == jit_before and current_plan() is None
    with pytest.raises(AmpConfigError, match="Unknown device"):
        configure_for_device("h800", registry=registry, environ={})


@pytest.mark.tensorflow
def test_auto_configure_after_configure_for_device_sets_this_machines_policy_again(registry):
    """model.md's sequence: auto_configure(), configure_for_device("h100"), auto_configure() "this machine's plan
    again" returned the cached plan without setting its policy back: models built next stayed in float16 on a CPU,
    and prepare_model and the trainer trained them there."""
    tf = pytest.importorskip("tensorflow")
    from amp_backends import keras_compat
    from amp_backends.configure import auto_configure, configure_for_device, reset

    reset()
    try:
        here = auto_configure(registry=registry, verbose=False, policy="float32")
        configure_for_device("h100", registry=registry, environ={})
        assert keras_compat.global_policy_name(tf) == "mixed_float16"
        assert auto_configure(registry=registry, verbose=False, policy="float32") is here  # the same plan
        assert keras_compat.global_policy_name(tf) == "float32"
        layer = tf.keras.layers.Dense(2)
        layer.build((None, 3))
        assert layer.compute_dtype == "float32"
    finally:
        reset()
        keras_compat.set_global_policy("float32", tf)


def test_plan_for_warns_of_a_request_it_downgrades_as_auto_configure_does():
    """concepts.md: a request that cannot be honoured is downgraded with an AmpWarning, for plan_for too (it
    used to say so only in the plan's text)."""
    from amp_backends.errors import AmpWarning

    with pytest.warns(AmpWarning, match="policy=mixed_bfloat16 .*downgraded"):
        assert plan_for(device="v100", policy="bf16").policy == "mixed_float16"
    with pytest.warns(AmpWarning, match="tf32=on .*downgraded"):
        assert plan_for(device="t4", tf32="on").tf32 is False


# -- a backend of one's own, tried with a registry before it is installed (docs/backends.md) ---------------------
def _npu_backend(name: str = "fakenpu", priority: int = 400, device: str = "npu-x", aliases: tuple = (),
                 assess_fails: bool = False, matrix_unit: int = 0):
    from amp_backends.backend_api import (BF16, NATIVE, UNSUPPORTED, Accelerator, Assessment, Backend, BackendProbe,
                                          KnownDevice, MatrixUnit, Support)

    entry = KnownDevice(device, aliases, name, f"{device} title", "https://example.com/npu", device_name=device)

    class Npu(Backend):
        tf_device_type = "NPU"

        def probe(self, *, use_tensorflow=False):
            return BackendProbe(name, False, "no NPU here")

        def assess(self, probe, hardware):
            if assess_fails:
                raise ValueError("the NPU driver table is broken")
            fast = Support(NATIVE, "bf16 units")
            return Assessment(name, ("/NPU:0",), {"float32": Support(NATIVE, "f32"), "mixed_bfloat16": fast,
                                                  "mixed_float16": Support(UNSUPPORTED, "none")},
                              ("mixed_bfloat16", "float32"), Support(UNSUPPORTED, "no"), Support(NATIVE, "xla"), True,
                              matrix_units={"bfloat16": MatrixUnit("FakeMXU", matrix_unit)} if matrix_unit else {})

        def catalogue(self):
            return (entry,)

        def describe(self, device):  # (no cite: the catalogue adds the source)
            npu = Accelerator(name, 0, device.device_name, "NPU", capabilities=frozenset({BF16}))
            return BackendProbe(name, True, f"1 NPU: {npu.name}", devices=(npu,))

    Npu.name, Npu.priority = name, priority
    return Npu()


def test_a_registry_of_ones_own_plans_its_catalogue_devices_and_cites_their_source(registry):
    """plan_for(device=..., registry=reg) looked the device up in the installed backends' catalogue, not reg's:
    a backend could not be tried before it was installed."""
    from amp_backends.backend_api import BackendRegistry
    from amp_backends.devices import known_devices as names_in

    reg = BackendRegistry([_npu_backend(), registry.get("cpu")])
    assert names_in(reg)[0] == "npu-x" and "h100" not in names_in(reg)
    plan = plan_for(device="npu-x", registry=reg, environ={}, keras=KERAS3)
    assert (plan.backend, plan.policy) == ("fakenpu", "mixed_bfloat16")
    probe = device_hardware("npu-x", reg).get("fakenpu")
    assert probe.reason.endswith("[catalogue: https://example.com/npu]") and probe.detail("catalogue")
    assert plan_for(registry=reg, environ={}, keras=KERAS3).backend == "cpu"  # no NPU in this machine


def test_a_name_two_backends_list_is_the_higher_prioritys_device(registry):
    """A lower-priority backend's "h100" was listed twice and won find_device, its aliases too, silently."""
    from amp_backends.backend_api import BackendRegistry
    from amp_backends.devices import known_devices as names_in

    low = _npu_backend("lowvendor", 50, "h100", aliases=("spr", "own-alias"))
    reg = BackendRegistry([*registry, low])
    assert names_in(reg).count("h100") == 1
    assert find_device("h100", reg).backend == "nvidia" and find_device("spr", reg).backend == "cpu"
    high = BackendRegistry([*registry, _npu_backend("highvendor", 500, "h100", aliases=("npu-h",))])
    assert find_device("h100", high).backend == "highvendor" and find_device("H100", high).backend == "highvendor"


def test_a_catalogue_device_whose_backend_fails_says_which_backend_to_repair(registry):
    from amp_backends.backend_api import BackendRegistry
    from amp_backends.errors import BackendError

    reg = BackendRegistry([_npu_backend(assess_fails=True), registry.get("cpu")])
    with pytest.raises(BackendError, match=r"fakenpu: failed: .*driver table is broken.*Fix: repair or uninstall "
                                           r"the distribution providing 'fakenpu'"):
        plan_for(device="npu-x", registry=reg, environ={}, keras=KERAS3)


def test_a_backends_matrix_unit_alignment_is_said_in_its_dtypes_bytes(registry):
    """The shape finding said "(16 bytes)" whatever the unit: 32 bfloat16 elements are 64 bytes."""
    tf = pytest.importorskip("tensorflow")
    from amp_backends.backend_api import BackendRegistry
    from amp_backends.model_check import check_model

    reg = BackendRegistry([_npu_backend(matrix_unit=32), registry.get("cpu")])
    plan = plan_for(device="npu-x", registry=reg, environ={}, keras=KERAS3)
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = tf.keras.Sequential([tf.keras.Input((96,)), tf.keras.layers.Dense(100), tf.keras.layers.Dense(8)])
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    text = check_model(model, plan, inputs=(64, 96)).render(width=300)
    assert "only on multiples of 32 (64 bytes)" in text and "16 bytes" not in text, text
    assert "(FakeMXU for bfloat16)" in text and "()" not in text, text


def test_a_summary_without_a_matrix_unit_for_the_models_dtypes_shows_no_empty_parentheses(registry):
    tf = pytest.importorskip("tensorflow")
    from amp_backends.model_check import check_model

    plan = plan_for(device="sapphire-rapids", registry=registry, environ={}, keras=KERAS3, policy="fp32", tf32="on")
    model = tf.keras.Sequential([tf.keras.Input((96,)), tf.keras.layers.Dense(100), tf.keras.layers.Dense(8)])
    text = check_model(model, plan, inputs=(64, 96)).render(width=300)
    assert "on shapes the matrix units run at full efficiency" in text and "()" not in text, text
