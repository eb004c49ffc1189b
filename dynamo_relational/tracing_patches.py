"""Process-wide patches in effect while the tracer runs ``forward``, as fx patches the functions it wraps:
``torch.autograd.Function.apply`` records a custom Function's call as one node (keeping its backward), and
``nn.Module.__setattr__`` refuses storing a traced tensor in the model. (The random functions' patch, which
refuses ``generator=``, is :func:`dynamo_relational.untraced_calls.refusing_own_generators`.)"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator

import torch
import torch.fx as fx
from torch import nn

from .errors import FrontendError
from .value_proxy import IN_PLACE_TARGETS, has_proxy

if TYPE_CHECKING:
    from .tracer import Tracer


@contextlib.contextmanager
def recording_autograd_functions(tracer: Tracer) -> Iterator[None]:
    """``MyFunction.apply(x)`` of a traced ``x`` records one call of ``MyFunction.apply``, which runs
    its forward and, in training, its own backward. (Left alone, fx would trace the ops of its
    forward and lose the backward.)"""
    original = torch.autograd.Function.__dict__["apply"]

    def apply(cls, *args, **kwargs):
        if not has_proxy(args, kwargs):
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
def refusing_traced_attributes(tracer: Tracer) -> Iterator[None]:
    """``self.steps = self.steps + 1`` in ``forward`` would store a proxy in the model, which the model
    could not run with afterwards, and the trace would not replay the assignment on later calls: it
    is refused while tracing, naming the line, before the model is changed."""
    original = nn.Module.__setattr__

    def __setattr__(module, name, value):
        if _updated_in_place(tracer, module, name, value):
            return   # ``self.steps += 1`` on a buffer: the recorded ``iadd`` wrote it; eager stores it again
        if has_proxy((value,), {}):
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


def _updated_in_place(tracer: Tracer, module: nn.Module, name: str, value: Any) -> bool:
    """Whether ``value`` is the result of an augmented assignment (``+=``) to buffer ``module.name``."""
    node = value.node if isinstance(value, fx.Proxy) else None
    if node is None or node.target not in IN_PLACE_TARGETS or name not in module._buffers:
        return False
    buffer = node.args[0]
    path = tracer.path_of_module(module)
    return isinstance(buffer, fx.Node) and buffer.op == "get_attr" and \
        buffer.target == (f"{path}.{name}" if path else name)
