"""Emit the grouped graph: one vectorized node per group.

Each group of ``k`` members becomes one node of shape ``[k, *member_shape]``
(made by the members' op family), and member ``r`` of it is row ``r``.
Operands are wired by :class:`GroupBuilder`: an operand that every member
shares is passed once; otherwise the members' operand rows are gathered
(``index_select`` over the source group, or over a ``cat`` of several).
Nodes that stay ungrouped are copied and read single rows (``group[r]``).
Groups smaller than ``min_group_size`` stay ungrouped too, except stacks and
sums over rows of groups (a readout) that one gather serves in fewer nodes
than reading their rows one by one (:func:`_small_group_form`).
Index tensors become buffers of the new GraphModule.

Legal because members of a group are pairwise independent and each family
computes exactly the members' values row by row. Saves all per-member nodes:
the graph shrinks from O(neurons) to O(groups) nodes.
"""
from __future__ import annotations

import operator
from typing import cast

import torch
import torch.fx as fx

from dynamo_relational.kernels.gather_reduce import pack_csr, unit_offsets
from dynamo_relational.kernels.segment import csr_offsets
from dynamo_relational.ops import REGISTRY, TensorInfo, tensor_info
from dynamo_relational.ops.elementwise import draws_random_numbers
from dynamo_relational.ops.facts import SAMPLE, is_factory

from .context import PassContext


#: a gather from several sources concatenates them only while that copies at most this many times the rows
#: it reads; beyond, it gathers the rows from each source first (:meth:`GroupBuilder._compact`)
MAX_CAT_GROWTH = 2


class GroupBuilder:
    """Writes the new graph; maps original nodes to new values or rows of groups."""

    def __init__(self, gm: fx.GraphModule, max_typed_groups: int = 8):
        self.gm = gm
        #: per-member weights with at most this many distinct values get one product per weight
        self.max_typed_groups = max_typed_groups
        self.graph = fx.Graph()
        self.env: dict[fx.Node, fx.Node] = {}          # original node -> its value in the new graph
        self.rows: dict[fx.Node, tuple[fx.Node, int]] = {}  # original member -> (group node, row)
        self.size: dict[fx.Node, int] = {}             # group (or source) node -> number of rows
        self._single: dict[fx.Node, fx.Node] = {}           # original node -> its value as one row
        self._value_of_single: dict[fx.Node, fx.Node] = {}  # that row -> the value
        self._gathers: dict[tuple, fx.Node] = {}
        self._cats: dict[tuple, fx.Node] = {}
        self._taken: dict[fx.Node, tuple[fx.Node, list[int]]] = {}  # gather -> (base, rows)
        self._constants: dict[tuple, fx.Node] = {}
        self.buffers = 0
        #: gathers from several sources whose concatenation would copy too much read each source's rows
        #: first (set for the group being emitted; see :func:`_small_group_form`)
        self.gather_by_source = False
        #: whether the group being emitted gathered an operand (a group of one that did not computes one value,
        #: not a row, and stays as it is)
        self.gathered = False

    # values --------------------------------------------------------------
    def value(self, node):
        """The new-graph value of original ``node`` (a row read if it was grouped)."""
        if not isinstance(node, fx.Node):
            return node
        new = self.env.get(node)
        if new is None:
            group, row = self.rows[node]
            new = self.env[node] = self.graph.call_function(operator.getitem, (group, row))
            if tensor_info(node) is not None:
                new.meta["rel_info"] = tensor_info(node)
        return new

    def slot(self, nodes: list) -> tuple[fx.Node | None, bool]:
        """One operand position over all members: (shared value, False) or (gathered rows, True). The one
        member of a group of one reads a row of a group as a row (its result is a group of one row)."""
        first = nodes[0]
        if all(n is first for n in nodes) and (len(nodes) > 1 or first not in self.rows):
            return self.value(first), False
        return self.gather(nodes), True

    def gather(self, nodes: list[fx.Node]) -> fx.Node:
        """A ``[len(nodes), *shape]`` tensor whose row ``i`` is the value of ``nodes[i]``."""
        self.gathered = True
        pairs = tuple(self._source(n) for n in nodes)
        cached = self._gathers.get(pairs)
        if cached is None:
            base, rows = self._base_rows(pairs)
            cached = self._gathers[pairs] = self.take(base, rows, tensor_info(nodes[0]))
        return cached

    def rows_of_sources(self, sources: list[fx.Node], rows: list[int], row: TensorInfo) -> fx.Node:
        """A tensor whose row ``i`` is row ``rows[i]`` of ``sources[i]`` (tensors of rows like ``row`` that are
        not grouped: the samples' own constants in a union), read from the rows of all of them, concatenated."""
        pairs = []
        for source, r in zip(sources, rows):
            value = self.value(source)
            self.size.setdefault(value, cast(TensorInfo, tensor_info(source)).shape[0])
            pairs.append((value, r))
        self.gathered = True
        base, taken = self._base_rows(tuple(pairs))
        return self.take(base, taken, row)

    def rows_of(self, nodes: list[fx.Node]) -> tuple[fx.Node, list[int]]:
        """``(base, rows)`` with ``base[rows[i]]`` the value of ``nodes[i]``, without emitting the gather
        (for kernels that gather while they compute)."""
        self.gathered = True
        base, rows = self._base_rows(tuple(self._source(n) for n in nodes))
        return self._untaken(base, rows)

    def _base_rows(self, pairs: tuple) -> tuple[fx.Node, list[int]]:
        sources = list(dict.fromkeys(src for src, _ in pairs))
        if len(sources) == 1:
            return sources[0], [r for _, r in pairs]
        if self.gather_by_source and sum(self.size[src] for src in sources) > MAX_CAT_GROWTH * len(pairs):
            return self._compact(pairs, sources)
        base = self._cat(tuple(sources))
        start, at = {}, 0
        for src in self._cat_order(sources):
            start[src], at = at, at + self.size[src]
        return base, [start[src] + r for src, r in pairs]

    def _compact(self, pairs: tuple, sources: list) -> tuple[fx.Node, list[int]]:
        """The rows that ``pairs`` read, each once, gathered source by source into one block: concatenating
        whole sources would copy far more rows than are read (one row of a large input beside a group)."""
        wanted = {src: list(dict.fromkeys(r for s, r in pairs if s is src)) for src in sources}
        blocks = [self.take(src, wanted[src], self.row_info(src)) for src in sources]
        block = self._cat(tuple(blocks))
        offset, at = {}, 0   # where each piece starts in the block (in _cat_order: single values first)
        for piece in self._cat_order(blocks):
            offset[piece], at = at, at + self.size[piece]
        position = {(src, r): offset[piece] + i for src, piece in zip(sources, blocks)
                    for i, r in enumerate(wanted[src])}
        return block, [position[pair] for pair in pairs]

    def row_info(self, source: fx.Node) -> TensorInfo:
        """What one row of ``source`` (a tensor of static shape) is like, for :meth:`take`."""
        info = tensor_info(source)
        return TensorInfo(info.shape[1:], info.dtype, info.device)

    def _untaken(self, base: fx.Node, rows: list[int]) -> tuple[fx.Node, list[int]]:
        """A gather of a gather reads the original rows directly."""
        if base in self._taken:
            base, inner = self._taken[base]
            rows = [inner[r] for r in rows]
        return base, rows

    def take(self, base: fx.Node, rows: list[int], row) -> fx.Node:
        """Rows ``rows`` of ``base``, whose rows are like ``row`` (a TensorInfo).

        Floating rows are read with ``gather_rows``: ``index_select`` with a
        deterministic backward (see kernels/gather_reduce.py)."""
        base, rows = self._untaken(base, rows)
        if rows == list(range(self.size[base])):
            return base
        index = torch.tensor(rows, dtype=torch.long, device=row.device)
        if row.dtype.is_floating_point:
            csr = pack_csr(unit_offsets(len(rows), row.device), index, self.size[base])
            result = self.graph.call_function(torch.ops.dynamo_relational.gather_rows.default,
                                              (base, self.constant(csr, "csr")))
        else:
            result = self.graph.call_function(torch.index_select, (base, 0, self.constant(index, "index")))
        self.size[result] = len(rows)
        self._taken[result] = (base, rows)
        result.meta["rel_info"] = TensorInfo((len(rows), *row.shape), row.dtype, row.device)
        return result

    def _source(self, node: fx.Node) -> tuple[fx.Node, int]:
        if node in self.rows:
            return self.rows[node]
        single = self._single.get(node)
        if single is None:
            single = self._single[node] = self.graph.call_method("unsqueeze", (self.value(node), 0))
            self._value_of_single[single] = self.value(node)
            self.size[single] = 1
            info = tensor_info(node)
            if info is not None:
                single.meta["rel_info"] = TensorInfo((1, *info.shape), info.dtype, info.device)
        return single, 0

    def _cat(self, sources: tuple) -> fx.Node:
        """All rows of ``sources`` in one tensor; single values are stacked in one node, not unsqueezed."""
        cat = self._cats.get(sources)
        if cat is None:
            ordered = self._cat_order(sources)
            singles = [s for s in ordered if s in self._value_of_single]
            blocks = ordered[len(singles):]
            if len(singles) > 1:
                values = [self._value_of_single[s] for s in singles]
                stacked = self.graph.call_function(torch.stack, (values,))
                info = tensor_info(singles[0])
                if info is not None:
                    stacked.meta["rel_info"] = TensorInfo((len(singles), *info.shape[1:]), info.dtype, info.device)
                blocks.insert(0, stacked)
            else:
                blocks = singles + blocks
            cat = blocks[0] if len(blocks) == 1 else self.graph.call_function(torch.cat, (blocks,))
            self.size[cat] = sum(self.size[s] for s in sources)
            self._cats[sources] = cat
            row = tensor_info(sources[0])
            if row is not None:
                cat.meta["rel_info"] = TensorInfo((self.size[cat], *row.shape[1:]), row.dtype, row.device)
        return cat

    def _cat_order(self, sources: list) -> list:
        """The order of ``sources``' rows inside ``_cat(sources)``: single values first."""
        return [s for s in sources if s in self._value_of_single] + \
            [s for s in sources if s not in self._value_of_single]

    def typed_rows(self, keys: list, make, row: TensorInfo) -> fx.Node | None:
        """Rows computed per distinct ``keys[i]`` (a weight, or weight and bias), in member order.

        ``make(key, members)`` emits the product of the members (indices) that
        share ``key``: one ``mm`` per weight instead of a copy of the weight per
        member and a batched product. The blocks are concatenated type by type
        and read back in member order by one gather (which ``compose_gathers``
        folds into the gather that reads this group). None when there are too
        many types (then the weights are gathered).
        """
        distinct = list(dict.fromkeys(keys))
        if not 1 < len(distinct) <= self.max_typed_groups:
            return None
        members = {key: [i for i, k in enumerate(keys) if k == key] for key in distinct}
        out = self.graph.call_function(torch.cat, ([make(key, members[key]) for key in distinct],))
        self.size[out] = len(keys)
        out.meta["rel_info"] = TensorInfo((len(keys), *row.shape), row.dtype, row.device)
        position = [0] * len(keys)
        for at, i in enumerate(i for key in distinct for i in members[key]):
            position[i] = at
        return self.take(out, position, row)

    def align(self, value: fx.Node, member, rank: int, k: int) -> fx.Node:
        """Reshape batched ``[k, *member.shape]`` so it broadcasts like the member did in a rank-``rank`` op."""
        if member.rank >= rank:
            return value
        return self.graph.call_method("reshape", (value, (k, *([1] * (rank - member.rank)), *member.shape)))

    # constants -----------------------------------------------------------
    def constant(self, tensor: torch.Tensor, hint: str) -> fx.Node:
        key = (hint, tensor.dtype, str(tensor.device), tuple(tensor.shape), tuple(tensor.flatten().tolist()))
        node = self._constants.get(key)
        if node is None:
            name = f"_relational_{hint}_{self.buffers}"
            self.buffers += 1
            self.gm.register_buffer(name, tensor, persistent=False)
            node = self._constants[key] = self.graph.get_attr(name)
        return node

    def index(self, values: list[int], device) -> fx.Node:
        return self.constant(torch.tensor(values, dtype=torch.long, device=device), "index")

    def csr(self, counts: list[int], device) -> fx.Node:
        return self.constant(csr_offsets(counts, device), "offsets")

    def gather_reduce(self, base: fx.Node, rows: list[int], counts: list[int], reduce: str, device) -> fx.Node:
        """``reduce`` over consecutive runs (of sizes ``counts``) of the rows ``rows`` of ``base``, fused."""
        index = torch.tensor(rows, dtype=torch.long, device=device)
        csr = pack_csr(csr_offsets(counts, device), index, self.size[base])
        node = self.graph.call_function(torch.ops.dynamo_relational.gather_reduce.default,
                                        (base, self.constant(csr, "csr"), len(counts), reduce))
        info = tensor_info(base)
        if info is not None:
            node.meta["rel_info"] = TensorInfo((len(counts), *info.shape[1:]), info.dtype, info.device)
        return node

    def copy(self, node: fx.Node) -> fx.Node:
        new = self.env[node] = self.graph.node_copy(node, self.value)
        return new


#: the meta key that marks a copied node which must stay even if nothing reads it (see :func:`_may_have_effects`)
MAY_HAVE_EFFECTS = "rel_may_have_effects"


def _may_have_effects(node: fx.Node) -> bool:
    """Whether ``node``, run alone, may do more than compute its value: a call outside the op catalog (other
    than a factory) may set state that other nodes depend on, as ``torch.func.grad``'s
    ``_set_tensor_requires_grad`` does, and a random op advances the generator, which later draws see.
    Such nodes stay even when nothing reads them (fx counts neither as impure)."""
    if draws_random_numbers(node):
        return True
    return node.op in ("call_function", "call_method", "call_module") and REGISTRY.family_of(node) is None \
        and not is_factory(node)


#: the meta key of a group node of such a union: the sample of each row
ROW_SAMPLES = "rel_row_samples"
#: the meta key of a union's output (the samples' results stacked): always one gather, never row reads
JOINED_OUTPUT = "rel_joined_output"


def _unique_members(ops):
    """Members with distinct (operands, consts); duplicates compute the same value, except dropouts in
    training (the ``group_dropout`` option), which draw a mask each. Members of different samples of a
    union stay apart: each row belongs to one sample."""
    if draws_random_numbers(ops[0].node):
        return ops, list(range(len(ops)))
    first: dict = {}
    unique, row_of = [], []
    for op in ops:
        key = (op.operands, op.consts, op.node.meta.get(SAMPLE))
        if key not in first:
            first[key] = len(unique)
            unique.append(op)
        row_of.append(first[key])
    return unique, row_of


def _small_group_form(members: list, b: GroupBuilder) -> str | None:
    """Whether a group too small to vectorize for its own sake, of stacks or aggregations over rows of
    groups (a readout over all neurons), still runs as one gather from those groups (``"gather"``, or
    ``"gather by source"``) rather than as copies reading each row (None).

    The gather reads its rows in place from one source. From several it first concatenates them where
    that copies at most twice the rows it reads, else it gathers the rows from each source first, a node
    or two per source: worth it for many rows (a readout that also reads one row of the input), not for
    a recurrent cell adding one input row per step (``h = tanh(W h + x[t])``), which would otherwise
    copy all of ``x``, or a row of it, on every step."""
    terms = [t for op in members for t in op.operands]
    if not members[0].variadic or not any(t in b.rows for t in terms):
        return None
    sources = {b.rows[t][0] if t in b.rows else t for t in terms}
    if len(sources) == 1 or sum(b.size.get(source, 1) for source in sources) <= MAX_CAT_GROWTH * len(terms):
        return "gather"
    return "gather by source" if len(terms) > 2 * len(sources) + 2 else None


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    b = GroupBuilder(gm, ctx.options.max_typed_groups)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            b.copy(node)
    min_size = ctx.options.min_group_size
    vectorized = 0
    for group in ctx.groups:
        ops = group.ops
        if ops is not None:
            unique, row_of = _unique_members(ops)
            form = "group" if len(unique) >= min_size else _small_group_form(unique, b)
            if form is None and JOINED_OUTPUT in unique[0].node.meta:
                form = "gather by source"
            if form is not None:
                b.gather_by_source, b.gathered = form == "gather by source", False
                new = unique[0].family.emit(unique, b)
                b.gather_by_source = False
                # (one member alone stays as it is, but in a union where it reads a whole value of rows, a
                # sample's only row ``u[0]`` of a one-row ``u``: a batch restricts rows read through a group)
                alone = SAMPLE in unique[0].node.meta and b.size.get(new) == 1
                if new is not None and (len(unique) > 1 or b.gathered or alone):
                    b.size[new] = len(unique)
                    info = unique[0].info
                    new.meta["rel_info"] = TensorInfo((len(unique), *info.shape), info.dtype, info.device)
                    if SAMPLE in unique[0].node.meta:
                        new.meta[ROW_SAMPLES] = [op.node.meta.get(SAMPLE) for op in unique]
                    for op, row in zip(ops, row_of):
                        b.rows[op.node] = (new, row)
                    vectorized += 1
                    continue
                for node in group.nodes:
                    ctx.leave_ungrouped(node, f"{ops[0].family.name} group of this layout is not vectorized")
        for node in group.nodes:
            new = b.copy(node)
            if ops is None and _may_have_effects(node):
                new.meta[MAY_HAVE_EFFECTS] = True
    for node in gm.graph.nodes:
        if node.op == "output":
            b.copy(node)
    ctx.stats["vectorized_groups"] = vectorized
    new_gm = fx.GraphModule(gm, b.graph, class_name=gm.__class__.__name__)
    return new_gm
