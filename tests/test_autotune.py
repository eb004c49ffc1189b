"""Autotuning the executor: Inductor's code or the grouped graph's plain ATen calls, whichever is faster."""
import time

import torch

from dynamo_relational.autotune import fastest
from examples.data import graph_batch
from examples.gcn import ScalarGCN
from tests.helpers import assert_compiled_matches_eager


def test_fastest_picks_the_faster_forward():
    x = torch.randn(3, requires_grad=True)

    def slow(x):
        time.sleep(0.002)
        return x * 2

    def quick(x):
        return x * 2

    choice, medians = fastest({"slow": slow, "quick": quick}, [x])
    assert choice == "quick" and medians["slow"] > medians["quick"]
    assert x.grad is None


def test_backend_records_its_choice_and_stays_right():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3)
    report = assert_compiled_matches_eager(ScalarGCN(batch, 7), batch.x)
    stats = report.graphs[0].stats
    assert stats["executor"] in ("inductor", "aten") and set(stats["executor_ms"]) == {"inductor", "aten"}
    assert "autotune" in report.pass_timings


def test_autotune_off_keeps_inductor():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3)
    report = assert_compiled_matches_eager(ScalarGCN(batch, 7), batch.x, autotune=False)
    assert "executor" not in report.graphs[0].stats
