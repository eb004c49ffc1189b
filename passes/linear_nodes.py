"""The linear maps of a graph: recognise ``F.linear`` nodes and read their operands.

Not a pass: the vocabulary that the passes rewriting products (``commute_linear``,
``fuse_linear``, ``fold_bias``, ``linear_layout``, ``postpone_gathers``,
``compress_values``) share, so that each reads ``linear(input, weight, bias=None)``
the same way whether its arguments were recorded by position or by keyword
(Dynamo records an absent bias as ``bias=None``).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch.fx as fx
import torch.nn.functional as F

from dynamo_relational.ops import tensor_info

_PARAMETERS = ("input", "weight", "bias")


class LinearArgs(NamedTuple):
    """The operands of one ``linear``: ``x @ weight.T + bias``."""
    x: Any
    weight: Any
    #: None where the linear adds no bias
    bias: Any

    def on_rows(self) -> bool:
        """``x`` and the weight are 2-D tensors: rows times a matrix, the form the passes rewrite."""
        x, weight = tensor_info(self.x), tensor_info(self.weight)
        return x is not None and weight is not None and x.rank == 2 and weight.rank == 2


def linear_args(node) -> LinearArgs | None:
    """The operands of ``node`` if it is a call of ``F.linear``, else None (also where its
    arguments are not ones ``F.linear`` accepts: an unknown keyword, one given twice, a missing one)."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is F.linear) \
            or len(node.args) > len(_PARAMETERS):
        return None
    bound = dict(zip(_PARAMETERS, node.args))
    for name, value in node.kwargs.items():
        if name not in _PARAMETERS or name in bound:
            return None
        bound[name] = value
    if "input" not in bound or "weight" not in bound:
        return None
    return LinearArgs(bound["input"], bound["weight"], bound.get("bias"))
