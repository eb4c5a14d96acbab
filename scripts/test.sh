#!/usr/bin/env bash
# Set everything up, then lint and run the whole test suite (unit + component + end-to-end).
# Extra arguments go to pytest.  "No tests collected" is a failure, not a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
.venv/bin/ruff check . || exit 1   # lint and import order (pyproject.toml [tool.ruff])
# Two workers (AIENG_TEST_WORKERS; tests/conftest.free_port splits the ports): each starts with half the tests,
# in order, and takes from the other's queue when its own runs dry; the e2e servers spend much time waiting.
.venv/bin/python -m pytest -n "${AIENG_TEST_WORKERS:-2}" --dist worksteal "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
