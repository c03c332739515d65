"""Small validators shared by the config dataclasses; each raises :class:`SpecError`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from autotune.errors import SpecError

MAX_LIST_ITEMS = 1_000
"""Most entries of a list field (a search axis): enumerating the space multiplies them."""


def _range(minimum: float, maximum: float | None, strict: bool = False) -> str:
    text = f"{'>' if strict else '>='} {minimum}"
    return text if maximum is None else f"{text} and <= {maximum}"


def check_int(field: str, value: Any, *, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer ``>= minimum`` and ``<= maximum`` (bools are refused: YAML's ``yes`` is
    not 1). The maxima the configs give are generous for real machines and models, and
    keep every product the planner forms (world size, layouts, FLOPs) small and finite."""
    if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
            or (maximum is not None and value > maximum)):
        raise SpecError(field, value, f"allowed: an integer {_range(minimum, maximum)}")
    return value


def check_float(field: str, value: Any, *, minimum: float = 0.0, maximum: float | None = None,
                strict: bool = False) -> float:
    """A finite real number within ``[minimum, maximum]`` (``(minimum, ...`` when
    ``strict``): ``.inf`` and ``.nan`` are refused (``timeout_s: .inf`` would reach the SLURM
    launcher as an ``OverflowError``), and so is an integer too big for a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(field, value, "allowed: a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    low_ok = number > minimum if strict else number >= minimum
    high_ok = maximum is None or number <= maximum
    if not (math.isfinite(number) and low_ok and high_ok):
        raise SpecError(field, value,
                        f"allowed: a finite number {_range(minimum, maximum, strict)}")
    return number


def check_list(field: str, value: Any, *, maximum: int = MAX_LIST_ITEMS) -> list[Any]:
    """A non-empty list of at most ``maximum`` entries."""
    if not isinstance(value, list) or not value or len(value) > maximum:
        raise SpecError(field, value, f"allowed: a non-empty list of at most {maximum} entries")
    return value


def check_text(field: str, value: Any, *, max_chars: int = 4096) -> str:
    """One line of printable text of at most ``max_chars`` characters (a path, a URL, a
    label): a newline or NUL would reach file names, job scripts or ``exec``."""
    if not isinstance(value, str) or len(value) > max_chars or not value.isprintable():
        raise SpecError(field, value, f"allowed: one line of printable text of at most "
                        f"{max_chars} characters")
    return value


def check_choice(field: str, value: Any, choices: Iterable[Any]) -> Any:
    """One of ``choices``."""
    allowed = tuple(choices)
    if isinstance(value, bool) and not any(isinstance(c, bool) for c in allowed):
        raise SpecError(field, value, f"allowed: one of {', '.join(map(repr, allowed))}")
    if value not in allowed:
        raise SpecError(field, value, f"allowed: one of {', '.join(map(repr, allowed))}")
    return value


def check_keys(section: str, data: Any, allowed: Iterable[str]) -> Mapping[str, Any]:
    """A mapping whose keys are all in ``allowed`` (typos are errors, not ignored)."""
    if not isinstance(data, Mapping):
        raise SpecError(section, data, "expected a mapping")
    known = sorted(allowed)
    for key in data:
        if key not in known:
            raise SpecError(f"{section}.{key}", data[key],
                            f"unknown key; allowed keys: {', '.join(known)}")
    return data


def optional_section(data: Mapping[str, Any], section: str) -> Any:
    """An optional section of ``data``: an empty one (``search:`` with nothing under it,
    YAML's null) is ``{}``, its defaults; anything else is returned for its config to
    check, so ``search: 0`` or ``launcher: false`` is an error naming the section, not
    silently the defaults (``data.get(section) or {}`` took every falsy value for empty)."""
    value = data.get(section)
    return {} if value is None else value
