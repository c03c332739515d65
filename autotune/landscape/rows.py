"""Reading a landscape CSV: the text of a file or stream, and one row with typed accessors
whose errors name the column and the line (:func:`autotune.landscape.load_landscape`)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from autotune.errors import SpecError
from autotune.hardware import MAX_TFLOPS_PER_DEVICE

__all__ = ["Row", "read_text", "check_columns"]


def read_text(path: str | os.PathLike[str] | IO[str], field: str = "--landscape",
              ) -> tuple[str, str]:
    # utf-8-sig: a table saved by a spreadsheet starts with a byte-order mark, which would
    # otherwise become part of the first column's name ('\ufeff# GPUs')
    if hasattr(path, "read"):
        return getattr(path, "name", "<stream>"), path.read().removeprefix("\ufeff")
    try:
        return str(path), Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise SpecError(field, str(path), "no such file") from None
    except UnicodeDecodeError as err:  # a binary file named by mistake: not a traceback
        raise SpecError(field, str(path), f"not UTF-8 text (byte {err.start}); "
                        "allowed: a CSV in the vTrain or Aurora format") from None


class Row:
    """One CSV row with typed accessors whose errors name the column and the line."""

    def __init__(self, header: list[str], line: int, cells: list[str], source: str):
        if len(cells) != len(header):
            raise SpecError(f"line {line}", ",".join(cells),
                            f"expected {len(header)} columns as in the header, "
                            f"got {len(cells)}", source=source)
        self.values = dict(zip(header, (c.strip() for c in cells), strict=True))
        self.line, self.source = line, source

    def _err(self, column: str, allowed: str) -> SpecError:
        return SpecError(f"line {self.line}, column {column!r}", self.values.get(column),
                         allowed, source=self.source)

    def text(self, column: str) -> str:
        return self.values[column]

    def integer(self, column: str, *, minimum: int = 1) -> int:
        raw = self.values[column]
        try:
            value = float(raw)
        except ValueError:
            raise self._err(column, f"allowed: an integer >= {minimum}") from None
        if not value.is_integer() or value < minimum:
            raise self._err(column, f"allowed: an integer >= {minimum}")
        return int(value)

    def number(self, column: str, *, optional: bool = False) -> float | None:
        raw = self.values[column]
        if raw == "" and optional:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise self._err(column, "allowed: a positive number") from None
        if not (value > 0 and math.isfinite(value)):
            # 'inf' parses as a float; a step of infinite time is no measurement (and no
            # stored result may hold it: JSON has no infinity).
            raise self._err(column, "allowed: a positive number")
        return value

    def throughput(self, column: str, tflops: float) -> float:
        """``tflops``, the model TFLOPS per device a row's ``column`` gives, if a result
        could hold it: finite and at most :data:`~autotune.hardware.MAX_TFLOPS_PER_DEVICE`,
        the bound on a measured trial's (a step of 1e-300 ms is a positive number whose
        throughput no JSON writer takes)."""
        if not (math.isfinite(tflops) and tflops <= MAX_TFLOPS_PER_DEVICE):
            raise self._err(column, f"gives {tflops:.3g} model TFLOPS per device; allowed: "
                                    f"a value that gives at most {MAX_TFLOPS_PER_DEVICE:g}")
        return tflops

    def flag(self, column: str) -> bool:
        raw = self.values[column].lower()
        if raw in ("true", "1", "yes"):
            return True
        if raw in ("false", "0", "no", ""):
            return False
        raise self._err(column, "allowed: true or false")

    def build(self, what: str, factory: Any, **kwargs: Any) -> Any:
        """Construct a config object; its SpecError gains the line number."""
        try:
            return factory(**kwargs)
        except SpecError as err:
            raise SpecError(f"line {self.line} ({what}) {err.field}", err.value, err.allowed,
                            source=self.source) from None


def check_columns(header: list[str], required: Iterable[str], source: str) -> None:
    missing = [c for c in required if c not in header]
    if missing:
        raise SpecError("landscape header", ",".join(header),
                        f"missing column(s) {', '.join(map(repr, missing))}", source=source)
