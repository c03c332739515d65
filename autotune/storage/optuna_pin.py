"""The Optuna releases whose private storage models autotune writes and reads, checked when
a database is opened.

:mod:`autotune.storage._optuna_rdb` and :mod:`autotune.storage.judged` use
``optuna.storages._rdb.models`` (``TrialModel``, ``TrialValueModel``,
``TrialIntermediateValueModel``, the attribute models, ``count_past_trials``,
``stored_repr_to_value``), which Optuna may change in any release without notice. A release
outside :data:`KNOWN` is refused in one line instead of writing trials it might read
differently; ``pyproject.toml`` pins the same range.
"""

from __future__ import annotations

import re

from autotune.errors import StorageError

__all__ = ["KNOWN", "KNOWN_TEXT", "check_optuna_version"]

KNOWN: tuple[tuple[int, int], tuple[int, int]] = ((5, 0), (5, 2))
"""``(lowest, first unknown)`` ``(major, minor)``: 5.0 (the layout these modules were
written against) and 5.1 (the one tested here)."""

KNOWN_TEXT = ">=5.0,<5.2"
"""The range as ``pyproject.toml`` writes it."""


def check_optuna_version(version: str | None = None) -> None:
    """Refuse an Optuna outside :data:`KNOWN` (``version``: the installed one by default)."""
    if version is None:
        import optuna

        version = optuna.__version__
    match = re.match(r"(\d+)\.(\d+)", version)
    lowest, beyond = KNOWN
    if match is None or not lowest <= (int(match[1]), int(match[2])) < beyond:
        raise StorageError(
            f"optuna {version} is installed; autotune reads and writes Optuna's private "
            f"storage models, known for optuna {KNOWN_TEXT}: install one of those "
            f"(pip install 'optuna{KNOWN_TEXT}')")
