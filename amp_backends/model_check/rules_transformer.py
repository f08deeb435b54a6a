"""The rules for transformers: attention's softmax and masks, normalization, vocabulary sizes, logits.

What Keras (3.15) and keras_hub (0.32) do, read from their sources, so that nothing here cries wolf:
``MultiHeadAttention`` with attention dropout (keras_hub's BERT and GPT-2 default) or returning its scores
takes its softmax in the policy's dtype, without dropout in float32 (``ops.dot_product_attention``); Keras's
own masks stay finite (`masks`); ``LayerNormalization`` computes in float32 whatever the policy; an embedding
is a gather, whose vocabulary size matters only where it is also a GEMM's width (the language-model head,
``ReversibleEmbedding(reverse=True)`` or ``Dense(vocabulary_size)``), which computes its logits in the
policy's dtype.
"""

from __future__ import annotations

from .masks import limit, overflow_result
from .result import Finding
from .rules_base import SIGNIFICANT, RuleContext, next_multiple
from .trace import by_layer

REDUCED = ("float16", "bfloat16")
NORM_STATS_OPS = frozenset({"Mean", "SquaredDifference", "Rsqrt", "Sqrt", "Square", "Sum", "Variance"})
VOCAB_ALIGNMENT = 64  # a vocabulary padded to 64 keeps the logits GEMM aligned for every unit and tile
MIN_VOCABULARY = 1000  # below this an embedding is a small categorical table, not a vocabulary


def vocabularies(rules: RuleContext) -> set[int]:
    """The vocabulary sizes of the model's embeddings (those of at least `MIN_VOCABULARY` entries).

    Args:
        rules: The check.

    Returns:
        The sizes.
    """
    return {info.vocabulary for info in rules.graph.layers if info.vocabulary and info.vocabulary >= MIN_VOCABULARY}


# -- mask-overflow: mask constants that are -inf in the compute dtype --------------------------------------
def mask_overflow(rules: RuleContext) -> None:
    """A finding per layer whose mask constants become -inf (or NaN) in a reduced dtype: an error where the constant
    itself does (the math after it meets it), else a warning.

    Args:
        rules: The check, whose findings it adds to.
    """
    for layer, masks in by_layer(rules.graph.masks).items():
        worst = min(masks, key=lambda m: m.value)
        dtype = worst.dtype
        bound = "-65504" if dtype == "float16" else f"about {-limit(dtype):.3g}"
        inf = overflow_result(dtype)  # "-inf", or "NaN" in the float8 types that have no infinity
        if worst.stored == dtype and worst.value == float("-inf"):
            such = "-1e9 or float32.min" if limit(dtype) < 1e9 else "float32.min"
            what = f"a mask constant beyond {dtype}'s range (such as {such}) is written as {inf} in {dtype}"
        else:
            via = "" if worst.stored == dtype else f" (written in {worst.stored}, cast to {dtype})"
            what = f"a mask constant {worst.value:.3g}{via} is {inf} in {dtype}"
        in_dtype = any(m.direct for m in masks)  # the -inf itself is multiplied: 0 * -inf = NaN at kept positions
        rules.add("error" if in_dtype else "warning", "mask-overflow", layer, what,
                  f"{dtype} ends at {bound}, so the constant becomes {inf}: "
                  + (f"(1 - mask) * {inf} is NaN at every kept position (0 * {inf}), and " if in_dtype else "")
                  + f"a row with every position masked is softmax({inf}, ..., {inf}) = NaN. Keras's own masks stay "
                  "finite (-3e4 in float16)",
                  "build the mask from the scores' dtype: tf.where(mask, scores, -0.7 * scores.dtype.max) "
                  "(what Keras's dot_product_attention does), or pass the mask to keras.layers.Softmax / "
                  "MultiHeadAttention(attention_mask=...), which do it for you",
                  None, value=worst.value, dtype=dtype, constants=[m.name for m in masks])


# -- attention-softmax: a softmax inside the model in float16/bfloat16 -------------------------------------
def attention_softmax(rules: RuleContext) -> None:
    """An info line for the softmax ops inside the model (not at its outputs) that run in float16/bfloat16.

    Args:
        rules: The check, whose findings it adds to.
    """
    graph = rules.graph
    at_output = {out.layer for out in graph.outputs if out.producer_type in ("Softmax", "LogSoftmax")}
    wrappers = [graph.layer(out.layer).path + "/" for out in graph.outputs  # (whose layer runs once per time step)
                if graph.layer(out.layer).class_name in ("TimeDistributed", "Bidirectional")]
    ops = [op for op in graph.others if op.op_type == "Softmax" and op.dtype in REDUCED and op.layer not in at_output
           and not graph.layer(op.layer).path.startswith(tuple(wrappers))]
    if not ops:
        return
    layers = sorted({op.layer for op in ops})
    dtype = ops[0].dtype
    paths = [graph.layer(i).path for i in layers]
    rules.add("info", "attention-softmax", layers[0],
              f"{len(ops)} softmax op(s) inside the model run in {dtype} ({len(layers)} layer(s), "
              "attention's probabilities)",
              f"Keras's Softmax layer computes in the policy's dtype: keras.layers.MultiHeadAttention uses it when it "
              f"has attention dropout or returns its scores. The softmax subtracts each row's maximum, so exp cannot "
              f"overflow; the scores before it are {dtype}"
              + (", so scores above 65504 are inf (and NaN after the softmax)" if dtype == "float16" else "")
              + f", and the probabilities keep {3 if dtype == 'float16' else 2} significant digits",
              "nothing to do while training is finite; if attention gives NaN or inf, compute the scores and softmax "
              "in float32: MultiHeadAttention(dropout=0) takes ops.dot_product_attention, which does on TensorFlow "
              "(or give the attention layer dtype='float32')",
              None, layers=paths, dtype=dtype)


# -- layernorm-precision: a normalization whose statistics run in float16/bfloat16 ------------------------
def normalization(rules: RuleContext) -> None:
    """A warning per normalization class (not a batch normalization) that computes its statistics in float16/bfloat16.

    Args:
        rules: The check, whose findings it adds to.
    """
    graph = rules.graph
    bad: dict[str, dict[int, None]] = {}  # class name -> its layers, in order
    for op in graph.others:
        name = graph.layer(op.layer).class_name
        if "Batch" not in name and "Norm" in name and op.op_type in NORM_STATS_OPS and op.dtype in REDUCED:
            bad.setdefault(name, {})[op.layer] = None
    for name, layer_set in bad.items():
        layers = list(layer_set)
        dtype = graph.layer(layers[0]).compute_dtype
        rules.add("warning", "layernorm-precision", layers[0],
                  f"{name} computes its mean and variance in reduced precision ({len(layers)} layer(s))",
                  "a normalization's variance of float16/bfloat16 values loses digits and, in float16, overflows "
                  "above 65504 (squares of activations above 256); keras.layers.LayerNormalization computes in "
                  "float32 under a mixed policy for this reason",
                  "use keras.layers.LayerNormalization (or RMSNormalization), or cast the input to float32 before the "
                  f"mean and variance and the result back to {dtype}",
                  None, layers=[graph.layer(i).path for i in layers])


# -- vocabulary-size: the vocabulary is the logits GEMM's width ---------------------------------------------
def vocabulary(rules: RuleContext) -> None:
    """A finding per vocabulary that is no multiple of `VOCAB_ALIGNMENT`: by its GEMMs' share where it is a GEMM's
    width, an info line where it is only a lookup (and no multiple of the matrix unit's alignment).

    Args:
        rules: The check, whose findings it adds to.
    """
    graph, target = rules.graph, rules.target
    unit = target.unit_for(target.effective_dtype)
    if unit is None:
        return  # no matrix unit for the plan's precision: widths do not matter here
    for index, info in enumerate(graph.layers):
        size = info.vocabulary
        if not size or size < MIN_VOCABULARY or size % VOCAB_ALIGNMENT == 0:
            continue
        padded = next_multiple(size, VOCAB_ALIGNMENT)
        gemms = [op for op in graph.gemms if size in (op.dims.get("N"), op.dims.get("K"))]
        if gemms:
            share = rules.share(gemms)
            severity = rules.level(share, SIGNIFICANT) if size % unit[1] else "info"
            rules.add(severity, "vocabulary-size", index,
                      f"the vocabulary of {size} is the width of {len(gemms)} matmul(s) (the logits) and not a "
                      f"multiple of {VOCAB_ALIGNMENT}",
                      f"on the {unit[0]}, a GEMM runs at full efficiency on widths that are multiples of {unit[1]}, "
                      f"and the largest tiles on multiples of {VOCAB_ALIGNMENT}; the logits GEMM is one of the largest "
                      "of a language model",
                      f"pad the vocabulary to {padded} (add unused tokens; the tokenizer never produces them)",
                      share, vocabulary=size, padded=padded, ops=[op.name for op in gemms])
        elif size % unit[1]:
            rules.add("info", "vocabulary-size", index,
                      f"the vocabulary of {size} is not a multiple of {unit[1]}; here it is only a lookup",
                      "an embedding lookup is a gather, not a matmul: its size does not matter in this model. A head "
                      f"that projects onto the vocabulary (masked or causal LM) runs a GEMM {size} wide",
                      f"if you add such a head, pad the vocabulary to {padded}", None, vocabulary=size, padded=padded)


# -- logits-dtype: logits over a vocabulary in float16/bfloat16 --------------------------------------------
def logits(rules: RuleContext) -> None:
    """Turn an ``output-dtype`` finding whose output is the logits over a vocabulary into ``logits-dtype``."""
    graph = rules.graph
    sizes = vocabularies(rules)
    if not sizes:
        return
    by_path = {info.path: info for info in graph.layers}
    heads = {graph.layer(op.layer).path: op.dims.get("N") for op in graph.gemms
             if op.output_to_model and op.dims.get("N") in sizes}
    for i, finding in enumerate(rules.findings):
        if finding.code != "output-dtype" or finding.layer not in heads:
            continue
        size, dtype = heads[finding.layer], finding.details.get("dtype")
        info = by_path[finding.layer]
        fix = ("give the head reverse_dtype='float32' (keras_hub ReversibleEmbedding) or compute it as a float32 "
               "layer" if info.vocabulary
               else "give the head dtype='float32' (keras.layers.Dense(..., dtype='float32'))")
        rules.findings[i] = Finding(
            "warning", "logits-dtype", finding.layer,
            f"the model's logits over a vocabulary of {size} are {dtype}",
            f"the loss reads {dtype} logits: " + ("3 significant digits and nothing above 65504"
                                                  if dtype == "float16" else "2 to 3 significant digits")
            + ", so close logits tie and the softmax over the vocabulary is coarse",
            fix + f" (its GEMM, {size} wide, then runs at the float32 rate); or cast the logits to float32 before "
            "the loss, which keeps the rounding but not the overflow",
            None, {**finding.details, "vocabulary": size})
