"""What a trial is: its spec, its on-disk layout, its result and the launcher's report.

A package below the launchers, the workloads and the runner, which all read it; it imports
none of them (``tests/test_architecture.py``). The names below the first four rows are
imported from their own modules:

==============  =============================================================
module          owns
==============  =============================================================
``spec``        :class:`TrialSpec` and :class:`RunConfig` (``python -m trainer``'s input)
``result``      :class:`TrialResult` (its output, one atomic file) and :func:`read_result`
``paths``       :class:`TrialPaths`: the trial directory, defined once
``report``      :class:`LaunchReport`: what a launcher observed
``outcome``     :class:`~autotune.trial.outcome.Outcome` (the enum of what a trial came to,
                with its Optuna state, constraint, retry, observation, label and colour)
                and :class:`~autotune.trial.outcome.Verdict` (one trial's outcome, value,
                reason)
``classify``    the one :func:`~autotune.trial.classify.classify` of a launched trial,
                for the trainer and a user's program alike
``numbers``     the result's numbers, checked before anything of them is stored
``measurement`` when to stop measuring: distribution-free bounds on the median step time
==============  =============================================================
"""

from autotune.trial.paths import TrialPaths
from autotune.trial.report import LaunchReport
from autotune.trial.result import PHASES, STATUSES, Status, TrialResult, read_result
from autotune.trial.spec import RunConfig, TrialSpec

__all__ = ["RunConfig", "TrialSpec", "TrialResult", "TrialPaths", "LaunchReport", "Status",
           "STATUSES", "PHASES", "read_result"]
