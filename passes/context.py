"""State shared by the passes of one graph compilation: options, logging, report."""
from __future__ import annotations

import logging
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dynamo_relational.options import Options

log = logging.getLogger("dynamo_relational")


@dataclass
class PassContext:
    options: Options
    #: fill the expensive parts of the report (lower bound, printed graphs)
    detailed: bool = False
    #: the graph is one sample's, to be grouped in a union with others (``dynamo_relational.union``): its results
    #: are joined with theirs, row by row
    in_union: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    node_counts: dict[str, int] = field(default_factory=dict)
    #: why nodes were left ungrouped: reason -> number of nodes
    ungrouped: Counter = field(default_factory=Counter)
    #: the same, with the nodes' names: reason -> [node name, ...]
    ungrouped_nodes: dict[str, list[str]] = field(default_factory=dict)
    #: why the graph must run in its original order (in-place ops left in it, mode switches such as
    #: autocast); grouping leaves every node alone when there is any reason
    keep_order: list[str] = field(default_factory=list)
    #: schedule chosen by the grouping pass (list of groups)
    groups: list[Any] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    #: what the outputs of the graph the pipeline started from share memory with
    #: (``passes/distinct_outputs.py``); None: not recorded, the outputs are left as they are
    output_aliases: Any = None
    #: the tensors whose values decided ``compress_values``'s merges, as (name, tensor, version counter):
    #: changed in place later, the compiled graph would merge rows that are no longer equal
    constants_read: list = field(default_factory=list)

    def leave_ungrouped(self, node, reason: str) -> None:
        self.ungrouped[reason] += 1
        self.ungrouped_nodes.setdefault(reason, []).append(node.name)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("left ungrouped: %s (%s): %s", node.name, node.target, reason)

    @contextmanager
    def timed(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
