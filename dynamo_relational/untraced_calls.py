"""Calls without a traced argument, which plain fx runs once while tracing and freezes into the graph as a
constant: random ops (``torch.randn(4)``, ``torch.bernoulli(p)`` of a constant ``p``), which eager runs anew
on every call, and tensor factories (``torch.zeros(n, d)``), whose tensors eager makes anew on every call.

The tracer draws no random number itself (random values are computed on a forked generator), so a change of
the default generators' states during a trace shows that a random op ran outside the graph.
:class:`RecordUntracedCalls` then records such calls as nodes on a second trace (see
:func:`dynamo_relational.tracing.trace` for when); random ops given their own ``generator=`` are refused."""
from __future__ import annotations

import contextlib
import functools
import random
from typing import TYPE_CHECKING, Callable, Iterator

import numpy
import torch
import torch.fx as fx
from torch.overrides import TorchFunctionMode

from .errors import FrontendError
from .ops.facts import RANDOM_UNDER_OTHER_NAMES, named_random
from .value_proxy import has_proxy

if TYPE_CHECKING:
    from .tracer import Tracer


@functools.cache
def random_ops() -> frozenset[str]:
    """Names of the ops that draw random numbers: ATen ops tagged ``nondeterministic_seeded``
    (``randn``, ``rand_like``, ``bernoulli``, ``dropout``, ``normal_``, ``random_``, ...), and the
    dropout variants of ``torch.nn.functional``, which reach ATen under other names. Found once per
    process, on the first trace (looking at every ATen op takes about 0.3 s)."""
    aten = {qualified.partition("::")[2].split(".")[0] for qualified in torch._C._dispatch_get_all_op_names()
            if qualified.startswith("aten::")}
    return frozenset(name for name in aten | RANDOM_UNDER_OTHER_NAMES if named_random(name))


def is_random(node: fx.Node, appliers) -> bool:
    """Whether computing ``node`` may draw random numbers: a random op, or a custom autograd Function."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", None)
    return name in random_ops() or node.target in appliers


def generator_states() -> list[torch.Tensor]:
    """The states of the default generators (CPU, and each CUDA device once CUDA is in use)."""
    states = [torch.random.get_rng_state()]
    if torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return states


def set_generator_states(states: list[torch.Tensor]) -> None:
    torch.random.set_rng_state(states[0])
    if len(states) > 1:
        torch.cuda.set_rng_state_all(states[1:])


def library_random_states() -> tuple:
    """The states of Python's and numpy's global generators, which library code may draw from (PyG's negative
    sampling draws from Python's)."""
    return random.getstate(), numpy.random.get_state()


def set_library_random_states(states: tuple) -> None:
    random.setstate(states[0])
    numpy.random.set_state(states[1])


def drew_since(states: list[torch.Tensor]) -> bool:
    """Whether random numbers were drawn from the default generators since they had ``states``."""
    return any(not torch.equal(a, b) for a, b in zip(states, generator_states()))


def _refusing_generators(function: Callable, name: str, current: Callable[[], Tracer | None]) -> Callable:
    @functools.wraps(function)
    def refusing(*args, **kwargs):
        tracer = current()
        if tracer is not None and kwargs.get("generator") is not None:
            raise FrontendError(f"random op `{name}` with an explicit torch.Generator at {tracer.user_line()}\n"
                                "dynamo_relational.compile records random ops on the default generator only: drop "
                                "the generator, or use torch.compile(model, backend=\"relational\").")
        return function(*args, **kwargs)
    return refusing


@contextlib.contextmanager
def refusing_own_generators(current: Callable[[], Tracer | None]) -> Iterator[None]:
    """A random op given its own ``generator=`` draws from a generator the tracer does not watch
    (see :func:`drew_since`): while a trace runs (``current()``, the tracer, is not None), the random
    functions of ``torch`` and ``torch.Tensor`` refuse it, naming the line, instead of letting its numbers
    be frozen. (The patch is process-wide: another thread passing ``generator=`` during a trace is refused
    too.)"""
    patched = []
    for namespace in (torch, torch.Tensor):
        for name in random_ops():
            original = getattr(namespace, name, None)
            if callable(original):
                patched.append((namespace, name, namespace.__dict__.get(name)))
                setattr(namespace, name, _refusing_generators(original, name, current))
    try:
        yield
    finally:
        for namespace, name, own in patched:
            if own is None:   # inherited (tensor methods live on torch._C.TensorBase)
                delattr(namespace, name)
            else:
                setattr(namespace, name, own)


class RecordUntracedCalls(TorchFunctionMode):
    """Records calls without a traced argument that fx would run once while tracing and freeze into
    the graph as a constant: random ops (``torch.randn(4)``, ``torch.bernoulli(p)`` of a constant
    ``p``), which then draw new numbers on every call, and (``factories``) tensor factories
    (``torch.zeros(n, d)``), whose tensors are then new on every call and traced when code writes
    into them. Every other call runs as is (calls with traced arguments reach
    :meth:`ValueProxy.__torch_function__ <dynamo_relational.value_proxy.ValueProxy.__torch_function__>`)."""

    def __init__(self, tracer: Tracer, random: bool, factories: bool):
        super().__init__()
        self.tracer = tracer
        self.names = (random_ops() if random else frozenset()) | (_FACTORY_NAMES if factories else frozenset())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in self.names and not has_proxy(args, kwargs):
            return self.tracer.record(func, args, kwargs)
        return func(*args, **kwargs)


#: tensor factories of ``torch`` (called without a traced argument: see :class:`RecordUntracedCalls`)
_FACTORY_NAMES = frozenset(("zeros", "ones", "full", "empty", "tensor", "as_tensor", "arange", "eye", "linspace",
                            "logspace", "zeros_like", "ones_like", "full_like", "empty_like", "empty_strided"))
#: in-place ops that Python's augmented assignment calls: ``acc += t`` rebinds ``acc`` to the op's result
_AUGMENTED = frozenset(("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__", "__imatmul__",
                        "__ifloordiv__", "__imod__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"))


def writes_untraced_tensor(func: Callable, args: tuple) -> bool:
    """Whether ``func(*args)``, a call with a traced argument, writes into a tensor that is not traced
    (``out[v] = h``, ``out.add_(h)`` for an ``out`` made from Python values): code reading that tensor
    later runs on its traced value, which the write did not change. Augmented assignment (``acc += h``)
    rebinds the name to the traced result, so later code reads that."""
    if not args or not isinstance(args[0], torch.Tensor) or isinstance(args[0], fx.Proxy):
        return False
    name = getattr(func, "__name__", "")
    return name == "__setitem__" or (name.endswith("_") and not name.endswith("__") and name not in _AUGMENTED)
