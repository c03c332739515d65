"""Helpers of the workload tests: programs that stand in for users' training programs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

# The stand-in programs are run, not collected (limit_as imports torch and DeepSpeed).
collect_ignore = ["programs"]
PROGRAMS = Path(__file__).parent / "programs"


@pytest.fixture(scope="session")
def deepspeed_cpu_ops() -> None:
    """DeepSpeed compiles its CPU shared-memory all-reduce op the first time a plain
    DeepSpeed program initialises on CPU (about a minute; then cached in
    ~/.cache/torch_extensions): done once here, so that no trial's start-up pays it."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", "from deepspeed.comm.torch import "
                           "build_shm_op; build_shm_op()"], env=env, capture_output=True,
                          text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
