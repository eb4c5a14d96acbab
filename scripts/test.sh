#!/usr/bin/env bash
# Set everything up, then lint and run the whole test suite (unit + component + end-to-end).
# Extra arguments go to pytest.  "No tests collected" is a failure, not a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
bash scripts/browser.sh || exit 1   # headless Chromium for the browser tests (distribution packages)
.venv/bin/ruff check . || exit 1   # lint and import order (pyproject.toml [tool.ruff])
# Two workers (AIENG_TEST_WORKERS), a test file per worker at a time: the e2e servers spend much of their
# time waiting, and a file's tests share its fixtures (tests/conftest.free_port splits the ports).
.venv/bin/python -m pytest -n "${AIENG_TEST_WORKERS:-2}" --dist loadfile -m "not browser" "$@"
rc=$?
# The browser tests after the rest, one at a time: Chromium beside a timing-bound test starves it on 2 cores.
.venv/bin/python -m pytest -m browser "$@"
rc_browser=$?
if [ "$rc" -eq 5 ] && [ "$rc_browser" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
[ "$rc" -eq 5 ] && rc=0            # the arguments named browser tests only
[ "$rc_browser" -eq 5 ] && rc_browser=0  # or none of them
[ "$rc" -ne 0 ] && exit "$rc"
exit "$rc_browser"
