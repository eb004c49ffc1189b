"""Logging: ``logging.getLogger("dynamo_relational")``, switched on from the environment.

PyTorch's logging takes the package by its name: ``TORCH_LOGS="dynamo_relational"``
prints what each compilation did (node counts, why nodes were left ungrouped),
``TORCH_LOGS="+dynamo_relational"`` also names every node left ungrouped, and
``torch._logging.set_logs(modules={"dynamo_relational": logging.INFO})`` does the
same from code. ``DYNAMO_RELATIONAL_LOGS=info`` (or ``debug``) is a shorthand.
Either way the lines have PyTorch's format, whose ``[0/1]`` names the Dynamo
frame and recompilation being compiled. Without them the logger stays silent
unless the application configures it.
"""
from __future__ import annotations

import logging
import os

from torch._logging._internal import DEFAULT_FORMATTER

ENV = "DYNAMO_RELATIONAL_LOGS"
log = logging.getLogger("dynamo_relational")


def configure_from_env(environ=os.environ) -> None:
    """Apply ``DYNAMO_RELATIONAL_LOGS``: a level name (``info``, ``debug``, ``warning``)."""
    value = environ.get(ENV, "").strip()
    if not value:
        return
    level = logging.getLevelName(value.upper())
    if not isinstance(level, int):
        raise ValueError(f"{ENV}={value!r} is not a log level; use info, debug or warning")
    log.setLevel(level)
    if not any(getattr(h, "_dynamo_relational", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(DEFAULT_FORMATTER)
        setattr(handler, "_dynamo_relational", True)
        log.addHandler(handler)
