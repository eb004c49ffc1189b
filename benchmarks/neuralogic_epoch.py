"""Time per training epoch: NeuraLogic's Java engine vs the bridged module under backend="relational".

    python -m benchmarks.neuralogic_epoch [--samples N] [--compression on|off] [--epochs E] [--template NAME]
                                         [--batch B] [--threads T]

On the bundled Mutagenesis data (``--template`` picks a file of its ``templates/`` folder). One
epoch is one pass over the samples: the engine's ``model.train(samples)`` (its own Adam, MSE,
sample by sample as the engine does), against one step of ``torch.optim.Adam`` on the MSE of the
compiled module's outputs (forward over every sample, backward, update). The forward pass is timed
alone too (``model(samples)`` vs the compiled module). Prints medians over ``--epochs`` epochs, the
compile time, and the neuron counts. ``--frontend fx`` (default) compiles with
``dynamo_relational.compile`` (torch.fx tracing, the same passes and Inductor handoff; TorchDynamo
needs about 1.2 ms per FX node, minutes here), ``--frontend dynamo`` with ``torch.compile``.
``--batch B`` trains the per-sample networks instead, in shuffled mini-batches of ``B`` samples through
``dynamo_relational.batch(module)`` (``module(i)`` computes sample ``i``'s network alone), one Adam step
per batch; its first two epochs (tracing each sample, then grouping them) count as the compile time.
Needs Java and ``pip install -e .[neuralogic]``.
"""
from __future__ import annotations

import argparse
import os
import random
import time

import torch

from examples.common import median_ms


def mutagenesis_networks(template: str):
    import neuralogic.utils.data as data
    from neuralogic.core.model import Model
    from neuralogic.dataset import FileDataset

    base = os.path.join(data.base_path, "molecules", "mutagenesis")
    model = Model(model_file=os.path.join(base, "templates", template + ".txt"))
    dataset = FileDataset(examples_file=os.path.join(base, "examples.txt"),
                          queries_file=os.path.join(base, "queries.txt"))
    return model, dataset


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=None, help="first N molecules (default: all 188)")
    parser.add_argument("--compression", choices=["on", "off"], default="on",
                        help="the engine's iso_value_compression and chain_pruning")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--template", default="template")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--frontend", choices=["fx", "dynamo"], default="fx",
                        help="fx: dynamo_relational.compile (fast tracer); dynamo: torch.compile(backend='relational')")
    parser.add_argument("--batch", type=int, default=None,
                        help="train the per-sample networks in shuffled mini-batches of this many samples")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import neuralogic.logging
    from neuralogic.core import Settings
    from neuralogic.nn.loss import MSE
    from neuralogic.nn.optim import Adam

    from dynamo_relational.neuralogic import to_module

    neuralogic.logging.clear_handlers()
    compression = args.compression == "on"
    model, dataset = mutagenesis_networks(args.template)
    model.build(Settings(optimizer=Adam(lr=args.lr), error_function=MSE(),
                         iso_value_compression=compression, chain_pruning=compression))
    samples = list(model.build_dataset(dataset))[: args.samples]

    start = time.perf_counter()
    module = to_module(model, samples)
    read_seconds = time.perf_counter() - start
    counts = module.counts

    java_forward = median_ms(lambda: model(samples), args.epochs) / 1e3
    java_epoch = median_ms(lambda: model.train(samples, epochs=1), args.epochs) / 1e3

    import dynamo_relational

    start = time.perf_counter()
    optimizer = torch.optim.Adam(module.parameters(), lr=args.lr)
    if args.batch:
        epoch, compiled, batched = _mini_batches(module, optimizer, args.batch)
        epoch()   # traces every sample (they run eagerly)
    else:
        if args.frontend == "fx":
            compiled = dynamo_relational.compile(module, ())
        else:
            compiled = torch.compile(module, backend="relational")

        def epoch():
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(compiled(), module.targets)
            loss.backward()
            optimizer.step()

    epoch()   # compiles (Dynamo: forward and backward; fx: backward; mini-batches: groups the samples)
    compile_seconds = time.perf_counter() - start
    torch_epoch = median_ms(epoch, args.epochs) / 1e3
    with torch.no_grad():
        torch_forward = median_ms(compiled, args.epochs) / 1e3

    result = dict(compression=args.compression, template=args.template, frontend=args.frontend, batch=args.batch,
                  **counts,
                  read_s=read_seconds, compile_s=compile_seconds, java_epoch_ms=java_epoch * 1e3,
                  relational_epoch_ms=torch_epoch * 1e3, java_forward_ms=java_forward * 1e3,
                  relational_forward_ms=torch_forward * 1e3, threads=torch.get_num_threads())
    print(f"Mutagenesis {args.template}, {len(samples)} molecules, compression {args.compression}: "
          f"{counts['neurons']} neurons, {counts['edges']} edges, {torch.get_num_threads()} torch threads")
    how = f"mini-batches of {args.batch}, first two epochs" if args.batch else \
        f"{args.frontend} front-end: compile + first epoch"
    print(f"  bridge: read {read_seconds:.1f} s; {how} {compile_seconds:.1f} s")
    print(f"  median over {args.epochs}    epoch (ms)   forward (ms)")
    print(f"  Java engine        {java_epoch * 1e3:10.2f}   {java_forward * 1e3:10.2f}")
    print(f"  relational         {torch_epoch * 1e3:10.2f}   {torch_forward * 1e3:10.2f}")
    if args.batch:
        print("\n".join("    " + line for line in str(batched.report).splitlines()))
    return result


def _mini_batches(module, optimizer, size: int):
    """An epoch of shuffled mini-batches of ``size`` samples through ``dynamo_relational.batch``, and a
    forward over every sample in such batches."""
    import dynamo_relational

    batched = dynamo_relational.batch(module, progress=False)
    order = list(range(len(module.outputs)))
    rng = random.Random(0)

    def epoch():
        rng.shuffle(order)
        for i in range(0, len(order), size):
            chosen = order[i:i + size]
            optimizer.zero_grad()
            outputs = torch.cat(batched([(j,) for j in chosen]))
            torch.nn.functional.mse_loss(outputs, module.targets[chosen]).backward()
            optimizer.step()

    def forward():
        return torch.cat([torch.cat(batched([(j,) for j in order[i:i + size]])) for i in range(0, len(order), size)])
    return epoch, forward, batched


if __name__ == "__main__":
    main()
