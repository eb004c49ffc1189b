#!/usr/bin/env bash
# Set up (virtual environment, CPU torch) and run the default test suite, one test process per core
# (pytest-xdist; -n 0 runs them in this process). Usage: ./test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup.sh
python -m pytest -q -n auto "$@" tests
