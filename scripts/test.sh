#!/usr/bin/env bash
# `make test`: the whole suite in two phases, then where its time went.
#
# 1. Every test that leaves the shared broker alone: in this process (TEST_WORKERS=1, the default),
#    or on TEST_WORKERS pytest-xdist workers (--dist loadgroup: tests/conftest.py groups the ones
#    sharing a SparkSession, an Airflow database or a Connect server). On a 2-core machine the
#    suite is CPU-bound (JVM start-ups, Airflow dag.test runs): with 4 workers the whole suite
#    took 1,474 s, where the last run in one process took 1,183 s, so one process stays the
#    default until the suite costs less CPU (docs/operations.md, "Tests").
# 2. The tests marked `serial` (they stop, restart or pause the broker), alone.
# Then the slowest 15 tests, time per tier and the idlest files (tests/support/timing.py), and a
# closing `N passed, N failed, N skipped` line over both phases. Arguments go to both pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORKERS=${TEST_WORKERS:-1}
out=$(mktemp -d /tmp/rmqs-test-XXXXXX)
trap 'rm -rf "$out"' EXIT
start=$SECONDS
xdist=()
if [[ $WORKERS -gt 1 ]]; then xdist=(-n "$WORKERS" --dist loadgroup); fi
"$PY" -m pytest "${xdist[@]}" -m "not serial" --junitxml "$out/parallel.xml" "$@"
parallel=$?
"$PY" -m pytest -m serial --junitxml "$out/serial.xml" "$@"
serial=$?
"$PY" -m tests.support.timing "$out/parallel.xml" "$out/serial.xml"
echo "make test: pytest took $((SECONDS - start)) s (parallel phase exit $parallel, serial phase exit $serial)"
# Exit 5 is "no test collected": fine for one phase (a path given with no serial test in it).
for rc in $parallel $serial; do
  if [[ $rc -ne 0 && $rc -ne 5 ]]; then exit "$rc"; fi
done
if [[ $parallel -eq 5 && $serial -eq 5 ]]; then exit 5; fi
exit 0
