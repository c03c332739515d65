"""A finished measurement of a cut-short execution, recorded instead of measured again.

A runner killed in the middle of a batch (SIGKILL, a node lost under it) leaves every
member's claim to be repaired as ``killed`` and retried (:mod:`autotune.storage.claims`),
although the members that finished before the kill wrote their ``result.json``: each
trial's directory is its own (:meth:`autotune.trial.TrialPaths.for_trial`, cleared when it
is launched), so such a file is that execution's own measurement, not to be measured
again. The worker that takes the retry over reads that file first
(:func:`finished_result`); one that holds a judged measurement (``ok``, ``oom``) is
recorded on the retry's trial, with where it came from, and the layout is not launched.

An ``error`` result is not taken: the trainer writes one for a rank the launcher stopped
(the runner's death ends its launch), which judges nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.errors import SpecError
from autotune.layout import Layout
from autotune.trial import LaunchReport, TrialPaths, TrialResult, read_result

__all__ = ["Recovered", "finished_result", "recovered_report", "JUDGED"]

JUDGED = ("ok", "oom")
"""Result statuses that judge a layout (recorded rather than measured again)."""


@dataclass(frozen=True)
class Recovered:
    """The finished result of the execution a retry takes over."""

    number: int
    """The cut-short trial's number."""
    paths: TrialPaths
    result: TrialResult


def finished_result(run_dir: str, study_name: str, layout: Layout,
                    retry_of: object) -> Recovered | None:
    """The judged result the trial ``retry_of`` (the number the retry's trial records,
    :data:`autotune.storage.keys.TrialAttr.RETRY_OF`) left in its directory, if any."""
    if isinstance(retry_of, bool) or not isinstance(retry_of, int):
        return None
    paths = TrialPaths.for_trial(run_dir, study_name, retry_of, layout.key())
    try:
        res = read_result(paths.result)
    except (SpecError, OSError):
        return None  # unreadable or degenerate: measured again
    if res is None or res.status not in JUDGED:
        return None
    if res.layout is not None and res.layout != layout.to_dict():
        return None  # not this layout's (a directory reused by hand)
    return Recovered(retry_of, paths, res)


def recovered_report(found: Recovered, workload: str) -> LaunchReport:
    """The launch report of a recovered result, as if its batch had just ended: classified
    and recorded like any other, with the trial it came from."""
    res = found.result
    return LaunchReport(result=res, returncode=None, elapsed_s=res.elapsed_s or 0.0,
                        hosts=list(res.hosts), workload=workload,
                        batch={"index": res.batch_index or 0, "size": res.batch_size or 1,
                               "lead": None, "rerun": False, "recovered_from": found.number})
