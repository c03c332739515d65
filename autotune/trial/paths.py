"""The on-disk layout of one trial, defined once (submitit's ``JobPaths``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["TrialPaths"]


@dataclass(frozen=True)
class TrialPaths:
    """The on-disk layout of one trial, defined once (submitit's ``JobPaths``): the launchers
    write it, the workloads and the exporter read it, so it lives beside the spec and result
    it holds rather than in the launcher package."""

    root: Path
    batch: tuple[TrialPaths, ...] = ()
    """The other trials run in the same launch as this one, after it (a batch: this
    directory holds the launch's logs)."""
    hold: tuple[Path, float] | None = None
    """A held launch's word file and how long to wait for it (:mod:`autotune.launchers.
    held`); ``None``: the launch ends after its last trial."""

    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    @property
    def stdout(self) -> Path:
        return self.root / "stdout.log"

    @property
    def stderr(self) -> Path:
        return self.root / "stderr.log"

    @property
    def report(self) -> Path:
        return self.root / "launch.json"

    @property
    def metrics(self) -> Path:
        """A foreign program's metrics file (``$AUTOTUNE_METRICS_FILE``)."""
        return self.root / "metrics.jsonl"

    @property
    def ds_config(self) -> Path:
        """A foreign program's DeepSpeed config (``{ds_config}``)."""
        return self.root / "ds_config.json"

    def rank_errors(self) -> list[Path]:
        """Error files a failing rank leaves beside the result (``result.json.rank3.err``)."""
        return sorted(self.root.glob("result.json.rank*.err"))

    def prepare(self) -> None:
        """Create the directory; clear what a previous attempt left (a retry starts clean)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in (self.result, self.report, self.metrics, self.root / "hold.json",
                      *self.rank_errors()):
            stale.unlink(missing_ok=True)

    @classmethod
    def for_trial(cls, run_dir: str | Path, study: str, number: int, key: str) -> TrialPaths:
        return cls(Path(run_dir) / study / f"trial-{number:05d}-{key}")
