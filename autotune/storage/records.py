"""What autotune stores on an Optuna trial: its writers and readers, and the
``measurements`` row, built from the same facts as the trial's attributes (the keys:
:mod:`autotune.storage.keys`; a study's records: :mod:`autotune.storage.study_records`).

User attributes are what optuna-dashboard shows next to each trial and study. Every key is
named here once (:class:`TrialAttr`, :class:`StudyAttr`), as :mod:`autotune.storage.schema`
names the SQL columns: the runner writes through the writers below, and the reports, the
status commands and the campaign read through the readers or the constants, so that the
table, the dashboard and the reports agree. Changing a key here changes what old studies
can be read with, so keys are added, not renamed.

This module imports nothing of the loop (no launcher, no Optuna study handling), so that
readers (:mod:`autotune.report`, :mod:`autotune.report.results`) can use it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from autotune.hardware import GiB
from autotune.layout import Layout
from autotune.models.calibration import BUILTIN_WORKLOAD
from autotune.models.version import model_version
from autotune.storage.keys import (
    FAILED_TRIAL_SYSTEM_ATTR,
    RESULT_ATTRS,
    RUNNING,
    HasAttrs,
    SetsAttrs,
    TrialAttr,
)
from autotune.trial import TrialResult
from autotune.trial.outcome import Verdict
from autotune.trial.reason_text import tail_at_word

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

__all__ = ["TrialFacts", "measurement_row", "user_attrs", "verdict_attrs",
           "retry_attrs", "set_user_attrs", "best_trial", "trial_layout",
           "trial_energy", "trial_energy_line", "trial_tokens_per_s",
           "trial_layout_key", "trial_outcome", "trial_reason", "is_retry"]


@dataclass(frozen=True)
class TrialFacts:
    """Everything known about one trial execution once it ended."""

    study_name: str
    trial_number: int
    trial_id: int
    layout: Layout
    outcome: Verdict | None
    """``None``: the execution is claimed and has not ended (its claim-time row, outcome
    :data:`~autotune.storage.keys.RUNNING`)."""
    result: TrialResult | None
    launcher: str
    worker: str
    started_at: datetime
    finished_at: datetime
    elapsed_s: float
    hosts: list[str]
    predicted_tflops_per_device: float | None
    predicted_memory_bytes: float | None
    trial_dir: str | None = None
    calibrated_tflops_per_device: float | None = None
    calibrated_memory_bytes: float | None = None
    batch: dict[str, Any] | None = None
    """Where the trial sat in its launch (:attr:`autotune.trial.report.LaunchReport.batch`)."""


def measurement_row(facts: TrialFacts, *, model: Any, cluster: Any, global_batch: int,
                    dtype: str, workload: str = BUILTIN_WORKLOAD) -> dict[str, Any]:
    """A row of the ``measurements`` table (``autotune.storage.schema.Measurement``). Its
    predictions are the models' own, uncalibrated: what the next calibration fits."""
    lay, res = facts.layout, facts.result
    return {
        "study_name": facts.study_name, "trial_number": facts.trial_number,
        "trial_id": facts.trial_id, "layout_key": lay.key(),
        "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "micro_batch": lay.micro_batch,
        "grad_accum": lay.grad_accum, "zero_stage": lay.zero_stage, "recompute": lay.recompute,
        "sequence_parallel": lay.sequence_parallel, "world_size": lay.world_size,
        "global_batch": global_batch,
        "model_name": model.name, "n_layer": model.n_layer, "hidden": model.hidden,
        "n_head": model.n_head, "seq_len": model.seq_len, "vocab_size": model.vocab_size,
        "n_params": float(model.n_params()), "device_type": cluster.device,
        "nodes": cluster.nodes, "devices_per_node": cluster.devices_per_node, "dtype": dtype,
        "workload": workload,
        "outcome": RUNNING if facts.outcome is None else facts.outcome.kind.value,
        "status": res.status if res else None,
        "reason": (facts.outcome.reason or None) if facts.outcome is not None else None,
        "model_tflops_per_device": res.model_tflops_per_device if res else None,
        "hardware_tflops_per_device": res.hardware_tflops_per_device if res else None,
        "mfu": res.mfu if res else None,
        "step_time_s": res.step_time_s if res else None,
        "step_time_iqr_s": res.step_time_iqr_s if res else None,
        "tokens_per_s": res.tokens_per_s if res else None,
        "peak_memory_bytes": float(res.peak_memory_bytes) if res and res.peak_memory_bytes
        else None,
        "predicted_memory_bytes": facts.predicted_memory_bytes,
        "predicted_tflops_per_device": facts.predicted_tflops_per_device,
        # which models predicted them: the warm start leaves out another version's rows
        "model_version": model_version() if facts.predicted_memory_bytes is not None
        or facts.predicted_tflops_per_device is not None else None,
        "elapsed_s": facts.elapsed_s, "launcher": facts.launcher,
        "hosts": json.dumps(facts.hosts or (res.hosts if res else [])),
        "versions": json.dumps(res.versions) if res else None,
        # The start-up breakdown (timings_s), the precision reached and the batch travel
        # in the result's JSON: readers take them from there (startup_of).
        "result_json": json.dumps({**res.to_dict(), "launch_batch": facts.batch})
        if res else None,
        "worker": facts.worker, "started_at": facts.started_at,
        "finished_at": facts.finished_at,
        # NULL where no counter measured (never 0): trainer/energy.py, autotune/energy.py
        "energy_j_per_step": res.energy_j_per_step if res else None,
        "energy_source": res.energy_source if res else None,
        "joules_per_token": res.joules_per_token if res else None,
        "model_tflops_per_watt": res.model_tflops_per_watt if res else None,
    }


def user_attrs(facts: TrialFacts) -> dict[str, Any]:
    """A measured trial's user attributes: readable in optuna-dashboard, JSON-serialisable."""
    if facts.outcome is None:
        raise ValueError(f"trial {facts.trial_number}: no outcome yet, nothing to record")
    res = facts.result
    attrs: dict[str, Any] = {
        TrialAttr.LAYOUT: facts.layout.key(),
        TrialAttr.WORLD_SIZE: facts.layout.world_size,
        TrialAttr.DP: facts.layout.dp,
        TrialAttr.GRAD_ACCUM: facts.layout.grad_accum,
        TrialAttr.OUTCOME: facts.outcome.kind.value,
        TrialAttr.WORKER: facts.worker,
        TrialAttr.LAUNCHER: facts.launcher,
        TrialAttr.ELAPSED_S: round(facts.elapsed_s, 2),
    }
    if facts.outcome.reason:
        attrs[TrialAttr.REASON] = tail_at_word(facts.outcome.reason, 1500)
    if facts.predicted_tflops_per_device is not None:
        attrs[TrialAttr.PREDICTED_TFLOPS] = facts.predicted_tflops_per_device
    if facts.predicted_memory_bytes is not None:
        attrs[TrialAttr.PREDICTED_MEMORY_GIB] = round(facts.predicted_memory_bytes / GiB, 3)
    if facts.calibrated_tflops_per_device is not None:
        attrs[TrialAttr.CALIBRATED_TFLOPS] = facts.calibrated_tflops_per_device
    if facts.calibrated_memory_bytes is not None:
        attrs[TrialAttr.CALIBRATED_MEMORY_GIB] = round(facts.calibrated_memory_bytes / GiB, 4)
    if facts.trial_dir:
        attrs[TrialAttr.TRIAL_DIR] = facts.trial_dir
    if facts.hosts:
        attrs[TrialAttr.HOSTS] = facts.hosts
    if res is not None:
        for key in RESULT_ATTRS:
            value = getattr(res, key)
            if value is not None:
                attrs[key] = value
        if res.peak_memory_bytes is not None:
            attrs[TrialAttr.PEAK_MEMORY_GIB] = round(res.peak_memory_bytes / GiB, 3)
        if res.versions:
            attrs[TrialAttr.VERSIONS] = res.versions
        if res.timings_s:
            attrs[TrialAttr.TIMINGS_S] = res.timings_s
        if res.measure_precision is not None:
            attrs[TrialAttr.MEASURE_PRECISION] = round(res.measure_precision, 5)
        if res.step_times_s:
            attrs[TrialAttr.MEASURED_STEPS] = len(res.step_times_s)
    if facts.batch:
        attrs[TrialAttr.BATCH] = facts.batch
    attrs[TrialAttr.LAYOUT_DICT] = facts.layout.to_dict()
    return attrs


def verdict_attrs(layout: Layout, outcome: str, reason: str, *,
                  worker: str | None = None) -> dict[str, Any]:
    """The attributes of a proposal judged without launching it (infeasible, skipped)."""
    attrs: dict[str, Any] = {TrialAttr.LAYOUT: layout.key(),
                             TrialAttr.LAYOUT_DICT: layout.to_dict(),
                             TrialAttr.OUTCOME: outcome, TrialAttr.REASON: reason}
    if worker is not None:
        attrs[TrialAttr.WORKER] = worker
    return attrs


def retry_attrs(trial_number: int) -> dict[str, Any]:
    """The attributes a re-enqueued layout starts with: which trial it measures again."""
    return {TrialAttr.RETRY_OF: trial_number}


def set_user_attrs(target: SetsAttrs, attrs: Mapping[str, Any]) -> None:
    """Write ``attrs`` on an Optuna trial or study, one user attribute each."""
    for key, value in attrs.items():
        target.set_user_attr(key, value)


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """:func:`autotune.storage.judged.highest` of an Optuna study's trials (the runner's
    own reads go through :func:`autotune.storage.judged.read_best_trial`)."""
    from optuna.trial import TrialState

    from autotune.storage.judged import highest

    return highest(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def trial_layout(trial: HasAttrs) -> Layout | None:
    """The layout a judged trial ran or was refused (``None``: not judged yet)."""
    data = trial.user_attrs.get(TrialAttr.LAYOUT_DICT)
    return None if data is None else Layout.from_dict(data)


def trial_energy(trial: HasAttrs) -> dict[str, Any]:
    """The trial's energy figures (``None`` each where not measured), by result key."""
    attrs = trial.user_attrs
    return {k: attrs.get(k) for k in (TrialAttr.ENERGY_J_PER_STEP, TrialAttr.ENERGY_SOURCE,
                                      TrialAttr.JOULES_PER_TOKEN, TrialAttr.TFLOPS_PER_WATT)}


def trial_energy_line(trial: HasAttrs) -> str:
    """``energy: ... J/step, ... J/token (source)`` or "energy: not measured (no counter)"."""
    from autotune.energy import energy_text

    e = trial_energy(trial)
    return energy_text(e[TrialAttr.ENERGY_J_PER_STEP], e[TrialAttr.ENERGY_SOURCE],
                       e[TrialAttr.JOULES_PER_TOKEN])


def trial_tokens_per_s(trial: HasAttrs) -> float | None:
    value = trial.user_attrs.get(TrialAttr.TOKENS_PER_S)
    return float(value) if isinstance(value, (int, float)) else None


def trial_layout_key(trial: HasAttrs) -> str | None:
    return trial.user_attrs.get(TrialAttr.LAYOUT)


def trial_outcome(trial: HasAttrs) -> str | None:
    """The trial's outcome kind or :data:`SKIPPED`; ``None`` when nobody judged it."""
    return trial.user_attrs.get(TrialAttr.OUTCOME)


def trial_reason(trial: HasAttrs) -> str:
    return trial.user_attrs.get(TrialAttr.REASON) or ""


def is_retry(user_attrs: Mapping[str, Any], system_attrs: Mapping[str, Any]) -> bool:
    """Whether a trial re-runs a layout whose first run was cut short: re-enqueued by the
    runner after an interrupt, or by Optuna after its runner died."""
    return FAILED_TRIAL_SYSTEM_ATTR in system_attrs or TrialAttr.RETRY_OF in user_attrs
