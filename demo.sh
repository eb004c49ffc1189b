#!/usr/bin/env bash
# Set up (virtual environment, CPU torch) and run the main demo. Usage: ./demo.sh [graphs]
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup.sh
python -m examples.demo "$@"
