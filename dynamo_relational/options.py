"""The backend's options: one typed dataclass, documented in one place.

Pass them as ``torch.compile(model, backend="relational", options={...})``
or as keyword arguments of :func:`dynamo_relational.explain`.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, fields
from typing import Any, Literal, Mapping

from .errors import OptionsError


#: the modes of ``torch.compile`` (Inductor's ``list_mode_options``)
INDUCTOR_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class Options:
    #: Hand the grouped graph to Inductor (``compile_fx``). ``False`` runs the
    #: grouped graph eagerly, which is handy for debugging the grouping itself.
    inductor: bool = True
    #: Inductor's compile mode for the grouped graph: ``"default"``,
    #: ``"reduce-overhead"``, ``"max-autotune"`` or ``"max-autotune-no-cudagraphs"``
    #: (``torch.compile(model, backend="relational", mode=...)`` passes it here;
    #: torch.compile takes either ``mode`` or ``options``). Its Inductor settings
    #: (``torch._inductor.list_mode_options(mode)``) apply while the grouped graph
    #: compiles: ``max_autotune`` times kernel choices (GEMM templates, more
    #: compile time); the CUDA graphs of ``"reduce-overhead"`` and
    #: ``"max-autotune"`` apply on CUDA only, and keep Inductor's code
    #: (``autotune`` does not time the executors then; docs/gpu.md).
    mode: str | None = None
    #: Choose by timing on this machine. The ``linear_layout`` pass times each
    #: large ``linear`` in its two memory layouts (on CPU); with Inductor on, the
    #: grouped graph run as plain ATen calls is timed against Inductor's code on
    #: the example inputs (the forward pass, in the grad mode the code serves) and
    #: the faster kept: on CPU, graphs of a few large gathers, products and
    #: segment reductions often run faster unfused. Choices and times are in
    #: the report (``stats["executor"]``, ``stats["linear_layout"]``; printed by
    #: ``explain()``). The timing costs a few runs of the graph, and of each
    #: distinct linear shape, at compile time. Those runs leave no trace: buffers,
    #: parameters and inputs they change (BatchNorm's running statistics) and the
    #: random generators are put back (``dynamo_relational/trial_runs.py``).
    autotune: bool = True
    #: Fast front-end (:func:`dynamo_relational.compile`): share compiled code
    #: between graphs whose grouped graphs have the same ops (another batch,
    #: the next fold). The first grounding gets code for its own sizes; the
    #: second compiles code with dynamic sizes (index tensors and sizes as
    #: inputs) that later groundings reuse without Inductor. ``False``
    #: compiles every grounding for its own sizes (docs/frontend.md).
    reuse_compiled: bool = True
    #: Group per-neuron nodes at all. ``False`` passes Dynamo's graph straight
    #: to the final compiler (stock behaviour), for comparisons.
    grouping: bool = True
    #: Rewrite ``+`` trees, the ``sum()`` builtin and
    #: ``torch.stack(list).sum/mean/amax/amin(0)`` into n-ary aggregations.
    aggregation: bool = True
    #: How groups are chosen: ``"asap"`` (depth levels), ``"agenda"`` (DyNet's
    #: lowest-average-depth-first), ``"ready_share"`` (the signature with the largest
    #: share of its remaining units ready first) or ``"auto"`` (asap and agenda, and
    #: for ``batch``'s unions ready_share too; the one with the fewest groups is kept).
    scheduler: Literal["auto", "asap", "agenda", "ready_share"] = "auto"
    #: Also try schedules that only merge nodes from the same source line
    #: (``stack_trace``), keeping them when they need no more groups.
    code_site_hint: bool = True
    #: Smallest group that is vectorized; smaller groups keep their original nodes.
    min_group_size: int = 2
    #: Nodes whose output has more elements than this are left ungrouped:
    #: large ops gain nothing from batching (this keeps MLPs, conv nets and
    #: transformer blocks as they are).
    max_member_numel: int = 4096
    #: Nodes of one signature that use more distinct weight tensors than this
    #: are grouped together (gathering the weights) instead of one group per weight.
    max_typed_groups: int = 8
    #: On an internal error, raise it instead of logging it and compiling the
    #: ungrouped graph (which is always correct, only slower); also lint the
    #: graph after every pass, naming the pass that left it malformed.
    strict: bool = False
    #: Optimizer passes to skip, by name (see ``dynamo_relational.passes.OPTIONAL_PASSES``):
    #: ``"postpone_gathers"`` (row-wise ops before gathers), ``"hoist_gathers"`` (a row-wise op of
    #: gathered rows that only gathers read, run per reader on its rows), ``"compose_gathers"``
    #: (gathers of gathers read the original rows), ``"simplify_gathers"`` (range
    #: gathers become slices), ``"absorb_gathers"`` (a gather after a reduction
    #: becomes its segments), ``"fuse_linear"`` (consecutive linear maps become one),
    #: ``"rewrite_search"`` (sequences of these rewrites, searched under the cost model),
    #: ``"pair_sums"`` (a sum of one row of each of two values becomes a gather and an add),
    #: ``"merge_gathers"`` (``batch``'s unions: the gathers of one value become one, split),
    #: ``"linear_layout"`` (tall, narrow ``linear`` run as
    #: the transposed product where timing shows it faster; only with ``autotune``),
    #: ``"recompute_gathers"`` (edge-sized gathers recomputed in the backward, not saved),
    #: ``"compress_values"`` (runs only with ``value_compression``).
    disable: tuple[str, ...] = ()
    #: Wall-time bound of the rewrite search (``passes/rewrite_search.py``), in
    #: seconds per graph. It also stops after 200 distinct graphs, which the
    #: example models reach first; the report says which bound stopped it.
    search_seconds: float = 1.0
    #: The search's relaxation: a graph whose estimated cost is below
    #: ``search_alpha`` times the best so far is explored further, so a rewrite
    #: that costs a little now can be followed by one that pays. ``1.0`` is a
    #: greedy descent; larger values search more graphs.
    search_alpha: float = 1.05
    #: Which kernel runs the segment reductions (``segment_reduce``: max/min,
    #: and integer sum/mean, over variable fan-in) of the compiled graph on CPU:
    #: ``"aten"`` (``torch.segment_reduce``) or ``"torch_scatter"``
    #: (``torch_scatter.segment_csr``, from the optional torch-scatter package:
    #: ``pip install --no-build-isolation torch-scatter``, or the ``scatter``
    #: extra). Both are deterministic (each output row reduced sequentially, no
    #: atomics) and give the same results, empty segments, NaN and infinities
    #: included (see ``dynamo_relational.kernels.segment``). ``"aten"`` is the
    #: default: torch-scatter's max/min measured 2.3-4.1x slower on one CPU
    #: thread (docs/BENCHMARKS.md, "Kernel providers"). Floating sums and means
    #: are fused gather-reductions (``gather_reduce``, MKL's sparse product on
    #: CPU) and are unaffected; so is CUDA, which runs its Triton kernel. The
    #: choice is part of the compiled graph (an argument of each
    #: ``segment_reduce`` call), so models compiled with different providers
    #: run side by side in one process. Asking for ``"torch_scatter"`` without
    #: the package installed is an error that says how to install it.
    segment_provider: Literal["aten", "torch_scatter"] = "aten"
    #: How the graph computes its fused gather-reductions (sums and means of
    #: gathered rows). ``"csr"``: the ``gather_reduce`` custom op (MKL's sparse
    #: product on CPU, Triton or cuSPARSE on CUDA; deterministic). ``"padded"``:
    #: ATen ops that Inductor lowers and fuses with their producer, a gather over
    #: the index padded to the widest segment, then a sum
    #: (``passes/padded_gathers.py``; its backward scatters with atomic adds, so
    #: it is not deterministic under several threads). ``"csr"`` is the default:
    #: the padded form measured 12-30x slower on CPU from 1e4 rows on, and
    #: slower on an H100 too (docs/BENCHMARKS.md, "Kernel providers").
    gather_reduce_form: Literal["csr", "padded"] = "csr"
    #: Value-based compression (``passes/compress_values.py``): every
    #: vectorized node computes each of its distinct rows once, and gathers
    #: expand them for its users. Rows are equal when they are computed the
    #: same way from equal values, traced exactly through the graph (no
    #: sampling, so no merge can be wrong). Buffers count as constants: their
    #: values at compile time decide, so compile again after changing a buffer
    #: (parameters and inputs are never compared by value). For grounded
    #: models whose facts sit in buffers, such as NeuraLogic networks built
    #: without the engine's own ``iso_value_compression``. Off by default.
    value_compression: bool = False
    #: Group dropout in training (``F.dropout(h, p, self.training)`` per neuron,
    #: ``nn.Dropout``) like an elementwise op: one mask drawn for a whole group.
    #: Each element is still kept with probability ``1 - p``, independently of
    #: every other, and scaled by ``1 / (1 - p)``: eager's distribution, but not
    #: eager's numbers for a given seed (neither are stock Inductor's). Off by
    #: default: every dropout then draws eager's numbers in eager's order, and
    #: stays ungrouped, one node per neuron (a large graph for Inductor).
    group_dropout: bool = False
    #: Show a progress bar (tqdm, on stderr) over the compile's steps once a
    #: compile has run for a few seconds (tracing, each pass, Inductor).
    progress: bool = True
    #: A directory to write the graph into after every pass, as readable code
    #: (``graph001_00_input.py``, ``graph001_01_inplace.py``, ...), plus the
    #: report as ``..._summary.txt``. For debugging; slow on large graphs.
    dump_dir: str | None = None

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | "Options" | None) -> "Options":
        """Build options from ``torch.compile(..., options=...)``; unknown keys are an error."""
        if options is None:
            return cls()
        if isinstance(options, Options):
            return options
        if not isinstance(options, Mapping):
            raise OptionsError(f"options must be a dict, got {type(options).__name__}")
        known = {f.name: f for f in fields(cls)}
        for key in options:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise OptionsError(
                    f"unknown option {key!r} for backend 'relational'{hint} "
                    f"Known options: {', '.join(sorted(known))}")
        if isinstance(options.get("disable"), list):
            options = {**options, "disable": tuple(options["disable"])}
        result = cls(**options)
        result._validate()
        return result

    def replace(self, **changes: Any) -> "Options":
        return Options.from_mapping({**dataclasses.asdict(self), **changes})

    def _validate(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            expected = {"bool": bool, "int": int}.get(str(f.type))
            if expected is not None and (type(value) is not expected):
                raise OptionsError(f"option {f.name!r} must be {f.type}, got {value!r}")
        if self.mode is not None and self.mode not in INDUCTOR_MODES:
            raise OptionsError(f"option 'mode' must be one of {', '.join(map(repr, INDUCTOR_MODES))} or None, "
                               f"got {self.mode!r}")
        if self.scheduler not in ("auto", "asap", "agenda", "ready_share"):
            raise OptionsError(
                f"option 'scheduler' must be 'auto', 'asap', 'agenda' or 'ready_share', got {self.scheduler!r}")
        # (imported here: the passes and kernels read Options, so they import this module)
        from dynamo_relational.kernels.segment import SEGMENT_PROVIDERS, require_torch_scatter

        if self.segment_provider not in SEGMENT_PROVIDERS:
            raise OptionsError(f"option 'segment_provider' must be one of {', '.join(map(repr, SEGMENT_PROVIDERS))}, "
                               f"got {self.segment_provider!r}")
        if self.segment_provider == "torch_scatter":
            require_torch_scatter()
        if self.gather_reduce_form not in ("csr", "padded"):
            raise OptionsError(f"option 'gather_reduce_form' must be 'csr' or 'padded', "
                               f"got {self.gather_reduce_form!r}")
        from dynamo_relational.passes import OPTIONAL_PASSES   # (as above)

        if isinstance(self.disable, str) or not all(isinstance(p, str) for p in self.disable):
            raise OptionsError(f"option 'disable' must be a tuple of pass names, got {self.disable!r}")
        if self.dump_dir is not None and not isinstance(self.dump_dir, (str, os.PathLike)):
            raise OptionsError(f"option 'dump_dir' must be a directory path, got {self.dump_dir!r}")
        unknown = sorted(set(self.disable) - set(OPTIONAL_PASSES))
        if unknown:
            raise OptionsError(f"option 'disable' names unknown pass(es) {unknown}; "
                               f"optional passes: {', '.join(OPTIONAL_PASSES)}")
        if not isinstance(self.search_seconds, (int, float)) or self.search_seconds < 0:
            raise OptionsError(f"option 'search_seconds' must be a number >= 0, got {self.search_seconds!r}")
        if not isinstance(self.search_alpha, (int, float)) or self.search_alpha < 1:
            raise OptionsError(f"option 'search_alpha' must be a number >= 1, got {self.search_alpha!r}")
        for name in ("min_group_size", "max_member_numel", "max_typed_groups"):
            if getattr(self, name) < 1:
                raise OptionsError(f"option {name!r} must be >= 1, got {getattr(self, name)}")
