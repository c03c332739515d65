"""What autotune stores on an Optuna study, written and read here: its fingerprint and
descriptions, its workload (what ``best --emit command`` renders), why its search last
stopped (``search_stop``) and what its calibration rests on (``learned_from``). The keys are
:mod:`autotune.storage.keys`. Imports nothing of the loop, so that readers can use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from autotune.models.calibration import Calibration, LogCorrection
from autotune.storage.keys import HasAttrs, StudyAttr

__all__ = ["study_attrs", "workload_record", "study_workload", "study_fingerprint",
           "study_device_memory_gib", "search_stop_record", "search_stop_of",
           "search_stop_threshold", "search_stop_line", "learned_from_record",
           "learned_from_of", "learned_from_line"]


def study_attrs(fingerprint: dict[str, Any], *, model: str, cluster: str,
                device_memory_gib: float) -> dict[str, Any]:
    """A new study's user attributes: its fingerprint and what the dashboard shows of it."""
    return {StudyAttr.FINGERPRINT: fingerprint, StudyAttr.MODEL: model,
            StudyAttr.CLUSTER: cluster,
            StudyAttr.OBJECTIVE: "model TFLOPS per device (higher is better)",
            StudyAttr.DEVICE_MEMORY_GIB: device_memory_gib}


def workload_record(workload: dict[str, Any], *, train_iters: int,
                    ranks_per_node: int, launcher: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """The study's :attr:`StudyAttr.WORKLOAD`: its ``workload`` section, the steps a trial
    ran (``{train_iters}``), the ranks per node (``{ranks_per_node}``) and the launcher
    (``kind``, its ``env`` and SLURM options: ``best --emit command``'s launch line)."""
    out = {**workload, "train_iters": train_iters, "ranks_per_node": ranks_per_node}
    if launcher is not None:
        out["launcher"] = launcher
    return out


def study_workload(study: HasAttrs) -> dict[str, Any] | None:
    """The recorded :func:`workload_record` (``None``: a study from before workloads, or
    one run through another tool)."""
    record = study.user_attrs.get(StudyAttr.WORKLOAD)
    return record if isinstance(record, dict) else None


def study_fingerprint(study: HasAttrs) -> dict[str, Any]:
    """The study's fingerprint (``{}`` for a study autotune did not create)."""
    fp = study.user_attrs.get(StudyAttr.FINGERPRINT)
    return fp if isinstance(fp, dict) else {}


def study_device_memory_gib(study: HasAttrs) -> float | None:
    """The device memory the runner stored (it includes ``cluster.memory_gb``), if any."""
    value = study.user_attrs.get(StudyAttr.DEVICE_MEMORY_GIB)
    return float(value) if isinstance(value, (int, float)) else None


def search_stop_record(reason: str, *, judged: int, strategy: str,
                       min_improvement: float | None, worker: str,
                       at: datetime) -> dict[str, Any]:
    """The study's :attr:`StudyAttr.SEARCH_STOP`: the reason, the finished trials it was
    decided on and the threshold, so that a later reader knows what it holds for."""
    return {"reason": reason, "judged": judged, "strategy": strategy,
            "min_improvement": min_improvement, "worker": worker,
            "at": at.isoformat(timespec="seconds")}


def search_stop_of(study: HasAttrs) -> dict[str, Any] | None:
    """The study's recorded search stop (:func:`search_stop_record`), ``None`` if none."""
    record = study.user_attrs.get(StudyAttr.SEARCH_STOP)
    return record if isinstance(record, dict) else None


def search_stop_threshold(record: Mapping[str, Any] | None) -> float | None:
    """The ``search.min_improvement`` a recorded stop was decided at (``None``: unknown)."""
    value = (record or {}).get("min_improvement")
    return float(value) if isinstance(value, (int, float)) else None


def search_stop_line(record: Any) -> str | None:
    """A :func:`search_stop_record` as one line; ``None`` when there is none."""
    if not isinstance(record, dict) or not record.get("reason"):
        return None
    threshold = search_stop_threshold(record)
    return str(record["reason"]) + (f" (search.min_improvement {threshold:g})"
                                    if threshold is not None else "")


def _correction(c: LogCorrection, **counts: int) -> dict[str, Any]:
    return {"factor": round(c.factor, 6), "log_sd": round(c.sd, 6), **counts}


def learned_from_record(cal: Calibration, *, enabled: bool) -> dict[str, Any]:
    """The study's :attr:`StudyAttr.LEARNED_FROM`: the key, the earlier studies learned
    from with their measurements (none when ``enabled`` is false: ``search.
    learn_from_database`` or ``--no-learn``), the study's own, and both corrections
    (``factor``: measured / predicted, the median; ``log_sd``: its sd in log)."""
    key = cal.key
    return {"enabled": enabled, "device_type": key.device_type, "dtype": key.dtype,
            "workload": key.workload,
            "studies": [{"study": name, "measurements": n} for name, n in cal.learned_from],
            "measurements": sum(n for _, n in cal.learned_from), "own": cal.own,
            "memory": {**_correction(cal.memory, ok=cal.memory.n_ok, oom=cal.memory.n_censored),
                       "by_zero_stage": {str(z): _correction(c, ok=c.n_ok, oom=c.n_censored)
                                         for z, c in cal.memory_by_stage}},
            "throughput": _correction(cal.throughput, ok=cal.throughput.n_ok),
            "stale": cal.stale}


def learned_from_of(study: HasAttrs) -> dict[str, Any] | None:
    """The study's recorded :func:`learned_from_record`, ``None`` if none."""
    record = study.user_attrs.get(StudyAttr.LEARNED_FROM)
    return record if isinstance(record, dict) else None


def learned_from_line(record: Any) -> str | None:
    """A :func:`learned_from_record` as one line for people; ``None`` when there is none.

    ``learned from 2 earlier studies of cpu/fp32/builtin (a: 5, b: 3 measurements); with
    this study's 4: memory x0.93 (+-5%), step time x2.2 (+-9%)``
    """
    if not isinstance(record, dict):
        return None
    what = f"{record.get('device_type')}/{record.get('dtype')}/{record.get('workload')}"
    studies = record.get("studies") or []
    if not record.get("enabled", True):
        head = "not learning from earlier studies (search.learn_from_database: false)"
    elif not studies:
        head = f"no earlier study of {what} in the database"
    else:
        listed = ", ".join(f"{s.get('study')}: {s.get('measurements')}" for s in studies[:5])
        more = f", and {len(studies) - 5} more" if len(studies) > 5 else ""
        head = (f"learned from {len(studies)} earlier "
                f"{'study' if len(studies) == 1 else 'studies'} of {what} "
                f"({listed}{more} measurements)")
    parts = []
    mem, tp = record.get("memory") or {}, record.get("throughput") or {}
    if mem.get("ok") or mem.get("oom"):
        stages = mem.get("by_zero_stage") or {}
        each = ", ".join(f"ZeRO {z} x{c['factor']:.3g}" for z, c in sorted(stages.items()))
        parts.append(f"memory x{mem['factor']:.3g} (+-{100 * mem['log_sd']:.0f}%"
                     + (f"; {each})" if len(stages) > 1 else ")"))
    if tp.get("ok"):
        parts.append(f"step time x{1 / tp['factor']:.3g} (+-{100 * tp['log_sd']:.0f}%)")
    own = record.get("own") or 0
    tail = (f"; with this study's {own}: " if own else "; ") + (
        ", ".join(parts) if parts else "no correction yet")
    stale = record.get("stale") or 0
    if stale:  # after an upgrade: their ratios measured the old models' error
        tail += (f" ({stale} earlier {'row' if stale == 1 else 'rows'} left out: predicted "
                 "by another version of autotune's models)")
    return head + tail
