"""The audit's CPU side without TensorFlow: the CPU backend's kernel audit (oneDNN verbose records), layer
matching, the report and its verdicts.

Recorded lines (tests/data): ``onednn_tf221_mnist_bf16.txt`` is one training step of the MNIST CNN under
mixed_bfloat16, TF 2.21 (oneDNN v3.7.3) on an AMD EPYC Zen 4 (avx512_bf16), batch 64, ``ONEDNN_VERBOSE=1``;
``onednn_itex215_mnist_f32.txt`` the same model in float32 under TF 2.15.1 + ITEX 2.15.0.0 (oneDNN v3.3.0),
same machine. The MKL-DNN 0.x line is the example of oneDNN's v0 documentation (perf_profile.html).
"""

from __future__ import annotations


import pytest

from amp_backends.auditing.build import from_reading
from amp_backends.auditing.match import LayerKernel, match
from amp_backends.auditing.audit_result import Audit, Entry
from amp_backends.auditing.runner import overrides_env, split_output
from amp_backends.backends.cpu import verbose as onednn
from amp_backends.kernel_audit import Capture
from amp_backends.registry import default_registry
from conftest import DATA
from schema_check import assert_valid

TF221 = (DATA / "onednn_tf221_mnist_bf16.txt").read_text().splitlines()
ITEX = (DATA / "onednn_itex215_mnist_f32.txt").read_text().splitlines()
MNIST_LAYERS = [
    {"path": "mnist_cnn/conv2d", "class_name": "Conv2D", "kernel_shape": [3, 3, 1, 32], "compute_dtype": "bfloat16"},
    {"path": "mnist_cnn/conv2d_1", "class_name": "Conv2D", "kernel_shape": [3, 3, 32, 64], "compute_dtype": "bfloat16"},
    {"path": "mnist_cnn/dense", "class_name": "Dense", "kernel_shape": [9216, 128], "compute_dtype": "bfloat16"},
    {"path": "mnist_cnn/dense_1", "class_name": "Dense", "kernel_shape": [128, 10], "compute_dtype": "float32"},
]
BF16_PLAN = {"backend": "cpu", "policy": "mixed_bfloat16", "compute_dtype": "bfloat16", "xla": False}
F32_PLAN = {"backend": "cpu", "policy": "float32", "compute_dtype": "float32", "xla": False}


def doc(plan=BF16_PLAN, **facts):
    """The child's document: ``facts`` are what the CPU's kernel audit recorded (``onednn_opts``, ``cpu_avx512``)."""
    return {"model": "mnist_cnn", "plan": plan, "batch_size": 64, "steps": 1, "step_time_ms": 20.0,
            "layers": MNIST_LAYERS, "findings": [{"code": "float32-compute", "layer": "mnist_cnn/dense_1",
                                                  "what": "pinned to float32"}], "facts": facts}


def from_onednn(lines, doc, header=()):
    """The audit of a CPU run, through the backend interface: the CPU backend's kernel audit reads the captured
    lines, the core builds the report from its reading."""
    reading = default_registry().get("cpu").kernel_audit().read(Capture(tuple(lines), tuple(header), doc))
    return from_reading(reading, doc)


def test_the_cpu_kernel_audit_starts_onednn_verbose_and_keeps_its_records():
    """The CPU backend's side of the audit: the child starts with ``ONEDNN_VERBOSE=1`` (every backend's variables:
    the child plans once it runs), the trainer's observer keeps the ``onednn_verbose`` lines, and the facts the
    reading needs are recorded in the audited process."""
    registry = default_registry()
    kernel_audit = registry.get("cpu").kernel_audit()
    assert (kernel_audit.device, kernel_audit.environment) == ("cpu", (("ONEDNN_VERBOSE", "1"),))
    assert registry.audit_environment() == {"ONEDNN_VERBOSE": "1"}
    assert kernel_audit.record_prefix == "onednn_verbose" and not kernel_audit.reads_traces
    assert kernel_audit.capturing({"ONEDNN_VERBOSE": "1"}) and kernel_audit.capturing({"DNNL_VERBOSE": "2"})
    assert not kernel_audit.capturing({"ONEDNN_VERBOSE": "0"}) and not kernel_audit.capturing({})
    assert set(kernel_audit.facts()) == {"onednn_opts", "cpu_avx512"}
    reading = kernel_audit.read(Capture(tuple(TF221), (), doc()))
    assert reading.device == "cpu" and reading.not_visible is None and len(reading.records) == len(onednn.parse(TF221))
    conv = next(r for r in reading.records if r.kind == "convolution")
    assert (conv.problem, conv.shape["ic"], conv.op) == ("convolution", 1, None)


def test_a_v3_7_convolution_record_is_read_field_by_field():
    r = onednn.parse_line(TF221[1])
    assert (r.kind, r.implementation, r.isa, r.prop) == ("convolution", "brg_conv_fwd:avx512_core_bf16",
                                                         "avx512_core_bf16", "forward_training")
    assert r.dtypes["src"] == r.dtypes["wei"] == r.dtypes["dst"] == "bf16"
    assert (r.dtype, r.unit, r.on_matrix_unit, r.emulated) == ("bfloat16", "AVX512-BF16", False, False)
    assert r.shape()["ic"] == 1 and r.shape()["oc"] == 32 and r.shape()["kh"] == 3 and r.shape()["mb"] == 64
    assert r.time_ms == pytest.approx(0.247803)
    assert "attr-post-ops:eltwise_relu" in r.attrs


def test_implementations_that_name_no_isa_are_unknown_never_guessed():
    records = onednn.parse(TF221)
    ip = next(r for r in records if r.kind == "inner_product" and r.dtype == "bfloat16")
    assert ip.implementation == "x64:gemm:jit" and ip.isa is None and ip.unit == "unknown"
    gemm = next(r for r in records if r.kind == "gemm_api")
    assert gemm.implementation == "" and gemm.dtype == "float32" and gemm.unit == "unknown"
    assert gemm.shape() == {"M": 128, "K": 64, "N": 10, "batch": 1}
    bwd = next(r for r in records if r.prop == "backward_data" and r.kind == "convolution")
    assert bwd.isa == "avx512_core_bf16"  # "brg_conv_bwd:avx512_core_bf16+brg_conv_fwd:avx512_core_bf16"


def test_the_itex_oneDNN_3_3_format_and_its_header():
    records = onednn.parse(ITEX)
    assert len(records) == 21 and all(r.engine == "cpu" for r in records)
    conv = next(r for r in records if r.kind == "convolution")
    assert (conv.dtype, conv.isa, conv.unit) == ("float32", "avx512_core", "AVX-512")
    mm = next(r for r in records if r.kind == "matmul")
    assert mm.implementation == "brg:avx512_core" and mm.shape()["K"] == 9216
    assert onednn.library_version(ITEX) == "oneDNN v3.3.0"
    assert onednn.parse_line("onednn_verbose,info,cpu,isa:Intel AVX-512 with Intel DL Boost") is None


def test_older_formats_timestamps_and_math_modes():
    v0 = "mkldnn_verbose,exec,reorder,jit:uni,undef,in:f32_nchw out:f32_nChw8c,num:1,2x16x7x7,0.529053"
    r = onednn.parse_line(v0)
    assert (r.kind, r.dtype, r.problem, r.time_ms) == ("reorder", "float32", "2x16x7x7", pytest.approx(0.529053))
    # constructed from the documented layout: a timestamp field after the marker, and fpmath:bf16
    stamped = "onednn_verbose,v1,1700000000123.4,primitive,exec,cpu," + TF221[1].split(",exec,cpu,", 1)[1]
    assert onednn.parse_line(stamped).dtype == "bfloat16"
    f32 = TF221[1].replace("bf16:", "f32:").replace("attr-scratchpad:user", "attr-fpmath:bf16 attr-scratchpad:user")
    assert onednn.parse_line(f32).dtype == "bfloat16"
    emulated = TF221[1].replace("avx512_core_bf16", "avx512_core")
    assert onednn.parse_line(emulated).emulated
    assert onednn.parse_line("not a verbose line") is None


def test_records_are_matched_to_layers_by_kernel_shape():
    layers = [LayerKernel.from_dict(d) for d in MNIST_LAYERS]
    records = [r for r in onednn.parse(TF221) if r.is_compute]
    matched = {(r.kind, r.problem): match(r.kernel_record(), layers) for r in records}
    assert all(len(v) == 1 for v in matched.values()), matched
    assert matched[("matmul", "9216x64:64x128")] == ["mnist_cnn/dense"]       # gradient of the weights
    assert matched[("matmul", "64x128:128x9216")] == ["mnist_cnn/dense"]      # gradient of the input
    assert matched[("gemm_api", "128x64:64x10")] == ["mnist_cnn/dense_1"]
    assert matched[("inner_product", "mb64ic128oc10")] == ["mnist_cnn/dense_1"]
    assert {m[0] for (k, _), m in matched.items() if k == "convolution"} == {"mnist_cnn/conv2d", "mnist_cnn/conv2d_1"}
    twins = layers + [LayerKernel("m/other", "Dense", (128, 10), "float32")]
    assert len(match(next(r for r in records if r.kind == "gemm_api").kernel_record(), twins)) == 2  # ambiguous


def test_records_go_to_the_step_ops_of_their_dtype_and_shape_before_any_kernel_shape():
    """Four Dense layers of one 64x64 kernel, the third pinned to float32: by kernel shape its float32 records
    were "ambiguous" over all four; the step's ops (from the child's trace) name the float32 one. A matmul
    without a kernel (a tied head: hidden x embeddings^T) is named by the layer that ran it."""
    f32 = "src:f32::blocked:ab::f0 wei:f32::blocked:ba::f0 dst:f32::blocked:ab::f0"
    lines = [f"onednn_verbose,v1,primitive,exec,cpu,inner_product,x64:gemm:jit,forward_training,{f32},,,"
             "mb16ic64oc64,0.02",  # the pinned layer's forward
             "onednn_verbose,v1,primitive,exec,cpu,gemm_api,,undef,src_f32::blocked:ba:f0 wei_f32::blocked:ab:f0 "
             "dst_f32::blocked:ab:f0,,,64x16:16x64,0.01",  # its gradient of the weights
             "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_bf16,undef,src:bf16::blocked:ab::f0 "
             "wei:bf16::blocked:ba::f0 dst:bf16::blocked:ab::f0,,,16x64:64x64,0.05",  # a bfloat16 layer's forward
             f"onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core,undef,{f32},,,2x8x64:1x64x1000,0.3"]
    dtypes = {"a": "bfloat16", "b": "bfloat16", "pinned": "float32", "c": "bfloat16"}
    layers = [{"path": f"four/{n}", "class_name": "Dense", "kernel_shape": [64, 64], "compute_dtype": d}
              for n, d in dtypes.items()]
    ops = [op for n, d in dtypes.items() for op in (
        {"layer": f"four/{n}", "op": "MatMul", "dtype": d, "M": 16, "K": 64, "N": 64, "batch": 1},
        {"layer": f"four/{n}", "op": "MatMul", "dtype": d, "M": 64, "K": 16, "N": 64, "batch": 1})]
    ops.append({"layer": "four/embedding", "op": "BatchMatMulV2", "dtype": "float32", "M": 8, "K": 64, "N": 1000,
                "batch": 2})
    by_shape = from_onednn(lines, {**doc(), "layers": layers}).to_dict()["float32_islands"]
    assert ["four/a", "four/b", "four/pinned", "four/c"] in [i["layers"] for i in by_shape]  # the fallback
    islands = from_onednn(lines, {**doc(), "layers": layers, "ops": ops}).to_dict()["float32_islands"]
    assert sorted((i["layers"], i["matched"]) for i in islands) == [(["four/embedding"], "layer"),
                                                                    (["four/pinned"], "layer")]


def test_the_bf16_step_reads_as_bf16_with_the_output_layer_a_float32_island():
    audit = from_onednn(TF221, doc(), ["onednn_verbose,v1,info,oneDNN v3.7.3 (commit N/A)"])
    d = audit.to_dict()
    assert d["time_share_by_dtype"]["bfloat16"] > 0.9
    assert d["by_kind"]["convolution"]["units"] == {"AVX512-BF16": 1.0}
    islands = d["float32_islands"]
    assert [i["layers"] for i in islands] == [["mnist_cnn/dense_1"]]
    assert islands[0]["check"][0]["code"] == "float32-compute"
    assert d["warnings"] == [] and d["matrix_unit_share"] == 0.0 and d["unknown_share"] == 0.0
    assert d["source"].startswith("oneDNN v3.7.3") and d["reorder_time_ms"] > 0
    text = str(audit)
    assert "float32 island: mnist_cnn/dense_1" in text and "AVX512-BF16" in text


def test_a_float32_run_has_no_bf16_time_and_no_islands():
    d = from_onednn(ITEX, doc(F32_PLAN)).to_dict()
    assert set(d["time_share_by_dtype"]) == {"float32"} and d["float32_islands"] == [] and d["warnings"] == []


def test_no_onednn_matrix_primitive_means_outside_onednn_and_no_dtypes():
    eigen_sgemm = [line for line in TF221 if ",gemm_api," in line]
    audit = from_onednn(eigen_sgemm, doc(onednn_opts="0"))
    assert audit.device == "cpu" and audit.warnings()[0]["code"] == "eigen-bfloat16"
    d = audit.to_dict()
    assert "outside oneDNN (Eigen)" in d["outside_onednn"] and "TF_ENABLE_ONEDNN_OPTS=0" in d["outside_onednn"]
    assert d["time_share_by_dtype"] == {} and d["unknown_share"] == 1.0 and d["float32_islands"] == []
    assert "no fast bfloat16 path" in d["warnings"][0]["what"]
    assert "outside oneDNN" in from_onednn([], doc()).to_dict()["outside_onednn"]


def test_contradictions_with_the_plan_are_warnings_with_their_fix():
    entries = [Entry("convolution", "bfloat16", "AVX512-BF16", 60.0, True, layers=("m/conv",)),
               Entry("convolution", "float32", "AVX-512", 40.0, True, layers=("m/conv_1",))]
    w = Audit("m", "cpu", BF16_PLAN, entries).warnings()
    assert w[0]["what"] == ("the plan says bfloat16; 40% of the convolution time ran in float32 kernels "
                            "(layers: m/conv_1)") and "float32" in w[0]["fix"]
    w = Audit("m", "cpu", F32_PLAN, entries).warnings()
    assert w[0]["what"] == "the plan says float32; 60% of the compute time ran in bfloat16 kernels"
    # float32 time in another row of the matmul family (the table's gemm_api): named, as the table names it (the
    # warning said "matmul" beside a matmul row that was all bfloat16)
    mixed = [Entry("matmul", "bfloat16", "AMX", 50.0, True, layers=("m/dense",)),
             Entry("gemm_api", "float32", "AVX-512", 50.0, True, layers=("m/mix",), problem="matmul")]
    assert Audit("m", "cpu", BF16_PLAN, mixed).warnings()[0]["what"] == (
        "the plan says bfloat16; 50% of the matmul time ran in float32 kernels (gemm_api) (layers: m/mix)")
    emulated = [Entry("matmul", "bfloat16", "AVX-512", 1.0, True, emulated=True)]
    assert "emulated" in Audit("m", "cpu", BF16_PLAN, emulated).warnings()[0]["what"]
    assert Audit("m", "cpu", BF16_PLAN, emulated).warnings()[0]["fix"] == "plan float32 here (--policy float32)"
    # under a float32 plan such kernels come from a layer on a mixed policy or a float32 math mode: its fix was
    # '--policy float32', the flag the user had passed
    (said,) = [w for w in Audit("m", "cpu", F32_PLAN, emulated).warnings() if w["code"] == "emulated-kernels"]
    assert "reset_policies=True" in said["fix"] and "ONEDNN_DEFAULT_FPMATH_MODE" in said["fix"]
    assert "--policy float32" not in said["fix"]


def test_the_child_output_is_split_at_its_markers_and_overrides_become_amp_variables():
    out = "noise\namp_backends_audit:begin\nrec1\nrec2\namp_backends_audit:end\nlater"
    assert split_output(out) == (["noise"], ["rec1", "rec2"])
    assert split_output("no markers") == (["no markers"], [])
    assert overrides_env(policy="float32", xla=None, strict=True) == {"AMP_POLICY": "float32", "AMP_STRICT": "1"}
    with pytest.raises(TypeError, match="unknown plan override polcy='float32'.*Fix"):
        overrides_env(polcy="float32")
    with pytest.warns(DeprecationWarning, match="graph_amp"):  # the old name works for one release
        assert overrides_env(itex_amp="on") == {"AMP_GRAPH_AMP": "on"}


def test_a_plan_passes_every_setting_that_changes_the_kernels_to_the_audits_child():
    import amp_backends

    plan = amp_backends.plan_for(device="zen5", graph_amp="on")
    assert plan.graph_amp == "bfloat16" and plan.policy == "float32"
    env = overrides_env(plan)
    assert env == {"AMP_BACKEND": "cpu", "AMP_POLICY": "float32", "AMP_XLA": "off", "AMP_TF32": "off",
                   "AMP_FP8": "off", "AMP_GRAPH_AMP": "on"}  # without the rewrite the child would plan float32 alone


def test_a_model_object_or_an_unimportable_factory_is_refused_before_anything_runs():
    from amp_backends.auditing import audit

    class FakeModel:
        layers = ()

    with pytest.raises(TypeError, match="takes a factory"):
        audit(FakeModel())
    with pytest.raises(ValueError, match="top-level function of an importable module"):
        audit(lambda: None)
    with pytest.raises(ValueError, match="expected MODULE:FACTORY"):
        audit("mymodels.py")
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        audit("amp_backends.models:mnist_cnn", batch_size=0)


def test_the_trainer_observer_does_nothing_without_onednn_verbose(monkeypatch, caplog):
    from types import SimpleNamespace

    from amp_backends.auditing.observer import AuditObserver

    monkeypatch.delenv("ONEDNN_VERBOSE", raising=False)
    obs = AuditObserver(window=(0, 1))
    with caplog.at_level("WARNING"):
        obs.on_fit_start(0, 10)
    obs.before_call(0, 1)
    obs.after_call(SimpleNamespace(step=1, steps=1, step_time=0.1))
    obs.close()
    assert obs.result is None and "amp-backends audit" in caplog.text


def test_the_audit_function_and_its_package_import_no_tensorflow():
    import subprocess
    import sys

    code = ("import sys, amp_backends, amp_backends.auditing\n"
            "assert callable(amp_backends.audit) and amp_backends.audit is amp_backends.auditing.audit\n"
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_outside_onednn_names_the_real_cause():
    """With TF_ENABLE_ONEDNN_OPTS=1 already set, a forced bfloat16 plan on a CPU without AVX-512 still runs Eigen:
    TensorFlow sends bfloat16 to oneDNN only on CPUs with AVX-512. Telling the user to set the variable is wrong."""
    from amp_backends.backends.cpu.verbose import outside_onednn_reason

    bf16 = {"compute_dtype": "bfloat16", "xla": False}
    why = outside_onednn_reason({"onednn_opts": "1", "cpu_avx512": False}, bf16, False)
    assert "only on CPUs with AVX-512" in why and "although TF_ENABLE_ONEDNN_OPTS=1 is set" in why
    assert "--policy float32" in why and "set TF_ENABLE_ONEDNN_OPTS=1" not in why and "(TF_ENABLE" not in why
    assert "only on CPUs with AVX-512" in outside_onednn_reason({"cpu_avx512": False}, bf16, False)
    f32 = {"compute_dtype": "float32", "xla": False}
    set_already = outside_onednn_reason({"onednn_opts": "1", "cpu_avx512": False}, f32, False)
    assert "although TF_ENABLE_ONEDNN_OPTS=1 is set" in set_already and "turns it on" not in set_already
    assert "TF_ENABLE_ONEDNN_OPTS=1 turns it on" in outside_onednn_reason({"cpu_avx512": False}, f32, False)
    assert "turns TensorFlow's oneDNN kernels off" in outside_onednn_reason({"onednn_opts": "0"}, bf16, False)
    assert outside_onednn_reason({"onednn_opts": "1"}, bf16, True) is None


def test_audits_from_onednn_records_and_of_an_unmeasured_xpu_match_their_schema():
    import amp_backends
    from amp_backends import audit

    bf16 = from_onednn(TF221, doc(), ["onednn_verbose,v1,info,oneDNN v3.7.3 (commit N/A)"]).to_dict()
    assert bf16["float32_islands"] and bf16["warnings"] == []
    xpu = audit("m:f", amp_backends.plan_for(device="max1550", environ={})).to_dict()  # not measured: nothing runs
    assert xpu["device"] == "xpu" and not xpu["measured"] and xpu["notes"][0].startswith("not measured on XPU")
    for result in (bf16, from_onednn(ITEX, doc(F32_PLAN)).to_dict(), from_onednn([], doc()).to_dict(), xpu):
        assert_valid("audit", result)

