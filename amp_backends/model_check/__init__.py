"""The precision check: what in a Keras model makes mixed precision slow or wrong on the planned device.

Mixed precision speeds training up only where the matmuls and convolutions really run in float16 or
bfloat16 on the device's matrix units (NVIDIA Tensor Cores, Intel XMX, AMX on CPUs), and it stays
accurate only where the few numerically delicate steps — the final softmax, the loss — stay in float32.
Models break both quietly: a layer pinned to float32, a custom layer that casts before its matmul, a
softmax left in float16, widths of 63 or a batch of 4090 that the Tensor Cores run at a fraction of their
rate, resizes that no matrix unit accelerates. Profilers show the symptoms; `check_model` names the
causes from the model alone::

    import amp_backends
    plan = amp_backends.auto_configure()
    model = build_model()
    print(amp_backends.check_model(model, batch_size=1024))   # a table; .to_json() for machines
    amp_backends.check_model(bert, inputs=one_batch_of_x)      # shapes the model leaves open (sequence length)

It traces the model's forward pass once (``tf.function(...).get_concrete_function``; nothing runs, nothing
changes) on the model's input shapes, or on the ones ``inputs=`` gives (a sample batch, a ``tf.data``
element spec or shapes; `shapes`), reads every matmul and convolution of the graph — the dtype it
computes in, its shapes, its FLOPs — maps each op to the layer that created it, and judges them against the
plan's device (see `target`) with the rules of `rules_general`. ``amp-backends check MODULE:FACTORY``
(`amp_backends.commands.check_command`) does the same from the command line.

Findings (``code``; when each is reported, its severity and its fix: docs/troubleshooting.md, "The precision
check's findings"): ``final-activation``, ``output-dtype``, ``float32-compute``, ``policy-mismatch``,
``measured-float32``, ``float32-layers``, ``layer-call-fails``, ``tensor-core-shape``, ``batch-size``,
``depthwise``, ``slow-op``, ``emulated-policy``, ``functional-policy``, ``unsized-model``; for transformers
(`rules_transformer`) ``mask-overflow``, ``attention-softmax``, ``layernorm-precision``, ``vocabulary-size`` and
``logits-dtype`` (in place of ``output-dtype``).

Each finding's ``details`` carries the rule's data: ``dims``, ``expected``, ``alignment``, ``unit``
(``tensor-core-shape``); ``pinned``, ``ops`` (``float32-compute``); ``batch_size``, ``alignment``
(``batch-size``); ``traffic_share``, ``op_count``, ``forward_ops``, ``ops`` (``slow-op``); ``layers``
(``depthwise``); ``output``, ``dtype`` (``final-activation``, ``output-dtype``); ``policy`` (the policy rules).

FLOPs are forward-pass matmul and convolution FLOPs per image (one sample), multiply-adds counted as two:
``2*M*N*K`` for a matmul, ``2*H_out*W_out*K_h*K_w*C_in*C_out`` for a convolution. Shares are of the total
of the ops with static shapes, and given only when those are most of the ops (``summary.sized``; 75% by
count, `rules_base.SIZED_MOST`): a share of part of the graph is never shown as the model's. Layer
widths are checked only where the plan's precision has a matrix unit: on a CPU without AMX, or under float32
without TF32, they do not matter and nothing is said about them.

JSON (`ModelCheck.to_dict`, ``schema_version`` 1; fields are only ever added): the model, the Keras
version, the plan it was judged against (with its matrix units), the batch size, the summary above, the counts
per severity, the findings (errors first, then by share), the fp8 choice of every Dense/EinsumDense layer
(`fp8_choice`) and notes. Its JSON Schema is ``amp_backends/schemas/check.schema.json`` (shipped with
the package).
"""

from __future__ import annotations

from typing import Any

from .checker import check_model
from .result import Finding, ModelCheck, Summary
from .shapes import shapes_with_sequence_length

__all__ = ["Finding", "ModelCheck", "Summary", "check_model", "shapes_with_sequence_length"]

# Submodules renamed, served under their old name for one release: old -> new (the docs showed
# ``amp_backends.model_check.check.shapes_with_sequence_length``).
_RENAMED = {"check": "checker"}


def _old_module(old: str, new: str) -> Any:
    """A module in ``sys.modules`` (where imports look first) for the old path: each public name of the new module
    read through it warns (``DeprecationWarning``) and forwards."""
    import importlib
    import importlib.machinery
    import sys
    import types

    name, target = f"{__name__}.{old}", f"{__name__}.{new}"
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name, f"Deprecated: the old path of {target}.")

    def forward(attr: str) -> Any:
        moved = importlib.import_module(target)
        if attr not in moved.__all__:
            raise AttributeError(f"module {name!r} has no attribute {attr!r} ({name} is now {target})")
        import warnings

        public = f"{__name__}.{attr}" if attr in __all__ else f"{target}.{attr}"
        warnings.warn(f"the module path {name} is deprecated: use {public} ({name} was renamed {target}); "
                      "the old path goes in the next release", DeprecationWarning, stacklevel=2)
        return getattr(moved, attr)

    vars(module).update(__getattr__=forward, __all__=[], __spec__=importlib.machinery.ModuleSpec(name, None))
    sys.modules[name] = module
    return module


for _old, _new in _RENAMED.items():
    _old_module(_old, _new)
del _old, _new


def __getattr__(name: str) -> Any:
    if name in _RENAMED:  # ``amp_backends.model_check.check`` as an attribute: the old path's module
        return _old_module(name, _RENAMED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
