"""The rules about the plan's policy: one the hardware emulates, a model built under another, float32 in a call."""

from __future__ import annotations

from collections import defaultdict

from .rules_base import SIGNIFICANT, RuleContext, op_dtype
from .target import EMULATED, FUNCTIONAL
from .trace import LayerInfo


# -- emulated-policy, functional-policy: a policy the hardware emulates or runs without a speed-up ---
def emulated_policy(rules: RuleContext) -> None:
    """A warning where the hardware emulates the plan's policy; an info line where it runs it without a speed-up.

    Args:
        rules: The check, whose findings it adds to.
    """
    target = rules.target
    if target.policy_level == EMULATED:
        rules.add("warning", "emulated-policy", 0,
                  f"the plan's policy {target.policy} is emulated on this {target.backend} device",
                  f"{target.policy_why}. Emulated {target.compute_dtype} is slower than float32 here: "
                  "training will be slower, not faster",
                  "use the automatic plan (remove the policy override and force); "
                  "keep the forced policy only to test numerics", policy=target.policy)
    elif target.policy_level == FUNCTIONAL:
        rules.add("info", "functional-policy", 0, f"the plan's policy {target.policy} runs here without a speed-up",
                  target.policy_why, "nothing to fix; the automatic plan may be as fast", policy=target.policy)


# -- policy-mismatch: the model built under another policy than the plan's --------------------
def policy_mismatch(rules: RuleContext) -> None:
    """A warning where the model computes under another policy than the plan's (built before the plan was applied,
    or under a policy the plan rejected); an info line where a measurement set every layer to float32.

    Args:
        rules: The check, whose findings it adds to; it sets its ``model_built_float32`` where the model computes in
            float32 (measured faster, or built before the plan).
    """
    target, graph = rules.target, rules.graph
    if rules.measured_float32 is not None and target.mixed:
        rules.model_built_float32 = True  # float32 on purpose: the float32 rules below stay quiet
        rules.add("info", "measured-float32", 0,
                  f"every layer computes in float32 under the {target.policy} plan: measured faster on this model",
                  str(rules.measured_float32), "nothing to do (prepare_model(..., measure_float32=False) or the "
                  "trainer's measure_float32=False keeps the plan's policy)", None)
        return
    if target.graph_amp or not graph.gemms:
        return
    ops = rules.known if rules.sized else graph.gemms  # unsized: judged by the count of ops
    of = "of the FLOPs" if rules.sized else "of the matmuls/convolutions"
    by_dtype: dict[str, float] = defaultdict(float)
    for op in ops:
        by_dtype[op_dtype(graph, op)] += rules.fraction([op])
    if target.mixed:
        # An output layer pinned to float32 is the recommended pattern, not a sign of a model built before the plan
        # (a GPT-2's float32 LM head is most of its FLOPs): the layers inside the model decide, where it has any.
        inner = [op for op in ops if not op.output_to_model]
        judged = inner or ops
        pinned = [op for op in judged if graph.layer(op.layer).compute_dtype == "float32" and op.dtype == "float32"
                  and not rules.kept_float32(graph.layer(op.layer))]  # (a head the layer plan pins: on purpose)
        share = rules.fraction(pinned) / (rules.fraction(judged) or 1.0)
        # a layer that computes as the plan says was built after it: the float32 ones beside it were given float32
        planned = any(op.dtype == target.compute_dtype for op in judged)
        if not inner:
            # Only the output layers' matmuls are seen (an LSTM's run inside a loop): the other layers' policies
            # decide, so that a float32 output layer alone never reads as a model built before the plan.
            seen = {graph.layer(op.layer).path for op in ops}
            others = [info for info in graph.layers[1:]  # (the first is the model itself)
                      if info.policy and info.class_name != "InputLayer" and info.path not in seen
                      and not rules.kept_float32(info)]
            if others:
                share = sum(info.compute_dtype == "float32" for info in others) / len(others)
                planned = any(info.compute_dtype == target.compute_dtype for info in others)
        if share >= 0.5 and not planned:
            rules.model_built_float32 = True
            rules.add("warning", "policy-mismatch", 0,
                      f"{100 * share:.0f}% {of} inside the model are in layers whose dtype policy is float32, "
                      f"although the plan's policy is {target.policy}",
                      "the model was built before the plan's policy was set (a Keras dtype policy applies to layers "
                      f"created after it): it trains in float32 and gets none of {target.policy}'s speed",
                      "call amp_backends.auto_configure() before building the model (a model loaded from a file "
                      "saved under another plan: amp_backends.prepare_model(model, plan, reset_policies=True)); a "
                      "model saved after a measurement set every layer to float32 elsewhere gets its layer plan back "
                      "here from amp_backends.prepare_model(model, plan, inputs=<one batch>), which measures it on "
                      "this machine",
                      policy=target.policy)
            return
    other = {d: s for d, s in by_dtype.items() if d in ("float16", "bfloat16") and d != target.compute_dtype}
    for dtype, share in other.items():
        if share < SIGNIFICANT:
            continue
        policy = f"mixed_{dtype}"
        why = target.rejected.get(policy, "the plan chose another policy for this hardware")
        rules.add("warning", "policy-mismatch", 0,
                  f"{100 * share:.0f}% {of} run in {dtype}, but the plan's policy is {target.policy}",
                  f"the model was built under {policy}; the plan rejected it here: {why}",
                  "build the model after amp_backends.auto_configure() (or under the plan's policy); a model "
                  "loaded from a file saved under another plan: amp_backends.prepare_model(model, plan, "
                  "reset_policies=True) gives its layers this plan's policy and layer plan",
                  share if rules.sized else None, policy=target.policy, model_dtype=dtype)


def float32_in_call(info: LayerInfo, op_types: str, rate: str, at_output: bool,
                    constant: bool = False) -> tuple[str, str, str]:
    """(what, why, fix) of a layer that follows the mixed policy but runs its matmul in float32; ``constant``: an
    operand is a float32 constant (a NumPy array or Python numbers the layer's code passed in)."""
    dtype = info.compute_dtype
    what = f"{info.class_name} (dtype policy {info.policy}) computes its {op_types} in float32 inside its call"
    why = f"the traced graph shows {op_types} with T=float32 in this layer although it computes in {dtype}: " + (
        "one operand is a float32 constant (a NumPy array or Python numbers in the layer's code become a float32 "
        f"tensor, and Keras ops promote {dtype} x float32 to float32)" if constant else "its code casts to float32 "
        f"(tf.cast), or mixes in a float32 tensor (Keras ops promote {dtype} x float32 to float32; an Embedding's "
        "weights stay float32)") + f"; it runs {rate}"
    fix = ("make the constant in the layer's compute dtype: keras.ops.convert_to_tensor(value, "
           "dtype=self.compute_dtype) (or tf.constant(value, dtype=self.compute_dtype)), or a NumPy array of that dtype"
           if constant else "compute in self.compute_dtype (drop any tf.cast(..., tf.float32) of the matmul's inputs, "
           "and cast float32 tensors it mixes in to self.compute_dtype; cast the result if a float32 output is needed)")
    if at_output:
        why += "; at the model's output this gives float32 logits, which is accurate (the recommended pattern)"
        fix = ("keep it for accuracy; for speed compute the head in the policy's dtype (keras_hub ReversibleEmbedding: "
               f"reverse_dtype='{info.compute_dtype}') and cast its output to float32 for the loss: the GEMM then runs "
               f"on the {info.compute_dtype} matrix units, the logits are rounded to {info.compute_dtype}")
    return what, why, fix


# -- float32-layers: the layer kinds the plan keeps in float32, in the model ---------------------------
def float32_layers(rules: RuleContext) -> None:
    """Layers of the kinds the plan keeps in float32: still in the low dtype (prepare_model not called), a
    warning with their share; kept in float32 as planned, an info line."""
    target, graph = rules.target, rules.graph
    if not target.mixed or target.graph_amp or not target.float32_layers or rules.model_built_float32:
        return
    planned = set(rules.layer_plan.paths("float32", "float32_layers")) if rules.layer_plan is not None else None
    matched = [(i, info) for i, info in enumerate(graph.layers) if i and info.kept_by(target.float32_layers)
               and (planned is None or info.path in planned)]
    if not matched:
        return
    low = [i for i, info in matched if info.compute_dtype == target.compute_dtype]
    kept = [i for i, info in matched if info.compute_dtype == "float32"]
    kinds = ", ".join(sorted({graph.layer(i).class_name for i in (low or kept)}))
    used = [r for r in target.float32_layers if any(graph.layer(i).kept_by([r]) for i in (low or kept))]
    why = "; ".join(dict.fromkeys(r.why for r in used if getattr(r, "why", ""))) or target.float32_layers_why
    ops = [op for op in graph.gemms if op.layer in low]
    share = rules.share(ops) if ops else None
    amount = "" if share is None else f" ({100 * share:.1f}% of the FLOPs)"
    if low:
        rules.add("warning", "float32-layers", low[0],
                  f"{len(low)} {kinds} layers{amount} compute in {target.compute_dtype}, which the plan keeps in "
                  "float32 on this hardware",
                  f"they train slower in {target.compute_dtype} than in float32 here: {why}",
                  "call amp_backends.prepare_model(model, plan) after building the model and before compile() (the "
                  "Trainer does it itself); or float32_layers=none to keep them as they are",
                  share, layers=[graph.layer(i).path for i in low])
    elif kept:
        rules.add("info", "float32-layers", kept[0],
                  f"{len(kept)} {kinds} layers compute in float32 inside the {target.policy} model, as the plan keeps "
                  "them", why, "nothing to do", None,
                  layers=[graph.layer(i).path for i in kept])
