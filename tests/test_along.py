"""The along family: softmax, log_softmax, softmin, cumsum, cumprod, logsumexp, logcumsumexp, glu, F.normalize,
vector norms, std and var inside one neuron group along the members' dimensions shifted by one, and match eager
(attention over a neuron's in-neighbours, as in GAT, is the common case); so do products of stacked values,
cosine similarities, pairwise distances and gathers by each neuron's own index."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import (STATISTICS_NEIGHBORS as NEIGHBORS, Statistics, assert_fast_compile_matches_eager,
                           report_matching_eager)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Each neuron's feature row and its 2 x 3 plane, float64."""
    return torch.randn(len(NEIGHBORS), 4, dtype=torch.float64), torch.randn(len(NEIGHBORS), 2, 3, dtype=torch.float64)


class Attention(nn.Module):
    """GAT-style attention per neuron, then per-neuron normalisations along one or all dimensions."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, dtype=torch.float64)
        self.att = nn.Parameter(torch.randn(8, dtype=torch.float64))

    def forward(self, x, planes):
        h = [self.lin(x[v]) for v in range(len(NEIGHBORS))]
        out = []
        for v, nbrs in enumerate(NEIGHBORS):
            scores = torch.stack([F.leaky_relu(torch.dot(self.att, torch.cat([h[v], h[u]]))) for u in nbrs + [v]])
            weights = (torch.softmax(scores, 0) + F.softmax(scores, dim=-1) + scores.log_softmax(0)
                       + F.softmin(scores, 0))
            message = sum(weights[i] * h[u] for i, u in enumerate(nbrs + [v]))
            z = (message / message.norm() + F.normalize(message, dim=0) + message.cumsum(0)
                 + torch.cumprod(message, dim=0) + torch.logsumexp(message, 0) + message.norm(1)
                 + torch.norm(message, p=3) + torch.linalg.vector_norm(message, ord=float("inf"))
                 + torch.logcumsumexp(message, 0) + message.logcumsumexp(-1) + F.glu(torch.cat([message, h[v]])))
            p = planes[v]
            w = (p.softmax(1) + F.normalize(p, dim=1) + p.norm(dim=1, keepdim=True) + p.logsumexp(-1, keepdim=True)
                 + torch.norm(p) + p.norm(p=2, dim=(0, 1))).sum(0)
            out.append(torch.cat([z, w]))
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_ops_along_dimensions_group_and_match_eager(front_end):
    torch.manual_seed(0)
    inputs = _inputs()
    report = report_matching_eager(front_end, Attention(), *inputs, inductor=False)
    assert not report.ungrouped, report.ungrouped   # (F.normalize's out=None was taken for an in-place op)
    assert report.nodes_after < report.nodes_before / 5


class ImplicitDims(nn.Module):
    """``nn.LogSoftmax()`` and ``nn.Softmax()`` without ``dim``, as older per-node classifiers call them: torch's
    implicit choice, dim 0 of a vector and dim 1 of a matrix."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, dtype=torch.float64)
        self.log_softmax, self.softmax = nn.LogSoftmax(), nn.Softmax()

    def forward(self, x, planes):
        return torch.stack([torch.cat([self.log_softmax(self.lin(x[v])), self.softmax(planes[v]).flatten()])
                            for v in range(len(NEIGHBORS))])


@pytest.mark.filterwarnings("ignore:Implicit dimension choice")
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_softmax_without_dim_takes_torchs_implicit_dim_and_groups(front_end):
    torch.manual_seed(0)
    inputs = _inputs()
    report = report_matching_eager(front_end, ImplicitDims(), *inputs, inductor=False)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 5


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_std_and_var_of_stacked_messages_group_and_match_eager(front_end):
    torch.manual_seed(0)
    inputs = _inputs()
    report = report_matching_eager(front_end, Statistics(), *inputs, inductor=False)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 3   # (three stack shapes: one group of each op per shape)


def test_a_matrix_norm_is_left_ungrouped_and_right():
    class Nuclear(nn.Module):
        def forward(self, planes):
            return torch.stack([torch.norm(planes[v], p="nuc") * planes[v] for v in range(len(NEIGHBORS))])

    torch.manual_seed(0)
    report = assert_fast_compile_matches_eager(Nuclear(), torch.randn(len(NEIGHBORS), 2, 3, dtype=torch.float64),
                                               inductor=False).report.graphs[0]
    assert "norm with p='nuc' (only vector norms are grouped)" in report.ungrouped


class Normalized(nn.Module):
    """A layer norm (shared affine weights), an RMS norm and a plain layer norm over each neuron's value."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, dtype=torch.float64)
        self.norm = nn.LayerNorm(4, dtype=torch.float64)
        self.rms = nn.RMSNorm(4, dtype=torch.float64)

    def forward(self, x, planes):
        out = []
        for v, nbrs in enumerate(NEIGHBORS):
            h = torch.relu(self.lin(x[v])) + sum(x[u] for u in nbrs)
            out.append(self.norm(h) + self.rms(h) + F.layer_norm(planes[v], (2, 3)).sum(0)[:4].repeat(2)[:4])
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_layer_norms_of_neurons_group_and_match_eager(front_end):
    torch.manual_seed(0)
    inputs = _inputs()
    report = report_matching_eager(front_end, Normalized(), *inputs, inductor=False)
    assert not any("norm" in reason for reason in report.ungrouped), report.ungrouped


def test_layer_norms_with_their_own_weights_are_left_ungrouped_and_right():
    class OwnNorms(nn.Module):
        def __init__(self):
            super().__init__()
            self.norms = nn.ModuleList(nn.LayerNorm(4, dtype=torch.float64) for _ in range(3))
            for norm in self.norms:
                nn.init.normal_(norm.weight)

        def forward(self, x):
            return torch.stack([self.norms[v % 3](x[v]) for v in range(len(NEIGHBORS))])

    torch.manual_seed(0)
    assert_fast_compile_matches_eager(OwnNorms(), torch.randn(len(NEIGHBORS), 4, dtype=torch.float64))


class Similarities(nn.Module):
    """Cosine similarities and distances of neighbours (one operand shared, or both per edge, along a first or
    a last dimension), and the product t-norm of each neuron's stacked body atoms in every form ``prod`` takes."""

    def __init__(self):
        super().__init__()
        self.anchor = nn.Parameter(torch.randn(4, dtype=torch.float64))

    def forward(self, x, planes):
        out = []
        for v, nbrs in enumerate(NEIGHBORS):
            edges = [F.cosine_similarity(x[v], x[u], dim=0) + F.pairwise_distance(x[v], x[u])
                     + F.pairwise_distance(self.anchor, x[u], p=1.0, eps=0.0, keepdim=True).squeeze()
                     + F.cosine_similarity(planes[v], planes[u], 0, eps=1e-3).sum() for u in nbrs]
            body = torch.sigmoid(torch.stack([x[u] for u in nbrs + [v]]))
            conjunction = (body.prod(0) + torch.prod(body, dim=1).sum() + body.prod()
                           + planes[v].prod(-1, keepdim=True).sum())
            out.append(torch.stack(edges).sum() + conjunction + F.cosine_similarity(self.anchor, x[v], dim=-1))
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_similarities_and_products_group_and_match_eager(front_end, dtype):
    torch.manual_seed(0)
    inputs = torch.randn(len(NEIGHBORS), 4, dtype=dtype), torch.randn(len(NEIGHBORS), 2, 3, dtype=dtype)
    inputs[0][3, 1] = 0.0   # a zero factor: prod's gradient divides by no factor
    report = report_matching_eager(front_end, Similarities().to(dtype), *inputs, inductor=False)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 4


def test_a_similarity_of_values_of_different_shapes_is_left_ungrouped_and_right():
    class Broadcast(nn.Module):
        def forward(self, x, planes):
            return torch.stack([F.cosine_similarity(planes[v], x[v][:3], dim=-1).sum() for v in range(len(NEIGHBORS))])

    torch.manual_seed(0)
    report = assert_fast_compile_matches_eager(Broadcast(), torch.randn(len(NEIGHBORS), 4, dtype=torch.float64),
                                               torch.randn(len(NEIGHBORS), 2, 3, dtype=torch.float64),
                                               inductor=False).report.graphs[0]
    assert any(reason.startswith("cosine_similarity of values other than") for reason in report.ungrouped)


class LabelScores(nn.Module):
    """Each neuron's log-probability of its label, ``scores.gather(1, labels[v:v + 1, None])``, plus that of
    the first class, by an index that every neuron shares (the group expands it to its rows)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, x, labels):
        first = torch.zeros(1, 1, dtype=torch.long)
        out = []
        for v in range(x.shape[0]):
            scores = F.log_softmax(self.lin(x[v:v + 1]), 1)
            out.append(scores.gather(1, labels[v:v + 1, None]) + torch.gather(scores, -1, first))
        return torch.cat(out)


class Predictions(nn.Module):
    """Whether each neuron's prediction, the argmax (or, for odd neurons, argmin) of its scores, is its label."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, x, labels):
        scores = [self.lin(x[v:v + 1]) for v in range(x.shape[0])]
        hits = [(s.argmax(1) if v % 2 == 0 else torch.argmin(s, dim=1)) == labels[v] for v, s in enumerate(scores)]
        return torch.cat(scores) * torch.cat(hits).double()[:, None]


@pytest.mark.parametrize("model, op", [(LabelScores, "gather"), (Predictions, "arg")])
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_gathers_and_argmax_by_each_neurons_label_group_and_match_eager(front_end, model, op):
    torch.manual_seed(0)
    x, labels = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 3, (6,))
    report = report_matching_eager(front_end, model(), x, labels, inductor=False)
    assert not any(op in reason for reason in report.ungrouped), report.ungrouped
