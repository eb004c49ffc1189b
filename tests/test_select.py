"""The select family: row reads followed by constant slices (``x[v, :2]``, ``x[v, ..., 1:3]``) and constant
indices into a neuron's value (``h[[0, 2]]``, ``h[idx]``) are gathered per group and match eager."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dynamo_relational
from tests.helpers import report_matching_eager

ROWS = 12


class SplitFeatures(nn.Module):
    """Each neuron splits its features: slices after the row index, lists and a shared index tensor."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2, dtype=torch.float64)
        self.register_buffer("pick", torch.tensor([3, 0]))

    def forward(self, x, x3):
        out = []
        for v in range(ROWS):
            h = torch.cat([x[v, 2:], x[v, :2]])
            first = self.lin(x[v, 1:3]) + self.lin(h[[0, 2]]) + self.lin(h[self.pick])
            second = x3[v, 1, ::2] + x3[v, ..., 1:3].sum(0) + x3[v, :, -2:][0] + x3[v, None][0, 2, :2]
            out.append(torch.cat([first, second, x[v, -1:]]))
        return torch.stack(out)


def _inputs():
    torch.manual_seed(0)
    return torch.randn(ROWS, 4, dtype=torch.float64), torch.randn(ROWS, 3, 4, dtype=torch.float64)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_row_reads_with_slices_and_constant_indices_group_and_match_eager(front_end):
    model = SplitFeatures()
    report = report_matching_eager(front_end, model, *_inputs(), inductor=False)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 5


def test_a_per_neuron_index_tensor_is_left_ungrouped_and_right():
    """``h[i_v]`` with an index that differs per neuron: the group cannot share one index."""
    class PerNeuronIndex(nn.Module):
        def forward(self, x, picks):
            return torch.stack([x[v][picks[v]] for v in range(ROWS)])

    picks = torch.randint(0, 4, (ROWS, 2))
    x = _inputs()[0].requires_grad_()
    out = torch.compile(PerNeuronIndex(), backend="relational", options={"strict": True})(x, picks)
    torch.testing.assert_close(out, PerNeuronIndex()(x, picks))


TRIPLES = [(0, 0, 1), (1, 1, 2), (2, 0, 3), (3, 2, 0), (1, 2, 3), (0, 1, 2)]


class TransE(nn.Module):
    """Knowledge-graph scores -||e_h + r - e_t|| with embeddings looked up by indices made in forward."""

    def __init__(self):
        super().__init__()
        self.entities = nn.Embedding(4, 3, dtype=torch.float64)
        self.relations = nn.Embedding(3, 3, dtype=torch.float64)

    def forward(self, scale):
        return torch.stack([-(self.entities(torch.tensor(h)) + self.relations(torch.tensor(r))
                              - self.entities(torch.tensor(t))).norm() * scale for h, r, t in TRIPLES])


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_embeddings_of_constant_indices_are_row_reads_that_group(front_end):
    torch.manual_seed(0)
    scale = torch.tensor(2.0, dtype=torch.float64)
    report = report_matching_eager(front_end, TransE(), scale, inductor=False)
    assert not any("embedding" in reason for reason in report.ungrouped), report.ungrouped


class WordsOfOneElement(nn.Module):
    """Per-leaf lookups as tree code writes them: ``emb(torch.LongTensor([w]))`` and ``emb(torch.tensor([w]))``,
    each a row with a leading 1."""

    WORDS = [3, 1, 4, 1, 5, 9, 2, 6]

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, dtype=torch.float64)

    def forward(self, x):
        rows = [self.emb(torch.LongTensor([w]) if i % 2 else torch.tensor([w])) for i, w in enumerate(self.WORDS)]
        return torch.cat([torch.tanh(row + x[i]) for i, row in enumerate(rows)])


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_embeddings_of_one_element_index_tensors_group(front_end):
    torch.manual_seed(0)
    x = torch.randn(len(WordsOfOneElement.WORDS), 4, dtype=torch.float64)
    report = report_matching_eager(front_end, WordsOfOneElement(), x, inductor=False)
    assert not any("embedding" in reason for reason in report.ungrouped), report.ungrouped
    assert report.nodes_after < report.nodes_before / 3


class WordsOfTheInput(nn.Module):
    """Per-leaf lookups of the words an input tensor holds, ``emb(tokens[v])``: an index each neuron reads."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, dtype=torch.float64)

    def forward(self, tokens, x):
        return torch.stack([torch.tanh(self.emb(tokens[v]) * x[v]) for v in range(ROWS)])




@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_an_embedding_of_a_buffer_reads_the_buffers_value_on_every_call(front_end):
    """A buffer may change between calls: its index is never baked into the graph as a constant."""
    class ByBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(3, 2, dtype=torch.float64)
            self.register_buffer("which", torch.tensor(1))

        def forward(self, x):
            return torch.stack([self.emb(self.which) * x[v] for v in range(ROWS)])

    torch.manual_seed(0)
    model, x = ByBuffer(), torch.randn(ROWS, 2, dtype=torch.float64)
    compiled = torch.compile(model, backend="relational") if front_end == "backend" else \
        dynamo_relational.compile(model, x)
    for which in (1, 2, 0):
        model.which.fill_(which)
        torch.testing.assert_close(compiled(x), model(x))


class RowsKept(nn.Module):
    """Each neuron reads its row kept two-dimensional, ``x[v:v + 1]`` (or, with ``sliced`` False, the same as
    ``x[v].unsqueeze(0)``), beside its two neighbours' rows."""

    def __init__(self, sliced: bool):
        super().__init__()
        self.lin, self.sliced = nn.Linear(8, 3, dtype=torch.float64), sliced

    def forward(self, x):
        def row(v):
            return x[v:v + 1, 1:] if self.sliced else x[v, 1:].unsqueeze(0)
        return torch.cat([self.lin(torch.cat([row(v), row((v + 1) % ROWS)], 1)) for v in range(ROWS)])


@pytest.mark.parametrize("front_end", ["fast", "backend"])
def test_a_row_kept_two_dimensional_groups_as_the_row_read(front_end):
    """``x[v:v + 1]`` is ``x[v, None]``: one gather for all neurons, not a slice group per row."""
    x = torch.randn(ROWS, 5, dtype=torch.float64)
    sliced, indexed = (report_matching_eager(front_end, RowsKept(s), x) for s in (True, False))
    assert sliced.groups <= indexed.groups, (sliced.groups, indexed.groups)


class OneHotLabels(nn.Module):
    """Each neuron's scores weighted by its one-hot label, ``F.one_hot(labels[v], 4) * scores``: an index each
    neuron reads, with the class count given."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, labels, x):
        return torch.stack([(F.one_hot(labels[v], 4) * self.lin(x[v])).sum() for v in range(ROWS)])


@pytest.mark.parametrize("model, values", [(WordsOfTheInput, 10), (OneHotLabels, 4)])
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_embeddings_and_one_hot_vectors_of_indices_the_neurons_read_group(front_end, model, values):
    torch.manual_seed(0)
    indices, x = torch.randint(0, values, (ROWS,)), torch.randn(ROWS, 4, dtype=torch.float64)
    report = report_matching_eager(front_end, model(), indices, x, inductor=False)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 5
