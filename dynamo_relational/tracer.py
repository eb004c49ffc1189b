"""The fast front-end's tracer: a ``torch.fx`` tracer that computes every node's value as it records the node.

How shapes are known during tracing: each node's value is computed by running its op eagerly (under
``no_grad``) on the values of its arguments, starting from copies of the example inputs, parameters and
buffers. (:mod:`~dynamo_relational.recorder` records a call with gradients as it runs instead.) For these tiny
per-neuron ops that costs a few microseconds, far less than meta tensors (300-500 us per op: their shape
functions are Python references) or fake tensors (about 300 us). The values never reach
Python control flow (:mod:`~dynamo_relational.value_proxy`, :mod:`~dynamo_relational.data_dependence`); they
give each node its shape, dtype and device (``meta["rel_info"]``, what the passes read) and are freed as soon
as user code drops the node's last proxy (most neuron values die within their layer), except those of inputs
and constants, which the passes compare. The innermost user frame of each node (and, where
that is torch's own code, the user's line that called it) is recorded as
``meta["stack_trace"]`` in Dynamo's format (the grouping's code-site hint).

Modules are traced through, not kept as leaves, so ``nn.Linear`` appears as ``F.linear`` and activations as
``torch.relu`` etc., which the grouping catalog understands; module hooks run as in eager. ``with
torch.no_grad():`` blocks are recorded as Dynamo records them; autocast inside ``forward`` is refused.
"""
from __future__ import annotations

import contextlib
import gc
import operator
import sys
import time
from dataclasses import fields, is_dataclass
from types import FrameType
from typing import Any, Callable, Iterator, Sequence

import numpy
import torch
import torch.fx as fx
from torch import nn
from torch.overrides import is_tensor_method_or_property
from torch.utils import _pytree as pytree

from .data_dependence import DataDependentOp, RejectDataDependentOps, needs_check, numbers_in_index
from .errors import DataDependenceError, FrontendError
from .forward_constants import changed_constant, tensor_version
from .nodes import new_node
from .ops.base import value_info
from .progress import NODE_STRIDE, NONE as NO_PROGRESS, CompileProgress
from .schemas import autocast_state
from .source_lines import code_site, format_frame, formatted_site, frames, traceback_frames, user_line
from .tracing_patches import tracing
from .trial_runs import cuda_devices
from .untraced_calls import RecordUntracedCalls, is_random, writes_untraced_tensor
from .value_proxy import ValueProxy

_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction
_is_grad_enabled = torch.is_grad_enabled
_is_autocast_enabled = torch._C._is_any_autocast_enabled
_CALLS_AND_OUTPUT = frozenset(("call_function", "call_method", "output"))
PLAIN_TYPES = frozenset([int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                         torch.memory_format])


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: tracing and grouping allocate many small objects
    per node, and the collections they trigger cost 25-30% of their time on large graphs."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_TENSOR_METHODS: dict[Any, bool] = {}
#: the tensor methods that the tensor operators call, recorded as the ``operator`` targets that fx's
#: proxies record for the operators: ``x + y`` reaches a torch function mode as ``TensorBase.add(x, y)``, and
#: the tracer so where ``x`` is a plain tensor and ``y`` a proxy; ``x == y`` as ``TensorBase.__eq__`` (``True & m``
#: as ``bitwise_and``, recorded so)
OPERATOR_METHODS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
                    "matmul": operator.matmul, "pow": operator.pow, "__getitem__": operator.getitem,
                    "remainder": operator.mod, "__floordiv__": operator.floordiv,
                    "__eq__": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
                    "gt": operator.gt, "ge": operator.ge, "__and__": operator.and_, "__or__": operator.or_,
                    "__xor__": operator.xor}


def _is_tensor_method(func: Callable) -> bool:
    """torch's ``is_tensor_method_or_property``, remembered per function (torch's enters a warnings context
    on every call: a few percent of tracing)."""
    try:
        return _TENSOR_METHODS[func]
    except KeyError:
        known = _TENSOR_METHODS[func] = is_tensor_method_or_property(func)
        return known
    except TypeError:   # an unhashable callable
        return is_tensor_method_or_property(func)


def shown_name(model: nn.Module) -> str:
    """The name that messages about ``model.forward`` give it (a batched sample's call: its model's)."""
    return getattr(model, "shown_as", type(model).__name__)


class Tracer(fx.Tracer):
    """Traces through every module; each node's value is computed as it is recorded."""

    def __init__(self, model: nn.Module, inputs: Sequence[torch.Tensor], input_names: Sequence[str],
                 progress: CompileProgress = NO_PROGRESS, record_random_ops: bool = False,
                 record_factories: bool = False):
        super().__init__()
        self.progress = progress
        #: record random ops, and tensor factories, called without a traced argument (:class:`RecordUntracedCalls`)
        self.record_random_ops, self.record_factories = record_random_ops, record_factories
        #: the user line of the first write of a traced value into a tensor not traced (writes_untraced_tensor)
        self.wrote_untraced: str | None = None
        #: the structure of ``forward``'s result, whose leaves the graph's output lists
        self.out_spec: pytree.TreeSpec | None = None
        self.nodes = 0
        self.model = model
        self.inputs = list(inputs)
        self.input_names = list(input_names)
        #: get_attr target -> tensor (parameters and buffers of the model, then constants)
        self.attrs: dict[str, torch.Tensor] = {}
        self._names: dict[int, str] = {}
        for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
            self._names.setdefault(id(t), name)
            self.attrs.setdefault(name, t)
        self._attr_nodes: dict[str, fx.Node] = {}
        self._attr_proxies: dict[str, fx.Proxy] = {}
        #: constants made here: (name, tensor, its version counter when a recorded op first read it)
        self._constants_read: list[tuple[str, torch.Tensor, int | None]] = []
        self._check = RejectDataDependentOps()
        #: custom autograd.Function subclass -> the function its recorded calls call (recording_autograd_functions)
        self.appliers: dict[type, Callable] = {}
        #: the frame of :meth:`trace`: user frames are the ones below it
        self._stop: FrameType | None = None
        self.value_seconds = 0.0
        #: values of call nodes while a proxy of the node lives: node -> [value, live proxies]
        self._values: dict[fx.Node, list] = {}
        #: the grad mode of the last recorded call (tracing starts with gradients on)
        self._grad_enabled = True
        #: the autocast regions around the trace: their casts are applied when compiling, as Dynamo does
        self._autocast = autocast_state()

    def trace(self, root, concrete_args=None) -> fx.Graph:
        self._stop = sys._getframe()
        try:
            recording = RecordUntracedCalls(self, self.record_random_ops, self.record_factories) \
                if self.record_random_ops or self.record_factories else contextlib.nullcontext()
            with gc_paused(), recording, tracing(self, root):
                return self._recorded(root)
        except FrontendError:
            raise
        except Exception as e:   # raised by user code (or code it calls) handed a proxy for a tensor
            if "Variable data has to be a tensor" in str(e):   # torch.autograd.Variable(t), which takes tensors only
                advice = ("torch.autograd.Variable(t) gives t back (detached) since PyTorch 0.4 and cannot take a "
                          "traced value: use t (or t.detach()) itself, or torch.compile(model, "
                          "backend=\"relational\").")
            else:
                advice = ("dynamo_relational.compile runs forward on torch.fx proxies: code that needs real tensors "
                          "(torch.func transforms, for one) cannot be traced; use torch.compile(model, "
                          "backend=\"relational\").")
            raise FrontendError(f"{type(e).__name__} while tracing {user_line(traceback_frames(e))}\n{e}\n"
                                f"{advice}") from e
        finally:
            self._stop = None
            self._values.clear()
            self._attr_proxies.clear()   # (they point back at the tracer: a cycle for the collector to find)

    def _recorded(self, root: nn.Module) -> fx.Graph:
        """What ``fx.Tracer.trace`` does for a module, but its patches (:func:`tracing` installs them): a graph of
        placeholders for the inputs, ``root``'s call on them, and an output node for its result."""
        self.root = root
        self.submodule_paths = {module: name for name, module in root.named_modules()}
        self.tensor_attrs = {}
        self.graph = fx.Graph(tracer_cls=type(self))
        try:
            fn, args = self.create_args_for_root(type(root).forward, True)
            self.create_node("output", "output", (self.create_arg(fn(*args)),), {})
        finally:
            self.submodule_paths = None
        return self.graph

    def value_of(self, node: fx.Node) -> Any:
        """The traced value of ``node`` (inputs and constants keep theirs in ``meta["example_value"]``)."""
        if node.op in ("placeholder", "get_attr"):
            return node.meta["example_value"]
        return self._values[node][0]

    def record(self, func: Callable, args: tuple, kwargs: dict) -> fx.Proxy:
        """A proxy for the call ``func(*args, **kwargs)`` of a torch function or tensor method."""
        if self.wrote_untraced is None and writes_untraced_tensor(func, args):
            self.wrote_untraced = self.user_line()
        if _is_tensor_method(func):
            if len(args) == 2 and not kwargs and func.__name__ in OPERATOR_METHODS:
                return self.create_proxy("call_function", OPERATOR_METHODS[func.__name__], args, kwargs)
            return self.create_proxy("call_method", func.__name__, args, kwargs)
        return self.create_proxy("call_function", func, args, kwargs)

    def release(self, node: fx.Node) -> None:
        live = self._values.get(node)
        if live is not None:
            live[1] -= 1
            if live[1] <= 0:
                del self._values[node]

    # Inputs: one placeholder per example input; the model is called as in eager (defaults, hooks).
    def create_args_for_root(self, root_fn, is_module, concrete_args=None):
        proxies = [self.create_proxy("placeholder", name, (), {}) for name in self.input_names]
        return (lambda *args: self._checked_outputs(self.model(*args))), proxies

    def proxy(self, node: fx.Node) -> fx.Proxy:
        live = self._values.get(node)
        if live is not None:
            live[1] += 1
        return ValueProxy(node, self)

    # Parameters and buffers read as module attributes become (shared) get_attr nodes.
    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict) -> Any:
        if not isinstance(attr_val, torch.Tensor):
            return attr_val
        name = self._attr_name(attr_val)
        proxy = self._attr_proxies.get(name)
        if proxy is None:
            proxy = self._attr_proxies[name] = self.proxy(self.create_node("get_attr", name, (), {}))
        return proxy

    def create_arg(self, a: Any) -> Any:
        kind = type(a)   # fast paths for the common argument types; fx's generic path is slow
        if kind is ValueProxy:
            return a.node
        if kind in PLAIN_TYPES:
            return a
        if kind is list:
            return [self.create_arg(x) for x in a]
        if kind is tuple:
            return tuple([self.create_arg(x) for x in a])
        if kind is dict and all(type(k) is str for k in a):
            return {k: self.create_arg(v) for k, v in a.items()}
        if kind is slice:   # (rows and columns of a neuron's vector: iou[:hidden])
            return slice(self.create_arg(a.start), self.create_arg(a.stop), self.create_arg(a.step))
        if isinstance(a, torch.Tensor):   # a parameter, buffer or constant tensor
            return self.create_node("get_attr", self._attr_name(a), (), {})
        if isinstance(a, (numpy.integer, numpy.floating)):
            return a.item()   # structure read from numpy arrays: eager treats their scalars as Python numbers
        if isinstance(a, numpy.ndarray):   # eager converts it to a tensor of its dtype (an index, a constant)
            return self.create_arg(torch.from_numpy(a.copy()))
        return super().create_arg(a)

    def _attr_name(self, t: torch.Tensor) -> str:
        name = self._names.get(id(t))
        if name is None:   # a tensor made in forward or held by plain Python: a constant of the graph
            name = f"_tensor_constant{len(self.attrs)}"
            self._names[id(t)] = name
            self.attrs[name] = t
            self._constants_read.append((name, t, tensor_version(t)))
        return name

    def changed_constant(self, held: set[int]) -> str | None:
        """A constant's name, if a call without a traced argument wrote into its tensor after a recorded op read
        it (``t = torch.zeros(3); a = h * t; t.add_(1)``): the graph would read the written value everywhere.
        Tensors the model holds (``held`` by id) are left to the check of changes to the model."""
        return changed_constant(self._constants_read, held)

    def create_proxy(self, kind, target, args, kwargs, *rest, **more):
        if target is operator.getitem and len(args) == 2:   # (x[u], fx's Proxy.__getitem__)
            args = (args[0], numbers_in_index(args[1], lambda t: isinstance(t, fx.Proxy)))
        return super().create_proxy(kind, target, args, kwargs, *rest, **more)

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None) -> fx.Node:
        if kind == "get_attr" and target in self._attr_nodes:
            return self._attr_nodes[target]
        if kind in _CALLS_AND_OUTPUT and (_is_grad_enabled() is not self._grad_enabled or (
                _is_autocast_enabled() if self._autocast is None else autocast_state() != self._autocast)):
            self._record_modes()
        # (Not fx's TracerBase.create_node: its module scopes, preserved metadata and stack traces are not used.)
        node = new_node(self.graph, kind, target, args, kwargs, name, type_expr)
        if kind == "get_attr":
            self._attr_nodes[target] = node
        if kind == "output":
            return node
        self.nodes += 1
        if self.nodes % NODE_STRIDE == 0:
            self.progress.traced(self.nodes)
        start = time.perf_counter()
        if self.record_random_ops or self.record_factories:
            with _NO_TORCH_FUNCTION():   # computing a value records nothing (see RecordUntracedCalls)
                self._store_value(node, kind)
        else:
            self._store_value(node, kind)
        self.value_seconds += time.perf_counter() - start
        if kind in ("call_function", "call_method"):
            node.meta["stack_trace"] = self._stack_trace()
        return node

    def _store_value(self, node: fx.Node, kind: str) -> None:
        value = self._value(node)
        if kind in ("placeholder", "get_attr"):
            node.meta["example_value"] = value
        else:   # the passes read the shape; the value lives while user code holds a proxy of the node
            node.meta["rel_info"] = value_info(value)
            self._values[node] = [value, 0]

    def _record_modes(self) -> None:
        """Record where user code switched gradients on or off (``with torch.no_grad():``) as Dynamo
        does, ``torch._C._set_grad_enabled(mode)`` where the mode changes (the ``mode_regions`` pass
        reads them); refuse autocast entered or left in ``forward``, which this tracer cannot record.
        (``create_node`` calls it only where either may have changed.)"""
        grad = torch.is_grad_enabled()
        if grad is not self._grad_enabled:
            self.graph.create_node("call_function", torch._C._set_grad_enabled, (grad,), {})
            self._grad_enabled = grad
        if autocast_state() != self._autocast:
            raise FrontendError(f"autocast at {self.user_line()}\ndynamo_relational.compile does not "
                                "record autocast: cast explicitly (x.to(torch.bfloat16)), or use "
                                "torch.compile(model, backend=\"relational\").")

    def _value(self, node: fx.Node) -> Any:
        target: Any = node.target   # a name, but for call_function nodes
        if node.op == "placeholder":
            value = self.inputs[self.input_names.index(target)]
            return value.detach().clone()
        if node.op == "get_attr":
            return self.attrs[target].detach().clone()
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), self.value_of)
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)   # (the context manager costs more than the op)
        try:
            if node.op == "call_method":
                fn, args = getattr(args[0], target), args[1:]
            else:
                fn = target
            if is_random(node, self.appliers.values()):   # no draw from the generators (see untraced_calls)
                with torch.random.fork_rng(devices=cuda_devices()), self._check:
                    return fn(*args, **kwargs)
            if not needs_check(node):
                return fn(*args, **kwargs)
            with self._check:
                return fn(*args, **kwargs)
        except DataDependentOp as e:
            raise self.data_dependence_error(f"{e} has a value-dependent output or output shape", node) from None
        except Exception as e:
            raise FrontendError(f"{type(e).__name__} while tracing {self.user_line()}\n{e}") from e
        finally:
            torch._C._set_grad_enabled(grad)

    def _checked_outputs(self, outputs: Any) -> tuple:
        """``forward``'s result as a flat tuple of its leaves, checked while its proxies (and so their values)
        are alive; its structure goes to :attr:`out_spec`. (Flattened here, fx never sees the containers: it
        would make its own immutable lists and dicts of them, and a node constructing each namedtuple.)"""
        leaves, self.out_spec = pytree.tree_flatten(outputs)
        name = shown_name(self.model)
        for leaf in leaves:
            if isinstance(leaf, ValueProxy) and not isinstance(leaf.value, torch.Tensor):
                raise FrontendError(f"{name}.forward returns {leaf.node.name} (a "
                                    f"{type(leaf.value).__name__}); outputs must be tensors, or tuples, "
                                    "namedtuples, lists and dicts of tensors and Python constants")
            if is_dataclass(leaf) and any(isinstance(getattr(leaf, f.name, None), fx.Proxy) for f in fields(leaf)):
                raise FrontendError(
                    f"{name}.forward returns a {type(leaf).__name__} holding tensors, a "
                    "dataclass that torch.utils._pytree does not know: register it "
                    f"(torch.utils._pytree.register_dataclass({type(leaf).__name__})), or return a tuple, "
                    "namedtuple or dict")
        return tuple(leaves)

    def _stack_trace(self) -> str:
        """The innermost user frame (:func:`code_site`), in Dynamo's ``stack_trace`` format."""
        return formatted_site(code_site(self._stop))

    def user_line(self) -> str:
        """``file:line in function: code`` of the user code running now (for error messages)."""
        return user_line(frames(self._stop))

    def data_dependence_error(self, what: str, read: fx.Node) -> DataDependenceError:
        """The error for user code that reads the value of ``read`` (or runs an op of value-dependent shape)."""
        user_frames = frames(self._stop)
        stack = "".join(format_frame(*f) for f in reversed(user_frames))
        return DataDependenceError(user_line(user_frames), what, inputs_of(read), stack)


def inputs_of(node: fx.Node) -> tuple[str, ...]:
    """The names of the placeholders that ``node`` is computed from."""
    found, seen, todo = [], {node}, [node]
    while todo:
        current = todo.pop()
        if current.op == "placeholder":
            found.append(str(current.target))
        for operand in current.all_input_nodes:
            if operand not in seen:
                seen.add(operand)
                todo.append(operand)
    return tuple(found)
