"""``explain(model, *inputs)``: compile with the relational backend and report what it did."""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from .backend import compile_graph
from .options import Options
from .report import Report


def explain(model: torch.nn.Module | Any, *inputs: Any, guard_filter_fn: Callable | None = None,
            **options: Any) -> Report:
    """Compile ``model`` with ``backend="relational"``, run it once on ``inputs`` and report.

    The report has ``nodes_before``/``nodes_after`` (FX nodes summed over the
    graphs Dynamo produced), ``groups``, ``lower_bound``, ``pass_timings`` and
    ``print_before()``/``print_after()``; ``print(report)`` shows a table.
    Keyword arguments are backend options (see :class:`Options`), except
    ``guard_filter_fn``, which goes to ``torch.compile`` as it does there
    (which of Dynamo's guards to keep; docs/guards.md).
    """
    opts = Options.from_mapping(options)
    graphs = []

    def backend(gm, example_inputs, **kwargs):
        compiled = compile_graph(gm, example_inputs, opts, detailed=True)
        graphs.append(compiled.report)
        return compiled.fn

    dynamo_options: dict[str, Any] | None = \
        {"guard_filter_fn": guard_filter_fn} if guard_filter_fn is not None else None
    compiled_model = torch.compile(model, backend=backend, options=dynamo_options)
    start = time.perf_counter()
    compiled_model(*inputs)
    return Report(graphs, compile_seconds=time.perf_counter() - start, compiled=compiled_model)
