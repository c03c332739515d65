"""A trial's facts as the worker records them: the measurements row and the user
attributes (:class:`~autotune.storage.TrialFacts`), from the launch's result and the
study's predictions and calibration."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from autotune.layout import Layout
from autotune.planning.candidates import Candidate
from autotune.runner.learning import StudyLearning
from autotune.spec import StudySpec
from autotune.storage import TrialFacts, measurement_row, utcnow
from autotune.trial import TrialPaths, TrialResult
from autotune.trial.outcome import Verdict

__all__ = ["FactsBuilder"]


@dataclass
class FactsBuilder:
    """Builds one worker's :class:`TrialFacts` and measurement rows."""

    spec: StudySpec
    launcher_kind: str
    worker: str
    learning: StudyLearning
    """The worker's learning (its calibration is refit during the run: read at each call)."""

    def facts(self, layout: Layout, *, trial_id: int, number: int, outcome: Verdict | None,
               t0: datetime, elapsed_s: float, result: TrialResult | None, hosts: list[str],
               paths: TrialPaths | None, cand: Candidate | None,
               finished: datetime | None = None,
               batch: dict[str, Any] | None = None) -> TrialFacts:
        return TrialFacts(
            study_name=self.spec.name, trial_number=number, trial_id=trial_id,
            layout=layout, outcome=outcome, result=result, launcher=self.launcher_kind,
            worker=self.worker, started_at=t0, finished_at=finished or utcnow(),
            elapsed_s=elapsed_s, hosts=hosts,
            predicted_tflops_per_device=cand.predicted_tflops if cand else None,
            predicted_memory_bytes=cand.predicted_memory_bytes if cand else None,
            trial_dir=str(paths.root) if paths else None,
            calibrated_tflops_per_device=cand.predicted_tflops
            * self.learning.calibration.throughput_factor if cand else None,
            calibrated_memory_bytes=self.learning.calibrated_memory_bytes(layout),
            batch=batch)

    def row(self, facts: TrialFacts) -> dict[str, Any]:
        spec = self.spec
        return measurement_row(facts, model=spec.model, cluster=spec.cluster,
                               global_batch=spec.training.global_batch,
                               dtype=spec.training.dtype, workload=self.learning.key.workload)
