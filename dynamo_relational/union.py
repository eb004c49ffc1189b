"""The union of traced samples: one ungrouped graph of disjoint components.

``dynamo_relational.batch`` traces a model written for one sample once per
sample structure. Each trace first runs the passes that need the sample
alone (:data:`SAMPLE_PASSES`: in-place rewrites, aggregation, CSE), then
:func:`build` copies the traces (kept as compact records, not fx nodes)
into one graph, whose grouping (:data:`UNION_PASSES`) vectorizes all samples
at once:

* the tensor arguments at one position become one input (``torch.cat`` of the
  samples' tensors along dim 0, or ``torch.stack`` of 0-d ones and of ones of
  one shape that a sample reads as a whole); a sample's row read ``x[v]``
  becomes a read of its row in that input, so the reads of every sample group
  into one gather, and a stacked argument is a row of its input; a row-wise
  op of a sample's rows is its rows of that op over the joined input, and a
  reduction over them (``h.sum(0)``) the aggregation of its rows; samples that
  take different numbers of tensor arguments (a tensor per tree node) have
  them packed by kind (shape, dtype, device) first, each a row of its kind's
  input (:func:`_packed`);
* every node is tagged with its sample (``meta["rel_sample"]``), which the
  vectorizer keeps per row (``meta["rel_row_samples"]``): no row is shared by
  two samples, so a group restricted to some samples' rows computes exactly
  those samples (:mod:`dynamo_relational.row_plan`);
* the output leaves at one position are stacked (equal shapes) or
  concatenated (rows) over the samples: one output tensor per position, whose
  rows belong to the samples in order; results of other structures (a list of
  every node's state) are packed by kind first (:func:`_packed_results`).

Samples are disjoint components of the union: no node of one reads a node of
another, so grouping the union computes each sample as its own graph would.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Hashable, Sequence, cast

import numpy
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.utils import _pytree as pytree

from dynamo_relational.passes import PIPELINE, Pass, PassContext
from dynamo_relational.passes.cse import value_key
from dynamo_relational.passes.gather_nodes import CONSTANT_PREFIX, names_rows
from dynamo_relational.passes.postpone_gathers import row_wise_in
from dynamo_relational.kernels.gather_reduce import GATHER_REDUCTIONS, pack_csr
from dynamo_relational.kernels.segment import csr_offsets
from dynamo_relational.passes.vectorize import JOINED_OUTPUT, ROW_SAMPLES, SAMPLE

from .backend import run_pass
from .collation import (ProgramRows, Slot as _Slot, collate, index_readers, own_constant, program_key,
                        reads_by_constants, record_info, record_slots, trial_key)
from .nodes import new_node
from .ops import REGISTRY, TensorInfo, tensor_info
from .ops.aggregate import REDUCTIONS, aggregate
from .ops.along import GATHER_ALONG
from .ops.cells import CELL
from .ops.elementwise import ELEMENTWISE
from .ops.losses import LOSS, loss_call
from .ops.facts import is_factory, is_forward_constant
from .ops.matmul import product_operands
from .options import Options
from .progress import NONE as NO_PROGRESS, CompileProgress
from .row_plan import elementwise_mixing, flat_nodes, works_within_rows

_GATHER_REDUCE = torch.ops.dynamo_relational.gather_reduce.default
_SEGMENT_REDUCE = torch.ops.dynamo_relational.segment_reduce.default

#: the passes that rewrite one sample's trace on its own, before the union (no grouping yet)
SAMPLE_PASSES = tuple(PIPELINE[:[p.name for p in PIPELINE].index("grouping")])
#: the passes run on the union: grouping, and the rewrites legal for every batch of its samples
#: (``Pass.on_unions``)
UNION_PASSES = tuple(p for p in PIPELINE if p.on_unions)


def run_passes(steps: Sequence[Pass], gm: fx.GraphModule, ctx: PassContext,
               progress: CompileProgress = NO_PROGRESS) -> fx.GraphModule:
    """``gm`` rewritten by ``steps``, but those ``options.disable`` names (a failing optimizer pass is skipped,
    as in compiled graphs: :func:`~dynamo_relational.backend.run_pass`); ``progress`` names each and counts it
    done."""
    for step in steps:
        if step.name not in ctx.options.disable:
            progress.start(step.name)
            gm = run_pass(step, gm, ctx)
            progress.step()
    return gm


class NotBatchable(Exception):
    """Why a set of samples cannot run as one union (the batch runs its samples one by one instead)."""


_NO_KWARGS: dict[str, Any] = fx.immutable_collections.immutable_dict()


@dataclass
class SampleGraph:
    """One sample structure's trace, after :data:`SAMPLE_PASSES`, kept compact: a batched module keeps every
    structure it traced, and an ``fx.Node`` with its tables costs several times a tuple of its fields.
    :func:`build` copies the records into the union's graph."""
    #: per node: (op, target, args, kwargs, name, meta items), each node argument the :class:`_Slot` of its record
    records: tuple[tuple, ...]
    #: the values of its ``get_attr`` targets
    attrs: dict[str, Any]
    out_spec: pytree.TreeSpec
    #: output leaves that are not tensors, by leaf position
    constants: dict[int, Any]
    #: its tensor arguments' shapes, dtypes and devices, in order
    inputs: tuple[TensorInfo, ...]
    #: the shapes of its tensor output leaves, in order
    output_shapes: tuple[tuple[int, ...], ...]
    #: per tensor argument: whether it is read as a whole (a target vector), not only row by row (``x[v]``)
    read_whole: tuple[bool, ...]
    #: per tensor argument: whether it is read at all (a model may ignore one: the edges beside an MLP's features)
    read: tuple[bool, ...]
    #: the records that run once for all samples of its program, on their rows joined
    #: (:mod:`~dynamo_relational.collation`), and that program; none for most traces
    collated: frozenset[int] = frozenset()
    program: Hashable | None = None


def prepare(graph: fx.GraphModule, out_spec: pytree.TreeSpec, constants: dict[int, Any],
            options: Options, collations: dict[Hashable, tuple | None] | None = None) -> SampleGraph:
    """A sample's trace after :data:`SAMPLE_PASSES`; :class:`NotBatchable` if they must keep its order.

    Where the trace reads rows by its own index constants and every such read collates
    (:mod:`~dynamo_relational.collation`), ``constant_indices`` is left out: its per-edge and per-node nodes
    are what collation does without. Where one does not, all the passes run on the trace as it came.
    ``collations`` keeps which records collate (with the program and the arguments read whole, which follow)
    by :func:`~dynamo_relational.collation.trial_key`, for the traces of other samples with that key (most of a
    data set's samples)."""
    if reads_by_constants(graph.graph):
        raw = _records(graph.graph)   # (the trace as it came: for all the passes, where collation does not do)
        compact = _compact(graph, out_spec, constants, options, collations)
        if compact is not None:
            return compact
        graph = _graph_module(raw, graph)
    ctx = PassContext(options, in_union=True)
    graph = run_passes(SAMPLE_PASSES, graph, ctx)
    if ctx.keep_order:
        raise NotBatchable(f"the sample's graph keeps its order: {ctx.keep_order[0]}")
    sample = _sample_graph(graph, out_spec, constants)
    _unlink(graph.graph)
    return sample


def _compact(graph: fx.GraphModule, out_spec: pytree.TreeSpec, constants: dict[int, Any], options: Options,
             collations: dict[Hashable, tuple | None] | None) -> SampleGraph | None:
    """The sample's trace after :data:`SAMPLE_PASSES` but ``constant_indices``, if it collates; else None."""
    ctx = PassContext(options, in_union=True)
    graph = run_passes([p for p in SAMPLE_PASSES if p.name != "constant_indices"], graph, ctx)
    if ctx.keep_order:
        return None
    for node in graph.graph.nodes:   # (collation reads every record's shape)
        tensor_info(node)
    sample = _sample_graph(graph, out_spec, constants)
    _unlink(graph.graph)
    key = trial_key(sample) if collations is not None else None
    if collations is not None and key in collations:
        found = collations[key]
    else:
        collated = _collates(sample)
        found = None if collated is None else \
            (collated, program_key(sample, collated),
             _argument_reads(sample.records, collated | _unneeded(sample.records, collated))[1])
        if collations is not None:
            if len(collations) >= _COLLATIONS_KEPT:
                collations.clear()
            collations[key] = found
    if found is None:
        return None
    sample.collated, sample.program, sample.read_whole = found
    return sample


def _graph_module(records: Sequence[tuple], root: fx.GraphModule) -> fx.GraphModule:
    """A graph module of ``records`` (as :func:`_records` made them) over ``root``'s attributes."""
    graph = fx.Graph()
    nodes: list[fx.Node] = []
    for op, target, args, kwargs, name, meta in records:
        args, kwargs = fx.node.map_aggregate((args, kwargs), lambda a: nodes[a] if type(a) is _Slot else a)
        node = graph.output(args[0]) if op == "output" else new_node(graph, op, target, args, dict(kwargs), name)
        node.meta.update(meta)
        nodes.append(node)
    return _LazyGraphModule(root, graph)


#: how many outcomes of :func:`_collates` a batched module keeps
_COLLATIONS_KEPT = 4096


def _sample_graph(graph: fx.GraphModule, out_spec: pytree.TreeSpec, constants: dict[int, Any]) -> SampleGraph:
    attrs = {str(n.target): _attribute(graph, str(n.target)) for n in graph.graph.find_nodes(op="get_attr")}
    output = next(n for n in reversed(graph.graph.nodes) if n.op == "output")
    for kind, nodes in (("tensor argument", graph.graph.find_nodes(op="placeholder")), ("result", output.args[0])):
        for j, node in enumerate(nodes):
            if tensor_info(node) is None:   # (the union joins dense tensors of static shapes)
                raise NotBatchable(f"{kind} {j} is not a dense tensor of static shape (a sparse one runs with the "
                                   "model)")
    inputs = tuple(_tensor_info(n) for n in graph.graph.find_nodes(op="placeholder"))
    shapes = tuple(_tensor_info(leaf).shape for leaf in output.args[0])
    records = _records(graph.graph)
    read, read_whole = _argument_reads(records)
    return SampleGraph(records, attrs, out_spec, constants, inputs, shapes, read_whole, read)


def _collates(sample: SampleGraph) -> frozenset[int] | None:
    """The records of ``sample`` that collate, if every read and sum by its own index constants does and no other
    record reads what they make otherwise than a union reads a sample's rows (a reduction over them, a row, a
    loss of them); else None. Built as a union of this sample alone would be: its program's union collates the
    same records."""
    graph = fx.Graph()
    shared = _Shared({t: v for t, v in sample.attrs.items() if not own_constant(t)})
    inputs, layouts = [], []
    for j, info in enumerate(sample.inputs):
        layouts.append("cat" if info.shape else "stack")
        inputs.append(graph.placeholder(f"input{j}"))
        inputs[-1].meta["rel_info"] = info if info.shape else TensorInfo((1,), info.dtype, info.device)
        if info.shape:
            shared.row_class[inputs[-1]] = ProgramRows((0,), (info.shape[0],))
    joined = collate(graph, shared, [(0, sample)],
                     [x if layout == "cat" else None for x, layout in zip(inputs, layouts)], [[0]] * len(inputs), True,
                     tried=True)
    collated = frozenset(joined)
    unneeded = _unneeded(sample.records, collated)
    if not joined or any(i not in joined for i in index_readers(sample.records, unneeded)):
        return None
    whole_reads: list[int] = []
    rows = {i: (node, 0, counts[0]) for i, (node, counts) in joined.items()}
    _copy_sample(graph, sample, 0, inputs, tuple(layouts), [0] * len(inputs), shared, rows, unneeded, whole_reads)
    return None if whole_reads else collated


def _unneeded(records: Sequence[tuple], collated: frozenset[int]) -> frozenset[int]:
    """The records that a sample with ``collated`` records does not copy: what no output needs but through
    collated records (the index constants, an index expanded for a scatter)."""
    needed: set[int] = set()
    for i in range(len(records) - 1, -1, -1):
        op, _, args, kwargs = records[i][:4]
        if op == "output" or (i in needed and i not in collated):
            needed.update(record_slots((args, kwargs)))
    return frozenset(i for i, record in enumerate(records)
                     if i not in needed and i not in collated and record[0] in ("get_attr", "call_function",
                                                                                "call_method"))


#: calls that read or write rows of their first operand by an index tensor (along dim 0), and its position
_INDEXED_READS: dict[tuple[str, Any], int] = {
    (op, name): 2 for plain in ("index_select", "index_add", "index_copy", "index_fill", "gather", "scatter",
                                "scatter_add", "scatter_reduce", "index_reduce")
    for name in (plain, f"{plain}_") for op in ("call_method", "call_function")}
#: joins of tensors along a dim
_JOINS = frozenset(("cat", "concat", "concatenate", "stack"))
#: ``x.index_put_((rows, ...), values)``, as ``x[rows, ...] = values``
_PUTS = frozenset(("index_put", "index_put_"))
#: the indexed calls that read their first operand's rows (the others write into them)
_READS = frozenset(("getitem", "index_select", "gather"))
#: calls whose result holds values of their first operand as they are (an edge list's row, ``src, dst = edges``)
_VALUE_VIEWS = frozenset(("t", "view", "reshape", "flatten", "squeeze", "unsqueeze", "contiguous", "unbind",
                          "select", "long", "clone", "expand", "expand_as"))


def structure_inputs(graph: fx.Graph) -> list[fx.Node]:
    """The tensor arguments of a sample's traced ``graph`` that are the sample's structure: integer ones whose
    values index rows of the sample's own values (``h[src]``, ``h.index_select(0, src)``, ``z.index_add(0, dst,
    m)``, ``src, dst = edge_index``, ``a[dst, src] = 1`` into ``torch.zeros(n, n)``: per-graph code's edge lists),
    and square float matrices, dense or sparse, that multiply values computed from other arguments (``adj @
    lin(x)``, also normalized first: an adjacency). Indices into a shared table (an embedding's token ids) and
    within rows (``logp.gather(1, labels[:, None])``, ``x[torch.arange(k), labels]``) stay inputs, as do matrices
    multiplied by values of their own alone (``(x @ x.t()) @ lin(x)``)."""
    placeholders = graph.find_nodes(op="placeholder")
    # integer arguments, and the values holding their values as they are (rows of an edge list, an edge list with
    # self-loops joined) -> those arguments
    origin = {p: (p,) for p in placeholders if (info := tensor_info(p)) is not None
              and not (info.dtype.is_floating_point or info.dtype.is_complex or info.dtype == torch.bool)}
    # values computed from square float matrix arguments and constants alone -> those arguments
    matrices = {p: frozenset((p,)) for p in placeholders if _square_matrix(p)}
    read: dict[fx.Node, frozenset[fx.Node]] = {}   # (:func:`_arguments_read`'s, found once per node)
    if not origin and not matrices:   # (most samples: no tensor to walk the trace for)
        return []
    of_sample = set(placeholders)   # values computed from the sample's tensors
    # the model's tensors and values computed from them alone: rows written into anything else are the sample's
    shared = set(n for n in graph.find_nodes(op="get_attr") if not is_forward_constant(n))
    found: dict[fx.Node, None] = {}
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        inputs = node.all_input_nodes
        if any(a in of_sample for a in inputs):
            of_sample.add(node)
        elif inputs and all(a in shared for a in inputs):
            shared.add(node)
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", None)
        args = node.args
        first = args[0] if args and isinstance(args[0], fx.Node) else None
        if first in origin and (name in _VALUE_VIEWS or (node.target is operator.getitem
                                                         and not flat_nodes(args[1:]))):
            origin[node] = origin[first]
        elif name in _JOINS and node.op == "call_function" and args and isinstance(args[0], (list, tuple)) \
                and any(a in origin for a in args[0]) and all(a in origin or is_forward_constant(a) for a in args[0]):
            origin[node] = tuple(p for a in args[0] for p in origin.get(a, ()))
        if matrices and any(a in matrices for a in inputs) and all(
                a in matrices or is_forward_constant(a) for a in inputs):
            matrices[node] = frozenset().union(*(matrices.get(a, ()) for a in inputs))
        if (node.target in (operator.getitem, operator.setitem) or name in _PUTS) and len(args) >= 2:
            index = args[1][0] if isinstance(args[1], (tuple, list)) and args[1] else args[1]   # (x[rows, ...])
        else:
            at = _INDEXED_READS.get((node.op, name))
            along_rows = at is not None and len(args) > at and first is not None and names_rows(args[1], first)
            index = args[at] if along_rows else None
        indices = [index] if isinstance(index, fx.Node) and index in origin else []
        if indices and (first in of_sample or first is not None and first not in shared and name not in _READS):
            found.update(dict.fromkeys(p for i in indices for p in origin[i]))
        product = product_operands(node, sparse=True)
        if product is not None and product[0] in matrices and product[1] in of_sample \
                and not matrices[product[0]] & _arguments_read(product[1], read):
            found.update(dict.fromkeys(matrices[product[0]]))
    return list(found)


def _square_matrix(node: fx.Node) -> bool:
    """Whether a sample's tensor argument is a square float matrix, dense or sparse."""
    value = node.meta.get("example_value")
    return isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[0] == value.shape[1] \
        and value.is_floating_point()


def _arguments_read(node: fx.Node, memo: dict[fx.Node, frozenset[fx.Node]]) -> frozenset[fx.Node]:
    """The placeholders that ``node``'s value is computed from (``memo``: found before, for any node)."""
    todo = [node]
    while todo:
        at = todo[-1]
        if at in memo:
            todo.pop()
            continue
        missing = [a for a in at.all_input_nodes if a not in memo]
        if missing:
            todo.extend(missing)
            continue
        todo.pop()
        memo[at] = frozenset((at,)) if at.op == "placeholder" else frozenset().union(
            *(memo[a] for a in at.all_input_nodes))
    return memo[node]


def _argument_reads(records: Sequence[tuple], ignored: frozenset[int] = frozenset()
                    ) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """Which tensor arguments of a sample's ``records`` are read by records but the ``ignored`` ones, and which
    of them otherwise than row by row (``x[v]``: the reads :func:`_row_read` makes reads of the union's input)."""
    rows = {i: (info.shape[0] if (info := record_info(r)) is not None and info.shape else 0)
            for i, r in enumerate(records) if r[0] == "placeholder"}
    read, whole = dict.fromkeys(rows, False), dict.fromkeys(rows, False)
    for i, (op, target, args, kwargs, _, _) in enumerate(records):
        if i in ignored:
            continue
        for x in record_slots((args, kwargs)):
            if x in whole:
                read[x] = True
                if op != "call_function" or target is not operator.getitem or kwargs or args[0] != x \
                        or len(args) != 2 or _read_row(args[1], rows[x]) is None:
                    whole[x] = True
    return tuple(read.values()), tuple(whole.values())


def _records(graph: fx.Graph) -> tuple[tuple, ...]:
    """``graph``'s nodes as :attr:`SampleGraph.records`."""
    slots: dict[fx.Node, _Slot] = {}
    metas: dict[tuple, tuple] = {}   # the nodes of one source line and shape share their meta
    records = []
    for node in graph.nodes:
        meta = tuple(node.meta.items())
        try:
            meta = metas.setdefault(meta, meta)
        except TypeError:   # (an unhashable meta value)
            pass
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), slots.__getitem__)
        records.append((node.op, node.target, args, kwargs or _NO_KWARGS, node.name, meta))
        slots[node] = _Slot(len(slots))
    return tuple(records)


def _unlink(graph: fx.Graph) -> None:
    """Break the reference cycles of ``graph``, whose records replace it: its nodes point at each other (the
    node list, arguments and users) and at the graph, whose tables point back at them. Reference counting
    then frees the nodes, their metadata and tables at once; left to the cyclic collector, which walks every
    object allocated since its last run, they cost about 7% of a first epoch. (fx internals: where a version
    lacks one, the collector frees what is left.)"""
    nodes = list(graph.nodes)
    try:
        for node in nodes:
            node._update_args_kwargs((), {})
        for node in nodes:
            node._remove_from_list()
        graph._find_nodes_lookup_table = type(graph._find_nodes_lookup_table)()   # (empty, as the graph now is)
        graph._graph_namespace = type(graph._graph_namespace)()
        graph.owning_module = None
    except AttributeError:
        pass


@dataclass
class Layout:
    """Where each sample's values lie in the union."""
    #: per input position: ``"cat"`` (rows), ``"stack"`` (0-d tensors) or ``"unread"`` (no sample reads it: the
    #: union takes no such input)
    inputs: tuple[str, ...]
    #: per output position: ``"cat"`` or ``"stack"``
    outputs: tuple[str, ...]
    #: per input position, each sample's rows of the union's input
    rows: tuple[tuple[int, ...], ...] = ()
    #: where the samples' tensor arguments were packed by kind (:func:`_packed`): per sample, per input
    #: position, the arguments whose stack is its part of that input; None where each position is an argument
    packing: tuple[tuple[tuple[int, ...], ...], ...] | None = None
    #: where the samples' results were packed by kind (:func:`_packed_results`): per sample, for each tensor of
    #: its result in order, the output position and the row of its part there; None where each output
    #: position is a tensor of every sample's result
    results_packing: tuple[tuple[tuple[int, int], ...], ...] | None = None


def input_layout(shapes: Sequence[tuple[int, ...]], position: int, read_whole: bool = False, read: bool = True
                 ) -> str:
    """How the samples' tensor arguments at ``position`` (of ``shapes``) join: rows, or stacked (scalars, and
    tensors of one shape that a sample reads as a whole: a target vector, a graph's global features, each a
    row of the stack); not at all where no sample ``read`` them."""
    if not read:
        return "unread"
    if all(len(s) == 0 for s in shapes) or read_whole and len(set(shapes)) == 1:
        return "stack"
    if all(len(s) >= 1 for s in shapes) and len({s[1:] for s in shapes}) == 1:
        return "cat"
    raise NotBatchable(f"tensor argument {position} has shapes {sorted(set(shapes))[:3]} across samples: they "
                       "join along dim 0 only where their other dims agree")


#: the union's progress is shown every this many structures
_SHOWN_EVERY = 256


def build(samples: Sequence[SampleGraph], params: dict[str, torch.Tensor],
          progress: CompileProgress = NO_PROGRESS) -> tuple[fx.GraphModule, Layout]:
    """The union of ``samples`` (in order) as one ungrouped graph over the model's ``params``; ``progress``
    shows how many are in."""
    results_packing = None
    if len({str(s.out_spec) for s in samples}) > 1:
        samples, results_packing = _packed_results(samples)
    packing = None
    try:
        inputs_layout = _input_layouts(samples)
    except NotBatchable as by_position:
        try:
            samples, packing = _packed(samples)
            inputs_layout = _input_layouts(samples)
        except NotBatchable:
            raise by_position from None
    graph = fx.Graph()
    shared = _Shared(params)
    union_inputs: list[fx.Node | None] = []
    for j, layout in enumerate(inputs_layout):
        if layout == "unread":
            union_inputs.append(None)
            continue
        node = graph.placeholder(f"input{j}")
        row = samples[0].inputs[j]
        rows = sum(s.inputs[j].shape[0] if layout == "cat" else 1 for s in samples)
        rest = row.shape[1:] if layout == "cat" else row.shape
        node.meta["rel_info"] = TensorInfo((rows, *rest), row.dtype, row.device)
        if layout == "cat":
            shared.row_class[node] = ProgramRows(tuple(range(len(samples))),
                                                 tuple(s.inputs[j].shape[0] for s in samples))
        union_inputs.append(node)
    sample_rows = tuple(tuple(s.inputs[j].shape[0] if layout == "cat" else 1 for s in samples)
                        for j, layout in enumerate(inputs_layout))
    ends = [numpy.cumsum(counts).tolist() for counts in sample_rows]
    collated, unneeded = _collated(graph, samples, shared, [x if layout == "cat" else None for x, layout in
                                                            zip(union_inputs, inputs_layout)], ends)
    leaves: list[list[fx.Node]] = []
    offsets = [0] * len(inputs_layout)
    for s, sample in enumerate(samples):
        if s % _SHOWN_EVERY == 0:
            progress.start(f"union: {s:,} of {len(samples):,} structures")
        leaves.append(_copy_sample(graph, sample, s, union_inputs, inputs_layout, offsets, shared,
                                   collated.get(s, {}), unneeded.get(sample.program, frozenset())))
        for j, layout in enumerate(inputs_layout):
            offsets[j] += sample.inputs[j].shape[0] if layout == "cat" else 1
    outputs_layout = []
    outputs = []
    consumed: list[fx.Node] = []
    for j in range(len(samples[0].output_shapes)):
        node, layout = _join_outputs(graph, [leaf[j] for leaf in leaves], [s.output_shapes[j] for s in samples], j,
                                     consumed)
        outputs.append(node)
        outputs_layout.append(layout)
    graph.output(tuple(outputs))
    unread = dict.fromkeys(consumed)   # joined into the outputs without them: erased, readers first
    while unread:
        erased = [node for node in unread if not node.users]
        for node in erased:
            graph.erase_node(node)
            del unread[node]
        if not erased:   # (the rest is read by other nodes)
            break
    # lazy: Python code for the ungrouped union is never needed
    return _LazyGraphModule(shared.attrs, graph), Layout(inputs_layout, tuple(outputs_layout), sample_rows, packing,
                                                         results_packing)


def _input_layouts(samples: Sequence[SampleGraph]) -> tuple[str, ...]:
    """How the samples' tensor arguments at each position join (:func:`input_layout`)."""
    arity = {len(s.inputs) for s in samples}
    if len(arity) > 1:
        raise NotBatchable(f"samples take different numbers of tensor arguments ({min(arity)} to {max(arity)})")
    layouts = tuple(input_layout([s.inputs[j].shape for s in samples], j, any(s.read_whole[j] for s in samples),
                                 any(s.read[j] for s in samples))
                    for j in range(arity.pop()))
    for j in range(len(layouts)):
        kinds = {(s.inputs[j].dtype, s.inputs[j].device) for s in samples}
        if len(kinds) > 1 and layouts[j] != "unread":
            raise NotBatchable(f"tensor argument {j} has several dtypes or devices across samples: "
                               f"{sorted(map(str, kinds))[:3]}")
    return layouts


def _kind(info: TensorInfo) -> tuple:
    return info.shape, str(info.dtype), str(info.device)


def _by_kind(infos_per_sample: Sequence[Sequence[TensorInfo]], why: str) -> list[tuple[tuple[int, ...], ...]]:
    """Per sample, the positions of its tensors (of ``infos_per_sample``) of each kind (shape, dtype, device)
    that any sample has, the kinds in one order; :class:`NotBatchable` (``why``) where a sample lacks a kind."""
    kinds = sorted({_kind(info) for infos in infos_per_sample for info in infos})
    members = []
    for infos in infos_per_sample:
        own = [_kind(info) for info in infos]
        found = tuple(tuple(i for i, kind in enumerate(own) if kind == k) for k in kinds)
        if not all(found):
            raise NotBatchable(why)
        members.append(found)
    return members


def _packed_results(samples: Sequence[SampleGraph]
                    ) -> tuple[list[SampleGraph], tuple[tuple[tuple[int, int], ...], ...]]:
    """The samples returning, for each kind (shape, dtype, device) of tensor in their results, the stack of
    theirs; and per sample, the output position and row of each tensor of its result. Per-node code that returns
    a list of every node's state returns as many tensors as the sample has nodes: by kind, they join as rows.
    :class:`NotBatchable` where a sample lacks a kind, or returns something else than tensors and constants."""
    leaf_infos: list[list[TensorInfo]] = []
    for s in samples:
        infos = [record_info(s.records[leaf]) for leaf in s.records[-1][2][0]]
        if None in infos:
            raise NotBatchable("samples return differently structured results")
        leaf_infos.append([cast(TensorInfo, info) for info in infos])
    members = _by_kind(leaf_infos, "samples return differently structured results (tensors of other kinds)")
    places = []
    for found, leaves in zip(members, leaf_infos):
        where = [(0, 0)] * len(leaves)
        for k, positions in enumerate(found):
            for row, leaf in enumerate(positions):
                where[leaf] = (k, row)
        places.append(tuple(where))
    return [_pack_results(s, found) for s, found in zip(samples, members)], tuple(places)


def _pack_results(sample: SampleGraph, members: tuple[tuple[int, ...], ...]) -> SampleGraph:
    """``sample`` returning the stack of each of ``members`` (positions among its result's tensors)."""
    *body, output = sample.records
    leaves = output[2][0]
    records = list(body)
    stacks, shapes = [], []
    for k, positions in enumerate(members):
        info = cast(TensorInfo, record_info(sample.records[leaves[positions[0]]]))
        stacked = TensorInfo((len(positions), *info.shape), info.dtype, info.device)
        records.append(("call_function", torch.stack, (tuple(leaves[p] for p in positions),), _NO_KWARGS,
                        f"results{k}", (("rel_info", stacked),)))
        stacks.append(_Slot(len(records) - 1))
        shapes.append(stacked.shape)
    records.append(("output", "output", (tuple(stacks),), _NO_KWARGS, output[4], output[5]))
    return replace(sample, records=tuple(records), output_shapes=tuple(shapes))


def _packed(samples: Sequence[SampleGraph]) -> tuple[list[SampleGraph], tuple[tuple[tuple[int, ...], ...], ...]]:
    """The samples with their tensor arguments of each kind (shape, dtype, device) packed into one argument, their
    stack, whose rows are read where they were; and per sample, the arguments of each kind in order. A tree
    whose nodes hold their own vectors takes one tensor argument per node: by kind, the samples' arguments join
    as rows, as a feature matrix's do. :class:`NotBatchable` where a sample lacks a kind, or collates."""
    why = "samples take tensor arguments of other kinds"
    if any(s.program is not None for s in samples):
        raise NotBatchable(why)
    packing = _by_kind([s.inputs for s in samples], why)
    return [_pack(s, members) for s, members in zip(samples, packing)], tuple(packing)


def _pack(sample: SampleGraph, members: tuple[tuple[int, ...], ...]) -> SampleGraph:
    """``sample`` taking the stack of each of ``members`` as one argument, of which each member is a row."""
    packed = len(members)
    placeholders = [i for i, record in enumerate(sample.records) if record[0] == "placeholder"]
    row_of = {placeholders[j]: (k, row) for k, js in enumerate(members) for row, j in enumerate(js)}
    records: list[tuple] = []
    for k, js in enumerate(members):
        info = sample.inputs[js[0]]
        stacked = TensorInfo((len(js), *info.shape), info.dtype, info.device)
        records.append(("placeholder", f"packed{k}", (), _NO_KWARGS, f"packed{k}", (("rel_info", stacked),)))

    def moved(tree: Any) -> Any:
        return fx.node.map_aggregate(tree, lambda a: _Slot(a + packed) if type(a) is _Slot else a)

    for i, (op, target, args, kwargs, name, meta) in enumerate(sample.records):
        if op == "placeholder":
            k, row = row_of[i]
            records.append(("call_function", operator.getitem, (_Slot(k), row), _NO_KWARGS, name, meta))
        else:
            records.append((op, target, moved(args), moved(kwargs) if kwargs else _NO_KWARGS, name, meta))
    inputs = tuple(dict(records[k][5])["rel_info"] for k in range(packed))
    read, read_whole = _argument_reads(records)
    return replace(sample, records=tuple(records), inputs=inputs, read_whole=read_whole, read=read)


def _collated(graph: fx.Graph, samples: Sequence[SampleGraph], shared: "_Shared", inputs: list[fx.Node | None],
              ends: list[list[int]]) -> tuple[dict[int, dict[int, tuple[fx.Node, int, int]]],
                                              dict[Hashable, frozenset[int]]]:
    """Each program's collated records (:mod:`~dynamo_relational.collation`), made in ``graph``: per sample, its
    rows of them (record -> (union value, first row, rows)); and per program, the records its samples do not
    copy. ``ends[j]``: where each sample's rows of input ``j`` end."""
    programs: dict[Hashable, list[int]] = {}
    for s, sample in enumerate(samples):
        if sample.program is not None:
            programs.setdefault(sample.program, []).append(s)
    rows: dict[int, dict[int, tuple[fx.Node, int, int]]] = {}
    unneeded = {}
    for program, members in programs.items():
        first = [[input_ends[s] - samples[s].inputs[j].shape[0] if inputs[j] is not None else 0 for s in members]
                 for j, input_ends in enumerate(ends)]
        joined = collate(graph, shared, [(s, samples[s]) for s in members], inputs, first,
                         len(members) == len(samples))
        if frozenset(joined) != samples[members[0]].collated:   # (decided by the program alone, so never)
            raise NotBatchable(f"the samples of one program collate records {sorted(joined)[:5]} where one "
                               f"sample collates {sorted(samples[members[0]].collated)[:5]}")
        for s in members:
            rows[s] = {}
        for i, (node, counts) in joined.items():
            firsts = numpy.cumsum(counts) - counts
            for k, s in enumerate(members):
                rows[s][i] = (node, int(firsts[k]), counts[k])
        unneeded[program] = _unneeded(samples[members[0]].records, samples[members[0]].collated)
    return rows, unneeded


@dataclass
class _Shared:
    """What the samples of a union share: the parameters' nodes, and each value computed from parameters alone
    (a sample's ``self.W[r]`` is every sample's), made once. Such a value belongs to the sample that made it
    (``meta[SAMPLE]``) until another sample computes it too; then it belongs to none, and grouping leaves it
    alone."""
    params: dict[str, torch.Tensor]
    #: get_attr target -> tensor: the parameters, then each sample's own constants
    attrs: dict[str, torch.Tensor] = field(default_factory=dict)
    attr_nodes: dict[str, fx.Node] = field(default_factory=dict)
    #: (op, target, arguments) -> the node that computes it from parameters alone
    computed: dict[Hashable, fx.Node] = field(default_factory=dict)
    #: the parameters' nodes and the values of ``computed``
    nodes: set[fx.Node] = field(default_factory=set)
    #: the key of a row-wise op of a union value (``self.lin(x)`` of the samples' joined ``x``) -> its node
    union_rows: dict[Hashable, fx.Node] = field(default_factory=dict)
    #: a union value with rows of samples (a joined input, a row-wise op of one, a program's collated value)
    #: -> its rows' class: values of one class have as many rows of each sample, at the same places (so a
    #: row-wise op may read several)
    row_class: dict[fx.Node, ProgramRows] = field(default_factory=dict)
    #: (union value, reduction) -> that reduction of each sample's rows of it (:func:`_aggregated_rows`)
    reductions: dict[tuple[fx.Node, str], tuple[fx.Node, dict[int, int]]] = field(default_factory=dict)

    def constant(self, graph: fx.Graph, hint: str, value: torch.Tensor | None, device: torch.device | None = None,
                 index: bool = True) -> fx.Node:
        """A get_attr in ``graph`` of a new constant of the union, ``value`` (on ``device``; None: the name alone,
        for a union that is only tried): an index tensor of the grouping (named as the passes name theirs,
        ``index``), else a value of no sample."""
        name = f"{CONSTANT_PREFIX if index else '_'}{hint}_{len(self.attrs)}"
        while name in self.attrs:
            name += "_"
        node = new_node(graph, "get_attr", name, (), {})
        if value is not None:
            value = self.attrs[name] = value.to(device) if device is not None else value
            node.meta["rel_info"] = TensorInfo(tuple(value.shape), value.dtype, value.device)
        return node

    def segments_of(self, node: fx.Node) -> tuple[Sequence[int], Sequence[int]] | None:
        """The samples with rows in union value ``node``, and their rows, in order (None for values of no
        :attr:`row_class`)."""
        rows = self.row_class.get(node)
        return (rows.samples, rows.counts) if isinstance(rows, ProgramRows) else None

    def attribute(self, graph: fx.Graph, sample: SampleGraph, s: int, target: str, meta: tuple) -> fx.Node:
        """The union's node for sample ``s``'s ``get_attr`` of ``target`` (with ``meta``): a parameter's is
        shared, a constant's the sample's own."""
        param = target in self.params
        name = target if param else f"_sample{s}_{target.replace('.', '_')}"
        if name not in self.attr_nodes:
            self.attrs[name] = self.params[name] if param else sample.attrs[target]
            self.attr_nodes[name] = graph.get_attr(name)
            self.attr_nodes[name].meta.update(meta)
            if param:
                self.nodes.add(self.attr_nodes[name])
            else:   # (a sample's own constant: grouping tells samples' members apart by it no more than by rows)
                self.attr_nodes[name].meta[SAMPLE] = s
        return self.attr_nodes[name]

    def key(self, node: fx.Node) -> Hashable | None:
        """What identifies ``node``'s value if CSE would merge it (equal keys, equal values) and it is an op of
        the catalog on shared values alone or a deterministic factory (a leaf's ``torch.zeros(1, d)``), else
        None."""
        inputs = node.all_input_nodes
        if any(a not in self.nodes for a in inputs) or \
                not (is_factory(node) if not inputs else REGISTRY.family_of(node) is not None):
            return None
        return value_key(node, node.args, node.kwargs)


def _copy_sample(graph: fx.Graph, sample: SampleGraph, s: int, union_inputs: Sequence[fx.Node | None],
                 layouts: tuple[str, ...], offsets: list[int], shared: _Shared,
                 collated: dict[int, tuple[fx.Node, int, int]] | None = None,
                 unneeded: frozenset[int] = frozenset(), whole_reads: list[int] | None = None) -> list[fx.Node]:
    """Copy sample ``s`` into ``graph``; returns its output leaves there.

    A sample's tensor argument joined along dim 0 with the others' is its rows of the union's input, and a
    row-wise op of it (``self.lin(x)``, ``torch.relu`` of that) is its rows of that op on the union's input,
    made once for all samples (the per-node code that follows reads rows of it, ``h[v]``: rows of one value
    that grouping gathers, as it gathers the rows of the input). Read otherwise, those rows are a slice.
    The ``collated`` records are the sample's rows of its program's union values, and the ``unneeded`` ones
    are not copied; a collated value read whole is added to ``whole_reads``."""
    collated = collated or {}
    env: list[fx.Node | None] = []   # by record
    placeholders: dict[int, int] = {}   # record -> argument position
    whole: dict[int, fx.Node] = {}
    #: record -> (union value, its first row of this sample, the sample's rows): the sample's rows of it
    rows_of: dict[int, tuple[fx.Node, int, int]] = {}
    results = set(sample.records[-1][2][0])   # (the output's)

    def value(arg: Any) -> Any:
        if type(arg) is not _Slot:
            return arg
        if arg in rows_of:   # read as a whole: a slice of the union value
            if whole_reads is not None and arg in collated:
                whole_reads.append(arg)
            if arg not in whole:
                union_value, first, n = rows_of[arg]
                whole[arg] = graph.call_function(operator.getitem, (union_value, slice(first, first + n)))
                whole[arg].meta.update(sample.records[arg][5])
                whole[arg].meta[SAMPLE] = s
            return whole[arg]
        j = placeholders.get(arg)
        if j is None:
            return env[arg]
        if arg not in whole:   # a stacked argument: its row of the union's input
            whole[arg] = graph.call_function(operator.getitem, (union_inputs[j], offsets[j]))
            whole[arg].meta.update(sample.records[arg][5])
            whole[arg].meta[SAMPLE] = s
        return whole[arg]

    for i, (op, target, args, kwargs, name, meta) in enumerate(sample.records):
        if i in collated:
            rows_of[i] = collated[i]
            env.append(None)
            continue
        if i in unneeded:
            env.append(None)
            continue
        if op == "placeholder":
            j = placeholders[i] = len(placeholders)
            joined = union_inputs[j]
            if layouts[j] == "cat" and joined is not None:
                rows_of[i] = (joined, offsets[j], sample.inputs[j].shape[0])
            env.append(None)
            continue
        if op == "get_attr":
            env.append(shared.attribute(graph, sample, s, target, meta))
            continue
        if op == "output":
            return [value(leaf) for leaf in args[0]]
        row = _row_read(op, target, args, kwargs, rows_of)
        if row is not None:
            base, index, keeps_dim = row
            new = new_node(graph, "call_function", operator.getitem, (base, index), {}, f"{name}_s{s}")
            if keeps_dim:   # x[v:v + 1]: the row read, given its dim back
                new.meta.update(meta, **{SAMPLE: s})
                new = new_node(graph, "call_method", "unsqueeze", (new, 0), {}, f"{name}_row_s{s}")
        else:
            rows = _rows_of_op(graph, op, target, args, kwargs, meta, rows_of, value, shared)
            if rows is not None:
                rows_of[i] = rows
                env.append(None)
                continue
            # (a name of its own: fx's search for a free one grows with the copies of the same name)
            new = _reduced_rows(graph, op, target, args, kwargs, meta, rows_of, s, shared) or \
                _loss_of_rows(graph, op, target, args, kwargs, meta, rows_of, value, shared, s) or \
                new_node(graph, op, target, *fx.node.map_aggregate((args, kwargs), value), f"{name}_s{s}")
        new.meta.update(meta)
        key = shared.key(new) if row is None and i not in results else None
        if key is not None and key in shared.computed:   # another sample's: now of no one sample
            graph.erase_node(new)
            env.append(shared.computed[key])
            shared.computed[key].meta.pop(SAMPLE, None)
            continue
        new.meta[SAMPLE] = s
        if key is not None:
            shared.computed[key] = new
            shared.nodes.add(new)
        env.append(new)
    raise AssertionError("a traced graph ends with its output")


def _rows_of_op(graph: fx.Graph, op: str, target: Any, args: tuple, kwargs: dict, meta: tuple,
                rows_of: dict[int, tuple[fx.Node, int, int]], value: Callable[[Any], Any],
                shared: "_Shared") -> tuple[fx.Node, int, int] | None:
    """``(union value, first row, rows)`` if the record (``op``, ``target``, ``args``, ``kwargs``) is a row-wise op
    of a sample's rows of union values (of one row class: ``h + self.lin(h)``, ``torch.cat([h, g], 1)``) and of
    shared values and constants: its rows of the same op on the union values, which the first sample to make
    it makes; None otherwise."""
    if op != "call_function" and not (op == "call_method" and isinstance(target, str) and not target.endswith("_")):
        return None   # (a write would change every sample's rows)
    slots: list = []
    fx.node.map_aggregate((args, kwargs), lambda a: slots.append(a) if type(a) is _Slot else None)
    read = [a for a in slots if a in rows_of]
    spans = {rows_of[a] for a in read}
    classes = {shared.row_class.get(span[0]) for span in spans}
    if not spans or len({span[1:] for span in spans}) > 1 or len(classes) > 1 or None in classes:
        return None
    union_value, first, n = next(iter(spans))
    values = {span[0] for span in spans}
    new_args, kw = fx.node.map_aggregate((args, kwargs),
                                         lambda a: rows_of[a][0] if type(a) is _Slot and a in rows_of else value(a))
    inputs: list[fx.Node] = []
    fx.node.map_arg((new_args, kw), inputs.append)
    if any(a not in shared.nodes and a not in values for a in inputs):   # (weights, a bias: what every sample reads)
        return None
    info = dict(meta).get("rel_info")
    whole = tensor_info(union_value)
    if info is None or whole is None or not info.shape or info.shape[0] != n:
        return None
    made = new_node(graph, op, target, new_args, dict(kw))
    made.meta.update(meta)
    made.meta["rel_info"] = TensorInfo((whole.shape[0], *info.shape[1:]), info.dtype, info.device)
    if not (len(read) == 1 and args[0] in rows_of and row_wise_in(made, union_value)
            or _row_wise_of_aligned(made, values)):
        graph.erase_node(made)
        return None
    key = value_key(made, made.args, made.kwargs)
    known = shared.union_rows.get(key) if key is not None else None
    if known is not None:
        graph.erase_node(made)
        return known, first, n
    if key is not None:
        shared.union_rows[key] = made
    shared.row_class[made] = shared.row_class[union_value]
    return made, first, n


def _row_wise_of_aligned(made: fx.Node, rows: set[fx.Node]) -> bool:
    """Whether ``made``, an op of union values of one row class (``rows``) and of shared values, computes each
    row from the same rows of them: an elementwise op whose row operands have its rank (their dim 0 is the
    rows) and whose shared operands broadcast along the rows, a recurrent cell of rows of inputs and states, or
    a join of rows along a later dim."""
    out = tensor_info(made)
    if out is None:
        return False
    if works_within_rows(made):   # (a softmax or a sum along each row's own dims)
        return made.all_input_nodes == [made.args[0]] and made.args[0] in rows
    if made.target in (torch.cat, torch.concat):
        items, dim = made.args[0], made.args[1] if len(made.args) > 1 else made.kwargs.get("dim", 0)
        return type(dim) is int and dim % out.rank > 0 and all(item in rows for item in cast(Sequence, items))
    if made.target is operator.getitem:   # (``h[:, 0]``, ``labels[:, None]``: each row's elements)
        index = made.args[1]
        return isinstance(index, tuple) and bool(index) and index[0] == slice(None) and made.args[0] in rows \
            and all(i is None or type(i) in (int, slice) for i in index)
    if made.target is F.embedding:   # (each row's ids looked up in a shared table)
        return made.all_input_nodes[0] is made.args[0] and made.args[0] in rows \
            and all(a not in rows for a in made.all_input_nodes[1:])
    if made.target is aggregate:   # (``h + self.lin(h)``, made n-ary by the aggregation pass)
        return all(term in rows for term in cast(Sequence, made.args[0]))
    family = REGISTRY.family_of(made)
    if family is CELL:   # (a recurrent cell: each row's state from that row's input and state, by shared weights)
        return made.args[0] in rows and made.args[1] in rows and all(a not in rows for a in made.args[2:])
    if family is GATHER_ALONG:   # (within each row, by that row's indices: ``logp.gather(1, labels[:, None])``)
        return len(made.args) > 1 and not names_rows(made.args[1], made) \
            and all(a in rows for a in made.all_input_nodes)
    if family is LOSS:   # (without reduction: a loss per row, or per element, of its scores and targets)
        call = loss_call(made)
        return not isinstance(call, str) and call.reduction == "none" and call.input in rows and call.target in rows
    return family is ELEMENTWISE and all(tensor_info(a) is not None for a in made.all_input_nodes) \
        and elementwise_mixing(made, rows) is None


#: reductions over a tensor's rows that an aggregation of its rows computes, by target
_ROW_REDUCTIONS = {**{getattr(torch, r): r for r in REDUCTIONS}, **{r: r for r in REDUCTIONS}}


def _reduced_rows(graph: fx.Graph, op: str, target: Any, args: tuple, kwargs: dict, meta: tuple,
                  rows_of: dict[int, tuple[fx.Node, int, int]], s: int, shared: "_Shared") -> fx.Node | None:
    """The aggregation of a sample's rows of a union value where a record reduces them over dim 0 (a set's
    ``self.phi(x).sum(0)``, ``h.mean(dim=0, keepdim=True)``, ``h.sum(dim=-2, keepdim=True)``): each row is read
    from the union value, as per-node code reads ``h[v]``, so the aggregations of all samples group as one
    segment reduction; None for any other record, and for a sample without rows (eager's sum of no rows is
    zeros, its amax an error)."""
    if op not in ("call_function", "call_method") or not args or type(args[0]) is not _Slot \
            or args[0] not in rows_of:
        return None
    try:
        reduce = _ROW_REDUCTIONS.get(target)
    except TypeError:   # (an unhashable target)
        return None
    named = dict(zip(("dim", "keepdim"), args[1:]), **kwargs) if len(args) <= 3 else None
    if reduce is None or named is None or set(named) - {"dim", "keepdim"} \
            or named.get("keepdim", False) not in (True, False):
        return None
    union_value, first, n = rows_of[args[0]]
    whole = tensor_info(union_value)
    dim = named.get("dim", "every")
    if type(dim) in (tuple, list) and len(dim) == 1:
        dim = dim[0]
    if n == 0 or whole is None or not (dim == "every" or type(dim) is int and dim % whole.rank == 0):
        return None   # (over dim 0, also written -2 for rows of vectors: PyG's global_add_pool(h, None))
    # over every dim: a sum or mean of the rows' sums or means (rows of equal size); a maximum of the rows'
    # maxima would split the gradient of ties across rows otherwise than eager does
    every = "dim" not in named
    if every and (reduce not in ("sum", "mean") or named.get("keepdim")):
        return None
    reduced = _aggregated_rows(graph, union_value, first, n, reduce, meta, s, shared)
    if not (every or named.get("keepdim")):
        return reduced
    return new_node(graph, "call_method", reduce if every else "unsqueeze", (reduced,) if every else (reduced, 0), {})


def _aggregated_rows(graph: fx.Graph, union_value: fx.Node, first: int, n: int, reduce: str, meta: tuple,
                     s: int, shared: "_Shared") -> fx.Node:
    """The ``reduce`` aggregation of rows ``first`` to ``first + n`` of ``union_value`` (sample ``s``'s), each
    row read as per-node code reads ``h[v]``; its metadata is the rows' (``meta``'s source line). Where the
    union value's rows are known sample by sample (:meth:`_Shared.segments_of`), it is the sample's row of one
    segment reduction for all samples, which grouping needs not find (nor join with another value's)."""
    whole = cast(TensorInfo, tensor_info(union_value))
    row = TensorInfo(whole.shape[1:], whole.dtype, whole.device)
    source = {k: v for k, v in meta if k == "stack_trace"}
    segments = shared.segments_of(union_value) if whole.dtype.is_floating_point else None
    if segments is not None:
        reduced, position = _segment_reduction(graph, shared, union_value, segments, reduce, row, source)
        read = new_node(graph, "call_function", operator.getitem, (reduced, position[s]), {})
        read.meta.update(source, rel_info=row, **{SAMPLE: s})
        return read
    terms = []
    for r in range(first, first + n):
        term = new_node(graph, "call_function", operator.getitem, (union_value, r), {})
        term.meta.update(source, rel_info=row, **{SAMPLE: s})
        terms.append(term)
    reduced = new_node(graph, "call_function", aggregate, (terms, reduce), {})
    reduced.meta.update(source, rel_info=row, **{SAMPLE: s})
    return reduced


def _segment_reduction(graph: fx.Graph, shared: "_Shared", union_value: fx.Node,
                       segments: tuple[Sequence[int], Sequence[int]], reduce: str, row: TensorInfo,
                       source: dict) -> tuple[fx.Node, dict[int, int]]:
    """The ``reduce`` of each sample's rows of ``union_value`` (a row per sample, in the order of ``segments``),
    made once; and each sample's row of it."""
    key = (union_value, reduce)
    if key not in shared.reductions:
        samples, counts = segments
        offsets = csr_offsets(list(counts))
        total = int(offsets[-1])
        if reduce in GATHER_REDUCTIONS:   # (as the vectorizer reduces: a sparse product; empty segments are zeros)
            csr = shared.constant(graph, "rows_of_each_sample", pack_csr(offsets, torch.arange(total), total),
                                  row.device)
            reduced = new_node(graph, "call_function", _GATHER_REDUCE, (union_value, csr, len(counts), reduce), {})
        else:
            offsets_node = shared.constant(graph, "rows_of_each_sample", offsets, row.device)
            reduced = new_node(graph, "call_function", _SEGMENT_REDUCE, (union_value, offsets_node, reduce), {})
        reduced.meta.update(source, rel_info=TensorInfo((len(counts), *row.shape), row.dtype, row.device))
        reduced.meta[ROW_SAMPLES] = list(samples)
        shared.reductions[key] = reduced, {s: k for k, s in enumerate(samples)}
    return shared.reductions[key]


def _loss_of_rows(graph: fx.Graph, op: str, target: Any, args: tuple, kwargs: dict, meta: tuple,
                  rows_of: dict[int, tuple[fx.Node, int, int]], value: Callable[[Any], Any], shared: "_Shared",
                  s: int) -> fx.Node | None:
    """A loss of a sample's rows of union values (its outputs and per-node targets or labels, of one row class)
    reduced to its mean or sum (``F.mse_loss(self.out(h), y)``, ``F.cross_entropy(scores, labels)``): the same
    loss without reduction over all samples' rows, made once, and the aggregation of the sample's rows of it
    (a class loss's mean divides by the labels that count, ``labels != ignore_index``, as eager's does); None
    for any other record."""
    try:
        if op != "call_function" or REGISTRY.functions.get(target) is not LOSS:
            return None
    except TypeError:   # (an unhashable target)
        return None
    reduction = kwargs.get("reduction", "mean")
    if reduction not in ("mean", "sum") or len(args) != 2 or not all(type(a) is _Slot and a in rows_of for a in args):
        return None
    scores, labels = (rows_of[a] for a in args)
    if scores[1:] != labels[1:] or scores[2] == 0:
        return None
    union_scores, first, n = scores
    scores_info, labels_info = tensor_info(union_scores), tensor_info(labels[0])
    if scores_info is None or labels_info is None or scores_info.rank == 0:
        return None
    classes = target in (F.cross_entropy, F.nll_loss)
    # (a loss per row of [rows, classes] scores, with a label or class probabilities per row; an elementwise
    # loss of a target of the input's shape: no broadcasting, so the rows' losses have the input's shape)
    if (labels_info.shape[1:] != scores_info.shape[1:] and not (classes and labels_info.rank == 1)) \
            or (classes and scores_info.rank != 2):
        return None
    rows_shape = (n,) if classes else (n, *scores_info.shape[1:])
    per_row = (("rel_info", TensorInfo(rows_shape, scores_info.dtype, scores_info.device)),
               *((k, v) for k, v in meta if k != "rel_info"))
    made = _rows_of_op(graph, op, target, args, {**kwargs, "reduction": "none"}, per_row, rows_of, value, shared)
    if made is None:
        return None
    union_losses = made[0]
    if not (classes and reduction == "mean" and not labels_info.dtype.is_floating_point):
        reduced = _aggregated_rows(graph, union_losses, first, n, reduction, meta, s, shared)
        return new_node(graph, "call_method", reduction, (reduced,), {}) if len(rows_shape) > 1 else reduced
    # (index labels: eager's mean divides by the labels that are not ignore_index)
    ignored = kwargs.get("ignore_index", -100)
    key = ("labels that count", labels[0], ignored, scores_info.dtype)
    counts = shared.union_rows.get(key)
    if counts is None:
        kept = new_node(graph, "call_function", operator.ne, (labels[0], ignored), {})
        kept.meta["rel_info"] = TensorInfo(labels_info.shape, torch.bool, scores_info.device)
        counts = shared.union_rows[key] = new_node(graph, "call_method", "to", (kept, scores_info.dtype), {})
        counts.meta["rel_info"] = TensorInfo(labels_info.shape, scores_info.dtype, scores_info.device)
        shared.row_class[counts] = shared.row_class[labels[0]]
    total = _aggregated_rows(graph, union_losses, first, n, "sum", meta, s, shared)
    counted = _aggregated_rows(graph, counts, first, n, "sum", meta, s, shared)
    return new_node(graph, "call_function", operator.truediv, (total, counted), {})


def _row_read(op: str, target: Any, args: tuple, kwargs: dict,
              rows_of: dict[int, tuple[fx.Node, int, int]]) -> tuple[fx.Node, Any, bool] | None:
    """``(union value, index into it, keeps_dim)`` where a record reads one row of a sample's rows of a union
    value (``x[v]``, ``x[v, :4]`` of a tensor argument or a row-wise op of one; with ``keeps_dim``,
    ``x[v:v + 1]``: the same row as a one-row tensor); None otherwise."""
    if op != "call_function" or target is not operator.getitem or kwargs:
        return None
    base, index = args
    joined = rows_of.get(base) if type(base) is _Slot else None
    if joined is None:
        return None
    union_value, first, n = joined
    read = _read_row(index, n)
    if read is None:
        return None
    row, rest, keeps_dim = read
    row += first
    return union_value, row if rest is None else (row, *rest), keeps_dim


def _read_row(index: Any, rows: int) -> tuple[int, tuple | None, bool] | None:
    """``(row, the rest of the index or None, keeps_dim)`` if ``x[index]`` of an ``x`` of ``rows`` rows reads
    one row: ``x[v]``, ``x[v, :4]``, or keeping its dim, ``x[v:v + 1]``, ``x[v:v + 1, :4]``."""
    first, rest = (index[0], index[1:]) if type(index) is tuple and index else (index, None)
    if type(first) is int and -rows <= first < rows:
        return first % rows, rest, False
    if type(first) is slice and first.step in (None, 1) and type(first.start) is int and 0 <= first.start < rows \
            and first.stop == first.start + 1:
        return first.start, rest, True
    return None


def _join_outputs(graph: fx.Graph, leaves: list[fx.Node], shapes: list[tuple[int, ...]], j: int,
                  consumed: list[fx.Node]) -> tuple[fx.Node, str]:
    """One union output from the samples' output leaves at position ``j``: stacked, or their rows joined
    (the leaves that the join computes without are added to ``consumed``)."""
    info = _tensor_info(leaves[0])
    rows_agree = all(len(s) >= 1 for s in shapes) and len({s[1:] for s in shapes}) == 1
    joined = _joined_rows(graph, leaves, consumed) if rows_agree else None
    if len(set(shapes)) == 1 and joined is None:
        node = graph.call_function(torch.stack, (list(leaves),))
        node.meta["rel_info"] = TensorInfo((len(leaves), *info.shape), info.dtype, info.device)
        node.meta[JOINED_OUTPUT] = True
        return node, "stack"
    if not rows_agree:
        raise NotBatchable(f"output {j} has shapes {sorted(set(shapes))[:3]} across samples: they join along dim 0 "
                           "only where their other dims agree")
    if joined is None:
        joined = graph.call_function(torch.cat, (list(leaves),))
        joined.meta[JOINED_OUTPUT] = True
        joined.meta["rel_info"] = TensorInfo((sum(s[0] for s in shapes), *info.shape[1:]), info.dtype, info.device)
    return joined, "cat"


def _joined_rows(graph: fx.Graph, leaves: list[fx.Node], consumed: list[fx.Node]) -> fx.Node | None:
    """A node whose rows are the rows of every leaf, leaf after leaf, computed without the leaves; the leaves
    are added to ``consumed`` (those that nothing else reads are erased once every output is joined). Where
    each leaf is a ``torch.stack`` (or each a ``torch.cat``) of a list along dim 0, ``cat(stack(a),
    stack(b))`` is ``stack(a + b)``: the stacked rows themselves group. Where each is the same row-wise op
    (``F.linear`` by the same weights, an elementwise op of constants, a softmax or sum within each row) of
    such values, ``cat(f(a), f(b))`` is ``f(cat(a, b))``: one op on all rows (a classifier over every node's
    state). Where the leaves are the samples' rows of one union value in order, that value. None otherwise."""
    if any(leaf.op not in ("call_function", "call_method") for leaf in leaves):
        return None
    first = leaves[0]
    if _slices_covering(leaves):   # each sample's rows of one union value, in order: that value
        joined = cast(fx.Node, first.args[0])
    elif first.target in (torch.stack, torch.cat) and all(
            leaf.target is first.target and isinstance(leaf.args[0], (list, tuple)) and _along_rows(leaf)
            for leaf in leaves):
        terms = [item for leaf in leaves for item in cast(Sequence[fx.node.Argument], leaf.args[0])]
        joined = graph.call_function(first.target, (terms,))
        joined.meta[JOINED_OUTPUT] = True
        term = _tensor_info(cast(fx.Node, terms[0]))
        if first.target is torch.stack:
            shape = (len(terms), *term.shape)
        else:
            shape = (sum(_tensor_info(cast(fx.Node, t)).shape[0] for t in terms), *term.shape[1:])
        joined.meta["rel_info"] = TensorInfo(shape, term.dtype, term.device)
    elif all(leaf.op == first.op and leaf.target == first.target and leaf.args[1:] == first.args[1:]
             and leaf.kwargs == first.kwargs and isinstance(leaf.args[0], fx.Node)
             and (row_wise_in(leaf, leaf.args[0]) or works_within_rows(leaf)) for leaf in leaves):
        inner = _joined_rows(graph, [cast(fx.Node, leaf.args[0]) for leaf in leaves], consumed)
        if inner is None:
            return None
        # (of no sample: a union's op on the rows of all of them, which grouping leaves as it is)
        joined = graph.create_node(first.op, first.target, (inner, *first.args[1:]), dict(first.kwargs))
        joined.meta.update({k: v for k, v in first.meta.items() if k not in (SAMPLE, "rel_info")})
        rows, row = _tensor_info(inner).shape[0], _tensor_info(first)
        joined.meta["rel_info"] = TensorInfo((rows, *row.shape[1:]), row.dtype, row.device)
    else:
        return None
    consumed[:0] = leaves   # (readers first)
    return joined


def _slices_covering(leaves: list[fx.Node]) -> bool:
    """Whether ``leaves`` are slices ``u[a:b]`` of one computed value ``u`` that cover its rows in order (each
    sample's rows of a row-wise op of its joined argument, returned as they are; an argument returned itself is
    eager's own tensor, which a slice of the joined arguments is not)."""
    base, at = leaves[0].args[0] if leaves[0].args else None, 0
    if not isinstance(base, fx.Node) or base.op == "placeholder":
        return False
    for leaf in leaves:
        if leaf.target is not operator.getitem or len(leaf.args) != 2 or leaf.args[0] is not base:
            return False
        index = leaf.args[1]
        if type(index) is not slice or index.start != at or index.step is not None or type(index.stop) is not int:
            return False
        at = index.stop
    info = tensor_info(base)
    return info is not None and bool(info.shape) and info.shape[0] == at


def _along_rows(join: fx.Node) -> bool:
    """Whether ``torch.stack`` / ``torch.cat`` node ``join`` joins its list along dim 0 (``stack(h)``,
    ``stack(h, 0)``, ``stack(h, dim=0)``)."""
    dim = join.args[1:] + tuple(join.kwargs.values()) if set(join.kwargs) <= {"dim"} else None
    return dim in ((), (0,))


def _tensor_info(node: fx.Node) -> TensorInfo:
    """The info of a sample's tensor argument or output leaf: always a tensor of static shape."""
    info = tensor_info(node)
    assert info is not None
    return info


def _attribute(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value
