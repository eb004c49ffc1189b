"""Outputs share memory with the inputs and with each other as eager's do.

Grouping changes which tensors hold an output: CSE merges two equal outputs
(two equal stacks, ``torch.zeros(3)`` returned twice) into one tensor, a
vectorized value can be a view of an input (``torch.stack([x[i] for i in
range(n)])`` is ``x`` itself once its identity gather is a view), and a row
read ``x[0]`` returned as it is can become a row of a gathered copy. A caller
that writes into one output would then change another one, or the input, or
no longer the input. :func:`output_aliases` records, before the first pass
(``ctx.output_aliases``), what eager's outputs share; at the end of the
pipeline this pass

* computes each output that eager computes by views of inputs alone (``x[0]``,
  ``x.t()``) by those same views again;
* computes each other output that eager computes by views of another output
  (``h`` and ``h.view(-1)``, where grouping made the view a row of a group of
  reshapes) by those same views of that output's value, ``view`` replayed as
  ``reshape`` (the value's layout may differ from eager's; where ``reshape``
  must copy, the values are still right; where eager's ``reshape`` copied but
  ours can view, a write into the view would reach the output, unlike eager's);
* gives every other class of outputs that share memory with each other its own
  copy of each *root* it now shares with another class or with an input
  (a root: a computed tensor or an input whose memory a value may share,
  followed back through views, casts, ``detach``, in-place ops and
  ``getitem`` to the tensor they view, not to an index tensor), its outputs
  the same views of the copy as of the root.

Outputs that eager computes by views of one computed value that it does not
return (``h[0]`` and ``h.view(-1)`` of a stack ``h``) are views of another
output once that value is returned too: :func:`expose_bases` adds each such
*base* to the outputs before the first pass, so that the passes keep its value,
and this pass replays the views on it and drops it from the outputs again.

Legal because a clone has the root's value and gradient and the views are
recomputed exactly. Costs a copy per separated root; most graphs have one
fresh output and get none.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from dynamo_relational.ops import tensor_info
from dynamo_relational.ops.elementwise import draws_random_numbers
from dynamo_relational.ops.facts import aliased_operands, may_alias, writes

from .context import PassContext

@dataclass(frozen=True)
class OutputAliases:
    """What the outputs of a graph share memory with (:func:`output_aliases`)."""
    #: per output position: the inputs (placeholders and attributes, as ``(op, target)``) it may share memory with
    inputs: tuple[frozenset, ...]
    #: per output position: the number of its class, the outputs that may share memory with each other
    classes: tuple[int, ...]
    #: per output position: a graph computing it by views from inputs alone (``x[0]``, ``x.t()``), or None
    input_views: tuple[fx.Graph | None, ...]
    #: per output position: ``(q, graph)``, the graph computing it by views from output ``q``'s value, or None;
    #: ``q`` may be the position of a base, after the outputs
    output_views: tuple[tuple[int, fx.Graph] | None, ...]
    #: computed values that eager does not return but two or more outputs are views of (:func:`expose_bases`)
    bases: tuple[fx.Node, ...] = ()


def _roots(value, memo: dict) -> frozenset:
    """The nodes (computed tensors, placeholders, attributes) whose memory ``value`` may share. Iterative:
    a chain of views can be longer than Python's recursion limit."""
    if not isinstance(value, fx.Node):
        return frozenset()
    stack = [value]
    while stack:
        node = stack[-1]
        if node in memo:
            stack.pop()
        elif node.op in _INPUTS or not may_alias(node):
            memo[node] = frozenset({node})
        else:
            operands = aliased_operands(node)
            pending = [a for a in operands if a not in memo]
            if pending:
                stack.extend(pending)
            else:
                memo[node] = frozenset().union(*(memo[a] for a in operands))
    return memo[value]


_INPUTS = ("placeholder", "get_attr")


def _input_keys(roots: frozenset) -> frozenset:
    return frozenset((r.op, r.target) for r in roots if r.op in _INPUTS)


def _outputs(graph: fx.Graph) -> tuple[fx.Node, list]:
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    values = output.args[0]
    return output, list(values) if isinstance(values, (list, tuple)) else [values]


def _classes(roots: list[frozenset]) -> tuple[int, ...]:
    """Each position's class: positions whose roots meet, transitively, share a number."""
    owner: dict = {}   # root -> class
    parent = list(range(len(roots)))

    def find(p):
        while parent[p] != p:
            parent[p] = p = parent[parent[p]]
        return p

    for p, rs in enumerate(roots):
        for r in rs:
            q = owner.setdefault(r, p)
            parent[find(p)] = find(q)
    return tuple(find(p) for p in range(len(roots)))


def _view_chain(value: fx.Node) -> fx.Graph | None:
    """A graph computing ``value`` from inputs by the same views (``x[0]``, ``x[index]``), if only views
    lead there."""
    order, done, stack = [], set(), [(value, False)]   # the chain's nodes, inputs first (a post-order walk)
    reached = {}   # the inputs it reads, as a dict for a deterministic order
    while stack:
        node, expanded = stack.pop()
        if node.op in _INPUTS:
            reached[node] = None
            continue
        if node in done:
            continue
        if expanded:
            done.add(node)
            order.append(node)
            continue
        if node.op == "call_module" or writes(node) or not may_alias(node) or draws_random_numbers(node):
            return None
        stack.append((node, True))
        stack.extend((a, False) for a in node.all_input_nodes)
    graph, env = fx.Graph(), {}
    for root in reached:
        env[root] = graph.placeholder(f"{root.op}_{root.target}".replace(".", "_"))
        env[root].meta["input"] = (root.op, root.target)
    for node in order:
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(env[value])
    return graph


def _view_of_output(values: list, p: int, first: dict) -> tuple[int, fx.Graph] | None:
    """``(q, graph)``: ``values[p]`` is computed by views (one tensor operand each) from ``values[q]``, and
    ``graph`` computes it from a placeholder for that value; else None (``first``: an output's node -> its
    first position). ``values[q]`` is the nearest output on the way back that comes before ``p``: the run
    replays the outputs in order, so it is replayed already, and the views from it are eager's own (one
    farther back would also replay the views in between, and a ``reshape`` there may copy, as eager's did
    not for ``values[q]``). Else the farthest output on the way back, no view of another output, so
    replaying from it needs no other output replayed first."""
    chain, node, farthest, earlier = [], values[p], None, None
    while isinstance(node, fx.Node) and replayable_view(node):
        chain.append(node)
        node = node.args[0]
        q = first.get(node)
        if q is not None and q != p:
            farthest = q, len(chain)
            if q < p and earlier is None:
                earlier = farthest
    found = earlier or farthest
    if found is None:
        return None
    q, length = found
    graph = fx.Graph()
    env = {values[q]: graph.placeholder("output")}
    for view in reversed(chain[:length]):
        env[view] = graph.node_copy(view, env.__getitem__)
        if view.op == "call_method" and view.target in _RESHAPES and not any(
                isinstance(a, torch.dtype) for a in view.args):
            env[view].target = _RESHAPES[view.target]   # the value's layout may not allow a view
    graph.output(env[values[p]])
    return q, graph


def replayable_view(node: fx.Node, sizes_from_inputs: bool = False) -> bool:
    """A view of its first argument, the only node it reads (with ``sizes_from_inputs``, besides the graph's
    inputs: the symbolic sizes of a graph Dynamo traced), that running again changes nothing else (not an
    in-place op, not dropout in training, which would draw random numbers)."""
    if node.op not in ("call_function", "call_method") or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    others = [n for n in node.all_input_nodes if n is not node.args[0]]
    return may_alias(node) and not writes(node) and not draws_random_numbers(node) \
        and all(sizes_from_inputs and _is_size_input(n) for n in others)


def _is_size_input(node: fx.Node) -> bool:
    """An input of the graph that is a size (an int, or a symbolic one: Dynamo's fake value), not a tensor."""
    return node.op == "placeholder" and isinstance(node.meta.get("example_value", node.meta.get("val")),
                                                   (int, torch.SymInt))


def view_base(value, sizes_from_inputs: bool = False):
    """The tensor that ``value`` is computed from by :func:`replayable_view` views; ``value`` itself if none.
    A tuple is no base: ``torch.topk(h, 2)[0]`` is the values tensor itself, not a view of the tuple (a view
    reads the tensor past it: ``h.split(2)[0]`` is a view of ``h``)."""
    base = value
    while isinstance(value, fx.Node) and replayable_view(value, sizes_from_inputs):
        value = value.args[0]
        if _holds_tensor(value):
            base = value
    return base


def _holds_tensor(node: fx.Node) -> bool:
    """Whether ``node``'s value is one tensor (not a tuple of them, as ``torch.topk``'s): by Dynamo's fake value
    where it has one (its shape may be symbolic), else by the shape the passes keep (:func:`tensor_info`)."""
    value = node.meta.get("example_value", node.meta.get("val"))
    return isinstance(value, torch.Tensor) if value is not None else tensor_info(node) is not None


#: ``view`` replayed on a value whose layout may differ from eager's: ``reshape`` views where it can
_RESHAPES = {"view": "reshape", "view_as": "reshape_as"}


def output_aliases(graph: fx.Graph) -> OutputAliases:
    """What each output of ``graph`` may share memory with (see :class:`OutputAliases`)."""
    memo: dict = {}
    _, values = _outputs(graph)
    roots = [_roots(v, memo) for v in values]
    views = tuple(_view_chain(v) if rs and all(r.op in _INPUTS for r in rs) else None
                  for v, rs in zip(values, roots))
    first: dict = {}   # output node -> its first position
    for p, value in enumerate(values):
        if isinstance(value, fx.Node):
            first.setdefault(value, p)
    of_outputs = [_view_of_output(values, p, first) if views[p] is None else None for p in range(len(values))]
    of_outputs = _once_per_node(values, of_outputs, first)
    bases = _bases(values, [p for p, (v, o) in enumerate(zip(views, of_outputs)) if v is None and o is None], first)
    if bases:   # the outputs that are views of them are views of outputs once the bases are outputs too
        extended = values + bases
        first.update((base, len(values) + k) for k, base in enumerate(bases))
        of_outputs = _once_per_node(values, [link or (None if views[p] is not None else
                                                      _view_of_output(extended, p, first))
                                             for p, link in enumerate(of_outputs)], first)
    return OutputAliases(tuple(_input_keys(rs) for rs in roots), _classes(roots), views, tuple(of_outputs),
                         tuple(bases))


def _once_per_node(values: list, links: list, first: dict) -> list:
    """``links`` with each position of an output node returned more than once given its first position's link
    (one chain: ``run`` replays it once, so the positions stay one tensor, as in eager)."""
    return [links[first[v]] if isinstance(v, fx.Node) else link for v, link in zip(values, links)]


def _bases(values: list, positions: list[int], first: dict) -> list[fx.Node]:
    """The computed tensors, not outputs, that two or more distinct outputs at ``positions`` are views of."""
    viewed: dict = {}   # base -> how many distinct outputs are views of it
    for value in dict.fromkeys(values[p] for p in positions if isinstance(values[p], fx.Node)):
        node = view_base(value)
        if node is not value and node not in first and node.op not in _INPUTS and tensor_info(node) is not None:
            viewed[node] = viewed.get(node, 0) + 1
    return [base for base, count in viewed.items() if count > 1]


def expose_bases(gm: fx.GraphModule, aliases: OutputAliases) -> None:
    """Add ``aliases.bases`` to ``gm``'s outputs, after eager's, so that every pass keeps their values; ``run``
    (or :func:`hide_bases`) drops them again."""
    if aliases.bases:
        output, values = _outputs(gm.graph)
        _set_outputs(output, values + list(aliases.bases))
        gm.recompile()


def hide_bases(gm: fx.GraphModule, aliases: OutputAliases) -> None:
    """Undo :func:`expose_bases` where ``run`` did not (a pipeline that stopped early)."""
    output, values = _outputs(gm.graph)
    extra = len(values) - len(aliases.inputs)
    if aliases.bases and extra == len(aliases.bases):
        _set_outputs(output, values[:-extra])
        gm.recompile()


def _set_outputs(output: fx.Node, values: list) -> None:
    structure = output.args[0]
    output.args = (type(structure)(values) if isinstance(structure, (list, tuple)) else values[0],)


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    before = ctx.output_aliases
    graph = gm.graph
    output, values = _outputs(graph)
    if before is None or len(values) != len(before.inputs) + len(before.bases):
        return gm
    inputs = {(n.op, n.target): n for n in graph.nodes if n.op in _INPUTS}
    changed = cloned = 0
    # Outputs that are views of inputs in eager: the same views of the same inputs.
    for p, chain in enumerate(before.input_views):
        if chain is not None and all(n.meta["input"] in inputs for n in chain.nodes if n.op == "placeholder"):
            with graph.inserting_before(output):
                values[p] = graph.graph_copy(chain, {n: inputs[n.meta["input"]] for n in chain.nodes
                                                     if n.op == "placeholder"})
            changed += 1
    # Outputs that are views of another output in eager: the same views of that output's value (once for a
    # value returned twice, which stays one tensor).
    replayed: dict = {}   # chain -> its result: an eager output returned twice has one chain
    for p, link in enumerate(before.output_views):
        if link is not None:
            q, chain = link
            if chain not in replayed:
                with graph.inserting_before(output):
                    replayed[chain] = graph.graph_copy(chain, {next(iter(chain.nodes)): values[q]})
            values[p] = replayed[chain]
            changed += 1
    if before.bases:   # replayed on: no longer outputs
        del values[len(before.inputs):]
        changed += 1
    # Every other class of outputs gets its own copy of each root it shares with another class, or of an input
    # its eager outputs did not share memory with; its outputs become the views of that copy they were of the root.
    memo: dict = {}
    roots = [_roots(v, memo) for v in values]
    position = {node: i for i, node in enumerate(graph.nodes)}
    owner: dict = {}   # computed root -> the class that keeps it
    for c in dict.fromkeys(before.classes):
        members = [p for p, k in enumerate(before.classes) if k == c and before.input_views[p] is None]
        eager_inputs = frozenset().union(*(before.inputs[p] for p in members))
        for root in sorted(frozenset().union(*(roots[p] for p in members)), key=position.__getitem__):
            keeps = (root.op, root.target) in eager_inputs if root.op in _INPUTS else owner.setdefault(root, c) == c
            if keeps:
                continue
            # A tuple (torch.max(h, 0)) cannot be cloned: the outputs read from it are, one by one.
            sources = [root] if tensor_info(root) is not None else [values[p] for p in members if root in roots[p]]
            for source in sources:
                with graph.inserting_before(output):
                    copy = graph.call_method("clone", (source,))
                copy.meta = dict(source.meta)
                rebuilt = _rebuilt_over(graph, output, source, copy, memo)
                for p in members:
                    values[p] = rebuilt(values[p])
                cloned += 1
    if changed or cloned:
        _set_outputs(output, values)
        gm.recompile()
    if cloned:
        ctx.stats["outputs_cloned"] = cloned
    return gm


def _rebuilt_over(graph: fx.Graph, output: fx.Node, root: fx.Node, copy: fx.Node, memo: dict):
    """A function giving a value's node computed from ``copy`` where it was computed from ``root``: the views
    between are copied. An in-place op or module between is not run again: its result is copied instead."""
    done = {root: copy}

    def rebuilt(node):
        if not isinstance(node, fx.Node):
            return node
        new = done.get(node)
        if new is None:
            if root not in memo.get(node, ()):
                return node
            with graph.inserting_before(output):
                if node.op == "call_module" or writes(node):
                    new = graph.call_method("clone", (node,))
                    new.meta = dict(node.meta)
                else:
                    new = graph.node_copy(node, rebuilt)
            done[node] = new
        return new
    return rebuilt
