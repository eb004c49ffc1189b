"""The ``group_dropout`` option: per-neuron dropout in training groups into one dropout per group, which keeps
each element with probability ``1 - p``, independently, scaled by ``1 / (1 - p)`` (eager's distribution, not
eager's numbers), with the gradient of the mask it drew; without the option each dropout stays in its place."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dynamo_relational
from tests.helpers import TOLERANCE, assert_shuffled_batches_match_eager, report_matching_eager

NEURONS, WIDTH, P = 40, 64, 0.3


class DroppedGCN(nn.Module):
    """A layer with dropout on every neuron's value (twice on some: two masks), then a readout; given
    ``masks``, each dropout multiplies by its mask instead, which replays a draw in eager."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        self.drop = nn.Dropout(P)
        self.readout = nn.Linear(WIDTH, 2, dtype=torch.float64)

    def forward(self, x, masks=None):
        def dropout(h, i):
            if masks is None:
                return self.drop(h) if i % 2 else F.dropout(h, P, self.training)
            return h * masks[i] / (1 - P)

        hidden = [torch.tanh(self.lin(x[v] + x[(v + 1) % NEURONS])) for v in range(NEURONS)]
        dropped = [dropout(h, v) for v, h in enumerate(hidden)]
        twice = [dropout(hidden[v], NEURONS + v) + dropout(hidden[v], NEURONS + 4 + v) for v in range(4)]
        return torch.cat([torch.stack(dropped), torch.stack(twice)]), torch.stack([self.readout(h) for h in dropped])


def _compile(front_end, model, x, **options):
    if front_end == "fast":
        return dynamo_relational.compile(model, x, strict=True, **options)
    return torch.compile(model, backend="relational", options={"strict": True, **options})


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_grouped_dropout_draws_eagers_distribution_and_differentiates_its_mask(front_end):
    torch.manual_seed(0)
    model, x = DroppedGCN(), torch.randn(NEURONS, WIDTH, dtype=torch.float64)
    compiled = _compile(front_end, model, x, group_dropout=True)
    leaf = x.clone().requires_grad_()
    dropped, readout = compiled(leaf)

    with torch.no_grad():
        hidden = model.eval()(x)[0]
        model.train()
    hidden = torch.cat([hidden[:NEURONS], hidden[:4], hidden[:4]])   # each dropout's input
    # each dropped value is 0 or its input scaled by 1 / (1 - p): which one is the mask this call drew
    masks = dropped[:NEURONS] != 0
    torch.testing.assert_close(dropped[:NEURONS], torch.where(masks, hidden[:NEURONS] / (1 - P), 0.0),
                               **TOLERANCE[torch.float64])
    assert abs(1 - masks.double().mean().item() - P) < 0.05   # 2,560 draws: 5 standard deviations
    # two dropouts of one value draw two masks: their sum is 0, one, or two scaled copies of the value
    ratio = dropped[NEURONS:] / hidden[:4] * (1 - P)
    assert {round(r) for r in ratio.flatten().tolist()} == {0, 1, 2}

    # replaying the masks in eager gives the outputs and every gradient
    scale = [(ratio.round() == k) for k in (1, 2)]
    twice_masks = [(scale[0] | scale[1]).double(), scale[1].double()]   # a split of the sum into two masks
    replay = torch.cat([masks.double(), twice_masks[0], twice_masks[1]])
    eager_leaf = x.clone().requires_grad_()
    want = model(eager_leaf, masks=replay)
    torch.testing.assert_close((dropped, readout), want, **TOLERANCE[torch.float64])
    weights = [torch.randn_like(t) for t in want]
    params = list(model.parameters())
    got_grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip((dropped, readout), weights)), [leaf, *params])
    want_grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip(want, weights)), [eager_leaf, *params])
    torch.testing.assert_close(got_grads, want_grads, **TOLERANCE[torch.float64])


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_grouped_dropout_draws_a_new_mask_on_every_call_and_groups(front_end):
    torch.manual_seed(0)
    model, x = DroppedGCN(), torch.randn(NEURONS, WIDTH, dtype=torch.float64)
    report = dynamo_relational.explain(model, x, group_dropout=True, strict=True) if front_end == "backend" else \
        dynamo_relational.compile(model, x, group_dropout=True, strict=True).report
    graph = report.graphs[0]
    assert not graph.ungrouped, graph.ungrouped
    assert graph.nodes_after < graph.nodes_before / 10
    compiled = _compile(front_end, model, x, group_dropout=True)
    assert not torch.equal(compiled(x)[0], compiled(x)[0])


def test_without_the_option_each_dropout_keeps_its_place_and_eagers_numbers():
    torch.manual_seed(0)
    model, x = DroppedGCN(), torch.randn(NEURONS, WIDTH, dtype=torch.float64)
    compiled = dynamo_relational.compile(model, x, inductor=False, strict=True)
    reasons = compiled.report.graphs[0].ungrouped
    assert reasons["dropout in training mode draws eager's random numbers in eager's order (option group_dropout)"] \
        == NEURONS + 8
    torch.manual_seed(1)
    got = compiled(x)
    torch.manual_seed(1)
    torch.testing.assert_close(got, model(x), **TOLERANCE[torch.float64])


class DroppedTreeRNN(nn.Module):
    """A TreeRNN written for one tree, with dropout on every node's state (``inner``) and on its result."""

    def __init__(self, inner: bool, p: float = P):
        super().__init__()
        self.W, self.U = nn.Linear(4, 8, dtype=torch.float64), nn.Linear(8, 8, bias=False, dtype=torch.float64)
        self.drop, self.inner = nn.Dropout(p), inner

    def forward(self, children, x):
        h = [None] * len(children)
        for v in reversed(range(len(children))):
            own = self.W(x[v])
            h[v] = torch.tanh(own + self.U(sum(h[c] for c in children[v])) if children[v] else own)
            if self.inner:
                h[v] = self.drop(h[v])   # (the line the reason names)
        return self.drop(h[0])


def _trees(count):
    from examples.per_sample import dataset
    return dataset("treernn", count, features=4, dtype=torch.float64)


def test_batch_runs_dropout_in_training_one_by_one_without_the_option_and_says_so():
    torch.manual_seed(0)
    data, model = _trees(8), DroppedTreeRNN(inner=True)
    batched = dynamo_relational.batch(model, progress=False)
    batched(data)
    batched(data)   # (known structures: grouped)
    assert batched.report.unbatched == 1
    reason = batched.report.unbatched_reason
    assert "option group_dropout" in reason
    # the user's line that called the dropout, not torch's code in between
    assert f'"{__file__}", line' in reason and "h[v] = self.drop(h[v])   # (the line the reason names)" in reason


def test_batch_groups_dropout_with_the_option_and_differentiates_each_samples_mask():
    torch.manual_seed(0)
    data, model = _trees(8), DroppedTreeRNN(inner=False)
    batched = dynamo_relational.batch(model, group_dropout=True, progress=False)
    batched(data)
    with torch.no_grad():
        clean = [model.eval()(*s) for s in data]   # each sample's value before its dropout
    model.train()
    got = batched(data)
    assert batched.report.unbatched == 0 and batched.report.eager_samples == len(data)   # (the first call's)
    masks = [out != 0 for out in got]
    for out, mask, value in zip(got, masks, clean):
        torch.testing.assert_close(out, torch.where(mask, value / (1 - P), 0.0), **TOLERANCE[torch.float64])
    kept = torch.cat(masks).double().mean().item()
    assert abs(1 - kept - P) < 0.25   # 64 draws: about 4 standard deviations
    weights = [torch.randn_like(out) for out in got]
    params = list(model.parameters())
    got_grads = torch.autograd.grad(sum((out * w).sum() for out, w in zip(got, weights)), params)
    replayed = [model.eval()(*s) * m / (1 - P) for s, m in zip(data, masks)]   # the same masks, in eager
    want_grads = torch.autograd.grad(sum((out * w).sum() for out, w in zip(replayed, weights)), params)
    torch.testing.assert_close(got_grads, want_grads, **TOLERANCE[torch.float64])


def test_batch_groups_dropout_of_every_node_with_the_option():
    torch.manual_seed(0)
    data, model = _trees(8), DroppedTreeRNN(inner=True)
    batched = dynamo_relational.batch(model, group_dropout=True, progress=False)
    batched(data)
    first, second = batched(data), batched(data)
    assert batched.report.unbatched == 0 and batched.report.groupings == 1
    assert not all(torch.equal(a, b) for a, b in zip(first, second))   # a new mask every call
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(batched(data), [model(*s) for s in data], **TOLERANCE[torch.float64])


class ZeroDropout(nn.Module):
    def forward(self, x):
        return torch.stack([F.dropout(torch.tanh(x[v]), 0.0, self.training) for v in range(x.shape[0])]).sum(0)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_dropout_of_probability_zero_returns_its_input_and_groups(front_end):
    """Dropout of probability 0 (``nn.Dropout(0.0)``, layers' default ``dropout=0``) draws nothing and returns
    its input itself, in training too: read through, it groups without the option."""
    torch.manual_seed(0)
    report = report_matching_eager(front_end, ZeroDropout(), torch.randn(6, 4, dtype=torch.float64), inductor=False)
    assert not report.ungrouped, report.ungrouped


def test_batch_runs_dropout_of_probability_zero_from_the_union():
    assert_shuffled_batches_match_eager(DroppedTreeRNN(inner=True, p=0.0), _trees(8))
