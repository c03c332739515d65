"""What the report computes from the frames: tables and numbers, no drawing, no I/O.

Each function takes the trials or measurements frame (:mod:`autotune.report.frames`) and
returns a smaller frame or value that a section shows and a plot draws.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import optuna
import pandas as pd
from optuna.trial import TrialState

from autotune.hardware import GiB, get_device
from autotune.layout import Layout
from autotune.trial.outcome import Outcome

__all__ = ["OUTCOME_LABELS", "Importance", "best_layouts", "tp_pp_grid", "bubble_fraction",
           "microbatch_frame", "outcome_counts", "failures", "tuning_cost",
           "device_memory_gib", "param_importance"]

OUTCOME_LABELS: dict[str, str] = {
    **{o.value: o.label for o in Outcome},
    "fail": "failed (runner died)", "running": "running", "skipped": "skipped",
}
"""Readable names of the outcomes (:attr:`autotune.trial.outcome.Outcome.label`) and of
trials without one."""

_LAYOUT_COLS = ["tp", "pp", "dp", "micro_batch", "grad_accum", "zero_stage", "recompute"]


def judged(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials that say something about their layout (not skipped, not still running)."""
    return trials[~trials["outcome"].isin(["skipped", "running"])]


def best_layouts(trials: pd.DataFrame, top: int = 10) -> pd.DataFrame:
    """The ``top`` complete trials by measured model TFLOPS per device."""
    done = trials[trials["outcome"] == "complete"].sort_values(
        ["value", "number"], ascending=[False, True]).head(top)
    out = done[["number", "layout", *_LAYOUT_COLS, "value", "predicted_tflops_per_device",
                "step_time_s", "peak_memory_gib", "predicted_memory_gib"]].copy()
    out.insert(0, "rank", range(1, len(out) + 1))
    return out.rename(columns={"number": "trial", "value": "model_tflops_per_device"}) \
        .reset_index(drop=True)


def tp_pp_grid(trials: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Best measured TFLOPS per device for each (tp, pp) over the other axes (complete and
    stopped trials: a stopped trial's value is a measurement too), and what each cell
    holds: ``complete`` or ``stopped`` (whose trial gave the best), else the commonest
    outcome of its trials (a layout retried and then measured shows its measurement).
    Rows pp, columns tp."""
    tried = judged(trials)
    tps, pps = sorted(tried["tp"].unique()), sorted(tried["pp"].unique())
    measured = tried[tried["measured_value"].notna()]
    best = measured.pivot_table(index="pp", columns="tp", values="measured_value",
                                aggfunc="max").reindex(index=pps, columns=tps)
    mode = tried.groupby(["pp", "tp"])["outcome"].agg(lambda s: s.value_counts().index[0])
    top = measured.sort_values(["measured_value", "number"], ascending=[False, True]) \
        .groupby(["pp", "tp"])["outcome"].first()
    what = mode.where(~mode.index.isin(top.index), top.reindex(mode.index))
    return best, what.unstack("tp").reindex(index=pps, columns=tps)


def bubble_fraction(pp: int | pd.Series, micro_batches: int | pd.Series) -> float | pd.Series:
    """Idle fraction of an ideal 1F1B pipeline step: ``(p - 1) / m``.

    Narayanan et al. 2021 (https://arxiv.org/abs/2104.04473), section 2.2.1: ``m``
    micro-batches through ``p`` equal stages take ``(m + p - 1)`` stage times, ``p - 1``
    of them idle. In a layout, ``m`` is ``grad_accum``. 0 without pipelining.
    """
    return (pp - 1) / micro_batches


def microbatch_frame(trials: pd.DataFrame) -> pd.DataFrame:
    """Every measured trial (complete and stopped, ``value`` its measured TFLOPS) with its
    pipeline bubble, for the micro-batch section."""
    done = trials[trials["measured_value"].notna()].copy()
    done["value"] = done["measured_value"]
    done["bubble_fraction"] = bubble_fraction(done["pp"], done["grad_accum"])
    return done.sort_values(["tp", "pp", "micro_batch", "number"])


def outcome_counts(trials: pd.DataFrame) -> pd.DataFrame:
    counts = trials["outcome"].value_counts()
    order = [k for k in OUTCOME_LABELS if k in counts.index]
    return pd.DataFrame({"outcome": [OUTCOME_LABELS[k] for k in order],
                         "trials": [int(counts[k]) for k in order]})


def failures(trials: pd.DataFrame, width: int = 160) -> pd.DataFrame:
    """Every judged trial that did not complete, with the first line of its reason."""
    bad = judged(trials)
    bad = bad[bad["outcome"] != "complete"]

    def first_line(text: object) -> str:
        if not isinstance(text, str) or not text.strip():
            return ""
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        # A traceback's last line says what went wrong; anything else, its first.
        line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
        return line if len(line) <= width else line[: width - 1] + "…"

    return pd.DataFrame({"trial": bad["number"], "layout": bad["layout"],
                         "outcome": bad["outcome"].map(OUTCOME_LABELS).fillna(bad["outcome"]),
                         "reason": bad["reason"].map(first_line)}).reset_index(drop=True)


def tuning_cost(measurements: pd.DataFrame,
                confirmation: tuple[int, float, float] | None = None) -> pd.DataFrame:
    """Device-hours spent by outcome: ``elapsed_s * world_size / 3600`` per execution,
    and with ``confirmation`` (its runs, wall-seconds, device-seconds) a row for the
    confirmation round, counted in the total.

    Infeasible layouts never ran and cost nothing; they have no measurement row.
    """
    m = measurements.assign(device_hours=measurements["elapsed_s"].fillna(0.0)
                            * measurements["world_size"] / 3600.0,
                            wall_hours=measurements["elapsed_s"].fillna(0.0) / 3600.0)
    out = m.groupby("outcome", sort=False).agg(executions=("id", "size"),
                                               wall_hours=("wall_hours", "sum"),
                                               device_hours=("device_hours", "sum"))
    out = out.reset_index()
    out["outcome"] = out["outcome"].map(OUTCOME_LABELS).fillna(out["outcome"])
    if confirmation is not None and confirmation[0] > 0:
        runs, wall_s, device_s = confirmation
        out.loc[len(out)] = {"outcome": "confirmation round", "executions": runs,
                             "wall_hours": wall_s / 3600.0, "device_hours": device_s / 3600.0}
    total = out[["executions", "wall_hours", "device_hours"]].sum()
    out.loc[len(out)] = {"outcome": "total", **total.to_dict()}
    return out.astype({"executions": "int64"})


def device_memory_gib(device_type: str | None, override_gib: float | None = None) -> float | None:
    """Memory of one device: the study file's ``cluster.memory_gb`` where known, else the
    hardware table's figure (:mod:`autotune.hardware`); ``None`` for an unknown device."""
    if override_gib is not None:
        return override_gib
    if not device_type:
        return None
    try:
        return get_device(device_type).memory_bytes / GiB
    except Exception:  # an unknown name: the plot simply has no capacity line
        return None


@dataclass(frozen=True)
class Importance:
    values: dict[str, float] | None
    """Parameter → importance (sums to 1), or ``None`` when it could not be computed."""
    note: str
    """How it was computed, or why it could not be."""


_CORE_AXES = tuple(a for a in Layout.SEARCH_AXES
                   if a not in ("sequence_parallel", "zero_variant", "zero_shard", "ulysses"))
"""The axes every autotune trial has (the others came later: older trials lack them)."""


def param_importance(study: optuna.Study) -> Importance:
    """Importance of the layout axes for the objective, on COMPLETE trials.

    Optuna's default evaluator, PED-ANOVA (Watanabe et al. 2023,
    https://arxiv.org/abs/2304.10255): how differently the top 10 % of trials are
    distributed along each axis than all of them. Pure numpy (fANOVA needs scikit-learn).
    Needs at least 2 complete trials, some spread in the objective and at least one axis
    that takes two values among them; otherwise says which of these is missing.
    """
    # Trials stored before sequence parallelism existed have no such parameter: the axes
    # are those every complete trial has.
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    axes = [a for a in Layout.SEARCH_AXES if complete and all(a in t.params for t in complete)]
    done = [t for t in complete if axes and all(a in t.params for a in _CORE_AXES)]
    if len(done) < 2:
        return Importance(None, f"not computed: {len(done)} complete trial(s); "
                                "at least 2 are needed")
    values = [t.value for t in done]
    if max(values) == min(values):  # type: ignore[type-var]
        return Importance(None, f"not computed: all {len(done)} complete trials measured "
                                "the same value, there is no variance to explain")
    varying = [a for a in axes if len({t.params[a] for t in done}) > 1]
    if not varying:
        return Importance(None, "not computed: the complete trials differ in no layout axis")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            imp = optuna.importance.get_param_importances(study, params=varying)
    except (ValueError, RuntimeError, ImportError) as err:
        return Importance(None, f"not computed: optuna could not evaluate it ({err})")
    if not imp or not all(math.isfinite(v) for v in imp.values()) or sum(imp.values()) <= 0:
        return Importance(None, f"not computed: {len(done)} complete trials are too few for "
                                "the evaluator to tell the axes apart")
    fixed = [a for a in axes if a not in varying]
    note = (f"PED-ANOVA over {len(done)} complete trials; axes varied: {', '.join(varying)}"
            + (f"; constant (importance 0): {', '.join(fixed)}" if fixed else ""))
    if len(done) < 10:
        note += "; with fewer than 10 trials read it as a hint, not a measurement"
    return Importance({k: float(v) for k, v in imp.items()}, note)
