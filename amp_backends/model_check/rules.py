"""The rules: from the traced graph and the planned device to findings, judged as a performance engineer would.

A rule reports what costs time or accuracy, says how much (the share of the model's matmul/convolution
FLOPs it concerns), and stays quiet or reports ``info`` where the cost is small or the cause unavoidable:

* below :data:`SIGNIFICANT` (1%) of the FLOPs a float32 layer or an odd width cannot cost more than a few
  percent of a step: ``info``;
* a width fixed by the data — the input's channels or features (nothing computes them), the targets' width
  at an output (10 classes, one logit, one image channel) — is real but not a mistake: ``info``;
* layer widths matter only where the plan's precision has a matrix unit; elsewhere nothing is said.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from .result import Finding, Summary
from .target import EMULATED, FUNCTIONAL, Target
from .trace import GemmOp, ModelGraph

SIGNIFICANT = 0.01  # share of matmul/convolution FLOPs above which a slow or misaligned layer is a warning
# A float32 first or output layer is a deliberate, recommended pattern: a warning only when it is this large.
EDGE_SIGNIFICANT = 0.05
SLOW_OP_SIGNIFICANT = 0.05  # share of the forward pass's memory traffic above which a slow op is a warning
REDUCED = ("float16", "bfloat16", "float8")
DENSE_CLASSES = ("Dense", "EinsumDense")
# Ops with no matrix-unit path: they only move memory, forward and (their *Grad ops) backward.
SLOW_OPS = {"ResizeNearestNeighbor": "ResizeNearestNeighborGrad", "ResizeBilinear": "ResizeBilinearGrad",
            "ResizeBicubic": "ResizeBicubicGrad", "ResizeArea": "(no gradient)",
            "ScaleAndTranslate": "ScaleAndTranslateGrad"}
SLOW_LAYERS = ("UpSampling1D", "UpSampling2D", "UpSampling3D", "Resizing")
FINAL_ACTIVATIONS = {"Softmax": "softmax", "LogSoftmax": "log_softmax", "Sigmoid": "sigmoid"}


def _next_multiple(value: int, align: int) -> int:
    return -(-value // align) * align


def _op_dtype(g: ModelGraph, op: GemmOp) -> str:
    return "float8" if g.layer(op.layer).policy.startswith("float8") else op.dtype


def _fp8_layer(g: ModelGraph, t: Target, op: GemmOp) -> bool:
    info = g.layer(op.layer)
    if info.policy.startswith("float8"):
        return True
    return t.fp8 and info.class_name in DENSE_CLASSES and not op.input_from_data and not op.output_to_model


def _labels(class_name: str, kind: str) -> dict[str, str]:
    if kind in ("conv", "conv_transpose", "depthwise"):
        return {"C_out": "filters", "C_in": "input channels"}
    if class_name == "Dense":
        return {"M": "rows (batch x positions)", "N": "units", "K": "input features"}
    if class_name == "EinsumDense":
        return {"M": "rows (batch x positions)", "N": "output width", "K": "input width"}
    return {"M": "rows M", "N": "columns N", "K": "reduction K"}


class Rules:
    """Applies every rule to one traced model for one target; :meth:`run` returns the findings, worst first."""

    def __init__(self, graph: ModelGraph, target: Target, batch_size: int | None) -> None:
        self.g = graph
        self.t = target
        self.batch_size = batch_size
        self.known = [op for op in graph.gemms if op.flops is not None]
        self.total = float(sum(op.flops for op in self.known)) or 1.0
        self.findings: list[Finding] = []
        self.model_built_float32 = False

    # -- helpers ---------------------------------------------------------------------------------
    def dims(self, op: GemmOp) -> dict[str, int | None]:
        """The op's dimensions that decide alignment; rows that grow with an unknown batch are left out."""
        if op.rows_include_batch and self.batch_size is None:
            return {d: v for d, v in op.dims.items() if d != "M"}
        return dict(op.dims)

    def share(self, ops: Iterable[GemmOp]) -> float:
        return sum(op.flops or 0 for op in ops) / self.total

    def add(self, severity: str, code: str, layer: int | str, what: str, why: str, fix: str,
            share: float | None = None, **details: Any) -> None:
        path = self.g.layer(layer).path if isinstance(layer, int) else layer
        self.findings.append(Finding(severity, code, path, what, why, fix,
                                     None if share is None else round(share, 6), details))

    def run(self) -> list[Finding]:
        self.emulated_policy()
        self.policy_mismatch()
        self.outputs()
        self.float32_compute()
        self.shapes()
        self.slow_ops()
        order = {"error": 0, "warning": 1, "info": 2}
        return sorted(self.findings, key=lambda f: (order[f.severity], -(f.flops_share or 0)))

    # -- 6: a policy the hardware emulates --------------------------------------------------------
    def emulated_policy(self) -> None:
        t = self.t
        if t.policy_level == EMULATED:
            self.add("warning", "emulated-policy", 0, f"the plan's policy {t.policy} is emulated on this {t.backend} device",
                     f"{t.policy_why}. Emulated {t.compute_dtype} is slower than float32 here: training will be slower, "
                     "not faster", "use the automatic plan (remove the policy override and force); keep the forced "
                     "policy only to test numerics", policy=t.policy)
        elif t.policy_level == FUNCTIONAL:
            self.add("info", "functional-policy", 0, f"the plan's policy {t.policy} runs here without a speed-up",
                     t.policy_why, "nothing to fix; the automatic plan may be as fast", policy=t.policy)

    # -- the model built under another policy than the plan's ----------------------------------
    def policy_mismatch(self) -> None:
        t, g = self.t, self.g
        if t.graph_amp or not self.known:
            return
        by_dtype: dict[str, float] = defaultdict(float)
        for op in self.known:
            by_dtype[_op_dtype(g, op)] += op.flops / self.total
        if t.mixed:
            pinned = [op for op in self.known if g.layer(op.layer).compute_dtype == "float32" and op.dtype == "float32"]
            if self.share(pinned) >= 0.5:
                self.model_built_float32 = True
                self.add("warning", "policy-mismatch", 0,
                         f"{100 * self.share(pinned):.0f}% of the FLOPs are in layers whose dtype policy is float32, "
                         f"although the plan's policy is {t.policy}",
                         "the model was built before the plan's policy was set (a Keras dtype policy applies to layers "
                         f"created after it): it trains in float32 and gets none of {t.policy}'s speed",
                         "call amp_backends.auto_configure() before building the model", policy=t.policy)
                return
        other = {d: s for d, s in by_dtype.items() if d in ("float16", "bfloat16") and d != t.compute_dtype}
        for dtype, share in other.items():
            if share < SIGNIFICANT:
                continue
            policy = f"mixed_{dtype}"
            why = t.rejected.get(policy, "the plan chose another policy for this hardware")
            self.add("warning", "policy-mismatch", 0,
                     f"{100 * share:.0f}% of the FLOPs run in {dtype}, but the plan's policy is {t.policy}",
                     f"the model was built under {policy}; the plan rejected it here: {why}",
                     "build the model after amp_backends.auto_configure() (or under the plan's policy)",
                     share, policy=t.policy, model_dtype=dtype)

    # -- 1, 2: outputs not float32; a final softmax/sigmoid in reduced precision -----------------
    def outputs(self) -> None:
        n = len(self.g.outputs)
        for out in self.g.outputs:
            label = f"the model's output {out.index}" if n > 1 else "the model's output"
            act = FINAL_ACTIVATIONS.get(out.producer_type)
            if act and out.producer_dtype in ("float16", "bfloat16"):
                also = f", and {label} is {out.dtype}" if out.dtype in ("float16", "bfloat16") else ""
                self.add("error", "final-activation", out.layer,
                         f"{label} is a {act} computed in {out.producer_dtype}{also}",
                         f"{out.producer_dtype} keeps about {3 if out.producer_dtype == 'float16' else 2} significant digits"
                         + (" and nothing below 6e-8" if out.producer_dtype == "float16" else "")
                         + ": probabilities near 0 and 1 round off, and the loss's log(p) reads the rounded values "
                         "(Keras's mixed precision guide computes the final activation in float32)",
                         f"give this layer activation=None and add keras.layers.Activation('{act}', dtype='float32') "
                         "after it (keras.applications: classifier_activation=None, then that Activation)",
                         output=out.index, dtype=out.producer_dtype)
            elif out.dtype in ("float16", "bfloat16"):
                self.add("warning", "output-dtype", out.layer, f"{label} is {out.dtype}, not float32",
                         f"the loss and its gradient then start from {out.dtype} values"
                         + (" (float16 overflows above 65504 and keeps about 3 significant digits)"
                            if out.dtype == "float16" else " (bfloat16 keeps about 2 significant digits)"),
                         "end the model with keras.layers.Activation('linear', dtype='float32') (or 'softmax'/'sigmoid' "
                         "there, if the last layer applied one)", output=out.index, dtype=out.dtype)

    # -- 3: matmuls/convolutions in float32 under a mixed policy ---------------------------------
    def float32_compute(self) -> None:
        t, g = self.t, self.g
        if not t.mixed or t.graph_amp:
            return
        by_layer: dict[int, list[GemmOp]] = defaultdict(list)
        for op in g.gemms:
            if op.dtype == "float32":
                by_layer[op.layer].append(op)
        unit, low = t.unit_for("float32"), t.unit_for(t.compute_dtype)
        if unit:
            rate = f"on {unit[0]}, at about half the {t.compute_dtype} rate"
        elif low:
            rate = f"without the {low[0]}, several times slower than {t.compute_dtype} on them"
        else:
            rate = f"at the float32 rate instead of the {t.compute_dtype} rate"
        for layer, ops in by_layer.items():
            info = g.layer(layer)
            share = self.share(ops)
            pinned = info.compute_dtype == "float32"
            if pinned and self.model_built_float32:
                continue
            at_output = all(op.output_to_model for op in ops)
            at_input = all(op.input_from_data for op in ops)
            edge = pinned and (at_output or at_input)
            severity = "warning" if share >= (EDGE_SIGNIFICANT if edge else SIGNIFICANT) else "info"
            op_types = ", ".join(sorted({op.op_type for op in ops}))
            if pinned:
                place = " (the model's output layer)" if at_output else " (the model's first layer)" if at_input else ""
                what = (f"{info.class_name}{place} is pinned to float32 (dtype policy {info.policy}) under the "
                        f"{t.policy} plan")
                why = f"its {op_types} runs in float32, {rate}"
                if at_output or at_input:
                    why += ("; float32 at the output keeps the loss in full precision (the recommended pattern)"
                            if at_output else "; float32 on the raw input is a deliberate choice")
                    why += ", and" + (" at this size it costs little" if severity == "info" else " it is a large layer")
                    fix = ("nothing to do at this size" if severity == "info" else
                           f"let the layer compute in {t.compute_dtype} (remove dtype='float32') and add "
                           "keras.layers.Activation('linear' or its activation, dtype='float32') after it")
                else:
                    fix = ("remove dtype='float32' from this layer so it follows the plan's policy, unless it needs "
                           "float32 for a numerical reason")
            else:
                what = (f"{info.class_name} (dtype policy {info.policy}) computes its {op_types} in float32 inside its "
                        "call")
                why = (f"the traced graph shows {op_types} with T=float32 in this layer although it computes in "
                       f"{info.compute_dtype}: its code casts to float32 (tf.cast) before the matmul; it runs {rate}")
                fix = ("compute in self.compute_dtype (drop the tf.cast(..., tf.float32) of the matmul's inputs; cast the "
                       "result if a float32 output is needed)")
            self.add(severity, "float32-compute", layer, what, why, fix, share, ops=op_types, pinned=pinned)

    # -- 4: shapes the matrix units run at full efficiency ---------------------------------------
    def shapes(self) -> None:
        t, g = self.t, self.g
        per_layer: dict[int, dict[str, Any]] = {}
        batch_ops: list[GemmOp] = []
        batch_align = 0
        depthwise: list[GemmOp] = []
        for op in g.gemms:
            unit = t.unit_for(_op_dtype(g, op), _fp8_layer(g, t, op))
            if unit is None:
                continue
            name, align = unit
            if op.kind == "depthwise":
                depthwise.append(op)
                continue
            labels = _labels(g.layer(op.layer).class_name, op.kind)
            entry = per_layer.setdefault(op.layer, {"ops": [], "dims": {}, "unit": name, "align": align, "dtype": op.dtype})
            entry["ops"].append(op)
            for dim, value in self.dims(op).items():
                if value is None or value % align == 0:
                    continue
                if dim == "M" and op.rows_include_batch:
                    batch_ops.append(op)
                    batch_align = max(batch_align, align)
                    continue
                expected = ((dim in ("K", "C_in") and op.input_from_data)
                            or (dim in ("N", "C_out") and op.output_to_model))
                entry["dims"][labels.get(dim, dim)] = (value, expected, dim)
        for layer, entry in per_layer.items():
            if not entry["dims"]:
                continue
            self._shape_finding(layer, entry)
        if batch_ops and self.batch_size:
            unique = list({op.name: op for op in batch_ops}.values())
            share = self.share(unique)
            self.add("warning" if share >= SIGNIFICANT else "info", "batch-size", 0,
                     f"batch size {self.batch_size} is not a multiple of {batch_align}: the rows of "
                     f"{len(unique)} matmul(s) are misaligned",
                     "a Dense layer's matmul has one row per sample (per position): the matrix units run it at full "
                     f"efficiency only when that count is a multiple of {batch_align}",
                     self._batch_fix(batch_align), share,
                     batch_size=self.batch_size, alignment=batch_align)
        if depthwise:
            layers = sorted({op.layer for op in depthwise})
            share = self.share(depthwise)
            self.add("info", "depthwise", layers[0] if len(layers) == 1 else 0,
                     f"{len(depthwise)} depthwise convolution(s) do not run on matrix units",
                     "a depthwise convolution has one input channel per filter: no matrix multiplication for the "
                     "matrix units, it is memory-bound", "nothing to do: expected for MobileNet-style models", share,
                     layers=[g.layer(i).path for i in layers])

    def _batch_fix(self, align: int) -> str:
        up, down = _next_multiple(self.batch_size, align), self.batch_size // align * align
        return f"use a batch of {up}" + (f" (or {down})" if down >= align else "")

    def _shape_finding(self, layer: int, entry: dict[str, Any]) -> None:
        info = self.g.layer(layer)
        align, unit = entry["align"], entry["unit"]
        share = self.share(entry["ops"])
        dims = entry["dims"]
        avoidable = {k: v for k, v in dims.items() if not v[1]}
        names = " and ".join(f"{label} {v[0]}" for label, v in dims.items())
        verb = "is" if len(dims) == 1 else "are"
        what = f"{info.class_name}: {names} {verb} not a multiple of {align}"
        why = (f"the {unit} run {entry['dtype']} matmuls and convolutions at full efficiency only on multiples of "
               f"{align} (16 bytes); other widths run on padded or slower kernels")
        if avoidable:
            severity = "warning" if share >= SIGNIFICANT else "info"
            fixes = []
            for label, (value, _, dim) in avoidable.items():
                target = _next_multiple(value, align)
                if dim in ("K", "C_in"):
                    fixes.append(f"{label} {value} come from the layer before: make it {target} wide")
                else:
                    fixes.append(f"pad {label} {value} -> {target}")
            fix = "; ".join(fixes)
            expected = [f"{label} {v[0]}" for label, v in dims.items() if v[1]]
            if expected:
                why += f" ({', '.join(expected)}: fixed by the data)"
        else:
            severity = "info"
            inputs = [v for v in dims.values() if v[2] in ("K", "C_in")]
            sides = "input" if inputs and len(inputs) == len(dims) else "output" if not inputs else "input/output"
            what += f" (expected: {sides} dimension fixed by the data)"
            fix = "nothing to do: " + ("the data has this width" if sides == "input" else
                                       "the targets have this width" if sides == "output" else
                                       "the data and targets fix them")
            if inputs and info.class_name in DENSE_CLASSES:
                fix += (f" (if it is a choice, such as a noise vector's size, {_next_multiple(inputs[0][0], align)} "
                        "would be aligned)")
        self.add(severity, "tensor-core-shape", layer, what, why, fix, share, alignment=align, unit=unit,
                 dims={label: v[0] for label, v in dims.items()}, expected=[label for label, v in dims.items() if v[1]])

    # -- 5: ops with no fast reduced-precision path ----------------------------------------------
    def slow_ops(self) -> None:
        t, g = self.t, self.g
        unit = t.unit_for(t.effective_dtype)
        if unit is None or t.effective_dtype == "float32":
            return
        total_traffic = float(sum(g.layer_traffic.values())) or 1.0
        n_ops = len(g.others) + len(g.gemms)
        by_layer: dict[int, list[Any]] = defaultdict(list)
        for op in g.others:
            if op.op_type in SLOW_OPS or g.layer(op.layer).class_name in SLOW_LAYERS:
                by_layer[op.layer].append(op)
        for layer, ops in by_layer.items():
            share = g.layer_traffic.get(layer, 0) / total_traffic
            kinds = sorted({op.op_type for op in ops})
            resize = [k for k in kinds if k in SLOW_OPS]
            grads = ", ".join(SLOW_OPS[k] for k in resize) if resize else "a sum over the copies"
            info = g.layer(layer)
            self.add("warning" if share >= SLOW_OP_SIGNIFICANT else "info", "slow-op", layer,
                     f"{info.class_name} ({', '.join(kinds)}) has no {unit[0]} path: {100 * share:.1f}% of the forward "
                     f"pass's estimated memory traffic ({len(ops)} of {n_ops} forward ops)",
                     f"a resize only copies memory and its gradient ({grads}) adds the copies back: neither gets "
                     f"faster in {t.effective_dtype}, the convolutions around it do (the GAN tutorial's profile had "
                     "ResizeNearestNeighbor and its gradient among the top GPU ops)",
                     "replace UpSampling2D + Conv2D(f, k, padding='same') by Conv2DTranspose(f, k, strides=2, "
                     f"padding='same'), a convolution the {unit[0]} run; or keep it if its share is small",
                     None, traffic_share=round(share, 6), op_count=len(ops), forward_ops=n_ops, ops=kinds)

    # -- the summary -----------------------------------------------------------------------------
    def summary(self) -> Summary:
        g, t = self.g, self.t
        shares: dict[str, float] = defaultdict(float)
        eligible = 0.0
        for op in self.known:
            dtype = _op_dtype(g, op)
            shares[dtype] += op.flops / self.total
            unit = t.unit_for(dtype, _fp8_layer(g, t, op))
            if unit is None or op.kind == "depthwise":
                continue
            if all(v is not None and v % unit[1] == 0 for v in self.dims(op).values()):
                eligible += op.flops / self.total
        return Summary(
            flops_per_image=(self.total if self.known else 0.0) / g.batch,
            dtype_shares={d: round(s, 6) for d, s in shares.items()},
            reduced_precision_share=round(sum(s for d, s in shares.items() if d in REDUCED), 6),
            eligible_share=round(eligible, 6) if t.units else None,
            matrix_units={d: u for d, (u, _) in t.units.items()},
            unknown_flops_ops=len(g.gemms) - len(self.known),
        )

    def fp8_eligibility(self) -> list[tuple[str, str | None]]:
        """``(layer path, why not)`` for every Dense/EinsumDense layer, ``None`` where it may train in float8.

        Eligible: neither the first layer (its input is the data) nor the last (its output is the model's:
        both stay in the policy's precision, as fp8 recipes keep them), one plain matmul, every dimension a
        multiple of 16 (what fp8 GEMMs need; rows that grow with an unknown batch are not judged).
        """
        g = self.g
        by_layer: dict[int, list[GemmOp]] = defaultdict(list)
        for op in g.gemms:
            by_layer[op.layer].append(op)
        out: list[tuple[str, str | None]] = []
        for layer, ops in by_layer.items():
            info = g.layer(layer)
            if info.class_name not in DENSE_CLASSES:
                continue
            why = None
            if any(op.input_from_data for op in ops):
                why = "the first layer: it reads the input data, kept in the policy's precision"
            elif any(op.output_to_model for op in ops):
                why = "the last layer: its output is the model's, kept in the policy's precision"
            elif any(op.kind != "matmul" for op in ops):
                why = "not a plain matmul"
            else:
                bad = {d: v for op in ops for d, v in self.dims(op).items() if v is None or v % 16}
                if bad:
                    labels = _labels(info.class_name, "matmul")
                    why = "not a multiple of 16 (fp8 GEMMs need it): " + ", ".join(
                        f"{labels.get(d, d)} {'unknown' if v is None else v}" for d, v in bad.items())
            out.append((info.path, why))
        return out
