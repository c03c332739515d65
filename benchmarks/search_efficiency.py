"""How many trials each search strategy needs to find a near-best layout on real landscapes.

Every landscape group (same model, devices and global batch) with at least
``--min-layouts`` measured layouts is replayed as a study: its layouts are the candidates
(in plan order), the strategy proposes one at a time through the same
:class:`autotune.search.Strategy` interface the study runner uses, and the replay
launcher (:class:`autotune.launchers.replay.ReplayLauncher`) answers with the table's
value. Counted: trials until a layout within ``--tolerance`` of the group's best was
measured (OOM trials count), over ``--repeats`` seeds (one run for deterministic
strategies). The random strategy is checked against its analytic expectation
``(N + 1) / (k + 1)`` for ``k`` good layouts among ``N``.

    python benchmarks/search_efficiency.py --json search.json

reads the two tables shipped in ``data/landscapes/`` (``--landscape FILE``, repeatable, reads
others). ``--json`` writes the contract format of ``docs/search.md`` (extended: quartiles,
mean trials, speed-up = analytic random mean / strategy mean, the analytic random
expectation). Runs in minutes on 2 cores (tpe and gp get ``--optuna-repeats`` seeds:
Optuna's GP refits per ask).

``--profile-cv SCHEME`` (``layers``, ``world``, ``batch``; repeatable or a comma list) also
replays the strategies that use the cost model (``default``, ``cost-model-only``) with its
layer times measured: each group's cluster gets the layer profile fitted on the groups
whose layer count, device count or global batch differs from its own
(``benchmarks/cost_model_accuracy.py``, ``held_out_clusters``). Their rows are named
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
import random
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ATTENTION_KINDS
from autotune.landscape import (
    SHIPPED_LANDSCAPES,
    LandscapeGroup,
    load_landscape,
    shipped_landscape,
)
from autotune.launchers.replay import ReplayLauncher
from autotune.layout import Layout
from autotune.search import (
    PARAM_AXES,
    STRATEGIES,
    Observation,
    Predictor,
    Strategy,
    cost_model_predictor,
    make_strategy,
)
from benchmarks.cost_model_accuracy import (
    add_profile_cv_argument,
    held_out_clusters,
    parse_profile_cv,
)

DETERMINISTIC = {"default", "grid", "cost-model-only"}
"""Strategies whose proposals do not depend on the seed: one run stands for all."""
USES_COST_MODEL = {"default", "cost-model-only"}
"""Strategies whose proposals depend on the cost model (a wrong or profiled one)."""


def candidates_of(group: LandscapeGroup) -> list[Layout]:
    """The group's layouts in plan order (the order :func:`autotune.space.enumerate_layouts`
    lists them: tp, pp, micro-batch, ZeRO stage, recompute)."""
    return sorted(group.layouts(), key=lambda lay: (lay.tp, lay.pp, lay.micro_batch,
                                                    lay.zero_stage, lay.recompute))


def threshold_of(group: LandscapeGroup, tolerance: float) -> float:
    return (group.best().model_tflops_per_device or 0.0) * (1.0 - tolerance)


def good_count(group: LandscapeGroup, tolerance: float) -> int:
    thr = threshold_of(group, tolerance)
    return sum(1 for m in group.ok() if (m.model_tflops_per_device or 0.0) >= thr)


def random_expectation(n: int, k: int) -> float:
    """Expected trials of random sampling without replacement until one of ``k`` good
    items among ``n`` is drawn: ``(n + 1) / (k + 1)``."""
    return (n + 1) / (k + 1)


def random_success_probability(n: int, k: int, budget: int) -> float:
    """Probability that random search draws a good item within ``budget`` trials."""
    if budget >= n - k + 1:
        return 1.0
    return 1.0 - math.comb(n - k, budget) / math.comb(n, budget)


def replay(strategy: Strategy, group: LandscapeGroup) -> Iterator[Observation]:
    """Replay a study: each layout the strategy proposes, measured from the table, in order,
    until it proposes nothing (then ``strategy.stop`` says whether it stopped early).
    Raises if it proposes a non-candidate or a repeat."""
    launcher = ReplayLauncher(group)
    candidates = candidates_of(group)
    history: list[Observation] = []
    while (lay := strategy.propose(candidates, history)) is not None:
        if lay in {o.layout for o in history}:
            raise RuntimeError(f"{strategy.name} proposed {lay} twice")
        res = launcher.result_for(lay)  # LaunchError if not a candidate
        if res.status == "ok":
            obs = Observation(lay, "ok", res.model_tflops_per_device)
        else:
            obs = Observation(lay, "oom" if res.status == "oom" else "error")
        history.append(obs)
        yield obs


def trials_to_hit(strategy: Strategy, group: LandscapeGroup, tolerance: float,
                  max_trials: int | None = None) -> int | None:
    """Trials until a layout within ``tolerance`` of the best is measured, ``None`` if the
    strategy stops first or ``max_trials`` pass without one (a censored run: a miss)."""
    threshold = threshold_of(group, tolerance)
    for n, obs in enumerate(replay(strategy, group), start=1):
        if obs.value is not None and obs.value >= threshold:
            return n
        if max_trials is not None and n >= max_trials:
            return None
    return None


def until_stop(strategy: Strategy, group: LandscapeGroup, budget: int, tolerance: float
               ) -> dict[str, float | int | bool | None]:
    """Replay until the strategy stops (or runs out of layouts) or ``budget`` trials are
    spent: the trials spent, whether it stopped early, whether the best measured by then is
    within ``tolerance`` of the group's best, and the regret ``1 - best / group best``."""
    best, trials = 0.0, 0
    for obs in replay(strategy, group):
        trials += 1
        best = max(best, obs.value or 0.0)
        if trials >= budget:
            break
    top = group.best().model_tflops_per_device or 0.0
    return {"min_improvement": getattr(strategy, "min_improvement", None), "trials": trials,
            "stopped": strategy.stop is not None and trials < budget,
            "success": best >= threshold_of(group, tolerance),
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
    cluster: ClusterConfig | None = None
    """The cluster the cost model predicts for (``--profile-cv``: the group's with a
    held-out layer profile); ``None``: the group's own."""
    label: str = ""
    """The row this replay is reported under (default: the strategy)."""

    def __post_init__(self) -> None:
        self.label = self.label or self.strategy


def run_task(task: Task) -> list[int | None]:
    g = task.group
    predict = cost_model_predictor(g.model, task.cluster or g.cluster, dtype=g.dtype)
    out = []
    for seed in task.seeds:
        pred = with_error(predict, g, task.cost_model_error, seed)
        out.append(trials_to_hit(make_strategy(task.strategy, seed=seed, predict=pred), g,
                                 task.tolerance, task.max_trials))
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


def perturbed(predict: Predictor, layouts: list[Layout], sd: float, seed: str) -> Predictor:
    """``predict`` times ``exp(N(0, sd^2))`` per axis value (tp=4, recompute=full, ...):
    a cost model that is wrong about whole axes, as real ones are (docs/models.md)."""
    rng = random.Random(seed)  # a str seed hashes the same in every process
    factor = {(a, v): math.exp(rng.gauss(0.0, sd)) for a in PARAM_AXES
              for v in sorted({getattr(lay, a) for lay in layouts}, key=str)}
    return lambda lay: predict(lay) * math.prod(factor[a, getattr(lay, a)]
                                                 for a in PARAM_AXES)


def with_error(predict: Predictor, group: LandscapeGroup, sd: float, draw: int) -> Predictor:
    """``predict`` itself when ``sd`` is 0, else its :func:`perturbed` draw ``draw`` for
    ``group`` (the same draw for every strategy and replay that asks for it)."""
    if sd <= 0:
        return predict
    return perturbed(predict, candidates_of(group), sd, f"{group.name}/{draw}")


def run_early_stop(task: EarlyStopTask) -> list[Run]:
    g = task.group
    predict = cost_model_predictor(g.model, g.cluster, dtype=g.dtype)
    runs = []
    for draw in range(task.draws):
        pred = with_error(predict, g, task.cost_model_error, draw)
        runs += [{"draw": draw, **until_stop(make_strategy("default", seed=0, predict=pred,
                                                           min_improvement=m),
                                             g, task.budget, task.tolerance)}
                 for m in task.min_improvements]
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


def summarize(trials: list[int | None], budget: int) -> dict[str, float | None]:
    """Median and quartiles of trials-to-hit (a miss counts as infinitely many) and the
    fraction of runs that hit within the budget."""
    vals = sorted(math.inf if t is None else float(t) for t in trials)

    finite = [v for v in vals if math.isfinite(v)]
    return {"median_trials": _fin(statistics.median(vals)),
            "q1_trials": _fin(_quantile(vals, 0.25)), "q3_trials": _fin(_quantile(vals, 0.75)),
            "mean_trials": statistics.fmean(finite) if len(finite) == len(vals) else None,
            "success_rate": sum(1 for v in vals if v <= budget) / len(vals)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--landscape", action="append", help="CSV (repeatable; default: the "
                    "tables shipped in data/landscapes/)")
    ap.add_argument("--strategies", default="default,random,grid,cost-model-only,tpe,gp")
    ap.add_argument("--repeats", type=int, default=20, help="seeds per random strategy")
    ap.add_argument("--optuna-repeats", type=int, default=3,
                    help="seeds for tpe and gp (Optuna's GP refits per ask: seconds a run)")
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--budget", type=int, default=10)
    ap.add_argument("--hardware", default=None, help="device name where the file lacks it")
    ap.add_argument("--devices-per-node", type=int, default=None)
    ap.add_argument("--vocab-size", type=int, default=51200)
    ap.add_argument("--min-layouts", type=int, default=8)
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
    ap.add_argument("--attention", choices=ATTENTION_KINDS, default=None,
                    help="override the file's attention kind (default: vTrain explicit, "
                    "Aurora flash)")
    add_profile_cv_argument(ap)
    args = ap.parse_args(argv)
    args.landscape = args.landscape or [str(shipped_landscape(n)) for n in SHIPPED_LANDSCAPES]
    try:
        schemes = parse_profile_cv(args.profile_cv)
    except ValueError as err:
        ap.error(str(err))
    for m in args.min_improvement:
        if not 0.0 <= m < 1.0:
            ap.error(f"--min-improvement: got {m}; allowed: a fraction >= 0 and < 1")

    if args.max_trials is not None and args.max_trials < args.budget:
        ap.error(f"--max-trials: got {args.max_trials}; allowed: at least --budget "
                 f"({args.budget}), or the success rate would be censored")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in strategies:
        if s not in STRATEGIES:
            ap.error(f"--strategies: unknown {s!r}; allowed: {', '.join(STRATEGIES)}")
    groups: list[LandscapeGroup] = []
    every_group: list[LandscapeGroup] = []  # the small ones too: profiles are fitted on all
    for path in args.landscape:
        loaded = load_landscape(path, hardware=args.hardware,
                                devices_per_node=args.devices_per_node,
                                vocab_size=args.vocab_size, attention=args.attention)
        usable = [g for g in loaded if len(g.measurements) >= args.min_layouts and g.ok()]
        print(f"{path}: {len(loaded)} groups, {len(usable)} with >= {args.min_layouts} "
              "layouts", file=sys.stderr)
        groups.extend(usable)
        every_group.extend(loaded)
    if not groups:
        print("no landscape group is large enough", file=sys.stderr)

    def seeds(strategy: str) -> list[int]:
        if strategy in DETERMINISTIC:
            return list(range(args.error_draws if strategy in USES_COST_MODEL
                              and args.cost_model_error > 0 else 1))
        return list(range(args.optuna_repeats if strategy in ("tpe", "gp") else args.repeats))

    # Random search is never censored: it is cheap, and its full runs are the harness check.
    tasks = [Task(g, s, seeds(s), args.tolerance, args.cost_model_error,
                  None if s == "random" else args.max_trials)
             for g in groups for s in strategies]
    profiled_rows: dict[str, dict[str, str]] = {}  # scheme -> strategy -> row label
    for scheme in schemes:
        mine = [s for s in strategies if s in USES_COST_MODEL]
        profiled_rows[scheme] = {s: f"{s}+{scheme}" for s in mine}
        clusters = held_out_clusters(groups, scheme, fit_on=every_group)
        tasks += [Task(g, s, seeds(s), args.tolerance, args.cost_model_error, args.max_trials,
                       cluster=c, label=profiled_rows[scheme][s])
                  for g, c in zip(groups, clusters, strict=True) for s in mine]
    rows = [*strategies, *(r for by_s in profiled_rows.values() for r in by_s.values())]
    started = time.monotonic()
    if args.jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(run_task, tasks, chunksize=1))
    else:
        results = [run_task(t) for t in tasks]

    early: list[list[Run]] = []
    stops: list[float | None] = [None, *sorted(set(args.min_improvement))]
    if args.min_improvement:
        draws = args.error_draws if args.cost_model_error > 0 else 1
        early_tasks = [EarlyStopTask(g, stops, args.budget, args.tolerance,
                                     args.cost_model_error, draws) for g in groups]
        if args.jobs > 1 and len(early_tasks) > 1:
            with ProcessPoolExecutor(args.jobs) as pool:
                early = list(pool.map(run_early_stop, early_tasks, chunksize=1))
        else:
            early = [run_early_stop(t) for t in early_tasks]
    elapsed = time.monotonic() - started

    per_group: dict[str, dict[str, list[int | None]]] = {}
    for task, res in zip(tasks, results, strict=True):
        per_group.setdefault(task.group.name, {})[task.label] = res

    out_groups: list[dict[str, Any]] = []
    group_rows: list[dict[str, dict[str, float | None]]] = []  # per group: row -> summary
    # Analytic columns keep their 10 characters; the longer profiled labels widen theirs.
    widths = {r: 10 if r in strategies else max(10, len(r)) for r in rows}
    header = f"{'group':44s} {'N':>3s} {'k':>3s} {'rnd E':>6s}" + "".join(
        f" {r[:widths[r]]:>{widths[r]}s}" for r in rows)
    print(header)
    for g in groups:
        n, k = len(g.measurements), good_count(g, args.tolerance)
        by_row = {r: summarize(per_group[g.name][r], args.budget) for r in rows}
        entry = {"name": g.name, "n_layouts": n, "n_good": k,
                 "random_expected_trials": random_expectation(n, k),
                 "random_expected_success_rate": random_success_probability(n, k, args.budget),
                 "strategies": {s: by_row[s] for s in strategies}}
        if profiled_rows:
            entry["profiled"] = {scheme: {s: by_row[r] for s, r in by_s.items()}
                                 for scheme, by_s in profiled_rows.items()}
        out_groups.append(entry)
        group_rows.append(by_row)
        cells = "".join(f" {_fmt(by_row[r]['median_trials']):>{widths[r]}s}" for r in rows)
        print(f"{g.name[:44]:44s} {n:3d} {k:3d} {entry['random_expected_trials']:6.2f}{cells}")

    summary: dict[str, dict[str, float | None]] = {}
    for s in rows:
        medians = [_inf(by_row[s]["median_trials"]) for by_row in group_rows]
        rates = [by_row[s]["success_rate"] or 0.0 for by_row in group_rows]
        summary[s] = {
            "median_trials": _fin(statistics.median(medians)) if medians else None,
            "q1_trials": _fin(_quantile(medians, 0.25)),
            "q3_trials": _fin(_quantile(medians, 0.75)),
            "max_group_median_trials": _fin(max(medians)) if medians else None,
            "success_rate": statistics.fmean(rates) if rates else None,
        }
    if out_groups:
        # Against the analytic random expectation (noise-free): mean trials over groups.
        expected_random = statistics.fmean(e["random_expected_trials"] for e in out_groups)
        for s in rows:
            means = [_inf(by_row[s]["mean_trials"]) for by_row in group_rows]
            summary[s]["mean_trials"] = _fin(statistics.fmean(means))
            mean = statistics.fmean(means)
            summary[s]["speedup_vs_random"] = (expected_random / mean if math.isfinite(mean)
                                               else None)  # a miss in some group: undefined
    if "random" in strategies and out_groups:
        measured = [e["strategies"]["random"]["mean_trials"] for e in out_groups]
        expected = [e["random_expected_trials"] for e in out_groups]
        print(f"\nrandom search check: mean over groups of measured mean trials "
              f"{statistics.fmean(m for m in measured if m is not None):.2f}, analytic "
              f"(N+1)/(k+1) {statistics.fmean(expected):.2f}; median of group medians "
              f"{summary['random']['median_trials']}")
    print(f"\nsummary over {len(out_groups)} groups (tolerance {args.tolerance:.0%}, "
          f"budget {args.budget}; {elapsed:.0f} s):")
    name_width = max([16, *(len(r) for r in rows)])
    print(f"{'strategy':{name_width}s} {'median':>7s} {'q1':>5s} {'q3':>5s} {'worst':>6s} "
          f"{'mean':>5s} {'success':>8s} {'x random':>9s}")
    for s in rows:
        r = summary[s]
        print(f"{s:{name_width}s} {_fmt(r['median_trials']):>7s} {_fmt(r['q1_trials']):>5s} "
              f"{_fmt(r['q3_trials']):>5s} {_fmt(r['max_group_median_trials']):>6s} "
              f"{_fmt(r.get('mean_trials')):>5s} "
              f"{r['success_rate'] or 0:8.1%} {_fmt(r.get('speedup_vs_random')):>9s}")
    early_summary = []
    if early:
        for entry, runs in zip(out_groups, early, strict=True):
            entry["early_stop"] = runs
        early_summary = [{"min_improvement": m, "cost_model_error": args.cost_model_error,
                          **summarize_early_stop([r for runs in early for r in runs
                                                  if r["min_improvement"] == m])}
                         for m in stops]
        _print_early_stop(groups, stops, early, early_summary, args.budget, args.tolerance,
                          args.cost_model_error)
    if args.json:
        doc = {"tolerance": args.tolerance, "budget": args.budget, "repeats": args.repeats,
               "min_layouts": args.min_layouts, "landscapes": args.landscape,
               "strategies": {s: summary[s] for s in strategies}, "groups": out_groups}
        if profiled_rows:
            doc["profiled"] = {scheme: {s: summary[r] for s, r in by_s.items()}
                               for scheme, by_s in profiled_rows.items()}
        if early_summary:
            doc["early_stop"] = early_summary
        Path(args.json).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
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


if __name__ == "__main__":
    raise SystemExit(main())
