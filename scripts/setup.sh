#!/usr/bin/env bash
# Set up autotune in a virtual environment (.venv by default). Idempotent: a second run
# only checks. Order matters: torch first (CPU wheel, pinned by constraints/cpu.txt), then
# DeepSpeed from its source distribution with DS_BUILD_OPS=0 (its torch>=2.0 requirement
# would otherwise pull a CUDA torch), then autotune itself.
#
#   VENV=.venv              where to install
#   AUTOTUNE_TORCH=keep     keep an already installed torch (XPU/CUDA clusters bring their
#                           own; create the venv with --system-site-packages or install it)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q)
if [ "${AUTOTUNE_TORCH:-}" = keep ] && "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "[setup] keeping torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
  CONSTRAINT=()
else
  CONSTRAINT=(-c constraints/cpu.txt)
  if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
    echo "[setup] installing torch (CPU build)"
    "${PIP[@]}" "${CONSTRAINT[@]}" torch
  fi
fi
if ! "$VENV/bin/python" -c "import deepspeed" 2>/dev/null; then
  echo "[setup] installing DeepSpeed (DS_BUILD_OPS=0: ops are JIT-built on first use)"
  DS_BUILD_OPS=0 "${PIP[@]}" "${CONSTRAINT[@]}" "deepspeed>=0.16"
fi
echo "[setup] installing autotune and its extras"
"${PIP[@]}" "${CONSTRAINT[@]}" -e ".[dev]"
# The project's modules as bytecode, as pip compiles any package it installs and an editable
# install does not: where PYTHONDONTWRITEBYTECODE is set (this machine, CI), every
# interpreter importing autotune compiled its hundred modules again, 0.08 of the 0.94 CPU-s
# of a worker's start, paid by each task of a job array (issue 23). A module edited since
# is compiled in memory as before (its bytecode no longer matches): nothing stale is run.
"$VENV/bin/python" -m compileall -q autotune trainer >/dev/null
echo "[setup] ok: $("$VENV/bin/python" -c 'import torch, deepspeed, optuna; print(f"torch {torch.__version__}, deepspeed {deepspeed.__version__}, optuna {optuna.__version__}")')"
