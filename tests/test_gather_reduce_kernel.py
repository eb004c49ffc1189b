"""The gather_reduce / gather_rows custom ops: values, gradients, fake tensors, opcheck, determinism."""
import pytest
import torch

from dynamo_relational.kernels.gather_reduce import gather_reduce, gather_rows, pack_csr, unit_offsets
from dynamo_relational.kernels.segment import csr_offsets

COUNTS = [3, 0, 2, 4]
INDEX = torch.tensor([0, 4, 2, 1, 1, 3, 0, 4, 2])


def _reference(source, reduce):
    parts = torch.split(source[INDEX], COUNTS)
    empty = torch.zeros(source.shape[1:], dtype=source.dtype)
    return torch.stack([getattr(p, reduce)(0) if len(p) else empty for p in parts])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(5,), (5, 3), (5, 2, 2)])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_gather_reduce_matches_gather_then_reduce(dtype, shape, reduce):
    torch.manual_seed(0)
    source = torch.randn(*shape, dtype=dtype, requires_grad=True)
    csr = pack_csr(csr_offsets(COUNTS), INDEX, shape[0])
    out = gather_reduce(source, csr, len(COUNTS), reduce)
    want = _reference(source, reduce)
    torch.testing.assert_close(out, want)
    weights = torch.randn_like(out)
    got_grad, = torch.autograd.grad((out * weights).sum(), source)
    want_grad, = torch.autograd.grad((want * weights).sum(), source)
    torch.testing.assert_close(got_grad, want_grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_low_precision_on_cpu_is_reduced_in_float32_and_rounded_once(dtype, reduce):
    """MKL's sparse product takes no bfloat16 or float16: those sources are reduced in float32."""
    torch.manual_seed(0)
    source = torch.randn(5, 3).to(dtype).requires_grad_()
    csr = pack_csr(csr_offsets(COUNTS), INDEX, 5)
    out = gather_reduce(source, csr, len(COUNTS), reduce)
    assert out.dtype == dtype
    torch.testing.assert_close(out, _reference(source.detach().float(), reduce).to(dtype), rtol=0, atol=0)
    weights = torch.randn_like(out)
    got, = torch.autograd.grad((out * weights).sum(), source)
    exact = source.detach().float().requires_grad_()
    want, = torch.autograd.grad((_reference(exact, reduce) * weights.float()).sum(), exact)
    torch.testing.assert_close(got, want.to(dtype), rtol=0, atol=0)


def test_products_keep_the_source_dtype_under_autocast():
    source = torch.randn(5, 3, requires_grad=True)
    csr = pack_csr(csr_offsets(COUNTS), INDEX, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = gather_reduce(source, csr, len(COUNTS), "sum")
        grad, = torch.autograd.grad(out.sum(), source)
    assert out.dtype == grad.dtype == torch.float32
    torch.testing.assert_close(out, _reference(source.detach(), "sum"))


def test_gather_rows_is_index_select_with_the_same_gradient():
    source = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    out = gather_rows(source, pack_csr(unit_offsets(len(INDEX)), INDEX, 5))
    torch.testing.assert_close(out, source[INDEX])
    weights = torch.randn_like(out)
    got, = torch.autograd.grad((out * weights).sum(), source)
    want, = torch.autograd.grad((source[INDEX] * weights).sum(), source)
    torch.testing.assert_close(got, want)


def test_transpose_multiplies_by_the_transposed_matrix():
    source = torch.randn(len(COUNTS), 2, dtype=torch.float64)
    csr = pack_csr(csr_offsets(COUNTS), INDEX, 5)
    dense = torch.zeros(len(COUNTS), 5, dtype=torch.float64)
    for row, (lo, hi) in enumerate(zip(csr_offsets(COUNTS)[:-1], csr_offsets(COUNTS)[1:])):
        for column in INDEX[lo:hi]:
            dense[row, column] += 1
    torch.testing.assert_close(gather_reduce(source, csr, 5, "sum", True), dense.t() @ source)


def _count_matrix() -> torch.Tensor:
    """``A`` as a dense matrix: entry (row, column) counts how often the row's segment reads the column."""
    dense = torch.zeros(len(COUNTS), 5, dtype=torch.float64)
    for row, (lo, hi) in enumerate(zip(csr_offsets(COUNTS)[:-1], csr_offsets(COUNTS)[1:])):
        for column in INDEX[lo:hi]:
            dense[row, column] += 1
    return dense


def _mean_of(matrix: torch.Tensor) -> torch.Tensor:
    return matrix / matrix.sum(1, keepdim=True).clamp(min=1)


def test_mean_adjoint_multiplies_by_the_transposed_mean_matrix():
    """``mean`` is the product by the matrix of 1/segment-size entries, ``mean_adjoint`` (its
    backward) the product by that matrix's transpose, in either orientation of the packed CSR."""
    csr = pack_csr(csr_offsets(COUNTS), INDEX, 5)
    counts = _count_matrix()
    rows, columns = torch.randn(len(COUNTS), 2, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)
    torch.testing.assert_close(gather_reduce(columns, csr, len(COUNTS), "mean"), _mean_of(counts) @ columns)
    torch.testing.assert_close(gather_reduce(rows, csr, 5, "mean_adjoint", True), _mean_of(counts).t() @ rows)
    # transposed: the segments are A's columns
    torch.testing.assert_close(gather_reduce(rows, csr, 5, "mean", True), _mean_of(counts.t()) @ rows)
    torch.testing.assert_close(gather_reduce(columns, csr, len(COUNTS), "mean_adjoint"),
                               _mean_of(counts.t()).t() @ columns)


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("reduce", ["mean", "mean_adjoint"])
def test_mean_gradients_pass_gradcheck(reduce, transpose):
    """First and second derivatives of both weighted products (each is the other's backward)."""
    csr = pack_csr(csr_offsets(COUNTS), INDEX, 5)
    rows = 5 if transpose else len(COUNTS)
    source = torch.randn(len(COUNTS) if transpose else 5, 3, dtype=torch.float64, requires_grad=True)
    fn = lambda s: gather_reduce(s, csr, rows, reduce, transpose)   # noqa: E731
    assert torch.autograd.gradcheck(fn, (source,))
    assert torch.autograd.gradgradcheck(fn, (source,))


def test_backward_is_deterministic():
    torch.manual_seed(0)
    index = torch.randint(0, 50, (20000,))
    csr = pack_csr(csr_offsets([100] * 200), index, 50)
    source = torch.randn(50, 8, requires_grad=True)
    grads = [torch.autograd.grad(gather_reduce(source, csr, 200, "sum").square().sum(), source)[0]
             for _ in range(3)]
    assert all(torch.equal(grads[0], g) for g in grads[1:])


def test_opcheck_passes():
    source = torch.randn(5, 3, requires_grad=True)
    csr = pack_csr(csr_offsets(COUNTS), INDEX, 5)
    for reduce in ("sum", "mean", "mean_adjoint"):
        torch.library.opcheck(torch.ops.dynamo_relational.gather_reduce.default, (source, csr, len(COUNTS), reduce))
    torch.library.opcheck(torch.ops.dynamo_relational.gather_rows.default,
                          (source, pack_csr(unit_offsets(len(INDEX)), INDEX, 5)))


def test_bad_arguments_are_named():
    csr = pack_csr(csr_offsets(COUNTS), INDEX, 5)
    with pytest.raises(ValueError, match="reduce must be one of"):
        gather_reduce(torch.ones(5, 2), csr, len(COUNTS), "amax")
    with pytest.raises(ValueError, match="does not fit a 4 x 6 matrix"):
        gather_reduce(torch.ones(6, 2), csr, len(COUNTS), "sum")
    with pytest.raises(ValueError, match="floating"):
        gather_reduce(torch.ones(5, 2, dtype=torch.long), csr, len(COUNTS), "sum")


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("shape", [(3, 2), (4,), (0,)])
@pytest.mark.parametrize("in_order", [False, True], ids=["gathered", "every_row_in_order"])
def test_indexed_forms_equal_the_ops_values_and_gradients(reduce, shape, in_order):
    """``index_select`` + ``index_add`` of the indexed layout (the forms for indices new on every call): the
    op's numbers, empty segments and rows of no width included; also where the index reads every source row
    in order (a pooling of each sample's rows), which skips the gather."""
    from dynamo_relational.kernels.gather_reduce import gather_reduce_indexed, gather_rows_indexed, pack_indexed

    generator = torch.Generator().manual_seed(0)
    rows, columns = 6, 9 if in_order else 5
    offsets = torch.tensor([0, 2, 2, 5, 6, 6, 9])
    index = torch.arange(9) if in_order else torch.randint(0, columns, (9,), generator=generator)
    csr = pack_csr(offsets, index, columns)
    source = torch.randn((columns, *shape), dtype=torch.float64, generator=generator, requires_grad=True)
    want, got = gather_reduce(source, csr, rows, reduce), gather_reduce_indexed(source, pack_indexed(offsets, index),
                                                                                 rows, reduce)
    weights = torch.randn(want.shape, dtype=torch.float64, generator=generator)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad((got * weights).sum(), source),
                               torch.autograd.grad((want * weights).sum(), source), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="not transposed"):
        gather_reduce_indexed(source, pack_indexed(offsets, index), rows, reduce, True)
    gather = pack_csr(unit_offsets(4), torch.tensor([4, 0, 0, 2]), 5)
    x = torch.randn(5, 3, dtype=torch.float64, generator=generator)
    torch.testing.assert_close(gather_rows_indexed(x, gather), gather_rows(x, gather))
