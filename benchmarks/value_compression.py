"""Value compression (``options={"value_compression": True}``) on NeuraLogic's Mutagenesis networks.

    python -m benchmarks.value_compression [--template NAME] [--samples N] [--repeats R]

Builds the bundled Mutagenesis template twice, with the engine's own compression
(``iso_value_compression``, ``chain_pruning``) and without, bridges both with
``dynamo_relational.neuralogic.to_module`` and compiles (fast front-end, Inductor):

* ``engine-compressed``: the engine's compressed networks, our default options;
* ``engine-compressed + value_compression``: the same, our compression on top;
* ``uncompressed``: the full networks, our default options;
* ``uncompressed + value_compression``: the full networks, our compression alone.

Prints each one's neurons, FX nodes before and after grouping, rows the pass
merged, compile time, the largest difference from the engine's outputs, and the
medians of forward and forward+backward timed in turns in one process, with
their ratios to ``uncompressed``. Needs Java and ``pip install -e .[neuralogic]``.
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.neuralogic_epoch import mutagenesis_networks
from examples.common import interleaved_medians_ms


def _build(template: str, compression: bool, samples: int | None):
    import neuralogic.logging
    from neuralogic.core import Settings

    neuralogic.logging.clear_handlers()
    model, dataset = mutagenesis_networks(template)
    model.build(Settings(iso_value_compression=compression, chain_pruning=compression))
    built = list(model.build_dataset(dataset))[:samples]
    return model, built


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", default="template")
    parser.add_argument("--samples", type=int, default=None, help="first N molecules (default: all 188)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import dynamo_relational
    from dynamo_relational.neuralogic import to_module

    variants = {"engine-compressed": (True, False), "engine-compressed + value_compression": (True, True),
                "uncompressed": (False, False), "uncompressed + value_compression": (False, True)}
    modules, compiled, rows = {}, {}, {}
    for label, (engine_compression, value_compression) in variants.items():
        if engine_compression not in modules:
            model, built = _build(args.template, engine_compression, args.samples)
            module = to_module(model, built)
            modules[engine_compression] = (module, torch.tensor(model(built), dtype=torch.float64).reshape(-1))
        module, engine_out = modules[engine_compression]
        start = time.perf_counter()
        fn = dynamo_relational.compile(module, (), progress=False, value_compression=value_compression)
        seconds = time.perf_counter() - start
        report = fn.report.graphs[0]
        merged = report.stats.get("rows_compressed", [])
        with torch.no_grad():
            diff = (fn() - engine_out).abs().max().item()
        compiled[label] = (module, fn)
        rows[label] = dict(neurons=module.counts["neurons"], nodes_before=report.nodes_before,
                           nodes_after=report.nodes_after, nodes_compressed=len(merged), compile_s=seconds,
                           max_abs_diff=diff)

    def forward_backward(module, fn):
        def step():
            module.zero_grad(set_to_none=True)
            fn().sum().backward()
        return step

    with torch.no_grad():
        forward = interleaved_medians_ms({k: fn for k, (_, fn) in compiled.items()}, args.repeats, warmup=3)
    both = interleaved_medians_ms({k: forward_backward(*v) for k, v in compiled.items()}, args.repeats, warmup=3)
    base = "uncompressed"
    print(f"Mutagenesis {args.template}, {args.samples or 188} molecules, {args.threads} thread(s); "
          f"medians of {args.repeats} runs in turns")
    print("| network | neurons | FX nodes before -> after | nodes compressed | compile [s] | max diff vs engine "
          "| fwd [ms] | fwd+bwd [ms] | fwd ÷ uncompressed | fwd+bwd ÷ uncompressed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, r in rows.items():
        r.update(forward_ms=forward[label], forward_backward_ms=both[label])
        print(f"| {label} | {r['neurons']:,} | {r['nodes_before']:,} -> {r['nodes_after']} | {r['nodes_compressed']} | "
              f"{r['compile_s']:.1f} | {r['max_abs_diff']:.1e} | {forward[label]:.2f} | {both[label]:.2f} | "
              f"{forward[label] / forward[base]:.2f} | {both[label] / both[base]:.2f} |")
    return rows


if __name__ == "__main__":
    main()
