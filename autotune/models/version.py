"""Which version of the cost and memory models predicted a stored measurement row.

The calibration (:mod:`autotune.models.calibration`) fits ``measured / predicted`` over
the rows of every study of a device type in the database. A row's prediction is the one
the models made when its trial ran; after an upgrade that changed them (a new term, a
corrected allocation), an old row's ratio says how wrong the *old* models were, and
carried into a new study's warm start it would correct the new predictions by the old
error. So each row stores :func:`model_version`, a digest of the source the predictions
come from (``autotune/models/`` and the device table ``autotune/hardware.py``), and the
warm start leaves out rows of another version (:func:`stale`). A digest of the source,
not a hand-kept number: nobody has to remember to bump it, and an edit that changes no
prediction (a comment) costs only the warm start of the first study after the upgrade.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__all__ = ["model_version", "stale"]

_ROOT = Path(__file__).resolve().parent.parent
"""The ``autotune`` package."""


@functools.lru_cache(maxsize=1)
def model_version() -> str:
    """16 hex digits of the SHA-256 of every file of ``autotune/models/`` (by relative
    path, line endings normalised) and of ``autotune/hardware.py``: equal exactly where
    the models' source is."""
    digest = hashlib.sha256()
    files = sorted(p for p in (_ROOT / "models").rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts)
    for path in [*files, _ROOT / "hardware.py"]:
        digest.update(path.relative_to(_ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes().replace(b"\r\n", b"\n") + b"\0")
    return digest.hexdigest()[:16]


def stale(version: str | None) -> bool:
    """A row's predictions came from other models than these: its ``model_version`` is
    set and differs. Rows written before autotune recorded it (``NULL``) are kept, as
    they were before."""
    return version is not None and version != model_version()
