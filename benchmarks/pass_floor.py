"""The floor of a Python pass pipeline: the least work per FX node grouping needs, timed on the real graph.

``python -m benchmarks.compile_scale --floor`` runs :func:`run` as an extra
first pass, on the traced graph before any other pass. It reads every node
once and, on integer ids, without rewriting the graph and without any of
the checks that make the real passes correct (purity, in-place writes,
dtypes, broadcasting, mode switches):

* merges duplicates: equal target and equal operands, one id (CSE);
* opens each sum: an ``add`` whose operand is an ``add`` used once takes
  that operand's terms (aggregation);
* gives each node a signature (target and operand shapes) and an ASAP level
  (one more than its deepest operand), and counts the groups these make
  (grouping's keys and the simplest schedule).

Whatever the passes do beyond this (describing each op for the catalog,
choosing between schedules, emitting the grouped graph with its gathers)
costs more. So ``1 / floor`` estimates the most FX nodes per second that a
pipeline written in Python over ``torch.fx`` nodes can reach on this
machine (a cleverer loop may shave some of it; the checks add to it). It
returns the graph unchanged; its time lands in the report's timings under
``"read_floor"`` and its counts in ``ctx.stats["floor"]``.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from dynamo_relational.ops import tensor_info

NAME = "read_floor"
_ADDITIONS = (operator.add, torch.add)
_CONSTANTS = (int, float, bool, str, type(None))


def run(gm: fx.GraphModule, ctx) -> fx.GraphModule:
    node_type = fx.Node
    ids: dict[fx.Node, int] = {}      # node -> id of the distinct value it computes
    distinct: dict[tuple, int] = {}   # (op, target, operands) -> id
    target_of: list = []              # id -> target
    operands_of: list[tuple] = []     # id -> operand ids and constants
    uses: list[int] = []              # id -> how many distinct values read it
    level: list[int] = []             # id -> ASAP level
    groups: set = set()               # (level, signature)
    for node in gm.graph.nodes:
        operands = tuple([ids[a] if type(a) is node_type else (type(a), a) if type(a) in _CONSTANTS else id(a)
                          for a in node.args])
        key = (node.op, node.target, operands, id(node) if node.kwargs else None)
        i = distinct.get(key)
        if i is not None:
            ids[node] = i
            continue
        i = distinct[key] = ids[node] = len(target_of)
        target_of.append(node.target)
        operands_of.append(operands)
        uses.append(0)
        depth = 0
        for o in operands:
            if type(o) is int and o < i:   # an operand's id (ids of other objects are large)
                uses[o] += 1
                if level[o] >= depth:
                    depth = level[o] + 1
        level.append(depth)
        signature = (node.target, tuple([tensor_info(a) for a in node.args if type(a) is node_type]))
        groups.add((depth, signature))
    terms: dict[int, list] = {}
    absorbed = 0
    for i, target in enumerate(target_of):
        if target in _ADDITIONS:
            collected = []
            for o in operands_of[i]:
                if type(o) is int and o < i and target_of[o] in _ADDITIONS and uses[o] == 1:
                    collected.extend(terms.pop(o))
                    absorbed += 1
                else:
                    collected.append(o)
            terms[i] = collected
    ctx.stats["floor"] = dict(nodes=len(ids), distinct=len(target_of), sums=len(terms), absorbed=absorbed,
                              groups=len(groups))
    return gm
