"""The main demo: a scalar-granular 2-layer GCN, eager vs compiled by the relational backend.

    python -m examples.demo [graphs] [--dynamo]

Default: the full Mutagenesis-shaped batch (188 graphs, 3,371 nodes, 7,442
edges: about 40,000 FX nodes), traced by the fast front-end
``dynamo_relational.compile``. ``--dynamo`` uses ``torch.compile(model,
backend="relational")`` instead: the same passes and Inductor handoff, behind
TorchDynamo's tracing (about 1 ms per FX node, minutes for the full batch).

Prints the largest difference between compiled and eager, the speedup, the
FX node counts before and after grouping, and the compile time.
"""
import sys

from examples import gcn

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    dynamo = "--dynamo" in sys.argv
    graphs = int(args[0]) if args else None
    how = "torch.compile(model, backend='relational')" if dynamo else "dynamo_relational.compile(model, x)"
    print(f"Compiling a scalar-granular GCN (one Python op per neuron and edge) with {how}.")
    if dynamo:
        print("TorchDynamo traces every per-neuron op first (about 1 ms per FX node): this takes a while.")
    result = gcn.main("mutagenesis", graphs, fast=not dynamo)
    print(f"\nnumbers match: max |compiled - eager| = {result['max_abs_diff']:.1e}")
    print(f"speedup over eager: {result['speedup']:.0f}x")
    print(f"FX nodes: {result['nodes_before']} before grouping -> {result['nodes_after']} after")
    print(f"compile time (first call, including tracing): {result['compile_s']:.1f} s")
