"""The planner against published full-scale runs: one plan per run, as an outsider tries it.

A published scaling table (e.g. Megatron-LM's weak-scaling table, Narayanan et al. 2021,
table 1) gives, per run, a model shape, a GPU count, a global batch, the (TP, PP) pair the
authors chose, and the TFLOPS per GPU they measured. Issue #32 judges the planner on such
tables: is the published pair among the plan's best pairs, is its layout ever excluded,
and how far is the predicted TFLOPS from the published one? This script answers that for
any such table, from a study file and a CSV, with the shipped planner
(:func:`autotune.planning.plan.plan_study`, what ``autotune plan --no-learn`` prints): no
table is shipped or fitted to here; the one that judges the model is the user's.

    .venv/bin/python benchmarks/published_runs.py TEMPLATE.yaml RUNS.csv \\
        [--tflops hardware|model] [--pp divisors|template] [--top-pairs 5] [--json OUT]

``TEMPLATE.yaml`` is a study file that says what is common to the runs: the device
(``cluster.device``, ``devices_per_node``), ``training.dtype`` and ``training.stack``,
``model.attention``, ``model.dropout``, ``model.vocab_size`` and ``seq_len``, and the
axes the plan searches (``search.tp``, ``micro_batch``, ``zero_stage``, ``recompute``, ...).
Each CSV row replaces the model's shape, the cluster's size and the global batch:

* required columns: ``layers``, ``hidden``, ``heads``, ``gpus``, ``global_batch``, ``tp``,
  ``pp``, ``tflops`` (the published TFLOPS per GPU);
* optional: ``name``, ``seq``, ``vocab``, ``devices_per_node`` (else the template's).

``--tflops hardware`` (the default) compares with the plan's hardware TFLOPS (recomputed
forward passes counted, as Megatron's table counts them: ``hardware_flops_per_step``);
``model`` with its model TFLOPS. ``--pp divisors`` (the default) searches every divisor
of the row's layer count as the pipeline degree (a published run's PP divides its layers);
``template`` keeps the template's ``search.pp``. Per run it prints the plan's best layout,
the published pair's rank among the plan's (TP, PP) pairs (ordered by each pair's best
layout, the plan's order), the pair's best layout with its predicted TFLOPS against the
published figure, and, where the plan has no layout of that pair, why (the plan's own
exclusion message). Under the rows: the median and largest absolute error, the signed
median, the rows whose pair is among the plan's best ``--top-pairs`` pairs, and the rows
whose published pair the plan excludes or does not search.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.errors import SpecError  # noqa: E402
from autotune.planning.empty import no_layout_text  # noqa: E402
from autotune.planning.plan import PlanResult, PlanRow, plan_study  # noqa: E402
from autotune.planning.space import axis_choices, divisors, space_size  # noqa: E402
from autotune.spec import StudySpec, parse_study, read_yaml  # noqa: E402

__all__ = ["RunRow", "RunResult", "read_runs", "row_spec", "evaluate_run", "summarize", "main"]

REQUIRED = ("layers", "hidden", "heads", "gpus", "global_batch", "tp", "pp", "tflops")
OPTIONAL = ("name", "seq", "vocab", "devices_per_node")
MAX_ROWS = 1000


@dataclass(frozen=True)
class RunRow:
    """One published run, as its CSV line gives it."""

    name: str
    line: int
    layers: int
    hidden: int
    heads: int
    gpus: int
    global_batch: int
    tp: int
    pp: int
    tflops: float
    seq: int | None = None
    vocab: int | None = None
    devices_per_node: int | None = None


@dataclass(frozen=True)
class RunResult:
    """What the plan makes of one run."""

    run: RunRow
    best: str | None
    """The plan's best layout (``None``: nothing feasible)."""
    n_pairs: int
    pair_rank: int | None
    """The published (TP, PP) pair's rank among the plan's pairs (``None``: no layout)."""
    layout: str | None
    """The published pair's best layout in the plan."""
    predicted: float | None
    p_fit: float | None
    note: str = ""
    """Why the plan has no layout of the published pair."""

    @property
    def error_pct(self) -> float | None:
        if self.predicted is None:
            return None
        return 100.0 * (self.predicted / self.run.tflops - 1.0)


def _cell(path: Path, line: int, column: str, raw: str | None, kind: type) -> Any:
    """One cell as ``kind``, finite and positive; else a :class:`SpecError` naming the
    file and line (its source), the column and the value."""
    what = "an integer" if kind is int else "a number"
    if raw is None or raw.strip() == "":
        raise SpecError(column, raw, f"required; allowed: {what} > 0", source=f"{path}:{line}")
    try:
        value = kind(raw.strip())
    except ValueError:
        raise SpecError(column, raw, f"allowed: {what} > 0", source=f"{path}:{line}") from None
    if not (math.isfinite(value) and value > 0):
        raise SpecError(column, raw, f"allowed: {what} > 0", source=f"{path}:{line}")
    return value


def read_runs(path: Path) -> list[RunRow]:
    """The rows of ``path``; a :class:`SpecError` naming the file, line, column and value
    of the first bad cell (or the missing columns)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as err:
        raise SpecError("RUNS", str(path), f"cannot read it ({err.strerror}); allowed: a "
                        "CSV file") from None
    reader = csv.DictReader(text.splitlines())
    columns = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in REQUIRED if c not in columns]
    unknown = [c for c in columns if c not in REQUIRED + OPTIONAL]
    if missing or unknown:
        raise SpecError("header", ",".join(columns),
                        f"missing {missing or 'nothing'}, unknown {unknown or 'none'}; allowed: "
                        f"{', '.join(REQUIRED)} (required), {', '.join(OPTIONAL)}",
                        source=str(path))
    rows = []
    for i, raw in enumerate(reader, start=2):
        cells = {k.strip(): v for k, v in raw.items() if k is not None}
        ints = {c: _cell(path, i, c, cells.get(c), int) for c in REQUIRED if c != "tflops"}
        opt = {c: _cell(path, i, c, cells.get(c), int) for c in OPTIONAL[1:]
               if (cells.get(c) or "").strip()}
        rows.append(RunRow(name=(cells.get("name") or "").strip() or f"line{i}", line=i,
                           tflops=_cell(path, i, "tflops", cells.get("tflops"), float),
                           **ints, **opt))
        if len(rows) > MAX_ROWS:
            raise SpecError("rows", len(rows), f"allowed: at most {MAX_ROWS}", source=str(path))
    if not rows:
        raise SpecError("rows", 0, "allowed: a header and at least one run", source=str(path))
    return rows


def row_spec(template: dict[str, Any], run: RunRow, *, pp: str = "divisors",
             base_dir: Path | None = None, source: str = "RUNS") -> StudySpec:
    """The template study with ``run``'s model shape, cluster size and batch (validated as
    any study file is: a row the template cannot take is refused with the field's name,
    ``source:LINE`` its source)."""
    data = copy.deepcopy(template)
    for section in ("model", "cluster", "training", "search"):
        if not isinstance(data.setdefault(section, {}), dict):
            raise SpecError(section, data[section], "allowed: a mapping (a study file's "
                            "section)", source="TEMPLATE")
    model = data["model"]
    model.update(n_layer=run.layers, hidden=run.hidden, n_head=run.heads, name=run.name)
    if run.seq is not None:
        model["seq_len"] = run.seq
    if run.vocab is not None:
        model["vocab_size"] = run.vocab
    cluster = data["cluster"]
    if run.devices_per_node is not None:
        cluster["devices_per_node"] = run.devices_per_node
    per_node = cluster.get("devices_per_node", 1)
    if isinstance(per_node, int) and not isinstance(per_node, bool) and per_node > 0:
        if run.gpus % per_node:
            raise SpecError("gpus", run.gpus, f"allowed: a multiple of devices_per_node "
                            f"({per_node})", source=f"{source}:{run.line}")
        cluster["nodes"] = run.gpus // per_node
    # else: parse_study refuses the template's devices_per_node by its own rule
    data["training"]["global_batch"] = run.global_batch
    if pp == "divisors":
        data["search"]["pp"] = list(divisors(run.layers))
    data["name"] = "published-" + "".join(c if c.isalnum() or c in "._-" else "-"
                                          for c in run.name)[:80]
    return parse_study(data, source=f"{source}:{run.line}", base_dir=base_dir)


def _tflops(row: PlanRow, kind: str) -> float:
    return (row.step.hardware_tflops_per_device if kind == "hardware"
            else row.step.model_tflops_per_device)


def evaluate_run(spec: StudySpec, run: RunRow, *, tflops: str = "hardware") -> RunResult:
    """Plan ``spec`` (every feasible layout, no database) and place ``run``'s pair in it."""
    plan: PlanResult = plan_study(spec, top=max(1, spec_size(spec)))
    pairs: list[tuple[int, int]] = []
    for row in plan.rows:
        pair = (row.layout.tp, row.layout.pp)
        if pair not in pairs:
            pairs.append(pair)
    best = plan.rows[0].layout.key() if plan.rows else None
    wanted = (run.tp, run.pp)
    mine = next((r for r in plan.rows if (r.layout.tp, r.layout.pp) == wanted), None)
    if mine is not None:
        return RunResult(run, best, len(pairs), pairs.index(wanted) + 1, mine.layout.key(),
                         _tflops(mine, tflops), mine.p_fit)
    axes = axis_choices(spec.search, spec.world_size, spec.training.global_batch)
    if run.tp not in axes["tp"] or run.pp not in axes["pp"]:
        note = (f"not in the search space (search.tp {list(axes['tp'])}, "
                f"search.pp {list(axes['pp'])})")
    else:  # the plan's own words for the pair: its space cut to the published TP and PP
        cut = plan_study(replace(spec, search=replace(spec.search, tp=(run.tp,),
                                                      pp=(run.pp,))), top=1)
        note = no_layout_text(cut.empty_reasons)
    return RunResult(run, best, len(pairs), None, None, None, None, note)


def spec_size(spec: StudySpec) -> int:
    """An upper bound on the study's layouts (the plan lists at most that many rows)."""
    return space_size(spec.search, spec.world_size, spec.training.global_batch)[0]


def summarize(results: list[RunResult], top_pairs: int) -> dict[str, Any]:
    errors = [r.error_pct for r in results if r.error_pct is not None]
    return {
        "rows": len(results),
        "predicted": len(errors),
        "median_abs_error_pct": statistics.median(abs(e) for e in errors) if errors else None,
        "max_abs_error_pct": max(abs(e) for e in errors) if errors else None,
        "signed_median_error_pct": statistics.median(errors) if errors else None,
        "pair_in_top": sum(r.pair_rank is not None and r.pair_rank <= top_pairs
                           for r in results),
        "top_pairs": top_pairs,
        "published_pair_without_layout": [r.run.name for r in results if r.pair_rank is None],
    }


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def print_results(results: list[RunResult], summary: dict[str, Any], tflops: str) -> None:
    print(f"{'run':<16} {'gpus':>5} {'published':<10} {'plan best':<34} {'pair':>6} "
          f"{'published pair best':<34} {tflops:>9} {'published':>9} {'error':>7} "
          f"{'P(fit)':>6}")
    for r in results:
        pair = f"{r.pair_rank}/{r.n_pairs}" if r.pair_rank else "-"
        print(f"{r.run.name:<16} {r.run.gpus:>5} {f'tp{r.run.tp}-pp{r.run.pp}':<10} "
              f"{r.best or '-':<34} {pair:>6} {r.layout or '-':<34} "
              f"{_fmt(r.predicted, '.1f'):>9} {r.run.tflops:>9.1f} "
              f"{_fmt(r.error_pct, '+6.1f', '%'):>7} {_fmt(r.p_fit, '6.2f'):>6}")
        if r.note:
            print(f"  {r.run.name}: no layout of the published pair: {r.note}")
    s = summary
    print(f"\n{s['predicted']} of {s['rows']} runs predicted: median |error| "
          f"{_fmt(s['median_abs_error_pct'], '.1f', '%')}, max "
          f"{_fmt(s['max_abs_error_pct'], '.1f', '%')}, signed median "
          f"{_fmt(s['signed_median_error_pct'], '+.1f', '%')}; published (TP, PP) among the "
          f"plan's top {s['top_pairs']} pairs: {s['pair_in_top']}/{s['rows']}; published "
          f"pair without a layout in the plan: {len(s['published_pair_without_layout'])}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("template", type=Path, help="a study file: what the runs share")
    p.add_argument("runs", type=Path, help="CSV of published runs (columns: see --help)")
    p.add_argument("--tflops", choices=("hardware", "model"), default="hardware")
    p.add_argument("--pp", choices=("divisors", "template"), default="divisors")
    p.add_argument("--top-pairs", type=int, default=5)
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    args = p.parse_args(argv)
    if args.top_pairs < 1:
        p.error(f"--top-pairs: {args.top_pairs}; allowed: an integer >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        template = read_yaml(args.template)
        if not isinstance(template, dict):
            raise SpecError("TEMPLATE", str(args.template), "allowed: a study file (a mapping)")
        runs = read_runs(args.runs)
        results = []
        for run in runs:
            spec = row_spec(template, run, pp=args.pp, base_dir=args.template.parent,
                            source=str(args.runs))
            results.append(evaluate_run(spec, run, tflops=args.tflops))
            print(f"  planned {run.name} ({len(results)}/{len(runs)})", file=sys.stderr)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = summarize(results, args.top_pairs)
    print_results(results, summary, args.tflops)
    if args.json is not None:
        out = {"template": str(args.template), "runs": str(args.runs), "tflops": args.tflops,
               "pp": args.pp, "summary": summary,
               "rows": [{"name": r.run.name, "gpus": r.run.gpus, "tp": r.run.tp,
                         "pp": r.run.pp, "published_tflops": r.run.tflops, "plan_best": r.best,
                         "pair_rank": r.pair_rank, "n_pairs": r.n_pairs, "layout": r.layout,
                         "predicted_tflops": r.predicted, "error_pct": r.error_pct,
                         "p_fit": r.p_fit, "note": r.note or None} for r in results]}
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps(out, indent=2) + "\n")
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
