"""Run pytest on an emulated CPU without AVX-512: the instructions TensorFlow, oneDNN and XLA see are that CPU's.

``--as-cpu NAME`` makes the probes see a catalogue CPU, but TensorFlow still runs on the real one. Here every
Python process of the run (pytest, its xdist workers, the programs tests start through ``sys.executable``) runs
in QEMU's user-mode emulator with the CPU model of a catalogue CPU, and ``/proc/cpuinfo`` shows that CPU (bound
over the real file in a mount namespace of the run's own). TensorFlow then decides oneDNN by itself, oneDNN
picks its AVX2 kernels, XLA compiles for AVX2, and ZenDNN sees an AMD CPU. QEMU's emulator runs no AVX-512, so
only the catalogue's AVX2 CPUs can be emulated; it is 10-100 times slower than the real CPU, so run a part of
the suite, not all of it, and read no timing from it.

Linux only, as root (the mount namespace), with QEMU's user-mode emulator (``apt-get install qemu-user``)::

    python3 tests/emulated_cpu.py zen3 -q -n 2 tests/commands/test_plan_face.py

Arguments after the CPU name go to pytest; run it with the Python of the environment under test (nox's
``.nox/tests/bin/python``). The exit status is pytest's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The catalogue's CPUs QEMU can emulate (AVX2, no AVX-512), and QEMU's model of each.
QEMU_MODELS = {"zen1": "EPYC-v1", "zen3": "EPYC-Milan-v1"}
# The x86-64 flags every CPU of QEMU_MODELS has, besides the catalogue's
BASE_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
              "syscall nx mmxext lm constant_tsc rep_good nopl cpuid pni pclmulqdq ssse3 cx16 sse4_1 sse4_2 movbe "
              "popcnt aes xsave avx rdrand hypervisor lahf_lm abm sse4a bmi1 bmi2 adx xsaveopt")


def cpuinfo(name: str) -> str:
    """``/proc/cpuinfo`` for the catalogue CPU ``name``, one entry per logical core."""
    from amp_backends.devices import device_hardware, find_device

    cpu = device_hardware(find_device(name)).cpu
    assert cpu is not None and cpu.family is not None and cpu.model_number is not None
    flags = " ".join(sorted(set(BASE_FLAGS.split()) | set(cpu.flags)))
    vendor = {"AMD": "AuthenticAMD", "Intel": "GenuineIntel"}[cpu.vendor]
    return "\n".join(f"processor\t: {i}\nvendor_id\t: {vendor}\ncpu family\t: {cpu.family}\nmodel\t\t: "
                     f"{cpu.model_number}\nmodel name\t: {cpu.model}\nstepping\t: 0\nflags\t\t: {flags}\n"
                     for i in range(cpu.logical_cores))


def quiet_model(qemu: str, model: str) -> str:
    """QEMU's ``-cpu`` value for ``model`` without the features its emulator lacks (each would be a warning on
    the standard error of every process, which tests read)."""
    said = subprocess.run([qemu, "-cpu", model, "/bin/true"], capture_output=True, text=True).stderr
    lacking = sorted(set(re.findall(r"CPUID\.\w+:\w+\.([\w-]+) ", said)))
    return ",".join([model, *(f"-{feature}" for feature in lacking)])


def main(argv: list[str]) -> int:
    """Run pytest with ``argv[1:]`` on the emulated CPU ``argv[0]``; returns pytest's exit status."""
    if not argv or argv[0] not in QEMU_MODELS:
        print(f"usage: {Path(sys.argv[0]).name} CPU [pytest arguments]; CPU is one of {', '.join(QEMU_MODELS)} "
              f"(AVX2 CPUs of the device catalogue that QEMU emulates)", file=sys.stderr)
        return 2
    qemu = shutil.which("qemu-x86_64")
    if qemu is None or os.geteuid() != 0 or not sys.platform.startswith("linux"):
        print("needs Linux, root and QEMU's user-mode emulator (apt-get install qemu-user)", file=sys.stderr)
        return 2
    name, args = argv[0], argv[1:]
    with tempfile.TemporaryDirectory(prefix="emulated-cpu-") as folder:
        info = Path(folder, "cpuinfo")
        info.write_text(cpuinfo(name), encoding="utf-8")
        # Beside the environment's python, so that Python finds its environment from the name it is started by
        # (``-0``); every ``sys.executable`` of the run is then this script, the emulator included.
        wrapper = Path(sys.executable).parent / f"python-emulated-{name}"
        model = quiet_model(qemu, QEMU_MODELS[name])
        wrapper.write_text(f'#!/bin/sh\nexec {qemu} -cpu {model} -0 "$0" {sys.executable} "$@"\n', encoding="utf-8")
        wrapper.chmod(0o755)
        try:
            command = f'mount --bind {info} /proc/cpuinfo && exec {wrapper} -m pytest "$@"'
            return subprocess.call(["unshare", "-m", "sh", "-c", command, "sh", *args],
                                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        finally:
            wrapper.unlink()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
