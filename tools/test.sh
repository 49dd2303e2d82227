#!/usr/bin/env bash
# The project's test command: set-up (idempotent), lint, types, then pytest.
# Extra arguments go to pytest (e.g. `bash tools/test.sh -m "not slow"`).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
bash tools/setup.sh --s3-server || exit 1
export PYSPARK_PYTHON="$here/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$here/.venv/bin/python"
# A fresh clone compiles the numba decode kernels (about a minute of one core): start
# that now, beside ruff and mypy, so the tests find them in the disk cache.
.venv/bin/python -c "from pipeline.commands.run import warm_decoder; warm_decoder(('am1', 'am2', 'v2', 'v2-amqp10'))" >/dev/null 2>&1 &
export QMF_WARM_PID=$!
echo "== ruff"; .venv/bin/ruff check . || exit 1
# mypy (~15 s of one core) beside pytest's first minutes, which wait on brokers and
# simulators; its result decides the exit code all the same.
mkdir -p .qmf
.venv/bin/mypy > .qmf/mypy.log 2>&1 &
mypy_pid=$!
echo "== pytest"
# Three test processes (pytest-xdist), each with its own SparkSession, a file's tests in
# one process (module fixtures such as a throw-away broker are built once): many tests
# wait on brokers, kills, restarts and Prometheus's alerts, so another process uses the
# cores meanwhile (CI's pytest on the 2-core VM: 41:48 in one process, 25:21 in two;
# three: docs/performance.md). QMF_TEST_WORKERS sets the count (0: one process); a `-n`
# among the arguments wins.
# Files go out in the order tests/conftest.py gives them (the longest first):
# pytest-xdist's default would put the files with most tests first, leaving the long
# one-test files (crash recovery, the kill tests) to the end, run alone.
.venv/bin/python -m pytest -n "${QMF_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
rc=$?
echo "== mypy"
wait "$mypy_pid"
mypy_rc=$?
cat .qmf/mypy.log
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here"
  exit 1
fi
if [ "$mypy_rc" -ne 0 ]; then
  echo "mypy failed (exit $mypy_rc)"
  exit 1
fi
exit "$rc"
