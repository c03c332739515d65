# Sourced by scripts/test.sh and scripts/test_under_load.sh (from the checkout's root): the
# environment the tests run in, the same for both.
#
# The services .ci/services.sh started (SLURM_CONF, the database URLs), where it ran.
if [ -f /tmp/autotune-ci/env ]; then
  . /tmp/autotune-ci/env
fi
# DeepSpeed JIT-builds its CPU communication op once; keep the build with the checkout's
# caches rather than in a home directory that CI may not keep.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}
# As an activated venv: the tools the tests' trials run come from .venv (`python` in the
# example templates; `ninja`, with which DeepSpeed builds that op: a build by the system's
# ninja is rebuilt by the venv's, inside a trial, where a kill mid-build leaves a lock
# behind that hangs every later build).
export PATH="$PWD/.venv/bin:$PATH"
# The `megatron` tests run real Megatron-DeepSpeed: CI uses the pinned snapshots beside the
# checkout; a developer points AUTOTUNE_MEGATRON_DIR at their own checkout (or leaves it
# unset: the tests skip).
if [ "${CI:-}" = true ] && [ -z "${AUTOTUNE_MEGATRON_DIR:-}" ]; then
  export AUTOTUNE_MEGATRON_DIR=$PWD/../shared/megatron-deepspeed
fi
# What "the whole suite" is, for both scripts: the tests and the package's doctests.
TEST_PATHS=(tests autotune trainer)
