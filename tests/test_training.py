"""Training through the compiled model: 20 Adam steps give eager's losses."""
import torch

from examples.data import graph_batch
from examples.gcn import ScalarGCN


def _losses(model, x, y, steps=20):
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_twenty_adam_steps_match_eager():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=4, dtype=torch.float64)
    y = torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    eager = ScalarGCN(batch, 7).double()
    compiled_model = ScalarGCN(batch, 7).double()
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, backend="relational", options={"strict": True})
    want = _losses(eager, batch.x, y)
    got = _losses(compiled, batch.x, y)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert want[-1] < want[0]
