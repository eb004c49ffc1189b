"""The ``relational`` TorchDynamo backend.

Registered through the ``torch_dynamo_backends`` entry point (see
pyproject.toml), so ``torch.compile(model, backend="relational")`` works
without importing this package first. This module never calls
``register_backend`` itself.

Pipeline: Dynamo's torch-level FX graph -> grouping passes
(:data:`dynamo_relational.passes.PIPELINE`) -> Inductor's ``compile_fx`` on the
small grouped graph (which runs AOT autograd, so training works). The
ungrouped graph is never re-traced with make_fx.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from .options import Options
from .report import GraphReport

log = logging.getLogger("dynamo_relational")


@dataclass
class CompiledGraph:
    fn: Callable
    graph: fx.GraphModule
    report: GraphReport


def group_graph(gm: fx.GraphModule, options: Options, detailed: bool = False) -> tuple[fx.GraphModule, GraphReport]:
    """Run the grouping pipeline on a Dynamo graph; returns the grouped graph and its report."""
    from dynamo_relational.passes import PIPELINE, PassContext

    ctx = PassContext(options, detailed=detailed)
    nodes_before = len(gm.graph.nodes)
    before_code = gm.print_readable(print_output=False) if detailed else ""
    if not options.grouping:
        return gm, GraphReport.from_context(ctx, nodes_before, nodes_before, before_code, before_code)
    try:
        for name, run_pass in PIPELINE:
            if name in options.disable:
                continue
            with ctx.timed(name):
                gm = run_pass(gm, ctx)
            ctx.node_counts[name] = len(gm.graph.nodes)
    except Exception:
        if options.strict:
            raise
        log.warning("relational: grouping failed; compiling the graph ungrouped (correct, but slower). "
                    "Set options={'strict': True} to raise instead.", exc_info=True)
        ctx.stats["error"] = "grouping failed; graph compiled ungrouped"
    after_code = gm.print_readable(print_output=False) if detailed else ""
    report = GraphReport.from_context(ctx, nodes_before, len(gm.graph.nodes), before_code, after_code)
    if ctx.ungrouped and log.isEnabledFor(logging.INFO):
        for reason, count in ctx.ungrouped.most_common():
            log.info("relational: %d node(s) left ungrouped: %s", count, reason)
    return gm, report


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], options: Options,
                  detailed: bool = False) -> CompiledGraph:
    grouped, report = group_graph(gm, options, detailed)
    start = time.perf_counter()
    if options.inductor:
        from torch._inductor.compile_fx import compile_fx

        fn = compile_fx(grouped, list(example_inputs))
    else:
        fn = grouped
    report.timings["inductor" if options.inductor else "no_inductor"] = time.perf_counter() - start
    log.info("relational: %d -> %d FX nodes in %d groups", report.nodes_before, report.nodes_after, report.groups)
    return CompiledGraph(fn, grouped, report)


def relational(gm: fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None, **kwargs):
    """The backend function: ``torch.compile(model, backend="relational", options={...})``."""
    if kwargs:
        from .errors import OptionsError

        raise OptionsError(f"unexpected backend arguments {sorted(kwargs)}; pass options={{...}}")
    return compile_graph(gm, example_inputs, Options.from_mapping(options)).fn
