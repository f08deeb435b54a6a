"""The Intel GPUs of the device catalogue, for ``plan_for(device="max1550")``, run under ITEX 2.15 with TensorFlow
2.15; each entry's name and memory come from Intel's product specifications, named in its ``source``.
"""

from __future__ import annotations

from amp_backends.backend_api import GB, KnownDevice


def _intel(name: str, aliases: tuple[str, ...], title: str, device_name: str, memory_gb: float,
           source: str) -> KnownDevice:
    return KnownDevice(name, aliases, "intel", title, source, device_name, memory_bytes=int(memory_gb * GB),
                       note="planned through ITEX 2.15 (end-of-life; TensorFlow 2.15, Keras 2)")


CATALOGUE: tuple[KnownDevice, ...] = (
    _intel("max1550", ("max-1550", "data-center-gpu-max-1550", "ponte-vecchio", "pvc"),
           "Intel Data Center GPU Max 1550 128 GB HBM2e", "Intel(R) Data Center GPU Max 1550", 128,
           "Intel Data Center GPU Max 1550 product specifications, https://ark.intel.com (Xe-HPC, XMX with TF32)"),
    _intel("flex170", ("flex-170", "data-center-gpu-flex-170"), "Intel Data Center GPU Flex 170 16 GB",
           "Intel(R) Data Center GPU Flex 170", 16,
           "Intel Data Center GPU Flex 170 product specifications, https://ark.intel.com (Xe-HPG, XMX)"),
    _intel("arc-a770", ("a770", "arc-a770-16gb"), "Intel Arc A770 Graphics 16 GB", "Intel(R) Arc(TM) A770 Graphics", 16,
           "Intel Arc A770 Graphics (16GB) product specifications, https://ark.intel.com (Xe-HPG, XMX)"),
)
