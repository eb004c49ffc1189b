"""DistributedDataParallel over models compiled with backend="relational": 2 CPU ranks (gloo)
give the gradients one process computes, and training lowers the loss."""
import torch

from examples.data import graph_batch
from examples.distributed import labels, shard, spawn
from examples.gcn import ScalarGCN


def _single_process_gradients(graphs: int, world: int):
    """Eager, one process: the mean over ranks of each shard's loss gradient (what DDP averages)."""
    total = None
    full = graph_batch("mutagenesis", graphs, dtype=torch.float64)
    for rank in range(world):
        batch = shard(full, rank, world)
        torch.manual_seed(0)
        model = ScalarGCN(batch, batch.x.shape[1]).double()
        loss = torch.nn.functional.binary_cross_entropy(model(batch.x), labels(batch))
        grads = torch.autograd.grad(loss, list(model.parameters()))
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
    return [g / world for g in total]


def test_shards_cover_every_graph_once():
    full = graph_batch("mutagenesis", 5)
    parts = [shard(full, rank, 2) for rank in range(2)]
    assert sum(p.num_graphs for p in parts) == 5
    assert sum(p.num_nodes for p in parts) == full.num_nodes
    assert sum(len(p.edges) for p in parts) == len(full.edges)


def test_ddp_gradients_match_one_process():
    results = spawn(2, graphs=4, steps=3, dtype=torch.float64)
    want = _single_process_gradients(graphs=4, world=2)
    for rank in range(2):
        for got, expected in zip(results[rank]["grads"], want):
            torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)
    assert results[0]["losses"][-1] < results[0]["losses"][0]
