"""The microarchitecture of an x86 CPU, named from CPUID's vendor, family, model (and stepping), as
``/proc/cpuinfo`` gives them: a model name such as "AMD EPYC" says nothing of the generation.

Sources: Linux's ``arch/x86/kernel/cpu/amd.c`` (``bsp_init_amd``: Zen generations by family and model range) and
``arch/x86/include/asm/intel-family.h`` (model 0x55 is Skylake-X, Cascade Lake at stepping 7, Cooper Lake at 11);
Zen+ (family 0x17, models 0x08 and 0x18) per CPUID dumps. A CPU outside these tables gets ``None``, never a guess.
"""

from __future__ import annotations

# family -> (first model, last model, name), AMD
_AMD: dict[int, tuple[tuple[int, int, str], ...]] = {
    0x17: ((0x08, 0x08, "Zen+"), (0x18, 0x18, "Zen+"), (0x00, 0x2F, "Zen"), (0x50, 0x5F, "Zen"),
           (0x30, 0x4F, "Zen 2"), (0x60, 0x7F, "Zen 2"), (0x90, 0x91, "Zen 2"), (0xA0, 0xAF, "Zen 2")),
    0x19: ((0x00, 0x0F, "Zen 3"), (0x20, 0x5F, "Zen 3"), (0x10, 0x1F, "Zen 4"), (0x60, 0xAF, "Zen 4")),
    0x1A: ((0x00, 0x2F, "Zen 5"), (0x40, 0x4F, "Zen 5"), (0x60, 0x7F, "Zen 5"),
           (0x50, 0x5F, "Zen 6"), (0x80, 0xAF, "Zen 6"), (0xC0, 0xCF, "Zen 6")),
}

# family-6 model -> name, Intel (the cores this library plans for: servers first, then recent clients)
_INTEL_6: dict[int, str] = {
    0x3F: "Haswell-X", 0x4F: "Broadwell-X", 0x56: "Broadwell-D", 0x55: "Skylake-X", 0x6A: "Ice Lake-X",
    0x6C: "Ice Lake-D", 0x8F: "Sapphire Rapids", 0xCF: "Emerald Rapids", 0xAD: "Granite Rapids",
    0xAE: "Granite Rapids-D", 0xAF: "Sierra Forest",
    0x4E: "Skylake", 0x5E: "Skylake", 0x8E: "Kaby Lake", 0x9E: "Kaby Lake", 0xA5: "Comet Lake", 0xA6: "Comet Lake",
    0x7D: "Ice Lake", 0x7E: "Ice Lake", 0xA7: "Rocket Lake", 0x8C: "Tiger Lake", 0x8D: "Tiger Lake",
    0x97: "Alder Lake", 0x9A: "Alder Lake", 0xB7: "Raptor Lake", 0xBA: "Raptor Lake", 0xBF: "Raptor Lake",
    0xAA: "Meteor Lake", 0xAC: "Meteor Lake", 0xB5: "Arrow Lake", 0xC5: "Arrow Lake", 0xC6: "Arrow Lake",
    0xBD: "Lunar Lake",
}
# model 0x55 by stepping, as intel-family.h's comments name them
_SKYLAKE_X_STEPPINGS = {7: "Cascade Lake", 11: "Cooper Lake"}
# Intel's cores with AMX (Intel's ISA extensions reference: Sapphire Rapids first, then its successors); AMX-FP16
# first came with Granite Rapids. A virtual machine may report another core's model number with the host's
# flags (seen: model 0xA7, Rocket Lake, with AMX and AVX512-FP16): the flags then name the generation.
_INTEL_AMX = frozenset({"Sapphire Rapids", "Emerald Rapids", "Granite Rapids", "Granite Rapids-D"})


def microarchitecture(vendor: str, family: int | None, model: int | None, stepping: int | None = None,
                      flags: frozenset[str] | None = None) -> str | None:
    """``("AMD", 26, 2)`` -> ``"Zen 5"``; ``("Intel", 6, 0x8F)`` -> ``"Sapphire Rapids"``; ``None`` when the tables
    do not know the CPU (never a guess). ``family`` and ``model`` are those ``/proc/cpuinfo`` displays; ``stepping``
    tells Cascade Lake and Cooper Lake from Skylake-X; an Intel model without AMX on a CPU whose ``flags`` have AMX
    (a virtual machine's made-up model) is named from the flags (``"Sapphire Rapids or later, AMX"``)."""
    if family is None or model is None:
        return None
    v = vendor.lower()
    if v in ("amd", "authenticamd"):
        return next((name for first, last, name in _AMD.get(family, ()) if first <= model <= last), None)
    if v in ("intel", "genuineintel") and family == 6:
        name: str | None = (_SKYLAKE_X_STEPPINGS.get(stepping, "Skylake-X") if model == 0x55 and stepping is not None
                            else _INTEL_6.get(model))
        if flags and "amx_tile" in flags and name not in _INTEL_AMX:
            first = "Granite Rapids" if "amx_fp16" in flags else "Sapphire Rapids"
            return f"{first} or later, AMX"
        return name
    return None
