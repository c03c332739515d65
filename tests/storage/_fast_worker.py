"""A study worker with an instant launcher, for concurrency tests of the shared database.

``python -m tests.storage._fast_worker STUDY.yaml`` runs the real runner (:func:`run_study`:
claims, heartbeats, ask/tell) with a launcher that writes a deterministic result at once.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

from autotune.launchers.base import Launcher
from autotune.runner.study import run_study
from autotune.spec import load_study
from autotune.storage import open_storage
from autotune.trial import TrialPaths, TrialResult, TrialSpec


class InstantLauncher(Launcher):
    kind = "instant"

    def _start(self, spec: TrialSpec, paths: TrialPaths) -> Any:
        digest = hashlib.sha256(spec.layout.key().encode()).digest()
        value = 0.001 + digest[0] / 1000.0
        TrialResult(status="ok", model_tflops_per_device=value, step_time_s=0.01,
                    world_size=spec.layout.world_size, device="cpu").write(paths.result)
        return None

    def _poll(self, handle: Any) -> int | None:
        return 0

    def _kill(self, handle: Any) -> None:
        pass


def main(study_file: str) -> int:
    spec = load_study(study_file)
    storage = open_storage(spec.storage)
    try:
        summary = run_study(spec, storage, InstantLauncher())
    finally:
        storage.close()
    print(f"measured={summary.measured} stopped_by={summary.stopped_by}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
