"""The gathers of a vectorized graph: recognise them, read and rewrite their index.

Not a pass: the vocabulary that the gather passes (``compose_gathers``,
``simplify_gathers``, ``postpone_gathers``) share. A *gather* reads rows of
``base`` at a constant ``index`` (kept in a buffer of the graph module):

* ``gather_rows(base, csr)``: ``base[index]`` (float rows, deterministic backward);
* ``torch.index_select(base, 0, index)``: the same, for integer rows;
* ``gather_reduce(base, csr, rows, reduce)``: the rows ``base[index]``,
  reduced per CSR segment as they are read.

``csr`` packs the index with its transpose (see ``kernels/gather_reduce.py``);
:func:`set_source` repacks it whenever the base or the index changes, so a
rewrite only has to say which rows it reads.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from dynamo_relational.kernels.gather_reduce import pack_csr, unit_offsets, unpack_csr
from dynamo_relational.ops import TensorInfo, tensor_info

_GATHER_ROWS = torch.ops.dynamo_relational.gather_rows.default
_GATHER_REDUCE = torch.ops.dynamo_relational.gather_reduce.default
_names = itertools.count()


@dataclass
class Gather:
    node: fx.Node
    base: fx.Node
    index: torch.Tensor
    #: CSR offsets of the segments a gather_reduce reduces; None for row gathers
    offsets: torch.Tensor | None = None

    @property
    def reduces(self) -> bool:
        return self.offsets is not None


def as_gather(gm: fx.GraphModule, node) -> Gather | None:
    """The gather ``node`` is, or None (also when its index is not a constant or its base's rows are unknown)."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return None
    if node.target is torch.index_select:
        index = constant_value(gm, node.args[2]) if node.args[1] == 0 else None
        return None if index is None else Gather(node, node.args[0], index)
    if node.target not in (_GATHER_ROWS, _GATHER_REDUCE):
        return None
    csr, columns = constant_value(gm, node.args[1]), rows(node.args[0])
    if csr is None or columns is None:
        return None
    if node.target is _GATHER_ROWS:
        count = (csr.shape[0] - columns - 2) // 3
        return Gather(node, node.args[0], unpack_csr(csr, count, columns)[1])
    transpose = node.args[4] if len(node.args) > 4 else node.kwargs.get("transpose", False)
    if transpose:
        return None
    offsets, index = unpack_csr(csr, node.args[2], columns)
    return Gather(node, node.args[0], index, offsets)


def rows(node) -> int | None:
    """Number of rows of a vectorized value, if known."""
    info = tensor_info(node)
    return info.shape[0] if info is not None and info.rank > 0 else None


def names_rows(dim, x) -> bool:
    """Whether ``dim`` (negative ones counted from the rank) is dim 0, the rows, of ``x``'s value (``x``: a node,
    or the value's info)."""
    info = x if isinstance(x, TensorInfo) else tensor_info(x)
    return type(dim) is int and info is not None and info.rank > 0 and dim % info.rank == 0


def constant_value(gm: fx.GraphModule, node) -> torch.Tensor | None:
    """The tensor a get_attr node reads (its target may be a dotted path: ``conv1.weight``), else None."""
    if isinstance(node, fx.Node) and node.op == "get_attr":
        value = gm
        for name in node.target.split("."):
            value = getattr(value, name, None)
        return value if isinstance(value, torch.Tensor) else None
    return None


#: the prefix of the names of the constants the passes add (:func:`add_constant`)
CONSTANT_PREFIX = "_relational_"


def is_added_constant(node: Any) -> bool:
    """Whether ``node`` reads a constant a pass added (:func:`add_constant`), never a model's parameter or buffer."""
    return isinstance(node, fx.Node) and node.op == "get_attr" and str(node.target).startswith(CONSTANT_PREFIX)


def add_constant(gm: fx.GraphModule, tensor: torch.Tensor, hint: str) -> fx.Node:
    """A new buffer of ``gm`` and the get_attr node that reads it (inserted before the first compute node)."""
    name = f"{CONSTANT_PREFIX}{hint}_r{next(_names)}"
    while hasattr(gm, name):
        name = f"{CONSTANT_PREFIX}{hint}_r{next(_names)}"
    gm.register_buffer(name, tensor, persistent=False)
    first = next(n for n in gm.graph.nodes if n.op not in ("placeholder", "get_attr"))
    with gm.graph.inserting_before(first):
        return gm.graph.get_attr(name)


def set_source(gm: fx.GraphModule, gather: Gather, base: fx.Node, index: torch.Tensor) -> None:
    """Make ``gather.node`` read ``base[index]`` instead (same rows, same result)."""
    node, columns = gather.node, rows(base)
    if columns is None:
        raise ValueError(f"set_source: rows of {base.name} unknown")
    args = list(node.args)
    args[0] = base
    if node.target is torch.index_select:
        args[2] = add_constant(gm, index, "index")
    else:
        offsets = unit_offsets(index.shape[0], index.device) if gather.offsets is None else gather.offsets
        args[1] = add_constant(gm, pack_csr(offsets, index, columns), "csr")
    node.args = tuple(args)


def is_cat0(node) -> bool:
    """``torch.cat(blocks)`` along dim 0."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is torch.cat):
        return False
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    return dim == 0 and isinstance(node.args[0], (list, tuple))


def set_rows_info(node: fx.Node, like: fx.Node, count: int) -> None:
    """Record that ``node`` has ``count`` rows shaped like those of ``like``."""
    info = tensor_info(like)
    if info is not None:
        node.meta["rel_info"] = TensorInfo((count, *info.shape[1:]), info.dtype, info.device)
