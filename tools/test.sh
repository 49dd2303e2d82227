#!/usr/bin/env bash
# The project's test command: set-up (idempotent), lint, types, then pytest.
# Extra arguments go to pytest (e.g. `bash tools/test.sh -m "not slow"`).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
bash tools/setup.sh || exit 1
export PYSPARK_PYTHON="$here/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$here/.venv/bin/python"
echo "== ruff"; .venv/bin/ruff check . || exit 1
echo "== mypy"; .venv/bin/mypy || exit 1
echo "== pytest"
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here"
  exit 1
fi
exit "$rc"
