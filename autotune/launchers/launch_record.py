"""What ran, recorded in the trial's folder: ``command.json``.

The argv the launcher started (the supervisor, torchrun or srun and the program), the
environment variables autotune set or changed for it (those that differ from the runner's
own environment: the launcher's, the workload's ``env`` and the rank variables), and the
working directory. Values of secret-looking names and passwords in URLs are masked
(:func:`autotune.storage.urls.mask_env`), so that the folder can be shared. ``autotune
best --emit command`` prints the study's own program with its ``workload.env`` for the
same reason: the printed line alone reproduces the run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from autotune.storage.urls import mask_env
from autotune.trial import TrialPaths
from autotune.util.atomic import write_json_atomic

__all__ = ["set_by_autotune", "write_launch_record", "FILENAME"]

FILENAME = "command.json"
def set_by_autotune(env: Mapping[str, str], base: Mapping[str, str] | None = None
                    ) -> dict[str, str]:
    """The variables of ``env`` that ``base`` (default: this process's environment) lacks
    or has another value of."""
    base = os.environ if base is None else base
    return {k: v for k, v in sorted(env.items()) if base.get(k) != v}


def write_launch_record(paths: TrialPaths, *, argv: Sequence[str], env: Mapping[str, str],
                        cwd: str | None = None) -> None:
    """``command.json`` in the trial's folder (module docstring); ``env``: the launch's
    whole environment."""
    write_json_atomic(paths.root / FILENAME, {
        "argv": list(argv), "env": mask_env(set_by_autotune(env)),
        "cwd": cwd or os.getcwd()})
