"""An ordinary model that grouping cannot speed up, through stock Inductor and through the relational backend.

    python -m benchmarks.ordinary [--steps 32] [--batch 4] [--width 16] [--threads 1]

A small batch through an ``nn.LSTMCell`` over time steps is a chain: each
step needs the one before, so grouping finds nothing to batch. The backend
must then cost what stock ``torch.compile`` costs. Compiles the model with
``torch.compile(backend="inductor")`` and ``torch.compile(backend="relational")``
(Dynamo's cache reset in between, Inductor's caches as the environment sets
them: ``TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0`` for
cold compiles), and prints each one's compile time (first forward and
backward) and median forward (``no_grad``) and forward+backward times, eager's,
and the relational backend's ratios to Inductor.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from examples.common import median_ms


class LSTMCellLoop(nn.Module):
    """One ``nn.LSTMCell`` over the time steps of ``x`` ([steps, batch, features]), then a linear readout."""

    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.cell, self.out = nn.LSTMCell(features, hidden), nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = x.new_zeros(x.shape[1], self.hidden)
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
        return self.out(h)


def measure(steps: int = 32, batch: int = 4, width: int = 16, repeats: int = 200) -> dict:
    torch.manual_seed(0)
    model, x = LSTMCellLoop(width, width), torch.randn(steps, batch, width)
    rows = {}
    for backend in ("inductor", "relational"):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend)
        start = time.perf_counter()
        compiled(x).sum().backward()
        compile_s = time.perf_counter() - start
        with torch.no_grad():
            compiled(x)
            forward = median_ms(lambda: compiled(x), repeats)
        rows[backend] = dict(compile_s=compile_s, forward_ms=forward,
                             train_ms=median_ms(lambda: compiled(x).sum().backward(), repeats))
    with torch.no_grad():
        eager_forward = median_ms(lambda: model(x), repeats)
    rows["eager"] = dict(compile_s=0.0, forward_ms=eager_forward,
                         train_ms=median_ms(lambda: model(x).sum().backward(), repeats))
    rows["ratio"] = {k: rows["relational"][k] / rows["inductor"][k] for k in ("compile_s", "forward_ms", "train_ms")}
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = measure(args.steps, args.batch, args.width, args.repeats)
    print("| system | compile [s] | forward [ms] | forward+backward [ms] |\n|---|---|---|---|")
    for name in ("eager", "inductor", "relational"):
        r = rows[name]
        print(f"| {name} | {r['compile_s']:.1f} | {r['forward_ms']:.3f} | {r['train_ms']:.3f} |")
    r = rows["ratio"]
    print(f"relational / inductor: compile {r['compile_s']:.2f}, forward {r['forward_ms']:.2f}, "
          f"forward+backward {r['train_ms']:.2f}")
    return rows


if __name__ == "__main__":
    main()
