"""Ctrl-C and SIGTERM during training: the first asks the loop to stop after the current call, a second acts at once.

The trainer then saves a checkpoint when checkpointing is on, and raises
`TrainingInterrupted` (a ``KeyboardInterrupt``) saying at which step and where the
checkpoint is.

Under several workers the signal reaches one of them; every worker stops after the same call
(`StopAgreement`) and they save together."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

logger = logging.getLogger("amp_backends.train")


class StopSignals:
    """Turn the first Ctrl-C (or SIGTERM) into a request to stop after the current call; a second one acts at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # ignored on purpose (nohup, a background job): it stays ignored
                try:
                    previous = signal.signal(sig, self._handle)
                except (ValueError, OSError):
                    continue
                # None: a handler installed outside Python; the default is the closest we can give back
                self._previous[sig] = signal.SIG_DFL if previous is None else previous
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
        logger.warning(f"{signal.Signals(signum).name} received: stopping after the current call "
                       "(again to stop at once, without a checkpoint).")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def interrupted_message(signum: int, step: int, path: str | None, *, checkpointing: bool, by: str | None = None) -> str:
    """What an interrupted run says: where it saved (``path``); ``by``: the worker the signal reached, when several
    workers stopped together."""
    name = signal.Signals(signum).name if by is None else f"{signal.Signals(signum).name} to {by}"
    if not checkpointing:
        return f"Interrupted ({name}) at step {step}: checkpointing is off, nothing was saved."
    where = f"checkpoint saved to {path}" if path else "checkpoint saved in the chief's checkpoint directory"
    if by is None:
        return f"Interrupted ({name}) at step {step}: {where}. Continue with --resume."
    return (f"Interrupted ({name}) at step {step}: {where} (every worker stopped at this step). Continue with "
            "--resume on every worker.")


def raise_interrupted(signum: int, step: int, store: Any, save: Any, together: Any, agree: Any, is_chief: bool) -> None:
    """Every worker stopped at ``step`` (agreed): save (``save()``, inside ``together(step)`` with the other workers)
    unless that step is saved already, and raise `TrainingInterrupted` saying where."""
    from ..errors import TrainingInterrupted

    path = None
    if store:
        path = save() if store.last_saved_step != step else store.latest
        with together(step):
            agree.saved(step)
        if agree.by is not None:  # the chief's checkpoint (a non-chief's save returns None)
            path = store.latest
    message = interrupted_message(signum, step, path, checkpointing=store is not None, by=agree.by)
    if is_chief:
        logger.warning(message)
    raise TrainingInterrupted(signum, step, path, message)
