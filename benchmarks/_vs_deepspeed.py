"""What ``benchmarks/vs_deepspeed_autotuner.py`` reads and scores, apart from running things.

* the space: ZeRO stages x micro-batches at a fixed global batch (:func:`space_points`),
  a point named ``z1-mb4`` (:func:`point_key`, the key of CONTRACTS.md's benchmark JSON);
* the ground truth's lines (:func:`parse_truth`): median samples/s per point;
* DeepSpeed's Autotuner: the config that makes it run exactly this grid
  (:func:`autotuner_config`), its named best from its own output folder
  (:func:`read_autotuner_best`) and its launches (:func:`read_launches`);
* autotune: its launches and device-seconds from the study's ``measurements`` rows and
  trial folders (:func:`autotune_cost`), its best from ``autotune best --emit json``
  (:func:`autotune_best_key`);
* :func:`relative_to_best`: a named best's ground-truth throughput over the true best's;
* :func:`truth_repeatability`: whether two or more measurements of the ground truth agree
  on the best and the top 3 (a truth that does not repeat scores no tool), and their
  pooled truth (the median per point).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["point_key", "parse_point", "space_points", "parse_truth", "train_py_truth_line",
           "autotuner_config", "read_autotuner_best", "read_autotuner_metrics",
           "read_launches", "union_seconds", "autotune_cost",
           "autotune_best_key", "relative_to_best", "truth_repeatability", "WITHIN"]

WITHIN = 0.05
"""A named best counts as found when its throughput is within 5 % of the true best's."""


class BenchmarkError(ValueError):
    """Bad benchmark input: the message names the field, the value and what is allowed."""


def point_key(zero_stage: int, micro_batch: int) -> str:
    """The name of a point (CONTRACTS.md's benchmark JSON).

    >>> point_key(1, 4)
    'z1-mb4'
    """
    return f"z{zero_stage}-mb{micro_batch}"


def parse_point(key: str) -> tuple[int, int]:
    """The ZeRO stage and micro-batch of a point's name.

    >>> parse_point("z2-mb8")
    (2, 8)
    """
    zero, mb = key.split("-")
    return int(zero.removeprefix("z")), int(mb.removeprefix("mb"))


def space_points(zero_stages: Sequence[int], micro_batches: Sequence[int], *,
                 global_batch: int, ranks: int) -> list[str]:
    """Every point of the space, each micro-batch dividing the global batch over the ranks
    (the gradient accumulation follows: ``global / (micro x ranks)``).

    >>> space_points([0, 2], [1, 8], global_batch=16, ranks=2)
    ['z0-mb1', 'z0-mb8', 'z2-mb1', 'z2-mb8']
    """
    for z in zero_stages:
        if z not in (0, 1, 2):
            raise BenchmarkError(f"--zero: {z} is not allowed (allowed: 0, 1, 2)")
    for mb in micro_batches:
        if mb < 1 or global_batch % (mb * ranks):
            raise BenchmarkError(f"--micro-batch: {mb} does not divide --global-batch "
                                 f"{global_batch} over {ranks} ranks (allowed: divisors of "
                                 f"{global_batch // ranks})")
    return [point_key(z, mb) for z in zero_stages for mb in micro_batches]


def parse_truth(lines: Iterable[str], *, global_batch: int, warmup_every_line: bool = False
                ) -> dict[str, float]:
    """Median samples/s per point from ``_ground_truth_ranks.py``'s lines: per round the
    median step time (the first step a point ever ran dropped as its warm-up; with
    ``warmup_every_line``, the first of every line: one launch per line), then the
    median over the rounds of ``global_batch / step time``.

    >>> parse_truth(["truth z0-mb1 round 1 step_s 9.0 0.5 0.5",
    ...              "truth z0-mb1 round 2 step_s 0.25 0.25", "noise"], global_batch=16)
    {'z0-mb1': 48.0}
    """
    per_round: dict[str, list[float]] = defaultdict(list)
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[0] != "truth" or parts[4] != "step_s":
            continue
        key, times = parts[1], [float(t) for t in parts[5:]]
        if warmup_every_line or key not in per_round:
            times = times[1:]  # the point's first step: warm-up
        if times:
            per_round[key].append(global_batch / statistics.median(times))
    return {key: statistics.median(v) for key, v in per_round.items()}


def train_py_truth_line(key: str, round_: int, stdout: str) -> str:
    """``train.py``'s step lines (``step 3/8 | time 0.412345 s | loss 5.53``) of one launch
    as one ground-truth line.

    >>> train_py_truth_line("z0-mb8", 2, "step 1/2 | time 0.5 s | loss 5\\nstep 2/2 | time 0.1 s")
    'truth z0-mb8 round 2 step_s 0.5 0.1'
    """
    times = [part.split()[1] for line in stdout.splitlines() if line.startswith("step ")
             for part in line.split("|") if part.strip().startswith("time ")]
    return f"truth {key} round {round_} step_s " + " ".join(times)


def autotuner_config(zero_stages: Sequence[int], micro_batches: Sequence[int], *,
                     global_batch: int, ranks: int, results_dir: Path, exps_dir: Path
                     ) -> dict[str, Any]:
    """DeepSpeed's Autotuner config for exactly this grid at this global batch.

    Keys from DeepSpeed 0.19.8 ``deepspeed/autotuning/constants.py`` and their use in
    ``autotuner.py``: a list under ``zero_optimization.stage`` is the stages to tune
    (``tune``: ``user_zero_stages``); a list under ``train_micro_batch_size_per_gpu``
    replaces its own micro-batch search (``tune_space``:
    ``tuning_micro_batch_sizes_overwritten``), and each experiment's accumulation is
    ``max_train_batch_size_per_gpu // mbs`` with ``max_train_batch_size_per_gpu = max(mbs)
    x gradient_accumulation_steps`` (``run_tuning_micro_batch_sizes``): so the config's
    accumulation is the one of the largest micro-batch and the global batch stays fixed.
    ``fast: true`` stops after the micro-batch grid of each stage (no ZeRO sub-knobs), so
    it runs 1 model-info profile + one experiment per point.
    """
    per_rank = global_batch // ranks
    return {
        "train_micro_batch_size_per_gpu": sorted(micro_batches),
        "gradient_accumulation_steps": per_rank // max(micro_batches),
        "zero_optimization": {"stage": sorted(zero_stages)},
        "autotuning": {"enabled": True, "fast": True, "metric": "throughput",
                       "results_dir": str(results_dir), "exps_dir": str(exps_dir),
                       "overwrite": True, "start_profile_step": 3, "end_profile_step": 5},
    }


def read_autotuner_best(results_dir: Path) -> str | None:
    """The best the autotuner named: its ``ds_config_optimal.json`` (written by
    ``Autotuner.write_optimal_config``); ``None`` where it wrote none (nothing ran)."""
    path = results_dir / "ds_config_optimal.json"
    if not path.exists():
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    return point_key(int(config.get("zero_optimization", {}).get("stage", 0)),
                     int(config["train_micro_batch_size_per_gpu"]))


def read_autotuner_metrics(results_dir: Path) -> dict[str, float]:
    """The throughput the autotuner measured per experiment folder (its ``metrics.json``;
    a folder without one is an experiment it recorded as throughput 0)."""
    out: dict[str, float] = {}
    for exp in sorted(results_dir.glob("*/exp.json")):
        config = json.loads(exp.read_text(encoding="utf-8")).get("ds_config", {})
        if config.get("autotuning", {}).get("model_info", {}).get("profile"):
            continue  # the model-info profile run (ZeRO 3, mbs 1: DEFAULT_MIN_MEM_CONFIG)
        key = point_key(int(config.get("zero_optimization", {}).get("stage", 0)),
                        int(config["train_micro_batch_size_per_gpu"]))
        metrics = exp.parent / "metrics.json"
        out[key] = (float(json.loads(metrics.read_text(encoding="utf-8"))["throughput"])
                    if metrics.exists() else 0.0)
    return out


def read_launches(path: Path) -> tuple[int, float]:
    """Launches and device-seconds (wall x ranks) from the wrapper's launch lines
    (``benchmarks/_ds_autotuner_local.py``)."""
    if not path.exists():
        return 0, 0.0
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
               if line.strip()]
    return len(records), sum(r["wall_s"] * r["ranks"] for r in records)


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by the intervals, overlaps counted once (several trials of one
    launch overlap: the devices are held once).

    >>> union_seconds([(0, 10), (5, 12), (20, 21)])
    13.0
    """
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _timestamp(value: Any) -> float:
    return (value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
            ).timestamp()


def autotune_cost(db_path: Path, study: str, run_dir: Path) -> tuple[int, float]:
    """autotune's launches (the trial folders that got a ``command.json``: one per launch,
    :mod:`autotune.launchers.launch_record`, the confirmation round's included) and
    device-seconds: the time its trials held the devices (the union of the
    ``measurements`` rows' ``started_at`` .. ``finished_at``) x their ranks, plus the
    ``device_s`` the confirmation round recorded for its own launches (its runs are
    ``confirmation_runs`` rows, not measurements)."""
    launches = sum(1 for _ in run_dir.rglob("command.json"))
    with sqlite3.connect(db_path) as db:
        rows = db.execute("select started_at, finished_at, world_size from measurements "
                          "where study_name = ? and started_at is not null and "
                          "finished_at is not null", (study,)).fetchall()
        tables = {r[0] for r in db.execute("select name from sqlite_master "
                                           "where type = 'table'")}
        confirm_s = (db.execute("select coalesce(sum(device_s), 0) from confirmations "
                                "where study_name = ?", (study,)).fetchone()[0]
                     if "confirmations" in tables else 0.0)
    trials_s = 0.0
    if rows:
        ranks = max(int(r[2]) for r in rows)
        trials_s = ranks * union_seconds((_timestamp(a), _timestamp(b)) for a, b, _ in rows)
    return launches, trials_s + float(confirm_s)


def autotune_best_key(best_json: str) -> str:
    """The point ``autotune best --emit json`` names."""
    layout = json.loads(best_json)["layout"]
    return point_key(int(layout["zero_stage"]), int(layout["micro_batch"]))


def relative_to_best(truth: dict[str, float], named: str | None) -> float:
    """The named point's ground-truth throughput over the true best's (0 for none).

    >>> relative_to_best({"z0-mb1": 50.0, "z1-mb4": 100.0}, "z0-mb1")
    0.5
    """
    if named is None or named not in truth:
        return 0.0
    return truth[named] / max(truth.values())


def truth_repeatability(truths: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Whether the ground truth's measurements agree (module docstring).

    >>> r = truth_repeatability([{"a": 10.0, "b": 9.0, "c": 5.0, "d": 1.0},
    ...                          {"a": 11.0, "b": 8.0, "c": 6.0, "d": 2.0}])
    >>> r["best_agrees"], r["top3_agrees"], r["repeats"], r["pooled"]["a"]
    (True, True, True, 10.5)
    >>> truth_repeatability([{"a": 10.0, "b": 9.0}, {"a": 9.0, "b": 10.0}])["repeats"]
    False
    """
    if not truths:
        raise BenchmarkError("truth_repeatability: no ground truth")
    points = sorted(set.intersection(*(set(t) for t in truths)))

    def ranked(t: dict[str, float]) -> list[str]:
        return sorted(points, key=lambda k: (-t[k], k))

    bests = [ranked(t)[0] for t in truths]
    tops = [sorted(ranked(t)[:3]) for t in truths]
    best_agrees = len(set(bests)) == 1
    top3_agrees = all(top == tops[0] for top in tops)
    spread = {k: (max(t[k] for t in truths) / min(t[k] for t in truths) - 1.0)
              if min(t[k] for t in truths) > 0 else float("inf") for k in points}
    return {"measurements": len(truths), "bests": bests, "top3": tops,
            "best_agrees": best_agrees, "top3_agrees": top3_agrees,
            "repeats": len(truths) > 1 and best_agrees and top3_agrees,
            "max_spread": round(max(spread.values()), 4) if spread else None,
            "pooled": {k: statistics.median(t[k] for t in truths) for k in points}}
