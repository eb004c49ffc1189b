"""Mode regions inside ``forward``: ``with torch.no_grad():`` becomes detached values.

Dynamo records a ``with`` block that switches a global mode as calls around the block's ops
(``torch._C._set_grad_enabled(False)`` ... ``(True)``, ``_enter_autocast`` ... ``_exit_autocast``);
the fast front-end records grad-mode switches the same way. Grouping moves nodes: it would merge
ops from inside and outside a region into one vectorized op, or move them out of their region.

* Gradient switches in a graph that starts with gradients on (the first switch turns them off:
  Dynamo and the fast front-end record a switch only where the mode changes): the switches are
  removed, and each value computed with gradients off is read through ``detach()`` by every node
  computed with them on (and by the output). Legal because ops compute the same values either way,
  and a detached value passes on no gradient, as one computed under ``no_grad``; the region's own
  values reach the rest of the graph only through detached ones. The ``detach`` nodes are
  vectorized like the other elementwise ops.
* Anything else (a graph that starts without gradients and turns them on, autocast, inference mode,
  other mode switches, or in-place ops left in the graph): the graph keeps its original order
  (``ctx.keep_order``, with the reason), so every node runs in its region.

What it saves: a graph with ``no_grad`` blocks is grouped, where keeping it correct would otherwise
mean running it node by node.
"""
from __future__ import annotations

import importlib
import operator

import torch
import torch.fx as fx

from dynamo_relational.ops import tensor_info

from .context import PassContext

_SET_GRAD_ENABLED = torch._C._set_grad_enabled


def _resolve(names: tuple[str, ...]) -> dict:
    """The functions of these dotted names that this torch has, in order (a dict as an ordered set)."""
    found = {}
    for name in names:
        module, _, attribute = name.rpartition(".")
        try:
            found[getattr(importlib.import_module(module), attribute)] = None
        except (ImportError, AttributeError):   # not in this version of torch
            pass
    return found


#: calls with which Dynamo records ``with`` blocks of modes that change values or gradients, other
#: than grad mode (fx does not count them all as side-effectful: inference mode's exit, for one)
_MODE_SWITCHES = _resolve((
    "torch.amp._enter_autocast", "torch.amp._exit_autocast",
    "torch.autograd.grad_mode._enter_inference_mode", "torch.autograd.grad_mode._exit_inference_mode",
    "torch._C._set_fwd_grad_enabled",
    "torch._C._autograd._saved_tensors_hooks_disable", "torch._C._autograd._saved_tensors_hooks_enable",
    "torch._C._functorch._grad_increment_nesting", "torch._C._functorch._grad_decrement_nesting",
    "torch._C._functorch.push_dynamic_layer_stack", "torch._C._functorch.pop_dynamic_layer_stack",
    "torch._C._functorch.set_inplace_requires_grad_allowed",
    "torch._functorch.predispatch._enter_dual_level", "torch._functorch.predispatch._exit_dual_level",
    "torch._functorch.predispatch._jvp_increment_nesting", "torch._functorch.predispatch._jvp_decrement_nesting",
    "torch._functorch.predispatch._vmap_increment_nesting", "torch._functorch.predispatch._vmap_decrement_nesting",
))


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    graph = gm.graph
    other = _other_mode_switch(graph)
    if other is not None:
        ctx.keep_order.append(f"mode switch {getattr(other.target, '__name__', other.target)} at {other.name}")
    switches = graph.find_nodes(op="call_function", target=_SET_GRAD_ENABLED)
    if not switches or ctx.keep_order:
        return gm   # nothing to do, or the switches stay and run in order
    reason = _unsupported(switches)
    if reason is None and not _detach_region_outputs(graph):
        reason = "a value computed without gradients that is not a tensor is read with gradients on"
    if reason is not None:
        ctx.keep_order.append(reason)
        return gm
    for switch in switches:
        graph.erase_node(switch)
    ctx.stats["grad_mode_switches"] = len(switches)
    return gm


def _unsupported(switches: list[fx.Node]) -> str | None:
    for switch in switches:
        if len(switch.args) != 1 or switch.kwargs or type(switch.args[0]) is not bool:
            return f"grad mode switch {switch.name} with a computed argument"
    if switches[0].args[0]:
        return f"grad mode switched on ({switches[0].name}) in a graph that starts without gradients"
    return None


def is_mode_switch(node: fx.Node) -> bool:
    """Whether ``node`` switches a mode (grad mode included): it must stay, and stay in its place."""
    if node.op != "call_function":
        return False
    try:
        return node.target is _SET_GRAD_ENABLED or node.target in _MODE_SWITCHES
    except TypeError:   # an unhashable target
        return False


def _other_mode_switch(graph: fx.Graph) -> fx.Node | None:
    """A call that switches a mode other than grad mode (autocast, inference mode, ...), if any: found
    through the graph's index of nodes by target, without a walk over all nodes."""
    for target in _MODE_SWITCHES:
        found = graph.find_nodes(op="call_function", target=target, sort=False)
        if found:
            return found[0]
    return None


def _detach_region_outputs(graph: fx.Graph) -> bool:
    """Read each value computed with gradients off through a ``detach`` where gradients are on.
    False (the graph partly rewritten, which changes no value) where such a value is not a tensor."""
    no_grad: set[fx.Node] = set()
    detached: dict[fx.Node, fx.Node] = {}
    enabled = True
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is _SET_GRAD_ENABLED:
            enabled = node.args[0]
            continue
        if node.op == "placeholder" or node.op == "get_attr":
            continue
        if not enabled and node.op != "output":
            no_grad.add(node)
            continue
        for value in node.all_input_nodes:
            if value not in no_grad:
                continue
            if tensor_info(value) is None:
                if node.target is not operator.getitem:
                    return False
                no_grad.add(node)   # an item of a tuple computed without gradients: detached where read
                break
            detach = detached.get(value)
            if detach is None:
                with graph.inserting_after(value):
                    detach = detached[value] = graph.call_method("detach", (value,))
                detach.meta["rel_info"] = tensor_info(value)
                if "stack_trace" in value.meta:
                    detach.meta["stack_trace"] = value.meta["stack_trace"]
            node.replace_input_with(value, detach)
    return True
