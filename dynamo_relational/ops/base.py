"""The neuron-op abstraction shared by the grouping and vectorizing passes.

A *neuron op* is one FX node seen as a possible member of a group: its family
(elementwise, matmul, gather, aggregation, ...), a hashable ``key`` (everything
two members must agree on: target, constant arguments, operand shapes and
dtypes), its tensor ``operands`` and the per-member ``consts`` that may differ
between members of one group (gather indices, scalar offsets).

A family ``describe``s a node (returning a :class:`NeuronOp`, or a string that
says why the node cannot be grouped) and ``emit``s one vectorized node for a
whole group through a :class:`~dynamo_relational.passes.vectorize.GroupBuilder`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.fx as fx

if TYPE_CHECKING:
    from dynamo_relational.passes.vectorize import GroupBuilder


@dataclass(frozen=True, eq=False, init=False)
class TensorInfo:
    """Static shape, dtype and device of one FX node's tensor value.

    Interned: equal infos are one object, so comparing and hashing them (which
    the passes do a few times per FX node) is by identity."""
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    def __new__(cls, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> "TensorInfo":
        key = (tuple(shape), dtype, device)
        info = _INTERNED.get(key)
        if info is None:
            info = _INTERNED[key] = super().__new__(cls)
            for name, value in zip(("shape", "dtype", "device"), key):
                object.__setattr__(info, name, value)
            n = 1
            for s in key[0]:
                n *= s
            # computed once per distinct info: the passes ask for them once or more per FX node
            object.__setattr__(info, "rank", len(key[0]))
            object.__setattr__(info, "numel", n)
            object.__setattr__(info, "number", not key[0] and not (key[1].is_floating_point or key[1].is_complex))
        return info

    def __reduce__(self):
        return TensorInfo, (self.shape, self.dtype, self.device)

    # ``rank`` (len(shape)), ``numel`` (prod(shape)) and ``number`` (0-dim and integer or boolean: PyTorch
    # reads it as a number where a call takes one) are plain attributes set by __new__, not fields: they
    # follow from the shape and dtype.
    if TYPE_CHECKING:
        rank: int
        numel: int
        number: bool


_INTERNED: dict[tuple, TensorInfo] = {}


def tensor_info(node: Any) -> TensorInfo | None:
    """Shape/dtype/device of ``node`` from Dynamo's fake value; None if not one static tensor."""
    if not isinstance(node, fx.Node):
        return None
    cached = node.meta.get("rel_info", False)
    if cached is not False:
        return cached
    info = node.meta["rel_info"] = value_info(node.meta.get("example_value", node.meta.get("val")))
    return info


def value_info(value: Any) -> TensorInfo | None:
    """Shape/dtype/device of a (real or fake) value; None if not one tensor of static shape."""
    if isinstance(value, torch.Tensor) and not value.is_sparse:
        shape = tuple(value.shape)
        try:   # an info seen before (a symbolic size cannot be hashed, and is never interned)
            info = _INTERNED.get((shape, value.dtype, value.device))
        except TypeError:
            return None
        if info is not None:
            return info
        if all(type(s) is int for s in shape):
            return TensorInfo(shape, value.dtype, value.device)
    return None


@dataclass(eq=False, slots=True)
class NeuronOp:
    node: fx.Node
    family: "OpFamily"
    key: tuple
    operands: tuple            # fx.Node (or None for an absent optional operand), or terms
    info: TensorInfo
    consts: tuple = ()         # per-member values allowed to differ within a group
    template: Any = None       # family-specific data needed by emit()

    @property
    def variadic(self) -> bool:
        return self.family.variadic


class OpFamily:
    """One family of neuron ops: how to recognise a member and vectorize a group."""
    name: str = "?"
    #: operands are a variable-length list of terms (aggregations, stacks)
    variadic: bool = False
    #: every result is a new tensor, never an operand or a view of one (so writing into it changes nothing else);
    #: calls that :func:`~dynamo_relational.ops.facts.may_alias` still may (a cast, dropout outside training)
    fresh: bool = False

    def describe(self, node: fx.Node) -> NeuronOp | str:
        raise NotImplementedError

    def member_numel(self, op: NeuronOp) -> int:
        """The size that makes ``op`` "large" (see ``max_member_numel``): its output; for a
        variadic op (a stack or aggregation), its largest term."""
        if not self.variadic:
            return op.info.numel
        infos = set(map(tensor_info, op.operands))   # interned: thousands of terms, a few infos
        return max((t.numel for t in infos if t is not None), default=0)

    def emit(self, members: Sequence[NeuronOp], b: "GroupBuilder") -> fx.Node | None:
        """One node computing all members, shape [len(members), *member_shape].

        Returns None when this particular group cannot be vectorized (the
        members are then emitted one by one, with a logged reason).
        """
        raise NotImplementedError


@dataclass
class Registry:
    """Which family describes a call: the tables ``register`` fills, then, for a target outside
    them, the families' ``resolve`` hooks (``register_resolver``), asked once per target."""
    functions: dict[Any, OpFamily] = field(default_factory=dict)
    methods: dict[str, OpFamily] = field(default_factory=dict)
    #: ``resolve(op, target)`` of families that recognise targets by what torch says of them: the family of
    #: every call of ``target``, a function of the node giving the family of some of its calls, or None
    resolvers: list[Callable] = field(default_factory=list)
    #: what the resolvers answered, per target (op -> target -> answer)
    _resolved: dict[str, dict] = field(default_factory=lambda: {"call_function": {}, "call_method": {}})

    def family_of(self, node: fx.Node) -> OpFamily | None:
        op, target = node.op, node.target
        if op == "call_function":
            try:
                family = self.functions.get(target)
            except TypeError:  # unhashable target
                return None
        elif op == "call_method" and isinstance(target, str):
            family = self.methods.get(target)
        else:
            return None
        if family is not None:
            return family
        found = self.resolved(op, target)
        return found if found is None or isinstance(found, OpFamily) else found(node)

    def knows(self, op: str, target: Any) -> bool:
        """Whether some calls of ``target`` (``op`` ``call_function`` or ``call_method``) belong to a family."""
        table = self.functions if op == "call_function" else self.methods
        return table.get(target) is not None or self.resolved(op, target) is not None

    def per_call(self, op: str, target: Any) -> bool:
        """Whether the family of a call of ``target`` depends on the call's arguments (``torch.max(a, b)`` is
        elementwise, ``torch.max(a)`` no op of the catalog): what is known per target is not per call."""
        table = self.functions if op == "call_function" else self.methods
        try:
            if table.get(target) is not None:
                return False
        except TypeError:  # unhashable target
            return False
        found = self.resolved(op, target)
        return found is not None and not isinstance(found, OpFamily)

    def resolved(self, op: str, target: Any):
        """What the resolvers say of ``target`` (see :attr:`resolvers`), asked once per target."""
        cache = self._resolved[op]
        try:
            return cache[target]
        except KeyError:
            pass
        found = None
        for resolve in self.resolvers:
            found = resolve(op, target)
            if found is not None:
                break
        if len(cache) > 4096:   # targets are few; a bound keeps a long-lived process from collecting them
            cache.clear()
        cache[target] = found
        return found


REGISTRY = Registry()


def register(family: OpFamily, functions: Sequence[Callable] = (), methods: Sequence[str] = ()) -> OpFamily:
    """Make ``family`` the describer of calls of ``functions`` and ``methods``; each has one family."""
    tables: tuple[tuple[dict[Any, OpFamily], Sequence[Any]], ...] = ((REGISTRY.functions, functions),
                                                                     (REGISTRY.methods, methods))
    for table, targets in tables:
        for target in targets:
            if table.setdefault(target, family) is not family:
                raise ValueError(f"{target!r} already belongs to the {table[target].name} family, not {family.name}")
    return family


def register_resolver(resolve: Callable) -> None:
    """Ask ``resolve(op, target)`` about targets outside the tables (see :attr:`Registry.resolvers`)."""
    REGISTRY.resolvers.append(resolve)


def node_args(node: fx.Node, names: Sequence[str]) -> dict[str, Any] | None:
    """Positional and keyword arguments of ``node`` by name; None if unknown kwargs appear."""
    out = dict(zip(names, node.args))
    if len(node.args) > len(names):
        return None
    for k, v in node.kwargs.items():
        if k not in names or k in out:
            return None
        out[k] = v
    return out


def is_scalar(value: Any) -> bool:
    return type(value) in (int, float, bool)


def hashable_const(value: Any) -> bool:
    if value is None or type(value) in (int, float, bool, str, torch.dtype):
        return True
    if isinstance(value, (tuple, list)):
        return all(hashable_const(v) for v in value)
    return False


def freeze(value: Any) -> Any:
    """A hashable, type-exact form of a constant (1 and 1.0 and True stay distinct)."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(freeze(v) for v in value))
    return (type(value).__name__, value)
