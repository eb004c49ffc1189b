"""dynamo_relational.cost: the estimates the cost-model passes compare."""
import torch

from dynamo_relational import cost


def test_cpu_flop_rate_scales_with_threads_and_bandwidth_does_not():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cost.rates(torch.device("cpu"))
        torch.set_num_threads(2)
        two = cost.rates(torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    assert two[0] == 2 * one[0] and two[1] == one[1]
    assert cost.rates(torch.device("cuda")) == cost.RATES["cuda"]


def test_estimates_grow_with_the_work_and_add_up():
    small, large = cost.linear(1000, 7, 10, 4), cost.linear(2000, 7, 10, 4)
    assert small.flops == 2 * 1000 * 7 * 10 and large.flops == 2 * small.flops
    assert large.seconds("cpu") > small.seconds("cpu") > 0
    both = small + cost.gather(500, 10, 4)
    assert both.seconds("cpu") > small.seconds("cpu")
    assert cost.gather_reduce(4000, 1000, 10, 4).bytes > cost.gather_reduce(2000, 1000, 10, 4).bytes


def test_graph_cost_reads_each_node_from_its_shapes_and_index():
    import dynamo_relational
    from examples.data import graph_batch
    from examples.sum_product import TransformThenAggregate

    batch = graph_batch("mutagenesis", graphs=2)
    x = torch.randn(batch.x.shape[0], 8)
    compiled = dynamo_relational.compile(TransformThenAggregate(batch, 8, 4), [x], inductor=False, progress=False,
                                         detailed=True, disable=("rewrite_search",))
    gm = compiled.report.graphs[0].graph_module
    by_kind = {}
    for node in gm.graph.nodes:
        by_kind.setdefault(getattr(node.target, "__name__", str(node.target)), []).append(cost.node_cost(gm, node))
    nodes, entries = batch.x.shape[0], batch.x.shape[0] + sum(len(n) for n in batch.in_neighbors())
    assert by_kind["linear"] == [cost.linear(nodes, 8, 4, 4)]                 # x @ W^T, once per node
    assert by_kind["gather_reduce.default"] == [cost.gather_reduce(entries, nodes, 4, 4)]   # one entry per edge
    assert by_kind["tanh"] == [cost.elementwise(nodes, 4, 4)]
    assert all(c == cost.Cost() for c in by_kind.get("reshape", []))          # views are free
    total = cost.graph_cost(gm)
    assert total == sum((c for costs in by_kind.values() for c in costs), cost.Cost())
