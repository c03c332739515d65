"""One exception root for autotune, and the errors users see.

Every error a user can cause (study file, CLI flag, result file, database URL) is a
subclass of :class:`AutotuneError` and carries a message that names what was wrong, the
value given and what is allowed. The CLI maps :class:`UsageError` to exit code 2 and every
other :class:`AutotuneError` to exit code 1.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AutotuneError",
    "UsageError",
    "SpecError",
    "StorageError",
    "LaunchError",
]


class AutotuneError(Exception):
    """Root of every error autotune raises on purpose."""


class UsageError(AutotuneError):
    """The user asked for something malformed or impossible (exit code 2)."""


class SpecError(UsageError):
    """A field of a study file, trial spec or result file is invalid.

    ``str(err)`` reads ``<field>: got <value!r>; <allowed>`` so that the user can fix the
    file without reading code.
    """

    def __init__(self, field: str, value: Any, allowed: str, *, source: str | None = None):
        self.field = field
        self.value = value
        self.allowed = allowed
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: got {value!r}; {allowed}")


class StorageError(AutotuneError):
    """The database could not be reached or refused an operation (exit code 1)."""


class LaunchError(AutotuneError):
    """A launcher could not start a trial at all (as opposed to a trial that failed)."""
