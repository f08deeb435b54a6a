"""What both input kinds share: the result of one compiled call (`Ran`), and walking nests of arrays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from .runs import At


@dataclass(frozen=True)
class Ran:
    """What one compiled call did: ``done`` steps, their losses and flags (``[done, updates]``: 1 applied, 0
    skipped for non-finite gradients, -1 a batch refused by the update's ``check``), the key it was compiled
    under (a new key is a call that traced and compiled), and whether the data's pass ended in it (an epoch of
    a stream without ``steps_per_epoch``)."""

    done: int
    losses: Any
    flags: Any
    key: Any
    pass_ended: bool = False

    @property
    def finite(self) -> Any:
        """Per step and update: its gradients were finite (a refused batch is not a non-finite one)."""
        return self.flags != 0

    def check_refused(self, at: At, first_in_epoch: int, updates: Any) -> None:
        """The library's error for the first batch an update's ``check`` refused in this call (the call ran from
        ``at``, its first step ``first_in_epoch`` of the epoch), naming its step."""
        bad = np.argwhere(self.flags < 0)
        if not len(bad):
            return
        i, u = int(bad[0][0]), updates[int(bad[0][1])]
        raise InputError(f"The batch of step {at.step + i} (epoch {at.epoch}, step {first_in_epoch + i} of the epoch) "
                         f"{u.check_message or 'was refused by the check of update ' + repr(u.name) + '.'} That step "
                         "was skipped (no weight changed) and training stopped; nothing was saved after it.")


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    return f"{type(value).__name__}" + (f" of shape {tuple(shape)}" if shape is not None else "") + (
        f" and dtype {dtype}" if dtype is not None else "")


def _leaf_paths(structure: Any, prefix: str) -> list[tuple[str, Any]]:
    """``(path, leaf)`` pairs of a nest of arrays: ``x['ids']``, ``x[1]``, ``y``."""
    if isinstance(structure, dict):
        return [p for k, v in structure.items() for p in _leaf_paths(v, f"{prefix}[{k!r}]")]
    if isinstance(structure, (tuple, list)):
        return [p for i, v in enumerate(structure) for p in _leaf_paths(v, f"{prefix}[{i}]")]
    return [(prefix, structure)]
