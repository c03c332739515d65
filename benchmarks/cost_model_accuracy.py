"""How well does the analytic cost model rank measured layouts?

For every landscape group with at least ``--min-layouts`` measured (``ok``) layouts, the
Spearman rank correlation between predicted and measured model TFLOPS per device, and
whether the measured best is among the predicted top 3; per file, the median and maximum
absolute percentage error of the predicted TFLOPS over its ok rows and the share of them
inside the 90% band ``plan`` prints (``benchmarks/_errors.py``). OOM rows are left out of the
correlation; the memory model's verdict on them is reported (``oom_flagged``). Every group
also goes through the feasibility check a real study of it would apply (default settings,
memory rule and placement included: ``benchmarks/_common.py``, ``study_check``): the
measured-ok layouts it excludes (``ok_excluded``), whether the measured best is one of them
(``best_excluded``) and the loss ``1 - best kept / best`` (``loss``).

    python benchmarks/cost_model_accuracy.py --json accuracy.json

reads the two tables shipped in ``data/landscapes/`` (vTrain and Aurora); ``--landscape
FILE`` (repeatable) reads others instead.

``--profile-cv SCHEME`` (``layers``, ``world``, ``batch``; repeatable or a comma list) also
ranks every group with measured layer times (:mod:`autotune.models.profile`) fitted only
on *other* groups: those with another layer count, device count or global batch than the
held-out group's (leave one value out). That is what a user has who profiled, or measured
earlier studies, before planning this one. ``--profile FILE`` ranks with a profile file
(``autotune profile``). The summary then compares the analytic model with each.

    python benchmarks/cost_model_accuracy.py \\
        --landscape data/landscapes/vtrain_a100_single_node.csv \\
        --profile-cv layers,world,batch

``--online-after 2,4`` (the default; empty for none) adds the **online-calibrated** row:
each group replayed as a study with the default strategy, and after its first ``k``
trials the strategy's own calibrated model (its residual posterior, fitted on those ``k``
trials only) ranks the layouts it has not tried; Spearman and top 3 (the measured best
already measured, or in the top 3 of the untried) beside the analytic model on the same
untried layouts (``benchmarks/_online.py``; JSON key ``online``). ``--cost-model-error
SD`` (``--error-draws N``) makes the cost model of that row wrong about whole axes, as in
``search_efficiency.py``: where the calibration earns its keep.

Attention: the vTrain runs (Megatron-DeepSpeed, 2022-23) used Megatron's fused softmax,
which materialises the score matrix; the Aurora runs and our trainer use flash / SDPA
attention. The loader sets ``model.attention`` by format; ``--attention`` overrides it.
Nothing here is fitted to the files: the model's constants are physical (docs/models.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.errors import SpecError
from autotune.feasibility import MemoryBudget, check_layout
from autotune.landscape import LandscapeGroup
from autotune.models.cost import estimate_step
from autotune.models.profile import LayerProfile, load_profile
from autotune.search import cost_model_predictor
from benchmarks import _common as common
from benchmarks import _cost_model_variants as variants
from benchmarks import _errors as errors
from benchmarks import _online as online
from benchmarks._common import spearman
from benchmarks._zero3_rows import print_zero3_variants, zero3_variant_report


def _flagged(group: LandscapeGroup, margin: float, status: str = "oom") -> int:
    """Rows of ``status`` that the memory model alone predicts do not fit the device."""
    spec = group.cluster.device_spec()
    budget = MemoryBudget(spec.memory_bytes, margin=margin, dtype=group.dtype,
                          device=group.cluster.device, stack=group.stack)
    return sum(1 for m in group.measurements if m.status == status
               and any(r.code == "memory"
                       for r in check_layout(m.layout, group.model, memory=budget)))


def rank_group(group: LandscapeGroup, profile: LayerProfile | None = None) -> dict[str, Any]:
    """The cost model on the group's cluster (with ``profile``'s measured layer times, if
    given) against the group's ``ok`` rows: Spearman's rho, whether the measured best is in
    the predicted top 3, and the share of those layouts whose layer time came from
    ``profile`` (``profiled_share``)."""
    ok = group.ok()
    if not ok:
        return {"name": group.name, "n_layouts": 0, "spearman": None, "best_in_top3": False,
                "profiled_share": 0.0}
    estimates = [estimate_step(group.model, m.layout, group.cluster, dtype=group.dtype,
                               stack=group.stack,
                               profile=profile) for m in ok]
    predicted = [e.model_tflops_per_device for e in estimates]
    measured = [float(m.model_tflops_per_device or 0.0) for m in ok]
    best = int(np.argmax(measured))
    top3 = sorted(range(len(ok)), key=lambda i: -predicted[i])[:3]
    return {
        "name": group.name, "n_layouts": len(ok),
        "spearman": spearman(predicted, measured) if len(ok) >= 2 else None,
        "best_in_top3": best in top3,
        "measured_best": ok[best].layout.key(),
        "predicted_best": ok[top3[0]].layout.key(),
        "profiled_share": statistics.fmean(e.profiled for e in estimates),
    }


def _below_half(group: LandscapeGroup, check: common.StudyCheck) -> tuple[int, bool]:
    """The rows that ran whose probability of fitting, as the study's runner hands it to a
    strategy before any trial (:func:`common.study_p_fit`: the group's stack), is below
    1/2, and whether the group's measured best is one of them: what a study would try late
    or not at all."""
    p_fit = common.study_p_fit(group, check, [])
    ok = group.ok()
    if p_fit is None or not ok:
        return 0, False
    below = {m.layout for m in ok if p_fit(m.layout) < 0.5}
    return len(below), group.best().layout in below


def evaluate_group(group: LandscapeGroup, *, margin: float,
                   check: common.StudyCheck | None = None) -> dict[str, Any]:
    """:func:`rank_group` with the analytic model, the memory model on its rows, and the
    study's feasibility check (``check``, computed when not given)."""
    check = check or common.study_check(group, memory_margin=margin)
    below, best_below = _below_half(group, check)
    return {**rank_group(group),
            "n_oom": sum(m.status == "oom" for m in group.measurements),
            "oom_flagged": _flagged(group, margin),
            "ok_flagged_infeasible": _flagged(group, margin, status="ok") if group.ok() else 0,
            "ok_below_half_p_fit": below, "best_below_half_p_fit": best_below,
            **check.to_dict()}


def summarize(ranked: list[dict[str, Any]]) -> dict[str, Any]:
    """Over groups ranked by :func:`rank_group`: the median Spearman (NaN groups left out),
    the top-3 hits and misses, and the share of all layouts whose layer time was measured."""
    rhos = [g["spearman"] for g in ranked if g["spearman"] is not None
            and not np.isnan(g["spearman"])]
    n_layouts = sum(g["n_layouts"] for g in ranked)
    return {"n_groups": len(ranked),
            "median_spearman": float(np.median(rhos)) if rhos else None,
            "top3_hits": sum(bool(g["best_in_top3"]) for g in ranked),
            "top3_misses": [g["name"] for g in ranked if not g["best_in_top3"]],
            "profiled_share": (sum(g["profiled_share"] * g["n_layouts"] for g in ranked)
                               / n_layouts if n_layouts else 0.0)}


def _profiled_variant(groups: list[LandscapeGroup], profiles: list[LayerProfile]
                      ) -> dict[str, Any]:
    """:func:`summarize` of the groups ranked with these profiles (one per group), with the
    per-group rows."""
    ranked = [rank_group(g, p) for g, p in zip(groups, profiles, strict=True)]
    return {**summarize(ranked), "groups": ranked}


# ---------------------------------------------------------------------------------- main


@dataclass
class Evaluation:
    """Every group read, and the rows of those with enough measured layouts."""

    loaded: list[LandscapeGroup] = field(default_factory=list)
    checks: list[common.StudyCheck] = field(default_factory=list)
    """``common.study_check`` of each loaded group."""
    selected: list[LandscapeGroup] = field(default_factory=list)
    selected_checks: list[common.StudyCheck] = field(default_factory=list)
    """``common.study_check`` of each selected group (the online row's candidates)."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """:func:`evaluate_group` of each selected group."""
    oom_rows: int = 0
    oom_flagged: int = 0
    ok_rows: int = 0
    ok_flagged: int = 0
    ok_below_half: int = 0
    """Rows that ran predicted below a probability of fitting of 1/2 (all groups read)."""
    best_below_half: list[str] = field(default_factory=list)
    """Groups whose measured best is one of them."""
    tables: list[errors.TableErrors] = field(default_factory=list)
    """Absolute error and band coverage of each file's ok rows (all groups read)."""


def evaluate(args: argparse.Namespace) -> Evaluation:
    """Read every file and evaluate each group; keep those with ``--min-layouts`` ok rows."""
    ev = Evaluation()
    for path, groups in common.load_groups(args):
        table = errors.TableErrors(str(path))
        ev.tables.append(table)
        for g in groups:
            table.add(errors.group_errors(g))
            check = common.study_check(g, memory_margin=args.memory_margin)
            res = evaluate_group(g, margin=args.memory_margin, check=check)
            ev.loaded.append(g)
            ev.checks.append(check)
            ev.oom_rows += res["n_oom"]
            ev.oom_flagged += res["oom_flagged"]
            ev.ok_rows += sum(m.status == "ok" for m in g.measurements)
            ev.ok_flagged += res["ok_flagged_infeasible"]
            ev.ok_below_half += res["ok_below_half_p_fit"]
            if res["best_below_half_p_fit"]:
                ev.best_below_half.append(g.name)
            if res["n_layouts"] >= args.min_layouts:
                ev.rows.append(res)
                ev.selected.append(g)
                ev.selected_checks.append(check)
    return ev


def profiled_variants(ev: Evaluation, schemes: list[str], given: LayerProfile | None
                      ) -> dict[str, dict[str, Any]]:
    """The selected groups ranked with held-out profiles (one variant per scheme) and with
    ``--profile`` (``file``). Every loaded group is fitted on (small ones too): a held-out
    group's own key value never is, so the only question is how much of the rest a user
    would have measured."""
    profiles = {s: variants.held_out_profiles(ev.selected, s, fit_on=ev.loaded) for s in schemes}
    if given is not None:
        profiles["file"] = [given] * len(ev.selected)
    return {name: _profiled_variant(ev.selected, ps) for name, ps in profiles.items()}


def online_variant(ev: Evaluation, after: list[int], *, error_sd: float = 0.0,
                   draws: int = 1, link_factor: float | None = None) -> dict[str, Any]:
    """The ``online`` row (``benchmarks/_online.py``) of the selected groups: its summary
    per count of trials, its definition and the per-group entries (empty without counts).
    ``error_sd`` > 0: the cost model made wrong (``variants.with_error``), ``draws`` draws a
    group, for this row alone (its analytic columns rank with the same wrong model);
    ``link_factor``: the cost model told every link has that times its bandwidth
    (``variants.wrong_links``), likewise for this row alone."""
    if not after:
        return {}
    draws = draws if error_sd > 0 else 1
    rows = []
    for draw in range(draws):
        for g, c in zip(ev.selected, ev.selected_checks, strict=True):
            told = g.cluster if link_factor is None else variants.wrong_links(g.cluster,
                                                                              link_factor)
            predict = variants.with_error(cost_model_predictor(g.model, told, dtype=g.dtype,
                                                          stack=g.stack),
                                          g, error_sd, draw)
            row = online.online_group(g, c, after, predict)
            rows.append({**row, "draw": draw} if error_sd > 0 else row)
    out = {"definition": online.DEFINITION, "after": online.summarize_online(rows, after),
           "groups": rows}
    if link_factor is not None:
        out["link_factor"] = link_factor
    return {**out, "cost_model_error": error_sd, "error_draws": draws} if error_sd > 0 else out


def print_groups(ev: Evaluation, analytic: dict[str, Any], min_layouts: int) -> None:
    """One line per selected group, then the totals and the study's feasibility check."""
    print(f"{'group':50s} {'n':>4s} {'spearman':>9s} {'top3':>5s} {'excl':>4s}  "
          "measured best / predicted")
    for row in ev.rows:
        rho = "nan" if row["spearman"] is None else f"{row['spearman']:.3f}"
        best = "  (measured best excluded)" if row["best_excluded"] else ""
        print(f"{row['name']:50s} {row['n_layouts']:4d} {rho:>9s} {row['best_in_top3']!s:>5s} "
              f"{row['ok_excluded']:4d}  {row['measured_best']} / {row['predicted_best']}{best}")
    median, misses = analytic["median_spearman"], analytic["top3_misses"]
    n = len(ev.rows)
    print(f"\ngroups with >= {min_layouts} layouts: {n}; median Spearman "
          f"{median if median is None else round(median, 4)}; measured best in predicted "
          f"top 3: {n - len(misses)}/{n}")
    print(f"OOM rows: {ev.oom_rows}, predicted infeasible by the memory model: "
          f"{ev.oom_flagged}")
    # The other side of the memory model's accuracy: rows that ran but are predicted not to.
    print(f"ok rows: {ev.ok_rows}, predicted infeasible by the memory model: {ev.ok_flagged}")
    share = ev.ok_below_half / ev.ok_rows if ev.ok_rows else 0.0
    print(f"ok rows predicted below P(fit) 0.5 by the study's memory rule: {ev.ok_below_half}"
          f" ({share:.1%}); groups whose measured best is one: {len(ev.best_below_half)}"
          + (f" ({', '.join(ev.best_below_half[:5])}"
             f"{', ...' if len(ev.best_below_half) > 5 else ''})" if ev.best_below_half else ""))
    common.print_study_check(list(zip(ev.loaded, ev.checks, strict=True)),
                             f"all {len(ev.loaded)} groups read")
    errors.print_tables(ev.tables)


def _print_comparison(variants: dict[str, dict[str, Any]]) -> None:
    """The analytic model beside each profiled one: one row each, then the misses."""
    print(f"\n{'cost model':24s} {'groups':>6s} {'median rho':>10s} {'best in top 3':>13s} "
          f"{'layer time measured':>19s}")
    for name, r in variants.items():
        rho = "-" if r["median_spearman"] is None else f"{r['median_spearman']:.4f}"
        print(f"{name:24s} {r['n_groups']:6d} {rho:>10s} "
              f"{r['top3_hits']:>7d}/{r['n_groups']:<5d} {r['profiled_share']:19.0%}")
    print("groups whose measured best is not in the predicted top 3:")
    for name, r in variants.items():
        print(f"  {name}: {', '.join(r['top3_misses']) or 'none'}")


def to_json(ev: Evaluation, analytic: dict[str, Any], profiled: dict[str, dict[str, Any]],
            profile_source: str | None, online_row: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    """The ``--json`` document (keys in docs/models.md, "Accuracy")."""
    pairs = list(zip(ev.loaded, ev.checks, strict=True))
    out: dict[str, Any] = {
        "median_spearman": analytic["median_spearman"], "groups": ev.rows,
        "n_groups": len(ev.rows), "top3_misses": analytic["top3_misses"],
        "oom_rows": ev.oom_rows, "oom_flagged": ev.oom_flagged,
        "ok_rows": ev.ok_rows, "ok_flagged_infeasible": ev.ok_flagged,
        "ok_below_half_p_fit": ev.ok_below_half,
        "best_below_half_p_fit_groups": ev.best_below_half,
        "top3_hits": analytic["top3_hits"],
        "ok_excluded": sum(c.ok_excluded for c in ev.checks),
        "best_excluded_groups": [g.name for g, c in pairs if c.best_excluded],
        "excluded_groups": common.excluded_groups(pairs),
        "tables": [t.to_dict() for t in ev.tables]}
    if profiled:
        out["profiled"] = profiled
        if profile_source is not None:
            out["profiled"]["file"]["source"] = profile_source
    if online_row:
        out["online"] = online_row
    return out


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str],
                                                LayerProfile | None]:
    """The options, the ``--profile-cv`` schemes and the ``--profile`` file read."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_landscape_arguments(p)
    variants.add_profile_cv_argument(p)
    p.add_argument("--profile", metavar="FILE",
                   help="also predict with this layer profile (written by autotune profile)")
    p.add_argument("--online-after", default="2,4", metavar="K,K",
                   help="also rank with the default strategy's model calibrated on its first "
                   "K trials of a replayed study (comma list; empty: none; default 2,4)")
    p.add_argument("--cost-model-error", type=float, default=0.0, metavar="SD",
                   help="for the online row only: a cost model wrong by a log-normal error of "
                   "this sd per axis value, as in search_efficiency.py (0: the real one)")
    p.add_argument("--error-draws", type=int, default=3, metavar="N",
                   help="draws of that error per group (default 3)")
    p.add_argument("--link-factor", type=float, default=None, metavar="F",
                   help="the online row's cost model is told every link has F times its "
                   "real bandwidth (0.25: NVLink 4x slower than it is); default: the truth")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    args.landscape = common.landscape_paths(args)
    if args.error_draws < 1:
        p.error(f"--error-draws: got {args.error_draws}; allowed: at least 1")
    if args.link_factor is not None and not 0 < args.link_factor <= 1000:
        p.error(f"--link-factor: got {args.link_factor}; allowed: a factor > 0 and <= 1000")
    try:
        args.online_after = online.parse_after(args.online_after)
        return args, variants.parse_profile_cv(args.profile_cv), (
            load_profile(args.profile) if args.profile else None)
    except (ValueError, SpecError) as err:
        p.error(str(err))


def main(argv: list[str] | None = None) -> int:
    args, schemes, given = parse_args(argv)
    ev = evaluate(args)
    analytic = summarize(ev.rows)
    print_groups(ev, analytic, args.min_layouts)
    profiled = profiled_variants(ev, schemes, given)
    if profiled:
        _print_comparison({"analytic": analytic, **{
            f"profiled, {'file' if name == 'file' else 'cv ' + name}": r
            for name, r in profiled.items()}})
    online_row = online_variant(ev, args.online_after, error_sd=args.cost_model_error,
                                draws=args.error_draws, link_factor=args.link_factor)
    if args.link_factor is not None:
        print(f"\n(the online row's cost model is told every link has {args.link_factor:g} "
              "times its bandwidth)")
    online.print_online(online_row.get("after", {}), args.cost_model_error)
    zero3 = zero3_variant_report(ev.loaded)  # the Aurora MiCS/hpZ rows (_zero3_rows.py)
    print_zero3_variants(zero3)
    if args.json:
        doc = to_json(ev, analytic, profiled, args.profile if given is not None else None,
                      online_row)
        doc["zero3_variants"] = zero3
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
