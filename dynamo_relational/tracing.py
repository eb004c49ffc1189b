"""Tracing a model into the ungrouped graph that the grouping passes take: :func:`trace` runs the
:class:`~dynamo_relational.tracer.Tracer`, traces again where calls without a traced argument must be
recorded (random ops, tensor factories: :mod:`~dynamo_relational.untraced_calls`), refuses what ``forward``
did to the model that a graph cannot repeat, and hands over the graph with its outputs flattened."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence, cast

import torch
import torch.fx as fx
from torch import nn
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.utils import _pytree as pytree

from .forward_constants import copy_mutated_constants, returned_constants_share_memory
from .errors import DataDependenceError, FrontendError, StoredTracedValue, UntracedCall
from .model_state import (HeldAttributes, ModuleAttributes, PlainObjects, assigned_traced_values, is_proxy,
                          module_attributes, take_out, traced_in)
from .module_hooks import refuse_unrecorded_hooks
from .ops import tensor_info
from .progress import NONE as NO_PROGRESS, CompileProgress
from .recorder import Recording
from .source_lines import recorded_line
from .tracer import Tracer, inputs_of, shown_name
from .untraced_calls import (drew_since, generator_states, library_random_states, set_generator_states,
                             set_library_random_states)

log = logging.getLogger("dynamo_relational")


@dataclass
class Trace:
    """An ungrouped graph recorded by :func:`trace`, flattened outputs and what the grouping needs of it."""
    graph: fx.GraphModule
    #: the structure of ``forward``'s result; the graph's output lists its tensor leaves
    out_spec: pytree.TreeSpec
    #: output leaves that are not tensors (constants), by leaf position
    constants: dict[int, Any]
    #: seconds spent tracing and computing the nodes' values
    seconds: float
    value_seconds: float
    #: traced ``live``: ``forward``'s result as the eager call computed it, gradients included, in a 1-tuple
    result: tuple | None = None
    #: whether ``forward`` read a tensor's ``requires_grad`` (recorded live: the graph holds for the gradient
    #: state of that call alone)
    reads_requires_grad: bool = False


def trace(model: nn.Module, inputs: Sequence[torch.Tensor], names: Sequence[str],
          progress: CompileProgress = NO_PROGRESS, live: bool = False,
          check: Callable[[fx.Graph], None] | None = None) -> Trace:
    """``model`` called on ``inputs`` (placeholders named ``names``), recorded as an ungrouped graph whose
    nodes carry their shapes (``meta["rel_info"]``); see :mod:`dynamo_relational.frontend` for the contract.
    ``live`` (with gradients on) records the call itself, as it runs (:func:`_recorded`): the trace also is the
    call, :attr:`Trace.result`. ``check(graph)`` may refuse the graph by raising: the trace then fails as one
    that raised, changing nothing."""
    start = time.perf_counter()
    refuse_unrecorded_hooks(model)
    names = [n.replace("[", "_").replace("]", "") for n in names]
    progress.start("tracing")
    generators, library_generators = generator_states(), library_random_states()
    attributes = HeldAttributes(model)
    objects = PlainObjects(model)
    before = module_attributes(model)
    live = live and torch.is_grad_enabled()   # (else the values would lack the gradients eager's have)
    # what a live trace may change in place (inputs, buffers), kept to put back if it fails
    # (all of them: ops such as batch_norm update buffers without counting a version)
    changeable = [(t, t.detach().clone()) for t in (*inputs, *model.buffers())] if live else []
    try:
        with torch.enable_grad():   # the graph serves calls with and without gradients: record no_grad blocks
            if live:
                tracer, result = _recorded(model, inputs, names, progress, attributes, objects, before, check)
            else:
                tracer, result = _traced(model, inputs, names, progress, generators, attributes), None
        _refuse_changes_to_the_model(model, attributes, objects, before)
        if check is not None:
            check(tracer.graph)
    except UntracedCall:   # (the call itself ran as eager's: its result, writes and draws stand)
        raise
    except BaseException:   # (a failed trace changes nothing: a batch may trace the sample again)
        _put_back(changeable)
        set_generator_states(generators)
        set_library_random_states(library_generators)
        raise
    progress.step()
    graph = tracer.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    leaves = list(output.args[0])
    tensors = [leaf for leaf in leaves if isinstance(leaf, fx.Node)]
    constants = {i: leaf for i, leaf in enumerate(leaves) if not isinstance(leaf, fx.Node)}
    output.args = (tuple(tensors),)   # a flat tuple: what compile_fx expects, unflattened on the way out
    copy_mutated_constants(graph, tracer.attrs, attributes.held_ids())
    for node in graph.nodes:   # the passes read shapes only: keep those and free the values early
        if node.op != "get_attr":   # (constants keep theirs: the passes compare them)
            tensor_info(node)
            node.meta.pop("example_value", None)
    # lazy: Python code for the ungrouped graph (tens of thousands of lines) is never needed
    gm = _LazyGraphModule({n.target: tracer.attrs[n.target] for n in graph.nodes if n.op == "get_attr"}, graph)
    out_spec = cast(pytree.TreeSpec, tracer.out_spec)   # set when forward returned
    return Trace(gm, out_spec, constants, time.perf_counter() - start, tracer.value_seconds, result,
                 isinstance(tracer, Recording) and tracer.read_requires_grad)


def _put_back(changeable: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for t, before in changeable:
            t.copy_(before)


def _recorded(model: nn.Module, inputs: Sequence[torch.Tensor], names: list[str], progress: CompileProgress,
              attributes: HeldAttributes, objects: PlainObjects, before: ModuleAttributes,
              check: Callable[[fx.Graph], None] | None = None) -> tuple[Recording | Tracer, tuple]:
    """The graph of ``model``'s call on ``inputs``, recorded while the call runs (:mod:`~dynamo_relational.
    recorder`), and the call's result in a 1-tuple. Where the recording gives up, the call has run as eager's
    and its result stands; the graph is then traced from copies of the tensors (nothing the call changed is
    changed again), and where that fails, :class:`UntracedCall` carries the result. A call that raises is
    traced from copies too, for the tracer's error naming the line."""
    def from_copies() -> Tracer:   # (the generators and attributes as the call left them)
        return _traced(model, inputs, names, progress, generator_states(), HeldAttributes(model))

    recording = Recording(model, inputs, names)
    try:
        recording.run(model, inputs, attributes, objects, before)
    except Exception:
        from_copies()
        raise
    if recording.read is not None:   # (the tracer refuses a read of a value too: say which inputs it reads)
        raise DataDependenceError(recorded_line(recording.read), cast(str, recording.unusable),
                                  inputs_of(recording.read))
    if recording.unusable is not None:
        log.debug("relational: recording %s gave up (%s); tracing from copies", type(model).__name__,
                  recording.unusable)
        if check is not None:   # (what it recorded, up to the op it gave up at, may be refused already)
            check(recording.graph)
    if recording.unusable is None:
        return recording, cast(tuple, recording.call_result)
    try:
        tracer = from_copies()
        if recording.stored_traced_value:   # (the tracer's refusal names the line)
            _refuse_changes_to_the_model(model, attributes, objects, before)
        return tracer, cast(tuple, recording.call_result)
    except DataDependenceError:
        raise
    except FrontendError as e:   # (library code may fail on proxies before the tracer finds what the call did)
        message = f"{e}\nWhile the call ran, its recording found: {recording.unusable}."
        if recording.stored_traced_value:   # (taken out of the model: the call does not stand as eager's)
            raise StoredTracedValue(message) from e
        raise UntracedCall(message, cast(tuple, recording.call_result)) from e


def _traced(model: nn.Module, inputs: Sequence[torch.Tensor], names: list[str], progress: CompileProgress,
            generators: list[torch.Tensor], attributes: HeldAttributes) -> Tracer:
    """The tracer that traced ``model``, once for most models. A call without a traced argument runs while
    tracing and its result becomes a constant of the graph; where that loses eager's behaviour, which only a
    trace shows, the model is traced again, recording such calls of one kind or both."""
    tracer = Tracer(model, inputs, names, progress)
    tracer.trace(model)
    # Tracing computes no random value from the generators (see Tracer._value): a draw means a random op ran
    # outside the graph (torch.randn(4)), frozen into it. Random ops are recorded on a second trace only: the
    # first trace is forward's first run, whose one-off draws (a random tensor it caches on the model) must
    # stay constants, as in eager (recorded, the cached value would be a traced one, refused); and recording
    # intercepts every torch call (3-12% more tracing time on the GCN and TreeLSTM examples).
    if drew_since(generators):
        log.info("relational: random numbers were drawn outside the traced graph; tracing again to "
                 "record the random ops that drew them")
        tracer = _traced_again(model, inputs, names, progress, generators, record_random_ops=True)
        if drew_since(generators):
            raise FrontendError(
                f"{shown_name(model)}.forward draws random numbers outside the traced graph through an op "
                "that is not known to be random; dynamo_relational.compile would freeze them. Use torch's "
                "random functions, or torch.compile(model, backend=\"relational\").")
    # Tensor factories are recorded on another trace only where a constant loses eager's behaviour: a traced
    # value written into a tensor made from Python values (out = torch.zeros(n, d); out[v] = h), whose later
    # reads ran on its untraced value; such a tensor written by an untraced call after a traced op read it
    # (a = h * t; t.add_(1)), which the graph would read written everywhere; or outputs sharing memory through
    # such tensors (z = torch.zeros(3); return z, z[1:]), traced as separate constants, so that the caller's
    # write into one would not reach the other. Elsewhere their constants are what the grouping needs (index
    # tensors) and what Python code may read (torch.arange(n).tolist()).
    held = attributes.held_ids()
    if tracer.wrote_untraced is not None:
        why = f"{tracer.wrote_untraced} writes a traced value into a tensor made without one"
    elif tracer.changed_constant(held) is not None:
        why = "a tensor made without a traced value is written in place after a traced op read it"
    elif returned_constants_share_memory(tracer.graph, tracer.attrs, held):
        why = "outputs made without a traced value share memory"
    else:
        return tracer
    log.info("relational: %s; tracing again to record the tensor factories", why)
    tracer = _traced_again(model, inputs, names, progress, generators, record_random_ops=tracer.record_random_ops,
                           record_factories=True)
    if tracer.wrote_untraced is not None:
        raise FrontendError(
            f"a traced value is written into a tensor the trace does not see at {tracer.wrote_untraced} "
            "(a plain tensor attribute, one made outside forward, or one made by a legacy constructor such "
            "as torch.Tensor(n, d) or torch.FloatTensor(n, d), which tracing cannot record): "
            "dynamo_relational.compile would keep one such tensor for every call. Make it in forward with a "
            "factory (x.new_zeros(...), torch.zeros(...)), register it as a buffer, or use "
            "torch.compile(model, backend=\"relational\").")
    changed = tracer.changed_constant(held)
    if changed is not None:
        t = tracer.attrs[changed]
        raise FrontendError(
            f"{shown_name(model)}.forward writes in place into a tensor made outside forward (a {t.dtype} "
            f"tensor of shape {tuple(t.shape)}, read at {_first_read(tracer.graph, changed)}) after a traced op "
            "read it: dynamo_relational.compile would read that tensor as the write left it, everywhere. Make it "
            "in forward with a factory, register it as a buffer, or use torch.compile(model, "
            "backend=\"relational\").")
    return tracer


def _first_read(graph: fx.Graph, constant: str) -> str:
    """Where the first recorded op that reads the constant named ``constant`` was called."""
    node = next(n for n in graph.nodes if n.op == "get_attr" and n.target == constant)
    return recorded_line(next(iter(node.users)))


def _traced_again(model: nn.Module, inputs: Sequence[torch.Tensor], names: list[str], progress: CompileProgress,
                  generators: list[torch.Tensor], **recording: bool) -> Tracer:
    set_generator_states(generators)   # as before the first trace
    tracer = Tracer(model, inputs, names, progress, **recording)
    tracer.trace(model)
    return tracer


def _refuse_changes_to_the_model(model: nn.Module, attributes: HeldAttributes, objects: PlainObjects,
                                 before: ModuleAttributes) -> None:
    """``forward`` storing a traced value in the model, or changing a tensor it holds, is refused (and undone):
    the trace would make the change once, at compile time, not on every call. ``before``: the modules'
    attributes before the call, to find also a list that ``forward`` assigns and then fills
    (``self.outputs = []; self.outputs.append(h)``)."""
    in_lists = ("not values kept in the model's lists and dicts (this one would be stored once, while tracing, and "
                "not as a tensor). Collect such values in a local list or dict and return them, or use "
                "torch.compile(model, backend=\"relational\").")
    assigned = assigned_traced_values(before)
    if assigned:
        module, name, _ = assigned[0]
        found = traced_in(vars(module)[name], is_proxy)
        take_out(assigned)
        raise FrontendError(
            f"{shown_name(model)}.forward stores a traced value in {type(module).__name__}.{name} (the value "
            f"computed at {recorded_line(found.node)}): dynamo_relational.compile records tensor ops, {in_lists}")
    for holder, why in (
            (attributes, in_lists),
            (objects, "and would leave that attribute holding a value of the trace, not of any call. Keep such state "
                      "in local variables (a dict from node to state) or return it, or use torch.compile(model, "
                      "backend=\"relational\"), which replays attribute writes.")):
        stored = holder.stored_proxy()
        if stored is not None:
            holder.restore()
            raise FrontendError(
                f"{shown_name(model)}.forward stores a traced value in {stored[0]} (the value computed at "
                f"{recorded_line(stored[1].node)}): dynamo_relational.compile records tensor ops, {why}")
    changed = attributes.changed(scalars=False)
    if changed is not None:
        attributes.restore()
        raise FrontendError(
            f"{shown_name(model)}.forward changes {changed[0]} ({changed[1]} while tracing): dynamo_relational."
            "compile would make that change once, at compile time, not on every call. Register the tensor as a "
            "buffer and update it in place, or use torch.compile(model, backend=\"relational\").")
