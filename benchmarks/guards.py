"""Per-call overhead of TorchDynamo's guards on scalar-granular models.

    python -m benchmarks.guards [--graphs 10 47 188] [--threads T]

A model whose structure lives in Python lists (``self.in_nbrs``) is guarded
by value: before every call Dynamo checks that the lists still hold what was
traced, which is what makes a rewired structure recompile instead of
returning stale results. The check costs time proportional to the size of
the structure. For the scalar GCN on Mutagenesis-shaped batches of several
sizes this prints the median time of

* the whole compiled call (``torch.compile(model, backend="relational")``),
* the compiled graph alone (what the backend returned, on the same inputs),
* the whole call under ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``,
* the whole call of the model compiled with the guard filter
  ``options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}``
  (no guards on the modules' attributes, so none on the structure),
* ``dynamo_relational.compile`` (the fast front-end: no guards; it checks
  the inputs' shapes, dtypes and devices, the modules' train/eval flags
  and hooks, and which module, parameter and buffer objects it has),

and the guard overhead (whole call minus graph alone) per call and per graph neuron; then a training
step (forward, ``.sum().backward()``) of the guard-filtered model and of the fast front-end.
"""
from __future__ import annotations

import argparse

import torch

from examples.common import median_ms


def measure(graphs: int) -> dict:
    import dynamo_relational
    from dynamo_relational.backend import compile_graph
    from dynamo_relational.options import Options
    from examples.data import graph_batch
    from examples.gcn import ScalarGCN

    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs)
    model = ScalarGCN(batch, batch.x.shape[1])
    captured = []

    def backend(gm, example_inputs):
        fn = compile_graph(gm, example_inputs, Options()).fn
        captured.append((fn, list(example_inputs)))
        return fn

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    x = batch.x
    with torch.no_grad():
        compiled(x)
        if len(captured) != 1:
            raise RuntimeError(f"expected one graph, Dynamo made {len(captured)}")
        graph_fn, graph_inputs = captured[0]
        whole = median_ms(lambda: compiled(x), repeats=50)
        alone = median_ms(lambda: graph_fn(*graph_inputs), repeats=50)
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            unsafe = median_ms(lambda: compiled(x), repeats=50)
        # Dynamo's cache belongs to forward's code, which every compiled copy of the model shares:
        # reset it, or the calls below would find and run the graph compiled above, with its guards.
        torch._dynamo.reset()
        filtered = torch.compile(model, backend="relational",
                                 options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})
        filtered(x)
        filtered_ms = median_ms(lambda: filtered(x), repeats=50)
        fast = dynamo_relational.compile(model, x)
        frontend = median_ms(lambda: fast(x), repeats=50)
    # training steps: the filtered path compiles once more for grad mode, with AOT autograd's backward
    filtered(x).sum().backward()
    fast(x).sum().backward()
    filtered_train = median_ms(lambda: filtered(x).sum().backward(), repeats=50)
    frontend_train = median_ms(lambda: fast(x).sum().backward(), repeats=50)
    return dict(graphs=graphs, neurons=batch.num_nodes, edges=len(batch.edges), whole_ms=whole, graph_ms=alone,
                guard_ms=whole - alone, unsafe_ms=unsafe, filtered_ms=filtered_ms, frontend_ms=frontend,
                filtered_train_ms=filtered_train, frontend_train_ms=frontend_train)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, nargs="+", default=[10, 47, 188])
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    print("| graphs | neurons | edges | torch.compile call (ms) | graph alone (ms) | guard overhead (ms) "
          "| per neuron (us) | skip_guard_eval_unsafe (ms) | guard filter (ms) | dynamo_relational.compile (ms) "
          "| guard filter, fwd+bwd (ms) | dynamo_relational.compile, fwd+bwd (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for graphs in args.graphs:
        r = measure(graphs)
        rows.append(r)
        print(f"| {r['graphs']} | {r['neurons']} | {r['edges']} | {r['whole_ms']:.3f} | {r['graph_ms']:.3f} "
              f"| {r['guard_ms']:.3f} | {r['guard_ms'] / r['neurons'] * 1e3:.2f} | {r['unsafe_ms']:.3f} "
              f"| {r['filtered_ms']:.3f} | {r['frontend_ms']:.3f} | {r['filtered_train_ms']:.3f} "
              f"| {r['frontend_train_ms']:.3f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
