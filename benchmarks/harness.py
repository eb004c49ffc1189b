"""Measuring prepared systems in one process: correctness checks, interleaved timing, peak memory.

* **Checks** (before any timing): every system's output must equal the scalar
  model's eager output within ``OUTPUT_ATOL`` (float32); compiled scalar
  systems must also give the eager parameter gradients (max difference at most
  ``GRAD_RTOL`` times the largest gradient, or ``GRAD_RTOL`` if that is < 1).
  On large graphs float32 sums taken in another order than eager's can differ
  by more: then both are compared with eager float64 gradients, and the
  system passes if it is at least as close to them as eager float32 is. A
  system that fails is reported with its error and not timed.
* **Timing**: ``warmup`` untimed rounds, then ``runs`` timed rounds; a round
  calls every system once, in an order rotated by one each round (so that no
  system always runs right after another), measuring a forward under
  ``torch.no_grad()`` and a forward+backward of ``output.sum()`` (gradients set
  to None before, outside the timed region). Each timed call ends with a
  64 KB allocation, so that it pays for the frees glibc defers to the next
  large request (``_settle``). Reported: the medians; ratios
  between systems are ratios of those medians, all taken in the same process.
* **Peak memory**: the peak of tensor bytes allocated during one
  forward+backward, on top of what was alive before it. On CPU it comes from
  the allocator events of ``torch.profiler`` (``profile_memory=True``: the
  running ``total_allocated`` the CPU allocator reports; includes Inductor's
  buffers, which tracemalloc and dispatch modes do not see); on CUDA from
  ``torch.cuda.max_memory_allocated``. Neither counts Python objects or the
  compiled code.
"""
from __future__ import annotations

import copy
import statistics
import time
from typing import Callable, Iterable

import torch

from benchmarks.systems import Prepared

OUTPUT_ATOL = 1e-4
GRAD_RTOL = 1e-4


def reference(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """The scalar model's eager output and parameter gradients of ``output.sum()``."""
    out = model(x)
    out.sum().backward()
    grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def check(p: Prepared, x: torch.Tensor, expected: torch.Tensor, grads: list | None) -> dict:
    """Compare ``p``'s output (and, given ``grads``, its parameter gradients) with eager."""
    out = p.fn(x)
    result = dict(output_max_abs_diff=(out.detach() - expected).abs().max().item())
    ok = out.shape == expected.shape and result["output_max_abs_diff"] <= OUTPUT_ATOL
    if grads is not None:
        out.sum().backward()
        got = [torch.zeros_like(q) if q.grad is None else q.grad.detach().clone() for q in p.module.parameters()]
        want = [torch.zeros_like(g) if w is None else w for g, w in zip(got, grads)]
        result["grad_max_rel_diff"] = _max_rel_diff(got, want)
        if result["grad_max_rel_diff"] > GRAD_RTOL and x.dtype == torch.float32:
            # Large graphs: float32 sums in another order than eager's differ by more than the
            # tolerance. Then the gradients pass if they are at least as close as eager's to float64.
            exact = float64_gradients(p.module, x)
            result["float64_rel_diff"] = dict(eager=_max_rel_diff(want, exact), system=_max_rel_diff(got, exact))
            ok = ok and result["float64_rel_diff"]["system"] <= result["float64_rel_diff"]["eager"]
        else:
            ok = ok and result["grad_max_rel_diff"] <= GRAD_RTOL
    p.module.zero_grad(set_to_none=True)
    result["passed"] = bool(ok)
    return result


def _max_rel_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Largest difference over the parameters, each relative to its largest gradient (or absolute below 1)."""
    return max((((g.double() - w.double()).abs().max() / max(1.0, w.abs().max().item())).item()
                for g, w in zip(got, want)), default=0.0)


def float64_gradients(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Eager parameter gradients of ``output.sum()`` computed in float64 on a copy of ``model``."""
    exact = copy.deepcopy(model).double()
    exact(x.double()).sum().backward()
    return [torch.zeros_like(q) if q.grad is None else q.grad for q in exact.parameters()]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forward(p: Prepared, x: torch.Tensor) -> None:
    torch.compiler.cudagraph_mark_step_begin()   # each timed call is a step of its own (CUDA graph modes)
    with torch.no_grad():
        p.fn(x)


def _forward_backward(p: Prepared, x: torch.Tensor) -> None:
    torch.compiler.cudagraph_mark_step_begin()
    p.fn(x).sum().backward()


def _timed(fn: Callable[[], None], device: torch.device) -> float:
    _synchronize(device)
    start = time.perf_counter()
    fn()
    _settle()
    _synchronize(device)
    return time.perf_counter() - start


def _settle() -> None:
    """Make a call pay for its own frees. glibc defers merging freed small chunks until the next
    large request: after eager's forward+backward of a scalar model (hundreds of thousands of
    tiny tensors) that costs milliseconds, and it would land on whichever system is timed next.
    One 64 KB request inside the timed region triggers it; otherwise it costs about a microsecond."""
    torch.empty(1 << 14)


def time_interleaved(systems: list[Prepared], x: torch.Tensor, runs: int, warmup: int,
                     progress: Callable[[Iterable], Iterable] = iter) -> dict[str, dict[str, list[float]]]:
    """Seconds per forward and per forward+backward of every system, ``runs`` timed rounds each."""
    times = {p.name: dict(forward=[], forward_backward=[]) for p in systems}
    for rnd in progress(range(warmup + runs)):
        shift = rnd % len(systems)
        for p in systems[shift:] + systems[:shift]:
            p.module.zero_grad(set_to_none=True)
            fwd = _timed(lambda: _forward(p, x), x.device)
            fwd_bwd = _timed(lambda: _forward_backward(p, x), x.device)
            if rnd >= warmup:
                times[p.name]["forward"].append(fwd)
                times[p.name]["forward_backward"].append(fwd_bwd)
    for p in systems:
        p.module.zero_grad(set_to_none=True)
    return times


def peak_memory_bytes(p: Prepared, x: torch.Tensor) -> int:
    """Peak tensor bytes allocated during one forward+backward (see the module docstring)."""
    p.module.zero_grad(set_to_none=True)
    try:
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
            base = torch.cuda.memory_allocated(x.device)
            torch.cuda.reset_peak_memory_stats(x.device)
            _forward_backward(p, x)
            torch.cuda.synchronize(x.device)
            return torch.cuda.max_memory_allocated(x.device) - base
        return _cpu_peak_bytes(lambda: _forward_backward(p, x))
    finally:
        p.module.zero_grad(set_to_none=True)


def _cpu_peak_bytes(fn: Callable[[], None]) -> int:
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    peak, base, stack = 0, None, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            fields = event.extra_fields
            if base is None or event.start_time_ns < base[0]:
                base = (event.start_time_ns, fields.total_allocated - fields.alloc_size)
            peak = max(peak, fields.total_allocated)
    return 0 if base is None else peak - base[1]


def summarize(times: dict[str, list[float]]) -> dict:
    """Medians in milliseconds, with the spread (min, max) and the number of runs."""
    out = {}
    for kind, values in times.items():
        ms = [v * 1e3 for v in values]
        out[f"{kind}_ms"] = statistics.median(ms)
        out[f"{kind}_ms_min"], out[f"{kind}_ms_max"] = min(ms), max(ms)
    out["runs"] = len(next(iter(times.values())))
    return out


def ratios(result: dict, ref: dict) -> dict:
    """``result`` over ``ref``: forward, forward+backward and peak-memory ratios (medians)."""
    r = dict(forward=result["forward_ms"] / ref["forward_ms"],
             forward_backward=result["forward_backward_ms"] / ref["forward_backward_ms"])
    if result.get("peak_memory_bytes") and ref.get("peak_memory_bytes"):
        r["peak_memory"] = result["peak_memory_bytes"] / ref["peak_memory_bytes"]
    return r
