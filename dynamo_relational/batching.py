"""``dynamo_relational.batch``: a model written for one sample, run over mini-batches of samples whose
structures differ (parse trees, molecules, grounded networks).

    batched = dynamo_relational.batch(model)
    outputs = batched([(tree, tokens), (tree2, tokens2), ...])   # one argument tuple per sample

Each distinct sample **structure** is traced once (the fast front-end's tracer)
and rewritten on its own (:data:`dynamo_relational.union.SAMPLE_PASSES`). The
structures seen are grouped together as one union
(:mod:`dynamo_relational.union`), and every batch whose structures that union
holds runs the union's grouped graph restricted to the batch's samples
(:mod:`dynamo_relational.row_plan`), its index tensors computed for the batch
together (:mod:`dynamo_relational.assembly`): no tracing, no passes, no
compiling.

A structure seen for the first time is traced, and until the union holds it
its samples run with the model itself (eagerly). With gradients on, the trace
of a new structure is its sample's call: the call runs as in eager while each
torch op it makes is recorded (:mod:`~dynamo_relational.recorder`), so the
model does not run a second time (unless the recording gives up on code it
cannot see in full: the structure is then traced from copies of the tensors).
When structures come back
(:data:`REGROUP_SHARE`), every structure seen is grouped as the new union, which
then serves every batch: usually once, when the second epoch begins. Where the
ungrouped union would not fit in memory (``max_union_nodes``), the structures
are grouped in several unions (shards) of consecutive structures, each batch
running each union that holds some of its samples.

A sample's structure is everything of its arguments except the values of its
tensors: the Python objects (compared by value, recursively through lists,
tuples, dicts, other mappings and the attributes of objects) and the tensors'
shapes, dtypes and devices (:func:`fingerprint`). Its tensors, wherever they
are (a PyG ``Data``'s ``x``), are the inputs: a trace's call gets a deep copy
of the sample holding the traced tensors. An integer tensor whose values
``forward`` reads in Python (``for u, v in edge_index.t().tolist()``) is
structure: found on the first trace that reads it, it is compared by value
from then on, at its path, and each trace keeps a copy of it. ``key=``
replaces the comparison with a function of the sample; two samples with equal
keys must have the same structure.

Where the union cannot be restricted (an op that mixes rows of samples, a
per-sample value the analysis cannot place), the reason is logged once and
the batch runs its samples one by one with the model itself.
"""
from __future__ import annotations

import copy
import ctypes
import dataclasses
import enum
import inspect
import logging
import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from typing import Any, Callable, Collection, Hashable, Literal, Sequence

import numpy
import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from .kernels.gather_reduce import INDEXED_FORMS
from .errors import (DataDependenceError, FrontendError, GradStateRead, OptionsError, StoredTracedValue,
                     UntracedCall)
from .module_hooks import global_hooks, module_hooks
from .options import Options
from .passes import PassContext
from .progress import CompileProgress
from .row_plan import Batch, Refused, RowPlan, analyse
from .tracer import gc_paused
from .tracing import trace
from .tracing_patches import patches_when_needed
from .union import UNION_PASSES, Layout, NotBatchable, SampleGraph, build, prepare, run_passes, structure_inputs

log = logging.getLogger("dynamo_relational")

__all__ = ["batch", "BatchedModule", "BatchReport", "fingerprint"]

#: a batch whose structures are not all in the union regroups all structures seen into a new union when at
#: least half of its samples have structures seen in earlier batches but not in the union (structures come
#: back: usually when the second epoch begins), and the structures outside the union number at least this
#: fraction of those in it (so that regrouping costs O(structures) in all); else the samples outside the
#: union run with the model itself
REGROUP_SHARE = 0.125
#: what grouping a union takes per FX node of it at its peak (measured: 2.1-2.5 KB, the ungrouped union as an FX
#: graph and the grouping pass's tables); ``max_union_nodes="auto"`` fits the unions into the memory available
UNION_BYTES_PER_NODE = 2500
#: code made per union (when it is grouped), each for the batches that leave a set of its values empty (the
#: batches of a depth, for trees: they skip the deeper levels); a batch runs the one that skips the most
MAX_PRUNED_GRAPHS = 12


def batch(model: nn.Module, *, key: Callable[..., Hashable] | None = None,
          max_union_nodes: int | Literal["auto"] | None = "auto", **options: Any) -> "BatchedModule":
    """``model`` (whose ``forward`` takes one sample) run over lists of samples; see the module docstring.

    ``key(*sample)``, if given, names a sample's structure (default: :func:`fingerprint`).
    ``max_union_nodes`` bounds the FX nodes of the traced structures grouped as one union (what grouping's
    memory grows with); more are grouped as several unions, and a batch runs each that holds some of its
    samples. ``"auto"``: as many as the memory available when grouping begins holds
    (:data:`UNION_BYTES_PER_NODE` each); ``None``: no bound. Keyword options are the backend's
    (:class:`~dynamo_relational.Options`); ``progress`` shows a bar while new samples are traced."""
    if not isinstance(model, nn.Module):
        raise FrontendError(f"batch expects an nn.Module, got {type(model).__name__}")
    if not (max_union_nodes in (None, "auto") or (type(max_union_nodes) is int and max_union_nodes > 0)):
        raise OptionsError(f"max_union_nodes must be a positive int, 'auto' or None, got {max_union_nodes!r}")
    return BatchedModule(model, key, Options.from_mapping(options), max_union_nodes)


@dataclass
class BatchReport:
    """What :class:`BatchedModule` did so far."""
    samples: int = 0
    batches: int = 0
    #: sample structures traced (again after a switch of train/eval mode)
    structures: int = 0
    #: unions grouped (each one pass pipeline over its structures)
    groupings: int = 0
    #: samples run with the model itself because the union did not hold their structure yet
    eager_samples: int = 0
    #: batches that ran their samples one by one because no union could run them, and why (the last reason)
    unbatched: int = 0
    unbatched_reason: str | None = None
    trace_seconds: float = 0.0
    grouping_seconds: float = 0.0
    #: per batch run from a union: seconds to key the samples and compute its index tensors
    assembly_seconds: list[float] = field(default_factory=list)
    #: FX nodes of the traced structures kept (for grouping them again): what memory grows with
    kept_nodes: int = 0
    #: the current unions: one, unless the structures' FX nodes exceed ``max_union_nodes``
    unions: int = 0
    #: FX nodes of the current unions before and after grouping
    union_nodes: tuple[int, int] = (0, 0)
    #: groups of the current unions' schedules, and ED-Batch's lower bound on them (``explain()``'s quality)
    union_groups: tuple[int, int] = (0, 0)
    #: the current unions' code: how many variants (for batches that leave values empty), and the fewest and
    #: most ops one runs
    union_code: tuple[int, int, int] = (0, 0, 0)

    def __str__(self) -> str:
        assembly = sorted(self.assembly_seconds)
        median = assembly[len(assembly) // 2] * 1e3 if assembly else float("nan")
        lines = [
            ("samples", self.samples), ("batches", self.batches), ("structures traced", self.structures),
            ("FX nodes kept of the traced structures", self.kept_nodes), ("unions grouped", self.groupings),
            ("current unions", self.unions),
            ("union FX nodes before/after", "%d / %d" % self.union_nodes),
            ("union groups / lower bound", "%d / %d" % self.union_groups),
            ("union code variants (ops, fewest-most)", "%d (%d-%d)" % self.union_code),
            ("samples run eagerly (structure new to the union)", self.eager_samples),
            ("batches run one sample at a time", self.unbatched), ("tracing [s]", f"{self.trace_seconds:.2f}"),
            ("grouping [s]", f"{self.grouping_seconds:.2f}"), ("assembly per batch, median [ms]", f"{median:.2f}"),
        ]
        if self.unbatched_reason:
            lines.append(("why unbatched", self.unbatched_reason))
        width = max(len(name) for name, _ in lines)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in lines)


class _SampleCall(nn.Module):
    """``model`` called on one sample whose tensors are the arguments (what the tracer records). (The sample
    is held in a closure: its tensors are the trace's inputs, which a live trace may change as the call would,
    not tensors the model holds.)"""

    def __init__(self, model: nn.Module, sample: tuple, inputs: _Inputs | None = None):
        super().__init__()
        self.model = model
        if inputs is None or not (inputs.objects or inputs.by_value):
            self.arguments = lambda tensors: _substituted(sample, iter(tensors))
            return
        # Objects, or tensors read by value: the call gets a deep copy of the sample whose inputs are the traced
        # tensors, and whose tensors read by value are copies (structure, which each trace keeps). What forward
        # stores on the sample's objects (per-node code passing a node's state to its parent as ``tree.state``)
        # stays on the copy, as a run from the union stores nothing: the sample's structure stays as it was.
        originals, kept = inputs.tensors, {id(t): t.clone() for t in inputs.by_value.values()}

        def arguments(tensors: Sequence[torch.Tensor]) -> tuple:
            memo: dict[int, Any] = {id(o): t for o, t in zip(originals, tensors)}
            memo.update(kept)
            return copy.deepcopy(sample, memo)
        self.arguments = arguments

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.model(*self.arguments(tensors))

    @property
    def shown_as(self) -> str:
        """The name that messages about this call's ``forward`` give it: the model's."""
        return type(self.model).__name__


def _substituted(value: Any, tensors) -> Any:
    """``value`` with its tensors (in :func:`fingerprint`'s order) replaced by the next of ``tensors``."""
    if isinstance(value, torch.Tensor):
        return next(tensors)
    kind = type(value)
    if kind in (list, tuple):
        return kind(_substituted(item, tensors) for item in value)
    if kind is dict:
        return {k: _substituted(v, tensors) for k, v in value.items()}
    return value


@dataclass
class _Inputs:
    """Where a sample's tensors are, found by :func:`fingerprint` when asked: each input tensor and its path,
    whether the sample holds objects (which forward may change), and the integer tensors read by value
    (structure), by path."""
    tensors: list[torch.Tensor] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    objects: bool = False
    by_value: dict[str, torch.Tensor] = field(default_factory=dict)

    def add(self, t: torch.Tensor, path: str, by_value: Collection[str]) -> bool:
        """Note the tensor ``t`` found at ``path``; whether it is read by value (structure), not an input."""
        if path in by_value and _is_structure(t):
            self.by_value[path] = t
            return True
        self.tensors.append(t)
        self.paths.append(path)
        return False


@dataclass
class _Structure:
    graph: SampleGraph | None
    #: why it cannot join a union (then its samples run one by one)
    refused: str | None = None
    #: where ``forward`` read ``requires_grad``: the gradient state its trace holds for (:meth:`BatchedModule.
    #: _grad_state`); the union serves its samples in that state alone
    grad_state: tuple | None = None
    #: refused where tracing without gradients could not answer a read of ``requires_grad``: traced again by
    #: the first batch with gradients on
    retrace_with_grad: bool = False


class _Key:
    """A sample's structure key with its hash computed once: keys are deep tuples, looked up several times
    per batch."""
    __slots__ = ("value", "hash")

    def __init__(self, value: Hashable):
        self.value, self.hash = value, hash(value)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is _Key and self.hash == other.hash and self.value == other.value)


@dataclass
class _Cache:
    structures: dict[Hashable, _Structure] = field(default_factory=dict)
    #: the structures that may join a union (not refused on their own), in the order seen
    joinable: list[Hashable] = field(default_factory=list)
    #: the unions grouped from consecutive runs of ``joinable`` (one unless ``max_union_nodes`` splits them)
    unions: list["_Union"] = field(default_factory=list)
    #: structure -> the union that holds it
    holder: dict[Hashable, "_Union"] = field(default_factory=dict)
    #: why grouping the structures failed, and how many there were (not tried again until more come)
    refused: tuple[int, str] | None = None


@dataclass
class _Union:
    keys: list[Hashable]
    position: dict[Hashable, int]
    layout: Layout
    plan: RowPlan
    #: the plan's code for batches that leave some of its values empty (:meth:`RowPlan.without`): the sets of
    #: empty values, one row each (the first none), and the code for each
    pruned: numpy.ndarray = field(init=False)
    graphs: list[fx.GraphModule] = field(init=False)
    #: each graph's ``forward``, bound once (skips ``nn.Module.__call__`` on every batch)
    runs: list[Callable] = field(init=False)
    #: the graph's ops per slot of :meth:`RowPlan.empty_values`
    ops: numpy.ndarray = field(init=False)

    #: samples per batch when it was grouped: what the pruned code is made for
    batch_size: int = 1
    #: every structure's result is one tensor (the graph's only output, no constants): a sample's result is
    #: its part of that output
    single_tensor: bool = False
    #: FX nodes before and after grouping; groups and their lower bound
    nodes: tuple[int, int] = (0, 0)
    groups: tuple[int, int] = (0, 0)

    def __post_init__(self):
        self.ops = self.plan.ops_per_slot
        self.pruned = _prunable_sets(self.plan.empty_in_samples(), self.ops, self.batch_size)
        # (indices new every batch: the forms without sparse matrices)
        self.graphs = [self.plan.without(empty, INDEXED_FORMS) for empty in self.pruned]
        self.runs = [graph.forward for graph in self.graphs]

    def run_for(self, batch: Batch) -> Callable:
        """The code that skips the most ops of what ``batch`` leaves empty."""
        if len(self.runs) == 1:   # (no value is left empty by enough batches: the molecules' unions)
            return self.runs[0]
        empty = self.plan.empty_values(batch)
        skipped = numpy.where(~(self.pruned & ~empty).any(1), self.pruned @ self.ops, -1)
        return self.runs[int(skipped.argmax())]


def _prunable_sets(empty_in_samples: numpy.ndarray, ops: numpy.ndarray, batch_size: int) -> numpy.ndarray:
    """[sets, slots]: the sets of empty values the union's code is made for, the first none. With the samples
    ordered by how much they leave empty (for trees: by depth, shallow first), the values the first ``k`` all
    leave empty are left empty by every batch of those samples. The ``k`` are chosen so that each set serves
    as many random batches of ``batch_size`` samples (up to :data:`MAX_PRUNED_GRAPHS` sets): a batch's last
    sample in that order is among the first ``k`` with probability ``(k / samples) ** batch_size``."""
    samples = empty_in_samples.shape[1]
    order = numpy.argsort(-(ops @ empty_in_samples), kind="stable")
    nested = numpy.logical_and.accumulate(empty_in_samples[:, order], axis=1).T
    shares = numpy.arange(1, MAX_PRUNED_GRAPHS) / MAX_PRUNED_GRAPHS
    firsts = numpy.unique(numpy.maximum(1, (samples * shares ** (1 / max(batch_size, 1))).astype(int)))
    chosen = [numpy.zeros(ops.shape[0], dtype=bool)]
    for k in firsts[::-1]:
        if (nested[k - 1] & ~chosen[-1]).any():
            chosen.append(nested[k - 1])
    return numpy.array(chosen)


class BatchedModule(nn.Module):
    """The result of :func:`batch`: call it with a list of samples (argument tuples); returns the list of
    ``model``'s results, in order. Gradients reach ``model.parameters()``; ``report`` tells what it did."""

    def __init__(self, model: nn.Module, key: Callable[..., Hashable] | None, options: Options,
                 max_union_nodes: int | Literal["auto"] | None = "auto"):
        super().__init__()
        self.model = model
        self.key = key
        self.options = options
        self.max_union_nodes = max_union_nodes
        self.report = BatchReport()
        #: per state of the modules (:meth:`_state`): the structures traced and the union grouped in it
        self._caches: dict[tuple, _Cache] = {}
        self._cache = _Cache()
        self._canonical: dict[_Key, _Key] = {}
        #: which records of a trace collate, its program and the arguments it reads whole, by its shapes' pattern
        #: (``union.prepare``)
        self._collations: dict[Hashable, tuple | None] = {}
        #: the paths (``argument 1``, ``argument 0._store['edge_index']``) of the integer tensors that ``forward``
        #: reads in Python (``edge_index.tolist()``): structure, compared by value and kept by each trace, not inputs
        self._by_value: set[str] = set()

    def forward(self, samples: Sequence[Any]) -> list[Any]:
        if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence):
            raise FrontendError(f"a batched {type(self.model).__name__} takes a list of samples (argument tuples), "
                                f"got {type(samples).__name__}")
        samples = [s if type(s) is tuple else (s,) for s in samples]
        self.report.batches += 1
        self.report.samples += len(samples)
        if not samples:
            return []
        self._cache = self._caches.setdefault(self._state(), _Cache())
        while True:
            found, tensors = zip(*(self._key(sample, i) for i, sample in enumerate(samples)))
            keys = [self._canonical.setdefault(k, k) for k in found]   # later lookups find the very key object
            try:
                # (the samples traced now were computed by their traces, as the model computes them)
                new, traced = self._trace_new(keys, samples, tensors)
                break
            except _ReadByValue as e:   # structure, not input: every sample's key changes
                log.info("relational: forward reads the values of the integer tensor(s) at %s: they are keyed by "
                         "value, as structure", sorted(e.paths))
                self._by_value |= e.paths
        refusal = self._regroup_if_due(keys, new)
        if refusal is not None:
            return self._one_by_one(samples, tensors, refusal, traced)
        holder = self._cache.holder
        structures = self._cache.structures
        held = [i for i, k in enumerate(keys) if k in holder]
        if any(structures[keys[i]].grad_state is not None for i in held):
            held = self._in_traced_grad_state(held, keys, tensors)
        # a structure refused on its own runs with the model, beside the others from the union
        refused = next((structures[k].refused for k in keys if structures[k].refused), None)
        if refused is not None:
            if not held:
                return self._one_by_one(samples, tensors, refused, traced)
            self._note_unbatched(refused)
        results: list[Any] = [None] * len(samples)
        if held:
            by_union: dict[int, list[int]] = {}
            for i in held:
                by_union.setdefault(id(holder[keys[i]]), []).append(i)
            assembly = 0.0
            for chosen in by_union.values():
                union_results, seconds = self._run(holder[keys[chosen[0]]], [keys[i] for i in chosen],
                                                   [tensors[i] for i in chosen])
                assembly += seconds
                for i, result in zip(chosen, union_results):
                    results[i] = result
            self.report.assembly_seconds.append(assembly)
        for i in sorted(set(range(len(samples))) - set(held)):
            results[i] = self._called(samples, tensors, i, traced)
        self.report.eager_samples += len(samples) - len(held)
        return results

    # -- structures ---------------------------------------------------------
    def _key(self, sample: tuple, i: int) -> tuple[Hashable, list[torch.Tensor]]:
        """The structure of sample ``i`` and its tensors."""
        if self.key is not None:
            inputs = _tensors_anywhere(sample, self._by_value)
            return _Key(("key", self.key(*sample), tuple((t.shape, t.dtype, t.device) for t in inputs.tensors),
                         tuple(_values_key(t) for t in inputs.by_value.values()))), inputs.tensors
        try:
            key, tensors = fingerprint(sample, self._by_value)
            return _Key(key), tensors
        except TypeError as e:
            raise FrontendError(f"sample {i}: {e}; pass key= to dynamo_relational.batch to name its structure") \
                from None

    def _state(self) -> tuple:
        """What traces depend on besides the samples: the modules' train/eval flags and which parameters and
        buffers they hold (graphs of parameters the model no longer has are dropped)."""
        modules = list(self.model.modules())
        held = tuple(id(x) for m in modules for x in (*m._parameters.values(), *m._buffers.values()))
        for stale in [state for state in self._caches if state[1] != held]:
            del self._caches[stale]
        return tuple(m.training for m in modules), held

    def _trace_new(self, keys: Sequence[Hashable], samples: list[tuple], tensors: Sequence[list]
                   ) -> tuple[set[Hashable], dict[int, tuple]]:
        """Trace the structures not seen before (each on its first sample); returns them, and the results that
        their traces computed (in a 1-tuple, by sample; with gradients on, a trace is also the model's call on
        its sample, :attr:`~dynamo_relational.tracing.Trace.result`)."""
        structures = self._cache.structures
        new: dict[Hashable, int] = {}
        for i, k in enumerate(keys):
            if k not in structures or structures[k].retrace_with_grad and torch.is_grad_enabled():
                new.setdefault(k, i)
        if not new:
            return set(), {}
        start = time.perf_counter()
        results = {}
        with gc_paused(), patches_when_needed(), \
                CompileProgress(self.options.progress, len(new), "relational: tracing samples") as progress:
            for k, i in new.items():
                seen = k in structures
                try:
                    structures[k], result = self._traced(samples[i], tensors[i])
                except FrontendError as e:
                    raise FrontendError(f"sample {i}: {e}") from e
                if structures[k].graph is not None:
                    self._cache.joinable.append(k)
                if result is not None:
                    results[i] = result
                self.report.structures += not seen   # (kept, as the structures traced before a sample that fails)
                progress.step()
        self.report.kept_nodes = sum(len(s.graph.records) for cache in self._caches.values()
                                     for s in cache.structures.values() if s.graph is not None)
        self.report.trace_seconds += time.perf_counter() - start
        return set(new), results

    def _traced(self, sample: tuple, tensors: list[torch.Tensor]) -> tuple[_Structure, tuple | None]:
        _check_arguments(self.model, sample)
        if self.key is not None:
            inputs = _tensors_anywhere(sample, self._by_value)
        else:
            inputs = _Inputs()
            fingerprint(sample, self._by_value, inputs)
        call = _SampleCall(self.model, sample, inputs)
        names = [f"arg{j}" for j in range(len(tensors))]
        try:
            traced = trace(call, tensors, names, live=True, check=partial(_structure_by_value, tensors=tensors,
                                                                          paths=inputs.paths))
        except DataDependenceError as e:   # a read of integer tensors of the sample: structure, not inputs
            read = [int(name.removeprefix("arg")) for name in e.inputs]
            paths = {inputs.paths[k] for k in read if _is_index(tensors[k])}
            if paths:
                raise _ReadByValue(paths) from e
            raise
        except UntracedCall as e:   # (eager's call ran: its samples run with the model)
            log.info("relational: a sample's call cannot be traced; its structure runs with the model: %s", e)
            return _Structure(None, f"forward cannot be traced: {e}"), e.result
        except StoredTracedValue as e:   # (undone: the model's own call stores it, as eager's does)
            log.info("relational: a sample's call stores a traced value in the model; its structure runs with the "
                     "model: %s", e)
            return _Structure(None, f"a run from the union would not store what forward stores: {e}"), \
                (self._called([sample], [tensors], 0, {}),)
        except GradStateRead as e:   # (gradients off: the call was not recorded, which would answer the read)
            return _Structure(None, str(e), retrace_with_grad=True), (self._called([sample], [tensors], 0, {}),)
        try:
            graph = prepare(traced.graph, traced.out_spec, traced.constants, self.options, self._collations)
        except NotBatchable as e:
            return _Structure(None, str(e)), traced.result
        return _Structure(graph, grad_state=self._grad_state(tensors) if traced.reads_requires_grad else None), \
            traced.result

    def _grad_state(self, tensors: list[torch.Tensor], parameters: tuple[bool, ...] | None = None) -> tuple:
        """What a tensor's ``requires_grad`` follows from: whether gradients are on, and which parameters and
        which of the sample's ``tensors`` require them."""
        if parameters is None:
            parameters = tuple(p.requires_grad for p in self.model.parameters())
        return torch.is_grad_enabled(), parameters, tuple(t.requires_grad for t in tensors)

    def _in_traced_grad_state(self, held: list[int], keys: Sequence[Hashable], tensors: Sequence[list]) -> list[int]:
        """The samples of ``held`` but those whose trace read ``requires_grad`` in another gradient state than
        the batch's (gradients off, a parameter frozen since): they run with the model."""
        parameters = tuple(p.requires_grad for p in self.model.parameters())
        structures = self._cache.structures
        kept = [i for i in held if structures[keys[i]].grad_state in (None, self._grad_state(tensors[i], parameters))]
        if len(kept) < len(held):
            self._note_unbatched("forward reads requires_grad, and its trace read it in another gradient state "
                                 "(gradients off, or other tensors requiring them)")
        return kept

    # -- the union ----------------------------------------------------------
    def _regroup_if_due(self, keys: Sequence[Hashable], new: set[Hashable]) -> str | None:
        """Group every structure seen again when :data:`REGROUP_SHARE`'s rule says so; why they cannot be
        grouped, if they cannot."""
        held = self._cache.holder
        if all(k in held for k in keys):
            return None
        joinable = self._cache.joinable
        if self._cache.refused is not None and self._cache.refused[0] == len(joinable):
            return self._cache.refused[1]
        structures = self._cache.structures
        back = sum(1 for k in keys if k not in held and k not in new and structures[k].graph is not None)
        if 2 * back >= len(keys) and len(joinable) - len(held) >= REGROUP_SHARE * len(held):
            # a shard the unions have already (the same structures) is kept as it is
            kept = {tuple(union.keys): union for union in self._cache.unions}
            unions = []
            for shard in self._shards(joinable):
                union = kept.get(tuple(shard)) or self._group(shard, len(keys))
                if isinstance(union, str):
                    self._cache.refused = (len(joinable), union)
                    return union
                unions.append(union)
            self._cache.unions = unions
            self._cache.holder = {k: union for union in unions for k in union.keys}
            self._report_unions()
        return None

    def _shards(self, keys: list[Hashable]) -> list[list[Hashable]]:
        """``keys`` split into runs of consecutive structures of at most ``max_union_nodes`` FX nodes each (a
        structure larger than that alone): one run where they fit."""
        nodes = [len(self._graph(k).records) for k in keys]
        bound = self.max_union_nodes
        if bound == "auto":
            available = available_memory()
            bound = None if available is None else max(1, available // UNION_BYTES_PER_NODE)
        if bound is None or sum(nodes) <= bound:
            return [list(keys)]
        shards: list[list[Hashable]] = [[]]
        total = 0
        for k, n in zip(keys, nodes):
            if shards[-1] and total + n > bound:
                shards.append([])
                total = 0
            shards[-1].append(k)
            total += n
        log.warning("relational: batch groups the %d structures seen as %d unions of at most %d FX nodes each "
                    "(max_union_nodes=%r); a batch runs each union that holds some of its samples",
                    len(keys), len(shards), bound, self.max_union_nodes)
        return shards

    def _report_unions(self) -> None:
        unions = self._cache.unions
        report = self.report
        report.unions = len(unions)
        report.union_nodes = tuple(map(sum, zip(*(u.nodes for u in unions))))   # type: ignore[assignment]
        report.union_groups = tuple(map(sum, zip(*(u.groups for u in unions))))   # type: ignore[assignment]
        ops = [len([n for n in graph.graph.nodes if n.op in ("call_function", "call_method")])
               for union in unions for graph in union.graphs]
        report.union_code = (len(ops), min(ops), max(ops))

    def _group(self, keys: list[Hashable], batch_size: int) -> _Union | str:
        start = time.perf_counter()
        graphs = [self._graph(k) for k in keys]
        # a bar over the steps: the union, each pass, the row plan and the code for batches
        steps = 3 + sum(1 for p in UNION_PASSES if p.name not in self.options.disable)
        try:
            with gc_paused(), CompileProgress(self.options.progress, steps,
                                              f"relational: grouping {len(keys):,} structures") as progress:
                union, layout = build(graphs, self._params(), progress)
                nodes_before = len(union.graph.nodes)
                progress.step()
                union, stats, ungrouped = _grouped(union, self.options, progress)
                progress.start("row plan")
                owners = [_input_owner(rows) for rows, kind in zip(layout.rows, layout.inputs) if kind != "unread"]
                try:
                    plan = analyse(union, owners, len(keys))
                except Refused as e:   # (a node left ungrouped computes one sample's rows: name why)
                    if not ungrouped:
                        raise
                    reasons = "; ".join(f"{count} nodes left ungrouped: {reason}"
                                        for reason, count in ungrouped.most_common())
                    raise Refused(f"{e}; {reasons}") from e
                progress.step()
                progress.start("code for batches")
                single = all(g.out_spec.is_leaf() and not g.constants for g in graphs)
                grouped = _Union(keys, {k: i for i, k in enumerate(keys)}, layout, plan, batch_size, single,
                                 (nodes_before, len(plan.graph.graph.nodes)), (stats["groups"], stats["lower_bound"]))
                progress.step()
        except (NotBatchable, Refused) as e:
            return str(e)
        except Exception as e:   # (a failure of grouping itself: the samples still run, as eager's calls do)
            log.debug("relational: grouping the union failed", exc_info=True)
            return f"grouping the union failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        finally:
            _hand_back_freed_memory()
            self.report.grouping_seconds += time.perf_counter() - start
        self.report.groupings += 1
        return grouped

    def _graph(self, key: Hashable) -> SampleGraph:
        graph = self._cache.structures[key].graph
        assert graph is not None, "a refused structure never joins a union"
        return graph

    def _params(self) -> dict[str, torch.Tensor]:
        return {f"model.{name}": t for name, t in [*self.model.named_parameters(remove_duplicate=False),
                                                  *self.model.named_buffers(remove_duplicate=False)]}

    # -- running ------------------------------------------------------------
    def _run(self, union: _Union, keys: Sequence[Hashable], tensors: Sequence[list]) -> tuple[list[Any], float]:
        """The samples' results from ``union``, and the seconds their inputs and index tensors took."""
        start = time.perf_counter()
        batch = Batch([union.position[k] for k in keys])
        inputs = []
        packing = union.layout.packing
        for j, layout in enumerate(union.layout.inputs):
            if layout == "unread":
                continue
            if packing is not None:   # (each sample's arguments of the j-th kind, stacked: its rows)
                inputs.append(torch.stack([sample_tensors[i] for sample_tensors, k in zip(tensors, keys)
                                           for i in packing[union.position[k]][j]]))
                continue
            parts = [sample_tensors[j] for sample_tensors in tensors]
            inputs.append(torch.cat(parts) if layout == "cat" else torch.stack(parts))
        arguments = union.plan.arguments(batch)
        assembly = time.perf_counter() - start
        outputs = union.run_for(batch)(*inputs, *arguments)
        per_output = [union.plan.split(batch, j, value, layout == "stack")
                      for j, (value, layout) in enumerate(zip(outputs, union.layout.outputs))]
        if union.single_tensor:
            return list(per_output[0]), assembly
        results = []
        packed = union.layout.results_packing
        for b, k in enumerate(keys):
            graph = self._graph(k)
            if packed is None:
                leaves = [part[b] for part in per_output]
            else:   # (each tensor of the sample's result: a row of its part of an output)
                leaves = [per_output[j][b][row] for j, row in packed[union.position[k]]]
            for position, value in graph.constants.items():
                leaves.insert(position, value)
            results.append(leaves[0] if graph.out_spec.is_leaf() else pytree.tree_unflatten(leaves, graph.out_spec))
        return results, assembly

    def _one_by_one(self, samples: list[tuple], tensors: Sequence[list], reason: str, traced: dict[int, tuple]
                    ) -> list[Any]:
        """The samples' results from the model itself (or from their traces, which were its calls)."""
        self.report.unbatched += 1
        self._note_unbatched(reason)
        return [self._called(samples, tensors, i, traced) for i in range(len(samples))]

    def _note_unbatched(self, reason: str) -> None:
        """Report why samples run with the model itself (logged once per reason in a row)."""
        if reason != self.report.unbatched_reason:
            self.report.unbatched_reason = reason
            log.warning("relational: batch runs its samples one by one with the model: %s", reason)

    def _called(self, samples: list[tuple], tensors: Sequence[list], i: int, traced: dict[int, tuple]) -> Any:
        """Sample ``i``'s result from the model itself, or from its trace, which was the model's call. The model
        gets a copy of the sample's objects, as its trace did: what ``forward`` stores on them (per-node code
        passing a node's state to its parent as ``tree.state``) would change the sample's structure, and a run
        from the union stores nothing."""
        if i in traced:
            return traced[i][0]
        sample = samples[i]
        if all(type(a) is torch.Tensor for a in sample):
            return self.model(*sample)
        return self.model(*copy.deepcopy(sample, {id(t): t for t in tensors[i]}))


def available_memory() -> int | None:
    """The bytes of memory that new allocations can take without swapping (Linux's ``MemAvailable``; else the
    free physical pages); None where neither is known."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


#: glibc's ``malloc_trim`` once looked up (False: the C library has none)
_MALLOC_TRIM: Any = None


def _hand_back_freed_memory() -> None:
    """Return the free memory of the C library's heap to the system (glibc's ``malloc_trim``; elsewhere
    nothing): grouping a union frees about as much as the ungrouped union took, which the heap would keep.
    (Python's own allocator keeps what its arenas hold; ``PYTHONMALLOC=malloc`` leaves all of it to the C
    library, docs/dynamic.md.)"""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:   # (the symbols the process has loaded, the C library's among them)
            _MALLOC_TRIM = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError, TypeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


def _check_arguments(model: nn.Module, sample: tuple) -> None:
    """:class:`FrontendError` where ``model.forward`` cannot take ``sample``'s arguments (before its trace, whose
    error would name the call inside ``batch``). A forward pre-hook may supply arguments: no check then."""
    if module_hooks(model)[0] or global_hooks()[0]:   # (the forward pre-hooks)
        return
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):   # (no signature to check against)
        return
    try:
        signature.bind(*sample)
    except TypeError as e:
        given = ", ".join(type(a).__name__ for a in sample)
        names = ", ".join(str(p.replace(annotation=p.empty, default=p.empty)) for p in signature.parameters.values())
        raise FrontendError(f"{type(model).__name__}.forward({names}) cannot take the sample's {len(sample)} "
                            f"argument(s) ({given}): {e}. A sample is a tuple of forward's arguments; a sample that "
                            "is not a tuple is forward's one argument") from None


def _grouped(union, options: Options, progress: CompileProgress) -> tuple[fx.GraphModule, dict, Counter]:
    """The union grouped by :data:`UNION_PASSES`, the passes' stats (with the schedule's lower bound), and why
    nodes were left ungrouped (reason -> number of nodes)."""
    # every group is vectorized, however small: a per-sample node left as it is could not be restricted
    ctx = PassContext(dataclasses.replace(options, min_group_size=1), detailed=True)
    union = run_passes(UNION_PASSES, union, ctx, progress)
    if ctx.keep_order:
        raise NotBatchable(f"the union keeps its order: {ctx.keep_order[0]}")
    return union, ctx.stats, ctx.ungrouped


def _structure_by_value(graph: fx.Graph, tensors: Sequence[torch.Tensor], paths: Sequence[str]) -> None:
    """Refuse a trace (of ``tensors``, at ``paths``) whose tensor arguments are the sample's structure
    (``h[src]``, ``z.index_add(0, dst, m)``, ``adj @ h``: :func:`~dynamo_relational.union.structure_inputs`): they
    are read by value, and the union reads rows by them (``passes/constant_indices.py``,
    :mod:`~dynamo_relational.collation`). A tensor that requires gradients stays an input."""
    found = {paths[k] for p in structure_inputs(graph) if _is_structure(tensors[k := int(str(p.target)[3:])])}
    if found:
        raise _ReadByValue(found)


def _input_owner(rows: Sequence[int]) -> torch.Tensor:
    """The sample of each row of a union's input, whose samples have ``rows`` rows each."""
    return torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(rows, dtype=torch.long))


_ATOMS = frozenset((int, float, bool, str, bytes, complex, type(None)))
_INT, _LIST, _TUPLE = frozenset((int,)), {list}, {tuple}
#: what an object's type may subclass, and the family it then belongs to (:func:`_family`)
_FAMILY_BASES = ((Mapping, Mapping), ((list, tuple), list), (enum.Enum, enum.Enum), (int, int), (float, float),
                 (complex, complex), (str, str), (bytes, bytes))
_FAMILIES: dict[type, Any] = {}
_UNKNOWN = object()


def _family(kind: type) -> Any:
    """What ``kind`` subclasses, found once per type: Mapping, list (for lists and tuples), enum.Enum, one of the
    atom types, or None."""
    family = _FAMILIES.get(kind, _UNKNOWN)
    if family is _UNKNOWN:
        family = _FAMILIES[kind] = next((f for bases, f in _FAMILY_BASES if issubclass(kind, bases)), None)
    return family


def fingerprint(sample: tuple, by_value: Collection[str] = (), inputs: _Inputs | None = None
                ) -> tuple[Hashable, list[torch.Tensor]]:
    """``(key, tensors)``: a hashable key equal for two samples of the same structure, and the sample's
    tensors in order. Python data is compared by value (through lists, tuples, dicts, other mappings and the
    attributes of objects; shared and cyclic objects by where they were first seen), tensors by shape, dtype
    and device, but the integer tensors at the paths ``by_value`` by their values too (those are not among
    ``tensors``). ``inputs``, if given, is filled in. ``TypeError`` for what it cannot compare."""
    asked = inputs is not None
    found = inputs if inputs is not None else _Inputs()
    key: list[Hashable] = []
    walk = None
    for i, arg in enumerate(sample):   # the common arguments first, without the walk's bookkeeping
        kind = type(arg)
        if kind is torch.Tensor and not by_value and not asked:   # (the paths only serve a caller who asks)
            found.tensors.append(arg)
            key.append(_tensor_key(arg))
            continue
        if kind is list or kind is tuple:
            ints = _int_lists(arg)
            if ints is not None:
                key.append(ints)
                continue
        walk = walk or _Walk(found, by_value)
        key.append(walk(arg, f"argument {i}"))
    return tuple(key), found.tensors


class _ReadByValue(Exception):
    """``forward`` read the values of the integer tensors at ``paths``: they are structure."""

    def __init__(self, paths: set[str]):
        super().__init__(paths)
        self.paths = paths


def _is_index(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not (value.is_floating_point() or value.is_complex())


def _is_structure(value: Any) -> bool:
    """Whether ``value`` may be read by value, as structure: an integer tensor, or a float one (an adjacency,
    dense or sparse) that does not require gradients."""
    return isinstance(value, torch.Tensor) and not value.is_complex() and not (
        value.is_floating_point() and value.requires_grad)


def _values_key(t: torch.Tensor) -> Hashable:
    """A tensor's part of a structure key when it is structure: its values too (a sparse one's, coalesced)."""
    if t.layout == torch.sparse_coo:
        t = t.detach().coalesce()
        return "sparse values", tuple(t.shape), t.dtype, t.device, *map(_values_key, (t.indices(), t.values()))
    return "tensor values", tuple(t.shape), t.dtype, t.device, t.detach().cpu().numpy().tobytes()


def _tensor_key(t: torch.Tensor) -> Hashable:
    """A tensor's part of a structure key: its shape, dtype and device, not its values."""
    return "tensor", tuple(t.shape), t.dtype, t.device


def _int_lists(x: list | tuple) -> Hashable | None:
    """The key of a list (or tuple) of ints, or of lists (tuples) of ints: neighbour and children lists."""
    types = set(map(type, x))
    if types <= _INT:
        return type(x), tuple(x)
    if types == _LIST or types == _TUPLE:
        flat = [*map(len, x), *chain.from_iterable(x)]
        if set(map(type, flat)) <= _INT:   # (one flat tuple: compared item by item without recursion)
            return type(x), types.pop(), len(x), tuple(flat)
    return None


class _Walk:
    """:func:`fingerprint`'s walk through any argument; objects are numbered where first seen. A path is kept
    as ``(parent, step)`` pairs and spelled out only where it is named (a tensor, an error): a tree of objects
    has a path per node."""

    def __init__(self, inputs: _Inputs, by_value: Collection[str]):
        self.inputs, self.by_value = inputs, by_value
        self.seen: dict[int, int] = {}

    def __call__(self, x: Any, path: Any) -> Hashable:
        kind = type(x)
        if kind in _ATOMS:
            return x if kind is int or kind is str else (kind, x)
        if kind is list or kind is tuple:
            found = _int_lists(x)
            if found is not None:
                return found
            return kind, tuple([self(item, (path, i)) for i, item in enumerate(x)])
        if isinstance(x, torch.Tensor):
            text = _path_text(path)
            return _values_key(x) if self.inputs.add(x, text, self.by_value) else _tensor_key(x)
        if kind is dict:
            return kind, tuple([(k, self(v, (path, (k,)))) for k, v in x.items()])
        seen = self.seen
        if id(x) in seen:
            return "seen", seen[id(x)]
        seen[id(x)] = len(seen)
        plain = _PLAIN_OBJECTS.get(kind)
        if plain is None:
            plain = _PLAIN_OBJECTS[kind] = _plain_object(x)
        if plain:
            self.inputs.objects = True
            return kind, self._attributes(x, path)
        # Subclasses of the containers and atoms above (an OrderedDict, a namedtuple, an IntEnum) are objects:
        # their items or value are compared, then their attributes; tensors among them are not inputs.
        if isinstance(x, type):   # (a class, as objects' attributes may hold: compared by identity)
            return x
        family = _family(kind)
        self.inputs.objects = self.inputs.objects or family is not enum.Enum
        if family is Mapping:   # (by its items alone: a mapping's attributes hold its storage, its owner)
            return kind, tuple([(k, self(v, (path, (k,)))) for k, v in x.items()])
        if family is list:
            return kind, tuple([self(v, (path, i)) for i, v in enumerate(x)]), self._attributes(x, path)
        if family is enum.Enum:   # (a member is one object, compared by identity)
            return kind, x
        if family is not None:
            return kind, family(x), self._attributes(x, path)
        if isinstance(x, numpy.ndarray):
            return "ndarray", x.dtype.str, x.shape, x.tobytes()
        if isinstance(x, numpy.generic):
            return kind, x.item()
        raise TypeError(f"the structure at {_path_text(path)} ({kind.__name__}) cannot be compared by value")

    def _attributes(self, x: Any, path: Any) -> tuple:
        if not hasattr(x, "__dict__"):
            return ()
        items = []
        for k, v in vars(x).items():   # (the atoms, most of a node's attributes, without a call)
            kind = type(v)
            items.append((k, v if kind is int or kind is str else (kind, v) if kind in _ATOMS else self(v, (path, k))))
        return tuple(items)


def _path_text(path: Any) -> str:
    """A path of :class:`_Walk` spelled out: ``argument 0.children[1]._store['x']``."""
    steps = []
    while type(path) is tuple:
        path, step = path
        steps.append(f"[{step}]" if type(step) is int else f".{step}" if type(step) is str else f"[{step[0]!r}]")
    return path + "".join(reversed(steps))


#: per type, whether its instances are compared as plain objects, by their attributes (a tree node)
_PLAIN_OBJECTS: dict[type, bool] = {}


def _plain_object(x: Any) -> bool:
    return (_family(type(x)) is None and not isinstance(x, (type, nn.Module, numpy.ndarray, numpy.generic))
            and hasattr(x, "__dict__") and not _builtin_callable(x))


def _builtin_callable(x: Any) -> bool:
    """A function, method or partial: not compared by value (an instance of a class with ``__call__`` is)."""
    return callable(x) and type(x).__module__ in ("builtins", "functools")


def _tensors_anywhere(sample: tuple, by_value: Collection[str]) -> _Inputs:
    """The tensors of ``sample`` wherever :func:`fingerprint` finds them, in its order (items of lists, tuples and
    mappings, then the attributes of objects and of subclasses of lists, tuples and atoms), with their paths: the
    inputs of a sample whose structure ``key=`` names, which is not compared."""
    inputs, seen = _Inputs(), set()

    def walk(value: Any, path: str) -> None:
        if isinstance(value, torch.Tensor):
            inputs.add(value, path, by_value)
            return
        kind = type(value)
        if kind in _ATOMS or isinstance(value, (nn.Module, type)) or _builtin_callable(value):
            return
        plain = kind is list or kind is tuple or kind is dict
        family = _family(kind)
        if not plain:   # (objects are walked once, where first seen, as fingerprint and _substituted do)
            if id(value) in seen:
                return
            seen.add(id(value))
            inputs.objects = inputs.objects or family is not enum.Enum
        if family is Mapping:   # (by its items alone, as fingerprint compares it)
            parts = [(f"{path}[{k!r}]", item) for k, item in value.items()]
        else:
            parts = [(f"{path}[{i}]", item) for i, item in enumerate(value)] if family is list else []
            if not plain and family is not enum.Enum and hasattr(value, "__dict__"):
                parts += [(f"{path}.{k}", item) for k, item in vars(value).items()]
        for where, item in parts:
            walk(item, where)

    for i, arg in enumerate(sample):
        walk(arg, f"argument {i}")
    return inputs
