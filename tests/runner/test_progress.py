"""The run's end as people read it: the trial table, the stop message, the best line."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autotune.layout import Layout
from autotune.runner.progress import best_line, format_duration, stop_message, trials_table
from autotune.storage.keys import SKIPPED
from autotune.storage.records import verdict_attrs

A = Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=2)
B = Layout(tp=2, pp=1, dp=1, micro_batch=1, grad_accum=4)


def _trial(layout: Layout, outcome: str, value: float | None = None,
           reason: str = "") -> optuna.trial.FrozenTrial:
    state = TrialState.COMPLETE if value is not None else TrialState.PRUNED
    return optuna.trial.create_trial(state=state, value=value,
                                     user_attrs=verdict_attrs(layout, outcome, reason))


def test_the_table_lists_judged_trials_best_first() -> None:
    trials = [_trial(A, "oom", reason="CUDA out of memory\ntraceback"),
              _trial(B, "complete", 120.0), _trial(A, SKIPPED, reason="owned"),
              optuna.trial.create_trial(state=TrialState.WAITING)]
    table = trials_table(trials)
    assert table is not None
    lines = table.splitlines()
    assert len(lines) == 4  # header, rule, the two judged trials
    assert B.key() in lines[2] and "complete" in lines[2]
    assert "oom" in lines[3] and "CUDA out of memory" in lines[3] and "traceback" not in table
    assert trials_table([_trial(A, SKIPPED)]) is None


def test_stop_messages_and_the_best_line() -> None:
    assert stop_message("budget", n_trials=8) == "budget of 8 trials reached"
    assert stop_message("strategy", n_trials=8, reason="EI < 1%") == "search stopped: EI < 1%"
    best = _trial(B, "complete", 120.0)
    assert best_line(best) == (f"best layout: {B.key()}  120 model TFLOPS/device "
                               f"(trial #{best.number}); energy: not measured (no counter)")
    assert format_duration(75) == "1m15s"
