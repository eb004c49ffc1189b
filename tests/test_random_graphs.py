"""Property test: random scalar-granular DAGs of mixed ops, fan-ins, shapes and dtypes
compile to the same outputs and gradients as eager."""
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.helpers import assert_compiled_matches_eager, assert_fast_compile_matches_eager

EXAMPLES = int(os.environ.get("RELATIONAL_FUZZ_EXAMPLES", "8"))
VECTOR_OPS = ["add", "mul", "relu", "sigmoid", "tanh", "matvec", "affine", "sum", "amax", "mean", "scale", "offset",
              "no_grad"]


class RandomScalarNet(torch.nn.Module):
    """Interprets a random program: every step makes one vector ([d]) or scalar value."""

    def __init__(self, program, rows, width, dtype):
        super().__init__()
        self.program = program
        self.rows = rows
        self.W = torch.nn.Parameter(torch.randn(width, width, dtype=dtype) / width ** 0.5)
        self.w = torch.nn.Parameter(torch.randn(rows, dtype=dtype))
        self.b = torch.nn.Parameter(torch.randn(width, dtype=dtype))

    def forward(self, x):
        values = [x[i] for i in range(self.rows)]
        scalars = [self.w[i] for i in range(self.rows)]
        for op, picks, const in self.program:
            a, b = values[picks[0] % len(values)], values[picks[1] % len(values)]
            if op == "add":
                v = a + b
            elif op == "mul":
                v = a * b
            elif op in ("relu", "sigmoid", "tanh"):
                v = getattr(torch, op)(a)
            elif op == "matvec":
                v = self.W @ a
            elif op == "affine":    # a bias added after the product (passes/fold_bias.py)
                v = self.W @ a + self.b
            elif op == "sum":
                v = sum(values[p % len(values)] for p in picks)
            elif op in ("amax", "mean"):
                v = getattr(torch.stack([values[p % len(values)] for p in picks]), op)(0)
            elif op == "no_grad":   # a gate computed without gradient (passes/mode_regions.py)
                with torch.no_grad():
                    gate = torch.tanh(self.W @ a)
                v = gate * b + self.b
            elif op == "scale":
                v = scalars[picks[0] % len(scalars)] * a
            else:
                v = a + const
            values.append(v)
            scalars.append(torch.dot(a, b) if op == "mul" else v.sum())
        return torch.cat([torch.stack(values[self.rows:]).flatten(), torch.stack(scalars[self.rows:])])


step = st.tuples(st.sampled_from(VECTOR_OPS), st.lists(st.integers(0, 1000), min_size=2, max_size=5),
                 st.sampled_from([0.5, -1.0, 2.0, 0.25]))


dags = dict(program=st.lists(step, min_size=1, max_size=25), rows=st.integers(2, 6), width=st.integers(1, 4),
            double=st.booleans(), seed=st.integers(0, 2 ** 16))


def _check(program, rows, width, double, seed, check=assert_compiled_matches_eager):
    torch.manual_seed(seed)
    dtype = torch.float64 if double else torch.float32
    model = RandomScalarNet(program, rows, width, dtype)
    check(model, torch.randn(rows, width, dtype=dtype), inductor=False)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(**dags)
def test_random_scalar_dag_matches_eager(program, rows, width, double, seed):
    _check(program, rows, width, double, seed)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(**dags)
def test_random_scalar_dag_through_the_fast_front_end_matches_eager(program, rows, width, double, seed):
    _check(program, rows, width, double, seed, check=assert_fast_compile_matches_eager)


class FactsScalarNet(RandomScalarNet):
    """The same programs over facts held in a buffer, a few distinct rows repeated: what
    ``value_compression`` merges (passes/compress_values.py)."""

    def __init__(self, program, rows, width, dtype, distinct):
        super().__init__(program, rows, width, dtype)
        kinds = torch.randn(distinct, width, dtype=dtype)
        self.register_buffer("facts", kinds[torch.randint(0, distinct, (rows,))])
        self.gate = torch.nn.Parameter(torch.rand(width, dtype=dtype) + 0.5)   # shared by all rows

    def forward(self):
        return super().forward(self.facts * self.gate)


def _check_compressed(program, rows, width, double, seed, distinct):
    torch.manual_seed(seed)
    dtype = torch.float64 if double else torch.float32
    model = FactsScalarNet(program, rows, width, dtype, distinct)
    assert_compiled_matches_eager(model, inductor=False, value_compression=True)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(**dags, distinct=st.integers(1, 3))
def test_random_scalar_dag_over_repeated_facts_matches_eager_with_value_compression(program, rows, width, double,
                                                                                   seed, distinct):
    _check_compressed(program, rows, width, double, seed, distinct)


@pytest.mark.fuzz
@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(**dags)
def test_thousand_random_scalar_dags_match_eager(program, rows, width, double, seed):
    """The fuzz run: ``./test.sh -m fuzz`` (about 7 minutes on 2 cores; the next tests 1.5 and 2 more)."""
    _check(program, rows, width, double, seed)


@pytest.mark.fuzz
@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(**dags)
def test_thousand_random_scalar_dags_through_the_fast_front_end_match_eager(program, rows, width, double, seed):
    _check(program, rows, width, double, seed, check=assert_fast_compile_matches_eager)


@pytest.mark.fuzz
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(**dags, distinct=st.integers(1, 3))
def test_random_scalar_dags_over_repeated_facts_match_eager_with_value_compression(program, rows, width, double,
                                                                                   seed, distinct):
    _check_compressed(program, rows, width, double, seed, distinct)
