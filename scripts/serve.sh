#!/usr/bin/env bash
# Set everything up, then run the server in the foreground on the demo models.
# Extra arguments go to `aieng serve` (see `aieng serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/aieng serve "$@"
