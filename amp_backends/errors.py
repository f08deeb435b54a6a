"""Every exception and warning amp_backends raises, in one place.

Every error the library raises on purpose is an `AmpError` and also the builtin a caller would catch without
knowing the library (``ValueError`` for bad input, ``RuntimeError`` for a failure); each message says what was
expected, what was received and how to fix it. `TrainingInterrupted` is no ``AmpError`` but a
``KeyboardInterrupt``, so that ``except Exception`` never swallows a stop. TensorFlow's own errors are read here
too (`lookup_error`, `xla_compile_failure`, `write_failure`).
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import importlib
import logging
import os
import re
import signal
import sys
import sysconfig
import warnings
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

__all__ = ["AmpConfigError", "AmpError", "AmpWarning", "BackendError", "CheckpointError", "CheckpointMismatchError",
           "ClusterConfigError", "DataUnavailableError", "DistributedFailure", "FactoryError", "InputError",
           "ModelCallError", "NonFiniteError", "TrainingInterrupted", "UnsupportedRequestError"]


class AmpError(Exception):
    """The base of every error amp_backends raises on purpose; each also derives from the builtin it stands for.

    Args:
        *args (str): The message (what was expected, what was received and how to fix it), as any ``Exception`` takes.
        **kwargs (object): None is taken (``Exception``'s own constructor).
    """

    # Exception's own constructor, named here: AutoGraph re-raises an error from traced code as its own type only
    # when that type takes Exception's constructor (else a StagingError hides ours: InputError, ValueError's child)
    __init__ = Exception.__init__


class AmpConfigError(AmpError, ValueError, TypeError):
    """A value given is not one the library accepts: a keyword argument, an environment variable, an option, an
    argument of another type than the one expected. A ``ValueError`` and a ``TypeError``: code that caught either
    builtin catches it."""


class UnsupportedRequestError(AmpConfigError):
    """A valid request that this hardware cannot honour, raised instead of a downgrade when ``strict``."""


class ClusterConfigError(AmpConfigError):
    """TF_CONFIG or the cluster it describes is unusable; the message says what was expected."""


class FactoryError(AmpError, ValueError):
    """A model factory given as ``MODULE:FACTORY`` is malformed, cannot be imported, or names no function."""


class BackendError(AmpError, RuntimeError):
    """A backend failed to load, probe, assess or apply where it was needed (asked for by name, the last one left,
    or the selected one applying its plan): otherwise the next backend is planned with. The message says why."""


class NonFiniteError(AmpError, RuntimeError):
    """Training cannot continue: too many non-finite steps under a fixed loss scale, or non-finite weights.

    It carries the remedy as data, for a command line to say in its own flags.

    Args:
        message: What went wrong and the fix, as the error says it.

    Attributes:
        overrides: The plan overrides to change, such as ``{"loss_scale": "fixed:16"}``.
        resume: Whether a saved finite state can be continued.
    """

    def __init__(self, message: str, *, overrides: dict[str, str] | None = None, resume: bool = False) -> None:
        super().__init__(message)
        self.overrides: dict[str, str] = dict(overrides or {})
        self.resume: bool = resume


class DistributedFailure(AmpError, RuntimeError):
    """A collective failed or timed out: another worker died, hung or cannot be reached."""


class DataUnavailableError(AmpError, RuntimeError):
    """The dataset could not be found or read; the message says how to provide it."""


class InputError(AmpError, ValueError):
    """The data given to the trainer cannot be trained on as given; the message says how to fix it."""


class ModelCallError(AmpError, RuntimeError):
    """The model does not run on the inputs it is checked on; the message names the layer whose call raised.

    Args:
        message: What went wrong and the fix, as the error says it.

    Attributes:
        layer: the path of the layer whose own call raised (``model/block/layer``), or ``None`` when the model
            as a whole does not run on the inputs.
        what: which layer raised what, on which tensors, when ``layer`` is set.
        why: whose error it is and what the layer was expected to take, when ``layer`` is set.
        fix: how to fix that layer, when ``layer`` is set.
    """

    def __init__(self, message: str, *, layer: str | None = None, what: str = "", why: str = "",
                 fix: str = "") -> None:
        super().__init__(message)
        self.layer: str | None = layer
        self.what: str = what
        self.why: str = why
        self.fix: str = fix


class CheckpointError(AmpError, RuntimeError):
    """Checkpoints cannot be used as asked (another run's, none intact, another model's) or written (a full disk,
    no permission, a read-only file system); the message says why and how to fix it."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint was written for other models or variables than the ones being trained."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM stopped training after the current call; ``checkpoint`` is where it was saved.

    A ``KeyboardInterrupt``: ``except Exception`` does not catch it, and a program that does not catch it ends, after
    its traceback and exit handlers, by the signal that stopped it, as Ctrl-C ends a Python program (the shell's
    status 130 for SIGINT, 143 for SIGTERM: ``exit_code``; Python itself does so only for a ``KeyboardInterrupt``
    that is no subclass, and ends others with status 1).

    Args:
        signum: The signal's number (``signal.SIGINT``, ``signal.SIGTERM``).
        step: The global step training stopped at.
        checkpoint: Where the checkpoint of that step was saved (``None``: none was).
        message: What stopped, where it was saved and how to continue.
    """

    def __init__(self, signum: int, step: int, checkpoint: str | None, message: str) -> None:
        super().__init__(message)
        self.signum, self.step, self.checkpoint, self.message = signum, step, checkpoint, message
        _end_by_the_signal_when_uncaught()

    @property
    def exit_code(self) -> int:
        """The exit status a shell gives a program the signal ended: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


def _end_by_the_signal_when_uncaught() -> None:
    """Chain a ``sys.excepthook`` (once) that ends the program by the signal of an uncaught `TrainingInterrupted`,
    after the usual traceback and the exit handlers (``atexit``: logging flushed), as Python ends one uncaught
    ``KeyboardInterrupt``; any other exception goes to the hook as before."""
    previous = sys.excepthook
    if getattr(previous, "ends_by_the_signal", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        previous(kind, value, tb)
        if isinstance(value, TrainingInterrupted) and value.signum in (signal.SIGINT, signal.SIGTERM):
            atexit._run_exitfuncs()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            signal.signal(value.signum, signal.SIG_DFL)
            os.kill(os.getpid(), value.signum)

    hook.ends_by_the_signal = True  # type: ignore[attr-defined]
    sys.excepthook = hook


class AmpWarning(UserWarning):
    """Emitted when a request is downgraded, or honoured although it is known to be slow."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB = ("<frozen ", os.path.join(sysconfig.get_paths()["stdlib"], ""))  # (runpy, threading: no user's line)
_LIBRARIES = frozenset({"amp_backends", "keras", "tensorflow", "tf_keras", "intel_extension_for_tensorflow",
                        "contextlib", "functools", "typer", "click"})  # (the last two: the command line's)



def moved_names(old: str, new: str, names: Iterable[str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that keeps names moved out of module ``old`` working for one release: each is read
    from module ``new``, with a `DeprecationWarning` naming its new place.

    Args:
        old: The module the names moved out of (its ``__name__``).
        new: The module that defines them now.
        names: The names that moved.

    Returns:
        The function to assign to ``old``'s ``__getattr__``; it raises ``AttributeError`` for any other name.
    """
    moved = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warn(f"{old}.{name} moved to {new}.{name}; the old name goes in the next release", DeprecationWarning)
        return getattr(importlib.import_module(new), name)

    return __getattr__

def _imports(frame: FrameType) -> bool:
    return "importlib" in frame.f_code.co_filename and "_bootstrap" in frame.f_code.co_filename


def _in_stdlib(frame: FrameType) -> bool:
    path = frame.f_code.co_filename
    return path.startswith(_STDLIB) and "site-packages" not in path and "dist-packages" not in path


def warn(message: str, category: type[Warning] = AmpWarning, *, log: logging.Logger | None = None) -> None:
    """Emit ``message`` as a warning of ``category`` at the user's line, not the library's.

    The line is the first caller outside amp_backends, its backends, Keras and TensorFlow (a ``Trainer.fit`` call,
    a ``model.fit`` whose callback warned): Python's filters (``module=``, once per location) and its
    ``file:line: category: message`` then name the user's code. Where there is no such caller (the command line,
    an example run as ``python -m``, a thread the library started), the warning names the line that called this
    function.

    Args:
        message: The warning's text: what was asked, what is done instead and why.
        category: The warning's class (`AmpWarning`; ``DeprecationWarning`` or ``FutureWarning`` for a renamed name).
        log: A logger that also writes ``message`` as a warning line first (a training log says it in its order).
    """
    if log is not None:
        log.warning(message)
    frame: FrameType | None = sys._getframe(1)
    level = 2
    while frame is not None and (_imports(frame) or frame.f_code.co_filename.startswith(_PACKAGE_DIR)
                                 or frame.f_globals.get("__name__", "").partition(".")[0] in _LIBRARIES):
        frame = frame.f_back
        level += frame is not None and not _imports(frame)  # (warnings counts no frame of the import system)
    outside = frame is not None and not _in_stdlib(frame)
    warnings.warn(message, category, stacklevel=level if outside else 2)


# ------------------------------------------------------------------------ TensorFlow's errors, read
_OUT_OF_TABLE = re.compile(r"indices\[[^\]]*\] = (-?\d+) is not in \[0, (\d+)\)")
_NODE = re.compile(r"\{\{node ([^}]+)\}\}")


def nearest(value: str, choices: Iterable[str], cutoff: float = 0.75) -> str | None:
    """The choice ``value`` is a misspelling of, for a fix to offer: the closest in spelling among those whose digits
    are ``value``'s, in any order (``bfloat61`` is ``bfloat16`` typed fast; ``fp64`` is no misspelt ``fp16``, ``gpu``
    no ``cpu``).

    Args:
        value: What was given.
        choices: What is accepted.
        cutoff: How alike they must be (`difflib`'s ratio).

    Returns:
        The choice, or ``None`` (then a fix offers no guess).
    """
    digits = sorted(re.sub(r"\D", "", value))
    near = difflib.get_close_matches(value, [c for c in choices if sorted(re.sub(r"\D", "", c)) == digits], 1, cutoff)
    return near[0] if near else None


def _batch_at(first_step: int | None, steps: int) -> str:
    """"The batch of step 7", "A batch of steps 7..9" (a call of several steps), or "A batch" (steps unknown)."""
    if first_step is None:
        return "A batch"
    last = first_step + steps - 1
    return f"The batch of step {first_step}" if steps <= 1 else f"A batch of steps {first_step}..{last}"


def lookup_error(message: str, first_step: int | None, steps: int = 1) -> InputError | None:
    """TensorFlow's error ``message`` for a gather past its table (``indices[1,44] = 8192 is not in [0, 8192)``)
    as the data's fault, with the fix: the `InputError` to raise instead (naming the call's ``steps`` from
    ``first_step``, where known), or ``None`` for any other error."""
    found = _OUT_OF_TABLE.search(message)
    if found is None:
        return None
    value, size = int(found.group(1)), int(found.group(2))
    node = _NODE.search(message)
    where = f" ({node.group(1).split('/GatherV2')[0]})" if node else ""
    return InputError(
        f"{_batch_at(first_step, steps)} holds the id {value}, outside 0..{size - 1} of a lookup table in the model"
        f"{where}: a token or category id past an Embedding's vocabulary (input_dim={size}). Expected ids in "
        f"0..{size - 1} in every batch. Fix: make the tokenizer's vocabulary match the model's (or map unknown ids to "
        f"an out-of-vocabulary id in the pipeline), or build the Embedding with input_dim >= {value + 1}.")


_TRACE_LINES = ("File ", "<stack traces", "Detected at node", "Graph execution error", "[[{{node")
_LOOP_SCOPES = {"while", "body", "cond", "then", "else"}


def batch_error(message: str, first_step: int | None, steps: int = 1, *, of: str | None = None) -> InputError:
    """TensorFlow's error ``message`` (an ``InvalidArgumentError``) for a call whose models run but which failed on
    its batch: the `InputError` to raise instead, naming the batch, what TensorFlow said and where, and the fix.

    Args:
        message: The error's message, as TensorFlow wrote it (``exc.message``).
        first_step: The first step of the failing training call (``None`` where not known), or with ``of`` the
            batch's index.
        steps: The steps the training call ran.
        of: What the data was given to (``"evaluate()"``), where the batch is not a training step's.

    Returns:
        The error to raise in place of TensorFlow's.
    """
    lines = [line.strip() for line in message.splitlines()]
    said = next((line for line in reversed(lines) if line and not line.startswith(_TRACE_LINES)), message.strip())
    node = _NODE.search(message)
    path = [p for p in node.group(1).split("/") if p not in _LOOP_SCOPES and not p.startswith("_")] if node else []
    where = (" in the data pipeline, as the batch was taken" if "IteratorGetNext" in "/".join(path)
             else f" at {'/'.join(path)}" if path else "")
    batch = f"Batch {first_step} of the data given to {of}" if of else _batch_at(first_step, steps)
    return InputError(
        f"{batch} could not be run: TensorFlow said {said!r}{where}. Expected every batch "
        "to be like the first: each input as wide as the model takes it, and as many labels (and weights) as "
        "samples. Fix: find what differs in that batch of the pipeline (a generator's batch of another width, fewer "
        "labels than samples); a tf.data.Dataset.from_generator whose output_signature has fixed shapes refuses "
        "such a batch where it is made.")


# an op given tensors of two dtypes, in TensorFlow's words (graph, eager), and AutoGraph's line of the user's code
_MIXED = re.compile(r"Input '\w+' of '(\w+)' Op has type (\w+) that does not match type (\w+)|cannot compute (\w+) "
                    r"as input #\d+\(zero-based\) was expected to be a (\w+) tensor but is a (\w+) tensor")
_USER_LINE = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*(.+)')
_DTYPES = {"half": "float16", "float": "float32"}  # (the eager message's names)


def mixed_dtypes_error(exc: BaseException) -> AmpConfigError | None:
    """Where ``exc`` is an op refusing a float16/bfloat16 tensor beside a float32 one (the user's loss subtracting
    float32 labels from a mixed-precision model's bfloat16 output), the error to raise instead, with the fix.

    Args:
        exc: An error raised while a training step was traced or run.

    Returns:
        The error naming the op, the two dtypes, the user's line where AutoGraph names it, and the fix; ``None`` for
        any other error.
    """
    found = _MIXED.search(str(exc))
    if found is None or type(exc).__name__ not in ("TypeError", "ValueError", "InvalidArgumentError"):
        return None
    op, first, second = [g for g in found.groups() if g]
    first, second = _DTYPES.get(first, first), _DTYPES.get(second, second)
    if {first, second} not in ({"float16", "float32"}, {"bfloat16", "float32"}):
        return None
    low = first if first != "float32" else second
    line = _USER_LINE.search(str(exc))
    where = f" at {line.group(1)}:{line.group(2)} ({line.group(3).strip()[:120]})" if line else ""
    return AmpConfigError(
        f"A training step gives the op {op} a {first} and a {second} tensor{where}: under a mixed-precision plan a "
        f"model's outputs and activations are {low}, while labels, constants and float32 layers are float32, and "
        "TensorFlow's ops take one dtype. Expected code that casts where the two meet. Fix: cast one side there (in "
        "a loss: tf.cast(y_pred, tf.float32); inside a layer: tf.cast(t, x.dtype)), or end the model with a float32 "
        "layer (keras.layers.Activation('linear', dtype='float32')).")


# XLA failing to compile a function, in TensorFlow's words: an op without an XLA kernel (tf2xla), or XLA's GPU
# compiler finding no kernel it can build for a fusion (its autotuner, ptxas)
_XLA_FAILED = re.compile(r"Detected unsupported operations when trying to compile graph|tf2xla conversion failed|"
                         r"Autotuner could not compile|[Pp]txas (exited|returned|failed)|Failed to compile PTX")
_XLA_MISSING_OPS = re.compile(r"on XLA_\w+_JIT: (.+?) \(No registered")
_XLA_ERRORS = ("InvalidArgumentError", "InternalError", "UnimplementedError")  # tf.errors' classes it comes as


def xla_compile_failure(exc: BaseException) -> str | None:
    """What XLA could not compile (the ops without an XLA kernel, or XLA's first line) where ``exc``, raised by a
    compiled function, is XLA failing to compile it (nothing of it ran); ``None`` for any other error."""
    if type(exc).__name__ not in _XLA_ERRORS or not type(exc).__module__.startswith("tensorflow"):
        return None
    message = str(getattr(exc, "message", exc))
    if not _XLA_FAILED.search(message):
        return None
    ops = _XLA_MISSING_OPS.search(message)
    if ops:
        return f"the model holds ops XLA has no kernel for ({ops.group(1)})"
    return f"XLA could not compile it ({message.strip().splitlines()[0][:200]})"


def write_failure(exc: BaseException) -> str:
    """Why a write (TensorBoard's scalars, a profiler trace) failed with ``exc``, in a few words: the operating
    system's (``No space left on device``...) where it gave them, else the error's class and its message's start."""
    text = " ".join(str(exc).split())
    return next((r for r in ("No space left on device", "Read-only file system", "Permission denied") if r in text),
                f"{type(exc).__name__}: {text[:200]}")
