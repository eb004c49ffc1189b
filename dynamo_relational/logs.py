"""Logging: ``logging.getLogger("dynamo_relational")``, switched on from the environment.

In the spirit of ``TORCH_LOGS``: ``DYNAMO_RELATIONAL_LOGS=info`` prints what each
compilation did (node counts, why nodes were left ungrouped);
``DYNAMO_RELATIONAL_LOGS=debug`` also names every node left ungrouped. Without
the variable the logger stays silent unless the application configures it.
"""
from __future__ import annotations

import logging
import os

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
        handler.setFormatter(logging.Formatter("[dynamo_relational] %(levelname)s %(message)s"))
        handler._dynamo_relational = True
        log.addHandler(handler)
