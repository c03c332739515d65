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
(``benchmarks/_cost_model_variants.py``, ``held_out_profiles``). Their rows are
named ``STRATEGY+SCHEME``; the JSON puts them under ``profiled`` (by scheme, then strategy).

``--min-improvement X`` (repeatable) also replays the default strategy with the early stop
of ``search.min_improvement = X`` (issue #5), and once without it, each until it stops or
``--budget`` trials are spent: per group the trials spent, whether the best measured by
then is within ``--tolerance`` of the group's best (success) and the regret
``1 - best found / group best``; summarised over groups (JSON key ``early_stop``).

This file parses the options, makes the tasks, runs them (in ``--jobs`` processes) and
writes the JSON; ``benchmarks/_search_replays.py`` scores one replay (the tasks the
processes run), ``benchmarks/_search_summary.py`` makes the rows and summaries of the
groups and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.config.launcher import ReplayOptions
from autotune.landscape import LandscapeGroup
from autotune.search import STRATEGIES
from benchmarks._common import (
    StudyCheck,
    add_landscape_arguments,
    landscape_paths,
    load_groups,
    print_study_check,
    study_check,
)
from benchmarks._cost_model_variants import (
    add_profile_cv_argument,
    held_out_profiles,
    parse_profile_cv,
)
from benchmarks._search_replays import (
    DETERMINISTIC,
    USES_COST_MODEL,
    EarlyStopTask,
    Run,
    Task,
    run_early_stop,
    run_task,
)
from benchmarks._search_summary import (
    Summary,
    print_summary,
    report_early_stop,
    score_groups,
    summarize_rows,
)

T = TypeVar("T")
R = TypeVar("R")


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


if __name__ == "__main__":
    raise SystemExit(main())
