"""What the passes know of a call (``dynamo_relational/ops/facts.py``) agrees with what eager does: every op
of op_db whose result shares memory with an operand is one that may alias; in-place ops, factories and
random ops are recognised from torch's schemas and tags."""
import operator
import warnings

import torch
import torch.fx as fx
import torch.nn.functional as F

from dynamo_relational.ops import facts
from tests.helpers import op_db_samples


def _call(target, *args, op="call_function", **kwargs) -> fx.Node:
    graph = fx.Graph()
    x = graph.placeholder("x")
    args, kwargs = fx.node.map_aggregate((args, kwargs), lambda a: x if isinstance(a, str) and a == "x" else a)
    return graph.create_node(op, target, args, kwargs)


def test_python_and_torch_in_place_ops_write_and_look_alikes_do_not():
    """``operator.and_`` ends in ``_`` like ``add_``; the in-place ``&=`` is ``iand``."""
    assert not any(facts.target_writes("call_function", f) for f in (operator.and_, operator.or_, operator.not_,
                                                                     operator.is_, operator.invert, operator.index))
    assert all(facts.target_writes("call_function", f) for f in (operator.iand, operator.iadd, operator.setitem))
    assert all(facts.target_writes("call_method", m) for m in ("masked_fill_", "__iadd__", "__setitem__", "add_",
                                                               "zero_", "requires_grad_"))
    assert not any(facts.target_writes("call_method", m) for m in ("add", "__add__", "__and__", "masked_fill"))
    assert facts.target_writes("call_function", torch.relu_)


def test_an_out_argument_writes_and_out_none_does_not():
    """``F.normalize`` passes ``out=None`` on: it writes no output, so the graph may still be grouped."""
    assert not facts.writes(_call(F.normalize, "x", dim=0, out=None))
    assert facts.writes(_call(torch.add, "x", 1.0, out="x"))
    assert facts.writes(_call(F.relu, "x", inplace=True))


def test_views_casts_and_eval_dropout_may_alias_and_arithmetic_does_not():
    for target in (torch.reshape, torch.t, torch.broadcast_to, F.dropout, torch.atleast_1d, operator.getitem):
        assert facts.may_alias(_call(target, "x")), target
    for method in ("float", "to", "contiguous", "detach", "type_as", "view", "cpu", "sum_to_size"):
        assert facts.may_alias(_call(method, "x", op="call_method")), method
    for target in (torch.add, torch.sigmoid, F.linear, torch.cat, operator.add, len):
        assert not facts.may_alias(_call(target, "x")), target
    assert facts.is_view(_call(getattr, "x", "T")) and not facts.is_view(_call(getattr, "x", "data"))


def test_a_wrapper_another_library_put_in_place_of_a_torch_function_is_that_op(monkeypatch):
    """torch_geometric replaces ``torch.select`` and ``torch.index_select`` with Python wrappers on import;
    Dynamo then records those wrappers, and ``select`` is still a view."""
    original_select, original_index_select = torch.select, torch.index_select

    def wrapped_select(input, dim, index):
        return original_select(input, dim, index)

    def wrapped_index_select(input, dim, index):
        return original_index_select(input, dim, index)

    monkeypatch.setattr(torch, "select", wrapped_select)
    monkeypatch.setattr(torch, "index_select", wrapped_index_select)
    assert facts.may_alias(_call(wrapped_select, "x", 0, 1)) and facts.is_view(_call(wrapped_select, "x", 0, 1))
    assert facts.aten_name("call_function", wrapped_index_select) == "index_select"
    assert not facts.may_alias(_call(wrapped_index_select, "x", 0, "x"))

    def a_users_function(input):
        return input
    assert facts.aten_name("call_function", a_users_function) is None


def test_factories_are_the_calls_that_take_no_tensor_but_for_a_shape():
    made = [_call(torch.zeros, 3), _call(torch.arange, 5), _call(torch.tensor, [1.0, 2.0]), _call(torch.eye, 2),
            _call(torch.zeros_like, "x"), _call("new_full", "x", (2,), 1.0, op="call_method"),
            _call(torch.full, (2,), 0.5, dtype=torch.float64), _call(torch.LongTensor, [3])]
    assert all(facts.is_factory(n) for n in made), [n.target for n in made if not facts.is_factory(n)]
    for n in (_call(torch.empty, 3), _call("new", "x", 2, op="call_method"), _call(torch.LongTensor, 3)):
        assert not facts.is_factory(n), n.target   # uninitialized memory: equal calls, other values
    assert facts.makes_tensor(_call(torch.empty_like, "x"))
    for n in (_call(torch.randn, 3), _call(torch.rand_like, "x"), _call(torch.as_tensor, "x"),
              _call(torch.tensor, ["x"]), _call(torch.zeros, 3, out="x"), _call(torch.sigmoid, "x")):
        assert not facts.makes_tensor(n), n.target
    assert facts.is_zeros(_call(torch.zeros_like, "x")) and not facts.is_zeros(_call(torch.ones, 2))


def test_random_ops_are_the_ones_torch_tags_seeded():
    assert all(facts.target_draws_random_numbers("call_function", f)
               for f in (torch.randn, torch.bernoulli, F.dropout, F.dropout1d, torch.rand_like))
    assert facts.target_draws_random_numbers("call_method", "normal_")
    assert not any(facts.target_draws_random_numbers("call_function", f) for f in (torch.add, torch.zeros, len))


def test_shape_static_ops_are_single_kernels_torch_does_not_tag_value_dependent():
    """Composites (``where(mask)`` runs ``nonzero``) and ops tagged with a value-dependent output (shape) are not."""
    static = [torch.add, torch.sigmoid, torch.cat, torch.stack, torch.sum, torch.index_select, torch.tanh]
    assert all(facts.target_shape_static("call_function", f) for f in static)
    assert all(facts.target_shape_static("call_method", m) for m in ("repeat", "new_zeros", "expand", "view", "t"))
    value_dependent = [torch.nonzero, torch.masked_select, torch.unique_consecutive, torch.argwhere, torch.where,
                       torch.repeat_interleave, torch.bincount, torch.unique, torch.equal, operator.add]
    assert not any(facts.target_shape_static("call_function", f) for f in value_dependent)
    assert not any(facts.target_shape_static("call_method", m) for m in ("item", "tolist", "nonzero", "narrow"))


def test_ops_of_three_tensors_are_told_from_binary_ones():
    for target in (torch.where, torch.lerp, torch.addcmul, torch.clamp, "clamp"):
        assert facts.takes_three_tensors("call_method" if isinstance(target, str) else "call_function", target)
    for target in (torch.add, torch.mul, torch.sigmoid, operator.add, torch.mm):
        assert not facts.takes_three_tensors("call_function", target), target


def _storages(value) -> set:
    if isinstance(value, torch.Tensor):
        return {value.untyped_storage().data_ptr()} if value.layout == torch.strided and value.numel() else set()
    if isinstance(value, (list, tuple)):
        return set().union(*map(_storages, value)) if value else set()
    return set()


def _misjudged_op_db_calls() -> list:
    """op_db's function and method variants, on each op's first CPU float32 samples, whose result shares memory
    with an operand that :func:`facts.aliased_operands` does not name (or that :func:`facts.may_alias` says
    never aliases)."""
    from torch.testing._internal.common_methods_invocations import op_db

    misjudged = set()
    for info in op_db:
        if torch.float32 not in info.supported_dtypes("cpu"):
            continue
        variants = [("call_function", info.op)]
        if info.method_variant is not None:
            variants.append(("call_method", info.method_variant.__name__))
        try:
            samples = op_db_samples(info, torch.float32, first=3)
        except Exception:   # noqa: BLE001  (samples op_db cannot make on this build)
            continue
        for sample, (op, target) in ((s, v) for s in samples for v in variants):
            if op == "call_function" and facts.aten_name(op, target) is None:
                continue   # a lambda or wrapper of op_db's, not a call a model records
            # the call as a graph records it: tensors are nodes
            graph, tensors = fx.Graph(), {}

            def node_of(value):
                if isinstance(value, torch.Tensor):
                    node = graph.placeholder(f"t{len(tensors)}")
                    tensors[node] = value
                    return node
                return value

            args = fx.node.map_aggregate((sample.input, *sample.args), node_of)
            kwargs = fx.node.map_aggregate(sample.kwargs, node_of)
            node = graph.create_node(op, target, args, kwargs)
            call = target if op == "call_function" else getattr(sample.input, target, None)
            try:
                with torch.no_grad():
                    result = call(sample.input, *sample.args, **sample.kwargs) if op == "call_function" \
                        else call(*sample.args, **sample.kwargs)
            except Exception:   # noqa: BLE001
                continue
            shared = _storages(result) & _storages(list(tensors.values()))
            named = _storages([tensors[n] for n in facts.aliased_operands(node)]) if facts.may_alias(node) else set()
            if shared - named:
                misjudged.add((op, getattr(target, "__name__", target)))
    return sorted(misjudged)


def test_every_op_db_op_whose_result_shares_an_operand_s_memory_may_alias_that_operand():
    """A view missing here would be a wrong result, not a missed speed-up: a pass would take the view for a
    new tensor and write into it, or copy an output eager returns as a view."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        misjudged = _misjudged_op_db_calls()
    assert not misjudged
