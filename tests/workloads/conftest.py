"""Helpers of the workload tests: programs that stand in for users' training programs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO

# The stand-in programs are run, not collected (limit_as imports torch and DeepSpeed).
collect_ignore = ["programs"]
PROGRAMS = Path(__file__).parent / "programs"


@pytest.fixture(scope="session")
def deepspeed_cpu_ops() -> Iterator[None]:
    """DeepSpeed compiles its CPU shared-memory all-reduce op the first time a plain
    DeepSpeed program initialises on CPU (about a minute; then cached in
    ~/.cache/torch_extensions): done once here, so that no trial's start-up pays it.

    For the tests that use it, this interpreter's bin folder (the venv's) comes first on
    PATH, as in an activated venv, for the build here and for every trial after it: the
    op is built by the ``ninja`` the trials find. A build by another ninja (the system's)
    is rebuilt by the first trial (their ``.ninja_log`` versions differ), inside its
    start-up time, and a trial stopped in the middle of that build leaves torch's build
    lock behind, on which every later DeepSpeed program waits for ever."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-c", "from deepspeed.comm.torch import "
                               "build_shm_op; build_shm_op()"], env=env, capture_output=True,
                              text=True, timeout=900, cwd=REPO)
        assert done.returncode == 0, done.stderr[-2000:]
        yield
