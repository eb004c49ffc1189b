"""Training over shuffled mini-batches of samples with different structures: eager vs ``dynamo_relational.batch``.

    python -m benchmarks.dynamic [--models treelstm treernn gcn] [--samples 400] [--batch 25] [--epochs 4]
                                 [--threads 1]

For each model of ``examples/per_sample.py`` (written for one sample), trains
``--epochs`` epochs of SGD over the same shuffled mini-batches twice in one
process, from the same weights: eagerly (the model called sample by sample)
and batched (``dynamo_relational.batch``), the two taking turns epoch by
epoch. Prints each epoch's seconds and the ratio eager / batched, the median
of the epochs after the second (the steady state: no tracing or grouping),
the batched module's report, and the largest difference between the two
models' weights after training (float32).
"""
from __future__ import annotations

import argparse
import copy
import statistics

import torch

from examples.per_sample import MODELS, dataset, train_epoch


def run(kind: str, samples: int, batch_size: int, epochs: int) -> dict:
    import dynamo_relational

    torch.manual_seed(0)
    data = dataset(kind, samples)
    targets = torch.randn(samples)
    eager = MODELS[kind][0](data[0][1].shape[1])
    model = copy.deepcopy(eager)
    batched = dynamo_relational.batch(model, progress=False)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (eager, model)]
    rows = []
    for epoch in range(epochs):
        eager_s = train_epoch(lambda batch: [eager(*s) for s in batch], data, targets, batch_size, optimizers[0], epoch)
        batched_s = train_epoch(batched, data, targets, batch_size, optimizers[1], epoch)
        rows.append((eager_s, batched_s))
        print(f"  {kind} epoch {epoch}: eager {eager_s:7.2f} s  batched {batched_s:7.2f} s  "
              f"ratio {eager_s / batched_s:6.2f}x", flush=True)
    diff = max((a - b).abs().max().item() for a, b in zip(eager.parameters(), model.parameters()))
    steady = rows[2:] or rows[-1:]
    result = {"model": kind, "epochs": rows, "weight_diff": diff,
              "steady_eager_s": statistics.median(e for e, _ in steady),
              "steady_batched_s": statistics.median(b for _, b in steady), "report": batched.report}
    result["steady_ratio"] = result["steady_eager_s"] / result["steady_batched_s"]
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["treelstm", "treernn", "gcn"])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    for kind in args.models:
        result = run(kind, args.samples, args.batch, args.epochs)
        print(f"{kind}: steady epochs: eager {result['steady_eager_s']:.2f} s, batched {result['steady_batched_s']:.2f} s "
              f"({result['steady_ratio']:.1f}x); largest weight difference {result['weight_diff']:.1e}")
        print("\n".join("    " + line for line in str(result["report"]).splitlines()), flush=True)
        results.append(result)
    return results


if __name__ == "__main__":
    main()
