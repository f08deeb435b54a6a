"""The precision check: what in a Keras model makes mixed precision slow or wrong on the planned device.

Mixed precision is fast only where matmuls and convolutions run in float16/bfloat16 on the matrix units, and
accurate only where the delicate steps (the final softmax, the loss) stay in float32. `check_model` names what
breaks either, from the model alone::

    plan = amp_backends.auto_configure()
    print(amp_backends.check_model(model, batch_size=1024))   # a table; .to_json() for machines
    amp_backends.check_model(bert, inputs=one_batch_of_x)      # shapes the model leaves open (sequence length)

It traces the forward pass once (nothing runs, nothing changes) on the model's input shapes or those of
``inputs=`` (`shapes`), reads every matmul and convolution — dtype, shapes, FLOPs —, maps each op to its layer,
and judges them against the plan's device (`target`) with the rules of `rules_general`, `rules_policy` and
`rules_transformer`. ``amp-backends check MODULE:FACTORY`` does the same from the command line.

Findings (``code``; when each is reported, its severity and fix: docs/troubleshooting.md, "The precision check's
findings"): ``final-activation``, ``output-dtype``, ``float32-compute``, ``policy-mismatch``, ``measured-float32``,
``float32-layers``, ``layer-call-fails``, ``tensor-core-shape``, ``batch-size``, ``depthwise``, ``slow-op``,
``emulated-policy``, ``functional-policy``, ``unsized-model``; for transformers ``mask-overflow``,
``attention-softmax``, ``layernorm-precision``, ``vocabulary-size`` and ``logits-dtype`` (for ``output-dtype``).

FLOPs are forward-pass matmul and convolution FLOPs per image, multiply-adds counted as two. Shares are of the
ops with static shapes, given only when those are most of the ops (``summary.sized``,
`result.SIZED_MOST`). Layer widths are checked only where the plan's precision has a matrix unit.

JSON (`ModelCheck.to_dict`, ``schema_version`` 1; fields are only ever added): the model, the Keras version, the
plan, the batch size, the summary, the counts per severity, the findings (errors first, then by share; each
with its rule's ``details``: ``dims``, ``expected``, ``alignment``, ``unit`` for ``tensor-core-shape``;
``pinned``, ``ops`` for ``float32-compute``; ``batch_size``, ``alignment`` for ``batch-size``; ``traffic_share``,
``op_count``, ``forward_ops``, ``ops`` for ``slow-op``; ``layers`` for ``depthwise``; ``output``, ``dtype`` for
``final-activation``/``output-dtype``; ``policy`` for the policy rules), the fp8 choice of every
Dense/EinsumDense layer (`fp8_choice`) and notes. Its JSON Schema is ``amp_backends/schemas/check.schema.json``.
"""

from __future__ import annotations

from typing import Any

from .checker import check_model
from .result import Finding, ModelCheck, Summary
from .shapes import shapes_with_sequence_length

__all__ = ["Finding", "ModelCheck", "Summary", "check_model", "shapes_with_sequence_length"]


def _old_module() -> Any:
    """``amp_backends.model_check.check``, renamed ``checker``, served for one release: a module in ``sys.modules``
    (where imports look first) that forwards each public name of ``checker`` with a ``DeprecationWarning``."""
    import importlib.machinery
    import sys
    import types

    from . import checker

    name, target = f"{__name__}.check", checker.__name__
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name, f"Deprecated: the old path of {target}.")

    def forward(attr: str) -> Any:
        if attr not in checker.__all__:
            raise AttributeError(f"module {name!r} has no attribute {attr!r} ({name} is now {target})")
        from ..errors import warn

        public = f"{__name__}.{attr}" if attr in __all__ else f"{target}.{attr}"
        warn(f"the module path {name} is deprecated: use {public} ({name} was renamed {target}); "
             "the old path goes in the next release", DeprecationWarning)
        return getattr(checker, attr)

    vars(module).update(__getattr__=forward, __all__=[], __spec__=importlib.machinery.ModuleSpec(name, None))
    sys.modules[name] = module
    return module


check = _old_module()  # (``amp_backends.model_check.check`` as an attribute too)
