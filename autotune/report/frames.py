"""pandas frames of a study: its Optuna trials and its rows of the ``measurements`` table.

The two frames are what every section of a report is computed from, and what
``data/*.csv`` and ``data/*.parquet`` export. Their columns have fixed dtypes
(:data:`TRIAL_COLUMNS`, and the SQL types of :class:`~autotune.storage.schema.Measurement`)
so that an export read back with :func:`read_export` equals the frame that was written:

* ``trials``: one row per Optuna trial that has a layout (waiting trials have none),
  flat scalars only: the layout axes, state, outcome, reason, the measured and predicted
  metrics from the trial's user attributes, start and end times;
* ``measurements``: one row per trial *execution* (a retried layout has two), exactly
  the SQL table: failures included, with device type, nodes, world size and elapsed time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial
from sqlalchemy import DateTime, Float, Integer, select
from sqlalchemy.engine import Engine

from autotune.errors import UsageError
from autotune.layout import Layout
from autotune.report.files import atomic_path
from autotune.storage import Measurement, TrialAttr, measured_value, study_fingerprint

__all__ = ["TRIAL_COLUMNS", "MEASUREMENT_COLUMNS", "trials_frame", "measurements_frame",
           "write_exports", "read_export"]

TRIAL_COLUMNS: dict[str, str] = {
    "number": "int64", "trial_id": "int64", "state": "str", "outcome": "str",
    "value": "float64", "layout": "str",
    "tp": "int64", "pp": "int64", "dp": "int64", "micro_batch": "int64",
    "grad_accum": "int64", "zero_stage": "int64", "recompute": "str", "world_size": "int64",
    "model_tflops_per_device": "float64", "hardware_tflops_per_device": "float64",
    "mfu": "float64", "step_time_s": "float64", "step_time_iqr_s": "float64",
    "tokens_per_s": "float64", "peak_memory_gib": "float64",
    "predicted_memory_gib": "float64", "predicted_tflops_per_device": "float64",
    "calibrated_memory_gib": "float64", "calibrated_tflops_per_device": "float64",
    "elapsed_s": "float64", "reason": "str", "device_name": "str", "launcher": "str",
    "worker": "str", "hosts": "str", "retry_of": "float64",
    "datetime_start": "datetime64[us]", "datetime_complete": "datetime64[us]",
    "measured_value": "float64",
}
"""Columns of the trials frame and their dtypes (``str`` columns may hold missing values)."""

_FLOAT_ATTRS = (TrialAttr.MODEL_TFLOPS, TrialAttr.HARDWARE_TFLOPS, TrialAttr.MFU,
                TrialAttr.STEP_TIME_S, TrialAttr.STEP_TIME_IQR_S, TrialAttr.TOKENS_PER_S,
                TrialAttr.PEAK_MEMORY_GIB, TrialAttr.PREDICTED_MEMORY_GIB,
                TrialAttr.PREDICTED_TFLOPS, TrialAttr.CALIBRATED_MEMORY_GIB,
                TrialAttr.CALIBRATED_TFLOPS, TrialAttr.ELAPSED_S, TrialAttr.RETRY_OF)
"""Trial attributes that are frame columns of the same name, as floats."""


def _sql_dtype(column: Any) -> str:
    if isinstance(column.type, Integer):
        return "float64" if column.nullable and not column.primary_key else "int64"
    if isinstance(column.type, Float):
        return "float64"
    if isinstance(column.type, DateTime):
        return "datetime64[us]"
    return "str"


MEASUREMENT_COLUMNS: dict[str, str] = {c.name: _sql_dtype(c)
                                       for c in Measurement.__table__.columns}
"""Columns of the measurements frame: the SQL table's, in its order."""


def _text(value: Any) -> str | None:
    """A string cell; ``""`` becomes missing (CSV cannot tell the two apart)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value)
    return text or None


def _trial_row(t: FrozenTrial, world_size: int, global_batch: int) -> dict[str, Any] | None:
    attrs = t.user_attrs
    lay = attrs.get(TrialAttr.LAYOUT_DICT)
    if lay is None:
        p = t.params
        if not {"tp", "pp", "micro_batch"} <= set(p):
            return None  # a waiting trial: nothing proposed yet
        tp, pp, mb = int(p["tp"]), int(p["pp"]), int(p["micro_batch"])
        dp = int(attrs.get(TrialAttr.DP) or max(world_size // (tp * pp), 1))
        lay = {"tp": tp, "pp": pp, "dp": dp, "micro_batch": mb,
               "grad_accum": int(attrs.get(TrialAttr.GRAD_ACCUM)
                                 or max(global_batch // (dp * mb), 1)),
               "zero_stage": int(p.get("zero_stage", 0)),
               "recompute": str(p.get("recompute", "none"))}
    row: dict[str, Any] = {
        "number": t.number, "trial_id": t._trial_id, "state": t.state.name,
        # A trial the runner never judged (it died: failed stale) has no outcome attr.
        "outcome": attrs.get(TrialAttr.OUTCOME, t.state.name.lower()),
        "value": measured_value(t),
        "layout": attrs.get(TrialAttr.LAYOUT), **lay,
        "world_size": lay["tp"] * lay["pp"] * lay["dp"],
        "reason": _text(attrs.get(TrialAttr.REASON)),
        "device_name": _text(attrs.get(TrialAttr.DEVICE_NAME)),
        "launcher": _text(attrs.get(TrialAttr.LAUNCHER)),
        "worker": _text(attrs.get(TrialAttr.WORKER)), "hosts": _text(attrs.get(TrialAttr.HOSTS)),
        "datetime_start": t.datetime_start, "datetime_complete": t.datetime_complete,
        # complete and stopped trials, however stored (autotune.report.measured)
        "measured_value": measured_value(t),
    }
    if row["layout"] is None:
        row["layout"] = Layout.from_dict(lay).key()
    for key in _FLOAT_ATTRS:
        value = attrs.get(key)
        row[key] = float(value) if isinstance(value, (int, float)) else None
    return row


def _typed(rows: list[dict[str, Any]], columns: dict[str, str]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(columns))
    return frame.astype(columns) if len(frame) else frame.astype(columns, errors="ignore")


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per trial that has a layout, ordered by trial number."""
    fp = study_fingerprint(study)
    ws, gb = int(fp.get("world_size", 1)), int(fp.get("global_batch", 1))
    rows = [r for t in study.get_trials(deepcopy=False)
            if (r := _trial_row(t, ws, gb)) is not None]
    return _typed(rows, TRIAL_COLUMNS)


def measurements_frame(engine: Engine, *, study_name: str | None = None,
                       device_type: str | None = None,
                       model_name: str | None = None) -> pd.DataFrame:
    """Rows of the ``measurements`` table, filtered, in insertion order."""
    stmt = select(Measurement).order_by(Measurement.id)
    if study_name is not None:
        stmt = stmt.where(Measurement.study_name == study_name)
    if device_type is not None:
        stmt = stmt.where(Measurement.device_type == device_type)
    if model_name is not None:
        stmt = stmt.where(Measurement.model_name == model_name)
    with engine.connect() as conn:
        frame = pd.read_sql(stmt, conn)
    frame = frame[list(MEASUREMENT_COLUMNS)]
    for col, dtype in MEASUREMENT_COLUMNS.items():
        if dtype == "str":  # "" and None are one missing value in CSV: keep them one here
            frame[col] = frame[col].map(_text, na_action="ignore")
    return frame.astype(MEASUREMENT_COLUMNS)


def write_exports(frames: dict[str, pd.DataFrame], data_dir: Path) -> list[Path]:
    """``<name>.csv`` and ``<name>.parquet`` for each frame, each written atomically."""
    written = []
    for name, frame in frames.items():
        for fmt in ("csv", "parquet"):
            target = data_dir / f"{name}.{fmt}"
            with atomic_path(target) as tmp:
                if fmt == "csv":
                    frame.to_csv(tmp, index=False)
                else:
                    frame.to_parquet(tmp, index=False)
            written.append(target)
    return written


def read_export(path: str | Path) -> pd.DataFrame:
    """An exported frame read back with its dtypes (CSV carries none of its own)."""
    path = Path(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix != ".csv":
        raise UsageError(f"{path}: not a report export; allowed: a .csv or .parquet file")
    header = pd.read_csv(path, nrows=0).columns
    schema = TRIAL_COLUMNS if list(header) == list(TRIAL_COLUMNS) else MEASUREMENT_COLUMNS
    dates = [c for c, d in schema.items() if d.startswith("datetime") and c in header]
    strings = {c: "str" for c, d in schema.items() if d == "str" and c in header}
    frame = pd.read_csv(path, dtype=strings, parse_dates=dates)
    return frame.astype({c: d for c, d in schema.items() if c in frame.columns})
