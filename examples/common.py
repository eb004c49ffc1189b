"""Shared helper of the examples: eager vs compiled, side by side."""
from __future__ import annotations

import statistics
import time

import torch


def median_ms(fn, repeats: int = 10, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def interleaved_medians_ms(calls: dict, repeats: int = 30, warmup: int = 3) -> dict:
    """Median ms of each of ``calls`` (label -> function), the calls taking turns so that changes
    in the machine's load hit them alike (ratios of these medians are side by side in one process)."""
    samples = {label: [] for label in calls}
    for round_ in range(warmup + repeats):
        for label, call in calls.items():
            start = time.perf_counter()
            call()
            if round_ >= warmup:
                samples[label].append(time.perf_counter() - start)
    return {label: statistics.median(times) * 1e3 for label, times in samples.items()}


def compare(model: torch.nn.Module, *inputs, repeats: int = 10, options: dict | None = None,
            fast: bool = False) -> dict:
    """Compile ``model`` with backend="relational" (or, with ``fast``, ``dynamo_relational.compile``),
    check it against eager and time both."""
    import dynamo_relational

    with torch.no_grad():
        if fast:
            start = time.perf_counter()
            compiled = dynamo_relational.compile(model, inputs, **(options or {}))
            report = compiled.report
            report.compile_seconds = time.perf_counter() - start
        else:
            report = dynamo_relational.explain(model, *inputs, **(options or {}))
            compiled = report.compiled
        out = compiled(*inputs)
        expected = model(*inputs)
        eager_ms = median_ms(lambda: model(*inputs), repeats)
        compiled_ms = median_ms(lambda: compiled(*inputs), repeats)
    result = dict(max_abs_diff=(out - expected).abs().max().item(), eager_ms=eager_ms,
                  compiled_ms=compiled_ms, speedup=eager_ms / compiled_ms,
                  nodes_before=report.nodes_before, nodes_after=report.nodes_after,
                  groups=report.groups, lower_bound=report.lower_bound,
                  compile_s=report.compile_seconds)
    return result


def print_result(name: str, r: dict) -> None:
    bound = "" if r["lower_bound"] is None else f", lower bound {r['lower_bound']}"
    print(f"{name}: max |compiled - eager| = {r['max_abs_diff']:.2e}; eager {r['eager_ms']:.2f} ms, "
          f"compiled {r['compiled_ms']:.3f} ms ({r['speedup']:.0f}x); FX nodes {r['nodes_before']} -> "
          f"{r['nodes_after']} ({r['groups']} groups{bound}); "
          f"first compile {r['compile_s']:.1f} s")


def run_graph_example(title: str, build, name: str = "mutagenesis", graphs: int | None = None,
                      fast: bool = False) -> dict:
    """Build ``build(batch)`` on a batch shaped like data set ``name``, compare and print."""
    from examples.data import graph_batch

    torch.manual_seed(0)
    batch = graph_batch(name, graphs)
    result = compare(build(batch), batch.x, fast=fast)
    print_result(f"{title} on {name} ({batch.num_graphs} graphs, {batch.num_nodes} nodes, "
                 f"{len(batch.edges)} edges)", result)
    return result


def run_tree_example(title: str, build, trees: int = 50, nodes: int = 500, features: int = 8) -> dict:
    """Build ``build(forest, features)`` over ``trees`` random trees of ``nodes`` nodes in all,
    compare and print."""
    from examples.data import random_forest

    torch.manual_seed(0)
    forest = random_forest(trees, nodes)
    x = torch.randn(nodes, features)
    result = compare(build(forest, features), x)
    print_result(f"{title} over {trees} random trees ({nodes} nodes)", result)
    return result
