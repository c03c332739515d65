"""The confirmation round one run per launch (a user's program, the replay launcher, the
fallback when the candidates' engines do not fit together): :func:`measure_rounds` runs
rounds of every candidate, interleaved (A B C, then C B A), and :func:`record_step` stores
them round by round.

Kept apart from :mod:`autotune.runner.confirm` (the round's flow and verdict) as the
one-launch rotation is (:mod:`autotune.runner.confirm_rotation`): each owns how its rounds
are measured and stored.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from autotune.launchers.base import Launcher
from autotune.layout import Layout
from autotune.spec import StudySpec
from autotune.storage import Storage, record_round
from autotune.trial import TrialPaths, TrialSpec
from autotune.trial.classify import classify, storable
from autotune.trial.paired import ConfirmCandidate

__all__ = ["measure_rounds", "record_step"]


def record_step(storage: Storage, confirmation_id: int, study: str,
                new_runs: list[dict[str, Any]], launches: int, device_s: float, *,
                worker: str) -> bool:
    """A step's runs, round by round; its cost charged with its first round (one launch
    for a batch). ``False`` once a round is refused: the round is another worker's now
    (taken over), and nothing more of this step is stored."""
    per_round: dict[int, list[dict[str, Any]]] = {}
    for run in new_runs:
        per_round.setdefault(run["round"], []).append(run)
    for i, (_, runs) in enumerate(sorted(per_round.items())):
        if not storage.retrying("recording a confirmation round", partial(
                record_round, storage, confirmation_id, study_name=study, runs=runs,
                launches=launches if i == 0 else 0, device_s=device_s if i == 0 else 0.0,
                worker=worker)):
            return False
    return True


def measure_rounds(spec: StudySpec, launcher: Launcher, confirmation_id: int,
                   by_key: dict[str, ConfirmCandidate], keys: list[str], rounds: range, *,
                   worker: str) -> tuple[list[dict[str, Any]], int, float]:
    """Measure ``rounds`` of every candidate, interleaved; the runs, launches, device-s."""
    # Never stopped early: the early stop's bar is the search's, and a run cut short
    # would leave its round without a value.
    run_cfg = replace(spec.run_config(None), early_stop_tolerance=None,
                      best_model_tflops_per_device=None)
    order: list[tuple[int, int, str]] = []
    for n in rounds:
        members = keys if n % 2 == 0 else list(reversed(keys))
        order += [(n, slot, key) for slot, key in enumerate(members)]
    root = Path(spec.launcher.run_dir) / spec.name / f"confirm-{confirmation_id:03d}"
    paths = [TrialPaths(root=root / f"round-{n:02d}-{slot}-{key}") for n, slot, key in order]
    layouts = {key: Layout.from_key(key) for key in keys}
    specs = [TrialSpec(model=spec.model, layout=layouts[key], run=run_cfg)
             for _, _, key in order]
    reports = launcher.run_batch(specs, paths, timeout_s=spec.trial.timeout_s)
    batched = launcher.batches and len(specs) > 1
    launches = (1 + sum(bool((r.batch or {}).get("rerun")) for r in reports)) if batched \
        else len(reports)
    world = layouts[keys[0]].world_size
    wall = sum(r.elapsed_s for r in reports)
    runs = []
    for (n, slot, key), report, path in zip(order, reports, paths, strict=True):
        outcome = classify(report, launcher.workload.oom_signatures)
        res = storable(report).result
        runs.append({"round": n, "slot": slot, "layout_key": key,
                     "trial_number": by_key[key].trial_number, "outcome": outcome.kind,
                     "reason": outcome.reason,
                     "model_tflops_per_device": outcome.value,
                     "step_time_s": res.step_time_s if res else None,
                     "measure_precision": res.measure_precision if res else None,
                     "elapsed_s": report.elapsed_s, "world_size": world,
                     "launcher": launcher.kind, "worker": worker, "run_dir": str(path.root)})
    return runs, launches, wall * world
