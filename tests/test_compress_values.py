"""passes/compress_values.py: with ``value_compression``, equal rows of a vectorized node are computed
once; only buffers are read by value, never parameters or inputs; the compiled model equals eager,
also after its parameters change."""
import pytest
import torch
from torch import nn

import dynamo_relational
from tests.helpers import (TOLERANCE, FactGCN, assert_fast_compile_matches_eager, compressed_rows, fact_gcn,
                           warnings_logged)

_GATHER_REDUCE = torch.ops.dynamo_relational.gather_reduce.default


def _reduced_rows(compiled) -> int:
    return sum(node.args[2] for node in compiled.graph.graph.nodes if node.target is _GATHER_REDUCE)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rows_that_read_equal_facts_are_computed_once(dtype):
    model = fact_gcn(dtype)
    plain = dynamo_relational.compile(model, (), strict=True)
    compressed = assert_fast_compile_matches_eager(model, value_compression=True)
    assert compressed_rows(compressed), "no node was compressed"
    assert _reduced_rows(compressed) < _reduced_rows(plain)
    assert "value compression" in str(compressed.report)


def test_compressed_model_matches_eager_through_training():
    """The rows merged are equal for every parameter value: training steps (which move the initially
    equal ``scale`` entries apart) keep the compiled model equal to eager."""
    model = fact_gcn()
    twin = fact_gcn()
    twin.load_state_dict(model.state_dict())
    compiled = dynamo_relational.compile(model, (), strict=True, value_compression=True)
    assert compressed_rows(compiled)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, twin)]
    for _ in range(3):
        losses = [(compiled() ** 2).sum(), (twin() ** 2).sum()]
        for loss, optimizer in zip(losses, optimizers):
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        torch.testing.assert_close(compiled(), twin(), **TOLERANCE[torch.float64])
    assert not torch.allclose(model.scale, torch.ones_like(model.scale))


def test_inputs_are_never_compared_by_value():
    """The same features passed as an input: equal rows today may differ on the next call."""
    model = fact_gcn(features_as_input=True)
    compiled = assert_fast_compile_matches_eager(model, model.facts.clone(), value_compression=True)
    assert not compressed_rows(compiled)
    other = torch.randn_like(model.facts)
    torch.testing.assert_close(compiled(other), model(other), **TOLERANCE[torch.float64])


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_dropouts_in_training_of_equal_facts_stay_apart(front_end):
    """Dropout in training draws a mask per row and per call: rows computed from equal facts through it
    are not equal (merged, every atom read one atom's dropped-out facts)."""
    class Dropped(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("facts", torch.ones(8, 64, dtype=torch.float64))
            self.lin = nn.Linear(64, 4, dtype=torch.float64)

        def forward(self):
            dropped = [torch.nn.functional.dropout(self.facts[v], 0.5, True) for v in range(8)]
            return torch.stack([torch.tanh(self.lin(h)) for h in dropped])

    model = Dropped()
    if front_end == "fast":
        compiled = dynamo_relational.compile(model, (), value_compression=True, strict=True)
    else:
        compiled = torch.compile(model, backend="relational", options={"value_compression": True, "strict": True})
    torch.manual_seed(0)
    out = compiled()
    assert len({tuple(row.tolist()) for row in out}) == 8   # (two equal masks of 64 entries: chance 2^-64)


def test_distinct_facts_leave_the_graph_alone():
    model = fact_gcn(types=1)
    model.facts = torch.randn_like(model.facts)   # every atom its own values
    compiled = assert_fast_compile_matches_eager(model, value_compression=True)
    assert not compressed_rows(compiled)


def test_off_by_default():
    compiled = dynamo_relational.compile(fact_gcn(), (), strict=True)
    assert "rows_compressed" not in compiled.report.graphs[0].stats


def test_backend_option_through_torch_compile():
    model = fact_gcn(graphs=2)
    report = dynamo_relational.explain(model, value_compression=True, strict=True)
    torch.testing.assert_close(report.compiled(), model(), **TOLERANCE[torch.float64])
    assert any(g.stats.get("rows_compressed") for g in report.graphs)


def _new_facts(model: FactGCN) -> None:
    """Every atom a type of its own: no two rows read equal facts any more."""
    with torch.no_grad():
        model.facts.copy_(torch.randn(model.facts.shape, dtype=model.facts.dtype,
                                      generator=torch.Generator().manual_seed(1)))


def test_facts_changed_in_place_after_compiling_are_traced_again_by_the_fast_front_end():
    """The merges hold for the facts the compression read: the fast front-end compares their version
    counter on every call, as it does plain attributes, and traces again."""
    model = fact_gcn(graphs=2)
    compiled = dynamo_relational.compile(model, (), value_compression=True, strict=True)
    assert compressed_rows(compiled)
    _new_facts(model)
    with warnings_logged() as warnings:
        torch.testing.assert_close(compiled(), model(), **TOLERANCE[torch.float64])
    assert any("facts changed in place" in message for message in warnings)


def test_facts_changed_in_place_after_compiling_are_a_clear_error_under_torch_compile():
    """Dynamo's guards do not read buffer values: the call names the buffer instead of returning old merges."""
    model = fact_gcn(graphs=2)
    compiled = torch.compile(model, backend="relational", options={"value_compression": True, "strict": True})
    torch.testing.assert_close(compiled(), model(), **TOLERANCE[torch.float64])
    _new_facts(model)
    with pytest.raises(dynamo_relational.RelationalError, match=r"value_compression.*_buffers\['facts'\].*changed"):
        compiled()
