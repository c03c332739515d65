"""Small validators shared by the config dataclasses; each raises :class:`SpecError`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from autotune.errors import SpecError


def check_int(field: str, value: Any, *, minimum: int = 1) -> int:
    """An integer ``>= minimum`` (bools are refused: YAML's ``yes`` is not 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(field, value, f"allowed: an integer >= {minimum}")
    return value


def check_float(field: str, value: Any, *, minimum: float = 0.0, maximum: float | None = None,
                strict: bool = False) -> float:
    """A real number within ``[minimum, maximum]`` (``(minimum, ...`` when ``strict``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(field, value, "allowed: a number")
    low_ok = value > minimum if strict else value >= minimum
    high_ok = maximum is None or value <= maximum
    if not (low_ok and high_ok):
        rng = f"{'>' if strict else '>='} {minimum}"
        if maximum is not None:
            rng += f" and <= {maximum}"
        raise SpecError(field, value, f"allowed: a number {rng}")
    return float(value)


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
