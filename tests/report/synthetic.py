"""A finished study with every outcome, stored the way the runner stores one.

Trials go in through Optuna's ``add_trial`` and rows through ``Storage.add_measurement``,
with user attributes and rows built by the runner's own :mod:`autotune.storage.records` from
realistic results (an H100 node pair, a 1.3B GPT): complete, out-of-memory, infeasible
(never launched, no row), failed and timed-out trials. Seconds instead of GPU hours.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

from autotune.config.study import StorageConfig
from autotune.hardware import GiB
from autotune.layout import Layout
from autotune.runner.optuna_io import open_study
from autotune.spec import StudySpec, parse_study
from autotune.storage import Storage, open_storage
from autotune.storage.records import TrialFacts, measurement_row, user_attrs
from autotune.trial import TrialResult
from autotune.trial.outcome import Verdict

WORLD, GLOBAL_BATCH = 8, 32

# (tp, pp, micro_batch, zero, outcome, TFLOPS/device or None, predicted memory GiB)
TRIALS: list[tuple[int, int, int, int, str, float | None, float]] = [
    (2, 1, 2, 1, "complete", 231.0, 41.0),
    (2, 1, 4, 1, "complete", 247.0, 58.5),
    (1, 1, 1, 1, "complete", 182.0, 49.0),
    (1, 1, 2, 1, "complete", 204.0, 66.0),
    (1, 1, 4, 1, "oom", None, 93.0),
    (1, 1, 4, 0, "infeasible", None, 101.0),
    (2, 2, 1, 0, "complete", 168.0, 33.0),
    (2, 2, 2, 0, "complete", 199.0, 39.5),
    (2, 2, 4, 0, "complete", 214.0, 51.0),
    (4, 1, 2, 0, "complete", 158.0, 27.0),
    (4, 1, 1, 1, "error", None, 21.0),
    (1, 2, 1, 0, "timeout", None, 44.0),
    (4, 2, 4, 0, "complete", 149.0, 24.0),
    (8, 1, 1, 0, "infeasible", None, 15.0),
]
REASONS = {
    "oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 "
           "has a total capacity of 79.11 GiB of which 3.12 GiB is free.",
    "error": "Traceback (most recent call last):\n  File \"trainer/engine.py\", line 88, in "
             "step\nRuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system "
             "error, NCCL version 2.21.5",
    "timeout": "killed after 900 s (trial timeout)",
}
INFEASIBLE = {
    8: "tp 8 needs 8 devices per tensor-parallel group, more than fit on a node's NVLink "
       "domain (4 devices)",
    1: "needs at least the memory of tp1-pp1-dp8-mb4-ga1-z1-none, which ran out of memory",
}


def spec(db: Path, name: str = "synthetic", nodes: int = 2) -> StudySpec:
    return parse_study({
        "name": name,
        "model": {"n_layer": 24, "hidden": 2048, "n_head": 16, "seq_len": 2048,
                  "vocab_size": 51200, "name": "gpt-1.3b"},
        "cluster": {"nodes": nodes, "devices_per_node": WORLD // nodes, "device": "h100"},
        "training": {"global_batch": GLOBAL_BATCH, "dtype": "bf16"},
        "search": {"tp": [1, 2, 4, 8], "pp": [1, 2], "micro_batch": [1, 2, 4, 8],
                   "zero_stage": [0, 1], "recompute": ["none"], "n_trials": 20},
        "storage": {"url": f"sqlite:///{db}"},
    })


def _distributions() -> dict[str, Any]:
    # As autotune.runner.optuna_io.suggest: fixed by the study's world size and global batch.
    return {"tp": IntDistribution(1, WORLD), "pp": IntDistribution(1, WORLD),
            "micro_batch": IntDistribution(1, GLOBAL_BATCH),
            "zero_stage": IntDistribution(0, 3),
            "recompute": CategoricalDistribution(["none", "full"])}


def _result(layout: Layout, kind: str, tflops: float | None, predicted_gib: float) -> \
        TrialResult | None:
    if kind == "complete":
        assert tflops is not None
        return TrialResult(
            status="ok", model_tflops_per_device=tflops, hardware_tflops_per_device=tflops,
            mfu=tflops / 989.0, step_time_s=GLOBAL_BATCH * 2048 * 1.3e9 * 6 / (tflops * 1e12)
            / WORLD, step_time_iqr_s=0.004, tokens_per_s=tflops * 1e12 * WORLD / (6 * 1.3e9),
            peak_memory_bytes=int(predicted_gib * 0.93 * GiB), world_size=WORLD,
            device="cuda", device_name="NVIDIA H100 80GB HBM3", hosts=["gpu001", "gpu002"],
            versions={"torch": "2.5.1", "deepspeed": "0.16.2"}, layout=layout.to_dict())
    if kind == "oom":
        return TrialResult(status="oom", error=REASONS["oom"], world_size=WORLD,
                           device="cuda", device_name="NVIDIA H100 80GB HBM3")
    return None  # error: crashed before a result; timeout: killed


def build(db: Path, name: str = "synthetic", *, nodes: int = 2,
          trials: list[tuple[int, int, int, int, str, float | None, float]] = TRIALS,
          speed: float = 1.0) -> Storage:
    """Create the study ``name`` in the SQLite file ``db`` and return its storage.

    ``speed`` scales every measured TFLOPS (another node count of a campaign)."""
    s = spec(db, name, nodes)
    storage = open_storage(StorageConfig(url=s.storage.url))
    study = open_study(s, storage)
    t0 = datetime(2025, 3, 1, 9, 0, 0)
    for i, (tp, pp, mb, z, kind, tflops, pred_gib) in enumerate(trials):
        tflops = tflops * speed if tflops is not None else None
        dp = WORLD // (tp * pp)
        lay = Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb, grad_accum=GLOBAL_BATCH // (dp * mb),
                     zero_stage=z, recompute="none")
        params = {"tp": tp, "pp": pp, "micro_batch": mb, "zero_stage": z, "recompute": "none"}
        if kind == "infeasible":
            attrs = {"layout": lay.key(), "layout_dict": lay.to_dict(), "outcome": kind,
                     "reason": INFEASIBLE[tp], "worker": "login01:4242"}
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.PRUNED, params=params,
                distributions=_distributions(), user_attrs=attrs,
                system_attrs={"constraints:feasible": 1.0}))
            continue
        outcome = Verdict(kind, value=tflops, reason=REASONS.get(kind, ""))
        result = _result(lay, kind, tflops, pred_gib)
        elapsed = {"complete": 140.0 + 7 * i, "oom": 75.0, "error": 38.0, "timeout": 900.0}[kind]
        started = t0 + timedelta(minutes=20 * i)
        facts = TrialFacts(
            study_name=name, trial_number=len(study.trials), trial_id=-1, layout=lay,
            outcome=outcome, result=result, launcher="slurm", worker="login01:4242",
            started_at=started, finished_at=started + timedelta(seconds=elapsed),
            elapsed_s=elapsed, hosts=["gpu001", "gpu002"],
            predicted_tflops_per_device=(tflops or 200.0) * 1.12,
            predicted_memory_bytes=pred_gib * GiB, trial_dir=f"runs/{name}/trial-{i:05d}")
        attrs = {**user_attrs(facts), "layout_dict": lay.to_dict()}
        study.add_trial(optuna.trial.create_trial(
            state=outcome.state, value=tflops if kind == "complete" else None, params=params,
            distributions=_distributions(), user_attrs=attrs,
            system_attrs={"constraints:feasible": 0.0 if kind == "complete" else 1.0}))
        frozen = study.trials[-1]
        facts = TrialFacts(**{**facts.__dict__, "trial_number": frozen.number,
                              "trial_id": frozen._trial_id})
        storage.add_measurement(measurement_row(facts, model=s.model, cluster=s.cluster,
                                                global_batch=GLOBAL_BATCH, dtype="bf16"))
    return storage
