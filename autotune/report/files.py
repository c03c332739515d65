"""Where a report's files go, defined once, and how each is written: atomically.

A report directory::

    OUT/report.md | report.html   the report (one format per run; both may coexist)
    OUT/plots/*.png               static plots the report embeds (relative links)
    OUT/data/trials.{csv,parquet}        one row per Optuna trial
    OUT/data/measurements.{csv,parquet}  one row per trial execution (the SQL table)

Every file is written to a temporary name beside its target and renamed over it, so a
reader (a browser, a CI artifact upload, a second report run) sees the old file or the
whole new one, never a part (submitit's result-file pattern).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.util.atomic import atomic_path, write_text_atomic

__all__ = ["ReportPaths", "atomic_path", "write_text_atomic"]


@dataclass(frozen=True)
class ReportPaths:
    """The on-disk layout of one report."""

    root: Path

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def report(self, fmt: str) -> Path:
        """``report.md`` or ``report.html``."""
        return self.root / f"report.{fmt}"

    def plot(self, name: str) -> Path:
        return self.plots / f"{name}.png"

    def export(self, frame: str, fmt: str) -> Path:
        """``data/<frame>.csv`` or ``data/<frame>.parquet``."""
        return self.data / f"{frame}.{fmt}"

    def relative(self, path: Path) -> str:
        """A link from the report file to ``path`` (always with ``/``)."""
        return path.relative_to(self.root).as_posix()

