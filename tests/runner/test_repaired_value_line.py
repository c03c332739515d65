"""Issue 23, smaller item: a worker whose trial was repaired as killed while it was stopped
(its record refused: another worker owns the layout now) says so, and prints no value line
for that trial: the study holds no such value."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

import autotune.storage.claims as claims_module
from autotune.launchers import make_launchers
from autotune.runner.progress import Progress
from autotune.runner.study import run_study
from autotune.spec import load_study
from autotune.storage import open_storage
from tests.replay_study import write_replay_study


def test_a_refused_record_prints_no_value_line(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_replay_study(tmp_path, name="late", url=f"sqlite:///{tmp_path / 's.db'}",
                              n_trials=2)
    refused: list[int] = []

    def record_refused(storage: Any, *, trial_id: int, **_: Any) -> bool:
        refused.append(trial_id)  # what record_execution answers once the repair won
        return False

    # The door (TrialStore.record) calls it through its module.
    monkeypatch.setattr(claims_module, "record_execution", record_refused)
    spec = load_study(path)
    stream = io.StringIO()
    launchers = make_launchers(spec.launcher, spec.model, spec.cluster, spec.training,
                               source=spec.source, workload=spec.workload)
    run_study(spec, open_storage(spec.storage), launchers,
              progress=Progress(2, stream=stream))
    out = stream.getvalue()
    assert len(refused) == 2, out
    assert out.count("was repaired as killed while it ran") == 2, out
    assert "TFLOPS/device in" not in out, out  # the value line of trial_finished
