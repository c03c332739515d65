"""``autotune report --all``: every measurement of a campaign, across studies.

A campaign runs one study per (model, node count, ...) on the same database. This view
reads the ``measurements`` table only (no Optuna study is loaded), filtered by device
type and/or model, and shows per study the best layout, per (model, device) the best
model TFLOPS per device against the node count, and what the campaign spent.

Reading the scaling plot: at a fixed per-device workload (weak scaling: the global batch
grows with the node count) a flat line is perfect scaling; the drop from the smallest
node count is the cost of the slower inter-node links.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from autotune.errors import UsageError
from autotune.report import plots
from autotune.report.analysis import OUTCOME_LABELS
from autotune.report.files import ReportPaths, write_text_atomic
from autotune.report.frames import measurements_frame, write_exports
from autotune.report.render import Image, Report, Section, Table, Text, render
from autotune.storage import Storage
from autotune.trial.outcome import Outcome

__all__ = ["campaign_report", "per_study", "scaling_frame"]


def _device_hours(m: pd.DataFrame) -> pd.Series:
    return m["elapsed_s"].fillna(0.0) * m["world_size"] / 3600.0


_FAILED = [o.value for o in Outcome if o.observed == "error"]
"""Outcomes of a layout that ran and failed (error, timeout)."""


def per_study(meas: pd.DataFrame) -> pd.DataFrame:
    """One row per study: where it ran, how its trials ended, its best layout, its cost."""
    rows = []
    for name, g in meas.groupby("study_name", sort=True):
        done = g[g["outcome"] == "complete"]
        best = done.loc[done["model_tflops_per_device"].idxmax()] if len(done) else None
        first = g.iloc[0]
        rows.append({
            "study": name, "model": first["model_name"], "device_type": first["device_type"],
            "nodes": int(first["nodes"]), "world_size": int(first["world_size"]),
            "global_batch": int(first["global_batch"]), "executions": len(g),
            "complete": len(done), "oom": int((g["outcome"] == "oom").sum()),
            "failed": int(g["outcome"].isin(_FAILED).sum()),
            "best_layout": best["layout_key"] if best is not None else None,
            "best_tflops_per_device": float(best["model_tflops_per_device"])
            if best is not None else None,
            "device_hours": float(_device_hours(g).sum()),
        })
    return pd.DataFrame(rows)


def scaling_frame(meas: pd.DataFrame) -> pd.DataFrame:
    """Best model TFLOPS per device for each (model, device type, nodes, global batch),
    with the efficiency relative to the smallest node count of that (model, device)."""
    done = meas[meas["outcome"] == "complete"]
    if done.empty:
        return pd.DataFrame(columns=["model_name", "device_type", "nodes", "global_batch",
                                     "best_tflops_per_device", "best_layout", "efficiency"])
    idx = done.groupby(["model_name", "device_type", "nodes", "global_batch"])[
        "model_tflops_per_device"].idxmax()
    best = done.loc[idx, ["model_name", "device_type", "nodes", "global_batch",
                          "model_tflops_per_device", "layout_key"]].rename(
        columns={"model_tflops_per_device": "best_tflops_per_device",
                 "layout_key": "best_layout"}).sort_values(["model_name", "device_type",
                                                            "nodes"])
    base = best.groupby(["model_name", "device_type"])["best_tflops_per_device"] \
        .transform("first")
    best["efficiency"] = best["best_tflops_per_device"] / base
    return best.reset_index(drop=True)


def campaign_report(storage: Storage, out_dir: Path, *, fmt: str = "md",
                    device_type: str | None = None, model: str | None = None,
                    log: Callable[[str], None] = lambda _: None) -> Path:
    """Write the cross-study report under ``out_dir``; return the report file's path."""
    paths = ReportPaths(out_dir)
    meas = measurements_frame(storage.engine, device_type=device_type, model_name=model)
    filters = ", ".join(f for f in (f"device type {device_type}" if device_type else "",
                                    f"model {model}" if model else "") if f) or "none"
    if meas.empty:
        everything = measurements_frame(storage.engine)
        raise UsageError(
            f"no measurements in {storage.masked_url} match (filters: {filters}); there: "
            f"device types {sorted(everything['device_type'].unique()) or 'none'}, "
            f"models {sorted(everything['model_name'].unique()) or 'none'}")
    log(f"cross-study report from {storage.masked_url}: {len(meas)} measurements, "
        f"{meas['study_name'].nunique()} studies (filters: {filters})")
    studies, scaling = per_study(meas), scaling_frame(meas)
    report = Report(
        title="autotune campaign report",
        meta=[f"storage: {storage.masked_url}", f"filters: {filters}",
              f"{meas['study_name'].nunique()} studies, {len(meas)} trial executions, "
              f"{_device_hours(meas).sum():.3g} device-hours",
              f"generated: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}"])
    report.sections.append(Section("Studies", [
        Text("One row per study: the best measured layout and what the study spent "
             "(device-hours = elapsed time x world size, summed over its executions)."),
        Table(studies)]))
    sec = Section("Scaling with the node count")
    if scaling.empty:
        sec.blocks.append(Text("No complete measurement: nothing to compare."))
    else:
        target = paths.plot("scaling")
        plots.scaling(scaling, target)
        log(f"wrote {target}")
        sec.blocks += [
            Text("Best model TFLOPS per device at each node count, one line per model and "
                 "device type; efficiency is relative to the smallest node count measured. "
                 "When the global batch grows with the node count (weak scaling), a flat "
                 "line is perfect scaling."),
            Image(paths.relative(target), "best TFLOPS per device vs nodes"),
            Table(scaling)]
    report.sections.append(sec)
    outcomes = meas.assign(outcome=meas["outcome"].map(OUTCOME_LABELS).fillna(meas["outcome"]),
                           device_hours=_device_hours(meas)) \
        .groupby(["device_type", "model_name", "outcome"], as_index=False) \
        .agg(executions=("id", "size"), device_hours=("device_hours", "sum"))
    report.sections.append(Section("Outcomes and cost", [
        Text("Trial executions and device-hours by device type, model and outcome."),
        Table(outcomes)]))
    exported = write_exports({"campaign_measurements": meas}, paths.data)
    for p in exported:
        log(f"wrote {p}")
    report.sections.append(Section("Data", [
        Text("Every measurement row behind this report (the measurements table, filtered)."),
        Table(pd.DataFrame({"file": [paths.relative(p) for p in exported]}))]))
    target = paths.report(fmt)
    write_text_atomic(target, render(report, fmt))
    log(f"wrote {target}")
    return target
