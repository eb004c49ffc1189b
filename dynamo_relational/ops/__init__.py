"""The catalog of neuron ops the vectorizer can group (one family per module)."""
from .base import REGISTRY, NeuronOp, OpFamily, TensorInfo, tensor_info
from . import aggregate, along, cells, einsum, elementwise, losses, matmul, reduce, reshape, select  # noqa: F401  (registration)
from .aggregate import aggregate as aggregate_fn

__all__ = ["REGISTRY", "NeuronOp", "OpFamily", "TensorInfo", "tensor_info", "aggregate_fn", "describe"]


def describe(node):
    """The :class:`NeuronOp` for ``node``, or a string saying why it cannot be grouped."""
    family = REGISTRY.family_of(node)
    if family is None:
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", node.target)
        return f"no vectorizer for {node.op} {name}"
    return family.describe(node)
