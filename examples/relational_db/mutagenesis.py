"""Mutagenesis from a SQL database: ground a scalar-granular R-GCN with SQL, compile it once
with ``backend="relational"``, and run stratified 10-fold cross-validation.

    python -m examples.relational_db.mutagenesis                      # SQLite default, created on first run
    python -m examples.relational_db.mutagenesis postgresql+psycopg://user@host/db --load

The database is opened read-only. Without an argument, the SQLite file
``examples/relational_db/mutagenesis.sqlite`` is used and, if it does not exist
yet, written by the loader from the copy of the data set that the
``neuralogic`` package ships. A database given as an argument is written only
with ``--load`` (``--replace`` to overwrite the three tables).

The model returns the logits of all 188 molecules; a fold only chooses which
of them enter the loss and which are scored, so one compiled graph serves
every fold (parameters are reset in place). The last line is ``accuracy=<mean>``.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

from dynamo_relational.db import DEFAULT_CHUNK_SIZE, open_database
from examples.relational_db.grounding import MoleculeGraphs, ground
from examples.relational_db.loader import write_mutagenesis
from examples.relational_db.model import MoleculeRGCN

DEFAULT_DATABASE = Path(__file__).with_name("mutagenesis.sqlite")


def compile_model(model: nn.Module) -> nn.Module:
    """``dynamo_relational.compile`` (the Dynamo-free front-end) where it exists, else
    ``torch.compile(backend="relational")``; strict, so an internal grouping error stops here
    instead of handing tens of thousands of ungrouped nodes to Inductor."""
    import dynamo_relational
    if hasattr(dynamo_relational, "compile"):
        return dynamo_relational.compile(model, (), strict=True)
    return torch.compile(model, backend="relational", options={"strict": True})


def stratified_folds(labels: torch.Tensor, folds: int, seed: int) -> list[torch.Tensor]:
    """``folds`` disjoint index sets covering all samples, each with about the same share of positives."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.cat([idx[torch.randperm(len(idx), generator=gen)]
                       for idx in (torch.nonzero(labels == 1).flatten(), torch.nonzero(labels == 0).flatten())])
    return [order[k::folds].sort().values for k in range(folds)]


def cross_validate(graphs: MoleculeGraphs, *, folds: int = 10, epochs: int = 150, hidden: int = 16,
                   layers: int = 2, lr: float = 0.01, seed: int = 0, compiled: bool = True,
                   log=print) -> list[float]:
    """Test accuracy of every fold: train from the same initial parameters on the other folds."""
    torch.manual_seed(seed)
    model = MoleculeRGCN(graphs, hidden=hidden, layers=layers)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    start = time.perf_counter()
    run = compile_model(model) if compiled else model
    run()                                       # torch.compile compiles on the first call
    log(f"{'compiled' if compiled else 'ran eagerly'} in {time.perf_counter() - start:.1f} s")
    labels = graphs.labels
    accuracies = []
    for k, test in enumerate(stratified_folds(labels, folds, seed)):
        train = torch.ones(len(labels), dtype=torch.bool)
        train[test] = False
        model.load_state_dict(initial)          # in place: the compiled graph stays valid
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        start = time.perf_counter()
        for _ in range(epochs):
            optimizer.zero_grad()
            loss = nn.functional.binary_cross_entropy_with_logits(run()[train], labels[train])
            loss.backward()
            optimizer.step()
        logits = run().detach()                 # same grad mode as training: no second compilation
        accuracies.append(((logits[test] > 0).float() == labels[test]).float().mean().item())
        log(f"fold {k + 1}/{folds}: test accuracy {accuracies[-1]:.3f} ({len(test)} molecules), "
            f"final train loss {loss.item():.3f}, {time.perf_counter() - start:.1f} s")
    return accuracies


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("database", nargs="?", help=f"SQLite path or SQLAlchemy URL (default: {DEFAULT_DATABASE}, "
                                                    "written from neuralogic's copy if missing)")
    parser.add_argument("--load", action="store_true", help="write the Mutagenesis tables into DATABASE first")
    parser.add_argument("--replace", action="store_true", help="with --load: overwrite existing tables")
    parser.add_argument("--folds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="rows per fetch while grounding")
    parser.add_argument("--eager", action="store_true", help="run the model uncompiled (slow; for comparison)")
    args = parser.parse_args(argv)

    database = args.database or DEFAULT_DATABASE
    if args.load or (args.database is None and not DEFAULT_DATABASE.exists()):
        print(f"writing tables molecule, atom, bond into {database} from "
              f"{write_mutagenesis(database, replace=args.replace)}")
    start = time.perf_counter()
    with open_database(database) as db:
        graphs = ground(db, chunk_size=args.chunk_size)
        print(f"grounded {db.url}: {graphs.num_molecules} molecules, {graphs.num_atoms} atoms, "
              f"{len(graphs.bond_src) // 2} bonds in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    accuracies = cross_validate(graphs, folds=args.folds, epochs=args.epochs, hidden=args.hidden,
                                layers=args.layers, lr=args.lr, seed=args.seed, compiled=not args.eager)
    mean = sum(accuracies) / len(accuracies)
    print(f"{args.folds}-fold cross-validation in {time.perf_counter() - start:.0f} s (compilation included)")
    print(f"accuracy={mean:.4f}")
    return mean


if __name__ == "__main__":
    main()
