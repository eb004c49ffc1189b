"""The bilinear family: ``nn.Bilinear`` scores of pairs of neurons (a neural tensor network's relation scores)
group into one ``F.bilinear`` per weight, through both front-ends, and match eager."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import assert_fast_compile_matches_eager, report_matching_eager

ENTITIES, WIDTH = 12, 4
#: (head, relation, tail)
TRIPLES = [(h, r, (h * 5 + r + 1) % ENTITIES) for h in range(ENTITIES) for r in range(3)]


class TensorNetwork(nn.Module):
    """Per triple: ``u_r . tanh(bilinear_r(e_h, e_t) + V_r [e_h; e_t])``, and each entity's bilinear score with a
    shared query vector (one input shared by the group)."""

    def __init__(self, relations: int = 3):
        super().__init__()
        self.bilinear = nn.ModuleList(nn.Bilinear(WIDTH, WIDTH, 2, dtype=torch.float64) for _ in range(relations))
        self.linear = nn.ModuleList(nn.Linear(2 * WIDTH, 2, dtype=torch.float64) for _ in range(relations))
        self.u = nn.Parameter(torch.randn(relations, 2, dtype=torch.float64))
        self.query = nn.Parameter(torch.randn(WIDTH, dtype=torch.float64))
        self.score = nn.Bilinear(WIDTH, WIDTH, 1, bias=False, dtype=torch.float64)

    def forward(self, e):
        triples = [self.u[r] @ torch.tanh(self.bilinear[r](e[h], e[t]) + self.linear[r](torch.cat([e[h], e[t]])))
                   for h, r, t in TRIPLES]
        queries = [self.score(self.query, e[v]) for v in range(ENTITIES)]
        return torch.cat([torch.stack(triples), torch.cat(queries)])


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_bilinear_scores_group_one_per_weight_and_match_eager(front_end):
    torch.manual_seed(0)
    report = report_matching_eager(front_end, TensorNetwork(), torch.randn(ENTITIES, WIDTH, dtype=torch.float64))
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 5


def test_bilinear_maps_of_a_weight_each_are_left_ungrouped_and_right():
    class OwnMaps(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(ENTITIES, 2, WIDTH, WIDTH, dtype=torch.float64))

        def forward(self, e):
            return torch.stack([F.bilinear(e[v], e[(v + 1) % ENTITIES], self.weight[v]) for v in range(ENTITIES)])

    torch.manual_seed(0)
    report = assert_fast_compile_matches_eager(OwnMaps(), torch.randn(ENTITIES, WIDTH, dtype=torch.float64),
                                               inductor=False).report.graphs[0]
    assert "bilinear group of this layout is not vectorized" in report.ungrouped, report.ungrouped
