#!/usr/bin/env bash
# Tests with every core held by a busy loop. CI runs on 2 cores that other work may share,
# so a test that fails on a loaded machine is a defect of the test or of the code, never a
# case for a retry: run the tests a change touches this way before calling it done.
#
#   bash scripts/test_under_load.sh tests/runner tests/launchers
#   LOAD_PROCS=1 bash scripts/test_under_load.sh -m "not slow" tests/trainer
#
# Arguments go to pytest (none: the whole suite, as scripts/test.sh runs it). LOAD_PROCS:
# how many busy loops (default: one per core, `nproc`). It sets nothing up: run
# scripts/test.sh once first (the venv, and where it can, the services and the
# Megatron-DeepSpeed environment; tests whose parts are missing skip as they do there).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  echo "[load] no .venv here: run 'bash scripts/test.sh' (or scripts/setup.sh) first" >&2
  exit 2
fi
procs=${LOAD_PROCS:-$(nproc)}
if [[ ! "$procs" =~ ^[0-9]+$ ]] || (( 10#$procs < 1 )); then
  echo "[load] LOAD_PROCS=$procs: allowed: an integer >= 1" >&2
  exit 2
fi
procs=$((10#$procs))
. scripts/test_env.sh
[ "$#" -gt 0 ] || set -- "${TEST_PATHS[@]}"
hogs=()
# The loops end with the script, and are gone when it returns (waited for, not only signalled).
trap 'kill "${hogs[@]}" 2>/dev/null || true; wait "${hogs[@]}" 2>/dev/null || true' EXIT
for _ in $(seq "$procs"); do
  .venv/bin/python -c 'while True: pass' > /dev/null 2>&1 &
  hogs+=("$!")
done
echo "[load] $procs busy loop(s) (pids ${hogs[*]}) running beside pytest $*"
t0=$(date +%s)
rc=0
.venv/bin/python -m pytest -q --durations=20 "$@" || rc=$?
echo "[load] pytest exited $rc after $(( $(date +%s) - t0 )) s with $procs busy loop(s)"
exit "$rc"
