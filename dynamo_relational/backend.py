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

import contextlib
import copy
import logging
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
from torch._dynamo.mutation_guard import GenerationTracker
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensor

from dynamo_relational.kernels.gather_reduce import EAGER_FORMS, gather_reduce, gather_rows, prepare_products
from dynamo_relational import passes
from dynamo_relational.passes import PassContext
from dynamo_relational.forward_constants import changed_constant
from dynamo_relational.passes.distinct_outputs import expose_bases, hide_bases, output_aliases
from dynamo_relational.passes.gather_nodes import constant_value

from .autotune import fastest
from .errors import OptionsError, RelationalError
from .ops import tensor_info
from .options import Options
from .output_views import compile_with_views_outside
from .progress import NONE as NO_PROGRESS, CompileProgress, compile_progress
from .report import GraphReport, Report
from .trial_runs import leaving_no_trace

log = logging.getLogger("dynamo_relational")


@dataclass
class CompiledGraph:
    fn: Callable
    graph: fx.GraphModule
    report: GraphReport


def group_graph(gm: fx.GraphModule, options: Options, detailed: bool = False,
                progress: CompileProgress = NO_PROGRESS) -> tuple[fx.GraphModule, GraphReport]:
    """Run the grouping pipeline on a Dynamo graph; returns the grouped graph and its report."""
    ctx = PassContext(options, detailed=detailed or options.dump_dir is not None,
                      output_aliases=output_aliases(gm.graph))
    dump = GraphDump(options.dump_dir) if options.dump_dir is not None else None
    nodes_before = len(gm.graph.nodes)
    before_code = gm.print_readable(print_output=False) if ctx.detailed else ""
    if dump:
        dump.write("input", before_code)
    if not options.grouping:
        return gm, GraphReport.from_context(ctx, nodes_before, nodes_before, before_code, before_code)
    # a small graph is kept as traced if grouping does not make it smaller (see _smaller_or_as_traced)
    as_traced = copy_graph(gm) if nodes_before <= KEEP_AS_TRACED_UP_TO else None
    expose_bases(gm, ctx.output_aliases)   # values that returned views share: kept by every pass
    for step in passes.PIPELINE:   # (read per compile: a test may replace a pass)
        name = step.name
        if name in options.disable or step.unions_only:
            continue
        progress.start(name)
        try:
            with ctx.timed(name):
                gm = run_pass(step, gm, ctx)
            if options.strict:
                _lint(gm, name)
        except Exception:
            if options.strict:
                raise
            log.warning("relational: pass %s failed; compiling the graph ungrouped (correct, but slower). "
                        "Set options={'strict': True} to raise instead.", name, exc_info=True)
            ctx.stats["error"] = f"pass {name} failed; graph compiled ungrouped"
            break
        ctx.node_counts[name] = len(gm.graph.nodes)
        progress.step()
        if dump:
            dump.write(name, gm.print_readable(print_output=False))
    hide_bases(gm, ctx.output_aliases)   # where distinct_outputs did not run
    gm = _smaller_or_as_traced(gm, as_traced, nodes_before, ctx)
    after_code = gm.print_readable(print_output=False) if ctx.detailed else ""
    report = GraphReport.from_context(ctx, nodes_before, len(gm.graph.nodes), before_code, after_code)
    report.graph_module = gm if ctx.detailed else None
    if dump:
        dump.write("summary", str(Report([report])), suffix=".txt")
    if ctx.ungrouped and log.isEnabledFor(logging.INFO):
        for reason, count in ctx.ungrouped.most_common():
            log.info("relational: %d node(s) left ungrouped: %s", count, reason)
    return gm, report


def _lint(gm: fx.GraphModule, after: str) -> None:
    """fx's checks of ``gm``'s graph (each node's inputs defined before it, names unique, targets resolvable),
    raised with the pass that left it so."""
    try:
        gm.graph.lint()
    except Exception as e:
        raise RuntimeError(f"the graph after pass {after} is malformed: {e}") from e


#: graphs of at most this many FX nodes are copied before grouping, to fall back to (the copy costs about
#: 30 us per node; larger graphs are relational ones, where grouping pays)
KEEP_AS_TRACED_UP_TO = 2000


def _smaller_or_as_traced(grouped: fx.GraphModule, as_traced: fx.GraphModule | None, nodes_before: int,
                          ctx) -> fx.GraphModule:
    """``grouped`` if it has fewer FX nodes than the traced graph had, else the traced graph itself.

    Grouping pays by running fewer, larger ops. Where nothing batches (a recurrent cell over time steps,
    an ordinary model), the passes can only split ops into more pieces (``nn.LSTMCell`` into its gates),
    which costs compile time and run time under Inductor and gains nothing.

    Not where ``distinct_outputs`` cloned an output: two outputs that eager computes apart, by equal
    expressions, are one value to CSE, and Inductor would merge them in the traced graph as well, so that
    writing into one output would change the other."""
    if as_traced is None or len(grouped.graph.nodes) < nodes_before or ctx.stats.get("outputs_cloned"):
        return grouped
    log.info("relational: grouping left %d FX nodes of %d; the graph is compiled as traced",
             len(grouped.graph.nodes), nodes_before)
    ctx.stats.update(kept_as_traced=f"grouping left {len(grouped.graph.nodes)} FX nodes of {nodes_before}",
                     groups=nodes_before, vectorized_groups=0, schedule="as traced")
    ctx.groups = []
    return as_traced


def run_pass(step: passes.Pass, gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    """``gm`` rewritten by ``step``. Optimizer passes rewrite in place: where one fails, the graph it started
    from (a copy kept for that) is the result, with a warning and ``stats["skipped_passes"]``, unless
    ``options.strict``; a failure of any other pass raises."""
    backup = copy_graph(gm) if step.optional and not ctx.options.strict else None
    try:
        return step.run(gm, ctx)
    except Exception:
        if backup is None:
            raise
        log.warning("relational: optimizer pass %s failed and was skipped (the result is unchanged); "
                    "set the option strict=True to raise instead.", step.name, exc_info=True)
        ctx.stats.setdefault("skipped_passes", []).append(step.name)
        return backup


def copy_graph(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm``'s graph over the same parameters and buffers (they are shared, not cloned)."""
    return fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=gm.__class__.__name__)  # nodes, not tensors


class GraphDump:
    """``options={"dump_dir": ...}``: the graph after every pass as readable code, then a summary."""
    _graphs = 0

    def __init__(self, directory: str):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        GraphDump._graphs += 1
        self.prefix = f"graph{GraphDump._graphs:03d}"
        self.step = 0

    def write(self, name: str, text: str, suffix: str = ".py") -> None:
        path = self.directory / f"{self.prefix}_{self.step:02d}_{name}{suffix}"
        path.write_text(text)
        self.step += 1


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], options: Options,
                  detailed: bool = False) -> CompiledGraph:
    with compile_progress(options.progress) as progress:
        grouped, report = group_graph(gm, options, detailed, progress)
        progress.start("inductor")
        return _compile_grouped(grouped, report, example_inputs, options)


def _compile_grouped(grouped: fx.GraphModule, report: GraphReport, example_inputs: Sequence[Any],
                     options: Options) -> CompiledGraph:
    if options.inductor:
        # Dynamo guards on the grad mode: the code runs in the mode it is compiled in, so it is timed in it
        # (a graph that registers a gradient hook on an intermediate cannot even run without gradients)
        fn = compile_static(grouped, example_inputs, options, report, grad=torch.is_grad_enabled())
    else:
        fn = grouped
        report.timings["no_inductor"] = 0.0   # nothing compiled (the key keeps it out of the passes' times)
    log.info("relational: %d -> %d FX nodes in %d groups", report.nodes_before, report.nodes_after, report.groups)
    return CompiledGraph(_refusing_changed_constants(fn, report.constants_read), grouped, report)


def _refusing_changed_constants(fn: Callable, read: list) -> Callable:
    """``fn``, checking before each call that the buffers whose values ``value_compression`` merged rows by
    are unchanged: Dynamo's guards do not look at buffer values, so the graph would compute with stale merges."""
    if not read:
        return fn

    def checked(*args):
        name = changed_constant(read)
        if name is not None:
            raise RelationalError(
                f"value_compression merged rows by the values of {name}, which changed in place since compiling: "
                "the compiled graph would compute with the old merges. Call torch._dynamo.reset() and compile again "
                "after changing it (or compile without value_compression).")
        return fn(*args)
    return checked


def without_autograd_cache_if_tagged(gm: fx.GraphModule):
    """AOT autograd's cache knows a graph by its code, not by its nodes' ``recompute`` tags
    (``passes/recompute_gathers.py``): it would serve a tagged graph the partition of the same graph
    compiled untagged (another options set, an earlier process). Tagged graphs skip that cache;
    Inductor's own cache, which sees the partitioned graphs, still applies."""
    if any("recompute" in node.meta for node in gm.graph.nodes):
        return torch._functorch.config.patch(enable_autograd_cache=False)
    return contextlib.nullcontext()


def inductor_mode(mode: str | None):
    """Inductor's settings for ``torch.compile``'s ``mode`` (``options.mode``), while they are in force."""
    if mode is None:
        return contextlib.nullcontext()
    from torch._inductor import config, list_mode_options   # (as compile_fx, at the first compile)
    return config.patch(list_mode_options(mode))


def compile_static(gm: fx.GraphModule, inputs: Sequence[Any], options: Options, report: GraphReport,
                   grad: bool = False) -> Callable:
    """Inductor's ``compile_fx`` (AOT autograd inside) on a copy of ``gm`` (it rewrites the graph it
    is given), for ``inputs``' sizes; then the executor choice between that code and ``gm`` itself."""
    from torch._inductor.compile_fx import compile_fx   # (importing Inductor takes 2 s: at the first compile)

    start = time.perf_counter()
    cuda_graphs = options.mode is not None and bool(_mode_options(options.mode).get("triton.cudagraphs"))
    products = _products_for_cuda_graphs(gm) if cuda_graphs else []
    compile_fn = _with_static_inputs_known(compile_fx) if cuda_graphs else compile_fx
    with without_autograd_cache_if_tagged(gm), inductor_mode(options.mode):
        fn = compile_with_views_outside(compile_fn, copy_graph(gm), list(inputs))
    if cuda_graphs:
        fn = _replaying(fn, products, under_dynamo=torch._guards.CompileContext.current_compile_id() is not None)
    report.add_time("inductor", start)
    if cuda_graphs:   # asked for by the mode; the timed trial runs could not replay them as a training loop does
        report.stats["executor"] = "inductor"
        return fn
    return choose_executor(fn, gm, inputs, options, report, grad)


def _mode_options(mode: str) -> dict:
    from torch._inductor import list_mode_options   # (as compile_fx, at the first compile)
    return list_mode_options(mode)


def _products_for_cuda_graphs(gm: fx.GraphModule) -> list:
    """The matrices of ``gm``'s gathers on CUDA, built before any run is recorded in a CUDA graph
    (:func:`~dynamo_relational.kernels.gather_reduce.prepare_products`)."""
    products = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (gather_reduce, gather_rows):
            continue
        csr, source = constant_value(gm, node.args[1]), tensor_info(node.args[0])
        if csr is not None and csr.is_cuda and source is not None:
            products += prepare_products(source, csr, *node.args[2:])
    return products


def _with_static_inputs_known(compile_fn: Callable) -> Callable:
    """``compile_fn`` telling AOT autograd which inputs keep their address from call to call.

    CUDA graphs copy every other input into their memory pool before each replay. AOT autograd knows the
    static ones (the parameters, the graph's index buffers) from Dynamo's records on the graph module, which
    the grouped graph, a new module, lacks: they are put back here (under Dynamo only; without it AOT
    autograd counts the module's own parameters and buffers as static by itself). The index buffers are
    named as constants of the graph, the placeholders keep the static marks Dynamo left in their meta."""
    def compile_marked(gm: fx.GraphModule, inputs: Sequence[Any]):
        compile_id = torch._guards.CompileContext.current_compile_id()
        if compile_id is not None:
            gm.meta["dynamo_compile_id"] = compile_id
            names = [*dict(gm.named_parameters(remove_duplicate=False)),
                     *dict(gm.named_buffers(remove_duplicate=False))]
            setattr(gm, "_param_name_to_source",
                    {name: ConstantSource(f"relational_graph.{name}") for name in names})
            for node in gm.graph.find_nodes(op="placeholder"):
                node._dynamo_source = None
        return compile_fn(gm, inputs)
    return compile_marked


def _replaying(fn: Callable, products: list, under_dynamo: bool) -> Callable:
    """``fn`` recorded in CUDA graphs, keeping the gathers' ``products`` alive as long as it is.

    CUDA graph trees take the entry into a ``torch.compile``'d frame as the start of a new step, when the last
    step's outputs may be overwritten; a call of the fast front-end enters no frame, so each call counts as
    one here (else every call would record anew, its predecessor's outputs still counting as alive). Its
    calls without gradients run the training graph, whose backward never comes: each starts a step outright."""
    def run(*args):
        if not under_dynamo:
            if torch.is_grad_enabled():
                GenerationTracker.generation += 1
            else:
                torch.compiler.cudagraph_mark_step_begin()
        return fn(*args)
    setattr(run, "products", products)   # held by the compiled function (see prepare_products)
    return run


def choose_executor(inductor_fn: Callable, aten: fx.GraphModule, inputs: Sequence[Any], options: Options,
                    report: GraphReport, grad: bool = False) -> Callable:
    """With ``options.autotune``, time Inductor's code against the grouped graph's plain ATen calls
    (:func:`aten_executor`) on the example inputs (where they are real: no fake tensors or symbolic ints) and
    return the faster; the choice is recorded in the report.
    ``grad`` times the forward with autograd recording (the mode the code was compiled for)."""
    real = not any(isinstance(x, (FakeTensor, torch.SymInt, torch.SymFloat, torch.SymBool)) for x in inputs)
    if not (options.autotune and report.vectorized_groups and real):
        return inductor_fn

    start = time.perf_counter()
    # the bound ``forward`` skips ``nn.Module.__call__`` (hook checks) on every call
    executor = aten_executor(aten).forward
    with leaving_no_trace(aten, inputs):   # the timed runs must not advance buffers or random generators
        choice, medians = fastest({"inductor": inductor_fn, "aten": executor}, inputs, grad)
    report.timings["autotune"] = time.perf_counter() - start
    report.stats["executor"] = choice
    report.stats.setdefault("executors", {})["grad" if grad else "no_grad"] = choice
    report.stats["executor_ms"] = medians
    log.info("relational: runs the grouped graph with %s (measured ms: %s)", choice, medians)
    return executor if choice == "aten" else inductor_fn


def aten_executor(gm: fx.GraphModule, forms: dict = EAGER_FORMS) -> fx.GraphModule:
    """``gm`` run as plain ATen calls: a copy whose custom kernel calls use their ``forms``
    (:data:`dynamo_relational.kernels.gather_reduce.EAGER_FORMS`: the same computation with less
    per-call overhead than the ``torch.library`` dispatch that Inductor and Dynamo need)."""
    executor = copy_graph(gm)
    use_forms(executor.graph, forms)
    executor.recompile()
    return executor


def use_forms(graph: fx.Graph, forms: dict) -> None:
    """Make ``graph``'s custom kernel calls call their ``forms`` instead (see :func:`aten_executor`)."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target in forms:
            node.target = forms[node.target]


def relational(gm: fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None,
               mode: str | None = None, **kwargs):
    """The backend function: ``torch.compile(model, backend="relational", options={...})``, or
    ``mode=...`` instead of ``options`` (Inductor's mode for the grouped graph: ``Options.mode``)."""
    if kwargs:
        raise OptionsError(f"unexpected backend arguments {sorted(kwargs)}; pass options={{...}}")
    opts = Options.from_mapping(options if mode is None else {**(options or {}), "mode": mode})
    _suggest_batch_on_recompiles()
    return compile_graph(gm, example_inputs, opts).fn


#: the compile of one frame at which the backend says that ``dynamo_relational.batch`` exists
SUGGEST_BATCH_AT = 3


def _suggest_batch_on_recompiles() -> None:
    """Warn once per frame, at its :data:`SUGGEST_BATCH_AT`-th compile, that a model called with one sample
    of another structure at a time (its tree's size, a list of neighbours: Dynamo's guards) compiles again on
    every call, and that ``dynamo_relational.batch`` traces each structure once instead."""
    compile_id = torch._guards.CompileContext.current_compile_id()
    if compile_id is None or compile_id.frame_compile_id != SUGGEST_BATCH_AT - 1:
        return
    log.warning("relational: Dynamo has compiled frame %s %d times (TORCH_LOGS=recompiles says why). A "
                "forward called with one sample of another structure each time (a tree, a molecule, a grounded "
                "network) compiles for each, until Dynamo's recompile limit makes it run eagerly: "
                "dynamo_relational.batch(model) runs lists of such samples, each structure traced once "
                "(docs/dynamic.md).", compile_id.frame_id, SUGGEST_BATCH_AT)
