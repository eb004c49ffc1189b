#!/usr/bin/env bash
# Set up (virtual environment, CPU torch), check the code with ruff and mypy, and run the default test suite,
# one test process per core (pytest-xdist; -n 0 runs them in this process). Usage: ./test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup.sh
ruff check .   # pyflakes and pycodestyle (pyproject.toml, tool.ruff)
mypy           # types of dynamo_relational/ (pyproject.toml, tool.mypy)
python -m pytest -q -n auto "$@" tests
