#!/usr/bin/env bash
# The test command: set everything up, lint, type-check, then run the whole test suite.
# Extra arguments go to pytest, in one process (e.g. `bash scripts/test.sh -m "not slow"`). Without any, the suite
# runs as two pytest processes side by side (T3AR_TEST_LANES=1: in one).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== set up (${SECONDS} s)" >&2

lanes=2
if [ $# -gt 0 ] || [ "${T3AR_TEST_LANES:-2}" = 1 ]; then lanes=1; fi
if [ "$lanes" = 2 ]; then
  # Two lanes (tests/lanes.py, pytest --lane): lane 2 holds the tests that mostly wait on other processes (the embedded
  # stack's jobs, the real Milvus server's starts and kills, the OpenAPI fuzzers' services), lane 1 the rest. In one
  # process the 2 cores sat idle 44 % of the run. Lane 2 starts now, so the checks below use its idle time too; its
  # output is shown once it ends. Each lane takes its own half of the ports free_port picks from.
  mkdir -p .cache/test
  log2=.cache/test/lane2.log
  echo "== pytest lane 2 in the background (its log: $log2, shown at the end)" >&2
  .venv/bin/python -m pytest --lane 2 -o cache_dir=.cache/test/pytest-lane2 >"$log2" 2>&1 &
  lane2=$!
  trap 'kill "$lane2" 2>/dev/null || true' EXIT
fi

echo "== ruff" >&2
.venv/bin/ruff check .
echo "== mypy (${SECONDS} s)" >&2
.venv/bin/mypy  # the packages t3ar and t3ar_services (pyproject.toml)
echo "== import contract (lint-imports) (${SECONDS} s)" >&2
.venv/bin/lint-imports --no-cache  # [tool.importlinter] in pyproject.toml
echo "== containers (hadolint, compose schema) (${SECONDS} s)" >&2
bash scripts/check_containers.sh

if [ "$lanes" = 1 ]; then
  echo "== pytest (${SECONDS} s)" >&2
  exec .venv/bin/python -m pytest "$@"
fi
echo "== pytest lane 1 (${SECONDS} s)" >&2
rc1=0
.venv/bin/python -m pytest --lane 1 || rc1=$?
echo "== pytest lane 1 ended (exit status $rc1, ${SECONDS} s); waiting for lane 2" >&2
rc2=0
wait "$lane2" || rc2=$?
trap - EXIT
echo "== pytest lane 2 (exit status $rc2, ${SECONDS} s): its output" >&2
cat "$log2"
echo "== pytest: lane 1 exit status $rc1, lane 2 exit status $rc2 (${SECONDS} s in all)" >&2
[ "$rc1" = 0 ] && [ "$rc2" = 0 ]
