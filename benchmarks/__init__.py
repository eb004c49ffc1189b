"""Benchmarks: compiled scalar-granular models against eager, stock torch.compile and PyTorch Geometric.

``python -m benchmarks --quick`` (a few minutes) or ``python -m benchmarks`` (full
sizes); see docs/BENCHMARKS.md. Modules: ``workloads`` (what is measured),
``peers`` (the PyG models with the same weights), ``systems`` (how each system is
compiled), ``harness`` (checks, interleaved timing, peak memory), ``session``
(one process's measurements), ``worker`` (capped systems in a child process),
``report`` (JSON and markdown), ``plots`` (the scaling sweep's figure), ``run``
(the command line).
"""
