#!/usr/bin/env bash
# Re-pin constraints.txt to what the project's venv holds now (run after changing a dependency in
# pyproject.toml, then run ./scripts/test.sh: the pins are the versions the tests passed with).
#   1. edit pyproject.toml;  2. .venv/bin/pip install -e '.[dev]' --upgrade (no -c, to pick new versions)
#   3. bash scripts/update_constraints.sh;  4. ./scripts/test.sh;  5. commit both files together.
set -euo pipefail
cd "$(dirname "$0")/.."
{
  echo "# Every dependency of aieng (runtime, the quantize extra and the dev extra), pinned at the versions"
  echo "# the test suite passed with.  scripts/setup.sh installs with -c constraints.txt.  Regenerate with"
  echo "# scripts/update_constraints.sh (see its header); never edit by hand."
  .venv/bin/python -m pip freeze --exclude-editable --all | grep -v -E '^(pip|setuptools|wheel)=='
} > constraints.txt
echo "constraints.txt: $(grep -c '==' constraints.txt) pins"
