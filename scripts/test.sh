#!/usr/bin/env bash
# `make test`: the whole suite in two phases, then where its time went.
#
# 1. Every test that leaves the shared broker alone, except the unit tier: on TEST_WORKERS
#    pytest-xdist workers (default 3: on 2 cores a third worker runs while the others wait; this
#    phase took 794 s on 2 workers and 695 s on 3), or in this process when TEST_WORKERS=1.
#    `--dist loadgroup`: tests/conftest.py keeps whole the files with module-scoped servers and
#    hands out the long tests first.
# 2. The tests marked `serial` (they stop, restart or pause the broker, or count its connections),
#    alone against the broker, while the unit tier (no broker, no Spark) uses the other core.
# The cluster tier (tests/cluster, `make test-cluster`) is in neither phase.
# Then the slowest 15 tests, time per tier and the idlest files (tests/support/timing.py), the
# machine's CPU over the run, and a closing `N passed, N failed, N skipped` line over every run.
# Arguments go to every pytest run (a path selects within each phase).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORKERS=${TEST_WORKERS:-3}
# The junit files stay in .test-results/ (`python -m tests.support.timing .test-results/*.xml` prints
# the report again).
out=${RMQS_TEST_RESULTS:-.test-results}
mkdir -p "$out"
rm -f "$out"/*.xml "$out"/unit.log
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8; exit}' /proc/stat; }
cpu0=$(busy)
start=$SECONDS
xdist=()
if [[ $WORKERS -gt 1 ]]; then xdist=(-n "$WORKERS" --dist loadgroup); fi
"$PY" -m pytest "${xdist[@]}" -m "not serial and not unit and not cluster" --junitxml "$out/parallel.xml" "$@"
parallel=$?
first=$((SECONDS - start))
"$PY" -m pytest -m unit --junitxml "$out/unit.xml" "$@" >"$out/unit.log" 2>&1 &
unit_pid=$!
"$PY" -m pytest -m serial --junitxml "$out/serial.xml" "$@"
serial=$?
wait "$unit_pid"
unit=$?
echo "--- the unit tier (ran beside the serial phase; whole output in $out/unit.log):"
grep -E "^(FAILED|ERROR)|passed|failed|no tests ran" "$out/unit.log" | tail -20
"$PY" -m tests.support.timing "$out"/parallel.xml "$out"/serial.xml "$out"/unit.xml
cpu1=$(busy)
echo "make test: the machine's CPU over the run: $(( (cpu1 - cpu0) / $(getconf CLK_TCK) )) s on $(nproc) cores (every process: tests, JVMs, broker)"
echo "make test: pytest took $((SECONDS - start)) s: phase 1 $first s (exit $parallel), serial phase and unit tier $((SECONDS - start - first)) s (exit $serial, $unit)"
# Exit 5 is "no test collected": fine for one run (a path given with no serial test in it).
for rc in $parallel $serial $unit; do
  if [[ $rc -ne 0 && $rc -ne 5 ]]; then exit "$rc"; fi
done
if [[ $parallel -eq 5 && $serial -eq 5 && $unit -eq 5 ]]; then exit 5; fi
exit 0
