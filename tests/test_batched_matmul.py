"""Products of batches of matrices per neuron (``c @ V @ c.T`` by a ``[d, n, n]`` tensor, as a recursive neural
tensor network writes its bilinear term): one ``matmul`` over the group, each member's batch dims after the
group's, a shared operand broadcast over them."""
import pytest
import torch
from torch import nn

from examples.per_sample import dataset
from tests.helpers import assert_shuffled_batches_match_eager, report_matching_eager

D = 3
#: a binary tree of 7 nodes, children numbered after their parents
CHILDREN = [[1, 2], [3, 4], [5, 6], [], [], [], []]


class TensorLayer(nn.Module):
    """A recursive neural tensor network's node: ``tanh(c V c^T + W c)`` of its children's states joined,
    ``c = [h_l, h_r]``, with ``V`` one ``[d, 2d, 2d]`` tensor (``style`` "shared"), one per node type chosen by
    the node's parity ("typed": ``V[t]`` read per member), or applied on the left of each node's column
    (``V @ c^T``, "left")."""

    def __init__(self, style: str):
        super().__init__()
        self.style = style
        self.V = nn.Parameter(0.3 * torch.randn(2, D, 2 * D, 2 * D, dtype=torch.float64))
        self.W = nn.Linear(2 * D, D, dtype=torch.float64)
        self.leaf = nn.Linear(4, D, dtype=torch.float64)

    def node(self, v: int, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        c = torch.cat([left, right], 1)   # [1, 2d]
        V = self.V[v % 2] if self.style == "typed" else self.V[0]
        if self.style == "left":
            bilinear = (c @ (V @ c.t())).reshape(1, D)   # c times a batch of columns, [d, 2d, 1]
        else:
            bilinear = (c @ V @ c.t()).reshape(1, D)     # a batch of rows, [d, 1, 2d], times c^T
        return torch.tanh(bilinear + self.W(c))

    def forward(self, children, x):
        h: list = [None] * len(children)
        for v in reversed(range(len(children))):
            h[v] = torch.tanh(self.leaf(x[v:v + 1])) if not children[v] else \
                self.node(v, h[children[v][0]], h[children[v][-1]])
        return h[0]


class _OneTree(nn.Module):
    def __init__(self, model: TensorLayer):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(CHILDREN, x)


@pytest.mark.parametrize("style", ["shared", "typed", "left"])
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_products_of_batches_of_matrices_group_and_match_eager(front_end, style):
    torch.manual_seed(0)
    x = torch.randn(len(CHILDREN), 4, dtype=torch.float64)
    report = report_matching_eager(front_end, _OneTree(TensorLayer(style)), x, inductor=False)
    assert not any("matmul" in reason for reason in report.ungrouped), report.ungrouped


@pytest.mark.parametrize("style", ["shared", "typed", "left"])
def test_products_of_batches_of_matrices_batch_over_trees(style):
    torch.manual_seed(0)
    data = [([c if len(c) < 3 else c[:2] for c in children], x)
            for children, x in dataset("treernn", 8, features=4, dtype=torch.float64)]
    assert_shuffled_batches_match_eager(TensorLayer(style), data)


class _VectorBesideMatrices(nn.Module):
    def __init__(self):
        super().__init__()
        self.V = nn.Parameter(torch.randn(D, 2, 2, dtype=torch.float64))

    def forward(self, x):
        return torch.stack([torch.tanh(self.V @ x[v]) for v in range(x.shape[0])])


def test_a_vector_beside_a_batch_of_matrices_is_left_ungrouped_with_its_reason():
    torch.manual_seed(0)
    report = report_matching_eager("fast", _VectorBesideMatrices(), torch.randn(4, 2, dtype=torch.float64))
    assert any("vector beside a batch" in reason for reason in report.ungrouped), report.ungrouped
