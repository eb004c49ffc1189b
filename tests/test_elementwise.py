"""The elementwise family beyond arithmetic: comparisons, logical and bitwise ops, ``masked_fill`` and dtype
casts group like arithmetic, through both front-ends, and match eager; so do the ops torch tags pointwise,
op_db's unary and binary elementwise ops among them."""
import types

import pytest
import torch
from torch import nn

import dynamo_relational
from tests.helpers import (ELEMENTWISE_ROWS as ROWS, ELEMENTWISE_WIDTH as WIDTH, PerNeuronScalars,
                           assert_fast_compile_matches_eager, op_db_samples, report_matching_eager)


class Masks(nn.Module):
    """Per neuron: a mask from comparisons and logical ops selects, fills and is cast back to floats."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)

    def forward(self, x, counts):
        out = []
        for v in range(ROWS):
            h = self.lin(x[v])
            mask = (h > 0) & (x[v] < 1) | ~(h != h.abs()) ^ torch.logical_not(h <= -0.5)
            count = counts[v].long()
            bits = (count & 3) | torch.bitwise_not(count ^ 1)
            out.append(torch.where(mask, h, -h).clamp(min=-1.0) * mask.to(h.dtype) + h.masked_fill(~mask, 0.5)
                       + bits.double() + (bits > 2).long().type_as(h) + torch.eq(h, x[v]).to(torch.float64))
        return torch.stack(out)


def _inputs():
    torch.manual_seed(0)
    return torch.randn(ROWS, WIDTH, dtype=torch.float64), torch.randint(0, 8, (ROWS, WIDTH)).double()


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_masks_comparisons_and_casts_group_and_match_eager(front_end):
    model = Masks()
    report = report_matching_eager(front_end, model, *_inputs(), inductor=front_end == "backend")
    assert not report.ungrouped, report.ungrouped   # (``&`` was taken for an in-place op: nothing grouped)
    assert report.nodes_after < report.nodes_before / 10


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_scalars_that_differ_per_neuron_group_and_match_eager(front_end, dtype):
    torch.manual_seed(0)
    x = (torch.randn(ROWS, WIDTH, dtype=torch.float64) * 10).round() / 10   # values on the thresholds too
    report = report_matching_eager(front_end, PerNeuronScalars(dtype), x.to(dtype), inductor=False)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 10   # one group per op, not one per threshold


class MathFunctions(nn.Module):
    """Rounding, trigonometric, hyperbolic, exponential and special functions, more activations, and binary ops
    (remainders, atan2, hypot, fmax, ...) of each neuron, as functions or (``methods``) as tensor methods."""

    def __init__(self, methods: bool):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        self.methods = methods

    def forward(self, x):
        F, out = torch.nn.functional, []
        for v in range(ROWS):
            h, g = self.lin(x[v]), x[(v + 1) % ROWS]
            unit, positive = torch.tanh(h) * 0.9, h.abs() + 1
            if self.methods:
                z = (h.floor() + h.ceil() + h.round(decimals=1) + h.trunc() + h.frac() + h.tan() + unit.asin()
                     + unit.acos() + h.atan() + h.sinh() + h.cosh() + h.asinh() + positive.acosh() + unit.atanh()
                     + positive.log2() + positive.log10() + h.exp2() + h.erfc() + unit.erfinv() + h.sinc()
                     + torch.sigmoid(h).logit() + positive.lgamma() + positive.digamma() + h.sign() * h.sgn()
                     + h.nan_to_num() + h.clamp_min(0.1) + h.clamp_max(0.2) + h.deg2rad() + h.rad2deg()
                     + h.hardshrink(0.3) + h % 0.7 + 0.7 % positive.detach() + h.remainder(g) + h.fmod(0.3)
                     + h.detach() // 0.3 + 2.0 // positive.detach() + h.detach().floor_divide(g.detach())
                     + h.atan2(g) + h.arctan2(g) + h.hypot(g) + h.copysign(g) + positive.xlogy(positive)
                     + h.logaddexp(g) + h.logaddexp2(g) + h.fmax(g) + h.fmin(g) + h.true_divide(positive)
                     + h.addcdiv(g, positive, value=0.5) + h.addcmul(g, h) + h.lerp(g, 0.25))
            else:
                z = (torch.floor(h) + torch.ceil(h) + torch.round(h) + torch.trunc(h) + torch.frac(h) + torch.tan(h)
                     + torch.asin(unit) + torch.acos(unit) + torch.atan(h) + torch.sinh(h) + torch.cosh(h)
                     + torch.asinh(h) + torch.acosh(positive) + torch.atanh(unit) + torch.log2(positive)
                     + torch.log10(positive) + torch.exp2(h) + torch.erfc(h) + torch.erfinv(unit) + torch.sinc(h)
                     + torch.logit(torch.sigmoid(h), eps=1e-6) + torch.special.logit(torch.sigmoid(h))
                     + torch.lgamma(positive) + torch.digamma(positive) + torch.special.i0(h) + torch.sgn(h)
                     + torch.nan_to_num(h, nan=0.0) + torch.clamp_min(h, 0.1) + torch.clamp_max(h, 0.2)
                     + torch.deg2rad(h) + torch.rad2deg(h) + F.hardsigmoid(h) + F.hardswish(h) + F.softsign(h)
                     + F.tanhshrink(h) + F.threshold(h, 0.1, 0.0) + torch.threshold(h, 0.2, -1.0) + F.hardshrink(h)
                     + F.softshrink(h, 0.2) + torch.remainder(h, 0.7) + torch.fmod(h, g) + torch.true_divide(h, 3.0)
                     + torch.floor_divide(h.detach(), 0.3) + torch.atan2(h, g) + torch.arctan2(g, h) + torch.hypot(h, g)
                     + torch.copysign(h, g) + torch.xlogy(h, positive) + torch.special.xlogy(positive, 2.0)
                     + torch.logaddexp(h, g) + torch.logaddexp2(h, g) + torch.fmax(h, g) + torch.fmin(h, g)
                     + torch.addcdiv(h, g, positive))
            finite = torch.isfinite(z) & ~torch.isnan(z) & ~torch.isinf(z)
            out.append(torch.where(finite, z, 0.0))
        return torch.stack(out)


@pytest.mark.parametrize("methods", [False, True], ids=["functions", "methods"])
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_math_functions_and_activations_group_and_match_eager(front_end, methods):
    torch.manual_seed(0)
    # (not through Inductor: ATen's hardsigmoid gradient on CPU multiplies by 1/6 rounded to float32, and
    # Inductor's by 1/6 in float64, as with the stock inductor backend)
    report = report_matching_eager(front_end, MathFunctions(methods), torch.randn(ROWS, WIDTH, dtype=torch.float64),
                                   inductor=False)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 10


def test_masked_fill_with_a_tensor_value_per_neuron_is_left_ungrouped_and_right():
    """Batched, a value that differs per neuron would no longer be one 0-d tensor."""
    class PerNeuronFill(nn.Module):
        def forward(self, x):
            return torch.stack([x[v].masked_fill(x[v] > 0, x[v, 0]) for v in range(ROWS)])

    report = assert_fast_compile_matches_eager(PerNeuronFill(), _inputs()[0], inductor=False).report.graphs[0]
    assert "masked_fill with a tensor value" in report.ungrouped


class WhereWithA0dTensor(nn.Module):
    """``torch.where(mask, h, torch.zeros(()))``: the 0-d tensor has ``h``'s dtype, and the condition takes no
    part in type promotion; ``mixed`` makes the 0-d tensor another dtype, which promotion sees."""

    def __init__(self, mixed: bool = False):
        super().__init__()
        self.lin, self.mixed = nn.Linear(WIDTH, WIDTH, dtype=torch.float64), mixed

    def forward(self, x):
        fill = torch.tensor(0.5, dtype=torch.float32 if self.mixed else torch.float64)
        out = []
        for v in range(ROWS):
            h = self.lin(x[v])
            out.append(torch.where(h > 0, h, fill) + h.where(h < 1, torch.zeros((), dtype=torch.float64)))
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["fast", "backend"])
@pytest.mark.parametrize("mixed", [False, True], ids=["one dtype", "mixed dtypes"])
def test_where_with_a_0d_tensor_groups_unless_promotion_sees_it(front_end, mixed):
    report = report_matching_eager(front_end, WhereWithA0dTensor(mixed), _inputs()[0], inductor=False)
    assert ("mixed dtypes with a 0-d operand" in report.ungrouped) == mixed, report.ungrouped


class InPlaceActivations(nn.Module):
    """``nn.ReLU(inplace=True)`` and friends on fresh values, and dropout, per neuron."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        self.act = nn.ReLU(inplace=True)
        self.leaky = nn.LeakyReLU(0.1, inplace=True)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        out = []
        for v in range(ROWS):
            h = self.drop(self.act(self.lin(x[v])))
            h = self.leaky(h + self.lin(x[(v + 1) % ROWS])) + torch.relu_(self.lin(x[v]) * 2)
            out.append(h + (self.lin(x[v]) - 1).sigmoid_() + torch.nn.functional.elu(self.lin(x[v]), inplace=True))
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_in_place_activations_on_fresh_values_and_eval_dropout_group_and_match_eager(front_end):
    """They used to keep the whole graph in its order (nothing grouped); dropout outside training is the identity."""
    model = InPlaceActivations().eval()
    x = _inputs()[0]
    report = report_matching_eager(front_end, model, x, inductor=False)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 5


def test_an_in_place_activation_of_an_input_row_keeps_the_graph_in_order_and_right():
    """``relu_`` on ``x[v]`` writes into the input: grouping would copy the row first, so nothing is grouped."""
    class IntoTheInput(nn.Module):
        def forward(self, x):
            return torch.stack([torch.relu_(x[v]) * 2 for v in range(ROWS)])

    x = _inputs()[0]
    compiled = torch.compile(IntoTheInput(), backend="relational")
    got, want = x.clone(), x.clone()
    torch.testing.assert_close(compiled(got), IntoTheInput()(want))
    torch.testing.assert_close(got, want)   # the input was changed in the same way


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("alias", ["detach", "to", "double", "type_as", "dropout"])
def test_an_in_place_activation_through_an_op_that_may_return_its_input_writes_into_the_input(alias, front_end):
    """``x[v].double().relu_()`` on a float64 ``x`` (or ``detach``, ``to``, ``type_as``, eval dropout):
    the cast returns ``x[v]`` itself, so ``relu_`` writes into ``x``, which later neurons read. (For
    eval dropout, torch 2.13's own ``aot_eager`` and ``inductor`` backends miss the write; the
    ``inplace`` pass reads the dropout's input instead.)"""
    import torch.nn.functional as F

    class ThroughAnAlias(nn.Module):
        def forward(self, x):
            out = []
            for v in range(ROWS):
                row = x[v]
                same = {"detach": row.detach, "to": lambda: row.to(torch.float64), "double": row.double,
                        "type_as": lambda: row.type_as(x), "dropout": lambda: F.dropout(row, 0.5, False)}[alias]()
                out.append(same.relu_() + x[(v + 1) % ROWS])
            return torch.stack(out)

    x = _inputs()[0]
    got, want = x.clone(), x.clone()
    compiled = torch.compile(ThroughAnAlias(), backend="relational") if front_end == "backend" else \
        dynamo_relational.compile(ThroughAnAlias(), x.clone(), inductor=False)
    torch.testing.assert_close(compiled(got), ThroughAnAlias()(want))
    torch.testing.assert_close(got, want)   # the input was changed in the same way


class Sums(nn.Module):
    """Sums of three rows, and sums of one to ``ROWS`` rows started from row 0 (the ``sum()`` builtin)."""

    def forward(self, x):
        fixed = [x[v] + x[(v + 1) % ROWS] + x[(v + 2) % ROWS] for v in range(ROWS)]
        ragged = [sum((x[u] for u in range(v + 1)), x[0]) for v in range(ROWS)]
        return torch.stack(fixed + ragged)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.int64, torch.bool, torch.complex64])
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_integer_bool_and_complex_sums_keep_their_dtype_and_match_eager(front_end, dtype):
    """Integer sums stay in their dtype and wrap around (uint8), ``+`` on bools is a logical or, complex sums
    have no segment kernel: none of them is aggregated into a reduction (which gave int64 sums, or failed)."""
    torch.manual_seed(0)
    x = (torch.randn(ROWS, WIDTH, dtype=torch.complex64) * 100) if dtype.is_complex else \
        torch.randint(0, 2 if dtype is torch.bool else 200, (ROWS, WIDTH)).to(dtype)
    model = Sums()
    if front_end == "backend":
        compiled = torch.compile(model, backend="relational", options={"strict": True})
    else:
        compiled = dynamo_relational.compile(model, x, strict=True)
        assert compiled.report.nodes_after < compiled.report.nodes_before / 4   # the additions still group
    torch.testing.assert_close(compiled(x), model(x), rtol=0 if not dtype.is_complex else 1e-6, atol=0)


class ScaledRows(nn.Module):
    """A scale, offset and divisor of its own for each neuron (Python floats)."""

    def forward(self, x):
        return torch.stack([(x[v] * (0.1 * v + 0.3) - 0.37 * v) / (1.3 + 0.2 * v) + (0.7 - 0.05 * v) * x[v]
                            for v in range(ROWS)])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_per_neuron_scalars_in_low_precision_round_as_eager(front_end, dtype):
    """Eager multiplies and divides a float16/bfloat16 tensor by a Python float in float32, and rounds a
    summand to the tensor's dtype first: the vectorized ops (grouped graph run by ATen) give its bits."""
    torch.manual_seed(0)
    x = (torch.randn(ROWS, 256) * 10).to(dtype)
    model = ScaledRows()
    if front_end == "backend":
        compiled = torch.compile(model, backend="relational", options={"strict": True, "inductor": False})
    else:
        compiled = dynamo_relational.compile(model, x, strict=True, inductor=False)
    got, want = compiled(x), model(x)
    assert got.dtype == dtype and torch.equal(got, want), (got != want).sum()


class TaggedPointwise(nn.Module):
    """Ops outside the hand tables that torch tags pointwise, as functions, methods and an in-place method on a
    fresh value, beside ``torch.max`` of one tensor (a reduction: not pointwise) and a 0-d operand of
    another dtype shared by all neurons."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor(0.1, dtype=torch.float64))

    def forward(self, x):
        out = []
        for v in range(ROWS):
            h, g = x[v], x[(v + 1) % ROWS]
            steps = (h.detach() * 2).heaviside_(g.detach()) + torch.heaviside(h.detach(), g.detach())
            z = (torch.special.entr(h.abs()) + torch.max(h, g) + torch.min(input=h, other=g) + h.float_power(2)
                 + torch.ldexp(h, steps) + torch.special.erfcx(h) + torch.polygamma(1, h.abs() + 1) + steps
                 + torch.rsub(h, 1.5) + torch.signbit(h) + torch.nextafter(h, g) + torch.max(h))
            out.append(z + torch.mul(h.float()[0], self.scale))
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_ops_torch_tags_pointwise_group_and_match_eager(front_end):
    torch.manual_seed(0)
    report = report_matching_eager(front_end, TaggedPointwise(), torch.randn(ROWS, WIDTH, dtype=torch.float64),
                                   inductor=False)
    assert set(report.ungrouped) == {"no vectorizer for call_function max"}, report.ungrouped   # torch.max(h)
    assert report.nodes_after < report.nodes_before / 5   # (the ROWS calls of torch.max(h) stay, with their reads)


def test_targets_tagged_pointwise_but_random_or_copies_are_not_elementwise():
    """``rrelu`` is tagged pointwise and ``nondeterministic_seeded``; a ``clone`` is made to be written into."""
    from dynamo_relational.ops import REGISTRY

    for op, target in [("call_function", torch.rrelu), ("call_function", torch.clone), ("call_method", "clone"),
                       ("call_function", torch.bernoulli), ("call_method", "heaviside_")]:
        assert REGISTRY.resolved(op, target) is None, target
    assert REGISTRY.resolved("call_function", torch.special.entr) is not None


# ------------------------------------------------------------------ op_db's elementwise ops, one call per row

#: op_db's unary and binary elementwise ops left out: (name, variant) -> why
_OPINFO_SKIPS = {
    ("nn.functional.rrelu", ""): "random in training, as most of its samples are",
    ("frexp", ""): "returns two tensors",
    ("chalf", ""): "complex32: no CPU sum to stack its rows into",
    **{(name, ""): "CUDA only" for name in ("jiterator_unary", "jiterator_binary", "jiterator_binary_return_by_ref")},
}
#: ops that stay ungrouped (each with a logged reason): untagged, so not known to be pointwise; ``positive``,
#: ``conj`` and ``real`` return their input itself, and ``prelu``'s weight runs along dimension 1
_UNGROUPED_OPINFOS = {"positive", "conj", "real", "isreal", "fill", "complex", "polar", "nn.functional.prelu"}
#: rows per model; values of a row are its sample's, rolled by the row's number (different, in the op's domain)
_OP_ROWS = 3


class _OneCallPerRow(nn.Module):
    """``torch.stack([op(x[i], *args_i) for i in rows])``: ``args`` holds the sample's constants, and None where
    the sample has a tensor, whose row ``i`` (a row of ``tensors``) is passed instead."""

    def __init__(self, op, args: list, kwargs: dict):
        super().__init__()
        self.op, self.args, self.kwargs = op, args, kwargs

    def forward(self, x, *tensors):
        out = []
        for i in range(_OP_ROWS):
            rows = iter([t[i] for t in tensors])
            args = [next(rows) if a is None else a for a in self.args]
            kwargs = {k: next(rows) if v is None else v for k, v in self.kwargs.items()}
            out.append(self.op(x[i], *args, **kwargs))
        return torch.stack(out)


def _rows(t: torch.Tensor) -> torch.Tensor:
    flat = t.reshape(-1)
    return torch.stack([flat.roll(i).reshape(t.shape) for i in range(_OP_ROWS)])


def _small_samples(opinfo) -> list:
    """Up to two float64 samples of at most 400 elements per tensor: the first, and the first that broadcasts."""
    samples = []
    for s in op_db_samples(opinfo, torch.float64):
        tensors = [s.input, *(a for a in (*s.args, *s.kwargs.values()) if isinstance(a, torch.Tensor))]
        if isinstance(s.input, torch.Tensor) and all(0 < t.numel() <= 400 for t in tensors) \
                and not any(isinstance(a, (list, tuple)) for a in (*s.args, *s.kwargs.values())):
            samples.append(s)
    broadcasting = [s for s in samples[1:] if any(isinstance(a, torch.Tensor) and a.shape != s.input.shape
                                                  for a in s.args)]
    return samples[:1] + broadcasting[:1]


def _as_called(op):
    """``op`` as user code calls it: a Tensor method of C by name (``x.heaviside(y)``; the descriptor
    ``torch.Tensor.heaviside`` does not take a traced value), anything else as it is."""
    if isinstance(op, types.MethodDescriptorType):
        return lambda x, *args, **kwargs: getattr(x, op.__name__)(*args, **kwargs)
    return op


def _groups_and_matches_eager(opinfo, op, sample) -> tuple[bool, dict]:
    """Compile the op's one-call-per-row model on ``sample``; check outputs and gradients against eager
    (within 1e-8); return whether the op grouped, and the report's reasons for what did not."""
    tensors = [a for a in (*sample.args, *sample.kwargs.values()) if isinstance(a, torch.Tensor)]
    model = _OneCallPerRow(_as_called(op), [None if isinstance(a, torch.Tensor) else a for a in sample.args],
                           {k: None if isinstance(v, torch.Tensor) else v for k, v in sample.kwargs.items()})
    leaves = [_rows(t).requires_grad_(t.is_floating_point() and opinfo.supports_autograd)
              for t in (sample.input, *tensors)]
    compiled = dynamo_relational.compile(model, leaves, inductor=False, strict=True)
    got, want = compiled(*leaves), model(*leaves)
    close = dict(rtol=1e-8, atol=1e-8, equal_nan=True)
    torch.testing.assert_close(got, want, **close)
    if want.requires_grad:
        wrt = [leaf for leaf in leaves if leaf.requires_grad]
        as_real = torch.view_as_real if want.is_complex() else (lambda t: t)
        weights = torch.randn(as_real(want).shape, dtype=torch.float64)
        losses = [(as_real(out) * weights).sum() for out in (got, want)]
        for g, w in zip(*(torch.autograd.grad(loss, wrt, allow_unused=True) for loss in losses)):
            if w is None:
                assert g is None or not g.any()
            else:
                torch.testing.assert_close(g, w, **close)
    report = compiled.report.graphs[0]
    # grouped: nothing left ungrouped, and the per-row calls became one node (beside the inputs, the output
    # and at most a reshape per operand and the final stack)
    grouped = not report.ungrouped and report.nodes_after <= 2 * len(leaves) + 3
    return grouped, dict(report.ungrouped)


@pytest.fixture(scope="module")
def elementwise_opinfos():
    """op_db's unary and binary elementwise ops with float64 samples on the CPU, less :data:`_OPINFO_SKIPS`."""
    pytest.importorskip("expecttest")   # (what torch's test helpers import)
    # importing torch's test helpers forbids setting torch.backends flags (disable_global_flags) for the tests
    # that run after: set back as it was
    backends = torch.backends.disable_global_flags.__globals__
    allowed = backends["__allow_nonbracketed_mutation_flag"]
    from torch.testing._internal.common_methods_invocations import BinaryUfuncInfo, UnaryUfuncInfo, op_db

    backends["__allow_nonbracketed_mutation_flag"] = allowed

    return [o for o in op_db if isinstance(o, (UnaryUfuncInfo, BinaryUfuncInfo))
            and torch.float64 in o.supported_dtypes("cpu") and (o.name, o.variant_test_name) not in _OPINFO_SKIPS]


@pytest.mark.parametrize("variant", ["function", "method"])
def test_op_db_elementwise_ops_written_one_call_per_row_group_and_match_eager(elementwise_opinfos, variant):
    """Every unary and binary elementwise OpInfo (``torch.special.*``, ``torch.max(a, b)``, ``heaviside``,
    ``float_power``, ``ldexp``, ``polygamma``, ..., most recognised by torch's ``pointwise`` tag), written as
    one call per row, computes eager's values and gradients, and groups into one node, except the ops of
    :data:`_UNGROUPED_OPINFOS`, which stay ungrouped with a reason."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    grouped, ungrouped, ran = [], {}, 0
    for opinfo in elementwise_opinfos:
        op = opinfo.op if variant == "function" else opinfo.method_variant
        if op is None:
            continue
        ran += 1
        name = opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")
        results = [_groups_and_matches_eager(opinfo, op, s) for s in _small_samples(opinfo)]
        assert results, f"{name}: no small sample"
        if all(g for g, _ in results):
            grouped.append(name)
        else:
            ungrouped[opinfo.name] = {reason for _, reasons in results for reason in reasons}
    print(f"{variant}s: {len(grouped)} of {ran} grouped; ungrouped: {ungrouped}")
    assert all(ungrouped.values()), ungrouped   # each with a logged reason
    assert set(ungrouped) <= _UNGROUPED_OPINFOS, ungrouped
    assert len(grouped) >= {"function": 174, "method": 122}[variant]
