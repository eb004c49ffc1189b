"""pytest configuration for the tests: fixtures and settings. The shared checks and models are in
tests/helpers.py."""
from __future__ import annotations

import os

import pytest
import torch
import torch._inductor.config

import dynamo_relational  # noqa: F401  (as before: the backend and custom ops registered for every test)

# (pytest rewrites the asserts of test modules and conftest only: the shared checks' failures say as much)
pytest.register_assert_rewrite("tests.helpers")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # test.sh runs one worker per core: a worker's own OpenMP threads would compete with the others' (small
    # kernels stall then), and Inductor's pool of compile processes would too
    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
