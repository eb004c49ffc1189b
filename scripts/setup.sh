# Sourced by demo.sh and test.sh: create .venv and install the package with its test and benchmark tools.
# `pip install torch==2.13.0` takes the local CPU wheel on the project machines (no CUDA wheels).
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
source .venv/bin/activate
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
python -m pip install --quiet --disable-pip-version-check -e ".[test,bench,db,neuralogic]" 2>&1 | grep -v "^WARNING: Location" || true
python -c "import torch, dynamo_relational, pytest, xdist, hypothesis, expecttest, torch_geometric, tqdm, sqlalchemy, neuralogic" || { echo "setup failed" >&2; exit 1; }
# PostgreSQL server binaries for tests/test_relational_db.py, which start a throwaway server (and skip
# without them). Best effort: only as root with apt-get, and a failure here does not stop the set-up.
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && ! command -v initdb >/dev/null \
        && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } \
        || echo "note: could not install PostgreSQL; its tests will be skipped" >&2
fi
