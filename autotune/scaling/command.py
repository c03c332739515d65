"""``autotune scaling`` and ``autotune plan --scaling``: parse-free glue between the
command line (:mod:`autotune.cli`) and the scaling modules; the report files.

Exit codes as ``autotune run``: 0 every size done, 1 a size completed no trial, 130 a
Ctrl-C, 0 after a SIGTERM (the next run resumes; the campaign convention).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.errors import SpecError, UsageError
from autotune.scaling.sizes import ScalingRequest, default_sizes, parse_sizes
from autotune.scaling.table import (
    ScalingRow,
    _pct,
    efficiency_base,
    format_scaling,
    scaling_csv,
    scaling_table,
)
from autotune.spec import StudySpec
from autotune.trial.outcome import StopReason

__all__ = ["request_of", "run_command", "plan_command", "write_report", "parse_references",
           "campaign_studies", "refuse_misplaced_flags", "status_lines"]


def request_of(spec: StudySpec, mode: str, nodes: str | None, devices: str | None,
               ) -> ScalingRequest:
    """The request from ``--mode`` and one of ``--nodes`` / ``--devices`` (default: the
    powers of two up to the study's cluster, along ``--nodes``)."""
    if nodes is not None and devices is not None:
        raise SpecError("--nodes / --devices", f"{nodes} / {devices}",
                        "allowed: one of them (--devices varies the ranks of one node)")
    if devices is not None:
        return ScalingRequest(mode, "devices", parse_sizes(devices, flag="--devices"))
    if nodes is not None:
        return ScalingRequest(mode, "nodes", parse_sizes(nodes, flag="--nodes"))
    return ScalingRequest(mode, "nodes", default_sizes(spec, "nodes"))


def parse_references(values: Sequence[str] | None) -> dict[int, float]:
    """``--reference 128=93`` (size = efficiency in percent), repeatable."""
    out: dict[int, float] = {}
    for text in values or ():
        size, _, pct = text.partition("=")
        try:
            n, value = int(size), float(pct.rstrip("%"))
        except ValueError:
            n, value = 0, -1.0
        if n < 1 or not 0 < value <= 200:
            raise SpecError("--reference", text, "allowed: SIZE=PERCENT, e.g. 128=93")
        out[n] = value / 100
    return out


def write_report(rows: Sequence[ScalingRow], request: ScalingRequest, spec: StudySpec,
                 out_dir: Path, fmt: str, *, csv_path: Path | None = None) -> Path:
    """``scaling.md`` (or ``.html``), ``scaling.png`` and ``scaling.csv`` in ``out_dir``."""
    import pandas as pd

    from autotune.report.render import Code, Image, Report, Section, Table, Text, render
    from autotune.scaling.plot import scaling_plot
    from autotune.util.atomic import write_text_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    scaling_plot(rows, request, out_dir / "scaling.png",
                 title=f"{spec.name}: {request.mode} scaling over {request.axis}")
    text = scaling_csv(rows, request)
    write_text_atomic(out_dir / "scaling.csv", text)  # the report's, beside its plot
    if csv_path is not None:
        write_text_atomic(csv_path, text)
    frame = pd.DataFrame([{
        request.axis: r.size, "devices": r.devices, "global batch": r.global_batch,
        "source": r.source, "best layout": r.best_layout,
        "TFLOPS/device": r.model_tflops_per_device, "tokens/s": r.tokens_per_s,
        "efficiency": _pct(r.efficiency), "calibrated on": r.calibrated_on or None} for r in rows])
    report = Report(f"Scaling: {spec.name} ({request.mode})", meta=[
        f"model: {spec.model.name}", f"device: {spec.cluster.device}",
        f"sizes ({request.axis}): {', '.join(map(str, request.sizes))}",
        f"efficiency: per-device throughput against {request.axis} "
        f"{efficiency_base(rows, request)}"],
        sections=[Section("Table", [Table(frame), Code(format_scaling(rows, request))]),
                  Section("Plot", [Image("scaling.png", "scaling curve"), Text(
                      "Measured points (green) beside the cost model's curve calibrated on "
                      "the measured sizes below each size (blue, 95% band).")])])
    path = out_dir / f"scaling.{fmt}"
    write_text_atomic(path, render(report, fmt))
    return path


def run_command(args: Any, log: Callable[[str], None]) -> int:
    """``autotune scaling``: tune every size, then print (and write) the table."""
    from autotune.config.sqlite_file import nothing_to_read
    from autotune.config.study import StorageConfig
    from autotune.scaling.run import ScalingRun, run_scaling
    from autotune.spec import load_study
    from autotune.storage import open_storage

    refuse_misplaced_flags(args)  # before the study file is read: nothing to undo
    spec = load_study(args.study)
    request = request_of(spec, args.mode, args.nodes, args.devices)
    if args.campaign_studies:
        judged = spec.with_storage_url(args.storage) if args.storage else spec
        print(campaign_studies(judged, request, args.study, n_trials=args.n_trials))
        return 0
    run = ScalingRun() if args.table_only else run_scaling(
        spec, request, n_trials=args.n_trials, storage_url=args.storage, log=log,
        quiet=args.quiet)
    config = StorageConfig(url=args.storage) if args.storage else spec.storage
    # --table-only reads: a SQLite file that does not exist holds no measurement, and is
    # not created (before, an empty one was left behind); the table is then the model's.
    storage = None if args.table_only and nothing_to_read(config.url) else open_storage(config)
    try:
        rows = scaling_table(storage, spec, request, predict=not args.no_predict)
    finally:
        if storage is not None:
            storage.close()
    print(format_scaling(rows, request))
    if args.csv:
        from autotune.util.atomic import write_text_atomic

        write_text_atomic(args.csv, scaling_csv(rows, request))
    if args.report:
        print(write_report(rows, request, spec, Path(args.report), args.format or "md",
                           csv_path=Path(args.csv) if args.csv else None))
    if run.stopped_by == StopReason.INTERRUPT:
        return 130
    if run.stopped_by == StopReason.SIGTERM:
        log(f"stopped by SIGTERM at {request.axis} {run.stopped_at}: run it again to resume")
        return 0
    if run.stopped_by == StopReason.FAILED:
        print(f"autotune: {request.axis} {run.stopped_at}: no trial completed; the larger "
              "sizes were not run", file=sys.stderr)
        return 1
    return 0


def refuse_misplaced_flags(args: Any) -> None:
    """A flag the chosen mode does not use is a usage error that names it (exit 2), as
    ``plan --nodes`` without ``--scaling`` is: ``--campaign-studies`` prints campaign
    entries and writes no table (``--csv``, ``--report``, ``--no-predict``, and
    ``--table-only``, the other mode that runs nothing, are for ``--table-only`` once the
    campaign ran); ``--table-only`` runs nothing (``--n-trials``); ``--format`` is the
    report's (``--report``). Silently ignored, a user would wait for a CSV or a report
    that was never written."""

    def given(*names: str) -> list[str]:
        return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n, None)]

    if args.campaign_studies and (extra := given("csv", "report", "no_predict",
                                                 "table_only")):
        raise UsageError(f"scaling: {', '.join(extra)} make or shape the table, which "
                         "--campaign-studies does not print (it prints the campaign's "
                         "studies: entries); run `autotune scaling ... --table-only` with "
                         "them once the campaign has run")
    if args.table_only and (extra := given("n_trials")):
        raise UsageError(f"scaling: {', '.join(extra)} sets what a run measures; "
                         "--table-only runs nothing")
    if args.format is not None and not args.report:
        raise UsageError("scaling: --format is the --report's (md or html); add "
                         "--report DIR")


def campaign_studies(spec: StudySpec, request: ScalingRequest, file: str, *,
                     n_trials: int | None) -> str:
    """The ``studies:`` entries of a campaign file that runs each size as its own study
    (one job array per size, resumable as any campaign's: docs/hpc.md); the table then
    comes from ``autotune scaling ... --table-only``. A size where no layout is feasible
    is left out, a comment above the entries says why (as the scaling run skips it); when
    every size is such, the first one's error. Each size is judged as its run will judge
    it, calibrated from the study's database as ``plan --scaling`` judges it
    (:func:`~autotune.scaling.table.judged_calibration`); a database that cannot be read is
    a comment, and the sizes are then judged by the model alone."""
    import yaml

    from autotune.errors import EmptySpaceError
    from autotune.planning.empty import no_layout_text
    from autotune.planning.plan import plan_study
    from autotune.runner.learning import open_to_read
    from autotune.scaling.sizes import size_spec
    from autotune.scaling.table import judged_calibration

    entries, left_out = [], list[tuple[int, str]]()
    storage, note = open_to_read(spec)
    try:
        for size in request.sizes:
            at = size_spec(spec, request, size)
            judged, ooms, fits = judged_calibration(storage, at, None)
            plan = plan_study(at, top=1, calibration=judged, ooms=ooms, fits=fits)
            if not plan.rows:
                left_out.append((size, no_layout_text(plan.empty_reasons)))
                continue
            overrides: dict[str, Any] = {
                "cluster": {"nodes": at.cluster.nodes,
                            "devices_per_node": at.cluster.devices_per_node},
                "training": {"global_batch": at.training.global_batch}}
            if n_trials:
                overrides["search"] = {"n_trials": n_trials}
            entries.append({"file": file, "name": at.name, "overrides": overrides})
    finally:
        if storage is not None:
            storage.close()
    if not entries:
        size, why = left_out[0]
        raise EmptySpaceError(f"{file}: no size has a layout; {request.axis} {size}: {why}")
    comments = [*([f"# {note}"] if note else []),
                *(f"# {request.axis} {size} left out: {why}" for size, why in left_out)]
    return "\n".join([*comments, yaml.safe_dump({"studies": entries}, sort_keys=False)
                      .rstrip("\n")])


def plan_command(spec: StudySpec, args: Any) -> str:
    """``autotune plan --scaling MODE``: the curve at every size, measured beside
    predicted where the study's database has the sizes' studies."""
    from autotune.config.sqlite_file import nothing_to_read
    from autotune.scaling.table import scaling_csv

    request = request_of(spec, args.scaling, args.nodes, args.devices)
    references = parse_references(args.reference)  # before any work: nothing to waste
    if references and args.format in ("csv", "json"):  # before: silently left out
        raise UsageError(f"plan: --reference is a column of the table; --format "
                         f"{args.format} has none (compare in the table, or drop it)")
    stray = [t for t in args.reference or () if int(t.partition("=")[0]) not in request.sizes]
    if stray:  # before: silently not shown (parse_references has checked the form)
        raise SpecError("--reference", ", ".join(stray),
                        f"allowed: a size of the table ({', '.join(map(str, request.sizes))})")
    storage = None
    if not args.no_learn and not nothing_to_read(spec.storage.url):
        from autotune.storage import open_storage  # a plan creates no database

        storage = open_storage(spec.storage)
    try:
        rows = scaling_table(storage, spec, request)
    finally:
        if storage is not None:
            storage.close()
    if args.format == "csv":
        return scaling_csv(rows, request).rstrip("\n")
    if args.format == "json":
        from autotune.scaling.table import scaling_json

        return scaling_json(rows, request)
    text = format_scaling(rows, request, references=references)
    from autotune.planning.band import unvalidated_band_note

    note = unvalidated_band_note(spec.cluster.device)
    if note is not None and any(r.source == "predicted" and not r.calibrated_on
                                and r.tflops_low is not None for r in rows):
        # a size no measured size below calibrates shows the prior's band, as plan's
        # header says (the calibrated sizes' bands are their correction's)
        text += "\n" + note
    return text


def status_lines(storage: Any, studies: Sequence[Any]) -> list[str]:
    """``autotune status``: the table of each scaling study among ``studies`` (measured
    rows; their study file, recorded with them, says the sizes and the batch rule)."""
    from autotune.scaling.run import SCALING_ATTR
    from autotune.spec import load_study

    groups: dict[tuple[str, str, str, tuple[int, ...]], str | None] = {}
    for study in studies:
        for mode, rec in (study.user_attrs.get(SCALING_ATTR) or {}).items():
            if isinstance(rec, dict):
                key = (str(rec.get("group")), str(mode), str(rec.get("axis")),
                       tuple(int(s) for s in rec.get("sizes") or ()))
                groups.setdefault(key, rec.get("source"))
    lines = []
    for (group, mode, axis, sizes), source in sorted(groups.items()):
        head = f"scaling {group} ({mode}, {axis} {','.join(map(str, sizes))})"
        try:
            spec = load_study(source or "")
        except SpecError as err:
            lines.append(f"{head}: its study file cannot be read ({err})")
            continue
        request = ScalingRequest(mode, axis, sizes)
        rows = scaling_table(storage, spec, request, predict=False)
        lines += [f"{head}:", format_scaling(rows, request)]
    return lines
