"""Scaling plots of a sweep (``python -m benchmarks --sweep``): log-log compile time and
run time against model size, one line per system.

The compile panel also draws the relational systems' grouping and passes
alone (dotted), the part whose growth should stay near linear.
A compile that finished but failed the output or gradient check is drawn
as an x: its compile time is real, its run time was not measured. Other
points that were not measured (``> cap``, failures) are left out; the
compile cap is drawn as a horizontal line, so a system whose line stops
below it ran into the cap at the next size.
"""
from __future__ import annotations

from pathlib import Path

from benchmarks.report import LABELS
from benchmarks.workloads import Workload, neurons


def plot_scaling(results: dict, out: Path) -> Path:
    """Write ``out/scaling.png`` (compile time, forward and forward+backward time against neurons)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for w in results["workloads"]:
        n = neurons(Workload.parse(w["name"]), w["size"])
        for system, e in w["systems"].items():
            s = series.setdefault(system, dict(compile=[], forward=[], forward_backward=[], passes=[], unchecked=[]))
            compile_ = e.get("compile") or {}
            if compile_.get("total") is not None:
                # a compile that finished but failed the output/gradient check is drawn apart (x)
                s["compile" if e.get("status") == "ok" else "unchecked"].append((n, compile_["total"]))
                if compile_.get("grouping") is not None:   # a relational system: its passes alone
                    s["passes"].append((n, compile_["grouping"] + compile_.get("passes", 0.0)))
            for kind in ("forward", "forward_backward"):
                if f"{kind}_ms" in e:
                    s[kind].append((n, e[f"{kind}_ms"]))

    colors = {system: f"C{i}" for i, system in enumerate(series)}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = (("compile", "compile time [s]"), ("forward", "forward [ms]"),
              ("forward_backward", "forward+backward [ms]"))
    for ax, (kind, ylabel) in zip(axes, panels):
        for system, s in series.items():
            if s[kind]:
                xs, ys = zip(*sorted(s[kind]))
                ax.plot(xs, ys, marker="o", color=colors[system], label=LABELS.get(system, system))
            if kind == "compile" and s["passes"]:
                xs, ys = zip(*sorted(s["passes"]))
                ax.plot(xs, ys, marker=".", linestyle=":", color=colors[system],
                        label=f"{LABELS.get(system, system)}: grouping + passes")
            if kind == "compile" and s["unchecked"]:
                xs, ys = zip(*sorted(s["unchecked"]))
                ax.plot(xs, ys, marker="x", linestyle="none", markersize=9, color=colors[system],
                        label=f"{LABELS.get(system, system)}: compiled, failed the check (not timed)")
        if kind == "compile":
            ax.axhline(results["meta"]["cap_s"], color="grey", linestyle="--", label="compile cap")
        ax.set(xscale="log", yscale="log", xlabel="neurons (graph nodes x layers)", ylabel=ylabel)
        ax.grid(True, which="both", alpha=0.3)
    handles = {h.get_label(): h for ax in axes for h in ax.get_lines()}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize="small")
    meta = results["meta"]
    fig.suptitle(f"scalar GCN, Mutagenesis-shaped batches; torch {meta['torch']}, "
                 f"{meta['num_threads']} threads, {meta['device']}")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path = out / "scaling.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
