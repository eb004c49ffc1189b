"""Rows read and summed by a constant index tensor become reads and sums of single rows, in a sample of a union.

Per-graph code written with tensor ops reads the rows of its edges' sources
and sums them into their targets by index tensors: ``h[src]`` (or
``h.index_select(0, src)``) and ``z.index_add(0, dst, m)``. Where those
indices are a sample's structure (``dynamo_relational.batch`` reads them by
value: each trace holds them as constants), this pass writes the same reads
and sums as per-node code does::

    h[src]                   ->  torch.stack([h[src[0]], ..., h[src[E - 1]]])
    z.index_add(0, dst, m)   ->  torch.stack([z[r] + m[e_1] + ... + m[e_k]  for each row r])   (dst[e_j] == r)

and so are ``z.scatter_add(0, dst.view(-1, 1).expand_as(m), m)`` (PyTorch
Geometric's sum of messages) and the in-place forms of both into a new
tensor of zeros that nothing else reads (``m.new_zeros(n, d).scatter_add_(...)``),
whose rows without an index are zeros.

Their reads of single rows and their sums then group across the samples of
a union as per-node code does, whatever the samples' sizes: the graph's rows
and edges are no longer one tensor per sample.

Legal because both compute the same values: a read by index is the stack of
the rows read, and ``index_add`` adds each row of ``m`` into the row of ``z``
its index names (``alpha`` 1), as ``scatter_add`` does with an index that
repeats one index along each row. Only 1-d integer constants read along dim
0, with every index within the rows, are rewritten (and their ``[E, 1]``
columns expanded along the rows); only in a sample's trace
(``ctx.in_union``), where the union needs them per row; it runs before the
in-place rewrites, which keep the order of an in-place scatter.
"""
from __future__ import annotations

import operator
from typing import Any, cast

import torch
import torch.fx as fx

from dynamo_relational.nodes import meta_without_value, new_node
from dynamo_relational.ops import REGISTRY, TensorInfo, tensor_info
from dynamo_relational.ops.elementwise import ELEMENTWISE, draws_random_numbers
from dynamo_relational.ops.facts import calls, is_zeros, writes
from dynamo_relational.ops.aggregate import aggregate

from .context import PassContext
from .gather_nodes import add_constant, constant_value, names_rows
from .postpone_gathers import row_wise_in


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    if not ctx.in_union:
        return gm
    rewritten = 0
    graph = gm.graph
    # a value -> its stacked parts, True for row-wise ops of a stack, or None; (value, r) -> its row r made, where
    # no write lies between two reads (the in-place rewrites after this pass send reads after a write elsewhere)
    kinds: dict[Any, Any] = {"reuse rows": not any(writes(n) for n in graph.nodes)}
    for node in list(graph.nodes):
        read, added = _read_by_index(gm, node), _index_add(gm, node)
        if read is None and added is None:
            continue
        meta = meta_without_value(node)
        with graph.inserting_before(node):
            if read is not None:
                x, index = read
                rows = [_row(graph, meta, x, r, kinds) for r in index.tolist()]
            else:
                z, index, m = cast(tuple, added)
                info = cast(TensorInfo, tensor_info(z))
                zeros = _zeros(z, gm)   # (a row of a zeros tensor adds nothing: not read, not a read of ``like``)
                terms: list[list[fx.Node]] = [[] if zeros else [_row(graph, meta, z, r, kinds)]
                                              for r in range(info.shape[0])]
                for e, r in enumerate(index.tolist()):
                    terms[r].append(_row(graph, meta, m, e, kinds))
                row = TensorInfo(info.shape[1:], info.dtype, info.device)
                rows = []
                for row_terms in terms:
                    if row_terms:
                        rows.append(new_node(graph, "call_function", aggregate, (row_terms, "sum"), {}))
                        rows[-1].meta.update(meta, rel_info=row)
                    else:
                        rows.append(_zeros_row(gm, row, kinds))
            stacked = new_node(graph, "call_function", torch.stack, (rows,), {})
        stacked.meta.update(meta, rel_info=tensor_info(node))
        node.replace_all_uses_with(stacked)
        operands = node.all_input_nodes
        graph.erase_node(node)
        _erase_unread(graph, operands)
        rewritten += 1
    ctx.stats["constant_indices"] = rewritten
    return gm


def _zeros_row(gm: fx.GraphModule, row: TensorInfo, kinds: dict[Any, Any]) -> fx.Node:
    """A row of zeros like ``row``, the sum of no messages: a constant of the sample's trace, one for all such rows
    (in a union each sample's own, as its other rows are: a factory would be one value shared by the samples)."""
    key = ("zeros", row)
    if key not in kinds:
        kinds[key] = add_constant(gm, torch.zeros(row.shape, dtype=row.dtype, device=row.device), "zeros")
        kinds[key].meta["rel_info"] = row
    return kinds[key]


def _read_by_index(gm: fx.GraphModule, node: fx.Node) -> tuple[fx.Node, torch.Tensor] | None:
    """``(x, index)`` where ``node`` is ``x[index]``, ``x.index_select(0, index)`` or ``torch.index_select(x, 0,
    index)`` of a constant index tensor (:func:`_constant_index`) within ``x``'s rows."""
    args = node.args
    if node.op == "call_function" and node.target is operator.getitem and len(args) == 2 and not node.kwargs:
        x, index = args
    elif calls(node.op, node.target, "index_select") and len(args) == 3 and names_rows(args[1], args[0]) \
            and not node.kwargs:
        x, _, index = args
    else:
        return None
    value = _constant_index(gm, index, x)
    return None if value is None else (x, value)


def _index_add(gm: fx.GraphModule, node: fx.Node) -> tuple[fx.Node, torch.Tensor, fx.Node] | None:
    """``(z, index, m)`` where ``node`` is ``z.index_add(0, index, m)`` (or ``torch.index_add``, or
    ``scatter_add`` by an index column expanded along the rows of ``m``; or either in place into a new tensor of
    zeros that nothing else reads) of a constant index tensor within ``z``'s rows, one index per row of
    ``m``."""
    in_place = (node.op == "call_method" and node.target in ("index_add_", "scatter_add_"))
    if not (in_place or any(calls(node.op, node.target, name) for name in ("index_add", "scatter_add"))) \
            or len(node.args) != 4 or node.kwargs or not names_rows(node.args[1], node.args[0]):
        return None
    z, _, index, m = node.args
    # (in place: only into a tensor of zeros this call makes, never into a constant or buffer it holds)
    if in_place and not (isinstance(z, fx.Node) and _zeros(z) and list(z.users) == [node]):
        return None
    scatter = str(node.target).startswith("scatter") or node.target is torch.scatter_add
    value = _column(gm, index, m, z) if scatter else _constant_index(gm, index, z)
    m_info, z_info = tensor_info(m), tensor_info(z)
    if value is None or m_info is None or z_info is None or m_info.shape != (len(value), *z_info.shape[1:]) \
            or m_info.dtype != z_info.dtype:
        return None
    return z, value, m


def _constant_index(gm: fx.GraphModule, index: Any, x: Any, value: torch.Tensor | None = None
                    ) -> torch.Tensor | None:
    """The values of ``index``, a get_attr of a non-empty 1-d integer tensor (or its ``value``) whose values all
    name rows of ``x`` (negative ones counted from the end, as indexing does), as non-negative row numbers;
    else None."""
    info = tensor_info(x)
    if value is None:
        value = constant_value(gm, index)
    if value is None or info is None or info.rank == 0 or value.dim() != 1 or value.numel() == 0 \
            or value.dtype not in (torch.int64, torch.int32):
        return None
    rows = info.shape[0]
    if bool(((value < -rows) | (value >= rows)).any()):
        return None   # (eager raises: left as it is, to raise the same)
    return value.remainder(rows).cpu()


def _column(gm: fx.GraphModule, index: Any, m: Any, z: Any) -> torch.Tensor | None:
    """The values of a scatter's ``index`` that repeats one constant index along each row of ``m``
    (``dst.view(-1, 1).expand_as(m)``, or a 1-d ``dst`` for a 1-d ``m``), as :func:`_constant_index` gives
    them; else None."""
    m_info = tensor_info(m)
    if not isinstance(index, fx.Node) or m_info is None:
        return None
    if m_info.rank == 1:
        return _constant_index(gm, index, z)
    if index.op != "call_method" or index.target not in ("expand_as", "expand") or not index.args:
        return None
    column, info = index.args[0], tensor_info(index)
    column_info = tensor_info(column)
    if info is None or info.shape != m_info.shape or column_info is None \
            or column_info.shape != (m_info.shape[0],) + (1,) * (m_info.rank - 1):
        return None
    value = constant_value(gm, column)
    return None if value is None else _constant_index(gm, column, z, value.reshape(-1))


def _zeros(z: fx.Node, gm: fx.GraphModule | None = None) -> bool:
    """Whether ``z`` is a new tensor of zeros (``torch.zeros(n, d)``, ``torch.zeros_like(h)``,
    ``h.new_zeros(n, d)``; not one that requires gradients), or, in ``gm``, a constant of zeros the trace made of
    such a call."""
    if z.op == "get_attr":
        value = constant_value(gm, z) if gm is not None else None
        return value is not None and not bool(value.any())
    return is_zeros(z) and set(z.kwargs) <= {"dtype", "device", "layout"}


def _erase_unread(graph: fx.Graph, nodes: list[fx.Node]) -> None:
    """Erase what only the rewritten node read (its index constants and their expansions, its new zeros, the
    messages it summed, which its rows now compute), where nothing else reads it and it writes nothing."""
    erased: set[fx.Node] = set()
    pending = list(nodes)
    while pending:
        node = pending.pop()
        if node not in erased and not node.users and (node.op == "get_attr" or _zeros(node) or _pure_call(node)):
            pending += node.all_input_nodes
            graph.erase_node(node)
            erased.add(node)


def _pure_call(node: fx.Node) -> bool:
    """A call that writes nothing and draws nothing: an op of the catalog, or an expansion of an index."""
    if node.op not in ("call_function", "call_method") or writes(node) or draws_random_numbers(node):
        return False
    return (node.op == "call_method" and node.target in ("expand_as", "expand")) \
        or REGISTRY.knows(node.op, node.target)


def _row(graph: fx.Graph, meta: dict, x: fx.Node, r: int, kinds: dict[Any, Any]) -> fx.Node:
    """Row ``r`` of ``x``, made at the graph's insert point (``meta``: the rewritten node's source line) once
    for every reader: the stacked value itself where ``x`` is a stack, or row-wise ops of one (the messages
    ``h[src] @ W.t()`` of rows read by index) applied to its row ``r``; else a read of the row. ``kinds``
    caches what each value is, and the rows made."""
    if x not in kinds:
        kinds[x] = _stack_parts(x) or (_row_wise_of_stack(x, kinds) or None)
    kind = kinds[x]
    if type(kind) is list:
        return kind[r]
    if (x, r) in kinds:   # (the same row, read again: one node, as CSE would leave it)
        return kinds[x, r]
    info = cast(TensorInfo, tensor_info(x))
    if kind is None:
        row = new_node(graph, "call_function", operator.getitem, (x, r), {})
    else:   # (the op on the stack's row r; an operand that is the stack again, ``h + h``, read as that row too)
        first = cast(fx.Node, x.args[0])
        first_row = _row(graph, meta, first, r, kinds)
        args, kwargs = fx.node.map_arg((x.args, x.kwargs), lambda a: first_row if a is first else a)
        row = new_node(graph, x.op, x.target, args, dict(kwargs))
    row.meta.update(meta, rel_info=TensorInfo(info.shape[1:], info.dtype, info.device))
    if kinds["reuse rows"]:
        kinds[x, r] = row
    return row


def _stack_parts(x: fx.Node) -> list[fx.Node] | None:
    """The stacked values where ``x`` is ``torch.stack`` of them along dim 0."""
    if x.op != "call_function" or x.target is not torch.stack or len(x.args) != 1 or x.kwargs.get("dim", 0) != 0:
        return None
    parts = x.args[0]
    return list(parts) if isinstance(parts, (list, tuple)) and all(isinstance(p, fx.Node) for p in parts) else None


def _row_wise_of_stack(x: fx.Node, kinds: dict[Any, Any]) -> bool:
    """Whether ``x`` is a chain of row-wise ops of a stack: by shared weights (``linear``, ``@ W``), or
    elementwise with constants and with values that broadcast along the rows (a bias)."""
    first = x.args[0] if x.args else None
    info, out = (tensor_info(first), tensor_info(x)) if isinstance(first, fx.Node) else (None, None)
    if info is None or out is None or info.rank < 2 or out.rank != info.rank:
        return False
    row_wise = row_wise_in(x, first) or (
        REGISTRY.family_of(x) is ELEMENTWISE and not x.kwargs
        and all(a is first or (i := tensor_info(a)) is not None and i.rank < out.rank for a in x.all_input_nodes))
    if not row_wise:
        return False
    if first not in kinds:
        kinds[first] = _stack_parts(first) or (_row_wise_of_stack(first, kinds) or None)
    return kinds[first] is not None
