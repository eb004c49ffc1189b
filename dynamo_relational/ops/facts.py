"""What a call does besides computing its result: aliasing, writing, drawing random numbers, making tensors.

The passes ask these questions of every FX node, catalog op or not. The answers
come from what PyTorch records about its ops, read once per target:

* the alias annotations of the ATen schemas: ``reshape(Tensor(a) self) ->
  Tensor(a)`` may return a view of ``self``; ``add_(Tensor(a!) self, ...)``
  writes into ``self``;
* the op tags: ``maybe_aliasing_or_mutating`` (``dropout``, ``atleast_1d``:
  composite ops that may return their input), ``nondeterministic_seeded``
  (``randn``, ``bernoulli``, ``dropout``);
* factories are the ops whose schema takes no tensor: their values follow from
  constant arguments.

A call is matched to ATen by its name (``torch.reshape``, ``x.reshape``, and
``F.dropout`` all reach ``aten::reshape`` / ``aten::dropout``), also where
another library replaced torch's function with a wrapper of its own. What the
schemas do not say is listed here, each with its reason: Python-level tensor
methods (``x.float()``), Python's operator module, and the ``*_like`` /
``new_*`` factories, whose tensor argument gives only a shape and dtype.
"""
from __future__ import annotations

import operator
import re
from functools import lru_cache
from typing import Any

import torch
import torch.fx as fx

#: modules whose functions are bindings of ATen ops of the same name
_TORCH_MODULES = frozenset(("torch", "torch.functional", "torch.nn.functional", "torch._C._nn", "torch._C._special",
                            "torch._C._linalg", "torch._C._VariableFunctions", "torch._tensor"))

#: tensor methods defined in Python or by the binding layer, not ATen, that may return the tensor itself
#: (a cast to the dtype it already has)
_RETURN_SELF_METHODS = frozenset(("float", "double", "half", "bfloat16", "int", "long", "short", "char", "byte", "bool",
                                  "cfloat", "cdouble", "chalf", "type"))
#: ATen ops whose schema does not annotate that they may return their input or views of it (found by the
#: op_db check in tests/test_op_facts.py); the second kind may return views of any of their operands
_UNANNOTATED_ALIASES = frozenset(("type_as", "sum_to_size"))
_UNANNOTATED_ALIASES_OF_ANY = frozenset(("unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk",
                                         "broadcast_tensors", "meshgrid", "histogramdd"))


@lru_cache(maxsize=None)
def _overloads(name: str) -> tuple[torch._ops.OpOverload, ...]:
    """The overloads of ATen op ``name`` (none for a name ATen does not have: also none for the namespace
    object's own attributes, such as ``__eq__``, which a tensor method of that name reaches)."""
    packet = getattr(torch.ops.aten, name, None) if name.isidentifier() else None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return ()
    return tuple(getattr(packet, overload) for overload in packet.overloads())


def _schemas(name: str) -> tuple[torch._C.FunctionSchema, ...]:
    return tuple(overload._schema for overload in _overloads(name))


@lru_cache(maxsize=None)
def _tags(name: str) -> frozenset:
    return frozenset(tag for overload in _overloads(name) for tag in overload.tags)


def aten_name(op: str, target: Any) -> str | None:
    """The ATen op a call of ``target`` reaches by name (``op`` ``call_function`` or ``call_method``), or None for a
    function outside torch's bindings (the operator module, a user's function)."""
    if op == "call_method":
        return target if isinstance(target, str) else None
    if op != "call_function":
        return None
    if getattr(target, "__module__", None) not in _TORCH_MODULES:
        try:
            return _name_in_torch(target)
        except TypeError:   # unhashable target
            return None
    name = getattr(target, "__name__", None)
    return name if isinstance(name, str) else None


@lru_cache(maxsize=4096)
def _name_in_torch(target: Any) -> str | None:
    """The name under which ``torch`` or ``torch.nn.functional`` holds ``target``, a function defined elsewhere:
    a wrapper another library put in place of torch's binding (torch_geometric replaces ``torch.select`` and
    ``torch.index_select`` on import). A call of it is a call of that op, a view where ``select`` is one."""
    for namespace in (torch, torch.nn.functional):
        for name, value in vars(namespace).items():
            if value is target and not name.startswith("_"):
                return name
    return None


def _is_tensors(t: torch._C.JitType) -> bool:
    return isinstance(t, torch.TensorType) or isinstance(t, torch.ListType) and isinstance(
        t.getElementType(), torch.TensorType)


def _returns_alias(schema: torch._C.FunctionSchema) -> bool:
    """A tensor result of ``schema`` shares memory with an argument (TorchScript's list overloads aside)."""
    return any(r.alias_info is not None and not r.alias_info.is_write and _is_tensors(r.type) for r in schema.returns)


def _writes_first(schema: torch._C.FunctionSchema) -> bool:
    """``schema`` writes into its first positional argument, a tensor (``sort.int(int[](a!) self)``, TorchScript's
    sort of a list, is none)."""
    first = schema.arguments[0] if schema.arguments else None
    return (first is not None and not first.kwarg_only and isinstance(first.type, torch.TensorType)
            and first.alias_info is not None and first.alias_info.is_write)


def _python_in_place(name: str) -> bool:
    """Python's augmented assignments: ``operator.iadd`` / ``__iadd__`` are the in-place forms of ``add``."""
    if name.startswith("__i") and name.endswith("__"):
        return hasattr(operator, f"__{name[3:]}")
    return name.startswith("i") and hasattr(operator, f"__{name[1:]}__")


@lru_cache(maxsize=4096)
def target_writes(op: str, target: Any) -> bool:
    """Whether calling ``target`` (without ``out=`` / ``inplace=``) writes into its first operand."""
    if op == "call_function" and getattr(target, "__module__", None) == "_operator":
        return target is operator.setitem or _python_in_place(target.__name__)
    if op == "call_method" and target == "__setitem__":
        return True
    name = aten_name(op, target)
    if name is None:
        return False
    schemas = _schemas(name)
    if schemas:
        return any(_writes_first(s) for s in schemas if s.overload_name != "out")
    if name.startswith("__"):
        return _python_in_place(name)
    return name.endswith("_")   # PyTorch's naming of in-place variants, for methods ATen does not know


def writes(node: fx.Node) -> bool:
    """Whether ``node`` writes into an operand: an in-place op (``add_``, ``x += y``, ``x[i] = v``), or a call
    with ``out=`` or ``inplace=True``."""
    op = node.op
    if op != "call_function" and op != "call_method":
        return False
    kwargs = node.kwargs
    if kwargs and (kwargs.get("inplace") is True or kwargs.get("out") is not None):   # (out=None is no output)
        return True
    try:
        return target_writes(op, node.target)
    except TypeError:   # unhashable target
        return False


def _indexes(op: str, target: Any) -> bool:
    """``x[i]``, ``x.__getitem__(i)``, ``getattr(x, "T")``: an element of a tuple, or a view."""
    return op == "call_function" and target in (operator.getitem, getattr) or op == "call_method" and \
        target == "__getitem__"


@lru_cache(maxsize=4096)
def target_may_alias(op: str, target: Any) -> bool:
    """Whether a call of ``target`` may return one of its operands or a view of one (``op`` as in :func:`writes`)."""
    if _indexes(op, target):
        return True   # an element of a tuple, a view (x[0], x.T)
    if target_writes(op, target):
        return True   # an in-place op returns its receiver
    name = aten_name(op, target)
    if name is None:
        return False
    if name in _RETURN_SELF_METHODS and op == "call_method" or name in _UNANNOTATED_ALIASES \
            or name in _UNANNOTATED_ALIASES_OF_ANY:
        return True
    return (any(_returns_alias(s) for s in _schemas(name))
            or torch.Tag.maybe_aliasing_or_mutating in _tags(name))


def may_alias(node: fx.Node) -> bool:
    """Whether ``node`` may return (a view of) one of its tensor operands instead of a new tensor."""
    if node.op == "call_module" or writes(node):
        return True
    if node.op != "call_function" and node.op != "call_method":
        return False
    try:
        return target_may_alias(node.op, node.target)
    except TypeError:
        return False


#: copies that place their operands' elements by position alone, as views do
_MOVING_COPIES = frozenset(("cat", "stack", "clone", "repeat"))
#: casts: they may return their operand (:data:`_RETURN_SELF_METHODS`) but change its values' type
_CASTS = _RETURN_SELF_METHODS | {"to", "type_as"}


def is_cast(node: fx.Node) -> bool:
    """A cast (``x.float()``, ``x.to(...)``): it may return its operand, or copy it into another dtype or device."""
    return aten_name(node.op, node.target) in _CASTS


def moves_elements(node: fx.Node) -> bool:
    """Whether ``node`` only places its first operand's elements (``reshape``, ``t``, ``x[i]``, ``cat``): applied to
    any tensor of that shape it moves that tensor's elements the same way. Not a cast, and not ``as_strided``,
    which reads the operand's strides."""
    if node.op == "call_function" and node.target is operator.getitem:
        return True
    name = aten_name(node.op, node.target)
    if name in _CASTS or (name or "").startswith("as_strided"):
        return False
    return is_view(node) or name in _MOVING_COPIES


@lru_cache(maxsize=4096)
def _aliases_first_only(op: str, target: Any) -> bool:
    """Whether a call of ``target`` that may alias shares memory with its first operand alone: no other argument
    of its schemas shares an alias set with a result."""
    if _indexes(op, target):
        return True
    name = aten_name(op, target)
    if name is None or name in _UNANNOTATED_ALIASES_OF_ANY:
        return False
    for schema in _schemas(name):
        results = set().union(*(r.alias_info.before_set for r in schema.returns if r.alias_info is not None))
        if any(a.alias_info is not None and a.alias_info.before_set & results for a in schema.arguments[1:]):
            return False
    return True


def aliased_operands(node: fx.Node) -> list[fx.Node]:
    """The operands whose memory the result of ``node`` (:func:`may_alias`) may share: a view's first operand,
    the tensor it views (not the index of ``h[index]``); any operand of a module, of an in-place op (``out=``),
    of a call that takes its tensors as a list (``torch.meshgrid([x, y])``)."""
    first = node.args[0] if node.args else None
    if node.op != "call_module" and isinstance(first, fx.Node) and not writes(node):
        try:
            if _aliases_first_only(node.op, node.target):
                return [first]
        except TypeError:   # unhashable target
            pass
    return node.all_input_nodes


def is_view(node: fx.Node) -> bool:
    """A call that returns a view of its first operand and writes nothing (``x.t()``, ``x.reshape(...)``,
    ``W.T``): merging two equal ones is legal, and it costs no arithmetic."""
    if node.op == "call_function" and node.target is getattr:
        return len(node.args) == 2 and isinstance(node.args[1], str) and node.args[1] in ("T", "mT", "H", "mH")
    return not writes(node) and target_is_view(node.op, node.target)


def target_is_view(op: str, target: Any) -> bool:
    """:func:`is_view` for every call of ``target`` but ``getattr`` (``out=`` and ``inplace=True`` are looked at
    per call)."""
    if op != "call_function" and op != "call_method" or target is operator.getitem:
        return False
    try:
        return not target_writes(op, target) and target_may_alias(op, target) and aten_name(op, target) is not None
    except TypeError:   # unhashable target
        return False


def _decomposes(overload: torch._ops.OpOverload) -> bool:
    """Whether ``overload`` is a composite (CompositeImplicitAutograd) that runs as other ops."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(), "CompositeImplicitAutograd")
    except RuntimeError:   # a TorchScript overload (``split.str``) the dispatcher does not hold: no tensor reaches it
        return False


@lru_cache(maxsize=4096)
def target_shape_static(op: str, target: Any) -> bool:
    """Whether the result of a call of ``target`` has a shape that follows from its operands' shapes and its
    Python arguments: it reaches an ATen op (:func:`aten_name`) none of whose overloads is tagged
    ``data_dependent_output`` or ``dynamic_output_shape``, or decomposes into other ops, which may be
    (``where(mask)`` runs ``nonzero``)."""
    name = aten_name(op, target)
    overloads = _overloads(name) if name is not None else ()
    if not overloads or _tags(name) & {torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape}:
        return False
    return not any(_decomposes(overload) for overload in overloads)


def _is_tensor_argument(t: torch._C.JitType) -> bool:
    return isinstance(t, torch.TensorType) or isinstance(t, torch.OptionalType) and isinstance(
        t.getElementType(), torch.TensorType)


@lru_cache(maxsize=4096)
def takes_three_tensors(op: str, target: Any) -> bool:
    """Whether some overload of ``target`` takes three or more tensors (``where``, ``lerp``, ``addcmul``, and
    ``clamp`` with tensor bounds): a rewrite that moves a gather through a binary op does not cover it."""
    name = aten_name(op, target)
    return name is not None and any(
        sum(_is_tensor_argument(a.type) and not (a.alias_info and a.alias_info.is_write) for a in s.arguments) >= 3
        for s in _schemas(name))   # (an out= tensor is no operand)


#: functions of ``torch.nn.functional`` that draw random numbers and reach ATen under other names
RANDOM_UNDER_OTHER_NAMES = frozenset(("dropout1d", "dropout2d", "dropout3d"))


def named_random(name: str) -> bool:
    """Whether the op named ``name`` may draw random numbers (ATen's ``nondeterministic_seeded`` tag)."""
    return name in RANDOM_UNDER_OTHER_NAMES or torch.Tag.nondeterministic_seeded in _tags(name)


@lru_cache(maxsize=4096)
def target_draws_random_numbers(op: str, target: Any) -> bool:
    """Whether calls of ``target`` may draw random numbers (:func:`named_random`)."""
    name = aten_name(op, target)
    return name is not None and named_random(name)


@lru_cache(maxsize=4096)
def _factory(op: str, target: Any) -> bool:
    """``target`` makes a new tensor from constant arguments: its schema takes no tensor (``zeros``,
    ``arange``, ``tensor``), or it is the ``*_like`` / ``new_*`` form of such a factory, whose tensor
    argument gives only the shape, dtype and device."""
    name = aten_name(op, target)
    if name is None:
        return False
    base = name.removesuffix("_like").removeprefix("new_")
    if base != name and (name.endswith("_like") or op == "call_method"):
        name = base
    schemas = [s for s in _schemas(name) if s.overload_name != "out"]
    if not schemas or target_draws_random_numbers(op, target):
        return False
    return any(not any(isinstance(a.type, torch.TensorType) for a in s.arguments)
               and len(s.returns) == 1 and isinstance(s.returns[0].type, torch.TensorType) for s in schemas)


#: legacy constructors: ``torch.Tensor([1, 2])`` copies its data (a factory), ``torch.Tensor(n, d)`` is
#: uninitialized memory of that size (``passes/row_writes.py``)
LEGACY_CONSTRUCTORS = (torch.Tensor, torch.FloatTensor, torch.DoubleTensor, torch.HalfTensor, torch.BFloat16Tensor,
                       torch.LongTensor, torch.IntTensor)


def target_makes_tensor(op: str, target: Any) -> bool:
    """Whether some calls of ``target`` make a new tensor from constant arguments (:func:`makes_tensor`)."""
    if op == "call_function" and target in LEGACY_CONSTRUCTORS:
        return True
    return _factory(op, target) or op == "call_method" and target == "new"


def makes_tensor(node: fx.Node) -> bool:
    """Whether ``node`` makes a new tensor from constant arguments (zeros, ones, full, arange, empty, ...,
    their ``*_like`` and ``x.new_*`` forms, the legacy ``x.new(n, d)``); its values may be uninitialized
    (see :func:`is_factory`). ``torch.as_tensor(h)`` of a computed ``h`` is none: it may return ``h``."""
    if node.op not in ("call_function", "call_method") or node.kwargs.get("out") is not None:
        return False
    try:
        if not target_makes_tensor(node.op, node.target) or node.target in LEGACY_CONSTRUCTORS:
            return False
    except TypeError:   # unhashable target
        return False
    shaped_like = node.op == "call_method" or (aten_name(node.op, node.target) or "").endswith("_like")
    constants = (node.args[1:] if shaped_like else node.args, node.kwargs)
    return not _has_node(constants)


def _has_node(value: Any) -> bool:
    found: list[fx.Node] = []
    fx.node.map_arg(value, found.append)
    return bool(found)


def uninitialized(node: fx.Node) -> bool:
    """ATen names its factories of uninitialized memory ``empty*`` (``empty``, ``empty_like``, ``new_empty``);
    the legacy ``x.new(n, d)`` is one too."""
    name = aten_name(node.op, node.target) or ""
    return name == "new" or name.removeprefix("new_").startswith("empty")


def is_factory(node: fx.Node) -> bool:
    """Deterministic tensor factories (``torch.zeros(8)`` or ``x.new_zeros(8)`` once per neuron): equal calls,
    equal values."""
    if node.op == "call_function" and node.target in LEGACY_CONSTRUCTORS:
        # torch.LongTensor([3]) copies its data; LongTensor(3) is uninitialized
        return len(node.args) == 1 and isinstance(node.args[0], (list, tuple)) and not node.kwargs
    return makes_tensor(node) and not uninitialized(node)


#: the name the tracers give a tensor that ``forward`` builds from Python values alone; a union prefixes each
#: sample's with ``_sample{s}_`` (:mod:`dynamo_relational.union`)
_FORWARD_CONSTANT = re.compile(r"(_sample\d+_)?_tensor_constant\d+$")


#: the meta key of a node of a union of samples (``dynamo_relational/union.py``): the sample it belongs to
SAMPLE = "rel_sample"


def is_sample_constant(node: Any) -> bool:
    """Whether ``node`` reads one sample's own constant in a union of samples (its edge counts, a tensor its
    ``forward`` built): every sample has its own, where they share the model's parameters."""
    return isinstance(node, fx.Node) and node.op == "get_attr" and SAMPLE in node.meta


def is_forward_constant(node: Any) -> bool:
    """Whether ``node`` reads a tensor that ``forward`` built from Python values alone (``torch.tensor([w])``),
    recorded as a constant of the graph; a model's parameters and buffers never are."""
    return isinstance(node, fx.Node) and node.op == "get_attr" and isinstance(node.target, str) \
        and is_forward_constant_name(node.target)


def is_forward_constant_name(target: str) -> bool:
    """Whether a get_attr of ``target`` reads a tensor that ``forward`` built from Python values alone."""
    return _FORWARD_CONSTANT.match(target) is not None


def zeros_call(op: str, target: Any) -> bool:
    """Whether a call of ``target`` (``op``: ``call_function`` or ``call_method``) makes a new tensor of zeros:
    ``torch.zeros``, ``torch.zeros_like``, ``x.new_zeros``."""
    return aten_name(op, target) in ("zeros", "zeros_like", "new_zeros")


def calls(op: str, target: Any, name: str) -> bool:
    """Whether a node of ``op`` and ``target`` calls the method ``name`` (``x.name(...)``) or ``torch.name``."""
    return (op == "call_method" and target == name) or (op == "call_function" and target is getattr(torch, name, None))


def is_zeros(node: Any) -> bool:
    """A new tensor of zeros on every call (an accumulator's start): ``torch.zeros(...)``,
    ``torch.zeros_like(...)``, ``x.new_zeros(...)``, or the constant the fast front-end records for a tensor that
    ``forward`` builds from Python values alone (``_tensor_constant*``; a model's buffers are not)."""
    if not isinstance(node, fx.Node):
        return False
    if node.op in ("call_function", "call_method"):
        return zeros_call(node.op, node.target) and makes_tensor(node)
    value = node.meta.get("example_value")
    return is_forward_constant(node) and isinstance(value, torch.Tensor) and not value.any()
