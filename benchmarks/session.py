"""One measuring session: some systems on one workload, in this process.

Builds the workload, computes the eager reference, prepares (compiles) and
checks every system, times the ones that passed interleaved, measures their
peak memory and computes their ratios against the reference systems of the same
session (``pyg``, ``pyg_compile``, ``eager``: whichever take part).
"""
from __future__ import annotations

import traceback
from typing import Callable, Iterable

import torch

from benchmarks import harness
from benchmarks.systems import NEEDS_PEER, prepare
from benchmarks.workloads import Workload

#: systems that ratios are taken against, when they take part in the session
REFERENCES = ("pyg", "pyg_compile", "eager")
#: on CPU, peak memory is measured with torch.profiler, which records every op: a system slower
#: than this per forward+backward (eager on a large scalar model: millions of ops) is not profiled
PROFILE_LIMIT_MS = 2000.0


def run_session(workload: Workload, systems: list[str], *, runs: int, warmup: int, device: str = "cpu",
                options: dict | None = None, progress: Callable[[Iterable], Iterable] = iter,
                on_event: Callable[[str, str], None] = lambda event, system: None) -> dict:
    """Measure ``systems`` on ``workload``; returns the workload's size and one entry per system.

    Each entry has ``status`` ("ok" or why it was not timed), ``compile``
    (seconds), ``check`` (differences against eager), the median times,
    ``peak_memory_bytes`` and ``vs`` (ratios against the session's reference
    systems). ``options`` are the relational systems' backend options;
    ``on_event("compiling", system)`` and ``on_event("compiled", system)``
    bracket each system's preparation (also when it fails).
    """
    torch._dynamo.reset()
    built = workload.build()
    model, x = built.model.to(device), built.x.to(device)
    peer = built.peer.to(device) if built.peer is not None else None
    expected, grads = harness.reference(model, x)

    results, ready = {}, []
    for system in systems:
        entry = results[system] = dict(status="ok")
        on_event("compiling", system)
        try:
            p = prepare(system, model, peer, x, options)
            on_event("compiled", system)
            entry["compile"] = p.compile
            entry["check"] = harness.check(p, x, expected, grads if system not in NEEDS_PEER else None)
        except Exception as error:  # a system that fails to compile is reported, not fatal
            on_event("compiled", system)
            entry["status"] = f"failed: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
            entry["traceback"] = traceback.format_exc(limit=-3)
            continue
        if entry["check"]["passed"]:
            ready.append(p)
        else:
            entry["status"] = "failed check (not timed)"

    if ready:
        times = harness.time_interleaved(ready, x, runs, warmup, progress)
        for p in ready:
            entry = results[p.name]
            entry.update(harness.summarize(times[p.name]))
            if x.device.type == "cpu" and entry["forward_backward_ms"] > PROFILE_LIMIT_MS:
                entry["peak_memory_bytes"] = None   # the profiler would record millions of tiny ops
                entry["peak_memory_note"] = f"not measured: forward+backward over {PROFILE_LIMIT_MS:g} ms"
            else:
                entry["peak_memory_bytes"] = harness.peak_memory_bytes(p, x)
    for system, entry in results.items():
        if "forward_ms" in entry:
            entry["vs"] = {ref: harness.ratios(entry, results[ref]) for ref in REFERENCES
                           if ref != system and "forward_ms" in results.get(ref, {})}
    return dict(size=built.size, systems=results)
