"""Draw docs/assets/float-ranges.svg: the ranges of float16, bfloat16 and float32 (the precision page).

    python docs/float_ranges.py       # needs numpy and matplotlib (the bench extra)

Every number in the picture is computed from the formats' bits (1 sign bit, e exponent bits, m mantissa bits,
IEEE 754 layout with subnormals) and checked against numpy's own float16 and float32, never typed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "assets" / "float-ranges.svg"

# name, exponent bits, mantissa bits, colour
FORMATS = (("float32", 8, 23, "#4c72b0"), ("bfloat16", 8, 7, "#55a868"), ("float16", 5, 10, "#dd8452"))


def limits(exponent_bits: int, mantissa_bits: int) -> dict[str, float]:
    """The largest value, the smallest normal and subnormal values and epsilon of a binary format."""
    bias = 2 ** (exponent_bits - 1) - 1
    return {"max": (2 - 2.0**-mantissa_bits) * 2.0**bias, "min_normal": 2.0 ** (1 - bias),
            "min_subnormal": 2.0 ** (1 - bias - mantissa_bits), "eps": 2.0**-mantissa_bits}


def check() -> None:
    """The formula against numpy for the two formats numpy has."""
    for dtype, e, m in ((np.float16, 5, 10), (np.float32, 8, 23)):
        info, got = np.finfo(dtype), limits(e, m)
        assert got["max"] == float(info.max) and got["min_normal"] == float(info.smallest_normal)
        assert got["min_subnormal"] == float(info.smallest_subnormal) and got["eps"] == float(info.eps)


def short(x: float) -> str:
    return f"{x:.0f}" if 1 <= x < 1e6 else f"{x:.2e}".replace("e-0", "e-").replace("e+", "e")


def draw(path: Path = OUT) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    check()
    plt.rcParams["svg.hashsalt"] = "amp_backends"
    plt.rcParams["svg.fonttype"] = "none"
    fig, ax = plt.subplots(figsize=(9, 3.4))
    for row, (_, e, m, colour) in enumerate(FORMATS):
        lim = limits(e, m)
        low, normal, high = (np.log10(lim[k]) for k in ("min_subnormal", "min_normal", "max"))
        ax.barh(row, normal - low, left=low, height=0.5, color=colour, alpha=0.35)
        ax.barh(row, high - normal, left=normal, height=0.5, color=colour)
        ax.text(low - 0.6, row, short(lim["min_subnormal"]), ha="right", va="center", fontsize=8)
        ax.text(normal, row + 0.32, f"normal from {short(lim['min_normal'])}", ha="left", va="bottom", fontsize=8)
        ax.text(high + 0.6, row, f"max {short(lim['max'])}", ha="left", va="center", fontsize=8)
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_yticks(range(len(FORMATS)), [f"{name}\n{e} exponent bits\n{m} mantissa bits\nstep near 1: "
                                         f"{short(limits(e, m)['eps'])}" for name, e, m, _ in FORMATS], fontsize=8)
    ax.set_xlim(-58, 52)
    ax.set_ylim(-0.6, len(FORMATS) - 0.3)
    ax.set_xticks(range(-40, 41, 10), [f"1e{t}" if t else "1" for t in range(-40, 41, 10)])
    ax.set_xlabel("magnitude (log scale); pale: subnormal values (fewer significant bits); below the pale bar: 0")
    ax.set_title("The range of each format (each also has 1 sign bit)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(draw())
