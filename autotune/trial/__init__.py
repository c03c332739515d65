"""What a trial is: its spec, its on-disk layout, its result and the launcher's report.

A package below the launchers, the workloads and the runner, which all read it:

==============  =============================================================
module          owns
==============  =============================================================
``spec``        :class:`TrialSpec` and :class:`RunConfig` (``python -m trainer``'s input)
``result``      :class:`TrialResult` (its output, one atomic file) and :func:`read_result`
``paths``       :class:`TrialPaths`: the trial directory, defined once
``report``      :class:`LaunchReport`: what a launcher observed
``outcome``     :class:`~autotune.trial.outcome.Outcome` (the enum of what a trial came to,
                with its Optuna state, constraint, retry, observation, label and colour)
                and the one :func:`~autotune.trial.classify.classify`; imported from there
                (it needs Optuna, which the trainer does not load)
==============  =============================================================
"""

from autotune.trial.paths import TrialPaths
from autotune.trial.report import LaunchReport
from autotune.trial.result import PHASES, STATUSES, Status, TrialResult, read_result
from autotune.trial.spec import RunConfig, TrialSpec

__all__ = ["RunConfig", "TrialSpec", "TrialResult", "TrialPaths", "LaunchReport", "Status",
           "STATUSES", "PHASES", "read_result"]
