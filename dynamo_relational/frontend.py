"""The fast front-end: ``dynamo_relational.compile(model, example_inputs, **options)``.

TorchDynamo costs about 1.2 ms per FX node, minutes for a scalar-granular
model of tens of thousands of neurons. This front-end traces the model with
a ``torch.fx`` tracer instead (about 80 us of CPU per node), runs the same
grouping passes and the same Inductor handoff as ``backend="relational"``
(:func:`dynamo_relational.backend.group_graph`) and returns a module that is
called like the model, for inference and for training (gradients reach the
model's own parameters).

Contract (what makes the fast trace exact):

* **Structure comes from Python data.** Loops, lists and ``if`` statements
  over Python values (neighbour lists, rules, trees) run once, at compile
  time; their result is frozen into the graph. Changing that data later does
  not change the compiled graph: compile again. Numpy scalars and arrays count as
  Python data (numbers and constant tensors), and so do tensors and scalars held
  in plain attributes; replacing or changing one of those traces again on the
  next call.
* **No data-dependent control flow on tensor values.** ``bool(t)``,
  ``if x[v] > 0``, ``int(t)``, ``t.item()``, ``t.tolist()`` and ops whose
  output shape depends on values (``nonzero``, boolean masks, ``unique``)
  raise :class:`FrontendError` naming the source line. Use ``torch.where``
  and friends, or ``torch.compile(model, backend="relational")``.
* **Gradient modes.** ``with torch.no_grad():`` blocks are recorded (as
  Dynamo records them) and become ``detach()`` in the grouped graph; the
  trace runs with gradients on, so one graph serves calls with and without
  them. Autocast is not recorded: a :class:`FrontendError`.
* **Custom autograd Functions keep their backward**: ``MyFunction.apply(h)``
  is recorded as one call (fx would trace its forward's ops instead).
* **Random ops draw new numbers on every call**, also without a traced
  argument (``torch.randn(4)``), where fx would freeze the numbers drawn
  while tracing into the graph: a trace that drew numbers outside the graph
  is redone recording such ops (:mod:`~dynamo_relational.untraced_calls`). Only
  the default generators are recorded (``generator=`` is an error).
* **Static shapes.** ``x.shape``, ``x.dim()``, ``len(x)``, ``x.dtype`` and
  ``x.device`` are the example inputs' values; the compiled module accepts
  only inputs of the example inputs' shapes, dtypes and devices.

Modules are traced through, not kept as leaves, so ``nn.Linear`` appears as
``F.linear`` and activations as ``torch.relu`` etc., which the grouping
catalog understands. Forward hooks and pre-hooks of modules run as in eager (registering or
removing one after compiling traces again); module backward hooks and global module hooks are a
:class:`FrontendError` (see :func:`~dynamo_relational.module_hooks.refuse_unrecorded_hooks`). Inside
``torch.func`` transforms the model runs eagerly.

This module holds :func:`compile` and the compiled module (:class:`RelationalModule`: which graph a call
runs, traced and compiled when the modules' state is new or stale). Tracing is
:func:`dynamo_relational.tracing.trace`, with the tracer in :mod:`dynamo_relational.tracer`.
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from dynamo_relational.forward_constants import changed_constant

from .backend import group_graph
from .errors import FrontendError
from .model_state import HeldAttributes
from .module_hooks import global_hooks, module_hooks
from .options import Options
from .progress import CompileProgress, compile_progress
from .report import GraphReport, Report
from .schemas import autocast_state, compile_grouped
from .tracer import gc_paused
from .tracing import trace

log = logging.getLogger("dynamo_relational")

__all__ = ["compile", "RelationalModule", "FrontendError"]


@dataclass(frozen=True)
class _InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    def describe(self) -> str:
        return f"shape {tuple(self.shape)}, {self.dtype}, on {self.device}"


@dataclass
class _Traced:
    """One grouped graph (per state of the modules: :meth:`RelationalModule._state`) and its compilations."""
    graph: fx.GraphModule
    report: GraphReport
    out_spec: pytree.TreeSpec
    #: output leaves that are not tensors (constants), by leaf position
    constants: dict[int, Any]
    #: what the modules held outside their parameters, buffers and submodules when traced: see :class:`HeldAttributes`
    attributes: HeldAttributes
    #: compiled callables by autograd need: ("grad", requires_grad flags of the inputs) or "no_grad"
    compiled: dict[Any, Callable] = field(default_factory=dict)
    #: keys of ``compiled`` whose code is shared across groundings (dynamic sizes)
    shared: set = field(default_factory=set)


class RelationalModule(nn.Module):
    """The result of :func:`compile`: call it like the model.

    ``model`` is the original module (its parameters are the ones trained),
    ``report`` a :class:`~dynamo_relational.Report` of the compilation (nodes
    before and after grouping, groups, timings; ``print(compiled.report)``),
    ``graph`` the grouped FX graph.
    """

    def __init__(self, model: nn.Module, example_inputs: Sequence[torch.Tensor], options: Options,
                 detailed: bool = False):
        super().__init__()
        self.model = model
        self.options = options
        self.detailed = detailed
        self._specs = _input_specs(model, example_inputs)
        self._example_inputs = [t.detach() for t in example_inputs]
        self._traced: dict[tuple, _Traced] = {}   # by _state()
        self._warned_torch_func = False
        grad = torch.is_grad_enabled()
        with torch.inference_mode(False), torch.set_grad_enabled(grad):   # (see forward)
            self._variant(list(example_inputs))   # trace, group and compile now

    @property
    def report(self) -> Report:
        """What the compilation did; ``compile_seconds`` is the sum of its timings."""
        traced = self._current()
        return Report([traced.report], compile_seconds=sum(traced.report.timings.values()), compiled=self)

    @property
    def graph(self) -> fx.GraphModule:
        """The grouped FX graph (``compiled.graph.print_readable()``)."""
        return self._current().graph

    def _current(self) -> _Traced:
        """The graph of the modules' current state (see :meth:`_state`); the latest one if that state was
        not run yet."""
        return self._traced.get(self._state()) or list(self._traced.values())[-1]

    def forward(self, *args: torch.Tensor, **kwargs: Any) -> Any:
        if kwargs:
            names = ", ".join(s.name for s in self._specs)
            raise FrontendError(f"compiled {type(self.model).__name__} takes its inputs positionally, as compiled: "
                                f"({names}); got keywords {sorted(kwargs)}")
        if torch.is_inference_mode_enabled():
            # AOT autograd's functions fail there ("Inference tensors cannot be saved for backward"), and the
            # constants of a graph traced there could not serve a later training call. Without gradients,
            # outside it, the compiled code computes the same values (this call checks the inputs).
            with torch.inference_mode(False), torch.no_grad():
                return self.forward(*args)
        self._check_inputs(args)
        if torch._C._functorch.peek_interpreter_stack() is not None:
            return self._run_eagerly_under_torch_func(args)
        traced, fn = self._variant(args)
        flat = list(fn(*args))
        for position, value in traced.constants.items():
            flat.insert(position, value)
        return pytree.tree_unflatten(flat, traced.out_spec)

    def _state(self) -> tuple:
        """What a traced graph depends on besides the inputs: each module's train/eval flag; the module
        hooks (by handle id, so registering or removing one changes it), which tracing ran; and the
        modules, parameters and buffers themselves (by identity), which the graph calls and reads
        (``m.weight = nn.Parameter(...)`` or ``load_state_dict(..., assign=True)`` replace them); and the
        autocast regions around the call (traced and compiled in them, the graph has their dtypes)."""
        modules = list(self.model.modules())
        hooks = [h for m in modules for h in module_hooks(m)] + list(global_hooks())
        ids = tuple(tuple(h) for h in hooks) if any(hooks) else None   # rarely any: tuples only then
        objects = [id(x) for m in modules for x in (m, *m._parameters.values(), *m._buffers.values())]
        return tuple([m.training for m in modules]), ids, tuple(objects), autocast_state()

    def _run_eagerly_under_torch_func(self, args: Sequence[torch.Tensor]) -> Any:
        """Inside ``torch.func.grad``, ``vmap``, ``jvp`` and the like, run the model itself. The compiled
        code cannot run there: its custom ops and AOT autograd's functions do not implement the
        transforms (``torch.func.grad`` fails with "must override the setup_context staticmethod").
        ``torch.compile(model, backend="relational")`` traces the transforms and compiles them."""
        if not self._warned_torch_func:
            self._warned_torch_func = True
            log.warning("relational: compiled %s called inside a torch.func transform; running the model eagerly "
                        "(torch.compile(model, backend=\"relational\") compiles such calls)", type(self.model).__name__)
        return self.model(*args)

    def _check_inputs(self, args: Sequence[Any]) -> None:
        if len(args) != len(self._specs):
            raise FrontendError(f"compiled {type(self.model).__name__} takes {len(self._specs)} tensor input(s) "
                                f"({', '.join(s.name for s in self._specs)}), got {len(args)}")
        for spec, arg in zip(self._specs, args):
            if not isinstance(arg, torch.Tensor):
                raise FrontendError(f"argument {spec.name!r} must be a tensor ({spec.describe()}), "
                                    f"got {type(arg).__name__}")
            if arg.shape != spec.shape or arg.dtype != spec.dtype or arg.device != spec.device:
                got = _InputSpec(spec.name, tuple(arg.shape), arg.dtype, arg.device)
                raise FrontendError(
                    f"argument {spec.name!r}: the graph was compiled for {spec.describe()}, got {got.describe()}. "
                    "The compiled graph is specialized to the example inputs; compile again for other shapes.")

    @staticmethod
    def _stale(traced: _Traced) -> bool:
        """Whether ``traced`` computes with values that changed since tracing (logged with the reason): a plain
        attribute replaced or changed in place, or a buffer that value_compression merged rows by."""
        changed = traced.attributes.changed()
        if changed is not None:
            log.warning("relational: %s was %s since the model was traced; tracing and compiling it again (a "
                        "value that changes between calls is better an input, or a buffer: the graph reads those on "
                        "every call)", *changed)
            return True
        if traced.report.constants_read:
            name = changed_constant(traced.report.constants_read)
            if name is not None:
                log.warning("relational: %s changed in place since the model was traced, and value_compression merged "
                            "rows by its values; tracing and compiling it again", name)
                return True
        return False

    def _variant(self, args: Sequence[torch.Tensor]) -> tuple[_Traced, Callable]:
        """The compiled graph for the modules' state (see :meth:`_state`) and the autograd need of this call."""
        state = self._state()
        traced = self._traced.get(state)
        if traced is not None and self._stale(traced):
            del self._traced[state]
            traced = None
        if traced is None:
            if self._traced:
                log.warning("relational: %s switched train/eval mode or autocast, or its module hooks, modules, "
                            "parameters or buffers changed; tracing and compiling it again", type(self.model).__name__)
                # graphs of modules, parameters or buffers the model no longer has would only keep them alive
                for stale in [key for key in self._traced if key[2] != state[2]]:
                    del self._traced[stale]
            with compile_progress(self.options.progress) as progress:
                traced = self._traced[state] = _trace_and_group(self.model, self._example_inputs,
                                                               [s.name for s in self._specs], self.options,
                                                               self.detailed, progress)
        if not self.options.inductor:
            return traced, traced.graph
        needs_grad = torch.is_grad_enabled() and (any(a.requires_grad for a in args) or any(
            p.requires_grad for p in traced.graph.parameters()))
        key = ("grad", tuple(a.requires_grad for a in args)) if needs_grad else "no_grad"
        fn = traced.compiled.get(key)
        if fn is None and key == "no_grad":
            # compile_fx's training graph also computes the outputs (shared Dynamo code would recompile); it
            # records its backward whatever the grad mode, so its results are detached, as no_grad's are
            training = next((f for k, f in traced.compiled.items() if k not in traced.shared), None)
            if training is not None:
                fn = traced.compiled[key] = _without_gradients(training)
        if fn is None:
            with CompileProgress(self.options.progress, 1) as progress:
                progress.start("inductor")
                fn, shared = compile_grouped(traced.graph, args, self.options, traced.report, grad=needs_grad)
            traced.compiled[key] = fn
            if shared:
                traced.shared.add(key)
        return traced, fn


def _without_gradients(fn: Callable) -> Callable:
    """``fn``, its results cut from the autograd graph it recorded (as a call under ``no_grad`` returns them:
    ``requires_grad`` false, so ``.numpy()`` works)."""
    def run(*args: torch.Tensor) -> list:
        return [out.detach() if isinstance(out, torch.Tensor) and out.grad_fn is not None else out
                for out in fn(*args)]
    return run


def _input_specs(model: nn.Module, example_inputs: Sequence[Any]) -> list[_InputSpec]:
    try:
        bound = inspect.signature(model.forward).bind(*example_inputs)
    except TypeError as e:
        raise FrontendError(f"example inputs do not fit {type(model).__name__}.forward: {e}") from None
    names = []
    for name, value in bound.arguments.items():
        if isinstance(value, tuple) and bound.signature.parameters[name].kind is inspect.Parameter.VAR_POSITIONAL:
            names += [f"{name}[{i}]" for i in range(len(value))]
        else:
            names.append(name)
    specs = []
    for name, t in zip(names, example_inputs):
        if not isinstance(t, torch.Tensor):
            raise FrontendError(f"example input {name!r} is a {type(t).__name__}; only tensors are supported "
                                "(keep Python structure such as neighbour lists on the module)")
        if t.layout != torch.strided:
            raise FrontendError(f"example input {name!r} is a {t.layout} tensor; compile takes dense tensors "
                                "(torch.compile(model, backend='relational') runs sparse ops outside its graphs)")
        specs.append(_InputSpec(name, tuple(t.shape), t.dtype, t.device))
    return specs


def _trace_and_group(model: nn.Module, inputs: Sequence[torch.Tensor], names: Sequence[str], options: Options,
                     detailed: bool, progress: CompileProgress) -> _Traced:
    traced = trace(model, inputs, names, progress)
    with gc_paused():
        gm, report = group_graph(traced.graph, options, detailed, progress)
    for node in gm.graph.nodes:   # the values were only needed for shapes; free them
        node.meta.pop("example_value", None)
    report.timings = {"trace": traced.seconds - traced.value_seconds, "values": traced.value_seconds,
                      **report.timings}
    # (after the trace: forward may set scalar attributes, say a cached size, which the graph does not change)
    return _Traced(gm, report, traced.out_spec, traced.constants, attributes=HeldAttributes(model))


def compile(model: nn.Module, example_inputs: Sequence[torch.Tensor] | torch.Tensor, *, detailed: bool = False,
            **options: Any) -> RelationalModule:
    """Trace ``model`` on ``example_inputs`` without TorchDynamo, group it and compile it with Inductor.

    ``example_inputs`` are the model's positional tensor inputs (a tuple, or
    one tensor). Keyword arguments are backend options
    (:class:`~dynamo_relational.Options`; ``inductor=False`` runs the grouped
    graph eagerly); ``detailed=True`` also fills the report's printed graphs
    and lower bound (slower). Returns a :class:`RelationalModule`: call it
    like the model, with inputs of the example inputs' shapes, dtypes and
    devices; train it through ``model.parameters()``. See the module
    docstring for the contract (structure from Python data, no control flow
    on tensor values, static shapes).
    """
    opts = Options.from_mapping(options)
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(model, nn.Module):
        raise FrontendError(f"compile expects an nn.Module, got {type(model).__name__}")
    return RelationalModule(model, tuple(example_inputs), opts, detailed)
