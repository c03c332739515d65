"""Plain text for the terminal: tables with aligned columns, and durations (no dependency).

>>> print(format_table(["a", "bb"], [[1, "x"], [22, "yy"]]))
a   bb
--  --
1   x
22  yy
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["format_table", "fmt", "format_duration"]


def fmt(value: Any, digits: int = 4) -> str:
    """Numbers to short strings; ``None`` to ``-``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in cells]
    return "\n".join(lines)


def format_duration(seconds: float) -> str:
    """``75`` → ``1m15s``; ``3725`` → ``1h02m``."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
