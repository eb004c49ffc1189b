"""Recording a live call: the model runs eagerly on its real tensors while a ``TorchFunctionMode`` records
each torch call that reads a traced tensor as an FX node, the node that the tracer
(:mod:`~dynamo_relational.tracer`) would record for it.

``dynamo_relational.batch`` traces a new sample structure with gradients on, and that trace is also the
sample's call. Recorded this way, the call is eager's exactly (its values, gradients, random draws and
buffer updates), and no value is computed twice or from copies; fx's proxies are not involved (tracing
through them cost 5-14% more on the per-sample examples). Its graph is the tracer's:
``operator`` targets for the tensor operators (``a + b`` reaches the mode as ``TensorBase.add``), a
``getitem`` node per result of an op returning several tensors (and per row of a tensor iterated over),
``get_attr`` nodes for the model's parameters and buffers and for the other tensors ops read (constants),
in-place ops on traced values (later reads of the written tensor read the write, as fx's proxies read
``h = F.relu(h, inplace=True)``) and on the model's tensors, random ops, the innermost user frame of each
node, and ``torch._C._set_grad_enabled`` where ``no_grad`` blocks begin and end. Equal calls of a pure op
(``cse``'s rule) but an addition on equal operands between two writes are one node, as ``cse`` would
leave them.

Only what the mode can see in full is recorded. The recording gives up, and the call goes on as eager's
(:attr:`Recording.unusable` says why; the caller traces the structure with the tracer instead), on: a read
of a traced value by Python (``bool(t)``, ``t.item()``, an attribute other than its shape, dtype, device
or ``requires_grad``, whose read is noted: :attr:`Recording.read_requires_grad`), an op with a
value-dependent output shape, a write into a tensor made without a traced value, random numbers drawn
without a traced argument, a write into the result of calls recorded as one, an input given twice,
autocast, an argument it does not know, a tensor computed outside its view (one that requires gradients
without being traced), a custom autograd Function, a traced value stored in the model (taken out again),
outputs made without a traced value that share memory, or a tensor made without a traced value that a call
without one writes into after a recorded op read it."""
from __future__ import annotations

import operator
import sys
from types import FrameType
from typing import Any, NamedTuple, Sequence, cast

import numpy
import torch
import torch.fx as fx
from torch import nn
from torch.autograd.function import BackwardCFunction
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from .data_dependence import (DataDependentOp, RejectDataDependentOps, needs_check, numbers_in_index, reads_a_number,
                              static_target)
from .forward_constants import changed_constant, returned_constants_share_memory, tensor_version
from .model_state import (HeldAttributes, ModuleAttributes, PlainObjects, assigned_traced_values, module_attributes,
                          take_out)
from .nodes import new_node
from .ops.base import TensorInfo, value_info
from .ops.elementwise import ADDITIONS
from .ops.facts import target_may_alias, target_writes
from .passes.cse import merges_by_target
from .source_lines import code_site, formatted_site
from .tracer import OPERATOR_METHODS, PLAIN_TYPES
from .untraced_calls import drew_since, generator_states, random_ops
from .value_proxy import STATIC_ATTRIBUTES, STATIC_METHODS

_is_grad_enabled = torch.is_grad_enabled
_Node, _Tensor = fx.Node, torch.Tensor
_is_autocast_enabled = torch._C._is_any_autocast_enabled
_REFLECTED = {"__radd__": operator.add, "__rsub__": operator.sub, "__rmul__": operator.mul,
              "__rdiv__": operator.truediv, "__rtruediv__": operator.truediv, "__rpow__": operator.pow,
              "__rmatmul__": operator.matmul, "__rmod__": operator.mod, "__rfloordiv__": operator.floordiv}
#: the unary ones
_UNARY = {"neg": operator.neg, "__invert__": operator.invert}
_STATIC = frozenset((*STATIC_ATTRIBUTES, *STATIC_METHODS, "__len__"))
_GETITEM = torch.Tensor.__getitem__


class _Unusable(Exception):
    """Raised inside the mode where the recording gives up; caught there (the call runs on)."""


class Recording(TorchFunctionMode):
    """The graph of ``model``'s call on ``inputs``, recorded while it runs (:func:`record`)."""

    def __init__(self, model: nn.Module, inputs: Sequence[torch.Tensor], input_names: Sequence[str]):
        super().__init__()
        #: why the call could not be recorded (then :attr:`graph` is incomplete), or None
        self.unusable: str | None = None
        #: whether Python code read a tensor's ``requires_grad``: the graph then holds for the gradient state of
        #: this call (gradients on; which parameters and inputs require them) alone
        self.read_requires_grad = False
        #: whether forward stored a traced value in the model (taken out again: eager's call cannot stand)
        self.stored_traced_value = False
        self.graph = fx.Graph()
        self.out_spec: pytree.TreeSpec | None = None
        #: get_attr target -> tensor (parameters and buffers of the model, then constants)
        self.attrs: dict[str, torch.Tensor] = {}
        self.value_seconds = 0.0
        self.call_result: tuple | None = None
        #: id -> node of every traced tensor (inputs, values computed), kept alive so that ids stay unique
        self._nodes: dict[int, fx.Node] = {}
        self._kept: list[torch.Tensor] = []
        #: the values computed with gradients off: a custom autograd Function's forward runs so, and its
        #: outputs (values recorded there) then get its backward
        self._kept_without_grad: list[torch.Tensor] = []
        self._model_names: dict[int, str] = {}
        for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
            self._model_names.setdefault(id(t), name)
            self.attrs.setdefault(name, t)
        self._model_tensors = frozenset(self.attrs)
        self._constants: dict[int, fx.Node] = {}
        #: constants made here: (name, tensor, its version counter when a recorded op first read it)
        self._constants_read: list[tuple[str, torch.Tensor, int | None]] = []
        #: whether a recorded op drew random numbers (as the eager call draws them)
        self.drew = False
        #: the node whose value Python code read (or whose shape depends on values), if that is why it gave up
        self.read: fx.Node | None = None
        self._check = RejectDataDependentOps()
        self._grad_enabled = True
        self._stop: FrameType | None = None
        #: (target, operands) -> the node of an earlier call of a pure op on these traced values and ints: a later
        #: call of equal key computes the same value, unless something was written since (the keys are forgotten
        #: at every write). Per-node code computes ``W @ h[u]`` for each edge from ``u``: one node here instead of
        #: several that ``cse`` merges later.
        self._calls: dict[tuple, fx.Node] = {}
        #: nodes that stand for the results of several calls
        self._merged: set[fx.Node] = set()
        #: whether a node's value is a number (0-dim integer tensor, ``TensorInfo.number``): until one is, no
        #: operand can be read as a number (:func:`reads_a_number` is skipped)
        self._numbers = False
        for name, t in zip(input_names, inputs):
            if id(t) in self._nodes or id(t) in self._model_names:
                self.unusable = f"input {name} is given twice, or is a tensor of the model"
            node = self.graph.create_node("placeholder", name, (), {})
            node.meta["example_value"] = t
            self._nodes[id(t)] = node
            self._note_number(value_info(t))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.unusable is not None:
            return func(*args, **kwargs)
        recipe = _recipe(func)
        if recipe is None:   # (a shape, dtype or device read, or len(): static)
            return func(*args, **kwargs)
        if recipe is _REQUIRES_GRAD:
            self.read_requires_grad = True
            return func(*args, **kwargs)
        if func is _GETITEM and len(args) == 2:   # (the call too: a mask's indices select the rows it selects)
            args = (args[0], numbers_in_index(args[1], self._known))
        if not self._reads_traced(args, kwargs):
            # a call on constants alone runs: its result is a constant, as traced; a random one would be
            # frozen (the tracer records it on a second trace)
            if getattr(func, "__name__", None) in random_ops():
                self.unusable = f"{func.__name__} draws random numbers without a traced argument"
            return func(*args, **kwargs)
        try:
            node, written, static, key = self._node(recipe, args, kwargs)
        except _Unusable as e:
            self.unusable = str(e)
            return func(*args, **kwargs)
        out = self._call(node, static, func, args, kwargs)
        if self.unusable is None:
            if written:
                node.meta["rel_info"] = info = value_info(out)
                self._note_number(info)
                if args and out is args[0] and id(out) not in self._model_names:
                    # h = F.relu(h, inplace=True): later reads of h read the write, as fx's proxies do (the
                    # write into a fresh value then becomes a pure op); the model's tensors stay get_attr reads
                    self._nodes[id(out)] = node
            else:
                self._record_value(node, out)
                if key is not None and type(out) is _Tensor:
                    self._calls[key] = node
        return out

    # -- arguments -----------------------------------------------------------
    def _reads_traced(self, args: tuple, kwargs: dict) -> bool:
        """Whether a tensor among the arguments (also in lists, tuples and dicts) is traced or the model's."""
        for group in (args, kwargs.values()):
            for a in group:
                if isinstance(a, torch.Tensor):
                    if self._known(a):
                        return True
                elif type(a) is list or type(a) is tuple:
                    for b in a:
                        if self._known(b) if isinstance(b, torch.Tensor) else self._nested(b):
                            return True
                elif self._nested(a):
                    return True
        return False

    def _known(self, t: torch.Tensor) -> bool:
        return id(t) in self._nodes or id(t) in self._model_names

    def _nested(self, value: Any) -> bool:
        """Whether ``value``, a list, tuple or dict, holds a traced tensor or the model's at any depth."""
        return isinstance(value, (list, tuple, dict)) and any(
            isinstance(t, torch.Tensor) and self._known(t) for t in pytree.tree_leaves(value))

    def _arg(self, a: Any) -> Any:
        kind = type(a)
        if kind in PLAIN_TYPES:
            return a
        if isinstance(a, torch.Tensor):
            node = self._nodes.get(id(a))
            return node if node is not None else self._attr_node(a)
        if kind is list or kind is tuple or kind is torch.Size:
            nodes = self._nodes   # (ids of traced tensors are unique: the recording keeps the tensors alive)
            items = [node if (node := nodes.get(id(x))) is not None else self._arg(x) for x in a]
            return items if kind is list else kind(items)
        if kind is dict and all(type(k) is str for k in a):
            return {k: self._arg(v) for k, v in a.items()}
        if kind is slice:
            return slice(self._arg(a.start), self._arg(a.stop), self._arg(a.step))
        if a is Ellipsis:
            return a
        if isinstance(a, (numpy.integer, numpy.floating)):
            return a.item()
        raise _Unusable(f"an argument of type {kind.__name__}")

    def _attr_node(self, t: torch.Tensor) -> fx.Node:
        """The get_attr node of a parameter or buffer of the model, or of a constant tensor."""
        node = self._constants.get(id(t))
        if node is not None:
            return node
        name = self._model_names.get(id(t))
        if name is None:
            if t.requires_grad:
                raise _Unusable("a tensor that requires gradients was computed outside the recorded calls")
            name = f"_tensor_constant{len(self.attrs)}"
            self.attrs[name] = t
            self._constants_read.append((name, t, tensor_version(t)))
            value = t.detach().clone()   # (a constant made in forward is fresh in every eager call)
        else:
            value = t
        node = self._constants[id(t)] = new_node(self.graph, "get_attr", name, (), {})
        node.meta["example_value"] = value
        self._note_number(value_info(value))
        return node

    # -- nodes ---------------------------------------------------------------
    def _node(self, recipe: _Recipe, args: tuple, kwargs: dict) -> tuple[fx.Node, bool, bool, tuple | None]:
        """The node recording a call by ``recipe`` (an earlier call's, where the two merge), whether it writes
        into its first operand, whether its target is shape-static, and the key under which a later call
        merges with it (None: none does)."""
        if _is_autocast_enabled():
            raise _Unusable("autocast")
        if _is_grad_enabled() is not self._grad_enabled:
            self._grad_enabled = _is_grad_enabled()
            self.graph.create_node("call_function", torch._C._set_grad_enabled, (self._grad_enabled,), {})
            self._calls.clear()   # (a value computed with gradients is another than one computed without)
        if recipe.unusable is not None:
            raise _Unusable(recipe.unusable)
        form = recipe.call
        if recipe.operator is not None and len(args) == recipe.operator.arity and not kwargs:
            form = recipe.operator
            if form.reflected:
                args = (args[1], args[0])
        operands = self._arg(args)
        key = None
        if form.merges and not kwargs:
            for a in operands:   # traced values and ints alone (True == 1, but x[True] is not x[1])
                if type(a) is not _Node and type(a) is not int:
                    break
            else:
                key = (form.target, operands)
                twin = self._calls.get(key)
                if twin is not None:
                    self._merged.add(twin)
                    return twin, False, form.static, None
        node = new_node(self.graph, form.kind, form.target, operands, self._arg(kwargs) if kwargs else {})
        written = form.writes or bool(kwargs) and (kwargs.get("inplace") is True or kwargs.get("out") is not None)
        if written:
            if not self._writable(node):
                raise _Unusable(f"{form.target} writes into a tensor made without a traced value")
            if self._merged and self._reaches_merged(cast(fx.Node, node.args[0])):
                raise _Unusable(f"{form.target} writes into the result of calls recorded as one")
            self._calls.clear()
        if form.random:
            self.drew = True
        node.meta["stack_trace"] = formatted_site(code_site(self._stop, skip=2))   # (_node, the mode)
        return node, written, form.static, key

    def _reaches_merged(self, written: fx.Node) -> bool:
        """Whether ``written`` is, or may be a view of, a node that stands for several calls' results: their
        eager values are distinct tensors, and a write into one leaves the others as they were."""
        todo, seen = [written], set()
        while todo:
            node = todo.pop()
            if node in self._merged:
                return True
            if node not in seen and node.op in ("call_function", "call_method") \
                    and target_may_alias(node.op, node.target):
                seen.add(node)
                todo.extend(node.all_input_nodes)
        return False

    def _writable(self, node: fx.Node) -> bool:
        """Whether an in-place op writes a traced value or the model's parameter or buffer (writes into
        constants, and ``out=``, are left to the tracer, which records the factories that made them)."""
        written = node.args[0] if node.args else None
        return node.kwargs.get("out") is None and isinstance(written, fx.Node) and (
            written.op != "get_attr" or written.target in self._model_tensors)

    def _call(self, node: fx.Node, static: bool, func, args: tuple, kwargs: dict) -> Any:
        """``func``'s result; an op that may have a value-dependent output (shape) runs under the check that
        raises on such ATen ops, as the tracer runs it (then the recording gives up and the op runs again).
        ``static``: the node's target is known to be shape-static (:func:`static_target`)."""
        if static and not (self._numbers and reads_a_number(node)) or not needs_check(node):
            return func(*args, **kwargs)
        try:
            with self._check:
                return func(*args, **kwargs)
        except DataDependentOp:
            self.unusable = f"{getattr(node.target, '__name__', node.target)} has a value-dependent output"
            self.read = node
            return func(*args, **kwargs)

    def _record_value(self, node: fx.Node, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            node.meta["rel_info"] = info = value_info(out)
            self._note_number(info)
            self._traced(out, node)
        elif isinstance(out, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in out) \
                and all(isinstance(t, torch.Tensor) or t is None for t in out):
            # (also torch.return_types: h.max(0).values reads the item itself; an attention's weights it was
            # not asked for are None)
            node.meta["rel_info"] = None
            source = node
            if node.target == "unbind" and node.args[1:] in ((), (0,)) and not node.kwargs:
                # iterating over a tensor: the tracer's proxies read its rows, x[i]
                source = cast(fx.Node, node.args[0])
                self.graph.erase_node(node)
            for i, t in enumerate(out):   # (fx's proxies record a getitem for each item read)
                if t is None:
                    continue
                item = new_node(self.graph, "call_function", operator.getitem, (source, i), {})
                item.meta["stack_trace"] = node.meta.get("stack_trace", "")
                item.meta["rel_info"] = info = value_info(t)
                self._note_number(info)
                self._traced(t, item)
        else:
            self.unusable = f"{node.target} returns a {type(out).__name__}, which Python code reads"
            self.read = node

    def _note_number(self, info: TensorInfo | None) -> None:
        if info is not None and info.number:
            self._numbers = True

    def _traced(self, t: torch.Tensor, node: fx.Node) -> None:
        self._nodes[id(t)] = node
        self._kept.append(t)
        if not self._grad_enabled:
            self._kept_without_grad.append(t)

    # -- the call ------------------------------------------------------------
    def run(self, model: nn.Module, inputs: Sequence[torch.Tensor], attributes: HeldAttributes,
            objects: PlainObjects, before: ModuleAttributes) -> None:
        """Call ``model`` on ``inputs`` (with gradients, as eager), recording; sets :attr:`call_result`.
        ``attributes``, ``objects`` and ``before`` (the modules' attributes) are the model's state before the
        call."""
        generators = generator_states()
        self._stop = sys._getframe()
        try:
            with self:
                result = model(*inputs)
        finally:
            self._stop = None
        self.call_result = (result,)
        if self.unusable is None:
            self._output(result)
        if self.unusable is None and any(isinstance(t.grad_fn, BackwardCFunction)
                                           for t in self._kept_without_grad):
            self.unusable = "a custom autograd Function ran (its forward's ops were recorded, not its backward)"
        if self.unusable is None and not self.drew and drew_since(generators):
            # (with random ops recorded, the calls without a traced argument were checked by name)
            self.unusable = "random numbers were drawn outside the recorded calls"
        self._refuse_stored_values(before, attributes, objects)   # (their stores undone in any case)
        held = attributes.held_ids()
        if self.unusable is None and returned_constants_share_memory(self.graph, self.attrs, held):
            self.unusable = "outputs made without a traced value share memory"
        if self.unusable is None and changed_constant(self._constants_read, held):
            self.unusable = "a tensor made without a traced value was written in place after a recorded op read it"
        self._nodes.clear()
        self._kept.clear()
        self._kept_without_grad.clear()
        self._calls.clear()
        self._merged.clear()
        self._constants.clear()
        self._constants_read.clear()

    def _output(self, result: Any) -> None:
        leaves, self.out_spec = pytree.tree_flatten(result)
        try:
            args = tuple(self._arg(leaf) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves)
        except _Unusable as e:
            self.unusable = str(e)
            return
        if any(not isinstance(a, fx.Node) and type(a) not in PLAIN_TYPES for a in args):
            self.unusable = "an output is neither a tensor nor a Python constant"
            return
        if _is_grad_enabled() is not self._grad_enabled:
            self.graph.create_node("call_function", torch._C._set_grad_enabled, (_is_grad_enabled(),), {})
        self.graph.create_node("output", "output", (args,), {})

    def _refuse_stored_values(self, before: ModuleAttributes, attributes: HeldAttributes,
                              objects: PlainObjects) -> None:
        """A traced value that ``forward`` stored in the model (an attribute of a module, as it was before the
        call in ``before``, or of a plain object it holds, or an item of a list or dict attribute),
        or a tensor the model holds changed: the graph would not repeat that (the tracer, tracing next, refuses
        it, naming the line). The stored values are taken out first."""
        traced = self._nodes

        def is_traced(value: Any) -> bool:
            return isinstance(value, torch.Tensor) and id(value) in traced

        # (an attribute that still holds what it held holds no new traced value, unless it is a list or dict,
        # which ``attributes`` looks into, or a dict where nn.Module stores assigned tensors: a long list of
        # Python data is not walked)
        stored = assigned_traced_values(before, is_traced)
        take_out(stored)
        if attributes.stored_proxy(is_traced) is not None or objects.stored_proxy(is_traced) is not None:
            attributes.restore()
            objects.restore()
            self.stored_traced_value = True
        elif not stored and attributes.changed(scalars=False) is None:
            return
        self.stored_traced_value = self.stored_traced_value or bool(stored)
        self.unusable = self.unusable or "forward stored a traced value in the model, or changed a tensor it holds"


def _static_name(func) -> str | None:
    """The name of a tensor attribute read (``x.shape``) or method."""
    if type(func).__name__ == "method-wrapper":   # a tensor attribute's getter
        return getattr(func.__self__, "__name__", None)
    return getattr(func, "__name__", None)


class _Form(NamedTuple):
    """The node a call is recorded as, and what its target is known to do."""
    kind: str
    target: Any
    #: whether it draws random numbers
    random: bool
    #: whether it writes into its first operand (``out=`` and ``inplace=True`` are looked at per call)
    writes: bool
    #: whether its output shape is static (:func:`~dynamo_relational.data_dependence.static_target`)
    static: bool
    #: a reflected operator's operands are swapped (``2 - x`` reaches the mode as ``x.__rsub__(2)``)
    reflected: bool = False
    #: the positional arguments a call must have, and no keywords, for an operator's form
    arity: int = 0
    #: whether two calls without keywords of equal arguments compute equal values (``cse``'s rule)
    merges: bool = False


class _Recipe(NamedTuple):
    """How the calls of one function are recorded, found once per function (:func:`_recipe`)."""
    call: _Form
    #: the ``operator`` target for a tensor operator's calls of its arity
    operator: _Form | None = None
    #: why its calls cannot be recorded
    unusable: str | None = None


_RECIPES: dict[Any, _Recipe | None] = {}
#: a read of ``requires_grad``: static in the call's gradient state, which the recording notes
_REQUIRES_GRAD = _Recipe(_Form("call_function", getattr, False, False, False))


def _recipe(func) -> _Recipe | None:
    """How calls of ``func`` are recorded; None for the static reads (a tensor's shape, dtype, ...)."""
    try:
        return _RECIPES[func]
    except KeyError:
        pass
    except TypeError:   # unhashable
        return _new_recipe(func)
    if len(_RECIPES) > 4096:   # (functions are few; a bound for functions made anew per call)
        _RECIPES.clear()
    recipe = _RECIPES[func] = _new_recipe(func)
    return recipe


def _form(kind: str, target: Any, **facts: Any) -> _Form:
    name = target if kind == "call_method" else getattr(target, "__name__", None)
    try:
        written = target_writes(kind, target)
    except TypeError:   # unhashable target
        written = False
    random = name in random_ops()
    return _Form(kind, target, random, written, static_target(kind, target), **facts,
                 merges=not random and not _adds(target) and merges_by_target(kind, target))


def _adds(target: Any) -> bool:
    """Whether ``target`` is an addition: the aggregation pass opens up a partial sum that feeds one addition
    only, and a partial sum merged while recording (``b + W @ h[u]`` begins the sum of every node whose first
    in-neighbour is ``u``) would feed several, staying a node of every batch's graph."""
    try:
        return target in ADDITIONS
    except TypeError:   # unhashable target
        return False


def _new_recipe(func) -> _Recipe | None:
    name = _static_name(func)
    if name in _STATIC:
        return None
    if type(func).__name__ == "method-wrapper":   # (its form is never used)
        if name == "requires_grad":
            return _REQUIRES_GRAD
        return _Recipe(_form("call_function", getattr), unusable=f"reads the tensor attribute {name}")
    if name is not None and getattr(torch.Tensor, name, None) is func:
        call = _form("call_method", name)
    else:
        call = _form("call_function", func)
    operator_form = None
    if name in OPERATOR_METHODS:
        operator_form = _form("call_function", OPERATOR_METHODS[name], arity=2)
    elif name in _REFLECTED:
        operator_form = _form("call_function", _REFLECTED[name], arity=2, reflected=True)
    elif name in _UNARY:
        operator_form = _form("call_function", _UNARY[name], arity=1)
    elif name == "__setitem__":
        operator_form = _form("call_function", operator.setitem, arity=3)
    return _Recipe(call, operator_form)


def record(model: nn.Module, inputs: Sequence[torch.Tensor], input_names: Sequence[str]) -> Recording:
    """``model`` called on ``inputs`` with gradients, recorded (see the module docstring)."""
    recording = Recording(model, inputs, input_names)
    recording.run(model, inputs, HeldAttributes(model), PlainObjects(model), module_attributes(model))
    return recording
