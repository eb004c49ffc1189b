"""The systems under comparison and how each one is prepared (compiled) for a workload.

=================  =====================================================================
system             what runs
=================  =====================================================================
eager              the scalar-granular model, eager PyTorch
inductor           the scalar model under stock ``torch.compile`` (Inductor)          [capped]
relational         the scalar model under ``torch.compile(backend="relational")``     [capped]
relational_unguarded  the same, each timed call under
                   ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``: Dynamo
                   skips the guards on the model's Python structure (docs/guards.md) [capped]
relational_filtered  ``torch.compile(backend="relational")`` with the guard filter
                   ``torch.compiler.skip_guard_on_all_nn_modules_unsafe``: no guards
                   on the modules' attributes (the structure), those on the inputs
                   and the grad mode kept (docs/guards.md)                       [capped]
relational_fast    the scalar model through ``dynamo_relational.compile`` (the fast
                   front-end), when the installed package has it
pyg                the PyTorch Geometric peer with the same weights, eager
pyg_compile        the PyG peer under stock ``torch.compile`` (Inductor), in the Inductor
                   ``mode`` of the relational systems' options (``--options
                   '{"mode": "reduce-overhead"}'``: CUDA graphs on both sides)
=================  =====================================================================

Systems marked *capped* are traced by TorchDynamo, which costs about 1 ms per
FX node of the scalar model (minutes at full size): the harness runs them in a
child process that is killed when compiling takes longer than the cap
(:mod:`benchmarks.worker`).

:func:`prepare` compiles a system the way a training user meets it: a first
forward with gradients, a first backward (AOT autograd compiles the backward
graph lazily, on that call) and a first forward under ``torch.no_grad()`` (a
different graph for Dynamo: it guards on the grad mode). Their wall times add up
to the reported compile time. Where the backend reports per-pass timings
(``Report.pass_timings``) compile time is split into

* ``trace``: Dynamo's bytecode tracing and guard building (the rest of the
  first calls' time), or the fast front-end's own tracing time,
* ``grouping``: the grouping pass (signatures and schedule),
* ``passes``: the other rewriting passes (aggregation, CSE, vectorize, ...),
* ``inductor``: AOT autograd + Inductor on the grouped graph (the ``inductor``
  timing), plus the first backward call, which compiles the backward graph.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

SYSTEMS = ("eager", "inductor", "relational", "relational_unguarded", "relational_filtered", "relational_fast", "pyg",
           "pyg_compile")
#: systems that TorchDynamo traces on the scalar model: run in a child process under the compile cap
CAPPED = ("inductor", "relational", "relational_unguarded", "relational_filtered")
#: systems that need a PyG peer
NEEDS_PEER = ("pyg", "pyg_compile")


def has_fast_frontend() -> bool:
    import dynamo_relational

    return hasattr(dynamo_relational, "compile")


def available(system: str, has_peer: bool) -> bool:
    if system in NEEDS_PEER:
        return has_peer
    if system == "relational_fast":
        return has_fast_frontend()
    return system in SYSTEMS


@dataclass
class Prepared:
    name: str
    #: call it like the model: fn(x) -> output
    fn: Callable[[torch.Tensor], torch.Tensor]
    #: the module whose parameters get gradients (zeroed between timed runs)
    module: nn.Module
    #: compile time and its parts in seconds; empty for eager systems
    compile: dict = field(default_factory=dict)


def prepare(system: str, model: nn.Module, peer: nn.Module | None, x: torch.Tensor,
            options: dict | None = None) -> Prepared:
    """Compile ``system`` for ``model`` (or its ``peer``) on input ``x``, timing the compilation.
    ``options``: backend options (``dynamo_relational.Options``) of the relational systems."""
    if system == "eager":
        return Prepared(system, model, model)
    if system == "pyg":
        return Prepared(system, peer, peer)
    if system == "pyg_compile":
        fn = torch.compile(peer, mode=(options or {}).get("mode"))
        return Prepared(system, fn, peer, _first_calls(fn, peer, x))
    if system == "inductor":
        fn = torch.compile(model)
        return Prepared(system, fn, model, _first_calls(fn, model, x))
    if system == "relational":
        return _prepare_relational(model, x, options or {})
    if system == "relational_unguarded":
        prepared = _prepare_relational(model, x, options or {})
        return Prepared(system, _skipping_guards(prepared.fn), model, prepared.compile)
    if system == "relational_filtered":
        prepared = _prepare_relational(model, x, options or {},
                                       guard_filter_fn=torch.compiler.skip_guard_on_all_nn_modules_unsafe)
        return Prepared(system, prepared.fn, model, prepared.compile)
    if system == "relational_fast":
        return _prepare_relational_fast(model, x, options or {})
    raise ValueError(f"unknown system {system!r}; expected one of {SYSTEMS}")


def _skipping_guards(fn: Callable) -> Callable:
    """``fn`` called with Dynamo's guard evaluation skipped, but for the guards that tell its cached
    graphs apart (the grad mode here): unsafe when the structure changes, which it does not here."""
    def call(x):
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            return fn(x)
    return call


def _first_calls(fn, module: nn.Module, x: torch.Tensor, first_forward_s: float | None = None) -> dict:
    """Make ``fn`` compile everything it needs; wall time of each first call in seconds.

    ``first_forward_s`` is given when the first forward with gradients already
    happened (``explain`` makes it); then only its output is recomputed here.
    """
    start = time.perf_counter()
    out = fn(x)
    forward = time.perf_counter() - start if first_forward_s is None else first_forward_s
    start = time.perf_counter()
    out.sum().backward()
    backward = time.perf_counter() - start
    start = time.perf_counter()
    with torch.no_grad():
        fn(x)
    inference = time.perf_counter() - start
    module.zero_grad(set_to_none=True)
    return dict(total=forward + backward + inference, first_forward=forward, first_backward=backward,
                first_inference=inference)


def _split(times: dict, pass_timings: dict[str, float], traced_s: float) -> dict:
    """Add trace / grouping / passes / inductor to ``times``.

    ``pass_timings``: the backend's per-pass seconds (``Report.pass_timings``);
    the fast front-end also reports its own tracing there (``trace`` and
    ``values``). Without those, tracing is the rest of ``traced_s``, the time of
    the calls that traced the model and ran the passes.
    """
    tracing, final = ("trace", "values"), ("inductor", "no_inductor")   # no_inductor: options inductor=False
    inductor = sum(pass_timings.get(k, 0.0) for k in final)
    grouping = pass_timings.get("grouping", 0.0)
    passes = sum(v for k, v in pass_timings.items() if k not in tracing + final + ("grouping",))
    if "trace" in pass_timings:
        trace = sum(pass_timings.get(k, 0.0) for k in tracing)
    else:
        trace = max(traced_s - inductor - grouping - passes, 0.0)
    times.update(trace=trace, grouping=grouping, passes=passes, inductor=inductor + times["first_backward"])
    return times


def _prepare_relational(model: nn.Module, x: torch.Tensor, options: dict,
                        guard_filter_fn: Callable | None = None) -> Prepared:
    """``torch.compile(model, backend="relational")`` via ``dynamo_relational.explain``, which
    keeps the per-pass timings of every graph it compiles (the gradient and the no-grad graph)."""
    import dynamo_relational

    report = dynamo_relational.explain(model, x, guard_filter_fn=guard_filter_fn, **options)
    training_graphs = list(report.graphs)   # the no-grad call below appends its graphs to the report
    times = _first_calls(report.compiled, model, x, first_forward_s=report.compile_seconds)
    times = _split(times, report.pass_timings, times["first_forward"] + times["first_inference"])
    times["fx_nodes_before"] = sum(g.nodes_before for g in training_graphs)
    times["fx_nodes_after"] = sum(g.nodes_after for g in training_graphs)
    return Prepared("relational", report.compiled, model, times)


def _prepare_relational_fast(model: nn.Module, x: torch.Tensor, options: dict) -> Prepared:
    """The fast front-end ``dynamo_relational.compile(model, example_inputs)``; its per-pass
    timings and node counts come from the compiled module's ``report``."""
    import dynamo_relational

    start = time.perf_counter()
    fn = dynamo_relational.compile(model, (x,), **options)
    compile_call = time.perf_counter() - start
    times = _first_calls(fn, model, x)
    times["compile_call"] = compile_call
    times["total"] += compile_call
    report = getattr(fn, "report", None)
    if report is not None:
        times = _split(times, report.pass_timings, compile_call + times["first_forward"] + times["first_inference"])
        times["fx_nodes_before"], times["fx_nodes_after"] = report.nodes_before, report.nodes_after
        times["executors"] = report.graphs[0].stats.get("executors")   # autotuned: "inductor" or "aten"
    return Prepared("relational_fast", fn, model, times)
