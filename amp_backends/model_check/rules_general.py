"""The rules: from the traced graph and the planned device to findings, judged as a performance engineer would.

A rule says how much a cost matters (the share of the model's matmul/convolution FLOPs) and reports ``info``
where it is small (below `SIGNIFICANT`, 1%) or fixed by the data (the input's width, the targets' width at an
output). Layer widths matter only where the plan's precision has a matrix unit; elsewhere nothing is said.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from . import rules_policy, rules_transformer
from .result import SIZED_MOST, Finding, Summary
from .rules_base import (DENSE_CLASSES, EDGE_SIGNIFICANT, FINAL_ACTIVATIONS, REDUCED, SIGNIFICANT, SLOW_LAYERS,
                         SLOW_OP_SIGNIFICANT, SLOW_OPS, RuleContext, fp8_layer, labels, next_multiple, op_dtype)
from .trace import GemmOp, by_layer


class Rules(RuleContext):
    """Applies every rule to one traced model for one target; `run` returns the findings, worst first."""

    def run(self) -> list[Finding]:
        """Apply every rule in turn.

        Returns:
            The findings, errors first, then warnings, then infos; ``unsized-model`` first among its own, then the
            largest share of FLOPs first.
        """
        self.unsized()
        rules_policy.emulated_policy(self)
        rules_policy.policy_mismatch(self)
        rules_policy.float32_layers(self)
        self.outputs()
        self.float32_compute()
        self.shapes()
        self.slow_ops()
        for rule in (rules_transformer.mask_overflow, rules_transformer.attention_softmax,
                     rules_transformer.normalization, rules_transformer.vocabulary, rules_transformer.logits):
            rule(self)
        order = {"error": 0, "warning": 1, "info": 2}
        return sorted(self.findings, key=lambda f: (order[f.severity], f.code != "unsized-model",
                                                    -(f.flops_share or 0)))

    # -- unsized-model: most matmuls have dynamic shapes ---------------------------------------------
    def unsized(self) -> None:
        """A warning where too few matmuls/convolutions have static shapes for shares to be given (`SIZED_MOST`)."""
        if self.sized:
            return
        n, unknown = len(self.graph.gemms), len(self.graph.gemms) - len(self.known)
        self.add("warning", "unsized-model", 0,
                 f"could not size enough of the model: {unknown} of {n} matmul/convolution ops have dynamic shapes "
                 f"(shares are given once {SIZED_MOST:.0%} are sized)",
                 "the model leaves dimensions open besides the batch (a sequence length, an image size): their ops "
                 "have no static size, so their FLOPs, shares and widths are unknown and a share of the others "
                 "would pass for the model's (none is given)",
                 "give the shapes: check_model(model, inputs=<one batch, its shapes or dataset.element_spec>), or "
                 "amp-backends check --seq-len N / --input-shape", None, unknown_ops=unknown, ops=n)

    def _head_fix(self, layer: int, act: str) -> str:
        """The fix of a final softmax/sigmoid in low precision: `prepare_model`'s where its layer plan computes that
        layer in float32, else by hand (a softmax inside a call, a Lambda, a reshape after the head)."""
        plan = self.layer_plan
        path = self.graph.layer(layer).path
        if plan is None or any(d.path == path and d.source == "head" for d in plan.decisions):
            return ("call amp_backends.prepare_model(model, plan) after building the model and before compile(): it "
                    "computes the output layer in float32 (the Trainer does it itself); or give this layer "
                    f"dtype='float32' (or activation=None and a keras.layers.Activation('{act}', dtype='float32') "
                    "after it)")
        return (f"compute the {act} in float32 yourself, as prepare_model leaves it (a {act} inside a call, a Lambda, "
                "layers after it, or a dtype given to the layer): keras.layers.Activation("
                f"'{act}', dtype='float32') as the model's last layer on the logits, or "
                f"tf.nn.{act}(tf.cast(logits, 'float32')) in the call")

    # -- final-activation, output-dtype: a final softmax/sigmoid or an output in reduced precision --
    def outputs(self) -> None:
        """An error for a final softmax/sigmoid computed in float16/bfloat16; a warning for an output in either."""
        n = len(self.graph.outputs)
        for out in self.graph.outputs:
            label = f"the model's output {out.index}" if n > 1 else "the model's output"
            act = FINAL_ACTIVATIONS.get(out.producer_type)
            if act and out.producer_dtype in ("float16", "bfloat16"):
                also = f", and {label} is {out.dtype}" if out.dtype in ("float16", "bfloat16") else ""
                self.add("error", "final-activation", out.layer,
                         f"{label} is a {act} computed in {out.producer_dtype}{also}",
                         f"{out.producer_dtype} keeps about {3 if out.producer_dtype == 'float16' else 2} significant "
                         "digits" + (" and nothing below 6e-8" if out.producer_dtype == "float16" else "")
                         + ": probabilities near 0 and 1 round off, and the loss's log(p) reads the rounded values "
                         "(Keras's mixed precision guide computes the final activation in float32)",
                         self._head_fix(out.layer, act),
                         output=out.index, dtype=out.producer_dtype)
            elif out.dtype in ("float16", "bfloat16"):
                self.add("warning", "output-dtype", out.layer, f"{label} is {out.dtype}, not float32",
                         f"the loss and its gradient then start from {out.dtype} values"
                         + (" (float16 overflows above 65504 and keeps about 3 significant digits)"
                            if out.dtype == "float16" else " (bfloat16 keeps about 2 significant digits)"),
                         "end the model with keras.layers.Activation('linear', dtype='float32') "
                         "(or 'softmax'/'sigmoid' there, if the last layer applied one)",
                         output=out.index, dtype=out.dtype)

    # -- float32-compute: matmuls/convolutions in float32 under a mixed policy ----------------------
    def float32_compute(self) -> None:
        """The layers whose matmuls/convolutions run in float32 under a mixed policy (not those the plan keeps so)."""
        target, graph = self.target, self.graph
        if not target.mixed or target.graph_amp:
            return
        unit, low = target.unit_for("float32"), target.unit_for(target.compute_dtype)
        if unit:
            rate = f"on {unit[0]}, at about half the {target.compute_dtype} rate"
        elif low:
            rate = f"without the {low[0]}, several times slower than {target.compute_dtype} on them"
        else:
            rate = f"at the float32 rate instead of the {target.compute_dtype} rate"
        for layer, ops in by_layer(op for op in graph.gemms if op.dtype == "float32").items():
            info = graph.layer(layer)
            share = self.share(ops)
            pinned = info.compute_dtype == "float32"
            if (pinned and self.model_built_float32) or self.kept_float32(info):
                continue  # the plan's own float32 layers: the float32-layers finding speaks of them
            at_output = all(op.output_to_model for op in ops)
            at_input = all(op.input_from_data for op in ops)
            if at_output and (vocab := {op.dims.get("N") for op in ops}) <= rules_transformer.vocabularies(self):
                self.add("info", "float32-compute", layer, f"{info.class_name} computes the model's logits over a "
                         f"vocabulary of {', '.join(map(str, sorted(vocab)))} in float32 under the {target.policy} "
                         "plan", "float32 logits keep close logits apart (as the logits-dtype finding advises), "
                         f"their GEMM {rate}", "nothing to do: the recommended pattern for a language model's head",
                         share, ops=", ".join(sorted({op.op_type for op in ops})), pinned=pinned)
                continue
            edge = (pinned and at_input) or at_output  # float32 at the output is the recommended pattern
            severity = self.level(share, EDGE_SIGNIFICANT if edge else SIGNIFICANT, "info" if edge else "warning")
            op_types = ", ".join(sorted({op.op_type for op in ops}))
            if pinned:
                place = " (the model's output layer)" if at_output else " (the model's first layer)" if at_input else ""
                what = (f"{info.class_name}{place} is pinned to float32 (dtype policy {info.policy}) under the "
                        f"{target.policy} plan")
                why = f"its {op_types} runs in float32, {rate}"
                if at_output or at_input:
                    why += ("; float32 at the output keeps the loss in full precision (the recommended pattern)"
                            if at_output else "; float32 on the raw input is a deliberate choice")
                    why += (", and its size is unknown (dynamic shapes)" if share is None else ", and" +
                            (" at this size it costs little" if severity == "info" else " it is a large layer"))
                    fix = ("nothing to do at this size" if severity == "info" else
                           f"let the layer compute in {target.compute_dtype} (remove dtype='float32') and add "
                           "keras.layers.Activation('linear' or its activation, dtype='float32') after it")
                else:
                    fix = ("remove dtype='float32' from this layer so it follows the plan's policy, unless it needs "
                           "float32 for a numerical reason")
            else:
                what, why, fix = rules_policy.float32_in_call(info, op_types, rate, at_output,
                                                              any(op.constant_operand for op in ops))
            self.add(severity, "float32-compute", layer, what, why, fix, share, ops=op_types, pinned=pinned)

    # -- tensor-core-shape, batch-size, depthwise: shapes the matrix units run at full efficiency ----
    def shapes(self) -> None:
        """The dimensions and batch size that are no multiple of their matrix unit's alignment, and the depthwise
        convolutions (no matrix unit runs them)."""
        target, graph = self.target, self.graph
        per_layer: dict[int, dict[str, Any]] = {}
        batch_ops: list[GemmOp] = []
        batch_align = 0
        depthwise: list[GemmOp] = []
        vocabularies = rules_transformer.vocabularies(self)
        for op in graph.gemms:
            unit = target.unit_for(op_dtype(graph, op), fp8_layer(graph, target, op))
            if unit is None:
                continue
            name, align = unit
            if op.kind == "depthwise":
                depthwise.append(op)
                continue
            names = labels(graph.layer(op.layer).class_name, op.kind)
            entry = per_layer.setdefault(op.layer,
                                         {"ops": [], "dims": {}, "unit": name, "align": align, "dtype": op.dtype})
            entry["ops"].append(op)
            for dim, value in self.dims(op).items():
                if value is None or value % align == 0 or (dim in ("N", "K") and value in vocabularies):
                    continue  # a vocabulary's width: the vocabulary-size rule says it
                if dim == "M" and op.rows_include_batch:
                    batch_ops.append(op)
                    batch_align = max(batch_align, align)
                    continue
                expected = ((dim in ("K", "C_in") and op.input_from_data)
                            or (dim in ("N", "C_out") and op.output_to_model))
                entry["dims"][names.get(dim, dim)] = (value, expected, dim)
        for layer, entry in per_layer.items():
            if entry["dims"]:
                self._shape_finding(layer, entry)
        if batch_ops and self.batch_size:
            unique = list({op.name: op for op in batch_ops}.values())
            share = self.share(unique)
            down = self.batch_size // batch_align * batch_align
            smaller = f" (or {down})" if down >= batch_align else ""
            self.add(self.level(share, SIGNIFICANT), "batch-size", 0,
                     f"batch size {self.batch_size} is not a multiple of {batch_align}: the rows of "
                     f"{len(unique)} matmul(s) are misaligned",
                     "a Dense layer's matmul has one row per sample (per position): the matrix units run it at full "
                     f"efficiency only when that count is a multiple of {batch_align}",
                     f"use a batch of {next_multiple(self.batch_size, batch_align)}{smaller}", share,
                     batch_size=self.batch_size, alignment=batch_align)
        if depthwise:
            layers = sorted({op.layer for op in depthwise})
            share = self.share(depthwise)
            self.add("info", "depthwise", layers[0] if len(layers) == 1 else 0,
                     f"{len(depthwise)} depthwise convolution(s) do not run on matrix units",
                     "a depthwise convolution has one input channel per filter: no matrix multiplication for the "
                     "matrix units, it is memory-bound", "nothing to do: expected for MobileNet-style models", share,
                     layers=[graph.layer(i).path for i in layers])

    def _shape_finding(self, layer: int, entry: dict[str, Any]) -> None:
        info = self.graph.layer(layer)
        align, unit = entry["align"], entry["unit"]
        share = self.share(entry["ops"])
        dims = entry["dims"]
        avoidable = {k: v for k, v in dims.items() if not v[1]}
        names = " and ".join(f"{label} {v[0]}" for label, v in dims.items())
        verb = "is" if len(dims) == 1 else "are"
        what = f"{info.class_name}: {names} {verb} not a multiple of {align}"
        bits = re.search(r"\d+", entry["dtype"])  # (float16: 16; float8_e4m3fn: 8)
        size = f" ({align * int(bits.group()) // 8} bytes)" if bits else ""
        why = (f"on the {unit}, {entry['dtype']} matmuls and convolutions run at full efficiency only on multiples of "
               f"{align}{size}; other widths run on padded or slower kernels")
        if avoidable:
            severity = self.level(share, SIGNIFICANT)
            fix = "; ".join(f"{label} {value} come from the layer before: make it {next_multiple(value, align)} wide"
                            if dim in ("K", "C_in") else f"pad {label} {value} -> {next_multiple(value, align)}"
                            for label, (value, _, dim) in avoidable.items())
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
                fix += (f" (if it is a choice, such as a noise vector's size, {next_multiple(inputs[0][0], align)} "
                        "would be aligned)")
        self.add(severity, "tensor-core-shape", layer, what, why, fix, share, alignment=align, unit=unit,
                 dims={label: v[0] for label, v in dims.items()}, expected=[label for label, v in dims.items() if v[1]])

    # -- slow-op: ops with no fast reduced-precision path -------------------------------------------
    def slow_ops(self) -> None:
        """The layers with ops no matrix unit runs (resizes, upsampling), by their share of the memory traffic, where
        the plan computes in reduced precision."""
        target, graph = self.target, self.graph
        unit = target.unit_for(target.effective_dtype)
        if unit is None or target.effective_dtype == "float32":
            return
        total_traffic = float(sum(graph.layer_traffic.values())) or 1.0
        n_ops = len(graph.others) + len(graph.gemms)
        slow = (op for op in graph.others if op.op_type in SLOW_OPS or graph.layer(op.layer).class_name in SLOW_LAYERS)
        for layer, ops in by_layer(slow).items():
            share: float | None = graph.layer_traffic.get(layer, 0) / total_traffic if self.sized else None
            kinds = sorted({op.op_type for op in ops})
            resize = [k for k in kinds if k in SLOW_OPS]
            grads = ", ".join(SLOW_OPS[k] for k in resize) if resize else "a sum over the copies"
            info = graph.layer(layer)
            amount = "its share of the memory traffic unknown" if share is None else (
                f"{100 * share:.1f}% of the forward pass's estimated memory traffic")
            self.add(self.level(share, SLOW_OP_SIGNIFICANT), "slow-op", layer,
                     f"{info.class_name} ({', '.join(kinds)}) has no {unit[0]} path: {amount} ({len(ops)} of {n_ops} "
                     "forward ops)",
                     f"a resize only copies memory and its gradient ({grads}) adds the copies back: neither gets "
                     f"faster in {target.effective_dtype}, the convolutions around it do "
                     "(the GAN tutorial's profile had ResizeNearestNeighbor and its gradient among the top GPU ops)",
                     "replace UpSampling2D + Conv2D(f, k, padding='same') by Conv2DTranspose(f, k, strides=2, "
                     f"padding='same'), a convolution the {unit[0]} run; or keep it if its share is small",
                     None, traffic_share=None if share is None else round(share, 6), op_count=len(ops),
                     forward_ops=n_ops, ops=kinds)

    # -- the summary -----------------------------------------------------------------------------
    def summary(self) -> Summary:
        """Where the model's FLOPs run.

        Returns:
            The `Summary`: the FLOPs per image, and the sized ops' shares by compute dtype, in reduced precision and
            on aligned shapes (no shares unless the model is sized).
        """
        graph, target = self.graph, self.target
        shares: dict[str, float] = defaultdict(float)
        eligible = 0.0
        for op in self.known:
            dtype = op_dtype(graph, op)
            shares[dtype] += (op.flops or 0) / self.total
            unit = target.unit_for(dtype, fp8_layer(graph, target, op))
            if unit is None or op.kind == "depthwise":
                continue
            if all(v is not None and v % unit[1] == 0 for v in self.dims(op).values()):
                eligible += (op.flops or 0) / self.total
        shown = self.sized  # shares of the sized ops stand for the model only when they are most of it
        reduced = sum(s for d, s in shares.items() if d in REDUCED)
        return Summary(flops_per_image=(self.total if self.known else 0.0) / graph.batch,
                       dtype_shares={d: round(s, 6) for d, s in shares.items()} if shown else {},
                       reduced_precision_share=round(reduced, 6) if shown else None,
                       eligible_share=round(eligible, 6) if target.units and shown else None,
                       matrix_units={d: u for d, (u, _) in target.units.items()},
                       unknown_flops_ops=len(graph.gemms) - len(self.known), gemm_ops=len(graph.gemms), sized=shown)
