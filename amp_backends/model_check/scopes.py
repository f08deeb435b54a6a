"""Which layer created each op of a trace, and which layer's call raised when a trace fails.

For one trace each layer's ``call`` (and ``quantized_call``) is wrapped in a name scope carrying the layer's
index: an op belongs to the innermost such scope (exact, unlike Keras's own scope names, which TensorFlow
renames), gradient ops to their forward op's layer. The wrapper of each layer a raising call passes through
records it: the first record is the layer whose own code raised, with its inputs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..keras_compat import restore_losses, snapshot_losses

TOKEN = "ampchk"
_TOKEN_RE = re.compile(TOKEN + r"(\d+)")


@dataclass(frozen=True)
class LayerFailure:
    """The call of layer ``index`` raised ``error`` on ``inputs`` (its first argument)."""

    index: int
    error: BaseException
    inputs: Any


def owner(op_name: str) -> int | None:
    """The index of the innermost layer whose wrapped call created the op, ``None`` for an op outside them all."""
    found = _TOKEN_RE.findall(op_name)
    return int(found[-1]) if found else None


def layer_of(op_name: str) -> int:
    """`owner`, with ops outside every layer given to the model (index 0)."""
    index = owner(op_name)
    return 0 if index is None else index


class LayerScopes:
    """``with LayerScopes(layers):`` each layer's call runs in a name scope naming its index in ``layers``, and
    what it returns is recorded (``made``: the id of each tensor -> the index of the layer whose call returned it);
    the collected losses of ``keep_losses`` (layers) are put back on exit."""

    def __init__(self, layers: list[Any], keep_losses: Sequence[Any] = ()) -> None:
        self.layers = layers
        self.losses = snapshot_losses(list(keep_losses))
        self.saved: list[tuple[Any, str, bool, Any]] = []
        self.failures: list[LayerFailure] = []
        self.made: dict[int, int] = {}

    def __enter__(self) -> LayerScopes:
        import tensorflow as tf

        def wrap(index: int, original: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                with tf.name_scope(f"{TOKEN}{index}"):
                    try:
                        result = original(*args, **kwargs)
                    except Exception as exc:
                        self.failures.append(LayerFailure(index, exc, args[0] if args else kwargs.get("inputs")))
                        raise
                self.made.update((id(t), index) for t in tf.nest.flatten(result))
                return result

            return call

        try:
            for index, layer in enumerate(self.layers):
                for attr in ("call", "quantized_call"):  # Keras 3 calls quantized_call for quantized layers
                    if not callable(getattr(layer, attr, None)):
                        continue
                    had = attr in layer.__dict__
                    self.saved.append((layer, attr, had, layer.__dict__.get(attr)))
                    # object.__setattr__: Keras's own __setattr__ would track the function as layer state.
                    object.__setattr__(layer, attr, wrap(index, getattr(layer, attr)))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for layer, attr, had, value in reversed(self.saved):
            if had:
                object.__setattr__(layer, attr, value)
            else:
                object.__delattr__(layer, attr)
        self.saved.clear()
        restore_losses(self.losses)

    def culprit(self, error: BaseException) -> LayerFailure | None:
        """The innermost layer whose call raised ``error`` (Keras and tf.function re-raise it with more words
        around the same message, so a record counts when its message is in ``error``'s, or in its chain)."""
        chain: list[BaseException] = []
        seen: BaseException | None = error
        while seen is not None and len(chain) < 20:
            chain.append(seen)
            seen = seen.__cause__ or seen.__context__
        text = " ".join(str(e) for e in chain)
        for failure in self.failures:
            if any(failure.error is e for e in chain) or (str(failure.error) and str(failure.error) in text):
                return failure
        return None
