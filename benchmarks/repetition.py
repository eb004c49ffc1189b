"""What simplify_gathers' repetition rewrite gains: a gather whose index repeats, as a gather and as a view.

    python -m benchmarks.repetition [--rows 250] [--times 8] [--width 64] [--threads 1] [--device cpu]

The model reads ``x[i] * y[j]`` for a list of ``i`` that is ``arange(rows)``
repeated ``times`` times ("dimension-1 repetition") or with each row repeated
``times`` times ("dimension-2 repetition"). It is compiled with
``dynamo_relational.compile`` twice: as it is, where ``simplify_gathers``
turns the ``x`` gather into ``unsqueeze/expand/reshape`` (which Inductor
lowers to index arithmetic inside the product), and with
``disable=("simplify_gathers",)``, where it stays a ``gather_rows``. Printed:
the median forward+backward times of both, measured in turns in one process,
and their ratio. ``--autotune`` lets the backend choose the executor (the
ATen executor's ``reshape`` copies the repeated rows); by default both run
Inductor's code, which is what the rewrite is for.
"""
from __future__ import annotations

import argparse

import torch
from torch import nn

from examples.common import interleaved_medians_ms


class RepeatedReads(nn.Module):
    """``stack([x[i] * y[j] for j, i in enumerate(reads)])``: one neuron per read."""

    def __init__(self, reads: list[int]):
        super().__init__()
        self.reads = reads

    def forward(self, x, y):
        return torch.stack([x[i] * y[j] for j, i in enumerate(self.reads)])


def measure(reads: torch.Tensor, rows: int, width: int, autotune: bool, device: str, repeats: int) -> dict:
    import dynamo_relational

    torch.manual_seed(0)
    x = torch.randn(rows, width, device=device, requires_grad=True)
    y = torch.randn(reads.shape[0], width, device=device, requires_grad=True)
    weights = torch.randn(reads.shape[0], width, device=device)
    model = RepeatedReads(reads.tolist())
    compiled = {label: dynamo_relational.compile(model, [x, y], progress=False, autotune=autotune, **options)
                for label, options in (("view", {}), ("gather", {"disable": ("simplify_gathers",)}))}
    broadcast = compiled["view"].report.graphs[0].stats.get("gathers_broadcast", 0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step(fn):
        def run():
            x.grad = y.grad = None
            (fn(x, y) * weights).sum().backward()
            sync()
        return run

    times = interleaved_medians_ms({label: step(fn) for label, fn in compiled.items()}, repeats, warmup=10)
    return dict(broadcast=broadcast, view_ms=times["view"], gather_ms=times["gather"],
                ratio=times["view"] / times["gather"])


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=250)
    parser.add_argument("--times", type=int, default=8, help="how often the rows repeat")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--autotune", action="store_true", help="let the backend choose the executor")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    run_ = torch.arange(args.rows)
    print(f"x {args.rows} x {args.width} float32, rows repeated {args.times} times, {args.device}, "
          f"autotune={args.autotune}; forward+backward medians")
    print("| repetition | rewritten | as a view [ms] | as a gather [ms] | view / gather |")
    print("|---|---|---|---|---|")
    rows = []
    for name, reads in (("dimension 1 (repeat)", run_.repeat(args.times)),
                        ("dimension 2 (repeat_interleave)", run_.repeat_interleave(args.times))):
        r = measure(reads, args.rows, args.width, args.autotune, args.device, args.repeats)
        rows.append(dict(repetition=name, **r))
        print(f"| {name} | {r['broadcast']} | {r['view_ms']:.3f} | {r['gather_ms']:.3f} | {r['ratio']:.2f} |",
              flush=True)
    return rows


if __name__ == "__main__":
    main()
