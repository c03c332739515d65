"""One exception root for autotune, and the errors users see.

Every error a user can cause (study file, CLI flag, result file, database URL) is a
subclass of :class:`AutotuneError` and carries a message that names what was wrong, the
value given and what is allowed. The CLI maps :class:`UsageError` to exit code 2 and every
other :class:`AutotuneError` to exit code 1.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = [
    "AutotuneError",
    "UsageError",
    "EmptySpaceError",
    "SpecError",
    "StorageError",
    "LaunchError",
    "short_repr",
    "SHOWN_CHARS",
]

SHOWN_CHARS = 80
"""At most this much of a bad value (its ``repr``) is quoted in a message: a 50 MB name or
an alias bomb must not become a 50 MB message."""
_HUGE_INT_BITS = 256  # ~77 digits; a bigger integer is shown by its size, not its digits


class _ShortRepr(reprlib.Repr):
    """``reprlib`` with every level bounded: huge integers by their size (``repr`` of one
    is quadratic and refused past 4,300 digits), bytes and subclasses of the containers
    like the containers (``reprlib`` would call their full ``repr``)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxlist, self.maxtuple, self.maxdict = 3, 5, 5, 5
        self.maxset = self.maxfrozenset = self.maxdeque = 5
        self.maxstring = self.maxother = self.maxlong = SHOWN_CHARS // 2

    def repr_int(self, x: int, level: int) -> str:
        if abs(x).bit_length() > _HUGE_INT_BITS:
            return f"<an integer of about {int(abs(x).bit_length() * 0.30103) + 1} digits>"
        return super().repr_int(x, level)

    def repr_bytes(self, x: bytes, level: int) -> str:
        return repr(x[:self.maxstring]) + (self.fillvalue if len(x) > self.maxstring else "")

    def repr_instance(self, x: Any, level: int) -> str:
        for base in (int, str, bytes, list, tuple, dict, set, frozenset):
            if isinstance(x, base):  # a subclass: shown as its base type, bounded
                return str(getattr(self, "repr_" + base.__name__)(x, level))
        return str(super().repr_instance(x, level))


_REPR = _ShortRepr()


def short_repr(value: Any, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` cut to about ``limit`` characters, in time and memory bounded
    whatever the value (a string is quoted from its start, then its length is given).

    >>> short_repr("x" * 1000)[-26:]
    "xxxx'... (1000 characters)"
    >>> short_repr(10**500)
    '<an integer of about 501 digits>'
    """
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = _REPR.repr(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > _REPR.maxlist:
        text += f" ({len(value)} items)"
    return text


class AutotuneError(Exception):
    """Root of every error autotune raises on purpose."""


class UsageError(AutotuneError):
    """The user asked for something malformed or impossible (exit code 2)."""


class EmptySpaceError(UsageError):
    """A study has no feasible layout to measure (exit code 2): its message says why.
    Apart from the other usage errors so that a scaling run can skip such a size (a large
    model on a few nodes) and go on with the sizes it fits."""


class SpecError(UsageError):
    """A field of a study file, trial spec or result file is invalid.

    ``str(err)`` reads ``<field>: got <value!r>; <allowed>`` so that the user can fix the
    file without reading code; the value (and a field named after a user's key) is quoted
    by :func:`short_repr`, at most a short prefix however large it is.
    """

    def __init__(self, field: str, value: Any, allowed: str, *, source: str | None = None):
        self.field = field
        self.value = value
        self.allowed = allowed
        self.source = source
        where = f"{source}: " if source else ""
        name = field if len(field) <= 2 * SHOWN_CHARS else (
            f"{field[:2 * SHOWN_CHARS]}... ({len(field)} characters)")  # a key of the file
        super().__init__(f"{where}{name}: got {short_repr(value)}; {allowed}")


class StorageError(AutotuneError):
    """The database could not be reached or refused an operation (exit code 1)."""


class LaunchError(AutotuneError):
    """A launcher could not start a trial at all (as opposed to a trial that failed)."""
