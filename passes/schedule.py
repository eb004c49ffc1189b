"""Batching schedules: which nodes run together, in which order.

Input: ``n`` units in topological order, ``preds[i]`` (indices of the units
that unit ``i`` reads) and ``signatures[i]`` (hashable; ``None`` means the
unit can only run alone). Output: a list of groups (lists of unit indices)
whose members are pairwise independent, in an order that respects every
dependency. Each schedule is linear in the graph size, plus, for the agendas,
a choice among the ready signatures per group.
"""
from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np


def asap_depths(preds: Sequence[Sequence[int]]) -> list[int]:
    depth = [0] * len(preds)
    for i, ps in enumerate(preds):
        if ps:
            depth[i] = 1 + max([depth[p] for p in ps])
    return depth


def asap(preds, signatures, depth=None) -> list[list[int]]:
    """Depth-based batching (TensorFlow Fold, ACRoBat): group by (ASAP level, signature).

    Units on one level never depend on each other, so every group is legal.
    """
    depth = depth or asap_depths(preds)
    groups: dict[Hashable, list[int]] = {}
    for i, sig in enumerate(signatures):
        key = (depth[i], ("alone", i) if sig is None else sig)
        members = groups.get(key)
        if members is None:
            groups[key] = [i]
        else:
            members.append(i)
    return [groups[key] for key in sorted(groups, key=lambda k: (k[0], groups[k][0]))]


def agenda(preds, signatures, depth=None) -> list[list[int]]:
    """DyNet's agenda-based batching.

    Repeatedly run every ready unit of the signature whose units have the lowest
    average depth over the whole graph; units that can only run alone run as
    soon as they are ready. Waiting lets slow branches catch up, so one
    signature ends in fewer, larger groups than under ASAP when depths differ.
    """
    return _agenda(preds, signatures, depth, by_share=False)


def ready_share(preds, signatures, depth=None) -> list[list[int]]:
    """The agenda, choosing the signature with the largest share of its units not yet run that are ready.

    A signature most of whose remaining units are ready loses little by running
    now; one with a few ready among many waits for its slower branches, as in
    DyNet's agenda, but judged by what is left of it rather than by average
    depth over the whole graph. Ties go to the lower average depth.
    """
    return _agenda(preds, signatures, depth, by_share=True)


def _agenda(preds, signatures, depth, by_share: bool) -> list[list[int]]:
    n = len(preds)
    depth = depth or asap_depths(preds)
    waiting = [0] * n
    succs: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        if ps:
            distinct = ps if len(ps) == 1 else set(ps)
            waiting[i] = len(distinct)
            for p in distinct:
                succs[p].append(i)
    totals: dict[Hashable, list[int]] = {}
    for i, sig in enumerate(signatures):
        if sig is not None:
            total = totals.get(sig)
            if total is None:
                totals[sig] = [depth[i], 1]
            else:
                total[0] += depth[i]
                total[1] += 1
    priority = {sig: total / count for sig, (total, count) in totals.items()}
    left = {sig: count for sig, (_, count) in totals.items()}   # units of each signature not yet run
    ready: dict[Hashable, list[int]] = {}
    alone: list[int] = []

    for i in range(n):
        if waiting[i] == 0:
            sig = signatures[i]
            if sig is None:
                alone.append(i)
            else:
                ready.setdefault(sig, []).append(i)
    groups: list[list[int]] = []
    while alone or ready:
        if alone:
            group = [alone.pop()]
        else:
            if by_share:
                sig = min(ready, key=lambda s: (-len(ready[s]) / left[s], priority[s], ready[s][0]))
            else:
                sig = min(ready, key=lambda s: (priority[s], ready[s][0]))
            group = sorted(ready.pop(sig))
            left[sig] -= len(group)
        groups.append(group)
        for i in group:
            for s in succs[i]:
                remaining = waiting[s] - 1
                waiting[s] = remaining
                if remaining == 0:   # ready: released like the units above
                    sig = signatures[s]
                    if sig is None:
                        alone.append(s)
                    else:
                        members = ready.get(sig)
                        if members is None:
                            ready[sig] = [s]
                        else:
                            members.append(s)
    if sum(len(g) for g in groups) != n:
        raise AssertionError("agenda schedule lost units: the dependency graph has a cycle")
    return groups


def merged(groups: list[list[int]], preds, signatures, rounds: int = 4) -> list[list[int]]:
    """``groups`` with whole groups moved into another group of their signature where the dependencies allow.

    Scanning from the last group back, a group joins the next group of its signature when every unit that
    reads one of its members runs after that group (its readers were moved as late as they can go before it);
    scanning forward, a group joins the previous group of its signature when every unit its members read runs
    before that group. A schedule that split one level of a tree between two groups (some of its units were
    ready later) runs it as one. Moves keep every unit after its inputs, and a group's members stay
    independent: a reader of a moved member runs after the group it joins. Units that run alone never move.
    """
    succs: list[list[int]] = [[] for _ in preds]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    members = [list(g) for g in groups]
    at = [0] * len(preds)   # unit -> index of its group in ``members``
    for g, units in enumerate(members):
        for i in units:
            at[i] = g
    signature = [signatures[units[0]] for units in members]
    for _ in range(rounds):
        moved = _merge_pass(members, at, signature, succs, later=True)
        moved += _merge_pass(members, at, signature, preds, later=False)
        if not moved:
            break
    return [sorted(units) for units in members if units]


def _merge_pass(members, at, signature, neighbours, later: bool) -> int:
    """One scan of :func:`merged`: moves groups to the next (``later``) or previous group of their signature
    when no neighbour (readers when ``later``, inputs otherwise) of their members lies in between."""
    order = range(len(members) - 1, -1, -1) if later else range(len(members))
    partner: dict = {}   # signature -> the nearest live group in the direction scanned from
    moved = 0
    for g in order:
        units, sig = members[g], signature[g]
        if not units or sig is None:
            continue
        target = partner.get(sig)
        if target is not None and all(at[w] > target if later else at[w] < target
                                      for i in units for w in neighbours[i]):
            for i in units:
                at[i] = target
            members[target].extend(units)
            members[g] = []
            moved += 1
        else:
            partner[sig] = g
    return moved


def lower_bound(preds, signatures, depth=None) -> int:
    """ED-Batch's lower bound on the number of groups of any legal schedule:
    max(longest path, alone units + sum over signatures of the most units of
    that signature on one path)."""
    depth = depth or asap_depths(preds)
    longest = (max(depth) + 1) if depth else 0
    kinds = {sig: j for j, sig in enumerate(dict.fromkeys(s for s in signatures if s is not None))}
    alone = sum(1 for s in signatures if s is None)
    if not kinds:
        return max(longest, alone)
    return max(longest, alone + int(_most_on_one_path(preds, signatures, kinds, depth).sum()))


def _most_on_one_path(preds, signatures, kinds: dict, depth: list[int]) -> np.ndarray:
    """Per signature, the most units of it on one path. A unit's counts are its own plus the elementwise
    maximum of its inputs'; the units of one ASAP level read only lower levels, so each level is one
    vectorized step (a unit-by-unit loop costs a numpy call per unit)."""
    n = len(preds)
    depths = np.asarray(depth)
    # (a count is at most the longest path's length: 16 bits hold a union's, at half the memory)
    counts = np.zeros((n, len(kinds)), dtype=np.int16 if depths.max() < np.iinfo(np.int16).max else np.int32)
    typed = [i for i, s in enumerate(signatures) if s is not None]
    counts[typed, [kinds[signatures[i]] for i in typed]] = 1
    fan_in = np.fromiter(map(len, preds), dtype=np.int64, count=n)
    flat = np.fromiter((p for ps in preds for p in ps), dtype=np.int64, count=int(fan_in.sum()))
    first = np.cumsum(fan_in) - fan_in   # where each unit's inputs start in ``flat``
    by_level = np.argsort(depths, kind="stable")
    bounds = np.searchsorted(depths[by_level], np.arange(1, depths.max() + 2))
    for start, stop in zip(bounds[:-1], bounds[1:]):
        units = by_level[start:stop]   # (each has inputs: its level is above 0)
        sizes = fan_in[units]
        segments = np.cumsum(sizes) - sizes
        inputs = flat[np.repeat(first[units] - segments, sizes) + np.arange(int(sizes.sum()))]
        counts[units] += np.maximum.reduceat(counts[inputs], segments, axis=0)
    return counts.max(axis=0)
