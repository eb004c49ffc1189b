"""Module hooks, tensor hooks and torch.func transforms around compiled models: eager's numbers and
gradients through both front-ends, or a clear error; never a hook silently dropped."""

import pytest
import torch
from torch import nn

import dynamo_relational
from dynamo_relational.frontend import FrontendError
from tests.helpers import TOLERANCE, assert_compiled_matches_eager, assert_fast_compile_matches_eager, warnings_logged

NBRS = [[1, 2], [0, 3], [0, 1, 3], [2], [0, 4], [1]]
EXACT = TOLERANCE[torch.float64]


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()

    def forward(self, x):
        return torch.stack([torch.tanh(sum(self.lin(x[u]) for u in nbrs)) for nbrs in NBRS])


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = Layer(), Layer()

    def forward(self, x):
        return self.second(self.first(x))


def _x():
    return torch.randn(len(NBRS), 4, dtype=torch.float64)


def _outputs_and_gradients(fn, model, x):
    leaf = x.clone().requires_grad_()
    out = fn(leaf)
    return [out, *torch.autograd.grad(out.pow(2).sum(), [leaf, *model.parameters()])]


def _assert_same(got, want):
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **EXACT)


HOOKS = {
    "forward hook on the model": lambda m: m.register_forward_hook(lambda mod, args, out: out * 2),
    "forward pre-hook on the model": lambda m: m.register_forward_pre_hook(lambda mod, args: (args[0].flip(0),)),
    "forward hook on a submodule": lambda m: m.first.register_forward_hook(lambda mod, args, out: out.relu()),
}


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_fast_compile_sees_module_hooks_registered_after_compiling(hook):
    """A hook registered (or removed) after compiling changes the traced graph, as a train/eval switch
    does: the next call traces again. Removing it brings back the graph traced without it."""
    torch.manual_seed(0)
    model, x = TwoLayers(), _x()
    compiled = dynamo_relational.compile(model, x, inductor=False, strict=True)
    _assert_same(_outputs_and_gradients(compiled, model, x), _outputs_and_gradients(model, model, x))
    handle = HOOKS[hook](model)
    try:
        with warnings_logged() as warnings:
            _assert_same(_outputs_and_gradients(compiled, model, x), _outputs_and_gradients(model, model, x))
        assert any("buffers changed; tracing and compiling it again" in w for w in warnings)
    finally:
        handle.remove()
    traced = len(compiled._traced)
    _assert_same(_outputs_and_gradients(compiled, model, x), _outputs_and_gradients(model, model, x))
    assert len(compiled._traced) == traced   # the graph from before the hook, not a third trace


def test_fast_compile_runs_module_hooks_registered_before_compiling():
    torch.manual_seed(0)
    model, x = TwoLayers(), _x()
    handles = [HOOKS[hook](model) for hook in sorted(HOOKS)]
    try:
        assert_fast_compile_matches_eager(model, x)
    finally:
        for handle in handles:
            handle.remove()


def test_global_module_hooks_are_a_clear_error_in_the_fast_front_end():
    """A global hook runs on every module call, also on the compiled module's own calls: refused, at
    compile time and at the first call after one is registered."""
    model, x = TwoLayers(), _x()
    compiled = dynamo_relational.compile(model, x, inductor=False)
    handle = nn.modules.module.register_module_forward_hook(lambda mod, args, out: out * 2)
    try:
        with pytest.raises(FrontendError, match=r"TwoLayers: global module hooks .* are not supported"):
            dynamo_relational.compile(model, x)
        with pytest.raises(FrontendError, match=r"TwoLayers: global module hooks .* are not supported"):
            compiled(x)
    finally:
        handle.remove()
    torch.testing.assert_close(compiled(x), model(x), **EXACT)


BACKWARD_HOOKS = {
    "full backward hook": (lambda m: m.first.register_full_backward_hook(lambda mod, gin, gout: (gin[0] * 3,)),
                           r"on first \(Layer\)"),
    "backward pre-hook": (lambda m: m.register_full_backward_pre_hook(lambda mod, gout: (gout[0] * 3,)),
                          r"on the model \(TwoLayers\)"),
}


@pytest.mark.parametrize("hook", sorted(BACKWARD_HOOKS))
def test_module_backward_hooks_are_a_clear_error_in_the_fast_front_end_and_run_through_dynamo(hook):
    """Tracing on proxies would drop a module backward hook (its autograd Function skips them) and
    give other gradients: the fast front-end refuses, naming the module; TorchDynamo runs the hook."""
    torch.manual_seed(0)
    model, x = TwoLayers(), _x()
    register, where = BACKWARD_HOOKS[hook]
    handle = register(model)
    try:
        with pytest.raises(FrontendError, match=rf"module backward hooks are not recorded .*{where}"):
            dynamo_relational.compile(model, x)
        assert_compiled_matches_eager(model, x)
    finally:
        handle.remove()


class TensorHooks(nn.Module):
    """Scales the gradient reaching every neuron's output (``h.register_hook`` on an intermediate)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()

    def forward(self, x):
        out = []
        for nbrs in NBRS:
            h = torch.tanh(sum(self.lin(x[u]) for u in nbrs))
            h.register_hook(lambda grad: grad * 3)
            out.append(h)
        return torch.stack(out)


@pytest.mark.parametrize("inductor", [False, True])
def test_tensor_hooks_on_intermediates_run_through_dynamo(inductor):
    """The executor choice times the forward in the grad mode it was compiled in: without gradients, the
    graph's ``register_hook`` calls would fail on tensors that need none."""
    torch.manual_seed(0)
    assert_compiled_matches_eager(TensorHooks(), _x(), inductor=inductor)


def test_tensor_hooks_are_a_clear_error_in_the_fast_front_end():
    with pytest.raises(FrontendError, match=r"h.register_hook\(lambda grad: grad \* 3\)"):
        dynamo_relational.compile(TensorHooks(), _x())


@pytest.mark.parametrize("options", [{}, {"autotune": False}, {"inductor": False}], ids=str)
def test_torch_func_transforms_of_a_fast_compiled_model_equal_eager(options):
    """Inside torch.func transforms the compiled code cannot run (its custom ops and AOT autograd's
    functions do not implement them): the model runs eagerly, with a warning."""
    torch.manual_seed(0)
    model, x = TwoLayers(), _x()
    compiled = dynamo_relational.compile(model, x, strict=True, **options)
    with warnings_logged() as warnings:
        grad = torch.func.grad(lambda inputs: compiled(inputs).pow(2).sum())(x)
    assert any("called inside a torch.func transform; running the model eagerly" in w for w in warnings)
    torch.testing.assert_close(grad, torch.func.grad(lambda inputs: model(inputs).pow(2).sum())(x), **EXACT)
    batch = torch.randn(3, *x.shape, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(compiled)(batch), torch.func.vmap(model)(batch), **EXACT)
    tangent = torch.randn_like(x)
    torch.testing.assert_close(torch.func.jvp(compiled, (x,), (tangent,)), torch.func.jvp(model, (x,), (tangent,)),
                               **EXACT)
    torch.testing.assert_close(compiled(x), model(x), **EXACT)   # outside the transforms: the compiled code


class InputGradients(nn.Module):
    """Each neuron's output is the gradient of an energy with respect to its input row (torch.func.grad
    inside forward): Dynamo records the transform's level changes and ``_set_tensor_requires_grad``,
    whose result nothing reads."""

    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(torch.randn(4, 4, dtype=torch.float64))

    def forward(self, x):
        energy = lambda row: torch.tanh(self.W @ row).pow(2).sum()   # noqa: E731
        return torch.stack([torch.func.grad(energy)(x[v]) + x[v] for v in range(x.shape[0])])


@pytest.mark.parametrize("inductor", [False, True])
def test_torch_func_grad_inside_forward_matches_eager_through_dynamo(inductor):
    """The transform's calls run in their order and none is dropped as dead code (``_set_tensor_requires_grad``
    was: the gradients came back wrong)."""
    torch.manual_seed(0)
    assert_compiled_matches_eager(InputGradients(), torch.randn(5, 4, dtype=torch.float64), inductor=inductor)
