"""How well does the analytic cost model rank measured layouts?

For every landscape group with at least ``--min-layouts`` measured (``ok``) layouts, the
Spearman rank correlation between predicted and measured model TFLOPS per device, and
whether the measured best is among the predicted top 3. OOM rows are left out of the
correlation; the memory model's verdict on them is reported (``oom_flagged``).

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
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ATTENTION_KINDS
from autotune.errors import SpecError
from autotune.feasibility import MemoryBudget, check_layout
from autotune.landscape import (
    SHIPPED_LANDSCAPES,
    LandscapeGroup,
    load_landscape,
    shipped_landscape,
)
from autotune.models.cost import estimate_step
from autotune.models.profile import LayerProfile, load_profile
from autotune.models.profile_fit import fit_layer_profile, landscape_samples

CV_SCHEMES: dict[str, Callable[[LandscapeGroup], int]] = {
    "layers": lambda g: g.model.n_layer,
    "world": lambda g: g.world_size,
    "batch": lambda g: g.global_batch,
}
"""Cross-validation schemes of measured layer profiles: the key whose every value is held
out in turn. Each is a situation a user is in: profiles from shallower or deeper models of
the same width (``layers``), from other device counts (``world``), from other global
batches (``batch``)."""


def average_ranks(values: list[float]) -> np.ndarray:
    """Ranks 1..n with ties given the mean of the ranks they span."""
    x = np.asarray(values, dtype=float)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tied = x == v
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rho: the Pearson correlation of the average ranks (NaN if constant)."""
    ra, rb = average_ranks(a), average_ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _flagged(group: LandscapeGroup, margin: float, status: str = "oom") -> int:
    """Rows of ``status`` that the memory model predicts do not fit the device."""
    spec = group.cluster.device_spec()
    budget = MemoryBudget(spec.memory_bytes, margin=margin, dtype=group.dtype,
                          device=group.cluster.device)
    return sum(1 for m in group.measurements if m.status == status
               and any(r.code == "memory"
                       for r in check_layout(m.layout, group.model, memory=budget)))


def rank_group(group: LandscapeGroup, cluster: ClusterConfig) -> dict[str, Any]:
    """The cost model on ``cluster`` against the group's ``ok`` rows: Spearman's rho, whether
    the measured best is in the predicted top 3, and the share of those layouts whose layer
    time came from ``cluster.profile`` (``profiled_share``)."""
    ok = group.ok()
    if not ok:
        return {"name": group.name, "n_layouts": 0, "spearman": None, "best_in_top3": False,
                "profiled_share": 0.0}
    estimates = [estimate_step(group.model, m.layout, cluster, dtype=group.dtype) for m in ok]
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


def evaluate_group(group: LandscapeGroup, *, margin: float) -> dict[str, Any]:
    """:func:`rank_group` on the group's own cluster, and the memory model on its rows."""
    return {**rank_group(group, group.cluster),
            "n_oom": sum(m.status == "oom" for m in group.measurements),
            "oom_flagged": _flagged(group, margin),
            "ok_flagged_infeasible": _flagged(group, margin, status="ok") if group.ok() else 0}


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


# ----------------------------------------------------------------- held-out layer profiles


def parse_profile_cv(values: Sequence[str]) -> list[str]:
    """``--profile-cv`` values (repeated or comma lists) as distinct scheme names, in order;
    :class:`ValueError` names an unknown one."""
    schemes = [v.strip() for value in values for v in value.split(",") if v.strip()]
    for s in schemes:
        if s not in CV_SCHEMES:
            raise ValueError(f"--profile-cv: unknown {s!r}; allowed: {', '.join(CV_SCHEMES)}")
    return list(dict.fromkeys(schemes))


def add_profile_cv_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--profile-cv`` option, the same in both benchmarks."""
    parser.add_argument("--profile-cv", action="append", default=[], metavar="SCHEME",
                        help="also predict with layer profiles fitted on the other groups "
                        f"(held out by: {', '.join(CV_SCHEMES)}; repeatable or a comma list)")


def held_out_profiles(groups: Sequence[LandscapeGroup], scheme: str,
                      fit_on: Sequence[LandscapeGroup] | None = None) -> list[LayerProfile]:
    """For each of ``groups``, the profile fitted on the groups of ``fit_on`` (default:
    ``groups``) whose ``scheme`` key differs from its own: nothing measured in a group, nor
    in any group sharing its key, enters its prediction. One fit per key value."""
    key = CV_SCHEMES[scheme]
    pool = groups if fit_on is None else fit_on
    folds: dict[int, LayerProfile] = {}
    for value in sorted({key(g) for g in groups}):
        folds[value] = fit_layer_profile(
            landscape_samples(g for g in pool if key(g) != value),
            source=f"landscape groups with {scheme} != {value}")
    return [folds[key(g)] for g in groups]


def held_out_clusters(groups: Sequence[LandscapeGroup], scheme: str,
                      fit_on: Sequence[LandscapeGroup] | None = None) -> list[ClusterConfig]:
    """Each group's cluster with its :func:`held_out_profiles` profile."""
    return [replace(g.cluster, profile=prof)
            for g, prof in zip(groups, held_out_profiles(groups, scheme, fit_on), strict=True)]


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--landscape", action="append", metavar="FILE",
                   help="CSV (repeatable; default: the tables shipped in data/landscapes/)")
    p.add_argument("--hardware", metavar="NAME", help="device name where the file lacks it")
    p.add_argument("--devices-per-node", type=int, metavar="N")
    p.add_argument("--vocab-size", type=int, default=51200, metavar="N")
    p.add_argument("--min-layouts", type=int, default=8, metavar="N")
    p.add_argument("--attention", choices=ATTENTION_KINDS,
                   help="override the file's attention kind (default: vTrain explicit, "
                        "Aurora flash)")
    p.add_argument("--memory-margin", type=float, default=0.05,
                   help="as trial.memory_margin (default 0.05)")
    add_profile_cv_argument(p)
    p.add_argument("--profile", metavar="FILE",
                   help="also predict with this layer profile (written by autotune profile)")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    args.landscape = args.landscape or [str(shipped_landscape(n)) for n in SHIPPED_LANDSCAPES]
    try:
        schemes = parse_profile_cv(args.profile_cv)
        given = load_profile(args.profile) if args.profile else None
    except (ValueError, SpecError) as err:
        p.error(str(err))

    loaded: list[LandscapeGroup] = []
    selected: list[LandscapeGroup] = []
    groups: list[dict[str, Any]] = []
    oom_total, oom_flagged, ok_total, ok_flagged = 0, 0, 0, 0
    for path in args.landscape:
        for g in load_landscape(path, hardware=args.hardware,
                                devices_per_node=args.devices_per_node,
                                vocab_size=args.vocab_size, attention=args.attention):
            loaded.append(g)
            res = evaluate_group(g, margin=args.memory_margin)
            oom_total += res["n_oom"]
            oom_flagged += res["oom_flagged"]
            ok_total += sum(m.status == "ok" for m in g.measurements)
            ok_flagged += res["ok_flagged_infeasible"]
            if res["n_layouts"] >= args.min_layouts:
                groups.append(res)
                selected.append(g)

    analytic = summarize(groups)
    median, misses = analytic["median_spearman"], analytic["top3_misses"]
    print(f"{'group':50s} {'n':>4s} {'spearman':>9s} {'top3':>5s}  measured best / predicted")
    for row in groups:
        rho = "nan" if row["spearman"] is None else f"{row['spearman']:.3f}"
        print(f"{row['name']:50s} {row['n_layouts']:4d} {rho:>9s} {row['best_in_top3']!s:>5s}  "
              f"{row['measured_best']} / {row['predicted_best']}")
    print(f"\ngroups with >= {args.min_layouts} layouts: {len(groups)}; median Spearman "
          f"{median if median is None else round(median, 4)}; measured best in predicted "
          f"top 3: {len(groups) - len(misses)}/{len(groups)}")
    print(f"OOM rows: {oom_total}, predicted infeasible by the memory model: {oom_flagged}")
    # The other side of the memory model's accuracy: rows that ran but are predicted not to.
    print(f"ok rows: {ok_total}, predicted infeasible by the memory model: {ok_flagged}")
    # Every loaded group is fitted on (small ones too): a held-out group's own key value
    # never is, so the only question is how much of the rest a user would have measured.
    clusters = {s: held_out_clusters(selected, s, fit_on=loaded) for s in schemes}
    if given is not None:
        clusters["file"] = [replace(g.cluster, profile=given) for g in selected]
    profiled = {name: _profiled_variant(selected, cl) for name, cl in clusters.items()}
    if profiled:
        _print_comparison({"analytic": analytic, **{
            f"profiled, {'file' if name == 'file' else 'cv ' + name}": r
            for name, r in profiled.items()}})
    if args.json:
        out = {"median_spearman": median, "groups": groups,
               "n_groups": len(groups), "top3_misses": misses,
               "oom_rows": oom_total, "oom_flagged": oom_flagged,
               "ok_rows": ok_total, "ok_flagged_infeasible": ok_flagged,
               "top3_hits": analytic["top3_hits"]}
        if profiled:
            out["profiled"] = profiled
            if given is not None:
                out["profiled"]["file"]["source"] = args.profile
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


def _profiled_variant(groups: list[LandscapeGroup], clusters: list[ClusterConfig]
                      ) -> dict[str, Any]:
    """:func:`summarize` of the groups ranked on these clusters, with the per-group rows."""
    ranked = [rank_group(g, c) for g, c in zip(groups, clusters, strict=True)]
    return {**summarize(ranked), "groups": ranked}


if __name__ == "__main__":
    sys.exit(main())
