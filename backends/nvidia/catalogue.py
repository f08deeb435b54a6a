"""The NVIDIA GPUs of the device catalogue, for ``plan_for(device="h100")``: each entry's name, compute capability
and memory come from NVIDIA's datasheet or specification page, named in its ``source``.
"""

from __future__ import annotations

from amp_backends.backend_api import GB, KnownDevice

from .capability import capability_facts


CUDA_GPUS = "NVIDIA, CUDA GPU compute capability list, https://developer.nvidia.com/cuda-gpus"


def _nvidia(name: str, aliases: tuple[str, ...], title: str, device_name: str, cc: tuple[int, int], memory_gb: float,
            source: str, note: str = "") -> KnownDevice:
    return KnownDevice(name, aliases, "nvidia", title, f"{source}; compute capability: {CUDA_GPUS}", device_name,
                       capability_facts(cc), int(memory_gb * GB), note=note)


CATALOGUE: tuple[KnownDevice, ...] = (
    _nvidia("v100", ("tesla-v100", "v100-32gb", "v100-sxm2"), "NVIDIA Tesla V100 SXM2 32 GB", "Tesla V100-SXM2-32GB",
            (7, 0), 32, "NVIDIA Tesla V100 datasheet, https://www.nvidia.com/en-us/data-center/v100/"),
    _nvidia("t4", ("tesla-t4",), "NVIDIA T4 16 GB", "Tesla T4", (7, 5), 16,
            "NVIDIA T4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/tesla-t4/"),
    _nvidia("a100", ("a100-80gb", "a100-sxm4-80gb", "a100-sxm"), "NVIDIA A100 SXM4 80 GB", "NVIDIA A100-SXM4-80GB",
            (8, 0), 80, "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/a100/"),
    _nvidia("a100-40gb", ("a100-sxm4-40gb",), "NVIDIA A100 SXM4 40 GB", "NVIDIA A100-SXM4-40GB", (8, 0), 40,
            "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/a100/"),
    _nvidia("l4", ("nvidia-l4",), "NVIDIA L4 24 GB", "NVIDIA L4", (8, 9), 24,
            "NVIDIA L4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/l4/"),
    _nvidia("rtx4090", ("rtx-4090", "geforce-rtx-4090", "4090"), "NVIDIA GeForce RTX 4090 24 GB",
            "NVIDIA GeForce RTX 4090", (8, 9), 24,
            "NVIDIA GeForce RTX 4090 specifications, https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4090/"),
    _nvidia("h100", ("h100-80gb", "h100-sxm", "h100-sxm5", "nvidia-h100"), "NVIDIA H100 SXM5 80 GB HBM3",
            "NVIDIA H100 80GB HBM3", (9, 0), 80,
            "NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/ "
            "(name and CC as NVML reported them on an H100 80GB HBM3)"),
    _nvidia("h200", ("h200-141gb", "h200-sxm", "nvidia-h200"), "NVIDIA H200 SXM 141 GB HBM3e", "NVIDIA H200",
            (9, 0), 141,
            "NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/"),
    _nvidia("b200", ("hgx-b200", "nvidia-b200"), "NVIDIA B200 (HGX B200) 180 GB HBM3e", "NVIDIA B200", (10, 0), 180,
            "NVIDIA HGX B200 datasheet (180 GB per GPU), https://www.nvidia.com/en-us/data-center/hgx/",
            note="TensorFlow 2.21's CUDA 12 wheels may need to JIT-compile their kernels for CC 10.0 at first use"),
)
