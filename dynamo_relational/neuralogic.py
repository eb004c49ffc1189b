"""Bridge from PyNeuraLogic (the ``neuralogic`` package, Java engine) to scalar-granular PyTorch.

``to_module(model, built_dataset)`` reads the neural networks the engine grounded for every
sample and returns a ``torch.nn.Module`` that computes them one torch op per neuron, the form
``torch.compile(module, backend="relational")`` groups into vectorized nodes::

    import neuralogic.utils.data as data
    from neuralogic.core import Settings
    from dynamo_relational.neuralogic import to_module

    model, dataset = data.Mutagenesis()
    model.build(Settings(iso_value_compression=False, chain_pruning=False))
    built = model.build_dataset(dataset)
    module = to_module(model, built)                 # parameters = the model's current weights
    compiled = torch.compile(module, backend="relational")
    compiled()                                        # == model(built), one value per sample

Neuron semantics mirror the engine's forward pass (``Up`` neuron visitor of NeuraLogic 0.9):

* a fact neuron is its value;
* a weighted neuron feeds its offset (unless it is the engine's shared zero) and then
  ``weight.times(input)`` for each input into its activation state; an unweighted neuron feeds
  its inputs as they are. A weight index of -1 is the engine's unit weight (``x`` itself);
* ``times`` is the engine's matrix product: a scalar scales, a row vector times a column vector
  is a dot product, a matrix times a column vector is a matrix-vector product (values keep the
  engine's shapes: scalar ``()``, column vector ``(n, 1)``, row vector ``(1, n)``, matrix ``(r, c)``);
* the activation state is the one the engine evaluated: a combination (sum, avg, max, min,
  product, element product) followed by a transformation (sigmoid, tanh, relu, ...), a
  combination alone, or a transformation alone (exactly one input: the engine replaces a
  single-input aggregation by the identity).

Structure and function names are read from the engine's objects after one forward pass of the
engine over ``built_dataset`` (the same pass ``model(built_dataset)`` runs), because the engine
picks each neuron's final activation state (e.g. identity for a single-input average) only when it
first evaluates it. Every value (weights, facts) is read as the exact float64 the engine holds.

Anything the bridge does not know (a neuron kind, a combination or a transformation) raises
``UnsupportedNeuronError`` naming it; nothing is approximated. ``neuralogic`` is imported lazily:
``import dynamo_relational`` never needs Java.
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence, cast

import torch
from torch import nn

from .errors import RelationalError

__all__ = ["to_module", "read_program", "NeuraLogicModule", "Program", "Neuron", "UnsupportedNeuronError"]


class UnsupportedNeuronError(RelationalError, NotImplementedError):
    """A neuron, combination or transformation of the engine that the bridge does not mirror."""


# ----------------------------------------------------------------------------------------------
# The engine's functions, by Java class name.
# ----------------------------------------------------------------------------------------------

# Elementwise transformations, exactly as the engine defines them (``ElementWise`` subclasses),
# each ``f(x, leaky_relu_alpha)``. Sigmoid and tanh clip at |x| > 100 in the engine; torch's
# versions differ there by < 1e-43.
TRANSFORMATIONS: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "Identity": lambda x, alpha: x,
    "Sigmoid": lambda x, alpha: torch.sigmoid(x),
    "Tanh": lambda x, alpha: torch.tanh(x),
    "ReLu": lambda x, alpha: torch.relu(x),
    "LeakyReLu": lambda x, alpha: torch.nn.functional.leaky_relu(x, alpha),   # x > 0 ? x : alpha * x
    "Exponentiation": lambda x, alpha: torch.exp(x),
    "Logarithm": lambda x, alpha: torch.log(x),
    "SquareRoot": lambda x, alpha: torch.sqrt(x),
    "Inverse": lambda x, alpha: torch.reciprocal(x),
    "Reverse": lambda x, alpha: 1.0 - x,
    "Signum": lambda x, alpha: (x > 0).to(x.dtype),
    "LukasiewiczSigmoid": lambda x, alpha: torch.sigmoid(6.0 * x + 0.5),   # the engine's definition, despite the name
}

# Combinations (``Combination`` / ``Aggregation`` subclasses) over the list of fed values.
COMBINATIONS = ("Sum", "Average", "Maximum", "Minimum", "Product", "ElementProduct")


@dataclass(frozen=True)
class Neuron:
    """One engine neuron, as the module computes it.

    ``inputs`` index earlier neurons of the program; ``weights`` holds, per input, a weight
    index of the program or ``None`` for the unit weight; ``offset`` a weight index or ``None``.
    A fact neuron has no inputs and no functions: ``value`` is its flattened constant value, or
    ``offset`` the weight holding its learnable value (``value`` is ``None`` for computed neurons).
    ``shape`` is the shape of the engine's value: ``()`` scalar, ``(n, 1)`` / ``(1, n)`` vector,
    ``(r, c)`` matrix.
    """

    kind: str
    name: str
    inputs: tuple[int, ...]
    weights: tuple[int | None, ...] | None
    offset: int | None
    combination: str | None
    transformation: str | None
    shape: tuple[int, ...]
    value: tuple[float, ...] | None = None

    @property
    def is_fact(self) -> bool:
        return self.value is not None or (not self.inputs and self.combination is None and self.transformation is None)


@dataclass
class Weight:
    """One engine weight: flattened float64 value, shape, whether training changes it."""

    index: int
    name: str
    value: tuple[float, ...]
    shape: tuple[int, ...]
    learnable: bool


@dataclass
class Program:
    """Every sample's network, deduplicated (neurons shared between samples appear once)."""

    neurons: list[Neuron]
    weights: dict[int, Weight]
    outputs: list[int]            # the query neuron of each sample, in sample order
    targets: list[tuple[float, ...]]
    leaky_relu_alpha: float       # the engine's (static) LeakyReLu slope

    def count(self) -> dict[str, int]:
        return {"neurons": len(self.neurons), "facts": sum(n.is_fact for n in self.neurons),
                "edges": sum(len(n.inputs) for n in self.neurons), "weights": len(self.weights),
                "samples": len(self.outputs)}


# ----------------------------------------------------------------------------------------------
# Reading the engine's networks
# ----------------------------------------------------------------------------------------------

def _flat(value: Any) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """A Java ``Value`` as (row-major flattened doubles, shape)."""
    shape = tuple(int(s) for s in value.size())
    if not shape or shape[0] == 0:
        return (float(value.get(0)),), ()
    return tuple(float(x) for x in value.getAsArray()), shape


def _function_names(neuron: Any, classes: dict[str, Any]) -> tuple[str | None, str | None]:
    """(combination, transformation) class names of the activation state the engine evaluated."""
    state = neuron.getComputationView(0).getFcnState()
    if isinstance(state, classes["compound"]):
        combination, transformation = state.getCombination(), state.getTransformation()
    elif isinstance(state, classes["transformation"]):
        combination, transformation = None, state.getTransformation()
        if not isinstance(transformation, classes["elementwise"]) and \
                str(transformation.getClass().getSimpleName()) != "Identity":
            # e.g. max/avg/softmax applied to a single vector input: not mirrored
            raise UnsupportedNeuronError(
                f"neuron {neuron.getName()!s} ({neuron.getClass().getSimpleName()}): transformation "
                f"{transformation.getClass().getSimpleName()} applied to a single value is not supported")
    elif isinstance(state, classes["combination"]):
        combination, transformation = state.getCombination(), None
    else:
        raise UnsupportedNeuronError(
            f"neuron {neuron.getName()!s} ({neuron.getClass().getSimpleName()}): activation state "
            f"{state.getClass().getName()} is not supported")
    names = [None if f is None else str(f.getClass().getSimpleName()) for f in (combination, transformation)]
    return names[0], names[1]


def read_program(model: Any, built_dataset: Any) -> Program:
    """Read every sample's neural network of ``built_dataset`` (a ``BuiltDataset``) from the engine.

    Runs the engine's forward pass once (see the module docstring for why), reads neurons in
    the engine's topological order and deduplicates neurons shared between samples by identity.
    """
    import jpype   # (comes with the optional neuralogic, which this module does not need to import)
    from neuralogic.core.constructs.java_objects import ValueFactory

    samples = list(built_dataset)
    model(samples)   # the engine fixes each neuron's activation state when it first evaluates it

    pkg = "cz.cvut.fel.ida."
    classes = {
        "compound": jpype.JClass(pkg + "algebra.functions.CompoundState"),
        "transformation": jpype.JClass(pkg + "algebra.functions.Transformation$State"),
        "combination": jpype.JClass(pkg + "algebra.functions.Combination$State"),
        "elementwise": jpype.JClass(pkg + "algebra.functions.ElementWise"),
        "weighted": jpype.JClass(pkg + "neural.networks.structure.components.neurons.WeightedNeuron"),
        "fact": jpype.JClass(pkg + "neural.networks.structure.components.neurons.types.FactNeuron"),
        "simple": jpype.JClass(pkg + "neural.networks.structure.components.neurons.states.States$SimpleValue"),
    }
    is_zero = jpype.java.util.IdentityHashMap()   # the engine skips an offset that *is* its shared Value.ZERO
    is_zero.put(jpype.JClass(pkg + "algebra.values.Value").ZERO, jpype.JInt(0))

    ids = jpype.java.util.IdentityHashMap()   # Java neuron -> program index
    neurons: list[Neuron] = []
    weights: dict[int, Weight] = {}
    outputs: list[int] = []
    targets: list[tuple[float, ...]] = []

    def weight_index(weight: Any) -> int | None:
        index = int(weight.index)
        if index not in weights:
            value, shape = _flat(weight.value)
            weights[index] = Weight(index, str(weight.name), value, shape, bool(weight.isLearnable()))
        if index == -1 and weights[index].value == (1.0,) and not weights[index].learnable:
            return None   # the unit weight: 1 * x == x
        return index

    for sample in samples:
        java_sample = sample._java_sample
        network = java_sample.query.evidence
        for neuron in network.allNeuronsTopologic:
            if ids.containsKey(neuron):
                continue
            kind, name = str(neuron.getClass().getSimpleName()), str(neuron.getName())
            where = f"neuron {name} ({kind})"
            value = neuron.getComputationView(0).getValue()
            if value is None:
                raise UnsupportedNeuronError(f"{where}: the engine did not evaluate it")
            _, shape = _flat(value)
            state = neuron.getRawState()
            if isinstance(neuron, classes["fact"]) or isinstance(state, classes["simple"]):
                offset = getattr(neuron, "offset", None)
                if offset is not None and int(offset.index) >= 0 and bool(offset.isLearnable()):
                    # a learnable fact (template fact ``{w} f.`` or learnable_facts=True): its value is the weight
                    record = Neuron(kind, name, (), None, weight_index(offset), None, None, shape, None)
                else:
                    fact_value, shape = _flat(value)
                    record = Neuron(kind, name, (), None, None, None, None, shape, fact_value)
            else:
                combination, transformation = _function_names(neuron, classes)
                if combination is not None and combination not in COMBINATIONS:
                    raise UnsupportedNeuronError(f"{where}: combination/aggregation {combination} is not supported")
                if transformation is not None and transformation not in TRANSFORMATIONS:
                    raise UnsupportedNeuronError(f"{where}: transformation {transformation} is not supported")
                inputs: list[int] = []
                input_weights: list[int | None] | None = None
                offset_index = None
                if isinstance(neuron, classes["weighted"]):
                    pair = network.getInputs(neuron)
                    input_weights = []
                    it_neurons, it_weights = pair.r, pair.s
                    while it_neurons.hasNext():
                        inputs.append(int(ids.get(it_neurons.next())))
                        input_weights.append(weight_index(it_weights.next()))
                    if not is_zero.containsKey(neuron.offset.value):
                        offset_index = int(neuron.offset.index)
                        weight_index(neuron.offset)
                else:
                    iterator = network.getInputs(neuron)
                    while iterator.hasNext():
                        inputs.append(int(ids.get(iterator.next())))
                fed = len(inputs) + (offset_index is not None)
                if combination is None and fed != 1:
                    raise UnsupportedNeuronError(
                        f"{where}: transformation {transformation} without a combination over {fed} values")
                record = Neuron(kind, name, tuple(inputs), None if input_weights is None else tuple(input_weights),
                                offset_index, combination, transformation, shape)
            ids.put(neuron, jpype.JInt(len(neurons)))
            neurons.append(record)
        query = java_sample.query.neuron
        if not ids.containsKey(query):
            raise UnsupportedNeuronError(f"sample {java_sample.getId()!s}: query neuron is not in its network")
        outputs.append(int(ids.get(query)))
        targets.append(tuple(float(x) for x in _as_tuple(ValueFactory.from_java(java_sample.target))))
    alpha = float(jpype.JClass(pkg + "algebra.functions.transformation.elementwise.LeakyReLu").alpha)
    return Program(neurons, weights, outputs, targets, alpha)


def _as_tuple(value: Any) -> tuple:
    if isinstance(value, (list, tuple)):
        return tuple(x for v in value for x in _as_tuple(v))
    return (value,)


# ----------------------------------------------------------------------------------------------
# The scalar-granular module
# ----------------------------------------------------------------------------------------------

def _times(weight: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The engine's ``Value.times``: scalar scaling, otherwise a matrix product."""
    if weight.dim() == 0 or value.dim() == 0:
        return weight * value
    return weight @ value


def _element_sums(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """The engine's ``greaterThan`` on vectors and matrices compares element sums: max/min's key."""
    return torch.stack([v.sum() for v in values])


class NeuraLogicModule(nn.Module):
    """The engine's networks of a built dataset, one torch op per neuron (see ``to_module``).

    ``forward()`` returns a 1-D tensor: every sample's output (its query neuron's value, flattened) in
    sample order; ``forward(i)`` computes sample ``i``'s network alone and returns its output.
    ``targets`` holds the samples' targets the same way.
    The engine's learnable weights are the parameters ``weights["w<index>"]``; fixed weights
    (and the engine's constants) are buffers.
    """

    def __init__(self, program: Program, dtype: torch.dtype = torch.float64):
        super().__init__()
        #: neurons, facts, edges, weights and samples of the networks (the program itself is not kept: its
        #: objects would be walked by every trace's check for state stored on plain objects)
        self.counts = program.count()
        self.weights = nn.ParameterDict()
        self._weight_attr: dict[int, tuple[str, str]] = {}
        for index, w in sorted(program.weights.items()):
            tensor = torch.tensor(w.value, dtype=dtype).reshape(w.shape)
            key = f"w{index}" if index >= 0 else f"w_minus{-index}"
            if w.learnable:
                self.weights[key] = nn.Parameter(tensor)
                self._weight_attr[index] = ("weights", key)
            else:
                self.register_buffer(f"fixed_{key}", tensor)
                self._weight_attr[index] = ("buffer", f"fixed_{key}")
        facts = [n.value for n in program.neurons if n.value is not None]
        self.register_buffer("facts", torch.tensor([x for v in facts for x in v], dtype=dtype))
        self.register_buffer("targets", torch.tensor([x for t in program.targets for x in t], dtype=dtype))
        # Per neuron, the op list forward() unrolls: plain Python data, so Dynamo traces it as constants.
        self.steps: list[tuple] = []
        position = 0
        for n in program.neurons:
            if n.value is not None:
                self.steps.append(("fact", position, len(n.value), n.shape))
                position += len(n.value)
            elif n.is_fact:
                self.steps.append(("weight", n.offset))
            else:
                self.steps.append(("neuron", n.inputs, n.weights, n.offset, n.combination, n.transformation, n.shape))
        self.outputs = list(program.outputs)
        self.leaky_relu_alpha = program.leaky_relu_alpha

    def weight(self, index: int) -> torch.Tensor:
        where, key = self._weight_attr[index]
        return self.weights[key] if where == "weights" else getattr(self, key)

    def forward(self, sample: int | None = None) -> torch.Tensor:
        """Every sample's output (``sample`` None), or the output of sample ``sample`` alone: its network
        only, the form ``dynamo_relational.batch(module)`` trains in mini-batches (``batched([(i,), ...])``)."""
        if sample is None:
            values = self._evaluate(range(len(self.steps)))
            return torch.cat([values[i].reshape(-1) for i in self.outputs])
        if not 0 <= sample < len(self.outputs):
            raise IndexError(f"sample {sample} of a module of {len(self.outputs)} samples")
        output = self.outputs[sample]
        return self._evaluate(self._network_of(output))[output].reshape(-1)

    def _network_of(self, output: int) -> list[int]:
        """The neurons that neuron ``output`` reads, directly or not, and itself, in program order."""
        seen, todo = {output}, [output]
        while todo:
            step = self.steps[todo.pop()]
            if step[0] == "neuron":
                for i in step[1]:
                    if i not in seen:
                        seen.add(i)
                        todo.append(i)
        return sorted(seen)

    def _evaluate(self, neurons) -> dict[int, torch.Tensor]:
        """The values of ``neurons`` (in program order: each reads earlier ones only)."""
        values: dict[int, torch.Tensor] = {}
        for index in neurons:
            step = self.steps[index]
            if step[0] == "fact":
                _, start, size, shape = step
                facts = cast(torch.Tensor, self.facts)   # (a buffer: nn.Module types attributes loosely)
                values[index] = facts[start] if size == 1 and shape == () else facts[start:start + size].reshape(shape)
                continue
            if step[0] == "weight":
                values[index] = self.weight(step[1])
                continue
            _, inputs, weights, offset, combination, transformation, shape = step
            fed = [] if offset is None else [self.weight(offset)]
            if weights is None:
                fed += [values[i] for i in inputs]
            else:
                fed += [values[i] if w is None else _times(self.weight(w), values[i]) for i, w in zip(inputs, weights)]
            out = fed[0] if combination is None else self._combine(combination, fed)
            if transformation is not None and transformation != "Identity":
                out = TRANSFORMATIONS[transformation](out, self.leaky_relu_alpha)
            if tuple(out.shape) != shape:
                out = out.reshape(shape)
            values[index] = out
        return values

    @staticmethod
    def _combine(combination: str, fed: list[torch.Tensor]) -> torch.Tensor:
        if len(fed) == 1:
            return fed[0]
        if combination == "Sum":
            return functools.reduce(operator.add, fed)
        if combination == "ElementProduct":
            return functools.reduce(operator.mul, fed)
        if combination == "Product":
            return functools.reduce(_times, fed)
        shapes = {tuple(v.shape) for v in fed}
        if len(shapes) > 1:   # a scalar offset among vectors: the engine broadcasts it
            size = torch.broadcast_shapes(*shapes)
            fed = [v.expand(size) for v in fed]
        stacked = torch.stack(fed)
        if combination == "Average":
            return stacked.mean(0)
        if fed[0].dim() == 0:
            return stacked.amax(0) if combination == "Maximum" else stacked.amin(0)
        # Non-scalar max/min: the engine keeps the whole value with the largest (smallest) sum, first on ties
        key = _element_sums(fed)
        return stacked[torch.argmax(key) if combination == "Maximum" else torch.argmin(key)]


def to_module(model: Any, built_dataset: Any, dtype: torch.dtype = torch.float64) -> NeuraLogicModule:
    """A scalar-granular ``torch.nn.Module`` computing ``model(built_dataset)``.

    ``model`` is a built ``neuralogic`` model, ``built_dataset`` what ``model.build_dataset``
    returned. The module's parameters start at the model's current weight values; calling it with
    no arguments returns the 1-D tensor of every sample's output, in sample order.
    """
    return NeuraLogicModule(read_program(model, built_dataset), dtype=dtype)
