"""What a backend author needs: the interface a vendor backend implements and the data it fills and reads.

A backend is a `Backend` registered in the ``amp_backends.backends`` entry point group: it probes its hardware
(a `BackendProbe`), assesses it (an `Assessment`), names and applies its `VendorSetting` values, and tells the
audit how to read its kernels (a `KernelAudit`); `make_plan` decides the `Plan`. A training script needs none of
this. Everything here is plain data and pure functions: importing it imports no TensorFlow.
"""

from __future__ import annotations

from .assessment import (EMULATED, FUNCTIONAL, LEVELS, NATIVE, UNSAFE, UNSUPPORTED, Assessment, Float32Layer,
                         MatrixUnit, PeerVerdict, Support, VendorSetting)
from .errors import AmpConfigError, BackendError, warn
from .evidence import RESULTS_DIR, Evidence, Results, load_results, quote_results, results_evidence
from .hardware import (BF16, FP8, FP16, GB, TENSOR_CORES, TF32, XMX, Accelerator, BackendProbe, CpuInfo,
                       DeviceFact, Hardware, KnownDevice)
from .kernel_audit import CONVOLUTION, INNER_PRODUCT, MATMUL, Capture, KernelAudit, KernelReading, KernelRecord
from .plan import BackendStatus, Plan, Rejected
from .planner import make_plan
from .probe import probe_hardware
from .registry import Backend, BackendRegistry, Peer, default_registry
from .request import LossScale, Request, build_request
from .software import installed_version, minor_version, tensorflow_version

__all__ = [
    # the interface and its registry
    "Backend", "BackendRegistry", "Peer", "default_registry",
    # what a probe fills: the devices, the capability tags and the vendor's facts they carry
    "Accelerator", "BackendProbe", "CpuInfo", "DeviceFact", "Hardware", "probe_hardware",
    "BF16", "FP8", "FP16", "TENSOR_CORES", "TF32", "XMX",
    # what an assessment says, and its support levels
    "Assessment", "Evidence", "Float32Layer", "MatrixUnit", "PeerVerdict", "Support", "VendorSetting",
    "EMULATED", "FUNCTIONAL", "LEVELS", "NATIVE", "UNSAFE", "UNSUPPORTED",
    # the committed measurements a reason quotes
    "RESULTS_DIR", "Results", "load_results", "quote_results", "results_evidence",
    # the device catalogue: a backend's entries (Backend.catalogue, Backend.describe)
    "GB", "KnownDevice",
    # the audit: how a backend reads the kernels that ran (Backend.kernel_audit)
    "Capture", "KernelAudit", "KernelReading", "KernelRecord", "CONVOLUTION", "INNER_PRODUCT", "MATMUL",
    # planning: the request, the planner, the plan and its parts
    "BackendStatus", "LossScale", "Plan", "Rejected", "Request", "build_request", "make_plan",
    # the installed software, read without importing it
    "installed_version", "minor_version", "tensorflow_version",
    # the errors a backend raises: a value it cannot take (a file it cannot read), its own failure; its warnings
    "AmpConfigError", "BackendError", "warn",
]
