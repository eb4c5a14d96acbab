#!/usr/bin/env bash
# Idempotent setup for a fresh machine: venv, the package with its dev extras, demo models.
# Used by scripts/serve.sh and scripts/test.sh; safe to run again (fast when nothing changed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.aieng-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # every dependency at the version the tests passed with (constraints.txt; scripts/update_constraints.sh)
  .venv/bin/python -m pip install --quiet -e '.[dev]' -c constraints.txt
  touch "$stamp"
fi
.venv/bin/python scripts/fetch_models.py
