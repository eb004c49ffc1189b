# Sourced by demo.sh and test.sh: create .venv and install the package with its test tools.
# `pip install torch==2.13.0` takes the local CPU wheel on the project machines (no CUDA wheels).
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
source .venv/bin/activate
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
python -m pip install --quiet --disable-pip-version-check -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
python -c "import torch, dynamo_relational, pytest, hypothesis" || { echo "setup failed" >&2; exit 1; }
