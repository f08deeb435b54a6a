"""Every exception and warning amp_backends raises, in one place.

Every error the library raises on purpose is an `AmpError` (``except amp_backends.AmpError``; the
classes below are imported from here: ``from amp_backends.errors import InputError``), and
also the builtin a caller would catch without knowing the library (``ValueError`` for bad input,
``RuntimeError`` for a failure). `TrainingInterrupted` is the one exception that is no ``AmpError``:
it is a ``KeyboardInterrupt``, so that ``except Exception`` (and ``except AmpError``) never swallows a stop.

===========================  =====================  ==============================================================
class                        bases                  raised when
===========================  =====================  ==============================================================
``AmpError``                 ``Exception``          (the base; never raised itself)
``AmpConfigError``           ``AmpError``,          an override (keyword or ``AMP_*`` variable) has an invalid value
                             ``ValueError``
``UnsupportedRequestError``  ``AmpConfigError``     a valid request this hardware cannot honour, with ``strict``
``ClusterConfigError``       ``AmpConfigError``     ``TF_CONFIG`` or the cluster it describes is unusable
``FactoryError``             ``AmpError``,          a ``MODULE:FACTORY`` model factory is malformed, cannot be
                             ``ValueError``         imported or is not a function (``check``, ``audit``)
``BackendError``             ``AmpError``,          a backend failed (load, probe, assess, apply) where it was
                             ``RuntimeError``       needed: asked for by name, or no backend is left at all
``NonFiniteError``           ``AmpError``,          training cannot continue: too many non-finite steps, or
                             ``RuntimeError``       non-finite weights
``DistributedFailure``       ``AmpError``,          a collective failed or timed out (a worker died or hangs)
                             ``RuntimeError``
``DataUnavailableError``     ``AmpError``,          a dataset could not be found or read
                             ``RuntimeError``
``InputError``               ``AmpError``,          data given to the trainer cannot be trained on as given
                             ``ValueError``
``ModelCallError``           ``AmpError``,          a model given to the precision check does not run on its inputs
                             ``RuntimeError``       (names the layer whose own code raised, and its inputs)
``CheckpointError``          ``AmpError``,          checkpoints cannot be used as asked (another run's, none intact)
                             ``RuntimeError``       or written (a full disk, no permission, a read-only file system)
``CheckpointMismatchError``  ``CheckpointError``    a checkpoint of other models than the ones being trained
``TrainingInterrupted``      ``KeyboardInterrupt``  Ctrl-C or SIGTERM stopped training (after saving, when it can)
``AmpWarning``               ``UserWarning``        a request was downgraded, or honoured although known to be slow
===========================  =====================  ==============================================================

Each message says what was expected, what was received and how to fix it.
"""

from __future__ import annotations


__all__ = ["AmpConfigError", "AmpError", "AmpWarning", "BackendError", "CheckpointError", "CheckpointMismatchError",
           "ClusterConfigError", "DataUnavailableError", "DistributedFailure", "FactoryError", "InputError",
           "ModelCallError", "NonFiniteError", "TrainingInterrupted", "UnsupportedRequestError"]


class AmpError(Exception):
    """The base of every error amp_backends raises on purpose; each also derives from the builtin it stands for."""


class AmpConfigError(AmpError, ValueError):
    """A configuration value is not one of the accepted ones (bad keyword argument or env variable)."""


class UnsupportedRequestError(AmpConfigError):
    """A valid request that this hardware cannot honour, raised instead of a downgrade when ``strict``."""


class ClusterConfigError(AmpConfigError):
    """TF_CONFIG or the cluster it describes is unusable; the message says what was expected."""


class FactoryError(AmpError, ValueError):
    """A model factory given as ``MODULE:FACTORY`` is malformed, cannot be imported, or names no function."""


class BackendError(AmpError, RuntimeError):
    """A backend failed to load, probe, assess or apply where it was needed; the message names it and why.

    A failing backend never breaks the others: `auto_configure` records the failure
    and plans with the next available backend. This is raised only when the failed backend was asked
    for by name (``backend=`` / ``AMP_BACKEND``), when no backend is left, or when the selected backend
    fails while its plan is being applied.
    """


class NonFiniteError(AmpError, RuntimeError):
    """Training cannot continue: too many non-finite steps under a fixed loss scale, or non-finite weights.

    Besides its message it carries the remedy as data, for a command line to say in its own flags:
    ``overrides`` (plan overrides to change, such as ``{"loss_scale": "fixed:16"}``) and ``resume``
    (whether a saved finite state can be continued).
    """

    def __init__(self, message: str, *, overrides: dict[str, str] | None = None, resume: bool = False) -> None:
        super().__init__(message)
        self.overrides = dict(overrides or {})
        self.resume = resume


class DistributedFailure(AmpError, RuntimeError):
    """A collective failed or timed out: another worker died, hung or cannot be reached."""


class DataUnavailableError(AmpError, RuntimeError):
    """The dataset could not be found or read; the message says how to provide it."""


class InputError(AmpError, ValueError):
    """The data given to the trainer cannot be trained on as given; the message says how to fix it."""


class ModelCallError(AmpError, RuntimeError):
    """The model does not run on the inputs it is checked on; the message names the layer whose call raised.

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
        self.layer = layer
        self.what = what
        self.why = why
        self.fix = fix


class CheckpointError(AmpError, RuntimeError):
    """Checkpoints cannot be used as asked (another run's, none intact, another model's) or written (a full disk,
    no permission, a read-only file system); the message says why and how to fix it."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint was written for other models or variables than the ones being trained."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM stopped training after the current call; ``checkpoint`` is where it was saved.

    A ``KeyboardInterrupt`` and no `AmpError`, so a program that does not catch it by name ends as
    Ctrl-C ends it (``except Exception`` does not catch it); ``exit_code`` is the shell's convention (130 for
    SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signum: int, step: int, checkpoint: str | None, message: str) -> None:
        super().__init__(message)
        self.signum, self.step, self.checkpoint, self.message = signum, step, checkpoint, message

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class AmpWarning(UserWarning):
    """Emitted when a request is downgraded, or honoured although it is known to be slow."""
