"""The CPUs of the device catalogue, for ``plan_for(device="zen3")``: each named as ``/proc/cpuinfo`` would (with
CPUID's family and model, from which the probe names the microarchitecture), with its sources; a described CPU
runs TensorFlow 2.21 on Linux with ``TF_ENABLE_ONEDNN_OPTS`` unset and no ITEX.
"""

from __future__ import annotations

from amp_backends.backend_api import KnownDevice


def _cpu(name: str, aliases: tuple[str, ...], title: str, vendor: str, model: str, arch: str, cores: int, flags: str,
         source: str, note: str = "", cpuid: tuple[int, int] | None = None) -> KnownDevice:
    return KnownDevice(name, aliases, "cpu", title, source, model, cpu_vendor=vendor, arch=arch, logical_cores=cores,
                       flags=flags, note=note, family=cpuid[0] if cpuid else None,
                       model_number=cpuid[1] if cpuid else None)


CATALOGUE: tuple[KnownDevice, ...] = (
    _cpu("sapphire-rapids", ("spr", "xeon-8480", "xeon-platinum-8480+", "xeon-8480+"),
         "Intel Xeon Platinum 8480+ (Sapphire Rapids), one socket", "Intel", "Intel(R) Xeon(R) Platinum 8480+",
         "x86_64", 112,
         "avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8",
         "Intel Xeon Platinum 8480+ product specifications, https://ark.intel.com (56 cores, 112 threads; AMX, "
         "AVX-512 with BF16 and FP16: Intel Architecture Instruction Set Extensions Programming Reference); "
         "family 6 model 0x8F: Linux's intel-family.h", cpuid=(6, 0x8F)),
    _cpu("zen1", ("amd-zen1", "epyc-zen1", "naples", "epyc-7001"),
         "AMD EPYC 7001 (Zen 1): AVX2, no AVX-512, no bf16 instructions, 2 logical cores",
         "AMD", "AMD EPYC", "x86_64", 2, "avx2 fma f16c",
         "AMD EPYC 7001 Series (Zen 1) product brief, https://www.amd.com/en/products/processors/server/epyc/"
         "7001-series.html; flags as /proc/cpuinfo lists them on the project's Zen 1 machines; family 0x17 model "
         "0x01: Linux's arch/x86/kernel/cpu/amd.c", cpuid=(0x17, 0x01)),
    _cpu("zen3", ("amd-zen3", "epyc-zen3", "milan", "epyc-7003"),
         "AMD EPYC 7003 (Zen 3): AVX2, no AVX-512, no bf16 instructions, 2 logical cores",
         "AMD", "AMD EPYC", "x86_64", 2, "avx2 fma f16c",
         "AMD EPYC 7003 Series (Zen 3) product brief, https://www.amd.com/en/products/processors/server/epyc/"
         "7003-series.html; flags as /proc/cpuinfo lists them on the project's Zen 3 machine; family 0x19 model "
         "0x01: Linux's arch/x86/kernel/cpu/amd.c", cpuid=(0x19, 0x01)),
    _cpu("zen4", ("amd-zen4", "epyc-zen4", "genoa", "epyc-9004"),
         "AMD EPYC 9004 (Zen 4), 2 logical cores as measured here", "AMD", "AMD EPYC", "x86_64", 2,
         "avx2 fma avx512f avx512bw avx512vl avx_vnni avx512_vnni avx512_bf16",
         "AMD EPYC 9004 Series (Zen 4) product brief, https://www.amd.com/en/products/processors/server/epyc/"
         "4th-generation-9004-and-8004-series.html; "
         "flags as /proc/cpuinfo lists them on the project's AVX512-BF16 machine; family 0x19 model 0x11: AMD's "
         "Processor Programming Reference for Family 19h Model 11h (EPYC 9004)", cpuid=(0x19, 0x11)),
    _cpu("zen5", ("amd-zen5", "epyc-zen5", "turin", "epyc-9005"),
         "AMD EPYC 9005 (Zen 5): AVX-512 with BF16, no AMX, 2 logical cores",
         "AMD", "AMD EPYC", "x86_64", 2,
         "avx2 fma f16c avx512f avx512bw avx512vl avx_vnni avx512_vnni avx512_bf16 avx512_vp2intersect",
         "AMD EPYC 9005 Series (Zen 5) product brief, https://www.amd.com/en/products/processors/server/epyc/"
         "9005-series.html; flags as /proc/cpuinfo lists them on the project's AVX512-BF16 machine; family 0x1A "
         "model 0x02: Linux's arch/x86/kernel/cpu/amd.c", cpuid=(0x1A, 0x02)),
    _cpu("graviton3", ("graviton-3", "aws-graviton3", "neoverse-v1", "c7g"),
         "AWS Graviton3 (Arm Neoverse V1), 64 cores", "ARM", "Neoverse-V1", "aarch64", 64,
         "fp asimd sve bf16 i8mm asimdhp fphp",
         "AWS Graviton3 (Neoverse V1, SVE, BF16, I8MM), https://aws.amazon.com/ec2/graviton/"),

)
