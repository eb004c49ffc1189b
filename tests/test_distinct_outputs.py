"""Outputs share memory with the inputs and with each other exactly where eager's do: writing into a
returned tensor changes what it changes in eager, nothing more."""
import dataclasses
import operator
import os
import subprocess
import sys

import pytest
import torch
from torch import fx, nn

import dynamo_relational
from dynamo_relational.passes.distinct_outputs import output_aliases
from tests.helpers import TOLERANCE


def _compile(front_end, model, x, **options):
    """The compiled callable and its graph's report; its outputs and gradients are checked against eager's."""
    options.setdefault("strict", True)
    example = x.clone().requires_grad_()   # as it is called below (else a second variant would compile)
    if front_end == "backend":
        report = dynamo_relational.explain(model, example, **options)
        compiled, graph_report = report.compiled, report.graphs[0]
    else:
        compiled = dynamo_relational.compile(model, example, **options)
        graph_report = compiled.report.graphs[0]
    got, want = (fn(x.clone().requires_grad_()) for fn in (compiled, model))
    got, want = [got] if torch.is_tensor(got) else list(got), [want] if torch.is_tensor(want) else list(want)
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])
    weights = [torch.randn_like(w) for w in want]
    wrt = list(model.parameters())
    if wrt:
        grads = [torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, weights)), wrt) for outs in (got, want)]
        torch.testing.assert_close(*grads, **TOLERANCE[torch.float64])
    return compiled, graph_report


def _assert_writes_as_in_eager(compiled, model, x, outputs):
    """For each position in ``outputs``, on a fresh call of each: after a write into that output, every output
    equals eager's exactly (the write reached the outputs that share its memory in eager, and no others)."""
    for written in outputs:
        with torch.no_grad():
            got, want = list(compiled(x)), list(model(x))
            got[written].add_(1)
            want[written].add_(1)
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"after writing into output {written}")


class StackedInputRows(nn.Module):
    """``torch.stack`` of the input's rows: a new tensor in eager, ``x`` itself once grouped."""

    def forward(self, x):
        return torch.stack([x[i] for i in range(x.shape[0])])


class EqualOutputs(nn.Module):
    """Two equal stacks and two ``torch.zeros(3)``: CSE merges each pair into one tensor."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 3, dtype=torch.float64))

    def forward(self, x):
        a = torch.stack([x[i] * self.w for i in range(3)])
        b = torch.stack([x[i] * self.w for i in range(3)])
        return a, b, torch.zeros(3, dtype=x.dtype), torch.zeros(3, dtype=x.dtype)


class EagersAliases(nn.Module):
    """Outputs that share memory in eager too: a row of the input, and a tensor with its in-place result."""

    def forward(self, x):
        t = torch.stack([x[i] * 2 for i in range(3)])
        return x[0], t, t.add_(1)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("inductor", [False, True])
def test_writing_into_an_output_leaves_the_input_as_in_eager(front_end, inductor):
    x = torch.randn(4, 3, dtype=torch.float64)
    compiled, report = _compile(front_end, StackedInputRows(), x, inductor=inductor)
    given = x.clone()
    with torch.no_grad():
        compiled(given).add_(1)
    torch.testing.assert_close(given, x, rtol=0, atol=0)
    assert report.stats["outputs_cloned"] == 1


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("inductor", [False, True])
def test_equal_outputs_merged_by_cse_are_distinct_tensors(front_end, inductor):
    x = torch.randn(3, 3, dtype=torch.float64)
    # (Inductor's code itself, not the ATen calls that autotune may pick: Inductor merges two clones of a value)
    compiled, report = _compile(front_end, EqualOutputs(), x, inductor=inductor, autotune=False)
    with torch.no_grad():
        a, b, zeros, more_zeros = compiled(x)
        want = b.clone()
        a.add_(1)
        zeros.add_(1)
    torch.testing.assert_close(b, want, rtol=0, atol=0)
    assert not more_zeros.any()
    # Dynamo records torch.zeros as calls, which CSE merges; the fast front-end as graph constants, which it
    # returns as a new copy on every call (see the next test), so only the stacks are cloned.
    assert report.stats["outputs_cloned"] == {"backend": 2, "fast": 1}[front_end]


class CopiesOfOneGroup(nn.Module):
    """Two equal stacks of the input's rows, grouped with two other stacks: each output a copy of the group's
    rows, which Inductor's code returned as one buffer for both."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 3, dtype=torch.float64))

    def forward(self, x):
        hidden = torch.stack([x[j] * self.w for j in range(3)])
        other = torch.stack([x[j] + 1 for j in range(3)])
        return hidden[1], torch.stack([x[j] for j in range(3)]), torch.stack([x[j] for j in range(3)]), other[1]


#: ``torch.select`` as torch_geometric replaces it on import: a Python wrapper, which Dynamo records in its place
_WRAPPED_SELECT = ("original_select = torch.select\n"
                   "def wrapped_select(input, dim, index):\n"
                   "    return original_select(input, dim, index)\n"
                   "torch.select = wrapped_select\n")


@pytest.mark.parametrize("front_end, wrapped_select", [("backend", False), ("fast", False), ("fast", True)])
def test_copies_made_for_distinct_outputs_stay_apart_in_inductors_code(front_end, wrapped_select):
    """Three groundings, the third on code compiled for dynamic sizes (schemas.py), each a write into every
    output; also where ``torch.select``, which the dynamic-size code calls, is another library's wrapper. In a
    fresh interpreter, where no import made it one."""
    code = ("import torch\n"
            + (_WRAPPED_SELECT if wrapped_select else "")
            + "from tests.test_distinct_outputs import CopiesOfOneGroup, _assert_writes_as_in_eager, _compile\n"
            "x = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))\n"
            "for grounding in range(3):\n"
            "    torch._dynamo.reset()\n"
            f"    compiled, _ = _compile({front_end!r}, CopiesOfOneGroup(), x, inductor=True, autotune=False)\n"
            "    _assert_writes_as_in_eager(compiled, CopiesOfOneGroup(), x, range(4))\n"
            "print('ok')\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_outputs_sharing_memory_in_eager_still_do(front_end):
    x = torch.randn(3, 4, dtype=torch.float64)
    model = EagersAliases()
    with torch.no_grad():
        compiled, report = _compile(front_end, model, x, inductor=False)
        given = x.clone()
        row, t, t_again = compiled(given)
        row.mul_(0)
        t.add_(1)
    assert not given[0].any()                        # the row is a view of the input, as in eager
    torch.testing.assert_close(t_again, t, rtol=0, atol=0)   # the in-place result is t, as in eager
    assert "outputs_cloned" not in report.stats


def test_output_aliases_follow_views_and_in_place_ops_to_inputs_and_other_outputs():
    graph = fx.Graph()
    x = graph.placeholder("x")
    row = graph.call_function(operator.getitem, (x, 0))
    product = graph.call_function(torch.mul, (row, 2))
    flat = graph.call_method("reshape", (product, -1))
    written = graph.call_method("add_", (product, 1))
    fresh = graph.call_function(torch.tanh, (row,))
    graph.output((row, flat, written, fresh))
    aliases = output_aliases(graph)
    assert aliases.inputs == (frozenset({("placeholder", "x")}), frozenset(), frozenset(), frozenset())
    assert aliases.classes[1] == aliases.classes[2] and len(set(aliases.classes)) == 3
    assert [chain is not None for chain in aliases.input_views] == [True, False, False, False]
    assert [n.op for n in aliases.input_views[0].nodes] == ["placeholder", "call_function", "output"]


class ConstantOutputs(nn.Module):
    """Returns a tensor made in forward from Python values, and one the model holds as a plain attribute."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3, dtype=torch.float64))
        self.table = torch.arange(3.0, dtype=torch.float64)

    def forward(self, x):
        return torch.stack([x[i] * self.w for i in range(3)]), torch.zeros(3, dtype=x.dtype), self.table


@pytest.mark.parametrize("inductor", [False, True])
def test_a_constant_made_in_forward_is_returned_new_on_every_call_by_the_fast_front_end(inductor):
    """The fast front-end traces ``torch.zeros(3)`` as a constant of the graph: returned as it is, a caller's
    write into it changed what every later call returned. A tensor the model holds is returned itself, as in eager."""
    model = ConstantOutputs()
    x = torch.randn(3, 3, dtype=torch.float64)
    compiled, _ = _compile("fast", model, x, inductor=inductor)
    with torch.no_grad():
        _, zeros, table = compiled(x)
        zeros.add_(1)
        assert not compiled(x)[1].any()
    assert table is model.table


class StackAndItsViews(nn.Module):
    """A stack of the input's rows, a view of that stack, and the input itself."""

    def forward(self, x):
        rows = torch.stack([x[i] for i in range(x.shape[0])])
        return rows, rows.reshape(-1), x


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("inductor", [False, True])
def test_a_view_of_an_output_stays_a_view_of_it_and_apart_from_the_input(front_end, inductor):
    """Grouped, all three outputs are ``x``: the two that eager computes from the stack get one copy of ``x``
    between them (a copy each would break the view), the third stays ``x``."""
    x = torch.randn(3, 2, dtype=torch.float64)
    compiled, report = _compile(front_end, StackAndItsViews(), x, inductor=inductor)
    given = x.clone()
    with torch.no_grad():
        rows, flat, same = compiled(given)
        rows.add_(1)
    torch.testing.assert_close(flat, x.reshape(-1) + 1, rtol=0, atol=0)
    torch.testing.assert_close(given, x, rtol=0, atol=0)
    assert same is given
    assert report.stats["outputs_cloned"] == 1


class ViewsOfComputedOutputs(nn.Module):
    """Two computed outputs, a view of each and a view of a view: grouping makes the views of ``a`` and ``s``
    one group of reshapes, a tensor apart from both outputs, unless the pass computes them from the outputs
    again."""

    def forward(self, x):
        a = x[0] * 2
        s = x[0] + x[1]
        flat = a.view(-1)
        return a, flat, s, s.reshape(-1)[1:], flat[1:]


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("inductor", [False, True])
def test_a_view_of_a_computed_output_sees_writes_into_it_as_in_eager(front_end, inductor):
    model = ViewsOfComputedOutputs()
    x = torch.randn(2, 3, dtype=torch.float64)
    compiled, report = _compile(front_end, model, x, inductor=inductor)
    _assert_writes_as_in_eager(compiled, model, x, range(5))
    assert "outputs_cloned" not in report.stats


class ConstantAndItsView(nn.Module):
    """A tensor made from Python values alone and a view of it, both returned."""

    def forward(self, x):
        z = torch.zeros(3, dtype=x.dtype)
        return x[0] * 2, z, z[1:]


@pytest.mark.parametrize("inductor", [False, True])
def test_outputs_made_from_python_values_share_memory_as_in_eager_in_the_fast_front_end(inductor):
    """Traced from their values, ``z`` and ``z[1:]`` were two constants: a write into ``z`` missed ``z[1:]``.
    The fast front-end now traces again recording ``torch.zeros``, and ``z[1:]`` is a view of it."""
    model = ConstantAndItsView()
    x = torch.randn(2, 3, dtype=torch.float64)
    compiled, _ = _compile("fast", model, x, inductor=inductor)
    _assert_writes_as_in_eager(compiled, model, x, (1, 1))   # and a new z on every call


class ViewsOfAValueNotReturned(nn.Module):
    """Outputs that are overlapping views of computed values that are not returned themselves: ``h``'s rows
    and ``g``'s flattening. Grouping made each view a tensor of its own."""

    def forward(self, x):
        h = torch.stack([x[i] * 2 for i in range(3)])
        g = torch.stack([x[0] + x[1], x[1] * 3, x[2] - 1])
        return h[0], h.view(-1), g[0], g.view(-1), h[1:3], x[0] * 4


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("inductor", [False, True])
def test_views_of_a_value_not_returned_see_each_others_writes_as_in_eager(front_end, inductor):
    model = ViewsOfAValueNotReturned()
    x = torch.randn(3, 2, dtype=torch.float64)
    compiled, _ = _compile(front_end, model, x, inductor=inductor)
    _assert_writes_as_in_eager(compiled, model, x, range(6))


class RowsOfAGatheredValue(nn.Module):
    """A row of ``h`` and its ``detach()``, which share memory in eager, beside a view of another stack
    that grouping stacks with ``h``: the copy that separates the two classes must keep the pair one tensor."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 3, dtype=torch.float64))

    def forward(self, x):
        h = torch.stack([x[0] * self.w])
        g = torch.stack([x[0] + 1])
        row = h[0]
        return g.view(-1), row, row.detach(), g[0]


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_an_output_and_its_detached_view_stay_one_tensor_when_their_class_gets_a_copy(front_end):
    model = RowsOfAGatheredValue()
    x = torch.randn(1, 3, dtype=torch.float64)
    compiled, _ = _compile(front_end, model, x, inductor=False)
    _assert_writes_as_in_eager(compiled, model, x, range(4))


class ARowAndItsDetachedView(nn.Module):
    """``r = g[0]`` and ``r.detach()`` returned beside a stack that grouping puts in one tensor with ``g``: AOT
    autograd replayed the detached view's recorded views on the wrong base ("shape '[2, 3, 3]' is invalid for
    input of size 3")."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 3, dtype=torch.float64))

    def forward(self, x):
        g = torch.stack([x[j] + 1 for j in range(3)])
        row = g[0]
        return row, row.detach(), self.w, torch.stack([x[j] * self.w for j in range(3)])


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_outputs_that_are_views_are_taken_outside_inductors_code_as_in_eager(front_end):
    model = ARowAndItsDetachedView()
    x = torch.randn(3, 3, dtype=torch.float64)
    compiled, _ = _compile(front_end, model, x, inductor=True, autotune=False)
    _assert_writes_as_in_eager(compiled, model, x, (0, 1, 3))


def test_a_pipeline_that_stops_early_returns_eagers_outputs_without_the_bases_it_kept(monkeypatch):
    """``expose_bases`` adds ``h`` and ``g`` to the outputs before the first pass; a required pass that fails
    stops the pipeline before ``distinct_outputs`` drops them, so the backend drops them itself."""
    import dynamo_relational.passes as passes

    def broken(gm, ctx):
        raise RuntimeError("broken pass")

    monkeypatch.setattr(passes, "PIPELINE", tuple(dataclasses.replace(p, run=broken) if p.name == "grouping" else p
                                                  for p in passes.PIPELINE))
    model, x = ViewsOfAValueNotReturned(), torch.randn(3, 2, dtype=torch.float64)
    compiled, report = _compile("fast", model, x, inductor=False, strict=False)
    assert report.stats["error"] == "pass grouping failed; graph compiled ungrouped"
    assert len(compiled(x)) == len(model(x)) == 6


class ARowReturnedTwice(nn.Module):
    """``r = h[0]`` returned twice beside other views of ``h``, which is not returned; also in a nested list."""

    def forward(self, x):
        h = torch.stack([x[i] * 2 for i in range(3)])
        r = h[0]
        return r, r, [h[1], h.view(-1)]


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_a_view_returned_twice_is_one_tensor_as_in_eager(front_end):
    model, x = ARowReturnedTwice(), torch.randn(3, 2, dtype=torch.float64)
    compiled = dynamo_relational.compile(model, [x], inductor=False, strict=True) if front_end == "fast" else \
        torch.compile(model, backend="relational", options=dict(inductor=False, strict=True))
    with torch.no_grad():
        got, want = compiled(x), model(x)
        assert (got[0] is got[1]) and (want[0] is want[1])
        got[2][0].add_(1)
        want[2][0].add_(1)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


class TwoEqualCopies(nn.Module):
    """``t.reshape(-1)`` twice of a transposed ``t``: two copies in eager, one node after CSE."""

    def forward(self, x):
        t = torch.stack([x[i] * 2 for i in range(2)]).t()
        return t, t.reshape(-1), t.reshape(-1)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_equal_views_of_an_output_that_cse_merged_stay_two_tensors_as_in_eager(front_end):
    model, x = TwoEqualCopies(), torch.randn(2, 3, dtype=torch.float64)
    compiled, _ = _compile(front_end, model, x, inductor=False)
    _assert_writes_as_in_eager(compiled, model, x, (1,))
