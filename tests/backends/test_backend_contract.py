"""The backend contract: every registered backend through probe, assess, report rows, vendor settings and apply;
and deliberately broken backends, which must never break the others."""

from __future__ import annotations

import json
import re
import types
import warnings

import pytest

from fakes import (AMD_HERE, H100, MAX1550, SAPPHIRE_RAPIDS, KernelAuditRaises, NoKernelAudit, cpu_of, intel,
                   machine, nvidia, plan_of)

from amp_backends.assessment import EMULATED, NATIVE, UNSUPPORTED, Assessment, Support, VendorSetting
from amp_backends.backends.cpu import CpuBackend
from amp_backends.backends.intel import IntelBackend
from amp_backends.backends.nvidia import NvidiaBackend
from amp_backends.commands.capability_report import collect
from amp_backends.configure import auto_configure, plan_for
from amp_backends.errors import AmpConfigError, AmpWarning, BackendError
from amp_backends.hardware import Accelerator, BackendProbe, Hardware
from amp_backends.kernel_audit import KernelAudit, KernelReading
from amp_backends.registry import Backend, BackendRegistry, default_registry

pytestmark = pytest.mark.intel

# Hardware on which each shipped backend is available (a backend of another distribution uses the real machine).
SAMPLES = {
    "nvidia": machine(nvidia(H100), cpu_of(AMD_HERE)),
    "intel": machine(intel(MAX1550), cpu_of(AMD_HERE)),
    "cpu": machine(cpu_of(SAPPHIRE_RAPIDS, itex=True)),
}


class FakeTF:
    """Just enough of ``tensorflow`` for a backend's ``apply``: device listing and visibility, recorded."""

    def __init__(self) -> None:
        self.hidden: list[str] = []
        self.config = types.SimpleNamespace(
            list_physical_devices=lambda kind=None: [],
            set_visible_devices=lambda devices, kind=None: self.hidden.append(kind),
        )


def is_rows(rows) -> bool:
    return isinstance(rows, list) and all(isinstance(r, tuple) and len(r) == 2 and all(isinstance(x, str) for x in r)
                                          for r in rows)


def sample_hardware(backend: Backend) -> Hardware:
    if backend.name in SAMPLES:
        return SAMPLES[backend.name]
    probe = backend.probe()
    if not probe.available:
        pytest.skip(f"backend {backend.name!r} has no sample hardware in these tests and none on this machine "
                    f"({probe.reason})")
    return Hardware((probe, *SAMPLES["cpu"].probes[2:]))


@pytest.fixture(params=default_registry().names())
def backend(request, registry):
    return registry.get(request.param)


def test_probe_returns_plain_data_that_explains_itself(backend):
    probe = backend.probe()  # the real machine, without TensorFlow
    assert isinstance(probe, BackendProbe) and probe.backend == backend.name and probe.error is None
    assert isinstance(probe.reason, str) and probe.reason.strip()
    assert all(isinstance(d, Accelerator) for d in probe.devices) and probe.available == bool(probe.devices)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in probe.details)
    json.dumps(probe.to_dict())
    assert is_rows(backend.report_rows(probe)) and is_rows(backend.software_rows())


def test_assess_answers_every_setting_and_prefers_a_native_policy(backend):
    hardware = sample_hardware(backend)
    probe = hardware.get(backend.name)
    a = backend.assess(probe, hardware)
    assert isinstance(a, Assessment) and a.backend == backend.name and a.contract_errors() == []
    assert a.devices and all(d.startswith("/") for d in a.devices)
    assert backend.assess(probe, hardware) == a  # pure: the same answer twice
    assert is_rows(backend.report_rows(probe))


def test_plan_vendor_settings_and_apply(backend, registry, monkeypatch):
    monkeypatch.setenv("ITEX_FP32_MATH_MODE", "")  # restored after the test: apply may set it
    hardware = sample_hardware(backend)
    plan = plan_of(hardware, registry, backend=backend.name)
    assert plan.backend == backend.name and plan.warnings == () and plan.assessment is not None
    assert all(isinstance(s, VendorSetting) for s in plan.vendor_settings)
    assert backend.vendor_settings(plan) == plan.vendor_settings
    notes = backend.apply(plan, FakeTF())
    assert isinstance(notes, list) and all(isinstance(n, str) for n in notes)
    for setting in plan.vendor_settings:  # a setting the backend names, it applies (and says so)
        assert any(setting.value in n for n in notes), (setting, notes)


def test_a_kernel_audit_is_plain_data_the_audit_can_use(backend):
    """``Backend.kernel_audit``: a fresh `KernelAudit` (or ``None``) whose environment and facts are plain strings
    and JSON, that reads records on standard output only where its process is started to print them."""
    audit = backend.kernel_audit()
    if audit is None:
        pytest.skip(f"the {backend.name} backend reads no kernels: its audits are not measured")
    assert isinstance(audit, KernelAudit) and isinstance(audit.device, str) and audit.device
    assert backend.kernel_audit() is not audit  # its begin/end may keep state: one object per audited run
    assert all(isinstance(name, str) and isinstance(value, str) for name, value in audit.environment)
    assert audit.record_prefix is None or (isinstance(audit.record_prefix, str) and audit.environment)
    assert audit.unavailable is None or audit.unavailable.strip()
    if audit.unavailable is None:
        json.dumps(audit.facts())
        assert audit.capturing(dict(audit.environment))


def test_a_backend_without_a_kernel_audit_is_reported_as_not_measured():
    from amp_backends.auditing.build import not_measured

    registry = BackendRegistry([NoKernelAudit(), KernelAuditRaises(), CpuBackend()])
    assert NoKernelAudit().kernel_audit() is None and registry.kernel_audit("npu") is None
    assert registry.kernel_audit("not registered") is None
    assert registry.audit_environment() == {"ONEDNN_VERBOSE": "1"}  # the broken one adds nothing, breaks nothing
    plan = {"backend": "npu", "policy": "float32", "compute_dtype": "float32", "xla": False}
    d = not_measured("m:f", plan, registry.kernel_audit("npu")).to_dict()
    assert (d["device"], d["measured"], d["source"], d["time_share_by_dtype"]) == ("npu", False, None, {})
    assert d["notes"] == ["not measured: the npu backend does not read what ran"]


# --------------------------------------------------------------------------------------------- broken backends
def native(why="fake") -> Support:
    return Support(NATIVE, why)


class Fake(Backend):
    """A third-party backend with a device, above every shipped backend, that works unless told otherwise."""

    name, priority, tf_device_type = "rocm", 400, None

    def probe(self, *, use_tensorflow=False):
        return BackendProbe(self.name, True, "1 fake GPU", devices=(Accelerator("amd", 0, "MI300X"),))

    def assess(self, probe, hardware):
        return Assessment(self.name, ("/GPU:0",), {p: native() for p in ("float32", "mixed_float16", "mixed_bfloat16")},
                          ("mixed_bfloat16", "float32", "mixed_float16"), Support(UNSUPPORTED, "no"), native(), True)


class AssessRaises(Fake):
    def assess(self, probe, hardware):
        return {}["compute_capability"]


class NoNativePolicy(Fake):
    def assess(self, probe, hardware):
        slow = Support(EMULATED, "emulated")
        return Assessment(self.name, ("/GPU:0",), {p: slow for p in ("float32", "mixed_float16", "mixed_bfloat16")},
                          ("float32",), Support(UNSUPPORTED, "no"), slow, False)


class ProbeRaises(Fake):
    def probe(self, *, use_tensorflow=False):
        raise OSError("libamdhip64.so: cannot open shared object file")


class RowsRaise(Fake):
    def report_rows(self, probe):
        raise RuntimeError("rows broke")

    def software_rows(self):
        raise RuntimeError("software rows broke")


class SettingsRaise(Fake):
    def vendor_settings(self, plan):
        raise ValueError("settings broke")


class ProbeOfAnother(Fake):
    def probe(self, *, use_tensorflow=False):
        return BackendProbe("other", True, "1 fake GPU", devices=(Accelerator("amd", 0, "MI300X"),))


class DevicesAsNames(Fake):
    def probe(self, *, use_tensorflow=False):
        return BackendProbe(self.name, True, "1 fake GPU", devices=("npu0",))


class DeviceWithoutAName(Fake):
    def probe(self, *, use_tensorflow=False):
        return BackendProbe(self.name, True, "1 fake GPU", devices=(Accelerator("amd", 0, None),))


class DetailsNotPairs(Fake):
    def probe(self, *, use_tensorflow=False):
        return BackendProbe(self.name, True, "1 fake GPU", devices=(Accelerator("amd", 0, "MI300X"),),
                            details=("driver",))


class AvailableInWords(Fake):
    def probe(self, *, use_tensorflow=False):
        return BackendProbe(self.name, "yes", "1 fake GPU", devices=(Accelerator("amd", 0, "MI300X"),))


def with_shipped(broken: Backend) -> BackendRegistry:
    return BackendRegistry([NvidiaBackend(), IntelBackend(), CpuBackend(), broken])


@pytest.mark.parametrize("broken,why", [
    (AssessRaises(), "assess() raised KeyError: 'compute_capability'"),
    (NoNativePolicy(), "no native dtype policy"),
    (ProbeRaises(), "probe failed: OSError: libamdhip64.so"),
    (SettingsRaise(), "vendor_settings() raised ValueError: settings broke"),
    # a probe not as the interface says: each said, not an AttributeError in a report or a plan with no device
    (ProbeOfAnother(), "ProbeOfAnother) returned a BackendProbe of backend 'other'; expected its own, 'rocm', as its "
                      "backend. Fix: that backend is at fault"),
    (DevicesAsNames(), "with devices=('npu0',); expected a tuple of Accelerator"),
    (DeviceWithoutAName(), "expected a tuple of Accelerator (a str name and kind, an int index)"),
    (DetailsNotPairs(), "with details=('driver',); expected a tuple of (label, text) pairs of str"),
    (AvailableInWords(), "with available='yes'; expected True or False"),
])
def test_a_broken_backend_is_skipped_named_and_refused_by_name(broken, why):
    reg = with_shipped(broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = auto_configure(registry=reg, apply=False, verbose=False)
    assert plan.backend != "rocm"
    status = next(b for b in plan.backends if b.name == "rocm")
    assert status.failed and not status.available and not status.selected and why in status.reason
    assert any("'rocm'" in str(w.message) and why in str(w.message) for w in caught if w.category is AmpWarning)

    report = collect(registry=reg, use_tensorflow=False, environ={}).data
    assert report["plan_error"] is None and report["plan"]["backend"] == plan.backend
    assert any(why in value for _, value in report["backend_rows"]["rocm"])

    with pytest.raises(BackendError) as err:
        plan_for(registry=reg, environ={"AMP_BACKEND": "rocm"})
    assert "backend=rocm (from AMP_BACKEND) failed: " in str(err.value) and why in str(err.value)
    assert "Fix: unset AMP_BACKEND to plan with the next available backend" in str(err.value)
    named = collect(registry=reg, use_tensorflow=False, environ={"AMP_BACKEND": "rocm"}).data
    assert named["plan"] is None and "BackendError" in named["plan_error"] and why in named["plan_error"]


def test_a_working_third_party_backend_wins_by_priority():
    plan = auto_configure(registry=with_shipped(Fake()), apply=False, verbose=False)
    assert plan.backend == "rocm" and plan.policy == "mixed_bfloat16" and plan.warnings == ()


def test_broken_report_rows_are_shown_not_raised():
    report = collect(registry=with_shipped(RowsRaise()), use_tensorflow=False, environ={}).data
    assert report["backend_rows"]["rocm"] == [["error", "RuntimeError: rows broke"]]
    assert report["software"]["backends"]["rocm"] == [["error", "RuntimeError: software rows broke"]]
    assert report["plan"]["backend"] == "rocm"


def test_a_backend_that_failed_to_load_is_refused_by_name_with_its_reason():
    reg = BackendRegistry([CpuBackend()])
    reg.load_errors["rocm"] = "ImportError: No module named 'rocm_backend'"
    with pytest.warns(AmpWarning, match="backend 'rocm' failed to load: ImportError"):
        assert auto_configure(registry=reg, apply=False, verbose=False).backend == "cpu"
    with pytest.raises(BackendError,
                       match="backend=rocm .*failed to load: ImportError: No module named 'rocm_backend'"):
        plan_for(registry=reg, environ={"AMP_BACKEND": "rocm"})


def test_an_empty_registry_is_planned_with_not_replaced_by_the_installed_backends():
    """A registry given with no backend in it was taken for "none given" (an empty registry is falsy) and the
    installed backends planned instead: the caller's registry is what is planned with, empty or not."""
    from amp_backends.probe import probe_hardware

    empty = "The backend registry given holds no backend.*Fix: leave registry out to plan with the installed"
    with pytest.raises(BackendError, match=empty):
        plan_for(hardware=machine(cpu_of(SAPPHIRE_RAPIDS)), registry=BackendRegistry(), environ={})
    with pytest.raises(BackendError, match=empty):
        plan_for(device="a100", registry=BackendRegistry(), environ={})
    with pytest.raises(BackendError, match=empty):
        auto_configure(registry=BackendRegistry(), apply=False, verbose=False)
    assert probe_hardware(BackendRegistry()).probes == ()
    for wrong in ({}, [], 0):  # was "'dict' object has no attribute 'known_names'", or the installed backends
        with pytest.raises(AmpConfigError, match="registry must be a BackendRegistry or None. Received: "
                                                 + re.escape(f"{wrong!r} (of type {type(wrong).__name__}). Fix: ")):
            plan_for(registry=wrong, environ={})


def test_the_cpu_backend_hides_accelerators_from_a_cpu_plan():
    from amp_backends.backends.cpu.backend import hide_accelerators

    tf = FakeTF()
    tf.config.list_physical_devices = lambda kind=None: ["dev"] if kind == "GPU" else []
    assert hide_accelerators(tf) == "hid GPU devices from TensorFlow for the CPU plan" and tf.hidden == ["GPU"]

    def started(devices, kind=None):
        raise RuntimeError("Visible devices cannot be modified after being initialized")

    tf.config.set_visible_devices = started
    assert "already started its GPU runtime" in hide_accelerators(tf)


# ----------------------------------------------------------------------- a broken catalogue, describe, kernel audit
def rocm_device(backend="rocm"):
    from amp_backends.hardware import KnownDevice

    return KnownDevice("mi300x-fake", ("mi-fake",), backend, "Fake MI300X", "a test", device_name="MI300X")


class CatalogueRaises(Fake):
    def catalogue(self):
        raise RuntimeError("catalogue broke")


class CatalogueOfAnother(Fake):
    def catalogue(self):
        return (rocm_device("nvidia"),)


class NoDescribe(Fake):
    def catalogue(self):
        return (rocm_device(),)


class DescribesInADict(NoDescribe):
    def describe(self, device):
        return {"backend": "rocm"}


class KernelAuditOfJunk(Fake):
    def kernel_audit(self):
        return ["ONEDNN_VERBOSE"]


def test_a_broken_catalogue_is_said_and_leaves_the_others_devices():
    from amp_backends.devices import known_devices

    for broken, said in ((CatalogueRaises(), r"catalogue\(\) \(.*CatalogueRaises\) raised RuntimeError: catalogue "
                                             r"broke: its devices are left out of the device catalogue\. Fix: that "
                                             r"backend is at fault: update or uninstall its package\.$"),
                         (CatalogueOfAnother(), r"catalogue\(\) lists 'mi300x-fake' \(backend 'nvidia'\): expected "
                                                r"KnownDevice entries whose backend is 'rocm' \(the backend that "
                                                r"describes them\); left out of the device catalogue\. Fix: ")):
        with pytest.warns(AmpWarning, match=said):
            names = known_devices(with_shipped(broken))
        assert "h100" in names and "mi300x-fake" not in names  # (it was an NVIDIA plan for the other's device)


@pytest.mark.parametrize("broken, said", [
    (NoDescribe(), "describe() (test_backend_contract.NoDescribe) raised NotImplementedError: the rocm backend lists "
                   "'mi300x-fake' in its catalogue but does not describe it: it implements no describe(device). Fix:"),
    (DescribesInADict(), "describe() (test_backend_contract.DescribesInADict) returned dict (\"{'backend': 'rocm'}\"); "
                         "expected a BackendProbe of the device. Fix: that backend is at fault: update or uninstall "
                         "its package."),
])
def test_a_catalogue_device_its_backend_cannot_describe_is_our_error(broken, said):
    with pytest.raises(BackendError) as err:
        plan_for(device="mi-fake", registry=with_shipped(broken))
    assert f"the rocm backend's {said}" in str(err.value)


def test_a_kernel_audit_of_junk_breaks_no_other_backends_audit():
    registry = with_shipped(KernelAuditOfJunk())
    assert registry.audit_environment() == {"ONEDNN_VERBOSE": "1"}  # the cpu backend's, as without it
    with pytest.raises(BackendError, match=r"kernel_audit\(\) .* returned list .*; expected a KernelAudit or None"):
        registry.kernel_audit("rocm")


def test_a_backend_without_a_name_or_priority_is_refused_saying_both():
    class NoPriority(Fake):
        priority = None

    with pytest.raises(AmpConfigError, match=r"A Backend sets name \(a str, as backend= takes it\) and priority \(an "
                                             r"int.* Received: NoPriority with name='rocm', priority=None\. Fix: "):
        BackendRegistry([NoPriority()])


@pytest.mark.parametrize("read, said", [
    (lambda capture: 1 / 0, "read) raised ZeroDivisionError: division by zero. Fix: that backend is at fault"),
    (lambda capture: [], "read) returned list; expected a KernelReading whose records are a tuple of KernelRecord"),
    (lambda capture: KernelReading("npu", (("convolution", "bf16"),)),
     "read) returned records=(('convolution', 'bf16'),); expected a KernelReading whose records are a tuple"),
])
def test_what_a_kernel_audit_reads_is_checked_as_our_error(read, said):
    """A reading that is not a KernelReading of KernelRecord was an AttributeError deep in the audit's counting."""
    from amp_backends.auditing.build import read_kernels
    from amp_backends.kernel_audit import Capture

    audit = KernelAudit()
    audit.read = read
    with pytest.raises(BackendError) as err:
        read_kernels(audit, Capture((), (), {}, None), "npu")
    assert str(err.value).startswith("the npu backend's kernel audit (amp_backends.kernel_audit.KernelAudit.read")
    assert said in str(err.value)


def test_a_backend_tensorflow_does_not_list_says_why_in_the_plan_row(monkeypatch):
    """Its hardware rows say "available"; the plan's row said only "unavailable", the reason in the JSON alone."""
    from amp_backends import probe
    from amp_backends.commands.capability_report import _plan_rows

    class Listed(Fake):
        tf_device_type = "NPU"

    monkeypatch.setattr(probe, "tensorflow_device_types", lambda: frozenset({"CPU"}))
    data = collect(registry=with_shipped(Listed()), use_tensorflow=False, environ={}).data
    (row, *_), _ = _plan_rows(data, why=False)
    assert ("rocm: unavailable (1 fake GPU, but TensorFlow lists no NPU device (a CPU-only TensorFlow build, missing "
            "device libraries or a plugin that did not load): check that TensorFlow lists it, with "
            "tf.config.list_physical_devices('NPU')), nvidia: unavailable,") in row[2]


def test_an_audit_that_read_no_compute_kernel_says_so():
    """It printed its headline alone: no table, no shares, no word of why."""
    from amp_backends.auditing.build import from_reading
    from amp_backends.kernel_audit import KernelRecord

    reading = KernelReading("npu", (KernelRecord("copy", "float32", "DMA", 0.5, False),
                                    KernelRecord("reorder", "bfloat16", "DMA", 0.2, False)))
    text = from_reading(reading, {"model": "m:f", "plan": {"backend": "npu"}}).render()
    assert "no compute kernel (matmul, convolution) among the 2 kernel records read: nothing to count by dtype" in text
    empty = from_reading(KernelReading("npu", ()), {"model": "m:f", "plan": {"backend": "npu"}}).render()
    assert "no kernel record was read from the run: nothing to count" in empty and "among the 0" not in empty


def test_a_float32_island_of_no_layer_says_unmatched_once():
    from amp_backends.auditing.build import from_reading
    from amp_backends.kernel_audit import KernelRecord

    reading = KernelReading("npu", (KernelRecord("gemm", "float32", "MXU", 1.0, True),
                                    KernelRecord("gemm", "bfloat16", "MXU", 3.0, True)))
    text = from_reading(reading, {"model": "m:f", "plan": {"backend": "npu", "policy": "mixed_bfloat16",
                                                           "compute_dtype": "bfloat16"}}).render()
    assert "float32 island: no layer of that shape (unmatched): 25.0% of compute time in gemm" in text, text
