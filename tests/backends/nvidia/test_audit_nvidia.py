"""The NVIDIA backend's kernel audit: GPU kernel names classified from recorded public profiles
(tests/data/nvidia_kernels.json lists each name with its source), XLA fusions by their HLO, and profiler traces
read into an audit. No TensorFlow, no GPU."""

from __future__ import annotations

import gzip
import json

import pytest

from amp_backends import audit_trace
from amp_backends.backends.nvidia.kernels import classify, events_from_trace_json, read_trace
from conftest import DATA
from schema_check import assert_valid

RECORDED = json.loads((DATA / "nvidia_kernels.json").read_text())["kernels"]


@pytest.mark.parametrize("kernel", RECORDED, ids=[k["name"][:60] for k in RECORDED])
def test_recorded_kernel_names(kernel):
    k = classify(kernel["name"])
    expected = (kernel["kind"], kernel["dtype"], kernel["tensor_core"])
    assert (k.kind, k.dtype, k.tensor_core) == expected, kernel["source"]


def test_every_generation_and_library_is_covered_by_a_recorded_name():
    names = " ".join(k["name"] for k in RECORDED)
    for marker in ("volta_", "turing_", "ampere_", "sm80_", "sm86_", "sm89_", "sm90_", "sm100_", "nvjet_", "cutlass_",
                   "implicit_convolve", "fusion"):
        assert marker in names
    assert {k["dtype"] for k in RECORDED} >= {"float16", "bfloat16", "float32", "float8", "int8", "unknown"}


def test_xla_fusions_are_read_from_their_hlo_and_unknown_without_it():
    assert classify("fusion_12").dtype == "unknown"
    hlo = ("%fused_computation.3 (p0: bf16[64,9216], p1: bf16[9216,128]) -> bf16[64,128] {\n"
           "  ROOT %dot.1 = bf16[64,128]{1,0} dot(bf16[64,9216]{1,0} %p0, bf16[9216,128]{1,0} %p1)\n}")
    k = classify("fusion_12", hlo)
    assert (k.kind, k.dtype, k.tensor_core) == ("gemm", "bfloat16", True)
    k = classify("loop_fusion", "%fusion.2 = f32[64,10]{1,0} fusion(f32[64,10]{1,0} %p), kind=kLoop")
    assert (k.kind, k.dtype) == ("other", "float32")
    assert classify("some_unheard_of_gemm_kernel").dtype == "unknown"  # matrix work, dtype not said: unknown


def test_a_fusion_is_classified_by_its_dot_or_convolution_not_by_a_convert_or_its_output_type():
    """A dot fusion holding a ``convert(`` was called a convolution ("conv" in the text), and a bfloat16 dot with a
    float32 output was called float32 (the first type after ``=`` is the fusion's output)."""
    hlo = ("%fused_computation.7 (p0: f32[64,256], p1: bf16[256,10]) -> f32[64,10] {\n"
           "  %convert.2 = bf16[64,256]{1,0} convert(f32[64,256]{1,0} %p0)\n"
           "  ROOT %dot.4 = f32[64,10]{1,0} dot(bf16[64,256]{1,0} %convert.2, bf16[256,10]{1,0} %p1)\n}")
    k = classify("fusion_3", hlo)
    assert (k.kind, k.dtype, k.tensor_core) == ("gemm", "bfloat16", True)
    conv = ("%fused_computation.1 (p0: f16[8,32,32,16], p1: f16[3,3,16,32]) -> f16[8,32,32,32] {\n"
            "  ROOT %convolution.1 = f16[8,32,32,32]{3,2,1,0} convolution(f16[8,32,32,16]{3,2,1,0} %p0, "
            "f16[3,3,16,32]{3,2,1,0} %p1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f\n}")
    assert (classify("fusion_9", conv).kind, classify("fusion_9", conv).dtype) == ("conv", "float16")


def trace_doc():
    """Shaped like TensorFlow's trace viewer JSON: process names, host and GPU events, args."""
    return {"displayTimeUnit": "ns", "traceEvents": [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0 (Stream #14)"}},
        {"ph": "X", "pid": 1, "tid": 1, "name": "MatMul", "ts": 0, "dur": 50},
        {"ph": "X", "pid": 2, "tid": 14, "name": "ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_tn",
         "ts": 1, "dur": 60, "args": {"tf_op": "model/dense/MatMul:MatMul"}},
        {"ph": "X", "pid": 2, "tid": 14, "name": "volta_sgemm_128x64_nn", "ts": 70, "dur": 20},
        {"ph": "X", "pid": 2, "tid": 14, "name": "fusion_3", "ts": 90, "dur": 20},
        {"ph": "X", "pid": 2, "tid": 14, "name": "elementwise_kernel", "ts": 110, "dur": 5},
    ]}


def test_a_trace_file_is_read_into_gpu_kernels_and_audited(tmp_path):
    path = tmp_path / "host.trace.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(trace_doc(), f)
    events = read_trace(tmp_path)  # the log directory: the trace file is found in it
    assert events[0].name.startswith("ampere_") and len(events) == 4
    assert events[0].op == "model/dense/MatMul:MatMul"
    d = audit_trace(path).to_dict()
    assert d["device"] == "nvidia" and d["source"] == "TensorFlow profiler trace"
    assert d["time_share_by_dtype"] == {"bfloat16": 0.6, "float32": 0.2, "unknown": 0.2}
    assert d["matrix_unit_share"] == 0.6 and d["unknown_share"] == 0.2
    assert d["other_time_ms"] == pytest.approx(0.005)


def test_unreadable_traces_say_what_was_expected(tmp_path):
    with pytest.raises(ValueError, match="profiler log directory"):
        read_trace(tmp_path)
    bad = tmp_path / "x.trace.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="trace-events JSON"):
        read_trace(bad)
    assert len(events_from_trace_json(trace_doc()["traceEvents"])) == 4


@pytest.mark.tensorflow
def test_an_xplane_protobuf_is_read_through_tensorflows_own_schema(tmp_path):
    xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
    space = xplane_pb2.XSpace()
    host = space.planes.add(name="/host:CPU")
    host.event_metadata[1].name = "MatMul"
    host.lines.add(name="TensorFlow Ops").events.add(metadata_id=1, duration_ps=9_000_000)
    gpu = space.planes.add(name="/device:GPU:0")
    gpu.stat_metadata[7].name = "tf_op"
    gpu.stat_metadata[8].name = "model/dense/MatMul:MatMul"
    gpu.event_metadata[1].name = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
                                  "execute_segment_k_off_kernel__5x_cublas")
    gpu.event_metadata[2].name = "fusion_3"
    stream = gpu.lines.add(name="Stream #14(Compute)")
    ev = stream.events.add(metadata_id=1, duration_ps=3_000_000)
    ev.stats.add(metadata_id=7, ref_value=8)
    stream.events.add(metadata_id=2, duration_ps=1_000_000)
    gpu.lines.add(name="XLA Ops").events.add(metadata_id=2, duration_ps=1_000_000)  # not a kernel line
    path = tmp_path / "plugins" / "profile" / "run" / "host.xplane.pb"
    path.parent.mkdir(parents=True)
    path.write_bytes(space.SerializeToString())
    events = read_trace(tmp_path)
    assert [(e.duration_us, e.op) for e in events] == [(3.0, "model/dense/MatMul:MatMul"), (1.0, None)]
    d = audit_trace(tmp_path).to_dict()
    assert d["time_share_by_dtype"] == {"bfloat16": 0.75, "unknown": 0.25}


def test_gpu_kernels_are_joined_to_layers_by_their_ops_name_scopes():
    from amp_backends.auditing.build import from_reading
    from amp_backends.backends.nvidia.kernels import KernelEvent, reading

    layers = [{"path": "mnist_cnn/dense", "class_name": "Dense", "kernel_shape": [9216, 128],
               "compute_dtype": "float16"},
              {"path": "mnist_cnn/dense_1", "class_name": "Dense", "kernel_shape": [128, 10],
               "compute_dtype": "float32"}]
    events = [KernelEvent("ampere_fp16_s16816gemm_fp16_64x64_sliced1x2_ldg8_relu_f2f_stages_64x5_tn", 90.0,
                          op="mnist_cnn_1/dense/MatMul:MatMul"),
              KernelEvent("volta_sgemm_128x64_nn", 10.0, op="gradient_tape/mnist_cnn_1/dense_1/MatMul_1:MatMul"),
              KernelEvent("volta_sgemm_128x64_nn", 1.0, op="some/other/MatMul:MatMul")]
    plan = {"backend": "nvidia", "policy": "mixed_float16", "compute_dtype": "float16", "xla": False}
    islands = from_reading(reading(events), {"plan": plan, "layers": layers}).to_dict()["float32_islands"]
    assert [(i["layers"], i["matched"]) for i in islands] == [(["mnist_cnn/dense_1"], "layer"), ([], "unmatched")]


def test_the_child_reads_the_trace_in_its_work_folder_and_says_so_when_no_gpu_ran(tmp_path):
    """The kernel audit's side of the child: the trace ``begin`` wrote into the work folder is read; a run where
    TensorFlow listed no GPU (nothing traced) is not measured, with the reason."""
    from amp_backends.kernel_audit import Capture
    from amp_backends.registry import default_registry

    kernel_audit = default_registry().get("nvidia").kernel_audit()
    assert kernel_audit.device == "nvidia" and kernel_audit.reads_traces and kernel_audit.environment == ()
    (tmp_path / "host.trace.json").write_text(json.dumps(trace_doc()))
    read = kernel_audit.read(Capture(doc={"facts": {"gpu": True}}, workdir=str(tmp_path)))
    assert read.measured and len(read.records) == 4 and read.records[0].op == "model/dense/MatMul:MatMul"
    nothing = kernel_audit.read(Capture(doc={"facts": {"gpu": False}}, workdir=str(tmp_path)))
    assert not nothing.measured and not nothing.records and "no GPU" in nothing.notes[0]


def test_the_audit_of_a_trace_matches_its_schema_with_and_without_a_plan(tmp_path):
    import amp_backends

    path = tmp_path / "host.trace.json"
    path.write_text(json.dumps(trace_doc()))
    assert_valid("audit", audit_trace(path).to_dict())
    assert_valid("audit", audit_trace(path, amp_backends.plan_for(device="h100", environ={})).to_dict())



def test_a_broken_third_party_kernel_audit_leaves_a_trace_audit_to_the_others(tmp_path, monkeypatch):
    """Every backend is asked for a trace reader: one whose kernel_audit() raises was a BackendError ending it."""
    from fakes import KernelAuditRaises

    from amp_backends import registry
    from amp_backends.backends.cpu import CpuBackend
    from amp_backends.backends.nvidia import NvidiaBackend

    path = tmp_path / "host.trace.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(trace_doc(), f)
    monkeypatch.setattr(registry, "default_registry",
                        lambda: registry.BackendRegistry([KernelAuditRaises(), NvidiaBackend(), CpuBackend()]))
    assert audit_trace(path).to_dict()["device"] == "nvidia"
