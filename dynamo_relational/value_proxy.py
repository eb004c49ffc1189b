"""The proxies user code handles while tracing: each stands for a node whose value the tracer computed, so
static metadata (``x.shape``, ``x.dtype``, ``len(x)``) is answered from the value, and reading the values
themselves (``bool(t)``, ``int(t)``, ``t.item()``) is refused as data-dependent control flow. Augmented
assignments (``acc += t``) record the in-place operator, as Dynamo does."""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import torch
import torch.fx as fx

from .errors import GradStateRead

if TYPE_CHECKING:
    from .tracer import Tracer

#: what a tensor's shape, dtype and device answer (a traced value's static metadata)
STATIC_ATTRIBUTES = ("shape", "dtype", "device", "ndim", "layout", "is_cuda", "is_cpu", "is_sparse",
                     "is_quantized", "is_meta", "is_mkldnn", "is_nested")
STATIC_METHODS = ("size", "dim", "ndimension", "numel", "nelement", "element_size", "stride",
                  "is_floating_point", "is_complex", "is_signed", "is_contiguous", "get_device")
_VALUE_METHODS = ("item", "tolist", "numpy", "__array__", "data_ptr")
_IN_PLACE_OPERATORS = {"__iadd__": operator.iadd, "__isub__": operator.isub, "__imul__": operator.imul,
                       "__itruediv__": operator.itruediv, "__ifloordiv__": operator.ifloordiv,
                       "__imod__": operator.imod, "__ipow__": operator.ipow, "__imatmul__": operator.imatmul,
                       "__iand__": operator.iand, "__ior__": operator.ior, "__ixor__": operator.ixor,
                       "__ilshift__": operator.ilshift, "__irshift__": operator.irshift}
#: the augmented assignments that write a tensor in place (``@=`` makes a new tensor)
IN_PLACE_TARGETS = frozenset(target for name, target in _IN_PLACE_OPERATORS.items() if name != "__imatmul__")


class ValueProxy(fx.Proxy):
    """A proxy whose node carries a concrete value: static metadata is answered, values are refused."""

    tracer: Tracer

    @property
    def value(self) -> Any:
        return self.tracer.value_of(self.node)

    def __del__(self):
        # The last proxy of a node gone, user code can no longer reach its value: free it now
        # (most neuron values die within a layer), not when the trace ends.
        try:
            self.tracer.release(self.node)
        except Exception:   # a half-built proxy, or interpreter shutdown
            pass

    @classmethod
    def __torch_function__(cls, orig_method, types, args=None, kwargs=None):
        # fx's version looks for the tracer with a pytree walk over all arguments; ours is
        # the first proxy found (one level deep covers torch.stack([...]) and friends)
        args, kwargs = args or (), kwargs or {}
        tracer = next((a.tracer for a in proxies(args, kwargs.values())), None)
        if tracer is None or isinstance(orig_method, (torch._C.ScriptMethod, torch._ops.HigherOrderOperator)):
            return super().__torch_function__(orig_method, types, args, kwargs)
        return tracer.record(orig_method, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in _VALUE_METHODS:
            raise self.tracer.data_dependence_error(f"`.{name}()` reads a tensor's values", self.node)
        if name.startswith("__") or name in ("node", "tracer"):   # copy/pickle probing, half-built proxies
            raise AttributeError(name)
        if name in STATIC_ATTRIBUTES or name in STATIC_METHODS:
            return getattr(self.value, name)
        if name == "requires_grad":   # (the values are computed without gradients)
            raise GradStateRead(f"forward reads requires_grad at {self.tracer.user_line()}, which tracing cannot "
                                "answer: dynamo_relational.batch answers it in calls with gradients on; or use "
                                "torch.compile(model, backend=\"relational\").")
        if callable(getattr(self.value, name)):
            return fx.proxy.Attribute(self, name)          # a method: calling it records call_method
        return self.tracer.create_proxy("call_function", getattr, (self, name), {})

    def __len__(self) -> int:
        return len(self.value)

    def __iter__(self):
        return iter([self[i] for i in range(len(self.value))])

    def __setitem__(self, index, value) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, index, value), {})

    def __bool__(self) -> bool:
        raise self.tracer.data_dependence_error(f"`bool()` of traced value {self.node.name} (an `if`, "
                                                "`while`, `and`/`or`/`not` or comparison chain on a tensor)",
                                                self.node)

    def _to_python(self, kind: str):
        raise self.tracer.data_dependence_error(f"`{kind}()` of traced value {self.node.name}", self.node)

    __int__ = lambda self: self._to_python("int")            # noqa: E731
    __float__ = lambda self: self._to_python("float")        # noqa: E731
    __index__ = lambda self: self._to_python("index")        # noqa: E731  (range(t), list[t])
    __complex__ = lambda self: self._to_python("complex")    # noqa: E731
    __contains__ = lambda self, item: self._to_python("in")  # noqa: E731


def _in_place(target: Callable) -> Callable:
    def method(self, other):
        return self.tracer.create_proxy("call_function", target, (self, other), {})
    return method


for _name, _target in _IN_PLACE_OPERATORS.items():   # `acc += t` records operator.iadd, as Dynamo does
    setattr(ValueProxy, _name, _in_place(_target))


def proxies(*groups: Iterable[Any]) -> Iterator[ValueProxy]:
    """The proxies among the arguments in ``groups``, and in lists and tuples among them (one level deep)."""
    for group in groups:
        for a in group:
            if isinstance(a, ValueProxy):
                yield a
            elif type(a) in (list, tuple):
                yield from (b for b in a if isinstance(b, ValueProxy))


def has_proxy(args: tuple, kwargs: dict) -> bool:
    return next(proxies(args, kwargs.values()), None) is not None
