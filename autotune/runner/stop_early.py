"""Stop the study when the program, not the layout, is broken.

A misspelled flag fails every layout alike, and at 128 nodes each such trial costs
node-hours. The rule (``search.stop_on_repeated_error``, ``k``, default 2): when ``k``
trials in a row, on ``k`` different layouts, failed (outcome ``error``) with one error
signature, the study stops, exits non-zero and shows the program's error line and the
trial folders. The signature is the program's own error line
(:func:`autotune.workloads.error_line.program_error_line`, else the reason's first line)
without what varies between layouts (:func:`~autotune.workloads.error_line.signature`).
An out-of-memory is the layout's own fault (outcome ``oom``) and never counts; an
unjudged trial (interrupted, killed, a lost node) neither counts nor breaks the row; any
other outcome does break it. The same rule holds for every workload: the built-in
trainer's reason is its traceback, whose last line is the exception.

The stop is stored as the study's :data:`BROKEN_PROGRAM_ATTR`, with a digest of the study
file. A resumed run whose study still ends on that signature (:func:`resume_refusal`) is
refused before it spends a trial, unless the study file changed (the user fixed it) or
``--retry-failed`` is given, which also puts the failed layouts up for a retry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autotune.spec import StudySpec
from autotune.storage import Storage, TrialStore
from autotune.trial.outcome import Outcome, Verdict
from autotune.workloads.error_line import program_error_line, signature

__all__ = ["BROKEN_PROGRAM_ATTR", "Failure", "BrokenProgram", "RepeatedErrorRule",
           "failure_of", "study_file_digest", "resume_refusal"]

BROKEN_PROGRAM_ATTR = "broken_program"
"""The study's user attribute of the last stop (:meth:`BrokenProgram.record`)."""

_UNJUDGED = tuple(o.value for o in Outcome if not o.measured)
"""Outcomes that say nothing about the program (it was refused, cancelled or lost)."""


@dataclass(frozen=True)
class Failure:
    number: int
    layout: str
    signature: str
    line: str
    trial_dir: str | None


def failure_of(outcome: Verdict, *, number: int, layout: str,
               trial_dir: str | None) -> Failure | None:
    """The failure an ``error`` outcome counts as (``None`` for any other outcome)."""
    if outcome.kind is not Outcome.ERROR:
        return None
    reason = outcome.reason or ""
    line = program_error_line(reason) or next(
        (ln.strip() for ln in reason.splitlines() if ln.strip()), "(no reason)")
    return Failure(number, layout, signature(line), line, trial_dir)


@dataclass(frozen=True)
class BrokenProgram:
    failures: tuple[Failure, ...]

    @property
    def line(self) -> str:
        return self.failures[-1].line

    def message(self) -> str:
        where = "\n".join(f"  trial #{f.number} {f.layout}: {f.trial_dir or '(no folder)'}"
                          for f in self.failures)
        return (f"{len(self.failures)} trials in a row on different layouts failed alike, "
                f"so the program or its arguments are broken, not the layouts:\n"
                f"  {self.line}\n{where}\nfix the study file (or the program) and run "
                "again, or run again with --retry-failed")

    def record(self, digest: str) -> dict[str, Any]:
        return {"signature": self.failures[-1].signature, "line": self.line,
                "trials": [f.number for f in self.failures],
                "layouts": [f.layout for f in self.failures], "study_file": digest}


class RepeatedErrorRule:
    """The rule of the module docstring over one worker's outcomes, in order."""

    def __init__(self, repeats: int) -> None:
        self.repeats = repeats
        self._row: list[Failure] = []

    def observe(self, kind: str, failure: Failure | None) -> BrokenProgram | None:
        if self.repeats < 2 or kind in _UNJUDGED:
            return None
        if failure is None:
            self._row.clear()
            return None
        if self._row and self._row[-1].signature != failure.signature:
            self._row.clear()
        self._row = [f for f in self._row if f.layout != failure.layout] + [failure]
        if len(self._row) >= self.repeats:
            return BrokenProgram(tuple(self._row[-self.repeats:]))
        return None


def study_file_digest(spec: StudySpec) -> str:
    """A digest of the study file as it is now (of its workload section when the spec
    has no file)."""
    try:
        data = Path(spec.source).read_bytes() if spec.source else b""
    except OSError:
        data = b""
    if not data:
        data = json.dumps(spec.workload.to_dict(), sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def _last_signature(trials: Sequence[optuna.trial.FrozenTrial]) -> str | None:
    """The failure signature of the study's last judged trial (``None``: not an error)."""
    from autotune.storage import TrialAttr

    judged = [t for t in trials if t.user_attrs.get(TrialAttr.OUTCOME) not in
              (None, "skipped", *_UNJUDGED)]
    if not judged:
        return None
    last = max(judged, key=lambda t: t.number)
    outcome = Verdict(Outcome(str(last.user_attrs[TrialAttr.OUTCOME])),
                      reason=str(last.user_attrs.get(TrialAttr.REASON) or ""))
    found = failure_of(outcome, number=last.number, layout="", trial_dir=None)
    return found.signature if found else None


def resume_refusal(study: optuna.Study, spec: StudySpec, storage: Storage, *,
                   retry_failed: bool) -> str | None:
    """Why a resumed run may not start (module docstring), or ``None``. A changed study
    file or ``retry_failed`` clears the stop; ``retry_failed`` also puts its layouts up
    for a retry."""
    record = study.user_attrs.get(BROKEN_PROGRAM_ATTR)
    if not isinstance(record, dict):
        return None
    changed = record.get("study_file") != study_file_digest(spec)
    still = _last_signature(study.get_trials(deepcopy=False)) == record.get("signature")
    if not still or changed or retry_failed:
        if retry_failed and still:
            TrialStore(storage, spec.name).mark_for_retry(list(record.get("layouts", [])))
        study.set_user_attr(BROKEN_PROGRAM_ATTR, None)
        return None
    return (f"study {spec.name!r} was stopped because trials "
            f"{', '.join('#' + str(n) for n in record.get('trials', []))} failed alike:\n"
            f"  {record.get('line')}\nthe study file is unchanged: fix it (or the program) "
            "first, or run again with --retry-failed to measure those layouts again")
