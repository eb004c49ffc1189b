"""dynamo_relational.batch: a model written for one sample run over batches of samples of other structures,
sample by sample equal to eager (outputs and gradients), with no tracing or grouping for known structures."""
from __future__ import annotations

import collections
import copy
import enum
import gc
import operator
import dataclasses
import random
import re
from operator import getitem

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

import dynamo_relational
from dynamo_relational import tracing_patches
from dynamo_relational.frontend import FrontendError
from examples.per_sample import MODELS, ObjectChildSumTreeLSTM, TreeLSTM, TreeRNN, dataset, object_tree
from tests.helpers import (BATCH_TOLERANCE, EveryNodesState, TypedGRUMessages, VectorNode, VectorTreeRNN,
                           assert_batches_match_eager, assert_rows_batch_as_eager, assert_shuffled_batches_match_eager,
                           traced_per_sample, typed_graphs, vector_tree, warnings_logged)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_shuffled_batches_equal_eager_and_later_epochs_only_assemble(kind):
    torch.manual_seed(0)
    data = dataset(kind, 24, features=4, dtype=torch.float64)
    model = MODELS[kind][0](4).double()
    batched = dynamo_relational.batch(model)
    for epoch in range(3):
        order = list(range(len(data)))
        random.Random(epoch).shuffle(order)
        for i in range(0, len(order), 6):   # the first epoch traces: new structures run eagerly
            assert_batches_match_eager(batched, model, [data[j] for j in order[i:i + 6]], through_union=epoch > 0)
        if epoch == 0:
            first_epoch_nodes = batched.report.kept_nodes
        if epoch == 1:
            second_epoch = (batched.report.structures, batched.report.groupings, batched.report.kept_nodes)
    report = batched.report
    assert report.unbatched == 0, report.unbatched_reason
    assert report.structures == len(data) and report.groupings <= 2
    # nothing traced or grouped in epoch 3; what is kept is every structure's trace, and no more after epoch 1
    assert (report.structures, report.groupings, report.kept_nodes) == second_epoch
    assert report.kept_nodes == first_epoch_nodes >= report.structures


@pytest.mark.parametrize("kind", ["treelstm", "lrnn"])
def test_a_kept_structure_holds_its_trace_as_records_not_fx_nodes(kind):
    """Every traced structure is kept, to be grouped again: as records of its nodes, not as ``fx.Node`` objects
    with their tables, which cost several times more; the union built from them equals eager."""
    data, model, batched = traced_per_sample(kind, 6)
    for structure in batched._cache.structures.values():
        reached, seen = [structure.graph], set()
        while reached:
            obj = reached.pop()
            if id(obj) in seen or isinstance(obj, (torch.Tensor, type)):
                continue
            seen.add(id(obj))
            assert not isinstance(obj, (fx.Node, fx.Graph, nn.Module)), obj
            if isinstance(obj, (tuple, list, dict)):
                reached.extend(obj.values() if isinstance(obj, dict) else obj)
            elif dataclasses.is_dataclass(obj):
                reached.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
    assert batched.report.kept_nodes == sum(len(s.graph.records) for s in batched._cache.structures.values())
    assert_batches_match_eager(batched, model, data[::-1])


@pytest.mark.parametrize("kind", ["treelstm", "gcn"])
def test_a_traced_structure_is_freed_without_the_cyclic_collector(kind):
    """Once a trace is records, its graph (hundreds of fx nodes per sample, linked to each other) is freed by
    reference counting, not left for the cyclic garbage collector to find."""
    data = dataset(kind, 8, features=4, dtype=torch.float64)
    batched = dynamo_relational.batch(MODELS[kind][0](4).double(), progress=False)
    gc.collect()
    gc.disable()
    try:
        batched(data)
        gc.set_debug(gc.DEBUG_SAVEALL)   # (what the collector finds stays in gc.garbage, to be counted)
        gc.collect()
        nodes = sum(1 for found in gc.garbage if isinstance(found, fx.Node))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert batched.report.structures == len(data)
    assert nodes <= 2 * len(data), nodes


def test_records_share_equal_metadata_and_keep_unhashable_metadata():
    from dynamo_relational.union import _records

    graph = fx.symbolic_trace(lambda x: torch.relu(x) + torch.relu(x)).graph
    relus = graph.find_nodes(op="call_function", target=torch.relu)
    add = next(n for n in graph.nodes if n.target is operator.add)
    for node in relus:
        node.meta["stack_trace"] = "line 1"
    add.meta["note"] = ["a list"]   # (cannot be hashed)
    records = {record[4]: record for record in _records(graph)}
    first, second = (records[node.name] for node in relus)
    assert first[5] is second[5] and first[5] == (("stack_trace", "line 1"),)
    assert dict(records[add.name][5]) == {"note": ["a list"]}
    assert records[add.name][2] == tuple(list(records).index(node.name) for node in relus)   # record positions


def test_values_every_sample_computes_alike_are_computed_once_in_the_union():
    """The child-sum leaves' ``x.new_zeros(1, hidden)`` and what they compute from it with parameters alone
    (``fh(zeros)``): one node for all samples, not one per sample."""
    data, model, batched = traced_per_sample("childsum", 12)
    assert_batches_match_eager(batched, model, data[::-1])
    nodes = batched._cache.unions[0].plan.graph.graph.nodes
    assert sum(1 for n in nodes if n.target is torch.zeros) <= 1


def test_the_readme_training_loop_over_a_data_loader_trains_as_eager_does():
    """README's loop: a DataLoader of ((tree, tokens), target) pairs collated as lists, one step per batch."""
    data = [(sample, torch.randn(())) for sample in dataset("treernn", 24)]
    model = TreeRNN(data[0][0][1].shape[1]).double()
    eager = copy.deepcopy(model)
    batched = dynamo_relational.batch(model, progress=False)
    for net, run in ((model, batched), (eager, lambda samples: [eager(*s) for s in samples])):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.001)
        torch.manual_seed(0)   # the same shuffles for both
        for _ in range(2):
            for pairs in torch.utils.data.DataLoader(data, batch_size=5, shuffle=True, collate_fn=list):
                outputs = run([(children, x.double()) for (children, x), _ in pairs])
                loss = sum(((out.sum() - target) ** 2 for out, (_, target) in zip(outputs, pairs)), torch.tensor(0.))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    assert batched.report.groupings >= 1 and batched.report.batches > batched.report.unbatched
    for got, want in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(got, want, **BATCH_TOLERANCE)


def test_a_structure_repeated_in_a_batch_and_batches_of_other_sizes():
    torch.manual_seed(1)
    data = dataset("treernn", 8, features=4, dtype=torch.float64)
    model = TreeRNN(4, hidden=5).double()
    batched = dynamo_relational.batch(model)
    batched(data)   # traces: new structures run eagerly
    same_tree = (data[2][0], torch.randn(len(data[2][0]), 4, dtype=torch.float64))
    for batch in ([data[2], same_tree, data[2]], [data[5]], data[::-1], [data[0]] * 4):
        assert_batches_match_eager(batched, model, batch)
    assert batched.report.groupings == 1 and batched.report.structures == 8


@pytest.mark.parametrize("enabled", [True, False])
def test_a_long_grouping_shows_a_progress_bar_over_its_steps(enabled, monkeypatch, capsys):
    from dynamo_relational import progress

    monkeypatch.setattr(progress, "DELAY", 0.0)   # every grouping counts as long here
    torch.manual_seed(1)
    data = dataset("treernn", 6, features=4, dtype=torch.float64)
    model = TreeRNN(4, hidden=5).double()
    batched = dynamo_relational.batch(model, progress=enabled)
    batched(data)   # traces
    capsys.readouterr()
    assert_batches_match_eager(batched, model, data)   # groups
    err = capsys.readouterr().err
    assert batched.report.groupings == 1
    assert ("relational: grouping 6 structures" in err and "union: 0 of 6 structures" in err and "vectorize" in err
            and "row plan" in err) == enabled
    assert err == "" or enabled


@pytest.mark.parametrize("libc", ["glibc", "none"])
def test_grouping_hands_the_c_heaps_freed_memory_back_once_per_union(libc, monkeypatch):
    from dynamo_relational import batching

    trims = []
    if libc == "glibc":
        monkeypatch.setattr(batching, "_MALLOC_TRIM", trims.append)
    else:   # a C library without malloc_trim: nothing to call, and grouping goes on
        monkeypatch.setattr(batching, "_MALLOC_TRIM", None)
        monkeypatch.setattr(batching.ctypes, "CDLL", lambda *args: object())
    torch.manual_seed(1)
    data = dataset("treernn", 6, features=4, dtype=torch.float64)
    model = TreeRNN(4, hidden=5).double()
    batched = dynamo_relational.batch(model, progress=False)
    batched(data)
    assert_batches_match_eager(batched, model, data)
    assert batched.report.groupings == 1
    assert trims == ([0] if libc == "glibc" else [])
    assert libc == "glibc" or batching._MALLOC_TRIM is False


def test_a_failure_of_grouping_itself_runs_the_samples_with_the_model_and_names_it(monkeypatch):
    """An error inside grouping (not a refusal) does not fail the batch: its samples run with the model, as eager's
    calls would, and the report says why."""
    from dynamo_relational import batching

    def fails(*args, **kwargs):
        raise RuntimeError("shapes of the grouped graph disagree\nsecond line")

    monkeypatch.setattr(batching, "analyse", fails)
    torch.manual_seed(1)
    data = dataset("treernn", 6, features=4, dtype=torch.float64)
    model = TreeRNN(4, hidden=5).double()
    batched = dynamo_relational.batch(model, progress=False)
    batched(data)
    assert_batches_match_eager(batched, model, data, through_union=False)
    assert batched.report.unbatched_reason == \
        "grouping the union failed: RuntimeError: shapes of the grouped graph disagree", batched.report


@pytest.mark.parametrize("kind", ["treelstm", "gcn"])
def test_structures_beyond_max_union_nodes_group_as_several_unions_each_batch_running_those_it_needs(kind):
    data, model, batched = traced_per_sample(kind, 16, progress=False, max_union_nodes=2000)
    order = random.Random(0).sample(range(len(data)), len(data))
    for chosen in (order[:8], order[8:], order[1:-1] + order[1:2]):
        assert_batches_match_eager(batched, model, [data[i] for i in chosen])
    report = batched.report
    assert report.unions == report.groupings == len(batched._cache.unions) > 1, report
    nodes = [sum(len(batched._cache.structures[k].graph.records) for k in union.keys)
             for union in batched._cache.unions]
    assert all(n <= 2000 for n in nodes) and report.union_nodes[0] == sum(u.nodes[0] for u in batched._cache.unions)
    assert report.unbatched == 0 and "current unions" in str(report)


def test_new_structures_regroup_only_the_union_they_join_when_unions_are_bounded():
    """Shards are runs of consecutive structures in the order seen: those already full are kept as they are."""
    data = dataset("treernn", 40, features=4, dtype=torch.float64)
    model = TreeRNN(4).double()
    batched = dynamo_relational.batch(model, progress=False, max_union_nodes=600)
    first, later = data[:30], data[30:]
    batched(first)   # traced
    batched(first)   # grouped
    before, groupings = list(batched._cache.unions), batched.report.groupings
    assert len(before) > 2
    batched(later)   # traced
    assert_batches_match_eager(batched, model, later[:6] + first[:2])   # back: grouped again
    after = batched._cache.unions
    assert list(map(id, after[:len(before) - 1])) == list(map(id, before[:-1])), "a full union was grouped again"
    assert batched.report.groupings - groupings == len(after) - (len(before) - 1)


def test_auto_max_union_nodes_fits_the_unions_into_the_memory_available(monkeypatch):
    from dynamo_relational import batching

    monkeypatch.setattr(batching, "available_memory", lambda: 1000 * batching.UNION_BYTES_PER_NODE)
    data, model, batched = traced_per_sample("treernn", 12, progress=False)
    assert_batches_match_eager(batched, model, data)
    assert batched.report.unions > 1
    monkeypatch.setattr(batching, "available_memory", lambda: None)   # (unknown: one union)
    data, model, batched = traced_per_sample("treernn", 12, progress=False)
    assert_batches_match_eager(batched, model, data)
    assert batched.report.unions == 1


@pytest.mark.parametrize("bound", [0, -5, 2.5, "all"])
def test_a_bad_max_union_nodes_is_refused_by_name(bound):
    with pytest.raises(dynamo_relational.OptionsError, match="max_union_nodes"):
        dynamo_relational.batch(TreeRNN(4), max_union_nodes=bound)


def test_a_batch_of_shallow_trees_skips_the_levels_only_deeper_trees_have():
    """The union computes every level of its deepest tree; a batch of smaller trees runs code, made when the
    union was grouped, without values that batch leaves empty, and still equals eager."""
    from dynamo_relational.row_plan import Batch

    data, model, batched = traced_per_sample("treelstm", 16)
    batched(data[:4])   # the union is grouped for batches of 4
    union = batched._cache.unions[0]
    assert len(union.runs) > 2

    def ops(run) -> int:
        graph = union.graphs[union.runs.index(run)].graph
        return sum(1 for n in graph.nodes if n.op in ("call_function", "call_method"))
    assert batched.report.union_code == (len(union.runs), min(map(ops, union.runs)), max(map(ops, union.runs)))
    by_size = sorted(data, key=lambda sample: len(sample[0]))
    for batch in (by_size[:3], by_size[:12], by_size[-4:], data[::3]):
        samples = Batch([union.position[batched._key(s, 0)[0]] for s in batch])
        run = union.run_for(samples)
        assert ops(run) <= ops(union.runs[0]) - union.ops @ union.pruned[union.runs.index(run)]
        assert not (union.pruned[union.runs.index(run)] & ~union.plan.empty_values(samples)).any()
        assert_batches_match_eager(batched, model, batch)
    assert ops(union.run_for(Batch([union.position[batched._key(s, 0)[0]] for s in by_size[:3]]))) \
        < ops(union.runs[0])


def test_a_changed_structure_is_traced_again_never_run_stale():
    model = TreeRNN(3, hidden=4).double()
    batched = dynamo_relational.batch(model)
    children = [[1, 2], [], []]
    x = torch.randn(3, 3, dtype=torch.float64)
    assert_batches_match_eager(batched, model, [(children, x)], through_union=False)
    assert_batches_match_eager(batched, model, [(children, x)])
    children[0].pop()            # the same list object, now another tree
    children[1].append(2)
    assert_batches_match_eager(batched, model, [(children, x)], through_union=False)
    assert_batches_match_eager(batched, model, [(children, x)])
    assert batched.report.structures == 2 and batched.report.eager_samples == 2


def test_key_names_the_structure():
    class Tree:
        def __init__(self, children):
            self.children = children

    class PerTree(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = TreeRNN(3, hidden=4)

        def forward(self, tree, x):
            return self.rnn(tree.children, x)

    model = PerTree().double()
    trees = [Tree([[1], []]), Tree([[1, 2], [], []]), Tree([[1], []])]
    batched = dynamo_relational.batch(model, key=lambda tree, x: tuple(map(tuple, tree.children)))
    batch = [(t, torch.randn(len(t.children), 3, dtype=torch.float64)) for t in trees]
    batched(batch)
    assert_batches_match_eager(batched, model, batch)
    assert batched.report.structures == 2
    # a tensor that an object holds is found (here read by value, as structure), not frozen into the trace
    assert_batches_match_eager(batched, model, [batch[0], (Tree([torch.tensor([1]), []]), batch[1][1][:2])],
                               through_union=False)


def test_key_finds_the_tensors_the_fingerprint_finds():
    """With ``key=``, a sample's tensors are found where the fingerprint finds them, in its order: a tensor
    missed would be frozen into the trace, and a sample of equal key would run with the first one's values."""
    from dynamo_relational.batching import _Inputs, _tensors_anywhere, fingerprint

    class Children(list):
        pass

    class Node:
        def __init__(self, x, children):
            self.x, self.children = x, children

    def tensors_of(sample):
        found = _Inputs()
        fingerprint(sample, (), found)
        return found.tensors

    t = [torch.randn(2, 3, dtype=torch.float64) for _ in range(5)]
    listed = Children([t[0], [t[1]]])
    listed.x = t[2]
    samples = [(listed,), (collections.OrderedDict(a=t[0], b=(t[1], {"c": t[2]})),),
               (Node(t[3], Children([Node(t[4], []), listed])), [t[0]])]
    for sample in samples:
        assert [id(x) for x in _tensors_anywhere(sample, ()).tensors] == [id(x) for x in tensors_of(sample)]

    class Rows(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3, dtype=torch.float64)

        def forward(self, children):
            return torch.stack([self.lin(children.x[v]) for v in range(len(children))])

    def sample(n):
        children = Children([[]] * n)
        children.x = torch.randn(n, 3, dtype=torch.float64)
        return (children,)

    model = Rows()
    batched = dynamo_relational.batch(model, key=len, progress=False)
    batched([sample(3)])
    assert_batches_match_eager(batched, model, [sample(3), sample(3)], through_union=False)


def test_structure_in_plain_objects_is_fingerprinted():
    class Node:
        def __init__(self, word, children=()):
            self.word, self.children = word, list(children)

    class Recursive(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.W = nn.Linear(4, 4)

        def forward(self, node, scale):
            h = self.emb(torch.tensor(node.word))
            for child in node.children:
                h = h + self.forward(child, scale)
            return torch.tanh(self.W(h) * scale)

    model = Recursive().double()
    batched = dynamo_relational.batch(model)
    trees = [Node(1, [Node(2), Node(3, [Node(4)])]), Node(5), Node(1, [Node(2), Node(3, [Node(4)])])]
    batch = [(t, torch.rand((), dtype=torch.float64)) for t in trees]
    batched(batch)
    # (rows times a per-sample scalar are not restricted to a batch: the samples run one by one)
    assert_batches_match_eager(batched, model, batch, through_union=False)
    assert batched.report.structures == 2


class NodeStates(TreeRNN):
    """A result with a row per node: every node's state (``style`` "stack": ``torch.stack(h)``, "cat": ``torch.cat``
    of one-row states), scores of every node by a classifier, each state plus their mean (``centered``: the
    stack beside a value of its own sample), ops within each row (``log-probabilities``: a log-softmax, a sum
    and an argmax over dim 1), or (``prefix sums``) a cumulative sum down the stack's rows."""

    def __init__(self, features: int, style: str = "stack"):
        super().__init__(features, hidden=5)
        self.style = style
        if style in ("classifier", "log-probabilities"):
            self.out = nn.Linear(5, 3)

    def forward(self, children, x):
        h = [None] * len(children)
        for v in reversed(range(len(children))):
            own = self.W(x[v])
            h[v] = torch.tanh(own + self.U(sum(h[c] for c in children[v])) if children[v] else own)
        if self.style == "cat":
            return torch.cat([state.unsqueeze(0) for state in h])
        states = torch.stack(h)
        if self.style == "classifier":
            return torch.sigmoid(self.out(states) * 2)
        if self.style == "centered":   # (each row beside its own sample's mean)
            return states + states.mean(0)
        if self.style == "log-probabilities":   # (within each row; the stack also read by a second result)
            return F.log_softmax(self.out(states), dim=1), states.sum(-1), self.out(states).argmax(1)
        return states.cumsum(0) if self.style == "prefix sums" else states


@pytest.mark.parametrize("style", ["stack", "cat", "classifier", "centered", "log-probabilities"])
def test_results_with_a_row_per_node_join_the_samples_rows(style):
    data = dataset("treernn", 10, features=4, dtype=torch.float64)
    model = NodeStates(4, style).double()
    batched = dynamo_relational.batch(model)
    batched(data)
    for batch in (data[::-1], data[3:7], [data[2]] * 3):
        assert_batches_match_eager(batched, model, batch)
    assert batched.report.unbatched == 0 and batched.report.groupings == 1


class _ObjectiveOverNodes(TreeRNN):
    """An objective over every node of the sample, written over its stacked states as per-sample code does:
    the negative log-likelihood of each node's label picked with ``gather``, ``-logp.gather(1, labels[:,
    None]).mean()`` (``style`` "mean"), with ``labels.unsqueeze(1)`` and a sum ("sum"), or over states joined as
    one-row tensors with ``labels.view(-1, 1)`` ("cat"), or picked by advanced indexing, ``logp[torch.arange(n),
    labels]`` ("arange", "range": a Python range), or weighted by one-hot labels ("one_hot"); a binary loss of
    each node's first score against a target computed from its label ("binary"); the norms of each node's
    scores, summed ("norm"); the likelihood beside the accuracy of the nodes' predictions ("accuracy")."""

    def __init__(self, style: str):
        super().__init__(4, hidden=5)
        self.style, self.out = style, nn.Linear(5, 3)

    def forward(self, children, x, labels):
        h = [None] * len(children)
        for v in reversed(range(len(children))):
            own = self.W(x[v])
            h[v] = torch.tanh(own + self.U(sum(h[c] for c in children[v])) if children[v] else own)
        states = torch.cat([state.unsqueeze(0) for state in h]) if self.style == "cat" else torch.stack(h)
        if self.style == "norm":
            return self.out(states).norm(dim=1).sum()
        if self.style == "binary":
            return F.binary_cross_entropy_with_logits(self.out(states)[:, 0], (labels > 1).double())
        logp = F.log_softmax(self.out(states), dim=1)
        if self.style == "accuracy":
            return torch.stack([F.nll_loss(logp, labels), (logp.argmax(1) == labels).double().mean()])
        if self.style == "mean":
            return -logp.gather(1, labels[:, None]).mean()
        if self.style == "one_hot":
            return -(F.one_hot(labels, 3) * logp).sum(1).mean()
        if self.style in ("arange", "range"):
            rows = torch.arange(len(children)) if self.style == "arange" else range(len(children))
            return -logp[rows, labels].mean()
        return -logp.gather(1, labels.unsqueeze(1) if self.style == "sum" else labels.view(-1, 1)).sum()


@pytest.mark.parametrize("style", ["mean", "sum", "cat", "arange", "range", "one_hot", "binary", "norm",
                                   "accuracy"])
def test_an_objective_over_a_samples_stacked_nodes_batches(style):
    generator = torch.Generator().manual_seed(0)
    data = [(children, x, torch.randint(0, 3, (len(children),), generator=generator))
            for children, x in dataset("treernn", 8, features=4, dtype=torch.float64)]
    assert_shuffled_batches_match_eager(_ObjectiveOverNodes(style).double(), data)


class _DenseFirstLayer(nn.Module):
    """Per-graph code that runs its first layer over all of the graph's nodes at once (``torch.relu(self.lin(x))``)
    and then passes messages node by node, as per-graph code built on dense node features does; with ``whole``,
    the readout also reads that layer's output as a whole (its mean over the graph's nodes)."""

    def __init__(self, whole: bool = False):
        super().__init__()
        self.whole = whole
        self.lin, self.out = nn.Linear(4, 5, dtype=torch.float64), nn.Linear(5, 2, dtype=torch.float64)

    def forward(self, in_nbrs, x):
        h = torch.relu(self.lin(x))
        states = torch.stack([torch.tanh(h[v] + sum(h[u] for u in in_nbrs[v])) for v in range(len(in_nbrs))])
        return self.out(states.mean(0) + (h.mean(0) if self.whole else 0))


def test_a_first_layer_over_all_of_a_samples_nodes_batches_as_one_layer_over_all_samples():
    """``self.lin(x)`` of each sample's whole ``x`` is its rows of one ``self.lin`` over the samples' joined
    inputs, which the rows read by the per-node code gather (before, the whole read ran the samples one by
    one)."""
    batched = assert_shuffled_batches_match_eager(_DenseFirstLayer(), dataset("gcn", 10, features=4,
                                                                             dtype=torch.float64))
    assert batched.report.union_nodes[1] < 40, batched.report


class _RowsOfALayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, in_nbrs, x):
        return torch.relu(self.lin(x))


def test_a_layer_over_all_of_a_samples_nodes_returned_as_it_is_batches():
    """Each sample's result is its rows of the layer over all samples' joined inputs: the union returns that."""
    assert_shuffled_batches_match_eager(_RowsOfALayer(), dataset("gcn", 10, features=4, dtype=torch.float64))


def test_a_first_layer_also_reduced_over_all_of_a_samples_nodes_batches():
    assert_shuffled_batches_match_eager(_DenseFirstLayer(whole=True), dataset("gcn", 10, features=4,
                                                                              dtype=torch.float64))


class _DeepSets(nn.Module):
    """A set model: ``rho(reduce(phi(x)))`` over the rows of one set ``x`` (of any size)."""

    def __init__(self, reduce: str):
        super().__init__()
        self.reduce = reduce
        self.phi, self.rho = nn.Linear(3, 4, dtype=torch.float64), nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, x):
        h = torch.relu(self.phi(x))
        pooled = {"sum": lambda: h.sum(0), "mean": lambda: torch.mean(h, dim=0), "amax": lambda: h.amax(0),
                  "keepdim": lambda: h.sum(0, keepdim=True)[0], "of the input": lambda: self.phi(x.mean(0)),
                  }[self.reduce]()
        return self.rho(pooled)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "keepdim", "of the input"])
def test_a_reduction_over_all_of_a_samples_rows_batches_as_one_segment_reduction(reduce):
    """Each sample's ``h.sum(0)`` of its rows of one layer over all samples (or of its own rows of the joined
    input) reads its rows, which one aggregation group reduces per sample (before, every sample ran alone)."""
    batched = assert_rows_batch_as_eager(_DeepSets(reduce))
    assert batched.report.union_nodes[1] < 25, batched.report


class _EdgeIndexGCN(nn.Module):
    """Per-graph message passing written with tensor ops over an edge list: ``edge_index`` ``[2, E]`` (or
    ``edges`` ``[E, 2]``), ``h[src]`` or ``h.index_select(0, src)``, and ``index_add`` into the targets."""

    def __init__(self, style: str):
        super().__init__()
        self.style = style
        self.lin, self.msg = nn.Linear(3, 4, dtype=torch.float64), nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x, edges):
        src, dst = (edges[:, 0], edges[:, 1]) if self.style == "[E, 2]" else edges
        h = self.lin(x)
        m = self.msg(h.index_select(0, src) if self.style == "index_select" else h[src])
        out = torch.zeros_like(h).index_add(0, dst, m) if self.style != "onto h" else h.index_add(0, dst, m)
        if self.style == "mean":   # (GraphSAGE: the mean of the messages, counted by the edges, and the root's term)
            count = torch.zeros(len(x), dtype=x.dtype).index_add(0, dst, torch.ones(len(dst), dtype=x.dtype))
            out = out / count.clamp(min=1).view(-1, 1) + h
        if self.style == "again, of h + h":   # (a second layer reads rows of the first's sums, added to themselves)
            out = torch.zeros_like(out).index_add(0, dst, (out + out)[src])
        return torch.relu(out).mean(0)


def _edge_list_graphs(style: str, sizes=(3, 4, 2, 5, 3, 4)) -> list[tuple]:
    generator = torch.Generator().manual_seed(len(sizes))
    graphs = []
    for n in sizes:
        edges = torch.randint(0, n, (2, n + 1), generator=generator)
        graphs.append((torch.randn(n, 3, dtype=torch.float64, generator=generator),
                       edges.t().contiguous() if style == "[E, 2]" else edges))
    return graphs


@pytest.mark.parametrize("style", ["h[src]", "index_select", "[E, 2]", "onto h", "mean", "again, of h + h"])
def test_per_graph_code_over_an_edge_index_tensor_batches_its_edges_as_structure(style):
    """The integer tensor that indexes the graph's own rows is its structure (read by value); the reads and
    sums by it become per-edge reads and per-node sums, which group across graphs of any size; the counts a
    mean divides by are computed from the edges alone, once per structure (a constant of its trace)."""
    batched = assert_shuffled_batches_match_eager(_EdgeIndexGCN(style), _edge_list_graphs(style))
    assert batched.report.union_nodes[1] < (60 if style == "mean" else 40), batched.report
    if style == "mean":
        targets = {record[1] for s in batched._cache.structures.values() for record in s.graph.records}
        assert not {torch.ones, "clamp", torch.Tensor.index_add}.intersection(targets), targets


@pytest.mark.parametrize("readout", ["amax", "sum"])
def test_nodes_without_messages_batch_in_any_readout(readout):
    """A node that no edge reaches sums no message: its row is zeros, which every sample's such node shares in a
    union; a sample's max (or sum) over its rows reads that row for the sample."""
    class Readout(nn.Module):
        def forward(self, x, edges):
            src, dst = edges
            return getattr(torch.zeros_like(x).index_add(0, dst, x[src] * 2), readout)(0)

    graphs = [(x, torch.tensor([[0, 0], [1, 1]])) for x, _ in _edge_list_graphs("h[src]")]   # (nodes 2 and on: none)
    assert_shuffled_batches_match_eager(Readout(), graphs)


def test_a_recurrent_cell_of_sums_started_from_zeros_batches():
    """The zeros of nodes without messages are one value for all samples, which the cell's group gathers for
    those nodes; the gather's rows take their samples from the cell's result (it reads its state twice)."""
    assert_shuffled_batches_match_eager(TypedGRUMessages(), typed_graphs())


@pytest.mark.parametrize("given", ["arguments", "Data"])
def test_a_tensor_argument_that_forward_does_not_read_is_not_joined(given):
    """An edge index beside the features of a model that ignores it (an MLP baseline on PyG's ``Data``): its
    shapes differ in more than their rows, which no join takes, but no sample reads it, so the union takes none."""
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 4, dtype=torch.float64)

        def forward(self, x, edge_index=None):
            x = x.x if given == "Data" else x
            return torch.relu(self.lin(x)).mean(0)

    graphs = _edge_list_graphs("h[src]")
    if given == "Data":
        data = pytest.importorskip("torch_geometric.data")
        graphs = [(data.Data(x=x, edge_index=edges),) for x, edges in graphs]
    batched = assert_shuffled_batches_match_eager(MLP(), graphs)
    assert batched.report.union_code[2] <= 5, batched.report


@pytest.mark.parametrize("layer", ["GraphConv", "GINConv", "GCNConv", "SAGEConv", "SAGEConv max", "GATConv",
                                   "TransformerConv", "EdgeConv", "TAGConv", "GatedGraphConv"])
def test_pytorch_geometric_layers_called_on_one_graph_batch_as_one_union(layer):
    """A PyG layer called on one ``Data`` (``index_select`` by the edges' sources, ``scatter_add_`` of the
    messages into a new tensor of zeros, GCN's normalization computed from the edges alone, SAGE's mean: the
    sums divided by counts of the edges expanded along the rows; a maximum, ``scatter_reduce_(..., "amax",
    include_self=False)``, and the attention's softmax over each node's incoming edges built on it; a GRU cell
    of each node's sum and state, its features padded with zeros)."""
    pyg = pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data

    class OneGraph(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = {"GraphConv": lambda: pyg.nn.GraphConv(3, 4), "GCNConv": lambda: pyg.nn.GCNConv(3, 4),
                         "GINConv": lambda: pyg.nn.GINConv(nn.Linear(3, 4)),
                         "SAGEConv": lambda: pyg.nn.SAGEConv(3, 4),
                         "SAGEConv max": lambda: pyg.nn.SAGEConv(3, 4, aggr="max"),
                         "GATConv": lambda: pyg.nn.GATConv(3, 4, heads=2),
                         "TransformerConv": lambda: pyg.nn.TransformerConv(3, 4),
                         "EdgeConv": lambda: pyg.nn.EdgeConv(nn.Linear(6, 4)),
                         "TAGConv": lambda: pyg.nn.TAGConv(3, 4),
                         "GatedGraphConv": lambda: pyg.nn.GatedGraphConv(4, 2)}[layer]()

        def forward(self, data):
            return torch.relu(self.conv(data.x, data.edge_index)).mean(0)

    graphs = [(Data(x=x, edge_index=edges),) for x, edges in _edge_list_graphs("h[src]")]
    batched = assert_shuffled_batches_match_eager(OneGraph().double(), graphs)
    assert batched.report.union_nodes[1] < 90, batched.report


def test_a_pytorch_geometric_layer_keeping_its_attention_for_a_loss_runs_with_the_model_in_training():
    """``SuperGATConv`` keeps each training call's attention logits on itself for ``get_attention_loss()``:
    its samples run with the model, which keeps the last sample's, as eager's calls do (negative edges drawn
    alike); in eval mode it keeps none, and batches."""
    pyg = pytest.importorskip("torch_geometric")

    class OneGraph(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = pyg.nn.SuperGATConv(3, 4)

        def forward(self, x, edge_index):
            return torch.relu(self.conv(x, edge_index)).mean(0)

    def seeded():   # (PyG draws negative edges from Python's generator)
        torch.manual_seed(0)
        random.seed(0)

    model, graphs = OneGraph().double(), _edge_list_graphs("h[src]")
    batched = dynamo_relational.batch(model, progress=False)
    for batch in (graphs, graphs[::-1]):
        seeded()
        got = batched(batch)
        loss = model.conv.get_attention_loss()
        seeded()
        torch.testing.assert_close(got, [model(*sample) for sample in batch], rtol=0, atol=0)
        torch.testing.assert_close(loss, model.conv.get_attention_loss(), rtol=0, atol=0)
    assert batched.report.unbatched == 2 and "would not store" in batched.report.unbatched_reason, batched.report
    assert_shuffled_batches_match_eager(model.eval(), graphs)


def test_a_transformer_layer_over_each_sample_runs_as_eager():
    """``nn.TransformerEncoderLayer`` over a sample's rows (its attention returns ``(out, None)``): recorded and
    traced, it is not grouped (a whole-sequence op), and its samples run with the model, as eager's."""
    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, dtype=torch.float64)

        def forward(self, x):
            return self.layer(x.unsqueeze(1)).mean(0)

    model, samples = Encoder(), [(torch.randn(n, 4, dtype=torch.float64),) for n in (3, 5, 4)]
    batched = dynamo_relational.batch(model, progress=False)
    for batch in (samples, samples[::-1]):
        assert_batches_match_eager(batched, model, batch, through_union=False)


class _SelfLoopFree(nn.Module):
    """Messages along the edges that are not self-loops, weighted by an edge feature: PyG's ``remove_self_loops``
    masks the edges and their features with ``edge_index[0] != edge_index[1]``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4, dtype=torch.float64)

    def forward(self, x, edge_index, edge_weight):
        mask = edge_index[0] != edge_index[1]
        (src, dst), w = edge_index[:, mask], edge_weight[mask]
        m = torch.zeros_like(x).index_add(0, dst, x[src] * w[:, None])
        return torch.relu(self.lin(m + x)).sum(0)


def test_features_selected_by_a_mask_of_the_structure_batch():
    """A boolean mask computed from the edges alone selects rows known while tracing: its indices, not a read of
    values (eager's call ran; the recording raised that the result's shape depends on values)."""
    generator = torch.Generator().manual_seed(0)
    graphs = []
    for n in (3, 4, 2, 5, 3, 4):
        graphs.append((torch.randn(n, 3, dtype=torch.float64, generator=generator),
                       torch.randint(0, n, (2, n + 2), generator=generator),
                       torch.rand(n + 2, dtype=torch.float64, generator=generator)))
    assert_shuffled_batches_match_eager(_SelfLoopFree(), graphs)


@pytest.mark.parametrize("layer", ["TransformerConv", "CGConv", "GINEConv"])
def test_pytorch_geometric_layers_with_edge_features_and_global_pooling_batch_as_one_union(layer):
    """PyG layers reading edge features beside the edge index, pooled by ``global_add_pool(h, None)``
    (``h.sum(dim=-2, keepdim=True)``: a sum over the sample's rows, written with a negative dim)."""
    pyg = pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data

    class OneGraph(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = {"TransformerConv": lambda: pyg.nn.TransformerConv(3, 4, edge_dim=2),
                         "CGConv": lambda: pyg.nn.CGConv(3, 2),
                         "GINEConv": lambda: pyg.nn.GINEConv(nn.Linear(3, 3), edge_dim=2)}[layer]()

        def forward(self, data):
            return pyg.nn.global_add_pool(torch.relu(self.conv(data.x, data.edge_index, data.edge_attr)), None)

    generator = torch.Generator().manual_seed(0)
    graphs = [(Data(x=x, edge_index=edges, edge_attr=torch.randn(edges.shape[1], 2, dtype=torch.float64,
                                                                 generator=generator)),)
              for x, edges in _edge_list_graphs("h[src]")]
    assert_shuffled_batches_match_eager(OneGraph().double(), graphs)


def test_graphs_of_one_shape_with_other_edges_are_other_structures():
    """Two graphs of the same sizes whose edges differ never share a trace: each runs with its own edges."""
    model = _EdgeIndexGCN("h[src]")
    x = torch.randn(4, 3, dtype=torch.float64)
    graphs = [(x, torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])), (x, torch.tensor([[3, 2, 1, 0], [0, 0, 0, 0]]))]
    batched = dynamo_relational.batch(model, progress=False)
    assert_batches_match_eager(batched, model, graphs, through_union=False)
    assert_batches_match_eager(batched, model, graphs[::-1])
    assert batched.report.structures == 2, batched.report


def test_labels_that_index_within_each_row_stay_inputs():
    """``logp.gather(1, labels[:, None])`` and ``logp[torch.arange(n), labels]`` pick an element of each row: the
    labels are values, not structure, so graphs of one size share one trace whatever their labels."""
    class Likelihood(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 4, dtype=torch.float64)

        def forward(self, x, labels):
            logp = torch.log_softmax(self.lin(x), 1)
            return -logp.gather(1, labels[:, None]).mean() - logp[torch.arange(len(labels)), labels].sum()

    model = Likelihood()
    graphs = [(torch.randn(n, 3, dtype=torch.float64), torch.randint(0, 4, (n,))) for n in (3, 2, 3, 2, 3)]
    batched = dynamo_relational.batch(model, progress=False)
    assert_batches_match_eager(batched, model, graphs, through_union=False)
    assert_batches_match_eager(batched, model, graphs[::-1])
    assert batched.report.structures == 2, batched.report


def test_token_ids_that_index_a_shared_table_stay_inputs():
    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(10, 3, dtype=torch.float64)

        def forward(self, tokens):
            return self.embedding(tokens).sum(0)

    model = Bag()
    bags = [(torch.tensor(tokens),) for tokens in ([1, 2, 3], [4, 5, 6], [7, 8], [9, 0])]
    batched = dynamo_relational.batch(model, progress=False)
    assert_batches_match_eager(batched, model, bags, through_union=False)
    assert_batches_match_eager(batched, model, bags[::-1])
    assert batched.report.structures == 2, batched.report   # (one per length: the ids are values)


class _RowsOfTwoValues(nn.Module):
    """Per-graph code over all of a graph's nodes at once, combining two values with a row per node: a layer's
    output and the node-feature matrix or the per-node targets."""

    def __init__(self, style: str):
        super().__init__()
        self.style = style
        self.a, self.b = nn.Linear(3, 3, dtype=torch.float64), nn.Linear(3, 3, dtype=torch.float64)

    def forward(self, x, y):
        h = torch.relu(self.a(x))
        return {"residual": lambda: (h + self.b(h)).sum(0),
                "gate": lambda: (torch.sigmoid(self.b(x)) * h).mean(0),
                "joined features": lambda: torch.cat([h, self.b(x)], 1).sum(0),
                "mask": lambda: (h * (y > 0)).sum(0),
                "error per node": lambda: ((self.b(h) - y) ** 2).sum(1),
                "sum of every element": lambda: (self.b(h) * y).sum(),
                }[self.style]()


@pytest.mark.parametrize("style", ["residual", "gate", "joined features", "mask", "error per node",
                                   "sum of every element"])
def test_ops_of_several_values_with_a_row_per_node_batch_as_ops_over_all_samples_rows(style):
    """Values with as many rows of every sample (the joined ``x`` and ``y``, layers of them) combine row by row
    in one op over all samples' rows; before, each sample read them as a whole and ran alone."""
    data = [(torch.randn(n, 3, dtype=torch.float64), torch.randn(n, 3, dtype=torch.float64)) for n in (2, 5, 1, 3, 5)]
    batched = assert_shuffled_batches_match_eager(_RowsOfTwoValues(style), data)
    assert batched.report.union_nodes[1] < 25, batched.report


class _GraphLoss(nn.Module):
    """Per-graph code that computes its loss in ``forward``, from a layer over all of the graph's nodes and the
    nodes' targets ``y`` (``[nodes, 4]``) or labels (some ``-100``, which the class losses ignore)."""

    def __init__(self, style: str):
        super().__init__()
        self.style = style
        self.lin = nn.Linear(3, 4, dtype=torch.float64)

    def forward(self, x, y, labels):
        h = self.lin(x)
        return {"mse": lambda: F.mse_loss(h, y),
                "mse, summed": lambda: F.mse_loss(h, y, reduction="sum"),
                "l1 of tanh": lambda: F.l1_loss(torch.tanh(h), y),
                "binary": lambda: F.binary_cross_entropy_with_logits(h, (y > 0).double()),
                "cross entropy": lambda: F.cross_entropy(h, labels),
                "cross entropy, summed": lambda: F.cross_entropy(h, labels, reduction="sum"),
                "label smoothing": lambda: F.cross_entropy(h, labels, label_smoothing=0.1),
                "nll of log_softmax": lambda: F.nll_loss(F.log_softmax(h, 1), labels),
                "class probabilities": lambda: F.cross_entropy(h, torch.softmax(y, 1)),
                "likelihood by hand": lambda: -torch.log_softmax(h, 1).gather(1, labels.clamp(min=0)[:, None]).mean(),
                "broadcast target": lambda: F.mse_loss(h[:, :1], y),
                }[self.style]()


@pytest.mark.parametrize("style", ["mse", "mse, summed", "l1 of tanh", "binary", "cross entropy",
                                   "cross entropy, summed", "label smoothing", "nll of log_softmax",
                                   "class probabilities", "likelihood by hand"])
def test_a_loss_over_all_of_a_samples_nodes_batches_as_one_loss_over_all_samples_rows(style):
    """The loss without reduction over all samples' rows, each sample's mean or sum aggregated from its rows (a
    class loss's mean divided by its labels that count); before, each sample ran alone."""
    data = [(torch.randn(n, 3, dtype=torch.float64), torch.randn(n, 4, dtype=torch.float64),
             torch.tensor([-100 if (i + n) % 4 == 0 else i % 4 for i in range(n)])) for n in (2, 5, 1, 3, 5)]
    batched = assert_shuffled_batches_match_eager(_GraphLoss(style), data)
    assert batched.report.union_nodes[1] < 30, batched.report


def test_a_loss_whose_target_broadcasts_over_the_input_still_matches_eager():
    data = [(torch.randn(n, 3, dtype=torch.float64), torch.randn(n, 4, dtype=torch.float64),
             torch.zeros(n, dtype=torch.long)) for n in (2, 5, 3)]
    model = _GraphLoss("broadcast target")
    batched = dynamo_relational.batch(model, progress=False)
    with pytest.warns(UserWarning, match="target size"):   # (eager's own warning)
        assert_batches_match_eager(batched, model, data, through_union=False)
        assert_batches_match_eager(batched, model, data[::-1], through_union=False)


def test_values_whose_rows_differ_from_sample_to_sample_are_not_combined_row_by_row():
    """``y`` has one row in some samples (it broadcasts over ``x``'s rows there) and as many as ``x`` in others:
    no op over all rows computes that, so the samples run one by one, as eager."""
    model = _RowsOfTwoValues("mask")
    data = [(torch.randn(n, 3, dtype=torch.float64), torch.randn(1 if n % 2 else n, 3, dtype=torch.float64))
            for n in (2, 5, 1, 3, 4)]
    batched = dynamo_relational.batch(model, progress=False)
    assert_batches_match_eager(batched, model, data, through_union=False)
    assert_batches_match_eager(batched, model, data[::-1], through_union=False)
    assert batched.report.unbatched > 0


def test_a_result_read_as_a_whole_per_sample_runs_the_samples_one_by_one():
    """Prefix sums over a sample's rows: one op on the union's joined rows would mix the samples."""
    data = dataset("treernn", 10, features=4, dtype=torch.float64)
    model = NodeStates(4, "prefix sums").double()
    batched = dynamo_relational.batch(model)
    batched(data)
    with warnings_logged() as messages:
        assert_batches_match_eager(batched, model, data[:4], through_union=False)
    assert batched.report.unbatched_reason and any(batched.report.unbatched_reason in m for m in messages)


class ReturnsItsArgument(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.linear = nn.Linear(features, 2)

    def forward(self, x):
        return x, self.linear(x[0])


def test_a_sample_that_returns_its_tensor_argument_runs_one_by_one_as_eager():
    """A result that is the argument itself is read as a whole: the union cannot restrict it, and says so."""
    model = ReturnsItsArgument(3).double()
    data = [(torch.randn(rows, 3, dtype=torch.float64),) for rows in (2, 3, 2, 4)]
    batched = dynamo_relational.batch(model)
    batched(data)
    with warnings_logged() as messages:
        assert_batches_match_eager(batched, model, data[::-1], through_union=False)
    assert "as a whole" in batched.report.unbatched_reason and any("as a whole" in m for m in messages)


class RootState(TreeLSTM):
    """The root's ``(h, c)``, or with ``nodes``, the states of the first and last node: several results of
    one shape per sample."""

    def __init__(self, features: int, nodes: bool = False):
        super().__init__(features, hidden=4)
        self.nodes = nodes

    def forward(self, children, x):
        states = [None] * len(children)
        for v in reversed(range(len(children))):
            states[v] = self.node(x[v], [states[c] for c in children[v]])
        return (states[0][0], states[-1][0]) if self.nodes else states[0]


@pytest.mark.parametrize("nodes", [False, True])
def test_several_results_of_one_shape_are_each_a_result(nodes):
    data = dataset("treelstm", 10, features=4, dtype=torch.float64)
    model = RootState(4, nodes).double()
    batched = dynamo_relational.batch(model)
    batched(data)
    for batch in (data[::-1], data[2:5]):
        assert_batches_match_eager(batched, model, batch)
    assert batched.report.unbatched == 0 and batched.report.groupings == 1


class WordTree(nn.Module):
    """A recursive net over a tree whose nodes are words: ``(children, token ids)``, each node's word embedded."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 4, dtype=torch.float64)
        self.W, self.U = nn.Linear(4, 5, dtype=torch.float64), nn.Linear(5, 5, dtype=torch.float64)

    def forward(self, children, tokens):
        h = [None] * len(children)
        for v in reversed(range(len(children))):
            own = self.W(self.emb(tokens[v]))
            h[v] = torch.tanh(own + self.U(sum(h[c] for c in children[v])) if children[v] else own)
        return h[0]


def test_samples_of_token_ids_embed_each_node_in_the_union():
    generator = torch.Generator().manual_seed(0)
    data = [(children, torch.randint(0, 30, (len(children),), generator=generator))
            for children, _ in dataset("treernn", 10, features=1)]
    model = WordTree()
    batched = dynamo_relational.batch(model)
    batched(data)
    for batch in (data[::-1], data[2:6]):
        assert_batches_match_eager(batched, model, batch)
    assert batched.report.unbatched == 0 and batched.report.groupings == 1


class EdgeIndexGCN(nn.Module):
    """Per-molecule code that reads its bonds from an ``edge_index`` tensor, as PyG's ``Data`` holds them."""

    def __init__(self, features: int = 4, hidden: int = 5):
        super().__init__()
        self.lin, self.out = nn.Linear(features, hidden), nn.Linear(hidden, 1)

    def forward(self, x, edge_index):
        h = [self.lin(x[v]) for v in range(x.shape[0])]
        total = list(h)
        for u, v in edge_index.t().tolist():
            total[v] = total[v] + h[u]
        return self.out(torch.relu(torch.stack(total))).sum()


class MaskedNeighboursGCN(EdgeIndexGCN):
    """Each node's in-neighbours found with a mask of ``edge_index``, each row read as ``x[u]`` for a tensor ``u``."""

    def forward(self, x, edge_index):
        total = [self.lin(x[v]) + sum((self.lin(x[u]) for u in edge_index[0][edge_index[1] == v]),
                                      torch.zeros_like(self.lin.bias)) for v in range(x.shape[0])]
        return self.out(torch.relu(torch.stack(total))).sum()


def _with_edge_index(in_nbrs, x):
    return x, torch.tensor([[u, v] for v, nbrs in enumerate(in_nbrs) for u in nbrs]).reshape(-1, 2).t().contiguous()


@pytest.mark.parametrize("model_type", [EdgeIndexGCN, MaskedNeighboursGCN])
def test_an_integer_tensor_that_forward_reads_is_structure_compared_by_its_values(model_type):
    torch.manual_seed(0)
    data = [_with_edge_index(*sample) for sample in dataset("gcn", 12, features=4, dtype=torch.float64)]
    model = model_type().double()
    batched = dynamo_relational.batch(model)
    assert_batches_match_eager(batched, model, data[:6], through_union=False)
    batched(data[6:])
    for batch in (data[::-2], data[1::2], data[3:7]):
        assert_batches_match_eager(batched, model, batch)
    assert batched.report.structures == 12 and batched.report.unbatched == 0
    x, edge_index = data[0]
    edge_index[0] = edge_index[0].flip(0)   # changed in place: traced again, never run stale
    assert_batches_match_eager(batched, model, data[:2], through_union=False)
    assert batched.report.structures == 13


def test_the_trace_that_finds_an_integer_tensor_read_leaves_the_random_state_and_buffers_as_eager_does():
    class Noisy(EdgeIndexGCN):
        def __init__(self):
            super().__init__()
            self.drop, self.norm = nn.Dropout(0.5), nn.BatchNorm1d(4)

        def forward(self, x, edge_index):
            return super().forward(self.drop(self.norm(x)), edge_index)

    data = [_with_edge_index(*sample) for sample in dataset("gcn", 3, features=4, dtype=torch.float64)]
    model = Noisy().double()
    twin = copy.deepcopy(model)
    torch.manual_seed(5)
    got = dynamo_relational.batch(model)(data)
    torch.manual_seed(5)
    torch.testing.assert_close(got, [twin(*sample) for sample in data], rtol=0, atol=0)
    torch.testing.assert_close(model.norm.running_mean, twin.norm.running_mean, rtol=0, atol=0)


def test_a_sample_whose_float_values_forward_reads_is_refused_with_the_sample_named():
    class Branching(TreeRNN):
        def forward(self, children, x):
            return super().forward(children, x if x.sum() > -1e9 else -x)

    data = dataset("treernn", 2, features=3)
    with pytest.raises(FrontendError, match=r"sample 0: data-dependent control flow at .*test_batching.py"):
        dynamo_relational.batch(Branching(3, hidden=4))(data)


def test_a_sample_forward_cannot_take_is_named_with_forwards_arguments_and_the_module_still_works():
    torch.manual_seed(0)
    data = dataset("treernn", 3, features=3, dtype=torch.float64)
    model = TreeRNN(3, hidden=4).double()
    batched = dynamo_relational.batch(model, progress=False)
    with pytest.raises(FrontendError, match=r"sample 1: TreeRNN.forward\(children, x\) cannot take the sample's 1 "
                                            r"argument\(s\) \(list\): missing a required argument: 'x'"):
        batched([data[0], (data[1][0],)])
    with pytest.raises(FrontendError, match=r"sample 0: .* cannot take the sample's 1 argument\(s\) \(list\)"):
        batched(data[0])   # one sample, not a list of them: its first item is taken for a sample
    assert batched.report.structures == 1   # (sample 0 of the first call was traced before sample 1 failed)
    assert_batches_match_eager(batched, model, data, through_union=False)   # traces the others
    assert_batches_match_eager(batched, model, data)
    assert batched.report.groupings == 1


def test_a_forward_pre_hook_may_supply_the_arguments_a_sample_lacks():
    torch.manual_seed(0)
    data = dataset("treernn", 3, features=3, dtype=torch.float64)
    model = TreeRNN(3, hidden=4).double()
    model.register_forward_pre_hook(
        lambda module, args: (args[0], torch.ones(len(args[0]), 3, dtype=torch.float64)) if len(args) == 1 else None)
    batched = dynamo_relational.batch(model, progress=False)
    for _ in range(2):
        outputs = batched([(children,) for children, _ in data])
        for out, (children, x) in zip(outputs, data):
            torch.testing.assert_close(out, model(children, torch.ones_like(x)))


class MaxOfChildren(TreeRNN):
    """Children pooled by ``torch.stack(states).max(0).values``: a max along each node's own rows."""

    def forward(self, children, x):
        h = [None] * len(children)
        for v in reversed(range(len(children))):
            own = self.W(x[v])
            pooled = torch.stack([h[c] for c in children[v]]).max(0).values if children[v] else None
            h[v] = torch.tanh(own + self.U(pooled) if pooled is not None else own)
        return h[0]


def test_child_sums_batch_where_torch_lists_overloads_the_arguments_alone_cannot_tell_apart(monkeypatch):
    """``sum(h, (1,), True)`` matches both ``sum.dim_IntList`` and ``sum.dim_DimnameList`` by its arguments (as
    torch 2.11 lists the overloads): the types of the arguments tell which one reduces over dim 1."""
    import typing
    from torch.fx import operator_schemas

    listed = operator_schemas.get_signature_for_torch_op

    def with_named_dims(op, return_schemas=False):
        signatures = listed(op)
        if op is torch.sum:
            first = signatures[0]
            names = typing.Optional[typing.List[str]]
            params = [p.replace(annotation=names) if p.name == "dim" else p for p in first.parameters.values()]
            signatures = [*signatures, first.replace(parameters=params)]
        return signatures

    monkeypatch.setattr(operator_schemas, "get_signature_for_torch_op", with_named_dims)
    data, model, batched = traced_per_sample("childsum", 8)
    assert_batches_match_eager(batched, model, data[::-1])
    assert batched.report.unbatched == 0, batched.report.unbatched_reason


def test_a_max_over_each_nodes_children_batches():
    data = dataset("treernn", 10, features=4, dtype=torch.float64)
    model = MaxOfChildren(4, hidden=5).double()
    batched = dynamo_relational.batch(model)
    batched(data)
    assert_batches_match_eager(batched, model, data[::-1])
    assert batched.report.unbatched == 0, batched.report.unbatched_reason


def test_a_model_that_mixes_samples_rows_runs_one_by_one_with_the_reason_logged():
    class WholeInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, n, x):
            return self.lin(x.cumsum(0)[-1]) * n   # prefix sums down its rows: over all samples', they would mix

    model = WholeInput().double()
    batched = dynamo_relational.batch(model)
    batch = [(2, torch.randn(4, 3, dtype=torch.float64)), (3, torch.randn(2, 3, dtype=torch.float64))]
    batched(batch)
    with warnings_logged() as messages:
        assert_batches_match_eager(batched, model, batch, through_union=False)
    assert batched.report.unbatched == 1
    assert any("one by one" in m for m in messages), messages
    tried = batched.report.grouping_seconds
    assert_batches_match_eager(batched, model, batch[::-1], through_union=False)
    assert batched.report.grouping_seconds == tried and batched.report.unbatched == 2   # not grouped again


def test_samples_may_return_structured_results_with_constants():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, nbrs, x):
            hs = [torch.relu(sum(self.lin(x[u]) for u in n)) for n in nbrs]
            return {"root": hs[0], "about": (len(nbrs), "tree")}

    model = Pair().double()
    batched = dynamo_relational.batch(model)
    batch = [([[0, 1], [1]], torch.randn(2, 3, dtype=torch.float64)),
             ([[0], [0, 2], [1, 2]], torch.randn(3, 3, dtype=torch.float64))]
    batched(batch)
    got = batched(batch)
    assert batched.report.eager_samples == 2 and batched.report.groupings == 1
    want = [model(*s) for s in batch]
    for g, w in zip(got, want):
        assert g.keys() == w.keys() and g["about"] == w["about"]
        torch.testing.assert_close(g["root"], w["root"], **BATCH_TOLERANCE)


class _Normed(nn.Module):
    """A TreeRNN over batch-normalized features (whose buffer updates keep a sample's order: the samples run
    one by one), counting its calls; optionally with dropout, scaled by a number drawn outside the graph, or
    written into a tensor made from Python values and read back from it."""

    def __init__(self, dropout: float = 0.0, noise: bool = False, written: bool = False):
        super().__init__()
        self.norm, self.rnn = nn.BatchNorm1d(3), TreeRNN(3, hidden=4)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        self.noise, self.written = noise, written
        self.calls: list = []

    def forward(self, children, x):
        self.calls.append(len(children))
        h = self.drop(self.rnn(children, self.norm(x)))
        if self.written:   # (the read of `out` runs on its untraced value while tracing)
            out = torch.zeros(2, *h.shape, dtype=h.dtype)
            out[1] = h
            h = out.sum(0)
        return h * torch.rand((), dtype=h.dtype) if self.noise else h   # (a draw without a traced argument)


def test_tracing_a_new_structure_is_its_samples_call():
    """With gradients on, a new structure's trace computes its sample's result from the model's own tensors:
    forward runs once per sample, buffers are updated once, and gradients reach the parameters as in eager."""
    torch.manual_seed(0)
    model = _Normed().double()
    twin = copy.deepcopy(model)
    batch = dataset("treernn", 4, features=3, dtype=torch.float64)
    got, want = dynamo_relational.batch(model)(batch), [twin(*s) for s in batch]
    assert len(model.calls) == len(batch)
    torch.testing.assert_close(got, want, **BATCH_TOLERANCE)
    torch.testing.assert_close(model.norm.running_mean, twin.norm.running_mean, rtol=0, atol=0)
    assert model.norm.num_batches_tracked == twin.norm.num_batches_tracked == len(batch)
    sum(g.sum() for g in got).backward()
    sum(w.sum() for w in want).backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **BATCH_TOLERANCE)


@pytest.mark.parametrize("case", ["dropout", "drawn_outside_the_graph", "written_into_a_factory"])
def test_a_trace_that_cannot_stand_for_the_call_is_undone_and_the_sample_runs_eagerly(case):
    """Tracing computes random ops without drawing, and traces again to record a random op called without a
    traced argument (setting the generators back), or a factory whose tensor a traced value is written into
    (whose later reads ran on its untraced value): the first trace's values are not eager's. The sample then
    runs with the model itself, after the buffers the trace updated are put back: one update, eager's draws."""
    torch.manual_seed(0)
    model = {"dropout": _Normed(dropout=0.5), "drawn_outside_the_graph": _Normed(noise=True),
             "written_into_a_factory": _Normed(written=True)}[case].double()
    twin = copy.deepcopy(model)
    batch = dataset("treernn", 4, features=3, dtype=torch.float64)
    batched = dynamo_relational.batch(model)
    torch.manual_seed(1)
    got = batched(batch)
    drawn = torch.get_rng_state()
    torch.manual_seed(1)
    want = [twin(*s) for s in batch]
    assert torch.equal(drawn, torch.get_rng_state())
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(model.norm.running_var, twin.norm.running_var, rtol=0, atol=0)
    assert model.norm.num_batches_tracked == len(batch)


def test_a_model_that_keeps_traced_values_in_its_list_runs_with_the_model_as_eager():
    """A traced value appended to the model's list is refused after the recorded call, which is undone (its
    buffer updates too): the model's own call runs instead, once per sample, as eager's."""
    class Storing(_Normed):
        def forward(self, children, x):
            h = super().forward(children, x)
            self.history.append(h)
            return h

    model = Storing().double()
    model.history = []
    twin = copy.deepcopy(model)
    data = dataset("treernn", 3, features=3, dtype=torch.float64)
    batched = dynamo_relational.batch(model, progress=False)
    for batch in (data, data[::-1]):
        torch.testing.assert_close(batched(batch), [twin(*sample) for sample in batch], rtol=0, atol=0)
    torch.testing.assert_close(model.history, twin.history, rtol=0, atol=0)
    torch.testing.assert_close(model.norm.running_mean, twin.norm.running_mean, rtol=0, atol=0)
    assert model.norm.num_batches_tracked == 2 * len(data) and model.calls == twin.calls
    assert "stores a traced value in Storing.history" in batched.report.unbatched_reason


def test_switching_to_eval_traces_again():
    class Dropping(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = TreeRNN(3, hidden=4)
            self.drop = nn.Dropout(0.5)

        def forward(self, children, x):
            return self.drop(self.rnn(children, x))

    model = Dropping().double().eval()
    batched = dynamo_relational.batch(model)
    batch = [([[1], []], torch.randn(2, 3, dtype=torch.float64))]
    batched(batch)
    assert_batches_match_eager(batched, model, batch)
    model.train()
    model.eval()
    assert_batches_match_eager(batched, model, batch)
    assert batched.report.structures == 1


def test_bad_batches_are_refused_with_the_sample_named():
    batched = dynamo_relational.batch(TreeRNN(3, hidden=4))
    with pytest.raises(FrontendError, match="list of samples"):
        batched(torch.zeros(3))
    with pytest.raises(FrontendError, match=r"sample 1: the structure at argument 0\[0\]"):
        batched([([[1], []], torch.randn(2, 3)), ([{1}, []], torch.randn(2, 3))])
    assert batched([]) == []


def test_the_tracing_patches_are_installed_once_for_the_samples_the_tracer_traces(monkeypatch):
    """A batch whose new samples are all recorded installs no patches; the samples whose recording gives up
    (a number drawn without a traced argument) are traced by the tracer under one installation."""
    installed = []
    install = tracing_patches._installed

    def counted():
        installed.append(nn.Module.__getattr__)
        return install()

    monkeypatch.setattr(tracing_patches, "_installed", counted)
    recorded = dataset("treernn", 3, features=3, dtype=torch.float64)
    dynamo_relational.batch(TreeRNN(3, hidden=4).double())(recorded)
    assert installed == []
    dynamo_relational.batch(_Normed(noise=True).double())(recorded)
    assert len(installed) == 1
    assert nn.Module.__getattr__ is installed[0]   # undone after the batch


def test_the_tracing_patches_serve_every_trace_of_a_batch_and_are_undone_after_it():
    """The patches are installed once for a batch's new samples: a later sample's trace still refuses
    ``generator=`` (its call ran: its structure runs with the model), and afterwards nothing is left patched."""
    class OwnGenerator(TreeRNN):
        def forward(self, children, x):
            if len(children) == 3:
                x = x + torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
            return super().forward(children, x)

    originals = (nn.Module.__getattr__, nn.Module.__setattr__, torch.autograd.Function.apply, torch.randn)
    batched = dynamo_relational.batch(OwnGenerator(3, hidden=4))
    samples = [([[1], []], torch.randn(2, 3)), ([[1, 2], [], []], torch.randn(3, 3))]
    batched(samples)
    assert "random op `randn` with an explicit torch.Generator" in batched.report.unbatched_reason
    assert (nn.Module.__getattr__, nn.Module.__setattr__, torch.autograd.Function.apply, torch.randn) == originals
    torch.randn(2, generator=torch.Generator().manual_seed(0))   # outside a trace, generators are fine


def test_samples_whose_tensors_differ_in_dtype_keep_their_dtypes():
    class Sums(nn.Module):
        def forward(self, children, x):
            return torch.tanh(torch.stack([sum((x[c] for c in cs), x[v]) for v, cs in enumerate(children)]))

    batched = dynamo_relational.batch(Sums())
    batch = [([[1], []], torch.randn(2, 3)), ([[1], []], torch.randn(2, 3, dtype=torch.float64))]
    batched(batch)
    got = batched(batch)
    for g, sample in zip(got, batch):
        assert g.dtype == sample[1].dtype
        torch.testing.assert_close(g, Sums()(*sample))
    assert batched.report.unbatched == 1 and "dtypes" in batched.report.unbatched_reason


def test_new_structures_run_eagerly_until_they_come_back_then_all_are_grouped_once():
    torch.manual_seed(2)
    data = dataset("treernn", 12, features=4, dtype=torch.float64)
    model = TreeRNN(4, hidden=5).double()
    batched = dynamo_relational.batch(model)
    assert_batches_match_eager(batched, model, data[:6], through_union=False)
    assert_batches_match_eager(batched, model, data[6:], through_union=False)
    assert batched.report.groupings == 0 and batched.report.eager_samples == 12
    # known structures come back: all are grouped, and samples of known and new structures share a batch
    assert_batches_match_eager(batched, model, data[3:9])
    assert batched.report.groupings == 1
    new = dataset("treernn", 2, features=4, dtype=torch.float64, seed=5)
    assert_batches_match_eager(batched, model, data[:4] + new, through_union=False)
    assert batched.report.eager_samples == 14 and batched.report.groupings == 1


def test_fingerprints_are_equal_exactly_for_equal_structures():
    from dynamo_relational.batching import fingerprint

    x = torch.zeros(2, 3)
    structures = [[[1, 2], []], [[1, 2], []], [(1, 2), ()], ([1, 2], []), [[1, 2], [0]], [[1, True], []],
                  [[1, 2], [[]]], [[], []], [], [[1, 2], ()], [1, 2], [[1], [2]]]
    keys = [fingerprint((s, x))[0] for s in structures]
    for i, a in enumerate(structures):
        for j, b in enumerate(structures):
            same = type(a) is type(b) and repr(a) == repr(b)
            assert (keys[i] == keys[j]) == same, (a, b)
    assert fingerprint(([[1]], torch.zeros(2, 3)))[0] != fingerprint(([[1]], torch.zeros(3, 3)))[0]
    # another mapping than a dict is an object: its items are structure, or inputs
    ordered = [collections.OrderedDict(children=c) for c in ([[1], []], [[1, 2], [], []], [[1], []])]
    assert [fingerprint((o, x))[0] for o in ordered].count(fingerprint((ordered[0], x))[0]) == 2
    assert fingerprint((collections.OrderedDict(x=x),))[1][0] is x   # (an input, as a tensor an object holds)
    # so are other subclasses of lists, tuples and atoms, and enum members: their items or values are compared
    class Children(list):
        pass

    class NodeId(int):
        pass

    class Color(enum.Enum):
        RED, BLUE = 1, 2

    pair = collections.namedtuple("Pair", "a b")
    for a, b in [(Children([[1], []]), Children([[1, 2], []])), (NodeId(1), NodeId(2)), (pair([1], []), pair([], [1])),
                 (Color.RED, Color.BLUE)]:
        assert fingerprint((a,))[0] == fingerprint((copy.copy(a),))[0] != fingerprint((b,))[0], (a, b)


def test_tensors_that_objects_hold_are_inputs_and_a_pyg_data_sample_batches():
    data_module = pytest.importorskip("torch_geometric.data")

    class PerGraph(EdgeIndexGCN):   # forward(data), as PyG code is written
        def forward(self, data):
            h = [self.lin(data.x[v]) for v in range(data.num_nodes)]   # (num_nodes reads x: a tensor, not a proxy)
            total = list(h)
            for u, v in data.edge_index.t().tolist():
                total[v] = total[v] + h[u]
            return self.out(torch.relu(torch.stack(total))).sum()

    torch.manual_seed(0)
    data = [data_module.Data(x=x, edge_index=edge_index)
            for x, edge_index in (_with_edge_index(*sample) for sample in dataset("gcn", 8, features=4,
                                                                                  dtype=torch.float64))]
    model = PerGraph().double()
    batched = dynamo_relational.batch(model)
    batched(data)
    for batch in (data[::-1], data[1:5]):   # (the graphs' x are inputs: other values, same structures)
        batch = [data_module.Data(x=torch.randn_like(d.x), edge_index=d.edge_index) for d in batch]
        got, want = batched(batch), [model(d) for d in batch]
        torch.testing.assert_close(got, want, **BATCH_TOLERANCE)
        gradients = [torch.autograd.grad(sum(y.sum() for y in ys), list(model.parameters())) for ys in (got, want)]
        torch.testing.assert_close(*gradients, **BATCH_TOLERANCE)
    report = batched.report
    assert (report.structures, report.eager_samples, report.unbatched, report.groupings) == (8, 8, 0, 1)
    # key= names the structure; the tensors are found and substituted alike
    keyed = dynamo_relational.batch(model, key=lambda d: (d.num_nodes, tuple(d.edge_index.flatten().tolist())))
    keyed(data)
    batch = [data_module.Data(x=torch.randn_like(d.x), edge_index=d.edge_index) for d in data[2:6]]
    torch.testing.assert_close(keyed(batch), [model(d) for d in batch], **BATCH_TOLERANCE)
    assert (keyed.report.structures, keyed.report.eager_samples) == (8, 8)


def test_options_disable_passes_and_a_failing_optimizer_pass_leaves_the_union_as_it_was(monkeypatch):
    """``disable`` reaches the union's passes; an optimizer pass that fails on the union is skipped with a
    warning, and the batches still equal eager."""
    import dataclasses

    import dynamo_relational.batching as batching

    adds_of_gathers = {}
    for disable in ((), ("pair_sums",)):
        data, model, batched = traced_per_sample("treelstm", 6, disable=disable)
        assert_batches_match_eager(batched, model, data)
        adds_of_gathers[disable] = any(n.target is torch.add and n.args[0].target in (torch.index_select, getitem)
                                       for n in batched._cache.unions[0].plan.graph.graph.nodes)
    assert adds_of_gathers == {(): True, ("pair_sums",): False}

    def broken(gm, ctx):
        next(n for n in gm.graph.nodes if n.op == "call_function").args = ()   # damaged, then failed
        raise RuntimeError("broken pass")

    steps = tuple(dataclasses.replace(p, run=broken) if p.name == "pair_sums" else p for p in batching.UNION_PASSES)
    monkeypatch.setattr(batching, "UNION_PASSES", steps)
    data, model, batched = traced_per_sample("treelstm", 6)
    with warnings_logged() as logged:
        assert_batches_match_eager(batched, model, data[::-1])
    assert any("pair_sums failed" in message for message in logged)


class _InPlaceActivations(nn.Module):
    """Per-node activations written in place, as much per-node code is: ``nn.ReLU(inplace=True)``,
    ``F.relu(h, inplace=True)``, ``k.tanh_()`` without rebinding ``k``, two writes in a row; ``view`` also
    reads a view taken before the last write (which sees it)."""

    def __init__(self, view: bool = False):
        super().__init__()
        self.lin, self.act, self.view = nn.Linear(3, 3, dtype=torch.float64), nn.ReLU(inplace=True), view

    def forward(self, x):
        out = []
        for v in range(x.shape[0]):
            h = self.act(self.lin(x[v]))
            g = torch.nn.functional.relu(self.lin(h), inplace=True)
            k = (g * 2).add_(1)
            first = k[:2] if self.view else None
            k.tanh_()
            out.append(h + k + (first.sum() if first is not None else 0))
        return torch.stack(out)


@pytest.mark.parametrize("view", [False, True], ids=["fresh", "view read after the write"])
def test_activations_written_in_place_group_in_a_union(view):
    """A write into a value that nothing else reads becomes a pure op, so the samples group (the recording
    reads the written tensor through the write, as fx's proxies do); a view read after the write keeps the
    sample's order, and its samples run one by one."""
    assert assert_rows_batch_as_eager(_InPlaceActivations(view), through_union=not view).report.groupings == \
        (0 if view else 1)


class _WritesInPlaceWhenOdd(nn.Module):
    """Samples ``(n, x)``: odd ``n`` write into a value read before the write, which keeps the sample's order
    (its structure cannot join a union)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3, dtype=torch.float64)

    def forward(self, n, x):
        h = self.lin(x[0])
        if n % 2:
            before = h * 2
            h.add_(1)
            return before + h
        return torch.tanh(h)


def test_structures_refused_on_their_own_run_with_the_model_beside_a_union_of_the_others():
    model = _WritesInPlaceWhenOdd()
    samples = [(n, torch.randn(2, 3, dtype=torch.float64)) for n in range(6)]
    batched = dynamo_relational.batch(model, progress=False)
    assert_batches_match_eager(batched, model, samples, through_union=False)   # traced: the model's calls
    assert_batches_match_eager(batched, model, samples, through_union=False)   # the others grouped
    assert batched.report.groupings == 1 and batched.report.eager_samples == 3, batched.report
    assert "keeps its order" in batched.report.unbatched_reason
    assert_batches_match_eager(batched, model, samples[::2])   # (the even ones: all from the union)


class _NormedNodes(nn.Module):
    """``nn.LayerNorm`` per node; ``whole`` also normalizes the stack of all nodes' states (across rows)."""

    def __init__(self, whole: bool = False):
        super().__init__()
        self.lin, self.norm = nn.Linear(3, 3, dtype=torch.float64), nn.LayerNorm(3, dtype=torch.float64)
        self.whole = whole

    def forward(self, x):
        h = torch.stack([torch.tanh(self.norm(self.lin(x[v]))) for v in range(x.shape[0])])
        return torch.nn.functional.layer_norm(h, h.shape) if self.whole else h


@pytest.mark.parametrize("whole", [False, True], ids=["per node", "across rows"])
def test_a_layer_norm_of_each_row_is_restricted_to_a_batch(whole):
    """Each row normalized over its own elements keeps the samples' rows; a norm across the rows of a sample's
    stack would mix them: its samples run one by one."""
    assert_rows_batch_as_eager(_NormedNodes(whole), through_union=not whole)


class _EinsumScores(nn.Module):
    """Per node ``einsum``: a shared matrix applied to a row, a bilinear score of two rows; ``pairwise`` also
    scores every pair of a sample's rows (across rows)."""

    def __init__(self, pairwise: bool = False):
        super().__init__()
        self.W, self.pairwise = nn.Parameter(torch.randn(3, 3, dtype=torch.float64)), pairwise

    def forward(self, x):
        out = []
        for v in range(x.shape[0]):
            h = torch.tanh(torch.einsum("ij,j->i", self.W, x[v]))
            out.append(h * torch.einsum("i,ij,j->", h, self.W, x[v]))
        out = torch.stack(out)
        return torch.einsum("ij,kj->ik", out, out).sum(1) if self.pairwise else out


@pytest.mark.parametrize("pairwise", [False, True], ids=["per node", "across rows"])
def test_an_einsum_of_each_row_is_restricted_to_a_batch(pairwise):
    """An einsum whose rows operands and result share their first subscript, which no other operand has,
    keeps the samples' rows; one that contracts across a sample's rows runs its samples one by one."""
    assert_rows_batch_as_eager(_EinsumScores(pairwise), through_union=not pairwise)


class _RowParts(nn.Module):
    """Each node's row cut into parts (slices, ``chunk``) that are joined again in another order along the
    row's one dimension, as gated per-node code does; ``across`` also joins the rows of all nodes into one."""

    def __init__(self, across: bool = False):
        super().__init__()
        self.lin, self.across = nn.Linear(4, 4, dtype=torch.float64), across

    def forward(self, x):
        out = []
        for v in range(x.shape[0]):
            h = self.lin(torch.cat([x[v][2:], x[v][:2]]))
            a, b = h.chunk(2)
            out.append(torch.cat([a * torch.sigmoid(b), b]))
        return torch.cat(out).reshape(2, -1) if self.across else torch.stack(out)


@pytest.mark.parametrize("across", [False, True], ids=["per node", "across rows"])
def test_a_rows_parts_joined_along_its_dimension_are_restricted_to_a_batch(across):
    """The parts of each row, joined along the row's dimension, are grouped as rows joined along dim 0 and
    merged in blocks by a reshape: each block is one node's, so the samples' rows stay theirs; a reshape that
    merges rows of several nodes into rows of another size (``across``) runs the samples one by one."""
    assert_rows_batch_as_eager(_RowParts(across), width=4, through_union=not across)


class _NodeDictGNN(nn.Module):
    """Message passing over a dict of in-neighbour lists keyed by node names, each node's features and 0-d
    weight given as dicts of tensors (two kinds of tensor arguments); returns a dict of results."""

    def __init__(self):
        super().__init__()
        self.lin, self.out = nn.Linear(3, 3, dtype=torch.float64), nn.Linear(3, 2, dtype=torch.float64)

    def forward(self, in_nbrs, features, weights):
        h = {v: torch.relu(self.lin(features[v])) * weights[v] for v in in_nbrs}
        h = {v: torch.relu(self.lin(h[v] + sum(h[u] for u in in_nbrs[v]))) for v in in_nbrs}
        return {"graph": self.out(torch.stack(list(h.values())).sum(0)), "nodes": torch.stack([h[v] for v in in_nbrs])}


def test_samples_holding_a_tensor_per_node_batch_as_rows_of_their_kind():
    """Trees whose nodes hold their own vectors, and graphs whose features are dicts of per-node tensors, take
    as many tensor arguments as they have nodes: packed by kind (shape, dtype, device), each kind's tensors of
    all samples are rows of one input of the union, as a feature matrix's rows are; gradients reach each."""
    torch.manual_seed(0)
    trees = [(vector_tree(children, x),) for children, x in dataset("treernn", 8, features=3, dtype=torch.float64)]
    generator = torch.Generator().manual_seed(0)
    graphs = []
    for n in (3, 5, 2, 4, 3, 6):
        names = [f"atom{v}" for v in range(n)]
        graphs.append(({v: [names[(i + 1) % n]] for i, v in enumerate(names)},
                       {v: torch.randn(3, dtype=torch.float64, generator=generator).requires_grad_() for v in names},
                       {v: torch.rand((), dtype=torch.float64, generator=generator).requires_grad_() for v in names}))
    for model, samples in ((VectorTreeRNN(), trees), (_NodeDictGNN(), graphs)):
        batched = assert_shuffled_batches_match_eager(model, samples)
        assert batched.report.groupings == 1, batched.report
        leaves = [t for sample in samples for t in _tensors_in(sample)]
        got, want = batched(samples), [model(*sample) for sample in samples]
        weights = [torch.randn_like(w) for w in pytree.tree_leaves(want)]
        got_grads, want_grads = (torch.autograd.grad(sum((r * w).sum() for r, w in zip(pytree.tree_leaves(results),
                                                                                          weights)), leaves)
                                 for results in (got, want))
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, **BATCH_TOLERANCE)


def _tensors_in(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, VectorNode):
        return [value.vec] + _tensors_in(value.children)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return [t for item in items for t in _tensors_in(item)]


def test_samples_returning_a_tensor_per_node_batch_as_rows_of_their_kind():
    """Results of other structures (a list of every node's state, as per-node code collects them) are packed by
    kind: each kind's tensors of all samples are rows of one output of the union, and each sample gets back its
    own list."""
    torch.manual_seed(0)
    batched = assert_shuffled_batches_match_eager(EveryNodesState(), dataset("treernn", 8, features=3,
                                                                              dtype=torch.float64))
    assert batched.report.groupings == 1, batched.report


def test_samples_lacking_a_kind_of_tensor_argument_run_one_by_one():
    """A sample without a tensor of one kind (a tree of one node has no children's weights) joins no packing:
    the batch runs its samples one by one, saying why."""
    class Weighted(nn.Module):
        def forward(self, vecs, edge_weights):
            return sum(vecs) * (1 + sum(edge_weights))

    samples = [([torch.randn(2) for _ in range(n)], [torch.rand(()) for _ in range(n - 1)]) for n in (3, 1, 2)]
    batched = dynamo_relational.batch(Weighted(), progress=False)
    batched(samples)
    batched(samples)
    assert batched.report.unbatched == 1 and "different numbers of tensor arguments" in batched.report.unbatched_reason


def test_tree_objects_whose_nodes_hold_their_states_batch_as_eager():
    """Per-node code that stores each node's state on the sample's tree (``tree.state``) runs its traces, and
    the calls of samples whose structure is traced but not grouped yet (here: the samples given twice), on a
    copy of the tree: the sample's structure stays as it was, and later batches run from the union."""
    torch.manual_seed(0)
    trees = [(object_tree(children), x) for children, x in dataset("childsum", 8, features=4, dtype=torch.float64)]
    model = ObjectChildSumTreeLSTM(4, hidden=3).double()
    batched = dynamo_relational.batch(model, progress=False)
    assert_batches_match_eager(batched, model, trees + trees[:2], through_union=False)
    assert_batches_match_eager(batched, model, trees[::-1])
    assert_batches_match_eager(batched, model, trees[2:5])
    report = batched.report
    assert report.structures == len(trees) and report.unbatched == 0 and report.groupings == 1, report
    assert not any(hasattr(tree, "state") for tree, _ in trees)   # (what forward stores stays on the copies)


class _WordTreeRNN(nn.Module):
    """A recursive net over a parse tree whose words are Python ints, as older per-node code writes it: a leaf's
    vector looked up with ``emb(torch.LongTensor([word]))``, an inner node's from its children's joined along
    dim 1; every node's projection is an output."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, dtype=torch.float64)
        self.W, self.proj = nn.Linear(8, 4, dtype=torch.float64), nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, children, words):
        outputs = []

        def node(v):
            if not children[v]:
                h = self.emb(torch.LongTensor([words[v]]))
            else:
                h = torch.tanh(self.W(torch.cat((node(children[v][0]), node(children[v][-1])), 1)))
            outputs.append(self.proj(h))
            return h

        node(0)
        return torch.cat(outputs)


def test_trees_of_words_given_as_python_ints_batch_as_eager():
    """A sample without tensors: each trace's constants (the words' index tensors) are its own, and the union
    reads them as constant indices (the lookups group into one gather of the table's rows)."""
    torch.manual_seed(0)
    trees = [(children, [(3 * v + len(children)) % 10 for v in range(len(children))])
             for children, _ in dataset("treernn", 8)]
    model = _WordTreeRNN()
    batched = dynamo_relational.batch(model, progress=False)
    assert_batches_match_eager(batched, model, trees, through_union=False)
    assert_batches_match_eager(batched, model, trees[::-1])
    assert batched.report.unbatched == 0 and batched.report.groupings == 1, batched.report


class _OutputsOnTheModel(_WordTreeRNN):
    """:class:`_WordTreeRNN` collecting its per-node outputs in a list it assigns to the model in forward."""

    def forward(self, children, words):
        self.outputs = []

        def node(v):
            h = self.emb(torch.LongTensor([words[v]])) if not children[v] else torch.tanh(
                self.W(torch.cat((node(children[v][0]), node(children[v][-1])), 1)))
            self.outputs.append(self.proj(h))
            return h

        node(0)
        return torch.cat(self.outputs)


def test_a_list_of_traced_values_assigned_to_the_model_runs_with_the_model():
    """A run from the union would not assign it (an RNTN keeping each node's output on the model): the
    structure runs with the model, which assigns the list of the batch's last sample, as eager's calls do; the
    reason says how to batch it."""
    trees = [(children, [v % 10 for v in range(len(children))]) for children, _ in dataset("treernn", 3)]
    model = _OutputsOnTheModel()
    batched = dynamo_relational.batch(model, progress=False)
    for batch in (trees, trees[::-1]):
        assert_batches_match_eager(batched, model, batch, through_union=False)
        model(*batch[-1])
        kept = model.outputs
        batched(batch)
        torch.testing.assert_close(model.outputs, kept, rtol=0, atol=0)
    report = batched.report
    assert report.structures == len(trees) and report.groupings == 0, report
    assert "stores a traced value in _OutputsOnTheModel.outputs" in report.unbatched_reason
    assert "Collect such values in a local list" in report.unbatched_reason


def test_code_that_fails_on_the_tracers_proxies_and_stores_a_value_runs_with_the_model():
    """Library code that checks for real tensors (``isinstance(x, torch.Tensor)``) fails on the tracer's
    proxies, which trace a call whose recording gave up (here: forward keeps a traced value on the model): the
    model's own call runs, and the reason says what the recording found."""
    class KeepsAValue(nn.Module):
        def forward(self, x):
            if not isinstance(x, torch.Tensor):
                raise ValueError("x must be a tensor")
            self.kept = x * 2
            return x.sum()

    model = KeepsAValue()
    batched = dynamo_relational.batch(model, progress=False)
    samples = [(torch.randn(3),), (torch.randn(4),)]
    for batch in (samples, samples[::-1]):
        assert_batches_match_eager(batched, model, batch, through_union=False)
        torch.testing.assert_close(model.kept, batch[-1][0] * 2)
    assert re.search(r"(?s)ValueError while tracing .*x must be a tensor.*its recording found: forward stored a "
                     r"traced value in the model", batched.report.unbatched_reason), batched.report.unbatched_reason


class _Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def test_a_call_that_runs_but_fails_on_the_tracers_proxies_runs_with_the_model():
    """Where the recording gave up (here: at a custom autograd Function) and library code then fails on the
    tracer's proxies (``x_src, x_dst = x`` unless ``x`` is a real tensor, as in PyG's ``GATConv``), the call
    itself ran as eager's: its result stands, and the samples of that structure run with the model, the reason
    logged."""
    class ChecksForTensors(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2, dtype=torch.float64)

        def forward(self, x):
            h = _Doubled.apply(x)
            x_src, x_dst = (h, x) if isinstance(x, torch.Tensor) else x
            return self.lin(x_src * x_dst).sum(0)

    model = ChecksForTensors()
    batched = dynamo_relational.batch(model, progress=False)
    samples = [(torch.randn(n, 3, dtype=torch.float64),) for n in (3, 4, 3)]
    for _ in range(2):
        assert_batches_match_eager(batched, model, samples, through_union=False)
    reason = batched.report.unbatched_reason
    assert batched.report.unbatched == 2 and "forward cannot be traced" in reason and "unpack" in reason, reason


def test_a_read_of_requires_grad_batches_in_the_gradient_state_it_read():
    """``requires_grad`` read in Python (PyG's aggregations read it on the GPU to pick a kernel) is answered
    while the call is recorded; the union then serves the sample where gradients are on and the same parameters
    and inputs require them, and elsewhere (``no_grad``, a frozen layer) the sample runs with the model. Seen
    first without gradients (where the call is traced, not recorded), the sample runs with the model, and its
    structure is traced again by the first batch with gradients on."""
    class ReadsRequiresGrad(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.out = nn.Linear(3, 4, dtype=torch.float64), nn.Linear(4, 1, dtype=torch.float64)

        def forward(self, x):
            h = self.lin(x)
            h = h.relu() if h.requires_grad else h.tanh()   # (no library does this: the test can fail)
            return self.out(h).sum(0)

    model = ReadsRequiresGrad()
    batched = dynamo_relational.batch(model, progress=False)
    samples = [(torch.randn(n, 3, dtype=torch.float64),) for n in (2, 3, 2, 4)]
    with torch.no_grad():
        torch.testing.assert_close(batched(samples), [model(*s) for s in samples])
    assert "tracing cannot answer" in batched.report.unbatched_reason, batched.report
    assert_batches_match_eager(batched, model, samples, through_union=False)
    assert_batches_match_eager(batched, model, samples[::-1])
    assert batched.report.structures == 3, batched.report
    with torch.no_grad():
        torch.testing.assert_close(batched(samples), [model(*s) for s in samples])
    assert "gradient state" in batched.report.unbatched_reason, batched.report
    model.lin.requires_grad_(False)
    eager = batched.report.eager_samples
    torch.testing.assert_close(batched(samples), [model(*s) for s in samples])
    assert batched.report.eager_samples == eager + len(samples)


def test_a_result_that_cannot_be_traced_runs_with_the_model_and_the_reason_names_the_users_model():
    """The call ran as eager's (its result stands); the samples run with the model, the reason saying why."""
    @dataclasses.dataclass
    class Result:   # (made here: never registered with pytree)
        h: torch.Tensor

    class ReturnsADataclass(nn.Module):
        def forward(self, children, x):
            return Result(x[0] * 2)

    batched = dynamo_relational.batch(ReturnsADataclass(), progress=False)
    samples = dataset("treernn", 2)
    for _ in range(2):
        for got, (children, x) in zip(batched(samples), samples):
            torch.testing.assert_close(got.h, x[0] * 2)
    assert "ReturnsADataclass.forward returns a Result holding tensors" in batched.report.unbatched_reason


class _NumbersPerNode(nn.Module):
    """Per-node code that divides and scales by Python numbers of the node's structure: a mean over the
    in-neighbours written by hand, GCN's ``1 / sqrt(deg(u) deg(v))`` per edge, a bound and a fill value per
    node."""

    def __init__(self, features: int):
        super().__init__()
        self.W, self.U = nn.Linear(features, 4, dtype=torch.float64), nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, neighbours, x):
        degree = [len(n) + 1 for n in neighbours]
        h = [torch.tanh(self.W(x[v])) for v in range(len(neighbours))]
        mean = [h[v] + sum(h[u] for u in neighbours[v]) / max(len(neighbours[v]), 1) for v in range(len(h))]
        normed = [sum((h[u] / (degree[u] * degree[v]) ** 0.5 for u in neighbours[v]), h[v] / degree[v])
                  for v in range(len(h))]
        out = [self.U(mean[v] + normed[v]).clamp(-0.2, 0.1 * degree[v])   # (-0.2: a 0-d tensor beside a column)
               .masked_fill(mean[v] > 0.5, float(degree[v])) for v in range(len(h))]
        return torch.stack(out).sum(0)


def test_numbers_of_each_nodes_structure_are_restricted_to_a_batch():
    """The vectorizer makes a column of such numbers, one row per member: a batch reads the rows of its
    samples (before, the union refused to read such a column as data, and every batch ran one by one)."""
    data = dataset("gcn", 10, dtype=torch.float64)
    assert_shuffled_batches_match_eager(_NumbersPerNode(data[0][1].shape[1]), data)


class _ElementReads(nn.Module):
    """Per-node code that reads an element of a small tensor per node: an ``nn.LSTMCell`` called on ``[1, d]``
    states with its result read as ``h[0]``, a row split by ``reshape(2, -1).unbind(0)``, and a parameter
    indexed by two numbers of the sample's structure (a value of one sample where no other reads it: grouped)."""

    def __init__(self, features: int):
        super().__init__()
        self.W = nn.Linear(features, 4, dtype=torch.float64)
        self.cell = nn.LSTMCell(4, 4, dtype=torch.float64)
        self.P = nn.Parameter(torch.randn(5, 3, 4, dtype=torch.float64))

    def forward(self, neighbours, x):
        h = [torch.tanh(self.W(x[v])) for v in range(len(neighbours))]
        out = []
        for v, around in enumerate(neighbours):
            m = sum(h[u] for u in around) if around else torch.zeros_like(h[v])
            state, _ = self.cell(h[v].unsqueeze(0), (m.unsqueeze(0), m.unsqueeze(0)))
            left, right = state[0].reshape(2, -1).unbind(0)
            out.append(torch.cat([right, left]) * self.P[len(neighbours) % 5, len(around) % 3])
        return torch.stack(out).sum(0)


def test_element_reads_of_each_node_are_restricted_to_a_batch():
    """The vectorizer reads an element of each member as ``rows[(range, i)]`` (``P[(i, j)]`` of a shared
    tensor), with index tensors as the columns: one gather of the rows flattened over the indexed dims, which a
    batch restricts (before, every batch of such a model ran one by one)."""
    data = dataset("gcn", 10, dtype=torch.float64)
    assert_shuffled_batches_match_eager(_ElementReads(data[0][1].shape[1]), data, seed=1)


class _WithTargetAndGlobals(nn.Module):
    """A per-graph model that reads two tensor arguments of one shape as a whole: the graph's global features
    ``u`` (beside every node's state) and its regression target (the loss computed in ``forward``)."""

    def __init__(self, features: int):
        super().__init__()
        self.W, self.G = nn.Linear(features, 4, dtype=torch.float64), nn.Linear(3, 4, dtype=torch.float64)
        self.out = nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, neighbours, x, u, target):
        g = self.G(u)
        h = [torch.tanh(self.W(x[v]) + g) for v in range(len(neighbours))]
        h = [h[v] + sum(h[w] for w in around) for v, around in enumerate(neighbours)]
        prediction = self.out(torch.stack(h).mean(0))
        return prediction, ((prediction - target) ** 2).mean()


def test_tensor_arguments_of_one_shape_read_as_a_whole_are_rows_of_a_stack():
    """A graph's global features and its target, read whole (before, such samples ran one by one: their
    arguments were joined along dim 0, whose rows the union reads one by one)."""
    generator = torch.Generator().manual_seed(0)
    data = [(neighbours, x, torch.randn(3, generator=generator, dtype=torch.float64),
             torch.randn(2, generator=generator, dtype=torch.float64))
            for neighbours, x in dataset("gcn", 10, dtype=torch.float64)]
    assert_shuffled_batches_match_eager(_WithTargetAndGlobals(data[0][1].shape[1]), data, seed=2)


class _OneRowSlices(nn.Module):
    """Per-node code that reads a node's row keeping its dim: ``x[v:v + 1]`` of the features, ``words[v:v + 1]``
    of the word ids (an embedding's ``[1, d]``), a label as ``labels[v:v + 1]`` for a loss."""

    def __init__(self):
        super().__init__()
        self.W, self.E = nn.Linear(4, 3, dtype=torch.float64), nn.Embedding(10, 3, dtype=torch.float64)

    def forward(self, children, x, words):
        h: list = [None] * len(children)
        for v in reversed(range(len(children))):
            own = self.W(x[v:v + 1]) + self.E(words[v:v + 1])
            own = own + F.cross_entropy(own, words[v:v + 1] % 3)
            h[v] = torch.tanh(own + sum(h[c] for c in children[v])) if children[v] else own
        return h[0]


def test_one_row_slices_of_tensor_arguments_are_row_reads():
    """``x[v:v + 1]`` is ``x[v]`` given its dim back: before, such reads made the union read each sample's
    arguments as a whole, and the samples ran one by one."""
    generator = torch.Generator().manual_seed(0)
    data = [(children, x, torch.randint(0, 10, (x.shape[0],), generator=generator))
            for children, x in dataset("treernn", 8, features=4, dtype=torch.float64)]
    assert_shuffled_batches_match_eager(_OneRowSlices(), data)


class _Sequence(nn.Module):
    """A sentence of any length through a recurrent cell, one token per step, from a state made in ``forward``:
    an ``nn.GRUCell`` on one-dimensional states (zeros from ``new_zeros``, or with ``constant_state`` "zeros"
    from ``torch.zeros``, "length" ``torch.full`` of the sentence's length), or an ``nn.LSTMCell`` on ``[1, d]``
    ones read by ``tokens[t:t + 1]``; then a classifier of the last state or of the states' maximum."""

    def __init__(self, cell: str, constant_state: str | None = None):
        super().__init__()
        self.emb, self.out = nn.Embedding(20, 6, dtype=torch.float64), nn.Linear(6, 2, dtype=torch.float64)
        self.cell = (nn.GRUCell if cell == "gru" else nn.LSTMCell)(6, 6, dtype=torch.float64)
        self.constant_state = constant_state

    def forward(self, tokens):
        if isinstance(self.cell, nn.GRUCell):
            zeros = torch.zeros(6, dtype=torch.float64) if self.constant_state == "zeros" else \
                torch.full((6,), tokens.shape[0] / 10, dtype=torch.float64) if self.constant_state == "length" else \
                self.emb.weight.new_zeros(6)
            h, states = zeros, []
            for t in range(tokens.shape[0]):
                h = self.cell(self.emb(tokens[t]), h)
                states.append(h)
            return self.out(torch.stack(states).max(0).values)
        h = c = torch.zeros(1, 6, dtype=torch.float64)
        for t in range(tokens.shape[0]):
            h, c = self.cell(self.emb(tokens[t:t + 1]), (h, c))
        return F.log_softmax(self.out(h), dim=1)


def _sentences():
    generator = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 20, (length,), generator=generator),) for length in (3, 7, 5, 9, 4, 6, 8, 5)]


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_sentences_of_other_lengths_through_a_recurrent_cell_batch(cell):
    """A state that every sample starts from is gathered, a row per member (before, the GRU's was expanded to
    the union's fixed row count, and the union refused it)."""
    assert_shuffled_batches_match_eager(_Sequence(cell), _sentences())


@pytest.mark.parametrize("state", ["zeros", "length"])
def test_a_state_made_with_torch_factories_in_forward_batches(state):
    """A start state made in ``forward`` without a traced value (``torch.zeros(d)``, or ``torch.full`` of the
    sentence's length: a value of its own per sample) is a constant of each sample's trace: the first steps of
    all samples group, each reading its own sample's constant as a row, which a batch keeps for its samples
    (before, the first steps stayed apart by sample and the batches ran one by one)."""
    assert_shuffled_batches_match_eager(_Sequence("gru", constant_state=state), _sentences())


class _TreeGRU(nn.Module):
    """A tree of ``nn.GRUCell`` updates, each node's state from its children's summed, a leaf's from zeros made
    with ``torch.zeros(1, d)``: a group of cells reads some members' states from the samples' constants and
    others' from sums, gathered from both."""

    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(4, 4, dtype=torch.float64)

    def forward(self, children, x):
        h: list = [None] * len(children)
        for v in reversed(range(len(children))):
            state = sum(h[c] for c in children[v]) if children[v] else torch.zeros(1, 4, dtype=torch.float64)
            h[v] = self.cell(x[v:v + 1], state)
        return h[0]


def test_cells_whose_states_come_from_the_samples_constants_and_from_sums_batch():
    assert_shuffled_batches_match_eager(_TreeGRU(), dataset("treernn", 12, features=4, dtype=torch.float64))


class _FeaturesMadeInForward(nn.Module):
    """Per-node features built in ``forward`` from Python data (``torch.tensor([...])``): constants of each
    sample's trace, many of them equal across samples (the same child count)."""

    def __init__(self):
        super().__init__()
        self.W = nn.Linear(3, 4, dtype=torch.float64)

    def forward(self, children, x):
        h: list = [None] * len(children)
        for v in reversed(range(len(children))):
            own = self.W(torch.tensor([float(len(children[v])), 1.0, 0.5], dtype=torch.float64)) + x[v, :4]
            h[v] = torch.tanh(own + sum(h[c] for c in children[v])) if children[v] else own
        return h[0]


def test_features_made_in_forward_from_python_data_batch():
    assert_shuffled_batches_match_eager(_FeaturesMadeInForward(), dataset("treernn", 10, features=4,
                                                                          dtype=torch.float64))
