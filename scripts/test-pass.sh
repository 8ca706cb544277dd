#!/usr/bin/env bash
# One pass of `make test` with the development cluster up, in three parts, so that it
# takes about as long as its longest file rather than the sum of its tests' waits:
#   1. the stress tests (marker heavy: CPU-bound, each with a store of its own) at
#      nice 19, in the background, all along parts 2 and 3;
#   2. meanwhile the others, in TEST_WORKERS processes (pytest-xdist): the cluster's tests
#      mostly wait for their jobs; a file's tests stay in one process, in order, sharing
#      its fixtures (one set of jobs, one SMTP server on the cluster's port);
#   3. then the tests marked serial, alone: they change the cluster for every job while
#      they run (its config, its store, its hooks) or count every job of a user.
# A failing part does not stop the others; the pass fails if any part did.
# usage: scripts/test-pass.sh MARKEXPR PATH...   (MARKEXPR "" selects every test)
#        scripts/test-pass.sh --parts               (the parts' names, for the total)
# PYTEST is the Makefile's pytest command (make exports it). With TEST_RESULTS set to a
# folder, each part writes its JUnit XML there as MARKEXPR-PART.xml, or TEST_PASS_NAME-PART.xml
# (for the total that `make test` prints at its end: scripts/test-total.py).
set -u
cd "$(dirname "$0")/.."
parts=(heavy side-by-side serial)
if [ "${1:-}" = --parts ]; then
  echo "${parts[@]}"
  exit 0
fi
select=$1
shift
read -r -a pytest <<< "${PYTEST:?the pytest command: run this through make (make test, make integration)}"

marked() {  # the pass's selection and one part's
  if [ -n "$select" ]; then echo "($select) and ($1)"; else echo "$1"; fi
}

ran() {  # pytest's status: 5 (no test selected) is not a failure
  [ "$1" -eq 0 ] || [ "$1" -eq 5 ]
}

results() {  # where a part writes its JUnit XML, if anywhere
  if [ -n "${TEST_RESULTS:-}" ]; then echo "--junitxml=$TEST_RESULTS/${TEST_PASS_NAME:-${select:-all}}-$1.xml"; fi
}

status=0
heavy_log=$(mktemp)
# nice 19 counts only against this session's own processes (the kernel's autogroup shares
# the CPU between sessions first): the stress tests get about the share of a job's
# session, which is what their time bounds need. Put lower (in a session of their own at
# nice 19, or 5), the 500-epilog test lost a summary or two to the epilog's 20 s bound
# while the hint rules' CPU-bound jobs ran (two CI runs of three).
nice -n 19 "${pytest[@]}" $(results heavy) -m "$(marked heavy)" "$@" > "$heavy_log" 2>&1 &
heavy=$!
"${pytest[@]}" $(results side-by-side) -n "${TEST_WORKERS:-4}" --dist loadfile \
  -m "$(marked 'not heavy and not serial')" "$@"
ran $? || status=1
echo "--- the tests that need the cluster to themselves:"
"${pytest[@]}" $(results serial) -m "$(marked serial)" "$@"
ran $? || status=1
wait "$heavy"
ran $? || status=1
echo "--- the stress tests, run beside the above at nice 19:"
cat "$heavy_log"
rm -f "$heavy_log"
exit $status
