"""Shared checks: a compiled model must equal eager, outputs and gradients."""
from __future__ import annotations

import pytest
import torch

import dynamo_relational

TOLERANCE = {torch.float64: dict(rtol=1e-9, atol=1e-12), torch.float32: dict(rtol=1e-4, atol=1e-5)}


def assert_compiled_matches_eager(model: torch.nn.Module, *inputs: torch.Tensor, **options):
    """Compile with the relational backend (via explain, strict), compare with eager; return the report."""
    torch._dynamo.reset()
    options.setdefault("strict", True)
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    report = dynamo_relational.explain(model, *leaves, **options)
    compiled_out = report.compiled(*leaves)
    eager_out = model(*leaves)
    dtype = eager_out.dtype
    torch.testing.assert_close(compiled_out, eager_out, **TOLERANCE[dtype])
    wrt = [p for p in model.parameters() if p.requires_grad] + [x for x in leaves if x.requires_grad]
    weights = torch.randn_like(eager_out)
    got = torch.autograd.grad((compiled_out * weights).sum(), wrt, allow_unused=True)
    want = torch.autograd.grad((eager_out * weights).sum(), wrt, allow_unused=True)
    for g, w in zip(got, want):
        if w is None:
            assert g is None or torch.count_nonzero(g) == 0
        else:
            torch.testing.assert_close(g, w, **TOLERANCE[dtype])
    return report


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
