"""The segment_reduce custom op: values, gradients (including ties and NaNs), fake tensors, opcheck."""
import pytest
import torch

from dynamo_relational.kernels.segment import csr_offsets, segment_reduce


def _reference(data, counts, reduce):
    parts = torch.split(data, counts)
    return torch.stack([getattr(p, reduce)(0) if len(p) else torch.zeros_like(data[0]) for p in parts])


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_segment_reduce_matches_dense_reduction(reduce):
    torch.manual_seed(0)
    counts = [3, 1, 4, 2]
    data = torch.randn(sum(counts), 5, dtype=torch.float64, requires_grad=True)
    data_ref = data.detach().clone().requires_grad_()
    out = segment_reduce(data, csr_offsets(counts), reduce)
    want = _reference(data_ref, counts, reduce)
    torch.testing.assert_close(out, want)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    (want * weights).sum().backward()
    torch.testing.assert_close(data.grad, data_ref.grad)


def test_max_gradient_splits_ties_like_amax():
    data = torch.tensor([[1.0], [1.0], [0.5]], dtype=torch.float64, requires_grad=True)
    segment_reduce(data, csr_offsets([3]), "amax").sum().backward()
    torch.testing.assert_close(data.grad, torch.tensor([[0.5], [0.5], [0.0]], dtype=torch.float64))


@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_extreme_gradients_with_nans_are_eagers(reduce):
    """A NaN extreme (no row equals it) gives NaN to every row of its segment, as eager's amax does (the
    rows that missed used to get 0); so does an infinite output gradient."""
    counts = [3, 2, 2]
    data = torch.tensor([[1.0, 2.0], [float("nan"), 0.5], [0.5, 0.5], [3.0, -1.0], [2.0, float("nan")],
                         [4.0, 4.0], [1.0, 0.0]], dtype=torch.float64)
    grad_out = torch.tensor([[1.0, 2.0], [0.5, 1.0], [float("inf"), 1.0]], dtype=torch.float64)
    got, want = data.clone().requires_grad_(), data.clone().requires_grad_()
    segment_reduce(got, csr_offsets(counts), reduce).backward(grad_out)
    _reference(want, counts, reduce).backward(grad_out)
    torch.testing.assert_close(got.grad, want.grad, equal_nan=True)


def test_ragged_max_aggregation_with_nans_compiles_to_eagers_gradients():
    import dynamo_relational

    class MaxOfNeighbors(torch.nn.Module):
        def forward(self, x):
            neighbors = [[1, 2], [0, 1, 3], [2], [1]]
            return torch.stack([torch.stack([x[u] for u in nbrs]).amax(0) for nbrs in neighbors])

    model, x = MaxOfNeighbors(), torch.randn(4, 3, dtype=torch.float64)
    x[1, 0] = x[2, 1] = float("nan")
    compiled = dynamo_relational.compile(model, x, inductor=False)
    assert "segment_reduce" in compiled.graph.code
    results = []
    for fn in (model, compiled):
        leaf = x.clone().requires_grad_()
        out = fn(leaf)
        out.backward(torch.ones_like(out))
        results.append((out, leaf.grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_empty_segments_sum_to_zero():
    out = segment_reduce(torch.ones(2, 3), csr_offsets([2, 0]), "sum")
    torch.testing.assert_close(out, torch.tensor([[2.0] * 3, [0.0] * 3]))


def test_opcheck_passes():
    data = torch.randn(6, 2, requires_grad=True)
    for reduce in ("sum", "mean", "amax"):
        torch.library.opcheck(torch.ops.dynamo_relational.segment_reduce.default,
                              (data, csr_offsets([2, 3, 1]), reduce))


def test_bad_reduce_is_named():
    with pytest.raises(ValueError, match="reduce must be one of"):
        segment_reduce(torch.ones(2, 2), csr_offsets([2]), "median")
