"""Which math library runs TensorFlow's CPU kernels, as `info` reports it: oneDNN, Eigen, ZenDNN or ITEX."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from amp_backends.backends.cpu import rules
from amp_backends.backends.cpu.backend import CpuBackend, cpu_probe
from amp_backends.backends.cpu.onednn import onednn_state
from amp_backends.hardware import CpuInfo
from conftest import NEUTRAL_CWD
from fakes import ITEX_LOADED, NO_ITEX, ZEN4

pytestmark = pytest.mark.intel  # pure rules over fake probes: true under TF 2.15 + ITEX as well

ZEN3 = CpuInfo("AMD", "AMD EPYC 7B13", "x86_64", 2, frozenset("sse sse2 avx avx2 fma f16c".split()))
ZEN5 = CpuInfo(ZEN4[0], ZEN4[1], "x86_64", 2, frozenset(ZEN4[2].split()))


def rows(cpu, environ=None, itex=NO_ITEX, **zen):
    return dict(CpuBackend().report_rows(cpu_probe(cpu, itex, environ=environ or {}, **zen)))


def test_the_report_names_the_library_tensorflows_defaults_pick():
    assert rows(ZEN5)["math library"] == "oneDNN"  # avx512_bf16: TensorFlow turns oneDNN on
    assert rows(ZEN3)["math library"].startswith("Eigen (TensorFlow's own kernels: oneDNN is off)")  # AVX2 only
    assert rows(ZEN3, {"TF_ENABLE_ONEDNN_OPTS": "1"})["math library"] == "oneDNN"
    assert rows(ZEN5, itex=ITEX_LOADED)["math library"].startswith("ITEX")


def test_zentf_runs_only_where_its_variable_is_set_and_the_report_says_how_to_turn_it_on():
    idle = rows(ZEN3, zentf="2.21.0.0")["math library"]
    assert idle.startswith("Eigen") and "zentf 2.21.0.0 is installed but off (TF_ENABLE_ZENDNN_OPTS=1" in idle
    on = rows(ZEN3, {"TF_ENABLE_ZENDNN_OPTS": "1"}, zentf="2.21.0.0", zendnn_on=True)["math library"]
    assert on == "ZenDNN (zentf 2.21.0.0, TF_ENABLE_ZENDNN_OPTS=1)"
    # oneDNN on as well: AMD documents ZenDNN with oneDNN off, and the report says so
    both = rows(ZEN5, zentf="2.21.0.0", zendnn_on=True)["math library"]
    assert both.startswith("ZenDNN") and "TF_ENABLE_ONEDNN_OPTS=0" in both
    # the variable without zentf installed changes nothing, and the report says so
    alone = rows(ZEN5, zendnn_on=True)["math library"]
    assert alone.startswith("oneDNN; TF_ENABLE_ZENDNN_OPTS=1 is set but zentf is not installed"), alone
    # read from the environment TensorFlow starts in, as oneDNN's variable is
    assert rows(ZEN3, {"TF_ENABLE_ZENDNN_OPTS": "1"}, zentf="2.21.0.0")["math library"].startswith("ZenDNN")


def test_the_rule_is_pure_over_its_inputs():
    on, off = onednn_state(ZEN5, {}, system="linux"), onednn_state(ZEN3, {}, system="linux")
    assert rules.math_library(on, False, None, False) == "oneDNN"
    assert rules.math_library(off, False, None, True).startswith("Eigen")
    assert rules.math_library(off, True, "2.21.0.0", True).startswith("ITEX")  # ITEX takes the CPU ops first


def test_the_real_probe_reads_the_variable_where_tensorflow_starts():
    code = ("from amp_backends.backends.cpu.backend import CpuBackend; p = CpuBackend().probe(); "
            "print(p.facts.zendnn_on, dict(CpuBackend().report_rows(p))['math library'])")
    for value, expected in (("1", "True"), ("0", "False")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             cwd=NEUTRAL_CWD, env={**os.environ, "TF_ENABLE_ZENDNN_OPTS": value})
        assert out.returncode == 0 and out.stdout.split()[0] == expected, out.stderr[-2000:]
