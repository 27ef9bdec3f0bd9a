#!/usr/bin/env bash
# `make test`: the whole suite in two phases, then where its time went.
#
# 1. Every test that leaves the shared broker alone, the unit tier included (handed out last, it fills
#    the end): on TEST_WORKERS pytest-xdist workers (default 3: on 2 cores a third worker runs while
#    the others wait), or in this process when TEST_WORKERS=1. `--dist loadgroup`: tests/conftest.py
#    keeps whole the files with module-scoped servers, runs the tests that stop, restart or pause a
#    broker one after the other against a second broker of their own (the "restartable" group), and
#    hands out the long tests first.
# 2. The tests marked `serial` (they would stop, restart or pause the shared broker: none today),
#    alone against it.
# The container tier (tests/containers, marked `containers`) is not run here: `make test-containers`;
# nor the soak (tests/e2e/soak, marked `soak`): `make soak`.
# The cluster tier (tests/cluster, `make test-cluster`) and the standalone Spark tier
# (tests/spark_cluster, `make test-spark-cluster`) are in neither phase.
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
rm -f "$out"/*.xml "$out"/memory-*.txt
# Spark's class-data archive (tests/support/jvm.py), when missing, is dumped beside the first tests
# instead of before them (or waited for, when `make test` started dumping it): the JVMs started
# meanwhile run without it.
"$PY" -m tests.support.jvm >/dev/null &
dump=$!
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8; exit}' /proc/stat; }
cpu0=$(busy)
start=$SECONDS
xdist=()
# A worker that dies (the OOM killer, a crash) is not replaced: pytest-xdist 3.8's loadgroup scheduler
# can wait forever after a replacement (pytest-xdist#1378; CI once hung there for 75 minutes), so the
# run ends, reporting the test the worker was running. tests/support/memory.py fails a test that grows
# its process past RMQS_TEST_MAX_RSS_MB before the OOM killer would.
if [[ $WORKERS -gt 1 ]]; then xdist=(-n "$WORKERS" --dist loadgroup --max-worker-restart 0); fi
# A hard limit on the phase besides the per-test timeout (600 s): a run that stops making progress
# ends with a message instead of holding CI to its limit. The usual phase takes 640 s.
limit=${RMQS_TEST_PHASE_SECONDS:-1800}
timeout --kill-after=30 "$limit" "$PY" -m pytest "${xdist[@]}" -m "not serial and not containers and not cluster and not spark_cluster and not soak" --junitxml "$out/parallel.xml" "$@"
parallel=$?
if [[ $parallel -eq 124 || $parallel -eq 137 ]]; then
  echo "make test: the suite did not finish within ${limit} s (RMQS_TEST_PHASE_SECONDS) and was stopped" >&2
fi
for f in "$out"/memory-*.txt; do  # a test that passed the memory limit: its stacks (tests/support/memory.py)
  [[ -e $f ]] && { echo "make test: a test passed the memory limit, from $f:" >&2; head -c 20000 "$f" >&2; }
done
first=$((SECONDS - start))
serial=5
if "$PY" -m tests.support.serial; then  # a second phase only when there are serial tests (none today)
  "$PY" -m pytest -m serial --junitxml "$out/serial.xml" "$@"
  serial=$?
fi
wait "$dump" || echo "make test: no class-data archive was dumped (the JVMs ran without it)"
"$PY" -m tests.support.timing "$out"/*.xml
cpu1=$(busy)
echo "make test: the machine's CPU over the run: $(( (cpu1 - cpu0) / $(getconf CLK_TCK) )) s on $(nproc) cores (every process: tests, JVMs, broker)"
echo "make test: pytest took $((SECONDS - start)) s: phase 1 $first s (exit $parallel), serial phase $((SECONDS - start - first)) s (exit $serial)"
# Exit 5 is "no test collected": fine for one run (a path given with no serial test in it).
for rc in $parallel $serial; do
  if [[ $rc -ne 0 && $rc -ne 5 ]]; then exit "$rc"; fi
done
if [[ $parallel -eq 5 && $serial -eq 5 ]]; then exit 5; fi
exit 0
