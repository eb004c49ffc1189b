"""dynamo-relational: a torch.compile backend for scalar-granular relational models.

``torch.compile(model, backend="relational")`` groups per-neuron FX nodes into
vectorized gather / segment-reduce / matmul nodes and hands the small graph to
Inductor. See README.md.
"""
from .errors import OptionsError, RelationalError
from .logs import configure_from_env as _configure_logging
from .batching import batch
from .explain import explain
from .frontend import compile
from .options import Options
from .report import GraphReport, Report

_configure_logging()

__version__ = "0.1.0"
__all__ = ["compile", "batch", "explain", "Options", "Report", "GraphReport", "RelationalError", "OptionsError"]
