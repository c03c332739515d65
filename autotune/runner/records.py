"""What is stored about one trial execution: a ``measurements`` row and trial user attrs;
and about a study: why its search stopped early.

Both are built here from the same facts so the table, the dashboard and the reports
agree. User attributes are what optuna-dashboard shows next to each trial.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from autotune.layout import Layout
from autotune.runner.outcome import Outcome
from autotune.trial import TrialResult

__all__ = ["TrialFacts", "measurement_row", "user_attrs", "SEARCH_STOP_ATTR",
           "search_stop_record", "search_stop_line"]

GiB = 2**30
SEARCH_STOP_ATTR = "search_stop"
"""Study user attribute: why the strategy last stopped before the budget (a dict from
:func:`search_stop_record`), or ``None`` once a later proposal was made."""


@dataclass(frozen=True)
class TrialFacts:
    """Everything known about one trial execution once it ended."""

    study_name: str
    trial_number: int
    trial_id: int
    layout: Layout
    outcome: Outcome
    result: TrialResult | None
    launcher: str
    worker: str
    started_at: datetime
    finished_at: datetime
    elapsed_s: float
    hosts: list[str]
    predicted_tflops_per_device: float | None
    predicted_memory_bytes: float | None
    trial_dir: str | None = None


def measurement_row(facts: TrialFacts, *, model: Any, cluster: Any, global_batch: int,
                    dtype: str) -> dict[str, Any]:
    """A row of the ``measurements`` table (``autotune.storage.schema.Measurement``)."""
    lay, res = facts.layout, facts.result
    return {
        "study_name": facts.study_name, "trial_number": facts.trial_number,
        "trial_id": facts.trial_id, "layout_key": lay.key(),
        "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "micro_batch": lay.micro_batch,
        "grad_accum": lay.grad_accum, "zero_stage": lay.zero_stage, "recompute": lay.recompute,
        "world_size": lay.world_size, "global_batch": global_batch,
        "model_name": model.name, "n_layer": model.n_layer, "hidden": model.hidden,
        "n_head": model.n_head, "seq_len": model.seq_len, "vocab_size": model.vocab_size,
        "n_params": float(model.n_params()), "device_type": cluster.device,
        "nodes": cluster.nodes, "devices_per_node": cluster.devices_per_node, "dtype": dtype,
        "outcome": facts.outcome.kind, "status": res.status if res else None,
        "reason": facts.outcome.reason or None,
        "model_tflops_per_device": res.model_tflops_per_device if res else None,
        "hardware_tflops_per_device": res.hardware_tflops_per_device if res else None,
        "mfu": res.mfu if res else None,
        "step_time_s": res.step_time_s if res else None,
        "step_time_iqr_s": res.step_time_iqr_s if res else None,
        "tokens_per_s": res.tokens_per_s if res else None,
        "peak_memory_bytes": float(res.peak_memory_bytes) if res and res.peak_memory_bytes
        else None,
        "predicted_memory_bytes": facts.predicted_memory_bytes,
        "predicted_tflops_per_device": facts.predicted_tflops_per_device,
        "elapsed_s": facts.elapsed_s, "launcher": facts.launcher,
        "hosts": json.dumps(facts.hosts or (res.hosts if res else [])),
        "versions": json.dumps(res.versions) if res else None,
        "result_json": json.dumps(res.to_dict()) if res else None,
        "worker": facts.worker, "started_at": facts.started_at,
        "finished_at": facts.finished_at,
    }


def user_attrs(facts: TrialFacts) -> dict[str, Any]:
    """Trial user attributes: readable in optuna-dashboard, JSON-serialisable."""
    res = facts.result
    attrs: dict[str, Any] = {
        "layout": facts.layout.key(),
        "world_size": facts.layout.world_size,
        "dp": facts.layout.dp,
        "grad_accum": facts.layout.grad_accum,
        "outcome": facts.outcome.kind,
        "worker": facts.worker,
        "launcher": facts.launcher,
        "elapsed_s": round(facts.elapsed_s, 2),
    }
    if facts.outcome.reason:
        attrs["reason"] = facts.outcome.reason[-1500:]
    if facts.predicted_tflops_per_device is not None:
        attrs["predicted_tflops_per_device"] = facts.predicted_tflops_per_device
    if facts.predicted_memory_bytes is not None:
        attrs["predicted_memory_gib"] = round(facts.predicted_memory_bytes / GiB, 3)
    if facts.trial_dir:
        attrs["trial_dir"] = facts.trial_dir
    if facts.hosts:
        attrs["hosts"] = facts.hosts
    if res is not None:
        for key in ("model_tflops_per_device", "hardware_tflops_per_device", "mfu",
                    "step_time_s", "step_time_iqr_s", "tokens_per_s", "device", "device_name"):
            value = getattr(res, key)
            if value is not None:
                attrs[key] = value
        if res.peak_memory_bytes is not None:
            attrs["peak_memory_gib"] = round(res.peak_memory_bytes / GiB, 3)
        if res.versions:
            attrs["versions"] = res.versions
    return attrs


def search_stop_record(reason: str, *, judged: int, strategy: str,
                       min_improvement: float | None, worker: str,
                       at: datetime) -> dict[str, Any]:
    """The study's :data:`SEARCH_STOP_ATTR`: the reason, the finished trials it was
    decided on and the threshold, so that a later reader knows what it holds for."""
    return {"reason": reason, "judged": judged, "strategy": strategy,
            "min_improvement": min_improvement, "worker": worker,
            "at": at.isoformat(timespec="seconds")}


def search_stop_line(record: Any) -> str | None:
    """A :func:`search_stop_record` as one line; ``None`` when there is none."""
    if not isinstance(record, dict) or not record.get("reason"):
        return None
    threshold = record.get("min_improvement")
    return str(record["reason"]) + (f" (search.min_improvement {threshold:g})"
                                    if isinstance(threshold, (int, float)) else "")
