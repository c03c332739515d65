"""One replayed search scored (``search_efficiency.py``): the trials and device-seconds a
strategy spends on a landscape group until it measures a layout within the tolerance of the
group's best, and what the default strategy's early stop spends and loses.

* :func:`trials_to_hit` / :func:`hit_in_process`: a strategy replayed in this process
  through the :class:`autotune.search.Strategy` interface (``benchmarks/_common.py``,
  ``replay``); :func:`hit_through_runner`: the study runner's own trials
  (``benchmarks/_study_run.py``, ``study_run``); both scored by :func:`first_hit`.
* :func:`good_count`, :func:`random_expectation`, :func:`random_success_probability`: the
  analytic figures of random search the measured ones are checked against.
* :func:`until_stop`: a replay until the strategy stops or the budget is spent.
* :class:`Task` / :func:`run_task`, :class:`EarlyStopTask` / :func:`run_early_stop`: the
  units of work the benchmark hands its worker processes (picklable, one group each).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from autotune.landscape import LandscapeGroup
from autotune.models.profile import LayerProfile
from autotune.search import Observation, Strategy, cost_model_predictor
from benchmarks._common import StudyCheck, replay, study_strategy
from benchmarks._cost_model_variants import with_error
from benchmarks._study_run import replay_device_seconds, study_run

__all__ = ["DETERMINISTIC", "USES_COST_MODEL", "EarlyStopTask", "Hit", "Run", "Task",
           "first_hit", "good_count", "hit_in_process", "hit_through_runner",
           "random_expectation", "random_success_probability", "run_early_stop", "run_task",
           "threshold_of", "trials_to_hit", "until_stop"]

DETERMINISTIC = {"default", "grid", "cost-model-only"}
"""Strategies whose proposals do not depend on the seed: one run stands for all."""
USES_COST_MODEL = {"default", "cost-model-only"}
"""Strategies whose proposals depend on the cost model (a wrong or profiled one)."""


def threshold_of(group: LandscapeGroup, tolerance: float) -> float:
    return (group.best().model_tflops_per_device or 0.0) * (1.0 - tolerance)


def good_count(group: LandscapeGroup, tolerance: float,
               check: StudyCheck | None = None) -> int:
    """The group's layouts within ``tolerance`` of its best (those ``check`` keeps)."""
    thr = threshold_of(group, tolerance)
    return sum(1 for m in group.ok() if (m.model_tflops_per_device or 0.0) >= thr
               and (check is None or m.layout not in check.excluded))


def random_expectation(n: int, k: int) -> float:
    """Expected trials of random sampling without replacement until one of ``k`` good
    items among ``n`` is drawn: ``(n + 1) / (k + 1)``."""
    return (n + 1) / (k + 1)


def random_success_probability(n: int, k: int, budget: int) -> float:
    """Probability that random search draws a good item within ``budget`` trials."""
    if budget >= n - k + 1:
        return 1.0
    return 1.0 - math.comb(n - k, budget) / math.comb(n, budget)


Hit = tuple[int | None, float | None]
"""Trials and device-seconds spent until a layout within the tolerance of the group's best
was measured, the hit included; ``(None, None)``: a miss."""


def first_hit(trials: Iterable[tuple[float | None, float]], threshold: float,
              max_trials: int | None = None) -> Hit:
    """``trials``: (value or ``None``, device-seconds) in launch order; the trials and
    device-seconds until the first value at or above ``threshold`` (a miss if the trials
    end, or ``max_trials`` pass, first)."""
    spent = 0.0
    for n, (value, seconds) in enumerate(trials, start=1):
        spent += seconds
        if value is not None and value >= threshold:
            return n, spent
        if max_trials is not None and n >= max_trials:
            break
    return None, None


def trials_to_hit(strategy: Strategy, group: LandscapeGroup, tolerance: float,
                  max_trials: int | None = None, *, check: StudyCheck | None = None,
                  history: list[Observation] | None = None) -> int | None:
    """Trials until a layout within ``tolerance`` of the best is measured, ``None`` if the
    strategy stops first or ``max_trials`` pass without one (a censored run: a miss), or if
    ``check`` excludes the measured best (no study could propose it: a miss). ``history``:
    the list the replay records into (:func:`~benchmarks._common.study_strategy`'s)."""
    return hit_in_process(strategy, group, tolerance, max_trials, check=check,
                          history=history)[0]


def hit_in_process(strategy: Strategy, group: LandscapeGroup, tolerance: float,
                   max_trials: int | None = None, *, check: StudyCheck | None = None,
                   history: list[Observation] | None = None,
                   build_s: float | None = None) -> Hit:
    """:func:`trials_to_hit` with the device-seconds (:func:`~benchmarks._study_run.
    replay_device_seconds`), for the replays that do not go through the runner."""
    if check is not None and check.best_excluded:
        return None, None
    cost = replay_device_seconds(group, build_s)
    return first_hit(((o.value, cost(o.layout))
                      for o in replay(strategy, group, check, history=history)),
                     threshold_of(group, tolerance), max_trials)


def hit_through_runner(group: LandscapeGroup, strategy: str, tolerance: float, *, seed: int,
                       max_trials: int | None, check: StudyCheck | None,
                       memory_margin: float | None = None,
                       build_s: float | None = None) -> Hit:
    """The study runner's own trials (:func:`~benchmarks._study_run.study_run`: what
    ``autotune run`` does with the group's replay study file, the memory check on when
    ``check`` is given), scored as :func:`first_hit`."""
    if check is not None and check.best_excluded:
        return None, None
    trials = study_run(group, strategy, seed=seed, n_trials=max_trials,
                       study_check=check is not None, memory_margin=memory_margin,
                       build_s=build_s)
    return first_hit(((t.value, t.device_seconds) for t in trials),
                     threshold_of(group, tolerance), max_trials)


def until_stop(strategy: Strategy, group: LandscapeGroup, budget: int, tolerance: float,
               check: StudyCheck | None = None, *, history: list[Observation] | None = None
               ) -> dict[str, float | int | bool | None]:
    """Replay until the strategy stops (or runs out of layouts) or ``budget`` trials are
    spent: the trials spent, whether it stopped early, whether the best measured by then is
    within ``tolerance`` of the group's best (never when ``check`` excludes that best), and
    the regret ``1 - best / group best``. ``history`` as in :func:`trials_to_hit`."""
    best, trials = 0.0, 0
    for obs in replay(strategy, group, check, history=history):
        trials += 1
        best = max(best, obs.value or 0.0)
        if trials >= budget:
            break
    top = group.best().model_tflops_per_device or 0.0
    return {"min_improvement": getattr(strategy, "min_improvement", None), "trials": trials,
            "stopped": strategy.stop is not None and trials < budget,
            "success": best >= threshold_of(group, tolerance)
            and not (check is not None and check.best_excluded),
            "regret": 1.0 - best / top if top > 0 else None}


@dataclass
class Task:
    group: LandscapeGroup
    strategy: str
    seeds: list[int]
    tolerance: float
    cost_model_error: float = 0.0
    """Sd of the per-axis-value error put on the cost model (0: the real one); seed ``i``
    then also draws the error ``i``, the same for every strategy."""
    max_trials: int | None = None
    """Censor each replay after this many trials (``--max-trials``)."""
    profile: LayerProfile | None = None
    """The layer profile the cost model predicts with (``--profile-cv``: one held out from
    the group); ``None``: the analytic model."""
    label: str = ""
    """The row this replay is reported under (default: the strategy)."""
    check: StudyCheck | None = None
    """The study's feasibility check of the group: the candidates are what it keeps."""

    memory_margin: float | None = None
    """``trial.memory_margin`` of the replayed study (``None``: the default)."""
    build_s: float | None = None
    """``launcher.replay.build_s`` of the replayed study (``None``: the default)."""

    def __post_init__(self) -> None:
        self.label = self.label or self.strategy

    @property
    def through_runner(self) -> bool:
        """Replayed by the study runner itself: the strategies whose single run stands for
        all seeds, with the real cost model (a perturbed or profiled model is not a study
        setting: those rows, and the seeded baselines, replay in process)."""
        return (self.strategy in DETERMINISTIC and self.cost_model_error <= 0
                and self.profile is None)


def run_task(task: Task) -> list[Hit]:
    g = task.group
    if task.through_runner:
        return [hit_through_runner(g, task.strategy, task.tolerance, seed=seed,
                                   max_trials=task.max_trials, check=task.check,
                                   memory_margin=task.memory_margin, build_s=task.build_s)
                for seed in task.seeds]
    predict = cost_model_predictor(g.model, g.cluster, dtype=g.dtype, profile=task.profile,
                                   stack=g.stack)
    out = []
    for seed in task.seeds:
        pred = with_error(predict, g, task.cost_model_error, seed)
        strategy, history = study_strategy(task.strategy, g, task.check, seed=seed,
                                           predict=pred)
        out.append(hit_in_process(strategy, g, task.tolerance, task.max_trials,
                                  check=task.check, history=history, build_s=task.build_s))
    return out


Run = dict[str, float | int | bool | None]
"""One early-stop replay: draw, min_improvement, trials, stopped, success, regret."""


@dataclass
class EarlyStopTask:
    group: LandscapeGroup
    min_improvements: list[float | None]
    """``None``: the default strategy without the stop (the baseline at the budget)."""
    budget: int
    tolerance: float
    cost_model_error: float = 0.0
    """Sd of a log-normal error per axis value put on the cost model (0: the real one)."""
    draws: int = 1
    check: StudyCheck | None = None


def run_early_stop(task: EarlyStopTask) -> list[Run]:
    g = task.group
    predict = cost_model_predictor(g.model, g.cluster, dtype=g.dtype, stack=g.stack)
    runs = []
    for draw in range(task.draws):
        pred = with_error(predict, g, task.cost_model_error, draw)
        for m in task.min_improvements:
            strategy, history = study_strategy("default", g, task.check, seed=0,
                                               predict=pred, min_improvement=m)
            runs.append({"draw": draw, **until_stop(strategy, g, task.budget, task.tolerance,
                                                    task.check, history=history)})
    return runs
