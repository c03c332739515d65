#!/usr/bin/env bash
# Set up everything and run the whole test suite (what CI runs: .ci/run calls this).
#
#   1. scripts/setup.sh: the virtual environment (torch CPU, DeepSpeed, autotune[dev])
#   2. .ci/services.sh: a real single-node SLURM with accounting, and the PostgreSQL and
#      MariaDB this machine runs; .ci/cluster.sh: a 4-node SLURM cluster beside it (one
#      network namespace per node; 2-3 s) for the `multinode` tests (needs root and apt;
#      skipped elsewhere: the SLURM and database tests then skip with their reason, except
#      under CI=true, where they fail)
#   3. scripts/megatron_env.sh when AUTOTUNE_MEGATRON_DIR is set (CI: ../shared/megatron-
#      deepspeed): the test-only environment of the `megatron` tests' real trials
#   4. ruff and mypy (started before step 3, beside it), then pytest (2 workers: see below)
#      over tests/ and the doctests of autotune/ and trainer/
#
# The tests' environment is scripts/test_env.sh's, which scripts/test_under_load.sh (the
# same tests beside busy loops) shares. Extra arguments go to pytest, e.g.
# `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/setup.sh
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  bash .ci/services.sh start
  bash .ci/cluster.sh start
else
  echo "[test] not root with apt: SLURM/PostgreSQL services not started (their tests skip)"
fi
. scripts/test_env.sh
# Lint and types need only .venv: they run beside the Megatron-DeepSpeed build (mypy takes
# ~30 s of one core; the build waits on pip and a compiler), their output shown after it.
lint_log=$(mktemp)
trap 'rm -f "$lint_log"' EXIT
( .venv/bin/ruff check autotune trainer tests benchmarks && .venv/bin/mypy autotune trainer ) \
  > "$lint_log" 2>&1 &
lint_pid=$!
# The `megatron` tests' test-only environment (.megatron-env) is built first, where
# AUTOTUNE_MEGATRON_DIR is set (scripts/test_env.sh).
if [ -n "${AUTOTUNE_MEGATRON_DIR:-}" ]; then
  t1=$(date +%s)
  bash scripts/megatron_env.sh
  echo "[test] Megatron-DeepSpeed environment took $(( $(date +%s) - t1 )) s"
fi
echo "[test] setup took $(( $(date +%s) - t0 )) s; lint and types"
lint_rc=0
wait "$lint_pid" || lint_rc=$?
cat "$lint_log"
[ "$lint_rc" = 0 ] || { echo "[test] lint or types failed (exit $lint_rc)"; exit "$lint_rc"; }
# Two pytest workers (pytest-xdist) by default: a 2-core machine runs the suite in about
# three quarters of the time, because many tests wait (on SLURM, subprocesses, timeouts) rather
# than compute. Each module stays whole on one worker (its fixtures run once), the SLURM
# tests share one worker, so do the Megatron tests, and an `alone` test runs with nothing
# beside it (tests/xdist_groups.py). AUTOTUNE_TEST_WORKERS=0 runs the suite in this process,
# one test after the other.
workers=${AUTOTUNE_TEST_WORKERS:-2}
if [[ ! "$workers" =~ ^[0-9]+$ ]]; then
  echo "[test] AUTOTUNE_TEST_WORKERS=$workers: allowed: an integer >= 0 (0: no workers)" >&2
  exit 2
fi
echo "[test] running pytest ($((10#$workers)) worker(s))"
.venv/bin/python -m pytest -q --durations=40 -n "$((10#$workers))" --dist loadgroup "$@" \
  "${TEST_PATHS[@]}"
