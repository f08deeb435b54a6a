"""Warnings name the user's line: `amp_backends.errors.warn`, the one way the library warns.

Python prints a warning as ``file:line: category: message`` and filters it by that place (``module=``, once per
location). The library's warnings named its own lines (``configure.py:118``, ``trainer.py:178``), which a user
could neither act on nor filter by their own module.
"""

from __future__ import annotations

import inspect
import threading
import warnings

import pytest
from helpers import classification_data, mlp

import amp_backends
from amp_backends.errors import AmpWarning, warn

pytestmark = pytest.mark.intel  # (the trainer's warnings pass through Keras 2's frames there)


def recorded(call):
    """The warnings ``call()`` emits, every one of them, and the line of this file that called it."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        call()
    return seen, inspect.stack()[1].lineno


def places(seen, category=AmpWarning):
    return {(w.filename, w.lineno) for w in seen if issubclass(w.category, category)}


def test_a_plans_warnings_name_the_line_that_asked_for_the_plan(monkeypatch):
    """A misspelt variable and a downgraded request: both named the library's configure.py."""
    monkeypatch.setenv("AMP_POLCY", "bf16")
    seen, line = recorded(lambda: amp_backends.plan_for(device="t4", policy="bf16"))
    said = [str(w.message) for w in seen if issubclass(w.category, AmpWarning)]
    assert any("AMP_POLCY is set" in m for m in said) and any("downgraded" in m for m in said), said
    assert places(seen) == {(__file__, line)}, [(w.filename, w.lineno, str(w.message)[:40]) for w in seen]


def test_an_old_name_warns_at_the_import_that_used_it():
    """``from amp_backends import InputError`` (moved to amp_backends.errors) passes through the import system's
    frames, which Python's own count of frames leaves out."""
    def old_import():
        from amp_backends import InputError  # noqa: F401

    seen, _ = recorded(old_import)
    assert places(seen, DeprecationWarning) == {(__file__, old_import.__code__.co_firstlineno + 1)}, seen


def test_a_warning_with_no_callers_line_names_the_line_that_warned():
    """In a thread the library started (or under ``python -m``), no caller of the user's is on the stack: the
    warning names the library's line that warned, not the standard library's ``threading.py``."""
    namespace = {"__name__": "amp_backends.a_module", "warn": warn}
    exec(compile("def work():\n    warn('said in a thread')\n", "<amp_backends/a_module.py>", "exec"), namespace)

    def in_a_thread():
        thread = threading.Thread(target=namespace["work"])
        thread.start()
        thread.join()

    seen, _ = recorded(in_a_thread)
    assert places(seen) == {("<amp_backends/a_module.py>", 2)}, [(w.filename, w.lineno) for w in seen]


@pytest.mark.tensorflow
def test_the_trainers_warnings_name_the_fit_call():
    """Said while the trainer traces its step (TensorFlow's and Keras's frames between): a loss that takes
    probabilities given a model's logits named ``trainer.py``."""
    pytest.importorskip("tensorflow")
    import tensorflow as tf

    plan = amp_backends.auto_configure(verbose=False, policy="float32")
    x, y = classification_data(32)
    trainer = amp_backends.Trainer(amp_backends.classifier_updates(mlp(hidden=16), tf.keras.optimizers.SGD(0.1)),
                                   plan, batch_size=16, progress=False, check_models=False)
    seen, line = recorded(lambda: trainer.fit(x, y, max_steps=1, validation_data=(x[:16], y[:16])))
    assert any("takes probabilities" in str(w.message) for w in seen), [str(w.message) for w in seen]
    assert places(seen) == {(__file__, line)}, [(w.filename, w.lineno, str(w.message)[:40]) for w in seen]


def test_mixed_dtypes_error_reads_an_op_given_a_low_precision_and_a_float32_tensor_and_nothing_else():
    from amp_backends.errors import AmpConfigError, mixed_dtypes_error

    graph = TypeError("in user code:\n\n    File \"/home/me/train.py\", line 12, in loss  *\n"
                      "        return pred - y\n\n    TypeError: Input 'y' of 'Sub' Op has type float32 that does not "
                      "match type bfloat16 of argument 'x'.")
    error = mixed_dtypes_error(graph)
    assert isinstance(error, AmpConfigError)
    assert "the op Sub a float32 and a bfloat16 tensor at /home/me/train.py:12 " in str(error)
    assert "(return pred - y)" in str(error) and "Fix: cast one side there" in str(error)
    eager = type("InvalidArgumentError", (Exception,), {})(
        "cannot compute AddV2 as input #1(zero-based) was expected to be a half tensor but is a float tensor")
    assert "the op AddV2 a float16 and a float32 tensor" in str(mixed_dtypes_error(eager))
    for other in ("Input 'y' of 'Mul' Op has type int32 that does not match type bfloat16 of argument 'x'.",
                  "Input 'y' of 'Sub' Op has type float64 that does not match type float16 of argument 'x'."):
        assert mixed_dtypes_error(TypeError(other)) is None, other  # (no float32 side: that fix would not do)
    assert mixed_dtypes_error(RuntimeError("Input 'y' of 'Sub' Op has type float32 that does not match type "
                                           "bfloat16")) is None
