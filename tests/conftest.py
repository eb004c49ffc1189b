"""Shared checks: a compiled model must equal eager, outputs and gradients."""
from __future__ import annotations

import contextlib
import logging
import os

import pytest
import torch
import torch._inductor.config

import dynamo_relational

TOLERANCE = {torch.float64: dict(rtol=1e-9, atol=1e-12), torch.float32: dict(rtol=1e-4, atol=1e-5)}

if os.environ.get("PYTEST_XDIST_WORKER"):
    # test.sh runs one worker per core: a worker's own OpenMP threads would compete with the others' (small
    # kernels stall then), and Inductor's pool of compile processes would too
    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1


def assert_compiled_matches_eager(model: torch.nn.Module, *inputs: torch.Tensor, tolerance: dict | None = None,
                                  **options):
    """Compile with the relational backend (via explain, strict), compare with eager; return the report.
    ``tolerance`` replaces the output dtype's (for a model that itself rounds through a lower precision)."""
    torch._dynamo.reset()
    options.setdefault("strict", True)
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    report = dynamo_relational.explain(model, *leaves, **options)
    compiled_out = report.compiled(*leaves)
    eager_out = model(*leaves)
    tol = tolerance or TOLERANCE[eager_out.dtype]
    torch.testing.assert_close(compiled_out, eager_out, **tol)
    wrt = [p for p in model.parameters() if p.requires_grad] + [x for x in leaves if x.requires_grad]
    weights = torch.randn_like(eager_out)
    got = torch.autograd.grad((compiled_out * weights).sum(), wrt, allow_unused=True)
    want = torch.autograd.grad((eager_out * weights).sum(), wrt, allow_unused=True)
    for g, w in zip(got, want):
        if w is None:
            assert g is None or torch.count_nonzero(g) == 0
        else:
            torch.testing.assert_close(g, w, **tol)
    return report


def assert_as_close_to_float64_as_eager(compiled, model: torch.nn.Module, exact: torch.nn.Module, x: torch.Tensor,
                                        x64: torch.Tensor, under=contextlib.nullcontext):
    """In low precision a compiled model rounds differently from eager: compare both with ``exact``, the
    model's float64 twin, instead. The compiled outputs and gradients (run, like eager's, inside
    ``under()``) must be as close to it as eager's, or closer (the largest relative error over the
    output and each parameter's gradient)."""
    def outputs_and_gradients(fn, module, inputs):
        out = fn(inputs.clone().requires_grad_())
        return [out.double()] + [g.double() for g in torch.autograd.grad(out.float().sum(), list(module.parameters()))]

    want = outputs_and_gradients(exact, exact, x64)

    def error(fn):
        with under():
            values = outputs_and_gradients(fn, model, x)
        return max(((v - w).abs().max() / w.abs().max()).item() for v, w in zip(values, want))

    assert error(compiled) <= error(model)


@contextlib.contextmanager
def warnings_logged():
    """The messages of the warnings logged by dynamo_relational inside the block."""
    messages = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("dynamo_relational")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
