"""What ran, recorded in the trial's folder: ``command.json`` (issue 21).

The argv the launcher started (the supervisor, torchrun or srun and the program), the
environment variables autotune set or changed for it (those that differ from the runner's
own environment: the launcher's, the workload's ``env`` and the rank variables), and the
working directory. Values of secret-looking names (:data:`SECRET_NAME`) and passwords in
URLs are masked, so that the folder can be shared. ``autotune best --emit command`` prints
the study's own program with its ``workload.env`` for the same reason: the printed line
alone reproduces the run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from autotune.atomic import write_json_atomic
from autotune.trial import TrialPaths

__all__ = ["SECRET_NAME", "mask_env", "set_by_autotune", "write_launch_record", "FILENAME"]

FILENAME = "command.json"
SECRET_NAME = re.compile(r"(?i)token|secret|passw|credential|api_?key|private|auth")
"""Environment variable names whose values are never written down."""
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@\s]+@")
MASK = "***"


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with secret values masked.

    >>> mask_env({"HF_TOKEN": "abc", "DB": "postgresql://me:pw@host/db", "LOCAL_SIZE": "2"})
    {'HF_TOKEN': '***', 'DB': 'postgresql://me:***@host/db', 'LOCAL_SIZE': '2'}
    """
    return {k: MASK if SECRET_NAME.search(k) else _URL_PASSWORD.sub(rf"\g<1>{MASK}@", v)
            for k, v in env.items()}


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
