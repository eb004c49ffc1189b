"""What a model holds besides its parameters, buffers and submodules, which tracing reads as Python data:
checked after tracing (``forward`` must not store traced values in it) and before each call of the fast
front-end's compiled module (a replaced or changed attribute traces again).

:class:`HeldAttributes` covers the modules' own attributes (tensors by identity and version, Python scalars by
value, lists and dicts); :class:`PlainObjects` the plain Python objects they reach (a tree's nodes).
"""
from __future__ import annotations

import itertools
import operator
import types
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn

from .forward_constants import tensor_version


def is_proxy(value: Any) -> bool:
    """A value of the tracer's (its proxies)."""
    return isinstance(value, fx.Proxy)


class HeldAttributes:
    """What the model's modules hold as plain attributes (neither parameter, buffer nor submodule), which
    tracing reads as Python data: tensors (``self.edge_index = ...``, also as items of a list, tuple or dict
    attribute), by identity and version counter, and Python scalars (``self.temperature = 0.5``, Dropout's
    ``p``), by value.

    Ops on them run once, at compile time, and their results are frozen into the graph
    (``deg = self.adj.sum(1)``). Replacing one (``model.adj = other``, ``model.drop.p = 0.2``) or changing a
    tensor in place (``model.adj.mul_(2)``) would leave the graph computing with the old values:
    :meth:`changed` tells, and the next call traces again, as Dynamo would recompile. (Containers of Python
    data, such as neighbour lists, are not compared: the contract freezes them.)"""

    def __init__(self, model: nn.Module):
        self.held = []   # (module, attribute name, key or _WHOLE, tensor, version) for tensors
        self.scalars = []   # (module, attribute name, value) for Python scalars
        self.containers = []   # (module, attribute name, list or dict, a shallow copy of it)
        self.inner = []   # (a list or dict item of such a container, a shallow copy of it)
        # The graph reads parameters and buffers live, so aliases of them (``self.weights = [self.lin.weight]``)
        # are not held: an optimizer step bumps their versions and must not trace again.
        registered = {id(t) for t in itertools.chain(model.parameters(), model.buffers())}
        for module in model.modules():
            for name, value in vars(module).items():
                if name in MODULE_STATE:
                    continue
                if type(value) in _SCALARS:
                    self.scalars.append((module, name, value))
                elif isinstance(value, torch.Tensor):
                    if id(value) not in registered:
                        self.held.append((module, name, _WHOLE, value, tensor_version(value)))
                elif isinstance(value, (list, tuple, dict)):
                    item_types = set(map(type, _items(value)))   # (found in C: a long list of Python data)
                    if isinstance(value, (list, dict)):
                        self.containers.append((module, name, value, value.copy()))
                        if not _MUTABLE_TYPES.isdisjoint(item_types):
                            self.inner += [(item, item.copy()) for item in _items(value) if type(item) in _MUTABLE]
                    if not any(issubclass(t, torch.Tensor) for t in item_types):
                        continue
                    for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
                        if isinstance(item, torch.Tensor) and id(item) not in registered:
                            self.held.append((module, name, key, item, tensor_version(item)))

    def held_ids(self) -> set[int]:
        """The ids of the tensors held (graph constants that are the model's own, returned as themselves)."""
        return {id(tensor) for _, _, _, tensor, _ in self.held}

    def changed(self, scalars: bool = True) -> tuple[str, str] | None:
        """(the first attribute replaced or changed in place since, as ``"Model.adj"``; how), or None."""
        for module, name, key, tensor, version in self.held:
            value: Any = vars(module).get(name)
            if key is not _WHOLE:
                try:
                    value = value[key]
                except (LookupError, TypeError):
                    value = None
            how = "replaced" if value is not tensor \
                else "changed in place" if tensor_version(tensor) != version else None
            if how:
                return f"{type(module).__name__}.{name}" + ("" if key is _WHOLE else f"[{key!r}]"), how
        for module, name, held in self.scalars if scalars else ():
            value = vars(module).get(name, _WHOLE)
            if value is not held and (type(value) is not type(held) or value != held):
                return f"{type(module).__name__}.{name}", f"changed from {held!r} to {value!r}"
        return None

    def stored_proxy(self, traced: Callable[[Any], bool] = is_proxy) -> tuple[str, Any] | None:
        """The first list or dict attribute (as ``"Model.history"``) that now holds a traced value (one level
        deep), and that value: ``forward`` appended one to it, or stored one in it, while tracing."""
        for module, name, container, saved in self.containers:
            for item in _new_items(container, saved):
                found = traced_in(item, traced)
                if found is not None:
                    return f"{type(module).__name__}.{name}", found
        return None

    def restore(self) -> None:
        """Put back the lists and dicts as they were (and the lists and dicts they hold, one level deep, as far as
        :meth:`stored_proxy` looks), and the held tensors where they were replaced (changes made in place stay)."""
        for container, saved in [(c, saved) for _, _, c, saved in self.containers] + self.inner:
            if isinstance(container, list):
                container[:] = saved
            else:
                container.clear()
                container.update(saved)
        for module, name, key, tensor, _ in self.held:
            if key is _WHOLE:
                vars(module)[name] = tensor
            else:
                holder: Any = vars(module).get(name)
                if isinstance(holder, (list, dict)):
                    try:
                        holder[key] = tensor   # type: ignore[call-overload]
                    except IndexError:
                        pass


def _new_items(container: list | dict, saved: list | dict) -> Any:
    """The items of ``container`` that may hold a value made since ``saved``, its shallow copy, was taken: an item
    still in its place holds none, unless it is a list or dict (changed in place), so a long list of Python data
    is compared by identity instead of walked."""
    if isinstance(container, dict):
        assert isinstance(saved, dict)
        return (v for k, v in container.items() if saved.get(k, _ABSENT) is not v or type(v) in _MUTABLE)
    if len(container) != len(saved):
        return container
    if all(map(operator.is_, container, saved)) and _MUTABLE_TYPES.isdisjoint(map(type, container)):
        return ()   # (checked in C)
    return (item for item, before in zip(container, saved) if item is not before or type(item) in _MUTABLE)


def _items(container: list | tuple | dict) -> Any:
    return container.values() if isinstance(container, dict) else container


#: nn.Module's own state, what every module has: its parameters, buffers and submodules (the graph reads those
#: as get_attr nodes), its train/eval flag (:meth:`RelationalModule._state` keys the graphs by it) and its hooks
#: (which tracing refuses or records: :func:`~dynamo_relational.module_hooks.refuse_unrecorded_hooks`)
MODULE_STATE = frozenset(vars(nn.Module()))
#: the dicts of that state where ``nn.Module.__setattr__`` stores a tensor or module assigned to an attribute
REGISTRIES = frozenset(("_parameters", "_buffers", "_modules"))


class PlainObjects:
    """The plain Python objects that the modules reach through their attributes (a tree's nodes, a sample's
    objects), with their attributes as they were before tracing: to find a traced value that ``forward``
    stored on one (``node.state = (c, h)``), which tracing would leave there, and to undo that."""

    #: objects looked at, at most (the structure of a large grounding stays cheap to walk)
    LIMIT = 200_000

    def __init__(self, model: nn.Module):
        self.saved: list[tuple[Any, tuple, dict]] = []   # (object, its path, its attributes before tracing)
        seen: set[int] = set()
        stack: list[tuple[Any, tuple]] = [(value, (type(module).__name__, f".{name}")) for module in model.modules()
                 for name, value in vars(module).items() if name not in MODULE_STATE]
        inert = _INERT_TUPLES
        if len(inert) > self.LIMIT:
            inert.clear()
        while stack and len(seen) < self.LIMIT:
            value, path = stack.pop()
            kind = type(value)
            if kind in _SCALARS or id(value) in seen or isinstance(value, (torch.Tensor, nn.Module, type)):
                continue
            seen.add(id(value))
            if kind is list or kind is tuple:
                # (checked in C: most lists hold numbers only, or tuples walked before)
                if _SCALARS.issuperset(map(type, value)) or all(map(inert.__contains__, map(id, value))) or \
                        kind is tuple and all(type(v) in _SCALARS or id(v) in inert for v in value):
                    if kind is tuple:
                        inert[id(value)] = value
                    continue
                stack.extend((v, (path, f"[{i}]")) for i, v in enumerate(value)
                             if type(v) not in _SCALARS and id(v) not in inert)
            elif kind is dict:
                stack.extend((v, (path, f"[{k!r}]")) for k, v in value.items() if type(v) not in _SCALARS)
            elif hasattr(value, "__dict__") and not callable(value) and not isinstance(value, types.ModuleType):
                attributes = getattr(value, "__dict__")
                if type(attributes) is not dict:   # (an object that is no plain one)
                    continue
                self.saved.append((value, path, dict(attributes)))
                stack.extend((v, (path, f".{k}")) for k, v in attributes.items() if type(v) not in _SCALARS)

    def stored_proxy(self, traced: Callable[[Any], bool] = is_proxy) -> tuple[str, Any] | None:
        """The first attribute of such an object (as ``"Model.trees[0].children[1].state"``) that now holds a
        traced value, also inside a list, tuple or dict, and that value."""
        for value, path, _ in self.saved:
            for name, item in vars(value).items():
                found = traced_in(item, traced)
                if found is not None:
                    return _path_text(path) + f".{name}", found
        return None

    def restore(self) -> None:
        for value, _, before in self.saved:
            attributes = vars(value)
            attributes.clear()
            attributes.update(before)


ModuleAttributes = list[tuple[nn.Module, dict[str, Any]]]


def module_attributes(model: nn.Module) -> ModuleAttributes:
    """Each module of ``model`` with a copy of its attributes, to find what ``forward`` assigns."""
    return [(module, dict(vars(module))) for module in model.modules()]


def assigned_traced_values(before: ModuleAttributes, traced: Callable[[Any], bool] = is_proxy
                           ) -> list[tuple[nn.Module, str, dict[str, Any]]]:
    """The attributes assigned since ``before`` (new, replaced, or nn.Module's registries) that hold a ``traced``
    value (also as an item of a list, tuple or dict: ``self.outputs = []`` then ``self.outputs.append(h)``), as
    (module, name, that module's attributes before)."""
    return [(module, name, held) for module, held in before for name, value in vars(module).items()
            if (name not in held or held[name] is not value or name in REGISTRIES)
            and traced_in(value, traced) is not None]


def take_out(assigned: list[tuple[nn.Module, str, dict[str, Any]]]) -> None:
    """Put the attributes :func:`assigned_traced_values` found back as they were (remove the new ones)."""
    for module, name, held in assigned:
        if name in held:
            vars(module)[name] = held[name]
        else:
            del vars(module)[name]


def traced_in(item: Any, traced: Callable[[Any], bool]) -> Any:
    """``item`` if it is a ``traced`` value, else the first one in the list, tuple or dict it is."""
    if traced(item):
        return item
    if type(item) in (list, tuple, dict):
        return next((i for i in (item.values() if type(item) is dict else item) if traced(i)), None)
    return None


def _path_text(path: tuple) -> str:
    parts = []
    while isinstance(path, tuple):
        path, part = path
        parts.append(part)
    return path + "".join(reversed(parts))
#: the Python scalars that :class:`_Attributes` compares
_SCALARS = frozenset((int, float, bool, str, complex, type(None)))
#: the containers whose items can change in place
_MUTABLE = (list, dict)
_MUTABLE_TYPES = frozenset(_MUTABLE)
#: id -> tuple, of the tuples seen to hold only scalars and such tuples, at any depth: they reach no plain object,
#: ever (a tuple cannot change), so the walk skips them (a model's program as tuples of numbers, walked once
#: instead of at every trace); kept alive here so that their ids stay theirs
_INERT_TUPLES: dict[int, tuple] = {}
#: the key of a tensor held by the attribute itself, not by an item of a list, tuple or dict
_WHOLE = object()
#: a dict's value where it had none
_ABSENT = object()
