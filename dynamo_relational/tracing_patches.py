"""Process-wide patches in effect while the tracer runs ``forward``:

* ``nn.Module.__getattr__`` gives a module's parameters and buffers as proxies, as fx's trace does, so that
  code reading them records ``get_attr`` nodes;
* the functions fx wraps (``math``'s, those registered with ``torch.fx.wrap``) record a call when given a proxy;
* ``torch.autograd.Function.apply`` records a custom Function's call as one node (keeping its backward);
* ``nn.Module.__setattr__`` refuses storing a traced tensor in the model;
* the random functions refuse ``generator=`` (:func:`dynamo_relational.untraced_calls.refusing_own_generators`).

Setting a class attribute invalidates the method caches of every subclass (``nn.Module`` has hundreds), so
installing and removing the patches costs a few ms, as much as tracing a small sample, and slows the calls
after it while the caches fill again: a run of traces (:func:`patches_installed`, or
:func:`patches_when_needed` around all the new samples of a batch) installs them once, and each trace only
names itself the one they serve (:func:`tracing`). Between traces they act as the functions they wrap."""
from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, Iterator

import torch
import torch.fx as fx
from torch import nn
from torch.fx import _symbolic_trace as fx_trace
from torch.utils import _pytree as pytree

from .errors import FrontendError
from .untraced_calls import refusing_own_generators
from .value_proxy import IN_PLACE_TARGETS, has_proxy

if TYPE_CHECKING:
    from .tracer import Tracer

#: the tracer running ``forward`` now (None between traces), and the patcher of the installed patches
_current: Tracer | None = None
_patcher: Any = None
#: the exit stack of the :func:`patches_when_needed` block running now, which the patches are installed into
_deferred: contextlib.ExitStack | None = None
#: the functions fx wraps by default: ``math``'s
_MATH_FUNCTIONS = {id(f) for name, f in vars(math).items() if not name.startswith("_") and callable(f)}


def current_tracer() -> Tracer | None:
    return _current


@contextlib.contextmanager
def patches_installed() -> Iterator[Any]:
    """The patches in place for every trace run inside (installed here unless an outer run did, or kept until
    the end of an enclosing :func:`patches_when_needed` block)."""
    if _patcher is not None:
        yield _patcher
    elif _deferred is not None:
        yield _deferred.enter_context(_installed())
    else:
        with _installed() as patcher:
            yield patcher


@contextlib.contextmanager
def patches_when_needed() -> Iterator[None]:
    """A run of traces in which the first trace that needs the patches installs them, for the rest of the
    run. A recorded call needs none (:mod:`~dynamo_relational.recorder`): the batch's samples that the tracer
    traces share one installation, and a batch whose samples are all recorded installs nothing."""
    global _deferred
    if _patcher is not None or _deferred is not None:
        yield
        return
    with contextlib.ExitStack() as stack:
        _deferred = stack
        try:
            yield
        finally:
            _deferred = None


@contextlib.contextmanager
def _installed() -> Iterator[Any]:
    """The patches installed for the block; yields fx's patcher."""
    global _patcher
    with fx_trace._new_patcher() as patcher, _getting_attributes_as_proxies(), _recording_autograd_functions(), \
            _refusing_traced_attributes(), refusing_own_generators(current_tracer):
        fx_trace._patch_wrapped_functions(patcher)
        fx_trace._autowrap_check(patcher, vars(math), _MATH_FUNCTIONS)
        _patcher = patcher
        try:
            yield patcher
        finally:
            _patcher = None


@contextlib.contextmanager
def tracing(tracer: Tracer, model: nn.Module) -> Iterator[None]:
    """The patches in place and serving ``tracer``, which runs ``model``; ``math`` functions imported into
    the modules of its ``forward`` methods are wrapped too."""
    global _current
    with patches_installed() as patcher:
        for module in model.modules():
            fx_trace._autowrap_check(patcher, getattr(type(module).forward, "__globals__", {}), _MATH_FUNCTIONS)
        previous, _current = _current, tracer
        tracing_flag, fx_trace._is_fx_tracing_flag = fx_trace._is_fx_tracing_flag, True
        try:
            yield
        finally:
            _current = previous
            fx_trace._is_fx_tracing_flag = tracing_flag


@contextlib.contextmanager
def _getting_attributes_as_proxies() -> Iterator[None]:
    """``self.weight`` read while tracing is the tracer's proxy for it (a ``get_attr`` node), so that ops on
    parameters alone (``self.weight.t()``) are recorded, not computed once into a constant."""
    original = nn.Module.__getattr__

    def __getattr__(module, name):
        value = original(module, name)
        return value if _current is None else _current.getattr(name, value, {})

    nn.Module.__getattr__ = __getattr__   # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.__getattr__ = original   # type: ignore[method-assign]


@contextlib.contextmanager
def _recording_autograd_functions() -> Iterator[None]:
    """``MyFunction.apply(x)`` of a traced ``x`` records one call of ``MyFunction.apply``, which runs
    its forward and, in training, its own backward. (Left alone, fx would trace the ops of its
    forward and lose the backward.)"""
    original = torch.autograd.Function.__dict__["apply"]

    def apply(cls, *args, **kwargs):
        tracer = _current
        if tracer is None or not has_proxy(args, kwargs):
            return original.__get__(None, cls)(*args, **kwargs)
        applier = tracer.appliers.get(cls)
        if applier is None:
            def applier(*args, **kwargs):
                return cls.apply(*args, **kwargs)
            applier.__name__ = applier.__qualname__ = f"{cls.__name__}_apply"
            tracer.appliers[cls] = applier
        return tracer.create_proxy("call_function", applier, args, kwargs)

    torch.autograd.Function.apply = classmethod(apply)   # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.autograd.Function.apply = original   # type: ignore[method-assign]


@contextlib.contextmanager
def _refusing_traced_attributes() -> Iterator[None]:
    """``self.steps = self.steps + 1`` in ``forward`` would store a proxy in the model, which the model
    could not run with afterwards, and the trace would not replay the assignment on later calls: it
    is refused while tracing, naming the line, before the model is changed."""
    original = nn.Module.__setattr__

    def __setattr__(module, name, value):
        tracer = _current
        if tracer is not None and has_proxy((value,), {}):
            if _updated_in_place(tracer, module, name, value):
                return   # ``self.steps += 1`` on a buffer: the recorded ``iadd`` wrote it; eager stores it again
            own = _as_own_tensors(tracer, value)
            if own is not None:   # (nn.LSTM caching its weights, whose proxies are not the tensors it cached)
                original(module, name, own)
                return
            raise FrontendError(
                f"{type(module).__name__}.{name} is assigned a traced tensor at {tracer.user_line()}"
                "\ndynamo_relational.compile records tensor ops, not assignments to the model's attributes "
                f"(this one would happen once, while tracing). Update a buffer in place (self.{name} += 1, "
                f"self.{name}.copy_(...)), or use torch.compile(model, backend=\"relational\").")
        original(module, name, value)

    nn.Module.__setattr__ = __setattr__   # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.__setattr__ = original   # type: ignore[method-assign]


def _as_own_tensors(tracer: Tracer, value: Any) -> Any:
    """``value`` with each proxy in it replaced by the model's parameter or buffer that it reads as it is, or
    None if a proxy in it is some other traced value. A module that caches its own parameters (``nn.LSTM``'s
    ``_flat_weights``, rebuilt when they are not the tensors it cached) then stores what eager's call would."""
    leaves, spec = pytree.tree_flatten(value)
    own = []
    for leaf in leaves:
        if isinstance(leaf, fx.Proxy):
            leaf = _model_tensor(tracer.root, leaf.node)
            if leaf is None:
                return None
        own.append(leaf)
    return pytree.tree_unflatten(own, spec)


def _model_tensor(root: nn.Module, node: fx.Node) -> torch.Tensor | None:
    """The parameter or buffer of ``root`` that ``node`` reads, if it is a ``get_attr`` of one."""
    if node.op != "get_attr":
        return None
    *path, name = str(node.target).split(".")
    module: nn.Module | None = root
    for step in path:   # (through the modules' own tables: attribute reads would give proxies)
        module = module._modules.get(step) if module is not None else None
    if module is None:
        return None
    return module._parameters.get(name, module._buffers.get(name))


def _updated_in_place(tracer: Tracer, module: nn.Module, name: str, value: Any) -> bool:
    """Whether ``value`` is the result of an augmented assignment (``+=``) to buffer ``module.name``."""
    node = value.node if isinstance(value, fx.Proxy) else None
    if node is None or node.target not in IN_PLACE_TARGETS or name not in module._buffers:
        return False
    buffer = node.args[0]
    path = tracer.path_of_module(module)
    return isinstance(buffer, fx.Node) and buffer.op == "get_attr" and \
        buffer.target == (f"{path}.{name}" if path else name)
