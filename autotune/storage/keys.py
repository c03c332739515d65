"""Every key autotune stores on Optuna trials and studies, named once
(:class:`TrialAttr`, :class:`StudyAttr`), as :mod:`autotune.storage.schema` names the SQL
columns; the writers and readers are :mod:`autotune.storage.records` (a trial's) and
:mod:`autotune.storage.study_records` (a study's). Changing a key here changes what old
studies can be read with, so keys are added, not renamed.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["TrialAttr", "RESULT_ATTRS", "RUNNING", "SKIPPED",
           "FAILED_TRIAL_SYSTEM_ATTR", "StudyAttr", "HasAttrs", "SetsAttrs"]


class TrialAttr:
    """Keys of a trial's user attributes."""

    LAYOUT = "layout"
    """The layout key (:meth:`autotune.layout.Layout.key`)."""
    LAYOUT_DICT = "layout_dict"
    """The layout as :meth:`autotune.layout.Layout.to_dict` (what readers rebuild it from)."""
    OUTCOME = "outcome"
    """An outcome kind (:data:`autotune.trial.outcome.OUTCOME_KINDS`) or :data:`SKIPPED`;
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


RUNNING = "running"
"""The ``outcome`` of an execution's ``measurements`` row from its claim until its record
(:func:`autotune.storage.claims.claim_layout`)."""


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
    """What the study measures: model, training, cluster shape and the workload's program
    (:mod:`autotune.runner.identity`): a study name is refused for another one."""
    SPACE = "search_space"
    """The search space's axes as last run: a resumed study says when they changed."""
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


class HasAttrs(Protocol):
    """An Optuna trial or study handle: something with user attributes to read."""

    @property
    def user_attrs(self) -> dict[str, Any]: ...


class SetsAttrs(Protocol):
    def set_user_attr(self, key: str, value: Any) -> None: ...
