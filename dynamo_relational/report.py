"""What the backend did to each graph: node counts, groups, quality, timings."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GraphReport:
    nodes_before: int
    nodes_after: int
    #: groups in the chosen schedule (each is one vectorized node or one node left alone)
    groups: int
    #: groups vectorized into one node
    vectorized_groups: int
    #: lower bound on the number of groups of any schedule (ED-Batch); None unless detailed
    lower_bound: int | None
    schedule: str
    timings: dict[str, float]
    node_counts: dict[str, int]
    ungrouped: Counter
    #: (family, size, signature) of every group vectorized from more than one node
    group_sizes: list[tuple[str, int, str]] = field(default_factory=list)
    #: reason -> names of the nodes left ungrouped for it
    ungrouped_nodes: dict[str, list[str]] = field(default_factory=dict)
    before: str = ""
    after: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    #: the grouped graph module (for drawing); set by the backend
    graph_module: Any = None
    #: (name, tensor, version) of the constants whose values value compression merged rows by
    #: (``passes/compress_values.py``): :func:`~dynamo_relational.passes.compress_values.changed_constant`
    constants_read: list = field(default_factory=list, repr=False)

    def add_time(self, name: str, start: float) -> None:
        """Add the seconds since ``start`` (``time.perf_counter()``) to timing ``name``."""
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start

    @classmethod
    def from_context(cls, ctx, nodes_before: int, nodes_after: int, before: str, after: str) -> "GraphReport":
        stats = dict(ctx.stats)
        return cls(
            nodes_before=nodes_before, nodes_after=nodes_after,
            groups=stats.get("groups", nodes_before), vectorized_groups=stats.get("vectorized_groups", 0),
            lower_bound=stats.get("lower_bound"), schedule=stats.get("schedule", "none"),
            timings=dict(ctx.timings), node_counts=dict(ctx.node_counts), ungrouped=Counter(ctx.ungrouped),
            group_sizes=[(g.family, len(g.nodes), g.signature) for g in ctx.groups if g.ops and len(g.nodes) > 1],
            ungrouped_nodes={reason: list(names) for reason, names in ctx.ungrouped_nodes.items()},
            before=before, after=after, stats=stats, constants_read=list(ctx.constants_read))


@dataclass
class Report:
    """The result of :func:`dynamo_relational.explain`: one :class:`GraphReport` per compiled graph."""
    graphs: list[GraphReport]
    #: wall time of the first (compiling) call, including Dynamo's tracing
    compile_seconds: float = 0.0
    #: the compiled model this report describes; call it like the original
    compiled: Any = None

    @property
    def nodes_before(self) -> int:
        return sum(g.nodes_before for g in self.graphs)

    @property
    def nodes_after(self) -> int:
        return sum(g.nodes_after for g in self.graphs)

    @property
    def groups(self) -> int:
        return sum(g.groups for g in self.graphs)

    @property
    def lower_bound(self) -> int | None:
        bounds = [g.lower_bound for g in self.graphs]
        return None if any(b is None for b in bounds) else sum(b for b in bounds if b is not None)

    @property
    def pass_timings(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for g in self.graphs:
            for name, seconds in g.timings.items():
                total[name] = total.get(name, 0.0) + seconds
        return total

    @property
    def ungrouped(self) -> Counter:
        total: Counter = Counter()
        for g in self.graphs:
            total.update(g.ungrouped)
        return total

    def groups_table(self) -> str:
        """Every vectorized group: graph, family, size and signature, largest first."""
        entries = sorted(((size, i, family, signature) for i, g in enumerate(self.graphs)
                          for family, size, signature in g.group_sizes), reverse=True)
        lines = [f"{'graph':>5}  {'family':<12} {'size':>7}  signature"]
        lines += [f"{i:>5}  {family:<12} {size:>7}  {signature}" for size, i, family, signature in entries]
        return "\n".join(lines)

    def ungrouped_table(self) -> str:
        """Every node left ungrouped, by reason."""
        lines = []
        for i, g in enumerate(self.graphs):
            for reason, names in g.ungrouped_nodes.items():
                lines.append(f"graph {i}: {reason}: {', '.join(names)}")
        return "\n".join(lines)

    def draw(self, path: str, graph: int = 0) -> None:
        """Draw grouped graph ``graph`` with FxGraphDrawer (needs ``pydot`` and Graphviz's ``dot``)."""
        from torch.fx.passes.graph_drawer import FxGraphDrawer   # (needs the optional pydot)

        module = self.graphs[graph].graph_module
        if module is None:
            raise ValueError("this report keeps no graph module to draw")
        FxGraphDrawer(module, "grouped").get_dot_graph().write(path, format=path.rsplit(".", 1)[-1])

    def print_before(self) -> None:
        for g in self.graphs:
            print(g.before)

    def print_after(self) -> None:
        for g in self.graphs:
            print(g.after)

    def __str__(self) -> str:
        lb = self.lower_bound
        quality = f"{self.groups / lb:.2f}" if lb else "n/a"
        counts: dict[str, int] = {}
        for g in self.graphs:
            for name, n in g.node_counts.items():
                counts[name] = counts.get(name, 0) + n
        rows = [("graphs", len(self.graphs)), ("FX nodes before grouping", self.nodes_before),
                ("FX nodes after grouping", self.nodes_after), ("groups", self.groups),
                ("lower bound on groups", lb if lb is not None else "n/a"), ("groups / lower bound", quality),
                ("compile time (first call) [s]", f"{self.compile_seconds:.2f}")]
        rows += [(f"  pass {name} [ms]", f"{seconds * 1e3:.1f}") for name, seconds in self.pass_timings.items()]
        rows += [(f"  nodes after {name}", n) for name, n in counts.items()]
        for i, g in enumerate(self.graphs):
            rows.append((f"graph {i}: schedule", g.schedule))
            sizes: Counter[str] = Counter()
            for family, size, _ in g.group_sizes:
                sizes[family] += size
            rows += [(f"graph {i}: {family} nodes grouped", n) for family, n in sizes.most_common()]
            rows += [(f"graph {i}: {key}", value) for key, value in _choices(g.stats)]
        rows += [(f"left ungrouped: {reason}", n) for reason, n in self.ungrouped.most_common(10)]
        width = max(len(str(k)) for k, _ in rows)
        lines = ["dynamo_relational report", "-" * (width + 14)]
        lines += [f"{k:<{width}}  {v:>10}" for k, v in rows]
        return "\n".join(lines)


def _choices(stats: dict[str, Any]) -> list[tuple[str, str]]:
    """The choices made by timing, with the measured times, and by the cost model, with its estimates
    (``explain()`` prints them)."""
    rows = [(f"{c['pass_']} {c['node']}",
             f"{c['choice']} (estimated " + ", ".join(f"{k} {us:.3g} us" for k, us in c["estimates_us"].items()) + ")")
            for c in stats.get("cost_choices", [])]
    rows += [(f"linear layout {c['node']} [{c['shape']}]",
              f"{c['layout']} (plain {c['plain_ms']:.3f} ms, transposed {c['transposed_ms']:.3f} ms)")
             for c in stats.get("linear_layout", [])]
    if stats.get("rows_compressed"):
        rows.append(("value compression", "; ".join(stats["rows_compressed"])))
    if "search" in stats:
        search = stats["search"]
        rows.append(("rewrite search", f"estimated {search['start_us']:.3g} -> {search['best_us']:.3g} us; "
                                       f"{search['graphs']} graphs in {search['seconds']:.2f} s, "
                                       f"stopped: {search['stopped_by']}"))
        rows += [(f"  step {i}: {step['rewrite']}", f"at {step['at']} (estimated {step['estimate_us']:.3g} us)")
                 for i, step in enumerate(search["path"], 1)]
    if stats.get("fold_bias"):
        rows.append(("biases folded into linear", stats["fold_bias"]))
    if "padded_gathers" in stats:
        rows.append(("gather-reduce form", f"padded: {stats['padded_gathers']} node(s); "
                                           f"{stats['padded_gathers_kept']} kept the CSR product (too much padding)"))
    if "executor" in stats:
        times = ", ".join(f"{name} {ms:.3f} ms" for name, ms in stats.get("executor_ms", {}).items())
        rows.append(("executor", f"{stats['executor']} ({times})"))
    return rows
