"""The precision check of the models a trainer trains, once, before the first step."""

from __future__ import annotations

import logging
from typing import Any, Sequence

logger = logging.getLogger("amp_backends.train")


def log_model_checks(models: Sequence[Any], plan: Any, *, batch_size: int) -> None:
    """Log the precision check of each model; a check that fails never stops training."""
    from ..model_check import check_model

    for model in models:
        try:
            result = check_model(model, plan, batch_size=batch_size)
        except Exception as exc:
            logger.warning(f"The precision check of {getattr(model, 'name', model)!r} failed ({type(exc).__name__}: "
                           f"{str(exc)[:200]}); training goes on.")
            continue
        for line in result.log_lines():
            logger.info(line)
