"""Compiled code shared across groundings whose grouped graphs have the same schema.

A new grounding (another batch of molecules, the next fold, a new database
query) changes the index tensors and sizes of the grouped graph, not its ops.
:func:`lift` rewrites a grouped graph into a pure function of
``(inputs, parameters, constant tensors, sizes)`` with canonical node names;
its code is the *schema*. From the second grounding on, graphs with the same
schema share one ``torch.compile``'d callable with dynamic shapes, so the
third and later groundings skip Inductor (the first gets static code, which
compiles fastest). The reuse is never wrong: Dynamo guards on everything the
compiled code assumed (dtypes, ranks, sizes it specialized on, grad mode) and
compiles again when a guard fails.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from dynamo_relational.passes.gather_nodes import is_added_constant

from .backend import choose_executor, compile_static, inductor_mode, without_autograd_cache_if_tagged
from .ops import REGISTRY
from .ops.elementwise import ELEMENTWISE
from .options import Options
from .output_views import compile_with_views_outside
from .report import GraphReport
from .trial_runs import leaving_no_trace

log = logging.getLogger("dynamo_relational")

#: Schemas kept per process (least recently used dropped first).
CAPACITY = 32


@dataclass
class Lifted:
    """A grouped graph as a pure function: ``graph(*inputs, *values)``."""
    graph: fx.GraphModule
    #: parameters, constant tensors and sizes, in the order of ``graph``'s extra placeholders
    values: list[Any]
    #: the graph's code: equal keys mean the same ops on differently sized data
    key: str
    #: the ``recompute`` tags of its nodes (``passes/recompute_gathers.py``) as (target, k) for
    #: the k-th call of that target: Dynamo's trace of ``graph`` drops node meta, :func:`retag` puts them back
    recompute: tuple[tuple[Any, int, Any], ...] = ()
    #: per value: whether it is a constant the passes made (an index tensor), equal by value from one grounding
    #: to another; the model's parameters and buffers are the same only as the same objects
    made: tuple[bool, ...] = ()

    def same_grounding(self, values: Sequence[Any]) -> bool:
        """Whether ``values`` (another grounding's) are these: the same sizes, index tensors of equal values,
        and the same parameter and buffer objects. Code compiled for one then serves the other."""
        if len(values) != len(self.values):
            return False
        for made, mine, other in zip(self.made, self.values, values):
            if not isinstance(mine, torch.Tensor):
                if mine != other:
                    return False
            elif mine is not other and not (made and mine.shape == other.shape and mine.dtype == other.dtype
                                            and mine.device == other.device and torch.equal(mine, other)):
                return False
        return True


def _is_size(value: Any) -> bool:
    # 0, 1 and -1 stay literal: Dynamo specializes them anyway, and -1 means "infer".
    return type(value) is int and value not in (-1, 0, 1)


def _takes_sizes(node: fx.Node) -> bool:
    """Whether ``node``'s int arguments may be sizes. Those of elementwise ops are operands (``h ** 2``,
    ``h + 3``), the same in every grounding: lifted, Inductor's backward of ``pow`` with a symbolic int
    exponent fails ("NYI SymInt equality"), and the schema's shared code with it."""
    return node.op in ("call_function", "call_method") and REGISTRY.family_of(node) is not ELEMENTWISE


def lift(gm: fx.GraphModule) -> Lifted | None:
    """``gm`` with its tensor attributes and sizes as inputs; ``None`` if it calls submodules."""
    if any(node.op == "call_module" for node in gm.graph.nodes):
        return None
    attrs: dict[str, int] = {}
    values: list[Any] = []
    made: list[bool] = []

    def collect(arg: Any) -> Any:
        if _is_size(arg):
            values.append(arg)
            made.append(False)
        return arg

    for node in gm.graph.nodes:   # first pass: what becomes an input, in order
        if node.op == "get_attr" and node.target not in attrs:
            value = _attribute(gm, node.target)
            if not isinstance(value, torch.Tensor):
                return None
            attrs[node.target] = len(values)
            values.append(value)
            made.append(is_added_constant(node))
        elif _takes_sizes(node):
            fx.node.map_aggregate((node.args, node.kwargs), collect)

    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(inputs):
        env[node] = graph.placeholder(f"input{i}")
    extra = [graph.placeholder(f"value{i}") for i in range(len(values))]
    sizes = iter(i for i, v in enumerate(values) if not isinstance(v, torch.Tensor))

    def rename(arg: Any) -> Any:
        if isinstance(arg, fx.Node):
            return env[arg]
        return extra[next(sizes)] if _is_size(arg) else arg

    def keep(arg: Any) -> Any:
        return env[arg] if isinstance(arg, fx.Node) else arg

    for i, node in enumerate(gm.graph.nodes):
        if node.op == "get_attr":
            env[node] = extra[attrs[node.target]]
        elif node.op in ("call_function", "call_method"):
            args, kwargs = fx.node.map_aggregate((node.args, node.kwargs), rename if _takes_sizes(node) else keep)
            env[node] = graph.create_node(node.op, node.target, args, kwargs, name=f"v{i}")
        elif node.op == "output":
            graph.output(fx.node.map_arg(node.args[0], env.__getitem__))
    lifted = fx.GraphModule(torch.nn.Module(), graph)
    recompute = tuple((target, k, node.meta["recompute"]) for target, k, node in _calls(gm.graph)
                      if "recompute" in node.meta)
    key = graph.python_code("self").src + "".join(f"\n# recompute {target} #{k}" for target, k, _ in recompute)
    return Lifted(lifted, values, key, recompute, tuple(made))


def _calls(graph: fx.Graph):
    """``(target, k, node)`` for every call, ``k`` counting the calls of that target."""
    seen: dict[Any, int] = {}
    for node in graph.nodes:
        if node.op == "call_function":
            seen[node.target] = k = seen.get(node.target, -1) + 1
            yield node.target, k, node


def retag(gm: fx.GraphModule, recompute: Sequence[tuple[Any, int, Any]]) -> fx.GraphModule:
    """Put the ``recompute`` tags of a lifted graph back on Dynamo's trace of it (same calls, same order)."""
    tags = {(target, k): policy for target, k, policy in recompute}
    found = 0
    for target, k, node in _calls(gm.graph):
        if (target, k) in tags:
            node.meta["recompute"] = tags[target, k]
            found += 1
    if found != len(tags):
        log.info("relational: %d of %d recompute tags found again in the shared graph", found, len(tags))
    return gm


def _attribute(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


@dataclass
class Schema:
    """One schema's compiled code, shared by every grounding that has it."""
    #: the shared code; None while only one grounding has been seen (it got static code)
    fn: Callable | None = None
    #: how it runs: "inductor", or "aten" (the lifted graph itself) where autotuning found that faster
    executor: str = "inductor"
    #: how often the schema was looked up (one per grounding and autograd mode)
    uses: int = 0
    #: the first grounding, its inputs' :func:`_specs` and its static code, which serves a later identical
    #: grounding (the model compiled again) without compiling code for dynamic sizes
    first: tuple[Lifted, tuple, Callable] | None = None


class SchemaCache:
    """Per-process map from (schema key, grad) to its :class:`Schema` (least recently used dropped)."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self._schemas: OrderedDict[tuple[str, bool, str | None], Schema] = OrderedDict()

    def get(self, key: tuple[str, bool, str | None]) -> Schema | None:
        schema = self._schemas.get(key)
        if schema is not None:
            self._schemas.move_to_end(key)
            schema.uses += 1
        return schema

    def put(self, key: tuple[str, bool, str | None], schema: Schema) -> Schema:
        self._schemas[key] = schema
        schema.uses += 1
        while len(self._schemas) > self.capacity:
            self._schemas.popitem(last=False)
        return schema

    def clear(self) -> None:
        self._schemas.clear()

    def __len__(self) -> int:
        return len(self._schemas)


SCHEMAS = SchemaCache()

_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "mtia")


def autocast_state() -> tuple[tuple[str, torch.dtype], ...] | None:
    """The autocast regions around the current call, as (device type, dtype) pairs; None outside any.
    Compiled code bakes in the casts of the regions it was compiled in (Dynamo guards on them)."""
    if not torch._C._is_any_autocast_enabled():
        return None
    return tuple((device, torch.get_autocast_dtype(device)) for device in _AUTOCAST_DEVICES
                 if torch.is_autocast_enabled(device))


def _inductor_with_tags(recompute: Sequence[tuple[Any, int, Any]], mode: str | None) -> Callable:
    """Inductor (in ``mode``) as a Dynamo backend, on the graph with its recompute tags restored."""
    from torch._inductor.compile_fx import compile_fx   # (importing Inductor takes 2 s: at the first compile)


    def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        gm = retag(gm, recompute)
        with without_autograd_cache_if_tagged(gm), inductor_mode(mode):
            return compile_with_views_outside(compile_fx, gm, example_inputs)

    return backend


def _specs(inputs: Sequence[Any]) -> tuple:
    """What static code is specialized to in its inputs: shapes, strides, dtypes, devices, and which need
    gradients (AOT autograd computes gradients for those alone)."""
    return tuple((tuple(x.shape), x.stride(), x.dtype, x.device, x.requires_grad) if isinstance(x, torch.Tensor)
                 else x for x in inputs)


def compile_grouped(gm: fx.GraphModule, inputs: Sequence[torch.Tensor], options: Options, report: GraphReport,
                    grad: bool) -> tuple[Callable, bool]:
    """A callable running grouped graph ``gm`` on ``inputs``-like arguments, compiled for the autograd
    need ``grad``, and whether it is code shared across groundings.

    As Dynamo's automatic dynamic shapes do: the first grounding of a schema
    gets Inductor's ``compile_fx`` for its own sizes (static code compiles
    fastest); the second compiles code with dynamic sizes, which it and every
    later grounding share. ``options.reuse_compiled=False`` always compiles static code, and so do calls
    in autocast regions: Inductor's CPU code generation for bfloat16 kernels with dynamic sizes did not
    finish in 5 minutes (index simplification in sympy) on the 4-molecule GCN's backward."""
    lifted = lift(gm) if options.reuse_compiled and autocast_state() is None else None
    if lifted is None:
        return compile_static(gm, inputs, options, report, grad), False
    key = (lifted.key, grad, options.mode)   # the executor is autotuned per autograd need
    schema = SCHEMAS.get(key)
    if schema is None:
        schema = SCHEMAS.put(key, Schema())
        report.stats["schema_uses"] = 1
        fn = compile_static(gm, inputs, options, report, grad)
        schema.first = lifted, _specs(inputs), fn
        return fn, False
    if (schema.first is not None and schema.first[1] == _specs(inputs)
            and schema.first[0].same_grounding(lifted.values)):
        report.stats["schema_uses"] = schema.uses
        report.stats["reused"] = "the code compiled for an identical grounding"
        return schema.first[2], False
    if schema.fn is None:
        args = (*inputs, *lifted.values)
        start = time.perf_counter()
        # Parameter shapes stay static (Dynamo's ``force_parameter_static_shapes``); Dynamo traces
        # only the small grouped graph.
        compiled = torch.compile(lifted.graph, backend=_inductor_with_tags(lifted.recompute, options.mode),
                                 dynamic=True)
        try:
            with torch.set_grad_enabled(grad), leaving_no_trace(lifted.graph, args):   # compiles; state stays
                compiled(*args)
        except Exception:
            log.warning("relational: compiling the grouped graph with dynamic sizes failed; compiling it for "
                        "these sizes only (no reuse across groundings)", exc_info=True)
            return compile_static(gm, inputs, options, report, grad), False
        report.add_time("inductor", start)
        schema.fn = choose_executor(compiled, lifted.graph, args, options, report, grad)
        schema.executor = report.stats.get("executor", "inductor")
    else:
        report.stats["executor"] = schema.executor
        report.stats.setdefault("executors", {})["grad" if grad else "no_grad"] = schema.executor
    report.stats["schema_uses"] = schema.uses
    values, shared = lifted.values, schema.fn
    return (lambda *args: shared(*args, *values)), True
