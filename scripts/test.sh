#!/usr/bin/env bash
# Set everything up, then lint and run the whole test suite (unit + component + end-to-end).
# Extra arguments go to pytest.  "No tests collected" is a failure, not a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
.venv/bin/ruff check . || exit 1   # lint and import order (pyproject.toml [tool.ruff])
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
