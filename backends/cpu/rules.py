"""The CPU's dtype-policy rules: which policy runs fast on this CPU, given oneDNN's state and ITEX, and why.

bfloat16 is fast on a CPU only where it has bf16 instructions (AVX512_BF16, AMX, Arm BF16) and oneDNN runs the
model (TensorFlow's, `onednn`, or ITEX's); Eigen runs bfloat16 many times slower than float32. The same holds for
the grappler bfloat16 rewrite (``graph_amp``). Every figure quoted comes from a committed results file (`measured`).
"""

from __future__ import annotations

from amp_backends.backend_api import (EMULATED, FUNCTIONAL, NATIVE, UNSAFE, UNSUPPORTED, Evidence, Float32Layer,
                                      PeerVerdict, Support)
from amp_backends.registry import Peer
from amp_backends.hardware import CpuInfo

from .measured import (LAYERS, WITH_BF16, WITH_FP16, WITHOUT_BF16, ZooModel, evidence, load, policy_file, quote,
                       times, zoo_results)
from .onednn import FLOAT16_FLAGS, VARIABLE, OneDnnState, onednn_takes_float16

OFF = " onednn=0"  # the suffix of the configurations measured with TF_ENABLE_ONEDNN_OPTS=0


def bf16_flags(cpu: CpuInfo) -> str:
    """The CPU's bf16 instruction flags, as the reasons name them.

    Args:
        cpu: The CPU.

    Returns:
        Those of ``avx512_bf16``, ``amx_bf16`` and Arm's ``bf16`` it has, sorted and comma-separated (``""``: none).
    """
    return ", ".join(sorted(cpu.flags & {"avx512_bf16", "amx_bf16", "bf16"}))


def measured_file(cpu: CpuInfo, *configs: str) -> str:
    """The results file that speaks for this CPU: one measured on a CPU the probe names alike holding ``configs``,
    else one of its kind (with bf16 instructions, or without)."""
    return policy_file(cpu.name, WITH_BF16 if cpu.native_bf16 else WITHOUT_BF16, *configs)


def _config(cpu: CpuInfo, onednn: OneDnnState, itex_active: bool, name: str) -> str:
    """The measured configuration that matches this CPU's oneDNN state (the bf16 machine was measured both ways)."""
    runs_onednn = onednn.enabled or itex_active
    return name + OFF if cpu.native_bf16 and not runs_onednn else name


def bf16_runs_fast(cpu: CpuInfo, onednn: OneDnnState, itex_active: bool) -> bool:
    """Whether bfloat16 runs fast on this CPU: it has bf16 instructions and oneDNN (TensorFlow's or ITEX's) runs it.

    Args:
        cpu: The CPU.
        onednn: Whether TensorFlow runs oneDNN there.
        itex_active: Whether ITEX is loaded (its own oneDNN then runs the model).

    Returns:
        True where both hold.
    """
    return cpu.native_bf16 and (onednn.enabled or itex_active)


def _too_late(onednn: OneDnnState) -> str:
    """TensorFlow reads the variable once, at import: say so when that has happened."""
    if not onednn.tensorflow_imported:
        return ""
    return (f"; TensorFlow is already imported in this process, so changing {VARIABLE} now changes nothing: set it "
            "before the program starts (or before its first `import tensorflow`)")


def bf16_support(cpu: CpuInfo, onednn: OneDnnState, itex_active: bool) -> Support:
    """The mixed_bfloat16 policy on this CPU: native with bf16 instructions where oneDNN runs it, else emulated (unsafe
    under ITEX), quoting the results files.

    Args:
        cpu: The CPU.
        onednn: Whether TensorFlow runs oneDNN there.
        itex_active: Whether ITEX is loaded (its own oneDNN then runs the model).

    Returns:
        The policy's `Support`, with its reason and evidence.
    """
    which = bf16_flags(cpu)
    if bf16_runs_fast(cpu, onednn, itex_active):
        on = policy_file(cpu.name, WITH_BF16, "mixed_bfloat16", "float32")
        runner = "ITEX's oneDNN runs them" if itex_active else f"TensorFlow runs oneDNN ({onednn.why})"
        return Support(NATIVE, f"the CPU has bf16 instructions ({which}) and {runner}: bf16 matmuls and convolutions "
                               f"run natively, without loss scaling ({quote(on, 'mixed_bfloat16', 'float32')})",
                       f"bf16 instructions ({which}) with oneDNN"
                       + ("; no Arm CPU measured" if cpu.is_arm and on == WITH_BF16 else  # (the figures are x86's)
                          "" if (x := times(on, "mixed_bfloat16", "float32")) == "much" else
                          f": {x} float32's speed where measured"),
                       evidence(on, "mixed_bfloat16", "float32"))
    if cpu.native_bf16:
        configs = ("float32" + OFF, "mixed_bfloat16" + OFF)
        off = policy_file(cpu.name, WITH_BF16, *configs)
        slower, figures, measured = times(off, *configs), quote(off, *configs), evidence(off, *configs)
        brief = f"oneDNN is off: TensorFlow's own bfloat16 kernels ran {slower} slower than float32"
        if onednn.switched_off:
            return Support(EMULATED, f"{VARIABLE}={onednn.variable}: without oneDNN, TensorFlow runs bfloat16 in "
                                     f"Eigen, {slower} slower than float32 even on a CPU with bf16 instructions "
                                     f"({figures}). "
                                     f"Unset {VARIABLE} (or set it to 1) before importing TensorFlow to run bfloat16 "
                                     f"through oneDNN{_too_late(onednn)}", f"{VARIABLE}={onednn.variable}: " + brief,
                           measured)
        return Support(EMULATED, f"the CPU has bf16 instructions ({which}) but oneDNN is off ({onednn.why}): "
                                 f"without oneDNN, TensorFlow runs bfloat16 in Eigen, {slower} slower than float32 on "
                                 f"the measured bf16 CPU ({figures}). Set {VARIABLE}=1 before importing TensorFlow to "
                                 f"run it through oneDNN (not measured on this CPU){_too_late(onednn)}",
                       brief, measured)
    if itex_active:
        return Support(UNSAFE, "this CPU has no bf16 instructions (no avx512_bf16, amx_bf16) and ITEX is loaded: "
                               "ITEX's oneDNN aborts the whole process on a bf16 matmul here",
                       "no bf16 instructions, and ITEX's oneDNN aborts on a bf16 matmul here")
    without = policy_file(cpu.name, WITHOUT_BF16, "float32", "mixed_bfloat16")
    figures = quote(without, "float32", "mixed_bfloat16")
    return Support(EMULATED, "this CPU has no bf16 instructions (no avx512_bf16, amx_bf16 or Arm bf16): TensorFlow "
                             f"emulates bf16, far slower than float32 ({figures})",
                   f"no bf16 instructions: emulated, {times(without, 'float32', 'mixed_bfloat16')} slower than "
                   "float32 where measured", evidence(without, "float32", "mixed_bfloat16"))


def fp16_support(cpu: CpuInfo, onednn: OneDnnState, itex_active: bool) -> Support:
    """The mixed_float16 policy on this CPU: unsafe under ITEX on an x86 CPU with fp16 instructions, emulated where
    TensorFlow sends float16 to oneDNN's reference kernels or the CPU has no fp16 arithmetic, else functional.

    Args:
        cpu: The CPU.
        onednn: Whether TensorFlow runs oneDNN there.
        itex_active: Whether ITEX is loaded (its own oneDNN then runs the model).

    Returns:
        The policy's `Support`, with its reason and evidence.
    """
    flags = ", ".join(sorted(cpu.flags & set(FLOAT16_FLAGS)))  # x86's fp16 instructions, as the reasons name them
    if itex_active and cpu.native_fp16 and not cpu.is_arm:
        return Support(UNSAFE, f"ITEX is loaded and this CPU has fp16 instructions ({flags}): ITEX sends float16 to "
                               "its own oneDNN ops, some of which have no float16 kernel (the max-pooling gradient, "
                               "_ITEXMaxPoolGrad, takes bfloat16 and float32 only), so float16 training fails (seen "
                               "with ITEX 2.15.0.0 on an AMX Xeon)",
                       "ITEX has no float16 kernel for some training ops on this CPU: training fails")
    if not itex_active and onednn_takes_float16(cpu, onednn):
        slower = times(WITH_FP16, "float32", "mixed_float16")
        return Support(EMULATED, f"TensorFlow sends float16 to oneDNN on this CPU ({flags}), which trains it in "
                                 "reference kernels (ref:any in ONEDNN_VERBOSE: the convolutions' weight gradients, "
                                 f"the Dense layers' matmuls): far slower than float32 "
                                 f"({quote(WITH_FP16, 'float32', 'mixed_float16', 'mixed_float16' + OFF)})",
                       f"oneDNN trains float16 in reference kernels here: {slower} slower than float32 where measured",
                       evidence(WITH_FP16, "float32", "mixed_float16", "mixed_float16" + OFF))
    if cpu.native_fp16:
        return Support(FUNCTIONAL, "the CPU has fp16 instructions, but TensorFlow's CPU kernels favour bf16; float16 "
                                   "also needs loss scaling", "TensorFlow's CPU kernels favour bf16")
    f32, f16 = (_config(cpu, onednn, itex_active, n) for n in ("float32", "mixed_float16"))
    file = measured_file(cpu, f32, f16)
    return Support(EMULATED, "this CPU has no fp16 arithmetic: TensorFlow emulates float16 on the CPU, far slower than "
                             f"float32 ({quote(file, f32, f16)})",
                   f"no fp16 arithmetic: emulated, {times(file, f32, f16)} slower than float32 where measured",
                   evidence(file, f32, f16))


def fp32_support(cpu: CpuInfo, onednn: OneDnnState, itex_active: bool, bf16: Support) -> Support:
    """The float32 policy on this CPU: native, with what it leaves unused or why it is the fastest safe choice here.

    Args:
        cpu: The CPU.
        onednn: Whether TensorFlow runs oneDNN there.
        itex_active: Whether ITEX is loaded (its own oneDNN then runs the model).
        bf16: The mixed_bfloat16 `Support` here (`bf16_support`), quoted where bfloat16 cannot run through oneDNN.

    Returns:
        The policy's `Support`.
    """
    if bf16_runs_fast(cpu, onednn, itex_active):
        return Support(NATIVE, "float32 is the CPU's native path, but it leaves the bf16 instructions unused",
                       "leaves the bf16 instructions unused")
    if cpu.native_bf16:
        return Support(NATIVE, f"float32, the fastest safe choice while bfloat16 cannot run through oneDNN: {bf16.why}",
                       f"the fastest safe choice here; bfloat16: {bf16.short}", bf16.evidence)
    why = "float32 is the CPU's native fast path; without bf16 instructions mixed precision only adds casts here"
    measured: tuple[Evidence, ...] = ()
    if not onednn.enabled and not onednn.set_by_user and not itex_active and not cpu.is_arm:
        why += "; " + onednn_left_off(onednn)
        measured = evidence(WITH_BF16, "float32 onednn_isa=AVX2", "float32" + OFF)
    return Support(NATIVE, why, "no bf16 instructions: mixed precision would only add casts", measured)


def onednn_left_off(onednn: OneDnnState) -> str:
    """Why the plan leaves oneDNN off where TensorFlow's default does: the one measurement near such a CPU (oneDNN
    limited to AVX2 on the AVX-512 machine) is a proxy, so the plan keeps the default and says what was measured."""
    avx2, eigen = "float32 onednn_isa=AVX2", "float32" + OFF
    results = load(WITH_BF16)
    ratio = results.ratio(avx2, eigen) if results else None
    verdict = ("not measured" if ratio is None else
               f"oneDNN limited to AVX2 kernels ran float32 {times(WITH_BF16, avx2, eigen)} as fast as TensorFlow's "
               "own kernels on an AVX-512 CPU" if ratio >= 1 else
               "oneDNN limited to AVX2 kernels was slower than TensorFlow's own float32 kernels on an AVX-512 CPU")
    return (f"oneDNN stays off, as TensorFlow's default has it ({onednn.why}): {verdict} "
            f"({quote(WITH_BF16, avx2, eigen)}), but no CPU without AVX-512 was measured. To try it, set "
            f"{VARIABLE}=1 before importing TensorFlow and compare with benchmarks/cpu_policy.py")


def preference(cpu: CpuInfo, onednn: OneDnnState, itex_active: bool) -> tuple[str, ...]:
    """The dtype policies in the order this CPU prefers them.

    Args:
        cpu: The CPU.
        onednn: Whether TensorFlow runs oneDNN there.
        itex_active: Whether ITEX is loaded (its own oneDNN then runs the model).

    Returns:
        mixed_bfloat16 first where bfloat16 runs fast (`bf16_runs_fast`), else float32 first.
    """
    if bf16_runs_fast(cpu, onednn, itex_active):
        return ("mixed_bfloat16", "float32", "mixed_float16")
    return ("float32", "mixed_bfloat16", "mixed_float16")


def xla_support(cpu: CpuInfo) -> Support:
    """XLA on this CPU: functional, TensorFlow's own CPU kernels having beaten XLA's CPU JIT where measured.

    Args:
        cpu: The CPU (it picks the results file quoted, `measured_file`).

    Returns:
        XLA's `Support`, quoting the MNIST CNN with and without XLA.
    """
    file, plain, jit = measured_file(cpu), "float32", "float32+xla"
    faster = times(file, plain, jit)
    return Support(FUNCTIONAL, f"TensorFlow's own CPU kernels beat XLA's CPU JIT on the MNIST CNN, {faster} faster "
                               f"({quote(file, plain, jit)}); Keras's own jit_compile='auto' also keeps XLA off on "
                               "CPUs",
                   f"TensorFlow's CPU kernels ran {faster} faster than XLA's where measured (MNIST CNN)",
                   evidence(file, plain, jit))


# The depthwise layers whose bfloat16 gradients oneDNN runs with slow kernels on AVX512-BF16 CPUs without AMX,
# and the measured cases that show it (benchmarks/cpu_layers.py: the layer between two Dense layers, in
# bfloat16 and kept in float32 inside the bfloat16 model).
DEPTHWISE_CLASSES = ("DepthwiseConv2D", "DepthwiseConv1D", "SeparableConv2D")
SLOW_DEPTHWISE = ("DepthwiseConv2D 3x3 stride 2 at 24x24x96", "DepthwiseConv2D 5x5 at 12x12x288",
                  "DepthwiseConv2D 5x5 stride 2 at 12x12x288", "DepthwiseConv1D 5 stride 2 at 128x128",
                  "SeparableConv2D 3x3 stride 2 at 24x24x96")
FAST_DEPTHWISE = "DepthwiseConv2D 3x3 at 24x24x96"
ISLAND = " mixed_bfloat16 + layer float32"
RECURRENT = "LSTM 128 at 64 steps"
MODEL = "MobileNetV3Small 96x96"
MODEL_VARIANTS = ("float32", "mixed_bfloat16", "mixed_bfloat16 + float32 strided or large-kernel depthwise")


def float32_layers(cpu: CpuInfo, onednn: OneDnnState, itex_active: bool) -> tuple[tuple[Float32Layer, ...], str]:
    """The layers a bfloat16 plan keeps in float32 on this CPU (measured on AVX512-BF16 without AMX: strided or
    large-kernel depthwise convolutions, whose bfloat16 gradients oneDNN runs in slow kernels, and LSTMs), or none
    and why."""
    if not bf16_runs_fast(cpu, onednn, itex_active):
        return (), ("bfloat16 does not run through oneDNN's bf16 kernels on this CPU, so no layer was measured "
                    "against float32 in it")
    if itex_active:
        return (), "ITEX runs the bfloat16 ops with its own oneDNN, whose depthwise kernels were not measured"
    if cpu.amx or cpu.is_arm or "avx512_bf16" not in cpu.flags:
        return (), ("no layer was measured slower in bfloat16 on a CPU like this one (the measured CPU has "
                    "AVX512-BF16 without AMX; oneDNN has other bfloat16 kernels on AMX and Arm CPUs)")
    results = load(LAYERS)
    model_runs = [f"{MODEL} {v}" for v in MODEL_VARIANTS]
    lstm_runs = [f"{RECURRENT} {v}" for v in ("float32", "mixed_bfloat16", ISLAND.strip())]
    slow = [(c, results.ratio(c + ISLAND, c + " mixed_bfloat16")) for c in SLOW_DEPTHWISE] if results else []
    figures = "; ".join(f"{c}: {r:.1f}x" for c, r in slow if r is not None) or "not measured"
    fast = results.ratio(FAST_DEPTHWISE + ISLAND, FAST_DEPTHWISE + " mixed_bfloat16") if results else None
    why = ("on CPUs with AVX512-BF16 and no AMX oneDNN runs a depthwise convolution's bfloat16 gradients with slow "
           "kernels at a stride above 1 (backward data: brgconv_strided) or a kernel above 3 (backward weights: "
           "jit_bf16); kept in float32 inside the bfloat16 model, casts included, such a layer trained faster "
           f"(times the bfloat16 speed: {figures}"
           + (f"; a 3x3 one at stride 1 stays in bfloat16, where float32 ran at {fast:.2f}x" if fast else "")
           + "; " + quote(LAYERS, *model_runs, unit="img/s") + ")")
    cases = [c + v for c in (*SLOW_DEPTHWISE, FAST_DEPTHWISE) for v in (" mixed_bfloat16", ISLAND)]
    measured = evidence(LAYERS, *cases, *model_runs, unit="samples/s")
    kept = tuple(Float32Layer(name, ("bfloat16",), why, strides_over=1, kernel_over=3, evidence=measured)
                 for name in DEPTHWISE_CLASSES)
    lstm = results.ratio(RECURRENT + ISLAND, RECURRENT + " mixed_bfloat16") if results else None
    lstm_why = ("TensorFlow runs an LSTM's recurrent loop on this CPU without a faster bfloat16 path, and its state "
                "in bfloat16 moves the loss: kept in float32 inside the bfloat16 model, casts included, it trained "
                + (f"{lstm:.2f}x as fast as in bfloat16 " if lstm else "")
                + "(" + quote(LAYERS, *lstm_runs, unit="samples/s")
                + "), and the model zoo's LSTM then ends the benchmark's steps within the float32 run-to-run "
                  "spread of the loss, which it leaves in bfloat16 (results/zoo-cpu)")
    lstm_measured = evidence(LAYERS, *lstm_runs, unit="samples/s")
    return kept + (Float32Layer("LSTM", ("bfloat16",), lstm_why, evidence=lstm_measured),), ""


ZENDNN_PACKAGE = "zentf"  # AMD's ZenDNN plug-in for TensorFlow (PyPI), enabled by TF_ENABLE_ZENDNN_OPTS=1
ZENDNN_VARIABLE = "TF_ENABLE_ZENDNN_OPTS"  # "1" (read when TensorFlow starts): zentf's kernels replace TensorFlow's


def math_library(onednn: OneDnnState, itex_active: bool, zentf: str | None, zendnn_on: bool) -> str:
    """The library TensorFlow's CPU convolutions and matmuls run in, as the report says it (ITEX, ZenDNN where
    ``zentf`` is installed and ``zendnn_on``, oneDNN or Eigen), with what turns the others on."""
    if itex_active:
        return "ITEX (Intel Extension for TensorFlow's oneDNN kernels)"
    if zentf and zendnn_on:
        both = "; oneDNN is on too: AMD documents ZenDNN with TF_ENABLE_ONEDNN_OPTS=0" if onednn.enabled else ""
        return f"ZenDNN (zentf {zentf}, {ZENDNN_VARIABLE}=1){both}"
    idle = (f"; zentf {zentf} is installed but off ({ZENDNN_VARIABLE}=1 turns it on)" if zentf else
            f"; {ZENDNN_VARIABLE}=1 is set but zentf is not installed (pip install zentf), so it changes nothing"
            if zendnn_on else "")
    if onednn.enabled:
        return "oneDNN" + idle
    return "Eigen (TensorFlow's own kernels: oneDNN is off)" + idle


GRAPPLER_BF16 = "auto_mixed_precision_onednn_bfloat16"  # TensorFlow's own float32-to-bfloat16 rewrite for oneDNN
GRAPPLER_PEER = "fp32 grappler-bf16"  # the zoo's configuration of it: a float32 model, rewritten
ITEX_PEER = "ITEX AMP bf16"  # ITEX's auto mixed precision, switched on by its environment variables


def peers(cpu: CpuInfo, onednn: OneDnnState, itex_active: bool, zentf: str | None) -> tuple[Peer, ...]:
    """What a user of this CPU would pick instead of the plan, each set up as it must be: float32 with oneDNN the
    other way round, the grappler bfloat16 rewrite, ZenDNN (with ``zentf``); under ITEX, ITEX's bfloat16 rewrite
    alone."""
    if itex_active:  # ITEX's own graph rewrite, switched on as the tutorials do; none without bf16 (ITEX aborts)
        return (Peer(ITEX_PEER, "a float32 model that ITEX's graph rewrite turns to bfloat16, with no Keras policy "
                     "(ITEX_AUTO_MIXED_PRECISION=1, ITEX_AUTO_MIXED_PRECISION_DATA_TYPE=BFLOAT16)",
                     env=(("ITEX_AUTO_MIXED_PRECISION", "1"), ("ITEX_AUTO_MIXED_PRECISION_DATA_TYPE", "BFLOAT16"))),
                ) if cpu.native_bf16 else ()
    found: list[Peer] = []
    if onednn.enabled:
        found.append(Peer("fp32 oneDNN-off", f"float32 in TensorFlow's Eigen kernels ({VARIABLE}=0)",
                          env=((VARIABLE, "0"),)))
        if cpu.native_bf16:
            found.append(Peer(GRAPPLER_PEER, "a float32 model that TensorFlow's grappler rewrites to bfloat16 "
                              f"for oneDNN ({GRAPPLER_BF16}), with no Keras policy", rewrite=GRAPPLER_BF16))
    elif not cpu.is_arm:
        found.append(Peer("fp32 oneDNN-on", f"float32 in oneDNN's kernels, which TensorFlow leaves off here "
                          f"({VARIABLE}=1)", env=((VARIABLE, "1"),)))
    if zentf and cpu.vendor.upper().startswith("AMD"):
        zen = (("TF_ENABLE_ZENDNN_OPTS", "1"), (VARIABLE, "0"))
        found.append(Peer("fp32 ZenDNN", f"float32 in AMD's ZenDNN kernels (zentf {zentf})", env=zen))
        if cpu.native_bf16:
            found.append(Peer("ZenDNN bf16-AMP", f"ZenDNN's own bfloat16 mixed precision (zentf {zentf})",
                              env=(*zen, ("TF_ZENDNN_PLUGIN_BF16", "1"))))
    return tuple(found)


GRAPH_AMP_FIGURES = (GRAPPLER_PEER, "fp32", "bf16")  # the rewrite, float32 and the Keras policy, all with XLA off


def graph_amp_support(cpu: CpuInfo, onednn: OneDnnState, itex_active: bool) -> Support:
    """The CPU's own graph rewrite (``graph_amp``), TensorFlow's grappler rewrite to bfloat16 for oneDNN: native
    where bfloat16 runs through oneDNN on bf16 instructions (quoting the zoo runs), else (and under ITEX)
    unsupported."""
    if itex_active:
        return Support(UNSUPPORTED, "ITEX is loaded: its own oneDNN runs the CPU's ops, and neither TensorFlow's "
                                    f"grappler rewrite ({GRAPPLER_BF16}) nor ITEX's auto mixed precision was measured "
                                    "under it; the Keras policy is the supported path here",
                       "ITEX is loaded: no graph rewrite was measured under it")
    if not bf16_runs_fast(cpu, onednn, itex_active):
        if not cpu.native_bf16:
            why = (f"this CPU has no bf16 instructions: the bfloat16 the rewrite ({GRAPPLER_BF16}) makes would be "
                   f"emulated, slower than float32 ({bf16_support(cpu, onednn, itex_active).short})")
        else:
            why = (f"oneDNN is off ({onednn.why}): TensorFlow's grappler rewrite to bfloat16 ({GRAPPLER_BF16}) is a "
                   "oneDNN pass, which TensorFlow skips without oneDNN (the graph stays float32)")
        return Support(UNSUPPORTED, why)
    brief = "TensorFlow's grappler rewrites the float32 graph to bfloat16 for oneDNN"
    rewrite = f"{brief} ({GRAPPLER_BF16}), on the CPU's bf16 instructions ({bf16_flags(cpu)})"
    models = [m for m in zoo_results(cpu.name) if m.source.has(*GRAPH_AMP_FIGURES)]
    if not models:
        return Support(NATIVE, f"{rewrite}; not measured on a CPU like this one ({cpu.name}): `amp-backends bench "
                               "--zoo --configs peers` measures it here", f"{brief}; not measured here")
    figures = "; ".join(f"{m.model}: {m.source.quote(*GRAPH_AMP_FIGURES, unit='samples/s')}" for m in models)
    speed = ", ".join(f"{m.source.times(GRAPPLER_PEER, 'fp32')} float32's speed on {m.model}" for m in models)
    proof = tuple(e for m in models if (e := m.source.evidence(*GRAPH_AMP_FIGURES, unit="samples/s")))
    return Support(NATIVE, f"{rewrite}; measured with XLA off as {GRAPPLER_PEER} (the rewrite) against fp32 (float32) "
                           f"and bf16 (the Keras mixed_bfloat16 policy): {figures}",
                   f"{brief}: {speed}", proof)


# The plan's own rows in a zoo run, and the margin a peer must beat the better of them by in every repetition
PLAN_RUNS = ("auto plan, trainer", "auto plan, fit")
PEER_MARGIN = 1.05  # closer than that is noise on these machines (as the layer plan's measured choice)


def _faster(model: ZooModel, peer: str) -> bool | None:
    """Whether ``peer`` beat the plan's better run by `PEER_MARGIN` in every repetition (``None``: not measured)."""
    mine = [model.reps.get(run) for run in PLAN_RUNS]
    theirs = model.reps.get(peer)
    if not theirs or not all(mine):
        return None
    best = [max(r) for r in zip(*mine, strict=False)]
    return all(t > PEER_MARGIN * b for t, b in zip(theirs, best, strict=False))


def judge_peers(cpu: CpuInfo, found: tuple[Peer, ...]) -> tuple[PeerVerdict, ...]:
    """A verdict on each peer ``found`` (`peers`) from the committed zoo runs of a CPU the probe names alike,
    quoting the figures or saying nothing was measured: it wins only where it beat the plan's better run by
    `PEER_MARGIN` in every repetition of every model, its loss within float32's spread."""
    models = zoo_results(cpu.name)
    verdicts = []
    for peer in found:
        measured = [(m, faster) for m in models if (faster := _faster(m, peer.name)) is not None]
        if not measured:
            verdicts.append(PeerVerdict(peer.name, False, f"{peer.why}: not measured on a CPU like this one "
                                        f"({cpu.name}); `amp-backends bench --zoo --configs peers` measures it here",
                                        graph_rewrite=peer.rewrite is not None))
            continue
        off = [m.model for m, _ in measured if not m.loss_ok.get(peer.name, False)]
        won = all(w for _, w in measured) and not off
        figures = "; ".join(
            f"{m.model}: {m.source.figure(peer.name)} samples/s, the plan {m.source.figure(PLAN_RUNS[0])} with the "
            f"trainer and {m.source.figure(PLAN_RUNS[1])} with Keras fit" for m, _ in measured)
        proof = tuple(e for m, _ in measured if (e := m.source.evidence(peer.name, *PLAN_RUNS, unit="samples/s")))
        where = ", ".join(dict.fromkeys(f"{e.machine}, {e.run}, {e.file}" for e in proof))
        if won:
            verdict = f"faster than the plan by over {PEER_MARGIN - 1:.0%} in every repetition of every model measured"
        elif off and all(w for _, w in measured):
            verdict = (f"faster than the plan by over {PEER_MARGIN - 1:.0%} in every repetition, but its loss left "
                       f"float32's run-to-run spread on {', '.join(off)}")
        elif all(m.source.medians[peer.name] < max(m.source.medians[r] for r in PLAN_RUNS) for m, _ in measured):
            verdict = "slower than the plan's better run (the trainer or Keras fit) on every model measured"
        else:
            verdict = (f"not faster than the plan by {PEER_MARGIN - 1:.0%} in every repetition of every model "
                       "measured: within the noise")
        verdicts.append(PeerVerdict(peer.name, won, f"{peer.why}: {verdict} ({figures}; measured on {where})",
                                    proof, graph_rewrite=peer.rewrite is not None))
    return tuple(verdicts)
