"""The real Megatron-DeepSpeed: where it is, and the environment its trials run in.

``AUTOTUNE_MEGATRON_DIR`` points at a Megatron-DeepSpeed checkout (a folder with
``pretrain_gpt.py``) or at a folder of several (CI: ``../shared/megatron-deepspeed``, the
pinned snapshots). Without it the ``megatron`` tests skip with the reason, except under
``CI=true``, where they fail. ``scripts/megatron_env.sh`` builds the trials' environment
(test-only scaffolding: DeepSpeed 0.18.9, the packages Megatron imports, a torchvision
stub) into ``.megatron-env``; :func:`megatron_env` runs it (a second run only checks).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.helpers import REPO

ENV_VAR = "AUTOTUNE_MEGATRON_DIR"
ENV_DIR = REPO / ".megatron-env"


@dataclass(frozen=True)
class MegatronEnv:
    forks: dict[str, Path]
    """Fork folder name (e.g. ``deepspeedai-4efb479``) -> its built copy."""
    env: dict[str, str]
    """What a trial's ``workload.env`` needs beside ``LOCAL_SIZE``."""

    def fork(self, prefix: str) -> Path:
        found = [p for name, p in self.forks.items() if name.startswith(prefix)]
        if not found:
            unavailable(f"Megatron-DeepSpeed fork {prefix}*",
                        f"not among {sorted(self.forks)} ({ENV_VAR})",
                        script="scripts/megatron_env.sh")
        return found[0]


@pytest.fixture(scope="session")
def megatron_env() -> MegatronEnv:
    source = os.environ.get(ENV_VAR)
    if not source:
        unavailable("Megatron-DeepSpeed", f"{ENV_VAR} is not set (a checkout, or a folder of "
                    "them; CI: ../shared/megatron-deepspeed)", script="scripts/megatron_env.sh")
    done = subprocess.run(["bash", str(REPO / "scripts" / "megatron_env.sh")],
                          capture_output=True, text=True, timeout=1200, check=False,
                          env={**os.environ, ENV_VAR: str(Path(source).resolve())})
    if done.returncode != 0:
        pytest.fail(f"scripts/megatron_env.sh failed:\n{done.stderr[-3000:]}")
    forks = {p.name: p for p in sorted((ENV_DIR / "forks").iterdir())
             if (p / "pretrain_gpt.py").is_file()}
    ext = (ENV_DIR / "torch_extensions_dir").read_text().strip()
    path = f"{ENV_DIR / 'deepspeed'}:{ENV_DIR / 'site'}"
    return MegatronEnv(forks=forks, env={
        "PYTHONPATH": path, "TORCH_EXTENSIONS_DIR": ext, "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"})
