"""The results file (JSON) and its markdown rendering.

``results.json``: ``{"meta": {...environment...}, "workloads": [{"name", "size",
"systems": {system: entry}}]}`` with the entries of
:func:`benchmarks.session.run_session` (times in ms, memory in bytes, compile
times in s; ``session`` says whether the system ran in the main process or in
a capped child). :func:`markdown` renders one table of everything and one
table of the targets for the relational systems (:data:`TARGETS`).
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

#: the targets: relational / PyG eager forward and forward+backward, relational / PyG compiled, memory / PyG
TARGETS = (("fwd ÷ PyG ≤ 0.8", "pyg", "forward", 0.8), ("fwd+bwd ÷ PyG ≤ 1.0", "pyg", "forward_backward", 1.0),
           ("fwd ÷ PyG-compiled ≤ 1.0", "pyg_compile", "forward", 1.0),
           ("fwd+bwd ÷ PyG-compiled ≤ 1.0", "pyg_compile", "forward_backward", 1.0),
           ("memory ÷ PyG ≤ 1.5", "pyg", "peak_memory", 1.5))
LABELS = {"eager": "eager (scalar)", "inductor": "torch.compile (scalar)", "relational": "relational",
          "relational_unguarded": "relational, guards skipped",
          "relational_filtered": "relational, structure guards filtered",
          "relational_fast": "relational (fast front-end)", "pyg": "PyG", "pyg_compile": "PyG + torch.compile"}


def environment(args: dict) -> dict:
    """What the numbers depend on: versions, threads, cores, load, the options of the run."""
    try:
        import torch_geometric
        pyg = torch_geometric.__version__
    except ImportError:
        pyg = None
    return dict(started=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), torch=torch.__version__,
                torch_geometric=pyg, python=platform.python_version(), platform=platform.platform(),
                cpu_count=os.cpu_count(), num_threads=torch.get_num_threads(),
                load_average_start=os.getloadavg(), **args)


def write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown(results))


def _num(value, fmt: str = "{:.3g}") -> str:
    return "—" if value is None else fmt.format(value)


def _ratio(entry: dict, ref: str, kind: str) -> str:
    return _num(entry.get("vs", {}).get(ref, {}).get(kind), "{:.3g}")


def _compile(entry: dict) -> tuple[str, str]:
    c = entry.get("compile") or {}
    if not c:
        return "—", "—"
    if c.get("total") is None:
        return entry["status"], "—"
    parts = "—"
    if "trace" in c:
        parts = " / ".join(f"{c[k]:.1f}" for k in ("trace", "grouping", "passes", "inductor"))
    return f"{c['total']:.1f}", parts


def markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [f"# Benchmark results ({meta.get('mode', '')})", "",
             f"{meta['started']}; torch {meta['torch']}, torch_geometric {meta['torch_geometric']}, "
             f"device {meta.get('device')}, {meta['num_threads']} threads on {meta['cpu_count']} cores; "
             f"load average {', '.join(f'{v:.1f}' for v in meta['load_average_start'])} at the start"
             + (f", {', '.join(f'{v:.1f}' for v in meta['load_average_end'])} at the end"
                if meta.get("load_average_end") else "") + "; "
             f"medians of {meta.get('runs')} timed runs after {meta.get('warmup')} warm-up rounds, systems "
             f"interleaved; ratios are ratios of medians taken in one process (capped systems: in their "
             f"child, against the PyG/eager run there); compile cap {meta.get('cap_s')} s.", "",
             "| workload | system | fwd [ms] | fwd+bwd [ms] | fwd ÷ PyG | fwd+bwd ÷ PyG | fwd ÷ PyG-c | "
             "fwd+bwd ÷ PyG-c | fwd ÷ eager | peak [MB] | mem ÷ PyG | compile [s] | "
             "trace / grouping / passes / inductor [s] | FX nodes | status |",
             "|" + "---|" * 15]
    for w in results["workloads"]:
        for system, e in w["systems"].items():
            total, parts = _compile(e)
            mem = e.get("peak_memory_bytes")
            c = e.get("compile") or {}
            nodes = f"{c['fx_nodes_before']} → {c['fx_nodes_after']}" if "fx_nodes_before" in c else "—"
            lines.append("| " + " | ".join([
                w["name"], LABELS.get(system, system), _num(e.get("forward_ms")), _num(e.get("forward_backward_ms")),
                _ratio(e, "pyg", "forward"), _ratio(e, "pyg", "forward_backward"),
                _ratio(e, "pyg_compile", "forward"), _ratio(e, "pyg_compile", "forward_backward"),
                _ratio(e, "eager", "forward"), _num(None if mem is None else mem / 2**20),
                _ratio(e, "pyg", "peak_memory"), total, parts, nodes,
                e["status"] + (" (child)" if e.get("session") == "child" else "")]) + " |")
    lines += ["", "## Targets (relational systems against PyG)", "",
              "| workload | system | " + " | ".join(t[0] for t in TARGETS) + " |", "|" + "---|" * (2 + len(TARGETS))]
    for w in results["workloads"]:
        for system in ("relational", "relational_unguarded", "relational_filtered", "relational_fast"):
            e = w["systems"].get(system)
            if not e or "vs" not in e or "pyg" not in e["vs"]:
                continue
            cells = []
            for _, ref, kind, limit in TARGETS:
                value = e["vs"].get(ref, {}).get(kind)
                cells.append("—" if value is None else f"{value:.3f} {'✓' if value <= limit else '✗'}")
            lines.append(f"| {w['name']} | {LABELS[system]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
