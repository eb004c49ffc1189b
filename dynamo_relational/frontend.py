"""The fast front-end: ``dynamo_relational.compile(model, example_inputs, **options)``.

TorchDynamo costs about 1.2 ms per FX node, minutes for a scalar-granular
model of tens of thousands of neurons. This front-end traces the model with
a ``torch.fx`` tracer instead (about 80 us of CPU per node), runs the same
grouping passes and the same Inductor handoff as ``backend="relational"``
(:func:`dynamo_relational.backend.group_graph`) and returns a module that is
called like the model, for inference and for training (gradients reach the
model's own parameters).

Contract (what makes the fast trace exact):

* **Structure comes from Python data.** Loops, lists and ``if`` statements
  over Python values (neighbour lists, rules, trees) run once, at compile
  time; their result is frozen into the graph. Changing that data later does
  not change the compiled graph: compile again. Numpy scalars and arrays count as
  Python data (numbers and constant tensors), and so do tensors and scalars held
  in plain attributes; replacing or changing one of those traces again on the
  next call.
* **No data-dependent control flow on tensor values.** ``bool(t)``,
  ``if x[v] > 0``, ``int(t)``, ``t.item()``, ``t.tolist()`` and ops whose
  output shape depends on values (``nonzero``, boolean masks, ``unique``)
  raise :class:`FrontendError` naming the source line. Use ``torch.where``
  and friends, or ``torch.compile(model, backend="relational")``.
* **Gradient modes.** ``with torch.no_grad():`` blocks are recorded (as
  Dynamo records them) and become ``detach()`` in the grouped graph; the
  trace runs with gradients on, so one graph serves calls with and without
  them. Autocast is not recorded: a :class:`FrontendError`.
* **Custom autograd Functions keep their backward**: ``MyFunction.apply(h)``
  is recorded as one call (fx would trace its forward's ops instead).
* **Random ops draw new numbers on every call**, also without a traced
  argument (``torch.randn(4)``), where fx would freeze the numbers drawn
  while tracing into the graph: a trace that drew numbers outside the graph
  is redone with :class:`_RecordRandomOps`, which records such ops. Only the
  default generators are recorded (``generator=`` is an error).
* **Static shapes.** ``x.shape``, ``x.dim()``, ``len(x)``, ``x.dtype`` and
  ``x.device`` are the example inputs' values; the compiled module accepts
  only inputs of the example inputs' shapes, dtypes and devices.

How shapes are known during tracing: every node's value is computed as the
node is recorded, by running its op eagerly (under ``no_grad``) on the values
of its arguments, starting from copies of the example inputs, parameters and
buffers. For these tiny per-neuron ops that costs a few microseconds, far
less than meta tensors (300-500 us per op: their shape functions are Python
references) or fake tensors (about 300 us). The values never reach Python
control flow (see the contract); they give each node its shape, dtype and
device (``meta["rel_info"]``, what the passes read) and are freed as soon as
user code drops the node's last proxy (most neuron values die within their
layer), except those of inputs and constants, which the passes compare. The
innermost user frame of each node is recorded as ``meta["stack_trace"]`` in
Dynamo's format (the grouping's code-site hint).

Modules are traced through, not kept as leaves, so ``nn.Linear`` appears as
``F.linear`` and activations as ``torch.relu`` etc., which the grouping
catalog understands. Forward hooks and pre-hooks of modules run as in eager (registering or
removing one after compiling traces again); module backward hooks and global module hooks are a
:class:`FrontendError` (see :func:`_refuse_unrecorded_hooks`). Inside ``torch.func`` transforms
the model runs eagerly.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import linecache
import logging
import operator
import os
import sys
import time
import traceback
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Sequence

import numpy
import torch
import torch.fx as fx
from torch import nn
from torch.nn.modules import module as _nn_module
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.overrides import TorchFunctionMode, is_tensor_method_or_property
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .backend import group_graph
from .errors import RelationalError
from .model_state import HeldAttributes, PlainObjects, computed_at
from .ops import tensor_info
from .ops.base import value_info
from .options import Options
from .progress import NODE_STRIDE, NONE as NO_PROGRESS, CompileProgress, compile_progress
from .report import GraphReport, Report
from .schemas import autocast_state, compile_grouped
from .trial_runs import cuda_devices

log = logging.getLogger("dynamo_relational")

__all__ = ["compile", "RelationalModule", "FrontendError"]


class FrontendError(RelationalError):
    """The fast front-end cannot trace or run a model; the message names the source line or argument."""


# --------------------------------------------------------------------------- user source lines

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
#: frames of the tracing machinery itself, never shown as user code
_INTERNAL = (os.path.join(_TORCH_DIR, "fx") + os.sep, os.path.join(_TORCH_DIR, "overrides.py"),
             os.path.join(_TORCH_DIR, "nn", "modules", "module.py"), os.path.abspath(__file__))


_internal_code: dict[Any, bool] = {}


def _is_internal(code) -> bool:
    internal = _internal_code.get(code)
    if internal is None:
        internal = _internal_code[code] = code.co_filename.startswith(_INTERNAL)
    return internal


def _frames(stop) -> list[tuple[Any, int]]:
    """(code, line) of the user frames between the tracer's ``trace`` call and here, innermost first."""
    out = []
    frame = sys._getframe(1)
    while frame is not None and frame is not stop:
        if not _is_internal(frame.f_code):
            out.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return out


def _innermost_frame(stop) -> tuple[Any, int] | None:
    frame = sys._getframe(1)
    while frame is not None and frame is not stop:
        if not _is_internal(frame.f_code):
            return frame.f_code, frame.f_lineno
        frame = frame.f_back
    return None


def _traceback_frames(error: BaseException) -> list[tuple[Any, int]]:
    """(code, line) of the user frames an exception passed through, innermost first."""
    frames = [(frame.f_code, line) for frame, line in traceback.walk_tb(error.__traceback__)]
    return [f for f in reversed(frames) if not _is_internal(f[0])]


def _format_frame(code, line: int) -> str:
    text = linecache.getline(code.co_filename, line).strip()
    return f'  File "{code.co_filename}", line {line}, in {code.co_name}\n    {text}\n'


def _user_line(frames) -> str:
    """``file:line: code`` of the innermost frame outside torch (the user's line)."""
    user = [f for f in frames if not f[0].co_filename.startswith(_TORCH_DIR)] or list(frames)
    if not user:
        return "<unknown source line>"
    code, line = user[0]
    return f"{code.co_filename}:{line} in {code.co_name}: {linecache.getline(code.co_filename, line).strip()}"


# --------------------------------------------------------------------------- data dependence

_DATA_DEPENDENT = torch.Tag.data_dependent_output
_DYNAMIC_SHAPE = torch.Tag.dynamic_output_shape


def _static_despite_tag(func, args, kwargs) -> bool:
    """Ops tagged dynamic_output_shape whose output shape is static for these arguments."""
    if func is torch.ops.aten.index.Tensor:   # integer (not boolean) index tensors
        return all(i is None or i.dtype not in (torch.bool, torch.uint8) for i in args[1])
    if func is torch.ops.aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is not None
    if func is torch.ops.aten.one_hot.default:
        return (args[1] if len(args) > 1 else kwargs.get("num_classes", -1)) >= 0
    return False


#: call_function / call_method targets whose output shape never depends on tensor values (the
#: hot per-neuron ops); every other op runs under :class:`_RejectDataDependentOps`
_SHAPE_STATIC = frozenset([
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.matmul, operator.pow,
    torch.add, torch.sub, torch.mul, torch.div, torch.matmul, torch.mm, torch.mv, torch.dot, torch.nn.functional.linear,
    torch.relu, torch.sigmoid, torch.tanh, torch.exp, torch.log, torch.stack, torch.cat, torch.sum, torch.mean,
    torch.squeeze, torch.unsqueeze, torch.reshape, torch.flatten, torch.nn.functional.relu, torch.nn.functional.sigmoid,
    torch.nn.functional.tanh,
    "add", "sub", "mul", "div", "matmul", "relu", "sigmoid", "tanh", "exp", "log", "sum", "mean", "squeeze",
    "unsqueeze", "view", "reshape", "flatten", "t", "transpose",
])


_TENSOR_METHODS: dict[Any, bool] = {}


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


def _needs_check(node: fx.Node) -> bool:
    """Whether computing ``node`` may run an op with a value-dependent output (shape)."""
    if node.target is operator.getitem:   # only tensor indices (boolean masks) can be
        return any(isinstance(a, fx.Node) for a in pytree.tree_leaves(node.args[1:]))
    try:
        return node.target not in _SHAPE_STATIC
    except TypeError:   # unhashable target
        return True


class _DataDependentOp(Exception):
    pass


class _RejectDataDependentOps(TorchDispatchMode):
    """Raises on ATen ops whose output, or output shape, depends on tensor values."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tags = func.tags
        if _DATA_DEPENDENT in tags or (_DYNAMIC_SHAPE in tags and not _static_despite_tag(func, args, kwargs)):
            raise _DataDependentOp(str(func))
        return func(*args, **kwargs)


# --------------------------------------------------------------------------- tracing

_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction
_is_grad_enabled = torch.is_grad_enabled
_is_autocast_enabled = torch._C._is_any_autocast_enabled
_CALLS_AND_OUTPUT = frozenset(("call_function", "call_method", "output"))


@contextlib.contextmanager
def gc_paused():
    """Pause Python's cyclic garbage collector: tracing and grouping allocate many small objects
    per node, and the collections they trigger cost 25-30% of their time on large graphs."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_STATIC_ATTRIBUTES = ("shape", "dtype", "device", "ndim", "layout", "is_cuda", "is_cpu", "is_sparse",
                      "is_quantized", "is_meta", "is_mkldnn", "is_nested")
_STATIC_METHODS = ("size", "dim", "ndimension", "numel", "nelement", "element_size", "stride",
                   "is_floating_point", "is_complex", "is_signed", "is_contiguous", "get_device")
_VALUE_METHODS = ("item", "tolist", "numpy", "__array__", "data_ptr")
_IN_PLACE_OPERATORS = {"__iadd__": operator.iadd, "__isub__": operator.isub, "__imul__": operator.imul,
                       "__itruediv__": operator.itruediv, "__ifloordiv__": operator.ifloordiv,
                       "__imod__": operator.imod, "__ipow__": operator.ipow, "__imatmul__": operator.imatmul,
                       "__iand__": operator.iand, "__ior__": operator.ior, "__ixor__": operator.ixor,
                       "__ilshift__": operator.ilshift, "__irshift__": operator.irshift}
#: the augmented assignments that write a tensor in place (``@=`` makes a new tensor)
_IN_PLACE_TARGETS = frozenset(target for name, target in _IN_PLACE_OPERATORS.items() if name != "__imatmul__")
_PLAIN_TYPES = frozenset([int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                          torch.memory_format])


class _ValueProxy(fx.Proxy):
    """A proxy whose node carries a concrete value: static metadata is answered, values are refused."""

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
        tracer = next((a.tracer for a in _proxies(args, kwargs.values())), None)
        if tracer is None or isinstance(orig_method, (torch._C.ScriptMethod, torch._ops.HigherOrderOperator)):
            return super().__torch_function__(orig_method, types, args, kwargs)
        return tracer.record(orig_method, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in _VALUE_METHODS:
            raise self.tracer.data_dependence_error(f"`.{name}()` reads a tensor's values")
        if name.startswith("__") or name in ("node", "tracer"):   # copy/pickle probing, half-built proxies
            raise AttributeError(name)
        if name in _STATIC_ATTRIBUTES or name in _STATIC_METHODS:
            return getattr(self.value, name)
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
                                                "`while`, `and`/`or`/`not` or comparison chain on a tensor)")

    def _to_python(self, kind: str):
        raise self.tracer.data_dependence_error(f"`{kind}()` of traced value {self.node.name}")

    __int__ = lambda self: self._to_python("int")            # noqa: E731
    __float__ = lambda self: self._to_python("float")        # noqa: E731
    __index__ = lambda self: self._to_python("index")        # noqa: E731  (range(t), list[t])
    __complex__ = lambda self: self._to_python("complex")    # noqa: E731
    __contains__ = lambda self, item: self._to_python("in")  # noqa: E731


def _proxies(*groups):
    for group in groups:
        for a in group:
            if isinstance(a, _ValueProxy):
                yield a
            elif type(a) in (list, tuple):
                yield from (b for b in a if isinstance(b, _ValueProxy))


@functools.cache
def _random_ops() -> frozenset[str]:
    """Names of the ops that draw random numbers: ATen ops tagged ``nondeterministic_seeded``
    (``randn``, ``rand_like``, ``bernoulli``, ``dropout``, ``normal_``, ``random_``, ...), and the
    dropout variants of ``torch.nn.functional``, which reach ATen under other names. Found once per
    process, on the first trace (looking at every ATen op takes about 0.3 s)."""
    names = {"dropout1d", "dropout2d", "dropout3d"}
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, name = qualified.partition("::")
        name = name.split(".")[0]
        if namespace != "aten" or name in names:
            continue
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and any(torch.Tag.nondeterministic_seeded in getattr(packet, overload).tags
                                      for overload in packet.overloads()):
            names.add(name)
    return frozenset(names)


def _is_random(node: fx.Node, appliers) -> bool:
    """Whether computing ``node`` may draw random numbers: a random op, or a custom autograd Function."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", None)
    return name in _random_ops() or node.target in appliers


def _generator_states() -> list[torch.Tensor]:
    """The states of the default generators (CPU, and each CUDA device once CUDA is in use)."""
    states = [torch.random.get_rng_state()]
    if torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return states


def _set_generator_states(states: list[torch.Tensor]) -> None:
    torch.random.set_rng_state(states[0])
    if len(states) > 1:
        torch.cuda.set_rng_state_all(states[1:])


def _refusing_generators(function: Callable, name: str, tracer: "_Tracer") -> Callable:
    @functools.wraps(function)
    def refusing(*args, **kwargs):
        if kwargs.get("generator") is not None:
            raise FrontendError(f"random op `{name}` with an explicit torch.Generator at "
                                f"{_user_line(_frames(tracer._stop))}\ndynamo_relational.compile records random "
                                "ops on the default generator only: drop the generator, or use "
                                "torch.compile(model, backend=\"relational\").")
        return function(*args, **kwargs)
    return refusing


class _RecordUntracedCalls(TorchFunctionMode):
    """Records calls without a traced argument that fx would run once while tracing and freeze into
    the graph as a constant: random ops (``torch.randn(4)``, ``torch.bernoulli(p)`` of a constant
    ``p``), which then draw new numbers on every call, and (``factories``) tensor factories
    (``torch.zeros(n, d)``), whose tensors are then new on every call and traced when code writes
    into them. Every other call runs as is (calls with traced arguments reach
    :meth:`_ValueProxy.__torch_function__`)."""

    def __init__(self, tracer: "_Tracer", random: bool, factories: bool):
        super().__init__()
        self.tracer = tracer
        self.names = (_random_ops() if random else frozenset()) | (_FACTORY_NAMES if factories else frozenset())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in self.names and not _has_proxy(args, kwargs):
            return self.tracer.record(func, args, kwargs)
        return func(*args, **kwargs)


#: tensor factories of ``torch`` (called without a traced argument: see :class:`_RecordUntracedCalls`)
_FACTORY_NAMES = frozenset(("zeros", "ones", "full", "empty", "tensor", "as_tensor", "arange", "eye", "linspace",
                            "logspace", "zeros_like", "ones_like", "full_like", "empty_like", "empty_strided"))
#: in-place ops that Python's augmented assignment calls: ``acc += t`` rebinds ``acc`` to the op's result
_AUGMENTED = frozenset(("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__", "__imatmul__",
                        "__ifloordiv__", "__imod__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"))


def _writes_untraced_tensor(func: Callable, args: tuple) -> bool:
    """Whether ``func(*args)``, a call with a traced argument, writes into a tensor that is not traced
    (``out[v] = h``, ``out.add_(h)`` for an ``out`` made from Python values): code reading that tensor
    later runs on its traced value, which the write did not change. Augmented assignment (``acc += h``)
    rebinds the name to the traced result, so later code reads that."""
    if not args or not isinstance(args[0], torch.Tensor) or isinstance(args[0], fx.Proxy):
        return False
    name = getattr(func, "__name__", "")
    return name == "__setitem__" or (name.endswith("_") and not name.endswith("__") and name not in _AUGMENTED)


def _has_proxy(args: tuple, kwargs: dict) -> bool:
    return next(_proxies(args, kwargs.values()), None) is not None


def _in_place(target):
    def method(self, other):
        return self.tracer.create_proxy("call_function", target, (self, other), {})
    return method


for _name, _target in _IN_PLACE_OPERATORS.items():   # `acc += t` records operator.iadd, as Dynamo does
    setattr(_ValueProxy, _name, _in_place(_target))


class _Tracer(fx.Tracer):
    """Traces through every module; each node's value is computed as it is recorded."""

    def __init__(self, model: nn.Module, inputs: Sequence[torch.Tensor], input_names: Sequence[str],
                 progress: CompileProgress = NO_PROGRESS, record_random_ops: bool = False,
                 record_factories: bool = False):
        super().__init__()
        self.progress = progress
        #: record random ops, and tensor factories, called without a traced argument (:class:`_RecordUntracedCalls`)
        self.record_random_ops, self.record_factories = record_random_ops, record_factories
        #: the user line of the first write of a traced value into a tensor not traced (_writes_untraced_tensor)
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
        self._stack_traces: dict[Any, str] = {}
        self._target_names: dict[Any, str] = {}
        self._check = _RejectDataDependentOps()
        #: custom autograd.Function subclass -> the function its recorded calls call (see below)
        self._appliers: dict[type, Callable] = {}
        self._stop = None
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
            recording = _RecordUntracedCalls(self, self.record_random_ops, self.record_factories) \
                if self.record_random_ops or self.record_factories else contextlib.nullcontext()
            with gc_paused(), recording, self._recording_autograd_functions(), self._refusing_own_generators(), \
                    self._refusing_traced_attributes():
                return super().trace(root, concrete_args)
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
            raise FrontendError(f"{type(e).__name__} while tracing {_user_line(_traceback_frames(e))}\n{e}\n"
                                f"{advice}") from e
        finally:
            self._stop = None
            self._values.clear()

    @contextlib.contextmanager
    def _recording_autograd_functions(self):
        """``MyFunction.apply(x)`` of a traced ``x`` records one call of ``MyFunction.apply``, which runs
        its forward and, in training, its own backward. (Left alone, fx would trace the ops of its
        forward and lose the backward.) ``Function.apply`` is patched while tracing, as fx patches
        the functions it wraps."""
        original = torch.autograd.Function.__dict__["apply"]
        tracer = self

        def apply(cls, *args, **kwargs):
            if not _has_proxy(args, kwargs):
                return original.__get__(None, cls)(*args, **kwargs)
            applier = tracer._appliers.get(cls)
            if applier is None:
                def applier(*args, **kwargs):
                    return cls.apply(*args, **kwargs)
                applier.__name__ = applier.__qualname__ = f"{cls.__name__}_apply"
                tracer._appliers[cls] = applier
            return tracer.create_proxy("call_function", applier, args, kwargs)

        torch.autograd.Function.apply = classmethod(apply)
        try:
            yield
        finally:
            torch.autograd.Function.apply = original

    @contextlib.contextmanager
    def _refusing_traced_attributes(self):
        """``self.steps = self.steps + 1`` in ``forward`` would store a proxy in the model, which the model
        could not run with afterwards, and the trace would not replay the assignment on later calls: it
        is refused while tracing, naming the line, before the model is changed. (``nn.Module.__setattr__``
        is patched while tracing, process-wide, as for the random functions below.)"""
        original = nn.Module.__setattr__
        tracer = self

        def __setattr__(module, name, value):
            if tracer._updated_in_place(module, name, value):
                return   # ``self.steps += 1`` on a buffer: the recorded ``iadd`` wrote it; eager stores it again
            if _has_proxy((value,), {}):
                raise FrontendError(
                    f"{type(module).__name__}.{name} is assigned a traced tensor at {_user_line(_frames(tracer._stop))}"
                    "\ndynamo_relational.compile records tensor ops, not assignments to the model's attributes "
                    f"(this one would happen once, while tracing). Update a buffer in place (self.{name} += 1, "
                    f"self.{name}.copy_(...)), or use torch.compile(model, backend=\"relational\").")
            original(module, name, value)

        nn.Module.__setattr__ = __setattr__
        try:
            yield
        finally:
            nn.Module.__setattr__ = original

    def _updated_in_place(self, module: nn.Module, name: str, value: Any) -> bool:
        """Whether ``value`` is the result of an augmented assignment (``+=``) to buffer ``module.name``."""
        node = value.node if isinstance(value, fx.Proxy) else None
        if node is None or node.target not in _IN_PLACE_TARGETS or name not in module._buffers:
            return False
        buffer = node.args[0]
        path = self.path_of_module(module)
        return isinstance(buffer, fx.Node) and buffer.op == "get_attr" and \
            buffer.target == (f"{path}.{name}" if path else name)

    @contextlib.contextmanager
    def _refusing_own_generators(self):
        """A random op given its own ``generator=`` draws from a generator this tracer does not watch
        (see :func:`_trace_and_group`): the random functions of ``torch`` and ``torch.Tensor`` refuse
        it while tracing, naming the line, instead of letting its numbers be frozen. (The patch is
        process-wide: another thread passing ``generator=`` during a trace is refused too.)"""
        patched = []
        for namespace in (torch, torch.Tensor):
            for name in _random_ops():
                original = getattr(namespace, name, None)
                if callable(original):
                    patched.append((namespace, name, namespace.__dict__.get(name)))
                    setattr(namespace, name, _refusing_generators(original, name, self))
        try:
            yield
        finally:
            for namespace, name, own in patched:
                if own is None:   # inherited (tensor methods live on torch._C.TensorBase)
                    delattr(namespace, name)
                else:
                    setattr(namespace, name, own)

    def value_of(self, node: fx.Node) -> Any:
        """The traced value of ``node`` (inputs and constants keep theirs in ``meta["example_value"]``)."""
        if node.op in ("placeholder", "get_attr"):
            return node.meta["example_value"]
        return self._values[node][0]

    def record(self, func: Callable, args: tuple, kwargs: dict) -> fx.Proxy:
        """A proxy for the call ``func(*args, **kwargs)`` of a torch function or tensor method."""
        if self.wrote_untraced is None and _writes_untraced_tensor(func, args):
            self.wrote_untraced = _user_line(_frames(self._stop))
        if _is_tensor_method(func):
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

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return False

    def call_module(self, m: nn.Module, forward: Callable, args: tuple, kwargs: dict) -> Any:
        return forward(*args, **kwargs)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        live = self._values.get(node)
        if live is not None:
            live[1] += 1
        return _ValueProxy(node, self)

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
        if kind is _ValueProxy:
            return a.node
        if kind in _PLAIN_TYPES:
            return a
        if kind is list:
            return [self.create_arg(x) for x in a]
        if kind is tuple:
            return tuple(self.create_arg(x) for x in a)
        if kind is dict and all(type(k) is str for k in a):
            return {k: self.create_arg(v) for k, v in a.items()}
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
        return name

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None) -> fx.Node:
        if kind == "get_attr" and target in self._attr_nodes:
            return self._attr_nodes[target]
        if kind in _CALLS_AND_OUTPUT and (_is_grad_enabled() is not self._grad_enabled or (
                _is_autocast_enabled() if self._autocast is None else autocast_state() != self._autocast)):
            self._record_modes()
        if name is None and kind in ("call_function", "call_method"):
            name = self._node_name(target)
        # Arguments are set after creation: Graph.create_node scans them for SymInts with a pytree
        # walk (~15% of tracing time), and a trace with static shapes has none.
        node = super().create_node(kind, target, (), {}, name, type_expr)
        if args or kwargs:
            node.args, node.kwargs = args, kwargs
        if kind == "get_attr":
            self._attr_nodes[target] = node
        if kind == "output":
            return node
        self.nodes += 1
        if self.nodes % NODE_STRIDE == 0:
            self.progress.traced(self.nodes)
        start = time.perf_counter()
        if self.record_random_ops or self.record_factories:
            with _NO_TORCH_FUNCTION():   # computing a value records nothing (see _RecordRandomOps)
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
            fx.Tracer.create_node(self, "call_function", torch._C._set_grad_enabled, (grad,), {})
            self._grad_enabled = grad
        if autocast_state() != self._autocast:
            raise FrontendError(f"autocast at {_user_line(_frames(self._stop))}\ndynamo_relational.compile does not "
                                "record autocast: cast explicitly (x.to(torch.bfloat16)), or use "
                                "torch.compile(model, backend=\"relational\").")

    def _node_name(self, target) -> str:
        """fx's name for nodes calling ``target`` (fx runs a regex per node; cached here)."""
        try:
            name = self._target_names.get(target)
        except TypeError:   # unhashable target
            return self.graph._target_to_str(target)
        if name is None:
            name = self._target_names[target] = self.graph._target_to_str(target)
        return name

    def _value(self, node: fx.Node) -> Any:
        if node.op == "placeholder":
            return self.inputs[self.input_names.index(node.target)].detach().clone()
        if node.op == "get_attr":
            return self.attrs[node.target].detach().clone()
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), self.value_of)
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)   # (the context manager costs more than the op)
        try:
            if node.op == "call_method":
                fn, args = getattr(args[0], node.target), args[1:]
            else:
                fn = node.target
            if not _needs_check(node):
                return fn(*args, **kwargs)
            if _is_random(node, self._appliers.values()):   # no draw from the generators (_trace_and_group)
                with torch.random.fork_rng(devices=cuda_devices()), self._check:
                    return fn(*args, **kwargs)
            with self._check:
                return fn(*args, **kwargs)
        except _DataDependentOp as e:
            raise self.data_dependence_error(f"{e} has a value-dependent output or output shape") from None
        except Exception as e:
            raise FrontendError(f"{type(e).__name__} while tracing {_user_line(_frames(self._stop))}\n{e}") from e
        finally:
            torch._C._set_grad_enabled(grad)

    def _checked_outputs(self, outputs: Any) -> tuple:
        """``forward``'s result as a flat tuple of its leaves, checked while its proxies (and so their values)
        are alive; its structure goes to :attr:`out_spec`. (Flattened here, fx never sees the containers: it
        would make its own immutable lists and dicts of them, and a node constructing each namedtuple.)"""
        leaves, self.out_spec = pytree.tree_flatten(outputs)
        for leaf in leaves:
            if isinstance(leaf, _ValueProxy) and not isinstance(leaf.value, torch.Tensor):
                raise FrontendError(f"{type(self.model).__name__}.forward returns {leaf.node.name} (a "
                                    f"{type(leaf.value).__name__}); outputs must be tensors, or tuples, "
                                    "namedtuples, lists and dicts of tensors and Python constants")
            if is_dataclass(leaf) and any(isinstance(getattr(leaf, f.name, None), fx.Proxy) for f in fields(leaf)):
                raise FrontendError(
                    f"{type(self.model).__name__}.forward returns a {type(leaf).__name__} holding tensors, a "
                    "dataclass that torch.utils._pytree does not know: register it "
                    f"(torch.utils._pytree.register_dataclass({type(leaf).__name__})), or return a tuple, "
                    "namedtuple or dict")
        return tuple(leaves)

    def _stack_trace(self) -> str:
        """The innermost user frame, in Dynamo's ``stack_trace`` format (what the code-site hint reads)."""
        frame = _innermost_frame(self._stop)
        text = self._stack_traces.get(frame)
        if text is None:
            text = self._stack_traces[frame] = _format_frame(*frame) if frame else ""
        return text

    def data_dependence_error(self, what: str) -> FrontendError:
        frames = _frames(self._stop)
        stack = "".join(_format_frame(*f) for f in reversed(frames))
        return FrontendError(
            f"data-dependent control flow at {_user_line(frames)}\n{what}.\n"
            "dynamo_relational.compile traces the structure from Python data only: it cannot branch on, or "
            "read, tensor values. Use tensor ops (torch.where, masks as multiplications), or "
            "torch.compile(model, backend=\"relational\") which handles graph breaks.\n"
            f"User stack (innermost last):\n{stack}")


# --------------------------------------------------------------------------- the compiled module


@dataclass(frozen=True)
class _InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    def describe(self) -> str:
        return f"shape {tuple(self.shape)}, {self.dtype}, on {self.device}"


@dataclass
class _Traced:
    """One grouped graph (per state of the modules: :meth:`RelationalModule._state`) and its compilations."""
    graph: fx.GraphModule
    report: GraphReport
    out_spec: pytree.TreeSpec
    #: output leaves that are not tensors (constants), by leaf position
    constants: dict[int, Any]
    #: compiled callables by autograd need: ("grad", requires_grad flags of the inputs) or "no_grad"
    compiled: dict[Any, Callable] = field(default_factory=dict)
    #: keys of ``compiled`` whose code is shared across groundings (dynamic sizes)
    shared: set = field(default_factory=set)
    #: what the modules held outside their parameters, buffers and submodules when traced: see :class:`HeldAttributes`
    attributes: "HeldAttributes | None" = None


class RelationalModule(nn.Module):
    """The result of :func:`compile`: call it like the model.

    ``model`` is the original module (its parameters are the ones trained),
    ``report`` a :class:`~dynamo_relational.Report` of the compilation (nodes
    before and after grouping, groups, timings; ``print(compiled.report)``),
    ``graph`` the grouped FX graph.
    """

    def __init__(self, model: nn.Module, example_inputs: Sequence[torch.Tensor], options: Options,
                 detailed: bool = False):
        super().__init__()
        self.model = model
        self.options = options
        self.detailed = detailed
        self._specs = _input_specs(model, example_inputs)
        self._example_inputs = [t.detach() for t in example_inputs]
        self._traced: dict[tuple, _Traced] = {}   # by _state()
        self._warned_torch_func = False
        grad = torch.is_grad_enabled()
        with torch.inference_mode(False), torch.set_grad_enabled(grad):   # (see forward)
            self._variant(list(example_inputs))   # trace, group and compile now

    @property
    def report(self) -> Report:
        """What the compilation did; ``compile_seconds`` is the sum of its timings."""
        traced = self._current()
        return Report([traced.report], compile_seconds=sum(traced.report.timings.values()), compiled=self)

    @property
    def graph(self) -> fx.GraphModule:
        """The grouped FX graph (``compiled.graph.print_readable()``)."""
        return self._current().graph

    def _current(self) -> _Traced:
        """The graph of the modules' current state (see :meth:`_state`); the latest one if that state was
        not run yet."""
        return self._traced.get(self._state()) or list(self._traced.values())[-1]

    def forward(self, *args: torch.Tensor, **kwargs: Any) -> Any:
        if kwargs:
            names = ", ".join(s.name for s in self._specs)
            raise FrontendError(f"compiled {type(self.model).__name__} takes its inputs positionally, as compiled: "
                                f"({names}); got keywords {sorted(kwargs)}")
        if torch.is_inference_mode_enabled():
            # AOT autograd's functions fail there ("Inference tensors cannot be saved for backward"), and the
            # constants of a graph traced there could not serve a later training call. Without gradients,
            # outside it, the compiled code computes the same values (this call checks the inputs).
            with torch.inference_mode(False), torch.no_grad():
                return self.forward(*args)
        self._check_inputs(args)
        if torch._C._functorch.peek_interpreter_stack() is not None:
            return self._run_eagerly_under_torch_func(args)
        traced, fn = self._variant(args)
        flat = list(fn(*args))
        for position, value in traced.constants.items():
            flat.insert(position, value)
        return pytree.tree_unflatten(flat, traced.out_spec)

    def _state(self) -> tuple:
        """What a traced graph depends on besides the inputs: each module's train/eval flag; the module
        hooks (by handle id, so registering or removing one changes it), which tracing ran; and the
        modules, parameters and buffers themselves (by identity), which the graph calls and reads
        (``m.weight = nn.Parameter(...)`` or ``load_state_dict(..., assign=True)`` replace them); and the
        autocast regions around the call (traced and compiled in them, the graph has their dtypes)."""
        modules = list(self.model.modules())
        hooks = [h for m in modules for h in _module_hooks(m)] + list(_global_hooks())
        ids = tuple(tuple(h) for h in hooks) if any(hooks) else None   # rarely any: tuples only then
        objects = [id(x) for m in modules for x in (m, *m._parameters.values(), *m._buffers.values())]
        return tuple([m.training for m in modules]), ids, tuple(objects), autocast_state()

    def _run_eagerly_under_torch_func(self, args: Sequence[torch.Tensor]) -> Any:
        """Inside ``torch.func.grad``, ``vmap``, ``jvp`` and the like, run the model itself. The compiled
        code cannot run there: its custom ops and AOT autograd's functions do not implement the
        transforms (``torch.func.grad`` fails with "must override the setup_context staticmethod").
        ``torch.compile(model, backend="relational")`` traces the transforms and compiles them."""
        if not self._warned_torch_func:
            self._warned_torch_func = True
            log.warning("relational: compiled %s called inside a torch.func transform; running the model eagerly "
                        "(torch.compile(model, backend=\"relational\") compiles such calls)", type(self.model).__name__)
        return self.model(*args)

    def _check_inputs(self, args: Sequence[Any]) -> None:
        if len(args) != len(self._specs):
            raise FrontendError(f"compiled {type(self.model).__name__} takes {len(self._specs)} tensor input(s) "
                                f"({', '.join(s.name for s in self._specs)}), got {len(args)}")
        for spec, arg in zip(self._specs, args):
            if not isinstance(arg, torch.Tensor):
                raise FrontendError(f"argument {spec.name!r} must be a tensor ({spec.describe()}), "
                                    f"got {type(arg).__name__}")
            if arg.shape != spec.shape or arg.dtype != spec.dtype or arg.device != spec.device:
                got = _InputSpec(spec.name, tuple(arg.shape), arg.dtype, arg.device)
                raise FrontendError(
                    f"argument {spec.name!r}: the graph was compiled for {spec.describe()}, got {got.describe()}. "
                    "The compiled graph is specialized to the example inputs; compile again for other shapes.")

    @staticmethod
    def _stale(traced: _Traced) -> bool:
        """Whether ``traced`` computes with values that changed since tracing (logged with the reason): a plain
        attribute replaced or changed in place, or a buffer that value_compression merged rows by."""
        changed = traced.attributes.changed()
        if changed is not None:
            log.warning("relational: %s was %s since the model was traced; tracing and compiling it again (a "
                        "value that changes between calls is better an input, or a buffer: the graph reads those on "
                        "every call)", *changed)
            return True
        if traced.report.constants_read:
            from dynamo_relational.passes.compress_values import changed_constant

            name = changed_constant(traced.report.constants_read)
            if name is not None:
                log.warning("relational: %s changed in place since the model was traced, and value_compression merged "
                            "rows by its values; tracing and compiling it again", name)
                return True
        return False

    def _variant(self, args: Sequence[torch.Tensor]) -> tuple[_Traced, Callable]:
        """The compiled graph for the modules' state (see :meth:`_state`) and the autograd need of this call."""
        state = self._state()
        traced = self._traced.get(state)
        if traced is not None and self._stale(traced):
            del self._traced[state]
            traced = None
        if traced is None:
            if self._traced:
                log.warning("relational: %s switched train/eval mode or autocast, or its module hooks, modules, "
                            "parameters or buffers changed; tracing and compiling it again", type(self.model).__name__)
                # graphs of modules, parameters or buffers the model no longer has would only keep them alive
                for stale in [key for key in self._traced if key[2] != state[2]]:
                    del self._traced[stale]
            with compile_progress(self.options.progress) as progress:
                traced = self._traced[state] = _trace_and_group(self.model, self._example_inputs,
                                                               [s.name for s in self._specs], self.options,
                                                               self.detailed, progress)
        if not self.options.inductor:
            return traced, traced.graph
        needs_grad = torch.is_grad_enabled() and (any(a.requires_grad for a in args) or any(
            p.requires_grad for p in traced.graph.parameters()))
        key = ("grad", tuple(a.requires_grad for a in args)) if needs_grad else "no_grad"
        fn = traced.compiled.get(key)
        if fn is None and key == "no_grad":
            # compile_fx's training graph also computes the outputs (shared Dynamo code would recompile); it
            # records its backward whatever the grad mode, so its results are detached, as no_grad's are
            training = next((f for k, f in traced.compiled.items() if k not in traced.shared), None)
            if training is not None:
                fn = traced.compiled[key] = _without_gradients(training)
        if fn is None:
            with CompileProgress(self.options.progress, 1) as progress:
                progress.start("inductor")
                fn, shared = compile_grouped(traced.graph, args, self.options, traced.report, grad=needs_grad)
            traced.compiled[key] = fn
            if shared:
                traced.shared.add(key)
        return traced, fn


def _without_gradients(fn: Callable) -> Callable:
    """``fn``, its results cut from the autograd graph it recorded (as a call under ``no_grad`` returns them:
    ``requires_grad`` false, so ``.numpy()`` works)."""
    def run(*args: torch.Tensor) -> list:
        return [out.detach() if isinstance(out, torch.Tensor) and out.grad_fn is not None else out
                for out in fn(*args)]
    return run


def _module_hooks(module: nn.Module) -> tuple[dict, ...]:
    """The hooks that run when ``module`` is called, by kind (handle id -> hook)."""
    return module._forward_pre_hooks, module._forward_hooks, module._backward_pre_hooks, module._backward_hooks


def _global_hooks() -> tuple[dict, ...]:
    """The hooks registered for every module (``nn.modules.module.register_module_forward_hook`` etc.)."""
    return (_nn_module._global_forward_pre_hooks, _nn_module._global_forward_hooks,
            _nn_module._global_backward_pre_hooks, _nn_module._global_backward_hooks)


def _input_specs(model: nn.Module, example_inputs: Sequence[Any]) -> list[_InputSpec]:
    try:
        bound = inspect.signature(model.forward).bind(*example_inputs)
    except TypeError as e:
        raise FrontendError(f"example inputs do not fit {type(model).__name__}.forward: {e}") from None
    names = []
    for name, value in bound.arguments.items():
        if isinstance(value, tuple) and bound.signature.parameters[name].kind is inspect.Parameter.VAR_POSITIONAL:
            names += [f"{name}[{i}]" for i in range(len(value))]
        else:
            names.append(name)
    specs = []
    for name, t in zip(names, example_inputs):
        if not isinstance(t, torch.Tensor):
            raise FrontendError(f"example input {name!r} is a {type(t).__name__}; only tensors are supported "
                                "(keep Python structure such as neighbour lists on the module)")
        specs.append(_InputSpec(name, tuple(t.shape), t.dtype, t.device))
    return specs


def _refuse_unrecorded_hooks(model: nn.Module) -> None:
    """Hooks that tracing cannot record, refused rather than dropped or doubled: module backward hooks
    (``register_full_backward_hook``) wrap a call's tensors in an autograd Function, which skips
    proxies; global module hooks (``nn.modules.module.register_module_forward_hook`` and the like)
    would also run on the modules that the compiled module calls, itself included."""
    if any(_global_hooks()):
        raise FrontendError(f"{type(model).__name__}: global module hooks (torch.nn.modules.module."
                            "register_module_*_hook) are not supported by dynamo_relational.compile: they would "
                            "also run on the modules it calls. Register the hook on the model's own modules.")
    hooked = [f"{name or 'the model'} ({type(m).__name__})" for name, m in model.named_modules()
              if m._backward_hooks or m._backward_pre_hooks]
    if hooked:
        raise FrontendError(f"{type(model).__name__}: module backward hooks are not recorded by "
                            f"dynamo_relational.compile, on {', '.join(hooked)}. Remove them, or use "
                            "torch.compile(model, backend=\"relational\"), which runs them.")


@dataclass
class Trace:
    """An ungrouped graph recorded by :func:`trace`, flattened outputs and what the grouping needs of it."""
    graph: fx.GraphModule
    #: the structure of ``forward``'s result; the graph's output lists its tensor leaves
    out_spec: pytree.TreeSpec
    #: output leaves that are not tensors (constants), by leaf position
    constants: dict[int, Any]
    #: seconds spent tracing and computing the nodes' values
    seconds: float
    value_seconds: float


def _trace_and_group(model: nn.Module, inputs: Sequence[torch.Tensor], names: Sequence[str], options: Options,
                     detailed: bool, progress: CompileProgress) -> _Traced:
    traced = trace(model, inputs, names, progress)
    with gc_paused():
        gm, report = group_graph(traced.graph, options, detailed, progress)
    for node in gm.graph.nodes:   # the values were only needed for shapes; free them
        node.meta.pop("example_value", None)
    report.timings = {"trace": traced.seconds - traced.value_seconds, "values": traced.value_seconds,
                      **report.timings}
    # (after the trace: forward may set scalar attributes, say a cached size, which the graph does not change)
    return _Traced(gm, report, traced.out_spec, traced.constants, attributes=HeldAttributes(model))


def trace(model: nn.Module, inputs: Sequence[torch.Tensor], names: Sequence[str],
          progress: CompileProgress = NO_PROGRESS) -> Trace:
    """``model`` called on ``inputs`` (placeholders named ``names``), recorded as an ungrouped graph whose
    nodes carry their shapes (``meta["rel_info"]``); see the module docstring for the contract."""
    start = time.perf_counter()
    _refuse_unrecorded_hooks(model)
    names = [n.replace("[", "_").replace("]", "") for n in names]
    tracer = _Tracer(model, inputs, names, progress)
    progress.start("tracing")
    generators = _generator_states()
    attributes = HeldAttributes(model)
    objects = PlainObjects(model)
    with torch.enable_grad():   # the graph serves calls with and without gradients: record no_grad blocks
        graph = tracer.trace(model)
        # Tracing computes no random value from the generators (see _Tracer._value): a draw means a
        # random op ran outside the graph (torch.randn(4)), frozen into it as a constant. Trace again,
        # recording such ops; only models that have them pay for the recording.
        if any(not torch.equal(a, b) for a, b in zip(generators, _generator_states())):
            log.info("relational: random numbers were drawn outside the traced graph; tracing again to "
                     "record the random ops that drew them")
            _set_generator_states(generators)
            tracer = _Tracer(model, inputs, names, progress, record_random_ops=True)
            graph = tracer.trace(model)
            if any(not torch.equal(a, b) for a, b in zip(generators, _generator_states())):
                raise FrontendError(
                    f"{type(model).__name__}.forward draws random numbers outside the traced graph through an op "
                    "that is not known to be random; dynamo_relational.compile would freeze them. Use torch's "
                    "random functions, or torch.compile(model, backend=\"relational\").")
        # Tensors made from Python values alone run while tracing and become constants of the graph. Trace
        # again, recording tensor factories, where that loses eager's behaviour: a traced value written into
        # such a tensor (out = torch.zeros(n, d); out[v] = h), whose later reads ran on its untraced value; or
        # outputs sharing memory through such tensors (z = torch.zeros(3); return z, z[1:]), traced as
        # separate constants, so that the caller's write into one would not reach the other.
        if tracer.wrote_untraced is not None:
            why = f"{tracer.wrote_untraced} writes a traced value into a tensor made without one"
        elif _returned_constants_share_memory(graph, tracer.attrs, attributes.held_ids()):
            why = "outputs made without a traced value share memory"
        else:
            why = None
        if why is not None:
            log.info("relational: %s; tracing again to record the tensor factories", why)
            _set_generator_states(generators)
            tracer = _Tracer(model, inputs, names, progress, record_random_ops=tracer.record_random_ops,
                             record_factories=True)
            graph = tracer.trace(model)
            if tracer.wrote_untraced is not None:
                raise FrontendError(
                    f"a traced value is written into a tensor the trace does not see at {tracer.wrote_untraced} "
                    "(a plain tensor attribute, one made outside forward, or one made by a legacy constructor such "
                    "as torch.Tensor(n, d) or torch.FloatTensor(n, d), which tracing cannot record): "
                    "dynamo_relational.compile would keep one such tensor for every call. Make it in forward with a "
                    "factory (x.new_zeros(...), torch.zeros(...)), register it as a buffer, or use "
                    "torch.compile(model, backend=\"relational\").")
    for holder, why in (
            (attributes, "not values kept in the model's lists and dicts (this one would be stored once, while "
                         "tracing, and not as a tensor). Collect such values in a local list or dict and return them, "
                         "or use torch.compile(model, backend=\"relational\")."),
            (objects, "and would leave that attribute holding a value of the trace, not of any call. Keep such state "
                      "in local variables (a dict from node to state) or return it, or use torch.compile(model, "
                      "backend=\"relational\"), which replays attribute writes.")):
        stored = holder.stored_proxy()
        if stored is not None:
            holder.restore()
            raise FrontendError(
                f"{type(model).__name__}.forward stores a traced value in {stored[0]} (the value computed at "
                f"{computed_at(stored[1])}): dynamo_relational.compile records tensor ops, {why}")
    changed = attributes.changed(scalars=False)
    if changed is not None:
        attributes.restore()
        raise FrontendError(
            f"{type(model).__name__}.forward changes {changed[0]} ({changed[1]} while tracing): dynamo_relational."
            "compile would make that change once, at compile time, not on every call. Register the tensor as a "
            "buffer and update it in place, or use torch.compile(model, backend=\"relational\").")
    progress.step()
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    leaves, out_spec = list(output.args[0]), tracer.out_spec
    tensors = [leaf for leaf in leaves if isinstance(leaf, fx.Node)]
    constants = {i: leaf for i, leaf in enumerate(leaves) if not isinstance(leaf, fx.Node)}
    output.args = (tuple(tensors),)   # a flat tuple: what compile_fx expects, unflattened on the way out
    _copy_mutated_constants(graph, tracer.attrs, attributes.held_ids())
    tracer.node_name_to_scope.clear()   # fx's record of module scopes, unused here
    for node in graph.nodes:   # the passes read shapes only: keep those and free the values early
        if node.op != "get_attr":   # (constants keep theirs: the passes compare them)
            tensor_info(node)
            node.meta.pop("example_value", None)
    # lazy: Python code for the ungrouped graph (tens of thousands of lines) is never needed
    gm = _LazyGraphModule({n.target: tracer.attrs[n.target] for n in graph.nodes if n.op == "get_attr"}, graph)
    return Trace(gm, out_spec, constants, time.perf_counter() - start, tracer.value_seconds)


def _returned_constants_share_memory(graph: fx.Graph, attrs: dict[str, torch.Tensor], held: set[int]) -> bool:
    """Whether two outputs read (views of) two different constants of the graph that share memory, both
    made in ``forward`` (tensors the model holds, ``held`` by id, are left out: they are returned as themselves)."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    storages: dict[int, str] = {}   # storage address -> the constant read there first
    for leaf in output.all_input_nodes:
        base = _viewed_base(leaf)
        if base.op != "get_attr" or not base.target.startswith("_tensor_constant"):
            continue
        tensor = attrs[base.target]
        if id(tensor) in held or tensor.untyped_storage().nbytes() == 0:
            continue
        if storages.setdefault(tensor.untyped_storage().data_ptr(), base.target) != base.target:
            return True
    return False


def _copy_mutated_constants(graph: fx.Graph, attrs: dict[str, torch.Tensor], held: set[int]) -> None:
    """A tensor made in ``forward`` from Python values alone (``acc = torch.zeros(8)``,
    ``out = torch.zeros(n, d)``) is traced as a constant of the graph; an in-place op on it or on a view
    of it (``acc += t``, ``out[v] = h``, ``out[v].copy_(h)``) would change that constant for every
    later call, and so would the caller's write into an output that is (a view of) it (unless the model
    holds it as a plain attribute, ``held`` by id: eager returns the attribute itself). Eager makes a new
    tensor on every call, so every reader of such a constant reads one fresh copy of it, made where the
    constant is read first. Tracing ran the ops on the constant's
    traced value, so the value is reset to the constant's (the passes recognize a zero accumulator by it)."""
    from dynamo_relational.passes.inplace import is_in_place

    written = [node.args[0] for node in graph.nodes
               if is_in_place(node) and node.args and isinstance(node.args[0], fx.Node)]
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    mutated: dict[fx.Node, None] = {}
    for value, by_caller in [(v, False) for v in written] + [(v, True) for v in output.all_input_nodes]:
        base = _viewed_base(value)
        # The caller may write into an output, unless it is a tensor the model holds: eager returns that itself.
        if base.op == "get_attr" and base.target.startswith("_tensor_constant") and not (
                by_caller and id(attrs[base.target]) in held):
            mutated[base] = None
    for constant in mutated:
        with graph.inserting_after(constant):
            fresh = graph.call_function(torch.clone, (constant,))
        constant.replace_all_uses_with(fresh, delete_user_cb=lambda user: user is not fresh)
        fresh.meta = dict(constant.meta)
        constant.meta["example_value"] = attrs[constant.target].detach().clone()


def _viewed_base(node: fx.Node) -> fx.Node:
    """The node whose memory ``node`` may share: followed back through view ops to their first operand."""
    from dynamo_relational.passes.distinct_outputs import may_alias

    while may_alias(node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def compile(model: nn.Module, example_inputs: Sequence[torch.Tensor] | torch.Tensor, *, detailed: bool = False,
            **options: Any) -> RelationalModule:
    """Trace ``model`` on ``example_inputs`` without TorchDynamo, group it and compile it with Inductor.

    ``example_inputs`` are the model's positional tensor inputs (a tuple, or
    one tensor). Keyword arguments are backend options
    (:class:`~dynamo_relational.Options`; ``inductor=False`` runs the grouped
    graph eagerly); ``detailed=True`` also fills the report's printed graphs
    and lower bound (slower). Returns a :class:`RelationalModule`: call it
    like the model, with inputs of the example inputs' shapes, dtypes and
    devices; train it through ``model.parameters()``. See the module
    docstring for the contract (structure from Python data, no control flow
    on tensor values, static shapes).
    """
    opts = Options.from_mapping(options)
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(model, nn.Module):
        raise FrontendError(f"compile expects an nn.Module, got {type(model).__name__}")
    return RelationalModule(model, tuple(example_inputs), opts, detailed)
