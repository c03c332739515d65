"""How many trials each search strategy needs to find a near-best layout on real landscapes.

Every landscape group (same model, devices and global batch) with at least
``--min-layouts`` measured layouts is replayed as a study: its layouts that pass the
feasibility check a real study of the group applies (default settings, memory rule and
placement included: ``benchmarks/_common.py``, ``study_check``) are the candidates (in
plan order), the strategy proposes one at a time through the same
:class:`autotune.search.Strategy` interface the study runner uses (made as the runner
makes it: the cost model's prediction and the memory rule's probability of fitting,
conditioned on the OOMs measured so far; ``_common.study_strategy``), and the replay
launcher (:class:`autotune.launchers.replay.ReplayLauncher`) answers with the table's
value. The default strategy calibrates online: before each proposal its residual model
is refitted on the trials it made so far (``cost_model_accuracy.py``'s ``online`` row
ranks with that calibrated model). Counted: trials until a layout within
``--tolerance`` of the group's best was measured (OOM trials count), over ``--repeats``
seeds (one run for deterministic strategies). A group whose measured best the check
excludes is a failure of every strategy (a study could never propose it). The random
strategy is checked against its analytic expectation ``(N + 1) / (k + 1)`` for ``k``
good layouts among ``N`` candidates.

    python benchmarks/search_efficiency.py --json search.json

reads the two tables shipped in ``data/landscapes/`` (``--landscape FILE``, repeatable, reads
others). ``--json`` writes the contract format of ``docs/search.md`` (extended: quartiles,
mean trials, speed-up = analytic random mean / strategy mean, the analytic random
expectation). Runs in minutes on 2 cores (tpe and gp get ``--optuna-repeats`` seeds:
Optuna's GP refits per ask).

``--profile-cv SCHEME`` (``layers``, ``world``, ``batch``; repeatable or a comma list) also
replays the strategies that use the cost model (``default``, ``cost-model-only``) with its
layer times measured: each group's cost model gets the layer profile fitted on the groups
whose layer count, device count or global batch differs from its own
(``benchmarks/_common.py``, ``held_out_profiles``). Their rows are named
``STRATEGY+SCHEME``; the JSON puts them under ``profiled`` (by scheme, then strategy).

``--min-improvement X`` (repeatable) also replays the default strategy with the early stop
of ``search.min_improvement = X`` (issue #5), and once without it, each until it stops or
``--budget`` trials are spent: per group the trials spent, whether the best measured by
then is within ``--tolerance`` of the group's best (success) and the regret
``1 - best found / group best``; summarised over groups (JSON key ``early_stop``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.config.launcher import ReplayOptions
from autotune.landscape import LandscapeGroup
from autotune.models.profile import LayerProfile
from autotune.search import (
    STRATEGIES,
    Observation,
    Strategy,
    cost_model_predictor,
)
from benchmarks._common import (
    StudyCheck,
    add_landscape_arguments,
    add_profile_cv_argument,
    candidates_of,
    held_out_profiles,
    landscape_paths,
    load_groups,
    parse_profile_cv,
    print_study_check,
    replay,
    replay_device_seconds,
    study_check,
    study_run,
    study_strategy,
    with_error,
)

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
    """:func:`trials_to_hit` with the device-seconds (:func:`~benchmarks._common.
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
    """The study runner's own trials (:func:`~benchmarks._common.study_run`: what
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

    def __post_init__(self) -> None:
        self.label = self.label or self.strategy


    memory_margin: float | None = None
    """``trial.memory_margin`` of the replayed study (``None``: the default)."""
    build_s: float | None = None
    """``launcher.replay.build_s`` of the replayed study (``None``: the default)."""

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
    predict = cost_model_predictor(g.model, g.cluster, dtype=g.dtype, profile=task.profile)
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
    predict = cost_model_predictor(g.model, g.cluster, dtype=g.dtype)
    runs = []
    for draw in range(task.draws):
        pred = with_error(predict, g, task.cost_model_error, draw)
        for m in task.min_improvements:
            strategy, history = study_strategy("default", g, task.check, seed=0,
                                               predict=pred, min_improvement=m)
            runs.append({"draw": draw, **until_stop(strategy, g, task.budget, task.tolerance,
                                                    task.check, history=history)})
    return runs


def summarize_early_stop(runs: list[Run]) -> dict[str, float | None]:
    """Over runs (groups x draws): trials spent (mean, median, max), the fraction stopped
    before the budget, the success rate and the regret (mean, max)."""
    trials = [float(r["trials"] or 0) for r in runs]
    regrets = [float(r["regret"]) for r in runs if r["regret"] is not None]
    return {"mean_trials": statistics.fmean(trials) if trials else None,
            "median_trials": statistics.median(trials) if trials else None,
            "max_trials": max(trials) if trials else None,
            "stopped_rate": statistics.fmean(bool(r["stopped"]) for r in runs) if runs else None,
            "success_rate": statistics.fmean(bool(r["success"]) for r in runs) if runs else None,
            "mean_regret": statistics.fmean(regrets) if regrets else None,
            "max_regret": max(regrets) if regrets else None}


def summarize(hits: list[Hit], budget: int) -> dict[str, float | None]:
    """Median and quartiles of trials-to-hit (a miss counts as infinitely many), the
    fraction of runs that hit within the budget, and the median and largest device-seconds
    to the hit (``None`` when a run missed)."""
    vals = sorted(math.inf if t is None else float(t) for t, _ in hits)
    secs = sorted(math.inf if d is None else float(d) for _, d in hits)
    finite = [v for v in vals if math.isfinite(v)]
    return {"median_trials": _fin(statistics.median(vals)),
            "q1_trials": _fin(_quantile(vals, 0.25)), "q3_trials": _fin(_quantile(vals, 0.75)),
            "mean_trials": statistics.fmean(finite) if len(finite) == len(vals) else None,
            "success_rate": sum(1 for v in vals if v <= budget) / len(vals),
            "median_device_seconds": _fin(statistics.median(secs)),
            "max_device_seconds": _fin(max(secs))}


# ---------------------------------------------------------------------------------- main

T = TypeVar("T")
R = TypeVar("R")
Summary = dict[str, float | None]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, checked; ``strategy_list`` and ``schemes`` parsed from theirs."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_landscape_arguments(ap)
    ap.add_argument("--strategies", default="default,random,grid,cost-model-only,tpe,gp")
    ap.add_argument("--repeats", type=int, default=20, help="seeds per random strategy")
    ap.add_argument("--optuna-repeats", type=int, default=3,
                    help="seeds for tpe and gp (Optuna's GP refits per ask: seconds a run)")
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--budget", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", default=None, help="write the summary here")
    ap.add_argument("--min-improvement", type=float, action="append", default=[],
                    metavar="X", help="also replay 'default' with search.min_improvement X "
                    "until it stops or the budget is spent (repeatable)")
    ap.add_argument("--cost-model-error", type=float, default=0.0, metavar="SD",
                    help="a deliberately wrong cost model: a log-normal error of this sd per "
                    "axis value (0.2: ~20%%), for every strategy and the early-stop replays")
    ap.add_argument("--error-draws", type=int, default=3,
                    help="draws of that error per group (with --cost-model-error; the "
                    "cost-model strategies then run once per draw)")
    ap.add_argument("--max-trials", type=int, default=None, metavar="N",
                    help="stop each replay after N trials without a hit and count it a miss "
                    "(bounds the run time of tpe/gp on large files; random is never cut; "
                    "default: no limit, every replay runs to its hit). Must be >= --budget")
    ap.add_argument("--group", action="append", default=[], metavar="NAME",
                    help="score only this group (repeatable; default: every group large "
                    "enough)")
    ap.add_argument("--build-s", type=float, default=None, metavar="S",
                    help="seconds a replayed trial spends before its first step, all an "
                    "OOM costs (launcher.replay.build_s; default "
                    f"{ReplayOptions.build_s:g})")
    ap.add_argument("--no-study-check", dest="study_check", action="store_false",
                    help="replay every row of a group as a candidate that fits (what "
                    "`autotune run` does with launcher.replay.study_check false); default: "
                    "the study's feasibility check, memory rule and placement included")
    add_profile_cv_argument(ap)
    args = ap.parse_args(argv)
    args.landscape = landscape_paths(args)
    try:
        args.schemes = parse_profile_cv(args.profile_cv)
    except ValueError as err:
        ap.error(str(err))
    for m in args.min_improvement:
        if not 0.0 <= m < 1.0:
            ap.error(f"--min-improvement: got {m}; allowed: a fraction >= 0 and < 1")
    if args.max_trials is not None and args.max_trials < args.budget:
        ap.error(f"--max-trials: got {args.max_trials}; allowed: at least --budget "
                 f"({args.budget}), or the success rate would be censored")
    args.strategy_list = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in args.strategy_list:
        if s not in STRATEGIES:
            ap.error(f"--strategies: unknown {s!r}; allowed: {', '.join(STRATEGIES)}")
    return args


def select_groups(args: argparse.Namespace) -> tuple[list[LandscapeGroup], list[LandscapeGroup]]:
    """The groups scored (``--min-layouts`` measured layouts, one ok), and every group read
    (the small ones too: profiles are fitted on all)."""
    groups: list[LandscapeGroup] = []
    every_group: list[LandscapeGroup] = []
    for path, loaded in load_groups(args):
        usable = [g for g in loaded if len(g.measurements) >= args.min_layouts and g.ok()
                  and (not args.group or g.name in args.group)]
        print(f"{path}: {len(loaded)} groups, {len(usable)} with >= {args.min_layouts} "
              "layouts", file=sys.stderr)
        groups.extend(usable)
        every_group.extend(loaded)
    if not groups:
        print("no landscape group is large enough", file=sys.stderr)
    return groups, every_group


def seeds_for(strategy: str, args: argparse.Namespace) -> list[int]:
    """One run for a deterministic strategy (one per error draw when the cost model it uses
    is perturbed), ``--optuna-repeats`` for tpe and gp, ``--repeats`` for random."""
    if strategy in DETERMINISTIC:
        return list(range(args.error_draws if strategy in USES_COST_MODEL
                          and args.cost_model_error > 0 else 1))
    return list(range(args.optuna_repeats if strategy in ("tpe", "gp") else args.repeats))


def make_tasks(args: argparse.Namespace, groups: list[LandscapeGroup],
               every_group: list[LandscapeGroup], checks: list[StudyCheck]
               ) -> tuple[list[Task], dict[str, dict[str, str]]]:
    """One task per group and strategy (random search never censored: it is cheap, and its
    full runs are the harness check), plus the profiled rows of ``--profile-cv``: the
    tasks and, per scheme, strategy -> row label."""
    on = args.study_check  # without: what `autotune run` replays by default (every row)
    tasks = [Task(g, s, seeds_for(s, args), args.tolerance, args.cost_model_error,
                  None if s == "random" else args.max_trials, check=c if on else None,
                  memory_margin=args.memory_margin, build_s=args.build_s)
             for g, c in zip(groups, checks, strict=True) for s in args.strategy_list]
    profiled_rows: dict[str, dict[str, str]] = {}
    for scheme in args.schemes:
        mine = [s for s in args.strategy_list if s in USES_COST_MODEL]
        profiled_rows[scheme] = {s: f"{s}+{scheme}" for s in mine}
        profiles = held_out_profiles(groups, scheme, fit_on=every_group)
        tasks += [Task(g, s, seeds_for(s, args), args.tolerance, args.cost_model_error,
                       args.max_trials, profile=p, label=profiled_rows[scheme][s],
                       check=c if on else None, memory_margin=args.memory_margin,
                       build_s=args.build_s)
                  for g, p, c in zip(groups, profiles, checks, strict=True) for s in mine]
    return tasks, profiled_rows


def run_all(fn: Callable[[T], R], tasks: Sequence[T], jobs: int) -> list[R]:
    """``fn`` over ``tasks`` in order, in ``jobs`` processes when there is more than one."""
    if jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(jobs) as pool:
            return list(pool.map(fn, tasks, chunksize=1))
    return [fn(t) for t in tasks]


def score_groups(args: argparse.Namespace, groups: list[LandscapeGroup],
                 checks: list[StudyCheck], tasks: list[Task], results: list[list[Hit]],
                 rows: list[str], profiled_rows: dict[str, dict[str, str]]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Summary]]]:
    """Per group: its JSON entry and each row's :func:`summarize`; prints one line each."""
    per_group: dict[str, dict[str, list[Hit]]] = {}
    for task, res in zip(tasks, results, strict=True):
        per_group.setdefault(task.group.name, {})[task.label] = res
    strategies = args.strategy_list
    entries: list[dict[str, Any]] = []
    group_rows: list[dict[str, Summary]] = []
    # Analytic columns keep their 10 characters; the longer profiled labels widen theirs.
    widths = {r: 10 if r in strategies else max(10, len(r)) for r in rows}
    print(f"{'group':44s} {'N':>3s} {'k':>3s} {'rnd E':>6s}" + "".join(
        f" {r[:widths[r]]:>{widths[r]}s}" for r in rows))
    for g, check in zip(groups, checks, strict=True):
        n, k = len(check.kept(candidates_of(g))), good_count(g, args.tolerance, check)
        by_row = {r: summarize(per_group[g.name][r], args.budget) for r in rows}
        entry = {"name": g.name, "n_layouts": len(g.measurements), "n_candidates": n,
                 "n_good": k, "random_expected_trials": random_expectation(n, k),
                 "random_expected_success_rate": random_success_probability(n, k, args.budget),
                 **check.to_dict(), "strategies": {s: by_row[s] for s in strategies}}
        if profiled_rows:
            entry["profiled"] = {scheme: {s: by_row[r] for s, r in by_s.items()}
                                 for scheme, by_s in profiled_rows.items()}
        entries.append(entry)
        group_rows.append(by_row)
        cells = "".join(f" {_fmt(by_row[r]['median_trials']):>{widths[r]}s}" for r in rows)
        failed = "  (measured best excluded: a failure)" if check.best_excluded else ""
        print(f"{g.name[:44]:44s} {len(g.measurements):3d} {k:3d} "
              f"{entry['random_expected_trials']:6.2f}{cells}{failed}")
    return entries, group_rows


def summarize_rows(rows: list[str], group_rows: list[dict[str, Summary]],
                   entries: list[dict[str, Any]]) -> dict[str, Summary]:
    """Per row over groups: the median and quartiles of the group medians, the worst group,
    the success rate, the mean trials and the speed-up over the analytic random mean."""
    summary: dict[str, Summary] = {}
    for s in rows:
        medians = [_inf(by_row[s]["median_trials"]) for by_row in group_rows]
        rates = [by_row[s]["success_rate"] or 0.0 for by_row in group_rows]
        secs = [_inf(by_row[s]["median_device_seconds"]) for by_row in group_rows]
        summary[s] = {
            "median_trials": _fin(statistics.median(medians)) if medians else None,
            "q1_trials": _fin(_quantile(medians, 0.25)),
            "q3_trials": _fin(_quantile(medians, 0.75)),
            "max_group_median_trials": _fin(max(medians)) if medians else None,
            "success_rate": statistics.fmean(rates) if rates else None,
            "median_device_seconds": _fin(statistics.median(secs)) if secs else None,
            "max_group_median_device_seconds": _fin(max(secs)) if secs else None,
        }
    if entries:
        # Against the analytic random expectation (noise-free): mean trials over groups.
        expected_random = statistics.fmean(e["random_expected_trials"] for e in entries)
        for s in rows:
            mean = statistics.fmean(_inf(by_row[s]["mean_trials"]) for by_row in group_rows)
            summary[s]["mean_trials"] = _fin(mean)
            summary[s]["speedup_vs_random"] = (expected_random / mean if math.isfinite(mean)
                                               else None)  # a miss in some group: undefined
    return summary


def print_summary(args: argparse.Namespace, rows: list[str], summary: dict[str, Summary],
                  entries: list[dict[str, Any]], elapsed_s: float) -> None:
    """The random search check, then one line per row."""
    if "random" in args.strategy_list and entries:
        measured = [e["strategies"]["random"]["mean_trials"] for e in entries]
        expected = [e["random_expected_trials"] for e in entries]
        print(f"\nrandom search check: mean over groups of measured mean trials "
              f"{statistics.fmean(m for m in measured if m is not None):.2f}, analytic "
              f"(N+1)/(k+1) {statistics.fmean(expected):.2f}; median of group medians "
              f"{summary['random']['median_trials']}")
    print(f"\nsummary over {len(entries)} groups (tolerance {args.tolerance:.0%}, "
          f"budget {args.budget}; {elapsed_s:.0f} s):")
    if any(r.split("+")[0] == "default" for r in rows):
        print("default = the cost model calibrated online: before each proposal its "
              "residual model is refitted on the trials made so far (the ranking it gives: "
              "cost_model_accuracy.py, 'online')")
    name_width = max([16, *(len(r) for r in rows)])
    print(f"{'strategy':{name_width}s} {'median':>7s} {'q1':>5s} {'q3':>5s} {'worst':>6s} "
          f"{'mean':>5s} {'success':>8s} {'x random':>9s} {'dev-s median':>12s} "
          f"{'worst':>9s}")
    for s in rows:
        r = summary[s]
        print(f"{s:{name_width}s} {_fmt(r['median_trials']):>7s} {_fmt(r['q1_trials']):>5s} "
              f"{_fmt(r['q3_trials']):>5s} {_fmt(r['max_group_median_trials']):>6s} "
              f"{_fmt(r.get('mean_trials')):>5s} "
              f"{r['success_rate'] or 0:8.1%} {_fmt(r.get('speedup_vs_random')):>9s} "
              f"{_fmt0(r['median_device_seconds']):>12s} "
              f"{_fmt0(r['max_group_median_device_seconds']):>9s}")
    print("device-seconds: to the hit, each trial's replayed timing breakdown times its "
          "devices (an OOM: a failed build, launcher.replay.build_s); rows through the "
          f"study runner itself: {', '.join(r for r in rows if r in DETERMINISTIC)}")


def run_early_stops(args: argparse.Namespace, groups: list[LandscapeGroup],
                    checks: list[StudyCheck]) -> tuple[list[float | None], list[list[Run]]]:
    """``--min-improvement``: the default strategy replayed without the stop (``None``) and
    with each threshold, per group (no runs without the option)."""
    if not args.min_improvement:
        return [], []
    stops: list[float | None] = [None, *sorted(set(args.min_improvement))]
    draws = args.error_draws if args.cost_model_error > 0 else 1
    tasks = [EarlyStopTask(g, stops, args.budget, args.tolerance, args.cost_model_error,
                           draws, check=c) for g, c in zip(groups, checks, strict=True)]
    return stops, run_all(run_early_stop, tasks, args.jobs)


def report_early_stop(args: argparse.Namespace, groups: list[LandscapeGroup],
                      entries: list[dict[str, Any]], stops: list[float | None],
                      early: list[list[Run]]) -> list[dict[str, float | None]]:
    """The early-stop runs into the group entries; the summary per threshold, printed."""
    if not early:
        return []
    for entry, runs in zip(entries, early, strict=True):
        entry["early_stop"] = runs
    summary = [{"min_improvement": m, "cost_model_error": args.cost_model_error,
                **summarize_early_stop([r for runs in early for r in runs
                                        if r["min_improvement"] == m])}
               for m in stops]
    _print_early_stop(groups, stops, early, summary, args.budget, args.tolerance,
                      args.cost_model_error)
    return summary


def write_json(args: argparse.Namespace, summary: dict[str, Summary],
               entries: list[dict[str, Any]], profiled_rows: dict[str, dict[str, str]],
               early_summary: list[dict[str, float | None]], checks: list[StudyCheck],
               groups: list[LandscapeGroup]) -> None:
    """The ``--json`` document (keys in docs/search.md, "Benchmark")."""
    doc: dict[str, Any] = {
        "tolerance": args.tolerance, "budget": args.budget, "repeats": args.repeats,
        "min_layouts": args.min_layouts, "landscapes": args.landscape,
        "strategies": {s: summary[s] for s in args.strategy_list}, "groups": entries,
        "ok_rows": sum(c.ok_rows for c in checks),
        "ok_excluded": sum(c.ok_excluded for c in checks),
        "best_excluded_groups": [g.name for g, c in zip(groups, checks, strict=True)
                                 if c.best_excluded]}
    if profiled_rows:
        doc["profiled"] = {scheme: {s: summary[r] for s, r in by_s.items()}
                           for scheme, by_s in profiled_rows.items()}
    if early_summary:
        doc["early_stop"] = early_summary
    Path(args.json).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The TPE/GP strategies create an in-memory Optuna study per replay: without this,
    # Optuna logs a line for each of them and for each of their trials.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    groups, every_group = select_groups(args)
    checks = [study_check(g, memory_margin=args.memory_margin) for g in groups]
    tasks, profiled_rows = make_tasks(args, groups, every_group, checks)
    rows = [*args.strategy_list, *(r for by_s in profiled_rows.values() for r in by_s.values())]
    started = time.monotonic()
    results = run_all(run_task, tasks, args.jobs)
    stops, early = run_early_stops(args, groups, checks)
    elapsed_s = time.monotonic() - started
    entries, group_rows = score_groups(args, groups, checks, tasks, results, rows,
                                       profiled_rows)
    summary = summarize_rows(rows, group_rows, entries)
    print_summary(args, rows, summary, entries, elapsed_s)
    print()
    print_study_check(list(zip(groups, checks, strict=True)),
                      f"the {len(groups)} groups scored (a group whose best is excluded is a "
                      "failure of every strategy)")
    early_summary = report_early_stop(args, groups, entries, stops, early)
    if args.json:
        write_json(args, summary, entries, profiled_rows, early_summary, checks, groups)
    return 0


def _print_early_stop(groups: list[LandscapeGroup], stops: list[float | None],
                      early: list[list[Run]], summary: list[dict[str, float | None]],
                      budget: int, tolerance: float, error: float) -> None:
    """Per group and threshold: mean trials spent (``*``: every draw stopped before the
    budget) and the largest regret; then the summary over groups (and draws)."""
    names = ["off" if m is None else f"{m:.2%}" for m in stops]
    noise = f", cost model error sd {error:g}" if error > 0 else ""
    print(f"\nearly stop of 'default' (trials spent, * = stopped before the budget {budget};"
          f" regret = 1 - best found / group best{noise}):")
    print(f"{'group':44s}" + "".join(f" {n:>15s}" for n in names))
    for g, runs in zip(groups, early, strict=True):
        cells = ""
        for m in stops:
            mine = [r for r in runs if r["min_improvement"] == m]
            trials = statistics.fmean(float(r["trials"] or 0) for r in mine)
            star = "*" if all(r["stopped"] for r in mine) else " "
            regret = max((float(r["regret"]) for r in mine if r["regret"] is not None),
                         default=None)
            cells += f" {trials:>5.1f}{star} {_pct(regret):>8s}"
        print(f"{g.name[:44]:44s}{cells}")
    print(f"\nearly stop over {len(groups)} groups (tolerance {tolerance:.0%}, budget {budget}"
          f"{noise}):")
    print(f"{'min_improvement':16s} {'trials mean':>11s} {'median':>7s} {'max':>4s} "
          f"{'stopped':>8s} {'success':>8s} {'regret mean':>12s} {'max':>7s}")
    for name, r in zip(names, summary, strict=True):
        print(f"{name:16s} {_fmt(r['mean_trials']):>11s} {_fmt(r['median_trials']):>7s} "
              f"{_fmt(r['max_trials']):>4s} {r['stopped_rate'] or 0:8.1%} "
              f"{r['success_rate'] or 0:8.1%} {_pct(r['mean_regret']):>12s} "
              f"{_pct(r['max_regret']):>7s}")


def _pct(x: float | int | bool | None) -> str:
    return "-" if x is None else f"{float(x):.2%}"


def _inf(x: float | None) -> float:
    return math.inf if x is None else x


def _fin(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) else x


def _quantile(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))]


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _fmt0(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


if __name__ == "__main__":
    raise SystemExit(main())
