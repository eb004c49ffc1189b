"""Data-parallel training: every rank compiles the scalar GCN of its own shard of graphs.

    torchrun --nproc_per_node=2 -m examples.distributed [graphs] [steps]
    python -m examples.distributed [graphs] [steps]       (spawns 2 local CPU processes itself)

The batch of graphs is split across ranks; each rank builds the scalar-granular
model over its shard (the structure lives in Python lists, so each rank's
model has different neurons but the same parameters), compiles it with
``backend="relational"`` and wraps it in ``DistributedDataParallel``, which
averages the gradients over ranks (gloo on CPU, NCCL on GPUs). Across many
machines, torchrun starts one process per device on each machine
(``--nnodes``, ``--node_rank``, ``--rdzv_endpoint``); nothing else changes:
every process only ever compiles its own shard.
"""
from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from examples.data import GraphBatch, graph_batch
from examples.gcn import ScalarGCN


def shard(batch: GraphBatch, rank: int, world: int) -> GraphBatch:
    """The graphs ``rank, rank + world, ...`` of ``batch``, renumbered."""
    graphs = list(range(rank, batch.num_graphs, world))
    nodes = [v for v, g in enumerate(batch.graph_of) if g % world == rank]
    new_id = {v: i for i, v in enumerate(nodes)}
    edges = [(new_id[u], new_id[v]) for u, v in batch.edges if u in new_id]
    graph_of = [graphs.index(batch.graph_of[v]) for v in nodes]
    return GraphBatch(batch.x[nodes], edges, graph_of, len(graphs))


def labels(batch: GraphBatch) -> torch.Tensor:
    """A fixed, learnable target per graph: whether its mean first feature is positive."""
    sums = torch.zeros(batch.num_graphs, dtype=batch.x.dtype).index_add_(0, torch.tensor(batch.graph_of), batch.x[:, 0])
    return (sums > 0).to(batch.x.dtype)


def train_rank(rank: int, world: int, graphs: int, steps: int, options: dict | None = None,
               dtype: torch.dtype = torch.float32) -> dict:
    """Train on this rank's shard; returns the losses and the gradients of the first step."""
    batch = shard(graph_batch("mutagenesis", graphs, dtype=dtype), rank, world)
    torch.manual_seed(0)  # same initial parameters on every rank (DDP also broadcasts rank 0's)
    model = ScalarGCN(batch, batch.x.shape[1]).to(dtype)
    ddp = DistributedDataParallel(torch.compile(model, backend="relational", options=options or {}))
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    y = labels(batch)
    losses, first_grads = [], None
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy(ddp(batch.x), y)
        loss.backward()
        if first_grads is None:
            first_grads = [p.grad.detach().clone() for p in model.parameters()]
        optimizer.step()
        losses.append(loss.item())
    return dict(losses=losses, grads=first_grads)


def _worker(rank: int, world: int, port: int, graphs: int, steps: int, dtype, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = train_rank(rank, world, graphs, steps, dtype=dtype)
        results[rank] = result
        if rank == 0:
            print(f"rank 0: loss {result['losses'][0]:.4f} -> {result['losses'][-1]:.4f} over {steps} steps")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(world: int, graphs: int, steps: int, dtype: torch.dtype = torch.float32) -> dict:
    """Run ``world`` local CPU ranks; returns {rank: result}."""
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(world, free_port(), graphs, steps, dtype, results), nprocs=world)
        return dict(results)


if __name__ == "__main__":
    graphs = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    if "RANK" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
        result = train_rank(dist.get_rank(), dist.get_world_size(), graphs, steps)
        print(f"rank {dist.get_rank()}: loss {result['losses'][0]:.4f} -> {result['losses'][-1]:.4f}")
        dist.destroy_process_group()
    else:
        spawn(2, graphs, steps)
