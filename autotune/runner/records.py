"""Everything autotune stores on Optuna trials and studies: the keys, their writers and
readers; and the ``measurements`` row, built from the same facts as a trial's attributes.

User attributes are what optuna-dashboard shows next to each trial and study. Every key is
named here once (:class:`TrialAttr`, :class:`StudyAttr`), as :mod:`autotune.storage.schema`
names the SQL columns: the runner writes through the writers below, and the reports, the
status commands and the campaign read through the readers or the constants, so that the
table, the dashboard and the reports agree. Changing a key here changes what old studies
can be read with, so keys are added, not renamed.

This module imports nothing of the loop (no launcher, no Optuna study handling), so that
readers (:mod:`autotune.report`, :mod:`autotune.results`) can use it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from autotune.hardware import GiB
from autotune.layout import Layout
from autotune.models.calibration import BUILTIN_WORKLOAD, Calibration, LogCorrection
from autotune.runner.outcome import Outcome
from autotune.trial import TrialResult

__all__ = ["TrialAttr", "StudyAttr", "SKIPPED", "FAILED_TRIAL_SYSTEM_ATTR", "RESULT_ATTRS",
           "TrialFacts", "measurement_row", "user_attrs", "verdict_attrs", "retry_attrs",
           "study_attrs", "set_user_attrs", "trial_layout", "trial_layout_key",
           "trial_outcome", "trial_reason", "is_retry", "study_fingerprint",
           "study_device_memory_gib", "search_stop_record", "workload_record",
           "study_workload",
           "search_stop_of", "search_stop_threshold", "search_stop_line",
           "learned_from_record", "learned_from_of", "learned_from_line"]


class TrialAttr:
    """Keys of a trial's user attributes."""

    LAYOUT = "layout"
    """The layout key (:meth:`autotune.layout.Layout.key`)."""
    LAYOUT_DICT = "layout_dict"
    """The layout as :meth:`autotune.layout.Layout.to_dict` (what readers rebuild it from)."""
    OUTCOME = "outcome"
    """An outcome kind (:data:`autotune.runner.outcome.OUTCOME_KINDS`) or :data:`SKIPPED`;
    absent on a trial whose runner died before judging it."""
    REASON = "reason"
    """Why it is not ``complete``: the error text, the infeasibility reasons, ..."""
    WORKER = "worker"
    """``host:pid`` of the runner (``/i`` for the i-th of several side by side)."""
    LAUNCHER = "launcher"
    WORLD_SIZE = "world_size"
    DP = "dp"
    GRAD_ACCUM = "grad_accum"
    ELAPSED_S = "elapsed_s"
    PREDICTED_TFLOPS = "predicted_tflops_per_device"
    PREDICTED_MEMORY_GIB = "predicted_memory_gib"
    CALIBRATED_TFLOPS = "calibrated_tflops_per_device"
    """The predicted TFLOPS times the study's throughput correction when it was launched
    (:mod:`autotune.models.calibration`); the ``predicted_*`` keys stay the models' own."""
    CALIBRATED_MEMORY_GIB = "calibrated_memory_gib"
    """The predicted peak times the study's memory correction when it was launched."""
    TRIAL_DIR = "trial_dir"
    HOSTS = "hosts"
    MODEL_TFLOPS = "model_tflops_per_device"
    HARDWARE_TFLOPS = "hardware_tflops_per_device"
    MFU = "mfu"
    STEP_TIME_S = "step_time_s"
    STEP_TIME_IQR_S = "step_time_iqr_s"
    TOKENS_PER_S = "tokens_per_s"
    DEVICE = "device"
    DEVICE_NAME = "device_name"
    PEAK_MEMORY_GIB = "peak_memory_gib"
    VERSIONS = "versions"
    RETRY_OF = "retry_of"
    """On a retry: the number of the interrupted or killed trial it measures again."""
    TIMINGS_S = "timings_s"
    ENERGY_J_PER_STEP = "energy_j_per_step"
    """Joules per step over the trial's devices (absent: not measured; docs/trainer.md)."""
    ENERGY_SOURCE = "energy_source"
    JOULES_PER_TOKEN = "joules_per_token"
    TFLOPS_PER_WATT = "model_tflops_per_watt"
    """Where the trial's wall time went, seconds per phase (:data:`autotune.trial.PHASES`)."""
    MEASURE_PRECISION = "measure_precision"
    """Relative precision the median step time reached (half-width of its 95% interval)."""
    MEASURED_STEPS = "measured_steps"
    BATCH = "batch"
    """In a launch of several layouts: ``index``, ``size``, ``lead``, ``rerun``."""


RESULT_ATTRS: tuple[str, ...] = (
    TrialAttr.MODEL_TFLOPS, TrialAttr.HARDWARE_TFLOPS, TrialAttr.MFU, TrialAttr.STEP_TIME_S,
    TrialAttr.STEP_TIME_IQR_S, TrialAttr.TOKENS_PER_S, TrialAttr.DEVICE, TrialAttr.DEVICE_NAME,
    TrialAttr.ENERGY_J_PER_STEP, TrialAttr.ENERGY_SOURCE, TrialAttr.JOULES_PER_TOKEN,
    TrialAttr.TFLOPS_PER_WATT)
"""Trial attributes copied from the :class:`~autotune.trial.TrialResult` field of the same
name."""

SKIPPED = "skipped"
"""The :attr:`TrialAttr.OUTCOME` of a proposal that was not launched and says nothing about
its layout (another trial owns it, or the budget was reached)."""

FAILED_TRIAL_SYSTEM_ATTR = "failed_trial"
"""Optuna's system attribute on a trial that
:class:`~optuna.storages.RetryHeartbeatStaleTrialCallback` re-enqueued (Optuna's key; studies
run before schema v3, whose retries were enqueued trials)."""


class StudyAttr:
    """Keys of a study's user attributes."""

    FINGERPRINT = "fingerprint"
    """What the study measures (model, device, world size, global batch, dtype, workload
    kind): a study name is refused for another one."""
    MODEL = "model"
    CLUSTER = "cluster"
    OBJECTIVE = "objective"
    DEVICE_MEMORY_GIB = "device_memory_gib"
    SEARCH_STOP = "search_stop"
    """Why the strategy last stopped before the budget (a dict from
    :func:`search_stop_record`), or ``None`` once a later proposal was made."""
    LEARNED_FROM = "learned_from"
    """What the study's calibration rests on (a dict from :func:`learned_from_record`):
    the earlier studies and their measurements, and the corrections last fitted."""
    SCALING = "scaling"
    """A scaling study's size: ``{mode: record}`` (:func:`autotune.scaling.run.scaling_record`)."""
    SELECTION = "selection"
    """``search.objective`` as last run (:func:`autotune.objective.selection_record`)."""
    CONFIRMATION = "confirmation"
    """The confirmation round's verdict and cost (a dict from
    :func:`autotune.runner.confirm.confirmation_record`): the best it names, the runner-up,
    the paired interval, rounds, launches, device-seconds."""
    WORKLOAD = "workload"
    """The study's ``workload`` section as last run (:func:`workload_record`): what
    ``autotune best --emit command`` renders the winning launch line from."""



class _HasAttrs(Protocol):
    """An Optuna trial or study handle: something with user attributes to read."""

    @property
    def user_attrs(self) -> dict[str, Any]: ...


class _SetsAttrs(Protocol):
    def set_user_attr(self, key: str, value: Any) -> None: ...


# -- trials: writers ------------------------------------------------------------------------

@dataclass(frozen=True)
class TrialFacts:
    """Everything known about one trial execution once it ended."""

    study_name: str
    trial_number: int
    trial_id: int
    layout: Layout
    outcome: Outcome
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
    """Where the trial sat in its launch (:attr:`autotune.launchers.base.LaunchReport.batch`)."""


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
        "outcome": facts.outcome.kind, "status": res.status if res else None,
        "reason": facts.outcome.reason or None,
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
    res = facts.result
    attrs: dict[str, Any] = {
        TrialAttr.LAYOUT: facts.layout.key(),
        TrialAttr.WORLD_SIZE: facts.layout.world_size,
        TrialAttr.DP: facts.layout.dp,
        TrialAttr.GRAD_ACCUM: facts.layout.grad_accum,
        TrialAttr.OUTCOME: facts.outcome.kind,
        TrialAttr.WORKER: facts.worker,
        TrialAttr.LAUNCHER: facts.launcher,
        TrialAttr.ELAPSED_S: round(facts.elapsed_s, 2),
    }
    if facts.outcome.reason:
        attrs[TrialAttr.REASON] = facts.outcome.reason[-1500:]
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


def set_user_attrs(target: _SetsAttrs, attrs: Mapping[str, Any]) -> None:
    """Write ``attrs`` on an Optuna trial or study, one user attribute each."""
    for key, value in attrs.items():
        target.set_user_attr(key, value)


# -- trials: readers ------------------------------------------------------------------------

def trial_layout(trial: _HasAttrs) -> Layout | None:
    """The layout a judged trial ran or was refused (``None``: not judged yet)."""
    data = trial.user_attrs.get(TrialAttr.LAYOUT_DICT)
    return None if data is None else Layout.from_dict(data)


def trial_energy(trial: _HasAttrs) -> dict[str, Any]:
    """The trial's energy figures (``None`` each where not measured), by result key."""
    attrs = trial.user_attrs
    return {k: attrs.get(k) for k in (TrialAttr.ENERGY_J_PER_STEP, TrialAttr.ENERGY_SOURCE,
                                      TrialAttr.JOULES_PER_TOKEN, TrialAttr.TFLOPS_PER_WATT)}


def trial_energy_line(trial: _HasAttrs) -> str:
    """``energy: ... J/step, ... J/token (source)`` or "energy: not measured (no counter)"."""
    from autotune.energy import energy_text

    e = trial_energy(trial)
    return energy_text(e[TrialAttr.ENERGY_J_PER_STEP], e[TrialAttr.ENERGY_SOURCE],
                       e[TrialAttr.JOULES_PER_TOKEN])


def trial_tokens_per_s(trial: _HasAttrs) -> float | None:
    value = trial.user_attrs.get(TrialAttr.TOKENS_PER_S)
    return float(value) if isinstance(value, (int, float)) else None


def trial_layout_key(trial: _HasAttrs) -> str | None:
    return trial.user_attrs.get(TrialAttr.LAYOUT)


def trial_outcome(trial: _HasAttrs) -> str | None:
    """The trial's outcome kind or :data:`SKIPPED`; ``None`` when nobody judged it."""
    return trial.user_attrs.get(TrialAttr.OUTCOME)


def trial_reason(trial: _HasAttrs) -> str:
    return trial.user_attrs.get(TrialAttr.REASON) or ""


def is_retry(user_attrs: Mapping[str, Any], system_attrs: Mapping[str, Any]) -> bool:
    """Whether a trial re-runs a layout whose first run was cut short: re-enqueued by the
    runner after an interrupt, or by Optuna after its runner died."""
    return FAILED_TRIAL_SYSTEM_ATTR in system_attrs or TrialAttr.RETRY_OF in user_attrs


# -- studies --------------------------------------------------------------------------------

def study_attrs(fingerprint: dict[str, Any], *, model: str, cluster: str,
                device_memory_gib: float) -> dict[str, Any]:
    """A new study's user attributes: its fingerprint and what the dashboard shows of it."""
    return {StudyAttr.FINGERPRINT: fingerprint, StudyAttr.MODEL: model,
            StudyAttr.CLUSTER: cluster,
            StudyAttr.OBJECTIVE: "model TFLOPS per device (higher is better)",
            StudyAttr.DEVICE_MEMORY_GIB: device_memory_gib}


def workload_record(workload: dict[str, Any], *, train_iters: int,
                    ranks_per_node: int, launcher: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """The study's :attr:`StudyAttr.WORKLOAD`: its ``workload`` section, the steps a trial
    ran (``{train_iters}``), the ranks per node (``{ranks_per_node}``) and the launcher
    (``kind``, its ``env`` and SLURM options: ``best --emit command``'s launch line)."""
    out = {**workload, "train_iters": train_iters, "ranks_per_node": ranks_per_node}
    if launcher is not None:
        out["launcher"] = launcher
    return out


def study_workload(study: _HasAttrs) -> dict[str, Any] | None:
    """The recorded :func:`workload_record` (``None``: a study from before workloads, or
    one run through another tool)."""
    record = study.user_attrs.get(StudyAttr.WORKLOAD)
    return record if isinstance(record, dict) else None


def study_fingerprint(study: _HasAttrs) -> dict[str, Any]:
    """The study's fingerprint (``{}`` for a study autotune did not create)."""
    fp = study.user_attrs.get(StudyAttr.FINGERPRINT)
    return fp if isinstance(fp, dict) else {}


def study_device_memory_gib(study: _HasAttrs) -> float | None:
    """The device memory the runner stored (it includes ``cluster.memory_gb``), if any."""
    value = study.user_attrs.get(StudyAttr.DEVICE_MEMORY_GIB)
    return float(value) if isinstance(value, (int, float)) else None


def search_stop_record(reason: str, *, judged: int, strategy: str,
                       min_improvement: float | None, worker: str,
                       at: datetime) -> dict[str, Any]:
    """The study's :attr:`StudyAttr.SEARCH_STOP`: the reason, the finished trials it was
    decided on and the threshold, so that a later reader knows what it holds for."""
    return {"reason": reason, "judged": judged, "strategy": strategy,
            "min_improvement": min_improvement, "worker": worker,
            "at": at.isoformat(timespec="seconds")}


def search_stop_of(study: _HasAttrs) -> dict[str, Any] | None:
    """The study's recorded search stop (:func:`search_stop_record`), ``None`` if none."""
    record = study.user_attrs.get(StudyAttr.SEARCH_STOP)
    return record if isinstance(record, dict) else None


def search_stop_threshold(record: Mapping[str, Any] | None) -> float | None:
    """The ``search.min_improvement`` a recorded stop was decided at (``None``: unknown)."""
    value = (record or {}).get("min_improvement")
    return float(value) if isinstance(value, (int, float)) else None


def search_stop_line(record: Any) -> str | None:
    """A :func:`search_stop_record` as one line; ``None`` when there is none."""
    if not isinstance(record, dict) or not record.get("reason"):
        return None
    threshold = search_stop_threshold(record)
    return str(record["reason"]) + (f" (search.min_improvement {threshold:g})"
                                    if threshold is not None else "")


def _correction(c: LogCorrection, **counts: int) -> dict[str, Any]:
    return {"factor": round(c.factor, 6), "log_sd": round(c.sd, 6), **counts}


def learned_from_record(cal: Calibration, *, enabled: bool) -> dict[str, Any]:
    """The study's :attr:`StudyAttr.LEARNED_FROM`: the key, the earlier studies learned
    from with their measurements (none when ``enabled`` is false: ``search.
    learn_from_database`` or ``--no-learn``), the study's own, and both corrections
    (``factor``: measured / predicted, the median; ``log_sd``: its sd in log)."""
    key = cal.key
    return {"enabled": enabled, "device_type": key.device_type, "dtype": key.dtype,
            "workload": key.workload,
            "studies": [{"study": name, "measurements": n} for name, n in cal.learned_from],
            "measurements": sum(n for _, n in cal.learned_from), "own": cal.own,
            "memory": {**_correction(cal.memory, ok=cal.memory.n_ok, oom=cal.memory.n_censored),
                       "by_zero_stage": {str(z): _correction(c, ok=c.n_ok, oom=c.n_censored)
                                         for z, c in cal.memory_by_stage}},
            "throughput": _correction(cal.throughput, ok=cal.throughput.n_ok)}


def learned_from_of(study: _HasAttrs) -> dict[str, Any] | None:
    """The study's recorded :func:`learned_from_record`, ``None`` if none."""
    record = study.user_attrs.get(StudyAttr.LEARNED_FROM)
    return record if isinstance(record, dict) else None


def learned_from_line(record: Any) -> str | None:
    """A :func:`learned_from_record` as one line for people; ``None`` when there is none.

    ``learned from 2 earlier studies of cpu/fp32/builtin (a: 5, b: 3 measurements); with
    this study's 4: memory x0.93 (+-5%), step time x2.2 (+-9%)``
    """
    if not isinstance(record, dict):
        return None
    what = f"{record.get('device_type')}/{record.get('dtype')}/{record.get('workload')}"
    studies = record.get("studies") or []
    if not record.get("enabled", True):
        head = "not learning from earlier studies (search.learn_from_database: false)"
    elif not studies:
        head = f"no earlier study of {what} in the database"
    else:
        listed = ", ".join(f"{s.get('study')}: {s.get('measurements')}" for s in studies[:5])
        more = f", and {len(studies) - 5} more" if len(studies) > 5 else ""
        head = (f"learned from {len(studies)} earlier "
                f"{'study' if len(studies) == 1 else 'studies'} of {what} "
                f"({listed}{more} measurements)")
    parts = []
    mem, tp = record.get("memory") or {}, record.get("throughput") or {}
    if mem.get("ok") or mem.get("oom"):
        stages = mem.get("by_zero_stage") or {}
        each = ", ".join(f"ZeRO {z} x{c['factor']:.3g}" for z, c in sorted(stages.items()))
        parts.append(f"memory x{mem['factor']:.3g} (+-{100 * mem['log_sd']:.0f}%"
                     + (f"; {each})" if len(stages) > 1 else ")"))
    if tp.get("ok"):
        parts.append(f"step time x{1 / tp['factor']:.3g} (+-{100 * tp['log_sd']:.0f}%)")
    own = record.get("own") or 0
    tail = (f"; with this study's {own}: " if own else "; ") + (
        ", ".join(parts) if parts else "no correction yet")
    return head + tail
