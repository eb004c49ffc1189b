"""Capped systems: one child process per (workload, system), killed when compiling exceeds the cap.

TorchDynamo traces the scalar model at about 1 ms per FX node, so stock
``torch.compile`` and ``backend="relational"`` on a full-size scalar model can
take from minutes to hours. :func:`run_capped` starts

    python -m benchmarks.worker WORKLOAD SYSTEM --references pyg --runs N ...

which runs one :func:`~benchmarks.session.run_session` (with the parent's
number of threads): the capped system first, then its reference system (PyG
eager, or eager when the workload has no PyG peer), so that the capped
system's ratios are still taken in one process.
The child writes ``COMPILING`` and ``COMPILED`` around the capped system's
compilation and ``RESULT <json>`` at the end; the parent kills it when
``COMPILED`` does not come within ``cap`` seconds of ``COMPILING`` and reports
the system as ``> cap``. Each child compiles into its own temporary Inductor cache
(a kill at the cap can leave half-written kernels, which must not reach the
user's cache), so capped systems' compile times are cold-cache times.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from benchmarks.workloads import Workload

ROOT = Path(__file__).resolve().parent.parent


def run_capped(workload: Workload, system: str, references: list[str], *, runs: int, warmup: int,
               device: str, cap_s: float, options: dict | None = None) -> dict:
    """Measure ``system`` with ``references`` in a child; the session dict, or ``{system: status}``."""
    cmd = [sys.executable, "-m", "benchmarks.worker", workload.name, system, "--references", ",".join(references),
           "--runs", str(runs), "--warmup", str(warmup), "--device", device,
           "--options", json.dumps(options or {}), "--threads", str(torch.get_num_threads())]
    # Its own Inductor cache: a child killed at the cap may leave half-written kernels behind,
    # which a shared cache would load later ("ImportError: ... .so: file too short").
    cache = tempfile.mkdtemp(prefix="relational-bench-inductor-")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               TORCHINDUCTOR_CACHE_DIR=cache)
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env, start_new_session=True)
    try:
        outcome = _follow(child, cap_s)
    finally:   # the cap, an error or Ctrl-C here: the child and whatever it started go too
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        shutil.rmtree(cache, ignore_errors=True)
    if isinstance(outcome, dict):
        return outcome
    entry = dict(status=outcome)
    if outcome.startswith(">"):
        entry["compile"] = dict(total=None)
    return dict(size=None, systems={system: entry})


def _follow(child: subprocess.Popen, cap_s: float) -> dict | str:
    """The child's result, or why there is none ("> cap (N s)" or "failed: ...")."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in child.stdout] + [lines.put(None)],
                     daemon=True).start()
    deadline = None
    while True:
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            return f"> cap ({cap_s:g} s)"
        if line is None:
            return f"failed: child exited with {child.wait()}"
        if line.startswith("COMPILING"):
            deadline = time.monotonic() + cap_s
        elif line.startswith("COMPILED"):
            deadline = None
        elif line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("system")
    parser.add_argument("--references", default="")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--options", type=json.loads, default={}, help="backend options as JSON")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (the parent's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from benchmarks.session import run_session

    def on_event(event: str, system: str) -> None:
        if system == args.system:
            print(event.upper(), flush=True)

    systems = [args.system] + [s for s in args.references.split(",") if s]
    result = run_session(Workload.parse(args.workload), systems, runs=args.runs, warmup=args.warmup,
                         device=args.device, options=args.options, on_event=on_event)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
