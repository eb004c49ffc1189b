"""Tensors made in ``forward`` from Python values alone (``out = torch.zeros(n, d)``): the tracer runs such
calls and keeps their tensors as constants of the graph. Eager makes them anew on every call, so a constant
that a recorded op or the caller may write into gets a fresh copy per call (:func:`copy_mutated_constants`),
and outputs sharing memory through two such constants (:func:`returned_constants_share_memory`), or a constant
written by an untraced call after a recorded op read it (:func:`changed_constant`), are detected to be traced
again with the factories recorded (:func:`dynamo_relational.tracing.trace`)."""
from __future__ import annotations

import torch
import torch.fx as fx

from dynamo_relational.ops.facts import is_forward_constant, may_alias, writes


def returned_constants_share_memory(graph: fx.Graph, attrs: dict[str, torch.Tensor], held: set[int]) -> bool:
    """Whether two outputs read (views of) two different constants of the graph that share memory, both
    made in ``forward`` (tensors the model holds, ``held`` by id, are left out: they are returned as themselves)."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    storages: dict[int, str] = {}   # storage address -> the constant read there first
    for leaf in output.all_input_nodes:
        name = _constant_name(_viewed_base(leaf))
        if name is None:
            continue
        tensor = attrs[name]
        if id(tensor) in held or tensor.untyped_storage().nbytes() == 0:
            continue
        if storages.setdefault(tensor.untyped_storage().data_ptr(), name) != name:
            return True
    return False


def copy_mutated_constants(graph: fx.Graph, attrs: dict[str, torch.Tensor], held: set[int]) -> None:
    """A tensor made in ``forward`` from Python values alone (``acc = torch.zeros(8)``,
    ``out = torch.zeros(n, d)``) is traced as a constant of the graph; an in-place op on it or on a view
    of it (``acc += t``, ``out[v] = h``, ``out[v].copy_(h)``) would change that constant for every
    later call, and so would the caller's write into an output that is (a view of) it (unless the model
    holds it as a plain attribute, ``held`` by id: eager returns the attribute itself). Eager makes a new
    tensor on every call, so every reader of such a constant reads one fresh copy of it, made where the
    constant is read first. Tracing ran the ops on the constant's
    traced value, so the value is reset to the constant's (the passes recognize a zero accumulator by it)."""
    written = [node.args[0] for node in graph.nodes
               if writes(node) and node.args and isinstance(node.args[0], fx.Node)]
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    mutated: dict[fx.Node, str] = {}
    for value, by_caller in [(v, False) for v in written] + [(v, True) for v in output.all_input_nodes]:
        base = _viewed_base(value)
        name = _constant_name(base)
        # The caller may write into an output, unless it is a tensor the model holds: eager returns that itself.
        if name is not None and not (by_caller and id(attrs[name]) in held):
            mutated[base] = name
    for constant, name in mutated.items():
        with graph.inserting_after(constant):
            fresh = graph.call_function(torch.clone, (constant,))
        constant.replace_all_uses_with(fresh, delete_user_cb=lambda user: user is not fresh)
        fresh.meta = dict(constant.meta)
        constant.meta["example_value"] = attrs[name].detach().clone()


def tensor_version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter (raised by each in-place change); None for an inference tensor, which has none
    (and cannot be changed in place outside inference mode)."""
    return None if tensor.is_inference() else tensor._version


def changed_constant(read: list[tuple[str, torch.Tensor, int | None]], held: set[int] | None = None) -> str | None:
    """The name of the first constant of ``read`` (name, tensor, its version when read) changed in place since,
    but for tensors the model holds (``held`` by id: the check of changes to the model refuses those)."""
    for name, tensor, version in read:
        if tensor_version(tensor) != version and not (held and id(tensor) in held):
            return name
    return None


def _constant_name(node: fx.Node) -> str | None:
    """The name of the constant ``node`` reads, if it is one the tracer made for a tensor built in ``forward``."""
    return str(node.target) if is_forward_constant(node) else None


def _viewed_base(node: fx.Node) -> fx.Node:
    """The node whose memory ``node`` may share: followed back through view ops to their first operand."""
    while may_alias(node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node
