#!/usr/bin/env bash
# TEST-ONLY scaffolding: the environment the `megatron` tests' trials run real
# Megatron-DeepSpeed `pretrain_gpt.py` in, on CPU, beside the project's own .venv (which keeps
# its DeepSpeed; nothing is installed into it). A user with their own Megatron environment
# needs none of this. Idempotent: a second run only checks (about a second).
#
#   AUTOTUNE_MEGATRON_DIR  a Megatron-DeepSpeed checkout (a folder with pretrain_gpt.py and
#                          megatron/), or a folder holding several (each sub-folder that has
#                          pretrain_gpt.py); CI: ../shared/megatron-deepspeed
#   MEGATRON_ENV=.megatron-env  where it is built (ignored by git)
#
# What it builds, and why (facts from running the deepspeedai fork at 4efb479 on CPU):
#   $MEGATRON_ENV/deepspeed/  DeepSpeed 0.18.9 (DS_BUILD_OPS=0), first on the trials'
#                             PYTHONPATH: megatron/training.py imports deepspeed.compression,
#                             which DeepSpeed 0.19 removed
#   $MEGATRON_ENV/site/       what Megatron imports unconditionally: transformers (+
#                             huggingface_hub, tokenizers, safetensors, requests and its
#                             dependencies), pybind11, regex, six; and a torchvision STUB
#                             (megatron/data/vit_dataset.py imports torchvision even for GPT,
#                             and the index's torchvision wheel is a CUDA build)
#   $TORCH_EXTENSIONS_DIR/megatron-deepspeed-0.18.9/  DeepSpeed 0.18.9's CPU shm op, built
#   $MEGATRON_ENV/forks/NAME/ a copy of each checkout with its C++ data-set helpers built
#                             (megatron/data/Makefile: the shared checkout is read-only, and
#                             Megatron would run `make` there at start-up)
# Every install is --no-deps with the versions pinned below, under constraints/cpu.txt:
# torch is never pulled.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ENV_DIR=${MEGATRON_ENV:-.megatron-env}
PY=${PYTHON:-$ROOT/.venv/bin/python}
SRC=${AUTOTUNE_MEGATRON_DIR:?set AUTOTUNE_MEGATRON_DIR to a Megatron-DeepSpeed checkout (or a folder of them)}
export PIP_DISABLE_PIP_VERSION_CHECK=1
STAMP_VERSION=1
PINS=(transformers==4.57.1 huggingface_hub==0.36.0 tokenizers==0.22.1 safetensors==0.6.2
      requests==2.32.5 urllib3==2.5.0 certifi==2025.10.5 idna==3.11
      charset_normalizer==3.4.4 regex==2025.10.23 pybind11==3.0.1 six==1.17.0)
mkdir -p "$ENV_DIR"
ENV_DIR=$(cd "$ENV_DIR" && pwd)
t0=$(date +%s)

if [ "$(cat "$ENV_DIR/deepspeed/.ok" 2>/dev/null)" != "0.18.9" ]; then
  echo "[megatron-env] DeepSpeed 0.18.9 (DS_BUILD_OPS=0) into $ENV_DIR/deepspeed"
  rm -rf "$ENV_DIR/deepspeed"
  # --no-build-isolation: the build imports the venv's torch instead of fetching one.
  DS_BUILD_OPS=0 "$PY" -m pip install -q --no-deps --no-build-isolation \
    -c constraints/cpu.txt --target "$ENV_DIR/deepspeed" deepspeed==0.18.9
  echo 0.18.9 > "$ENV_DIR/deepspeed/.ok"
fi

if [ "$(cat "$ENV_DIR/site/.ok" 2>/dev/null)" != "${PINS[*]} $STAMP_VERSION" ]; then
  echo "[megatron-env] ${PINS[*]} into $ENV_DIR/site"
  rm -rf "$ENV_DIR/site"
  "$PY" -m pip install -q --no-deps -c constraints/cpu.txt --target "$ENV_DIR/site" "${PINS[@]}"
  # The torchvision stub: the names Megatron's ViT modules use at import time
  # (megatron/data/vit_dataset.py, image_folder.py); any use fails loudly.
  mkdir -p "$ENV_DIR/site/torchvision"
  cat > "$ENV_DIR/site/torchvision/__init__.py" <<'EOF'
"""TEST-ONLY torchvision stub (autotune scripts/megatron_env.sh): GPT never uses it."""
from . import datasets, transforms  # noqa: F401
__version__ = "0.0.0+autotune.stub"
def get_image_backend():
    raise RuntimeError("torchvision stub: no image backend (autotune test scaffolding)")
EOF
  cat > "$ENV_DIR/site/torchvision/datasets.py" <<'EOF'
"""TEST-ONLY torchvision stub."""
class VisionDataset:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("torchvision stub: no data sets (autotune test scaffolding)")
def __getattr__(name):
    raise AttributeError(f"torchvision stub has no datasets.{name}")
EOF
  cat > "$ENV_DIR/site/torchvision/transforms.py" <<'EOF'
"""TEST-ONLY torchvision stub."""
def __getattr__(name):
    raise AttributeError(f"torchvision stub has no transforms.{name}")
EOF
  echo "${PINS[*]} $STAMP_VERSION" > "$ENV_DIR/site/.ok"
fi

# DeepSpeed's CPU communication op, JIT-built by every CPU rank's first `init_distributed`
# (one to three minutes): built once here, into a folder of its own under
# $TORCH_EXTENSIONS_DIR (kept apart from the project's DeepSpeed 0.19 build of the same op;
# scripts/test.sh keeps that folder in ~/.cache, so that a fresh CI clone reuses it). The
# folder is written to $MEGATRON_ENV/torch_extensions_dir for the tests, which give it to
# the trials as TORCH_EXTENSIONS_DIR.
EXT_DIR=${TORCH_EXTENSIONS_DIR:-$ENV_DIR}/megatron-deepspeed-0.18.9
echo "$EXT_DIR" > "$ENV_DIR/torch_extensions_dir"
if [ ! -f "$EXT_DIR/.ok" ]; then
  echo "[megatron-env] building DeepSpeed 0.18.9's CPU shm op"
  TORCH_EXTENSIONS_DIR="$EXT_DIR" DS_ACCELERATOR=cpu \
    PYTHONPATH="$ENV_DIR/deepspeed:$ENV_DIR/site" "$PY" -c \
    "from deepspeed.comm.torch import build_shm_op; assert build_shm_op() is not None" >/dev/null
  touch "$EXT_DIR/.ok"
fi

# torch's JIT loader takes a plain lock file in the op's build folder at every load
# (torch/utils/file_baton.py) and a rank killed while holding it leaves it behind: every
# later trial then waits on it for ever (found: a MiCS trial killed by torchrun). No trial
# runs while this script does, so a lock here is stale (the tests run it before their trials,
# and their 2 pytest workers keep every Megatron test on one: tests/xdist_groups.py).
find "$EXT_DIR" -name lock -type f -delete 2>/dev/null || true

# The forks: SRC itself when it is a checkout, else each sub-folder that is one.
if [ -f "$SRC/pretrain_gpt.py" ]; then forks=("$SRC"); else forks=("$SRC"/*/); fi
mkdir -p "$ENV_DIR/forks"
INCLUDES=$(PYTHONPATH="$ENV_DIR/site" "$PY" -m pybind11 --includes)
SUFFIX=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
for fork in "${forks[@]}"; do
  fork=${fork%/}
  [ -f "$fork/pretrain_gpt.py" ] || continue
  name=$(basename "$fork")
  dest=$ENV_DIR/forks/$name
  src_sum=$(cd "$fork" && find megatron pretrain_gpt.py -type f -printf '%s %p\n' \
            2>/dev/null | sort | md5sum | cut -c1-16)
  if [ "$(cat "$dest/.ok" 2>/dev/null)" != "$src_sum" ]; then
    echo "[megatron-env] copying $name and building its data-set helpers"
    rm -rf "$dest"
    mkdir -p "$dest"
    cp -r "$fork"/. "$dest"/
    chmod -R u+w "$dest"
    make -s -C "$dest/megatron/data" CXXFLAGS="-O3 -w -shared -std=c++11 -fPIC" CPPFLAGS="$INCLUDES" LIBEXT="$SUFFIX"
    echo "$src_sum" > "$dest/.ok"
  fi
done
# The argonne-lcf fork imports wandb and tensorboard unconditionally (megatron/training.py
# line 33, `import wandb`; megatron/timers.py line 12, `from tensorboard.summary import
# Writer`; everywhere else they are guarded): stubs with no run and no writer, on the
# argonne trials' PYTHONPATH only ($ENV_DIR/argonne), never the deepspeedai fork's.
if [ ! -f "$ENV_DIR/argonne/tensorboard/summary.py" ]; then
  mkdir -p "$ENV_DIR/argonne/tensorboard"
  echo '"""TEST-ONLY tensorboard stub (autotune scripts/megatron_env.sh)."""' \
    > "$ENV_DIR/argonne/tensorboard/__init__.py"
  cat > "$ENV_DIR/argonne/tensorboard/summary.py" <<'EOF2'
"""TEST-ONLY tensorboard stub: a Writer type for annotations, never constructed."""
class Writer:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("tensorboard stub: no writer (autotune test scaffolding)")
EOF2
fi
if [ ! -f "$ENV_DIR/argonne/wandb/__init__.py" ]; then
  mkdir -p "$ENV_DIR/argonne/wandb"
  cat > "$ENV_DIR/argonne/wandb/__init__.py" <<'EOF2'
"""TEST-ONLY wandb stub (autotune scripts/megatron_env.sh): no run, nothing logged."""
run = None
def log(*args, **kwargs):
    return None
def init(*args, **kwargs):
    raise RuntimeError("wandb stub: no wandb here (autotune test scaffolding)")
EOF2
fi
# ezpz/distributed.py runs `from mpi4py import MPI` at import, and megatron/checkpointing.py
# calls ez.get_world_size(): mpi4py needs an MPI library to load. mpi4py's binary wheel
# dlopens one at import (mpi4py/_mpiabi.py), and MPICH's runtime wheel ships it. --prefix,
# not --target: --target drops the wheel's data files, lib/libmpi.so.12 among them. The
# tests give the argonne trials $ENV_DIR/mpi/site on PYTHONPATH and MPI4PY_LIBMPI (the file
# named in $ENV_DIR/mpi/libmpi), never the deepspeedai fork's.
MPI_PINS=(mpi4py==4.1.2 mpich==5.0.2)
if [ "$(cat "$ENV_DIR/mpi/.ok" 2>/dev/null)" != "${MPI_PINS[*]}" ]; then
  echo "[megatron-env] ${MPI_PINS[*]} into $ENV_DIR/mpi"
  rm -rf "$ENV_DIR/mpi"
  "$PY" -m pip install -q --no-deps --prefix "$ENV_DIR/mpi/prefix" "${MPI_PINS[@]}"
  site=$(ls -d "$ENV_DIR"/mpi/prefix/lib/python3*/site-packages)
  ln -s "$site" "$ENV_DIR/mpi/site"
  echo "$ENV_DIR/mpi/prefix/lib/libmpi.so.12" > "$ENV_DIR/mpi/libmpi"
  MPI4PY_LIBMPI=$(cat "$ENV_DIR/mpi/libmpi") PYTHONPATH="$ENV_DIR/mpi/site" "$PY" -c \
    "from mpi4py import MPI; assert MPI.Get_library_version().startswith('MPICH')"
  echo "${MPI_PINS[*]}" > "$ENV_DIR/mpi/.ok"
fi
# What ezpz imports at `import ezpz` (ezpz/configs.py: rich; ezpz/log: rich, omegaconf), on
# the argonne trials' PYTHONPATH only ($ENV_DIR/argonne-site). Without rich, ezpz's lazy
# __getattr__ skips the module that failed and megatron/timers.py line 15 stops at
# "module 'ezpz' has no attribute 'get_logger'".
EZPZ_PINS=(rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 omegaconf==2.4.0
           antlr4-python3-runtime==4.9.3)
if [ "$(cat "$ENV_DIR/argonne-site/.ok" 2>/dev/null)" != "${EZPZ_PINS[*]}" ]; then
  echo "[megatron-env] ${EZPZ_PINS[*]} into $ENV_DIR/argonne-site"
  rm -rf "$ENV_DIR/argonne-site"
  "$PY" -m pip install -q --no-deps -c constraints/cpu.txt --target "$ENV_DIR/argonne-site" \
    "${EZPZ_PINS[@]}"
  echo "${EZPZ_PINS[*]}" > "$ENV_DIR/argonne-site/.ok"
fi
# The argonne-lcf fork imports ezpz (not the index's unrelated `ezpz`): its src/ on the path.
for ez in "$SRC"/ezpz-*/src; do
  [ -d "$ez" ] && [ ! -d "$ENV_DIR/ezpz/ezpz" ] && { rm -rf "$ENV_DIR/ezpz"; mkdir -p "$ENV_DIR/ezpz"; cp -r "$ez"/. "$ENV_DIR/ezpz"/; }
done
echo "[megatron-env] ok in $(( $(date +%s) - t0 )) s: $ENV_DIR (forks: $(ls "$ENV_DIR/forks" | tr '\n' ' '))"
