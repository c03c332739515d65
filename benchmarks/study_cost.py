"""What a study costs in device time, today's way and the cheap way, side by side (issue #16).

The CPU demo study (``studies/cpu_demo.yaml``: a tiny GPT, 4 ranks, 5 trials) run twice,
one after the other in this process's run, each into a database and run directory of its
own, through ``autotune run`` as a user runs it:

* ``baseline``: one launch per trial, a fixed ``trial.measure_steps`` (``trial.batch_size:
  1``, ``trial.measure_precision: null``, no early stop) -- how every trial ran before;
* ``optimized``: the study file as it is: ``trial.batch_size`` layouts per launch (the demo
  sets 5, its whole budget), adaptive measurement (``trial.measure_precision``,
  ``trial.max_measure_steps``: their defaults) and the early stop of hopeless trials
  (``trial.early_stop_tolerance``: the demo sets 0.1). ``--batch-size``, ``--precision``,
  ``--max-steps`` and ``--tolerance`` override them.

Printed for each: wall time of the run, device-seconds per measured layout (each trial's
wall time, launch to result, times the devices it held: in a batch the launch's wall
time is split between its trials, so that they add up to it), the measured layouts, the
best layout found, and where the trials' time went (start-up phases, build, warm-up,
measured steps, teardown), and beside the search alone what the confirmation round spent
(``confirmation``: its launches, runs, runs stopped early, device-seconds, verdict) and
the two together. Goals: ``ratio`` (optimized over baseline device-seconds per measured
layout) <= 0.40 at an equal number of measured layouts, the same best layout; the
confirmation round at most ``search.confirm_budget`` (default 0.25) of the search's
device-seconds (``confirmation_share``), none of its runs stopped early. Nothing is
asserted.

    python benchmarks/study_cost.py                      # both arms, about 2-3 min on 2 cores
    python benchmarks/study_cost.py --json out.json      # per arm its figures; ratio, same_best
    python benchmarks/study_cost.py --batch-size 4 --precision 0.1 --tolerance 0.2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.report.timings import STARTUP_PHASES, time_breakdown  # noqa: E402
from autotune.trial import PHASES  # noqa: E402

_RAN = ("complete", "stopped", "oom")
"""Outcomes of a layout that was measured (it ran and was judged)."""


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", default=str(REPO / "studies" / "cpu_demo.yaml"))
    p.add_argument("--batch-size", type=int, default=None,
                   help="optimized arm's trial.batch_size (default: the study file's)")
    p.add_argument("--precision", type=float, default=None,
                   help="optimized arm's trial.measure_precision (default: the study file's)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="optimized arm's trial.max_measure_steps (default: the study file's)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="optimized arm's trial.early_stop_tolerance (default: the study "
                        "file's)")
    p.add_argument("--n-trials", type=int, default=None, help="default: the study file's")
    p.add_argument("--confirm-budget", type=float, default=None,
                   help="both arms' search.confirm_budget (default: the study file's)")
    p.add_argument("--only", choices=["baseline", "optimized"], default=None)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    return p.parse_args(argv)


def _arm_study(base: dict[str, Any], tmp: Path, arm: str, args: argparse.Namespace) -> Path:
    study = json.loads(json.dumps(base))
    trial = dict(study.get("trial") or {})
    if arm == "baseline":
        trial.update({"batch_size": 1, "measure_precision": None, "early_stop_tolerance": None})
    else:
        for key, value in (("batch_size", args.batch_size), ("measure_precision", args.precision),
                           ("max_measure_steps", args.max_steps),
                           ("early_stop_tolerance", args.tolerance)):
            if value is not None:
                trial[key] = value
    study["trial"] = trial
    study["name"] = f"{base.get('name', 'study')}-{arm}"
    if args.n_trials:
        study.setdefault("search", {})["n_trials"] = args.n_trials
    if args.confirm_budget is not None:
        study.setdefault("search", {})["confirm_budget"] = args.confirm_budget
    study["storage"] = {**(study.get("storage") or {}), "url": f"sqlite:///{tmp / arm}.db"}
    study["launcher"] = {**(study.get("launcher") or {}), "run_dir": str(tmp / f"runs-{arm}")}
    path = tmp / f"{arm}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def _run_arm(path: Path, name: str) -> dict[str, Any]:
    import optuna

    from autotune.storage import TrialAttr, best_trial, trial_layout_key, trial_outcome

    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "autotune", "run", str(path)], cwd=REPO,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    wall_s = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"{path.name}: autotune run failed ({proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    url = yaml.safe_load(path.read_text())["storage"]["url"]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=url)
    trials = study.get_trials(deepcopy=False)
    ran = [t for t in trials if trial_outcome(t) in _RAN]
    device_s = sum(float(t.user_attrs.get(TrialAttr.ELAPSED_S) or 0.0)
                   * int(t.user_attrs.get(TrialAttr.WORLD_SIZE) or 1) for t in ran)
    best = best_trial(study)
    breakdown = time_breakdown(t.user_attrs.get(TrialAttr.TIMINGS_S) or {} for t in ran)
    steps = [int(t.user_attrs.get(TrialAttr.MEASURED_STEPS) or 0) for t in ran]
    confirm = _confirmation(url, name, study.user_attrs.get("confirmation"), device_s)
    return {
        "confirmation": confirm,
        "device_seconds_with_confirmation": round(device_s + confirm["device_seconds"], 2),
        "wall_s": round(wall_s, 2),
        "device_seconds": round(device_s, 2),
        "device_seconds_per_layout": round(device_s / len(ran), 3) if ran else None,
        "measured_layouts": len(ran),
        "by_outcome": {k: sum(trial_outcome(t) == k for t in ran) for k in _RAN},
        "launches": breakdown.launches,
        "timed_steps": sum(steps),
        "best": trial_layout_key(best) if best else None,
        "best_model_tflops_per_device": best.value if best else None,
        "layouts": sorted(str(trial_layout_key(t)) for t in ran),
        "trials": [{"layout": trial_layout_key(t), "outcome": trial_outcome(t),
                    "model_tflops_per_device": t.value,
                    "steps": t.user_attrs.get(TrialAttr.MEASURED_STEPS),
                    "precision": t.user_attrs.get(TrialAttr.MEASURE_PRECISION),
                    "elapsed_s": t.user_attrs.get(TrialAttr.ELAPSED_S),
                    "batch": t.user_attrs.get(TrialAttr.BATCH)} for t in ran],
        "breakdown_s": {p: round(v, 3) for p, v in breakdown.totals_s.items()},
        # What the launcher's wall time holds beyond the trainer's phases: torchrun's own
        # start before it, the interpreters' and torchrun's exit after the last result.
        "outside_trainer_s": round(sum(float(t.user_attrs.get(TrialAttr.ELAPSED_S) or 0.0)
                                       for t in ran) - breakdown.total_s, 3),
        "startup_share": round(breakdown.startup_share, 3),
    }


def _confirmation(url: str, name: str, record: Any, search_device_s: float) -> dict[str, Any]:
    """What the study's confirmation round spent (every round of it in the database)."""
    from sqlalchemy import func, select

    from autotune.config.study import StorageConfig
    from autotune.storage import ConfirmationRun, confirmation_cost, open_storage
    from autotune.trial.paired import decision_line

    storage = open_storage(StorageConfig(url=url))
    cost = confirmation_cost(storage, name)
    with storage.session() as s:
        stopped = s.scalar(select(func.count(ConfirmationRun.id)).where(
            ConfirmationRun.study_name == name, ConfirmationRun.outcome == "stopped"))
    record = record if isinstance(record, dict) else {}
    return {"launches": cost.launches, "runs": cost.runs, "stopped_runs": int(stopped or 0),
            "device_seconds": round(cost.device_s, 2),
            "confirmation_share": round(cost.device_s / search_device_s, 3)
            if search_device_s else None,
            "state": record.get("state"), "verdict": decision_line(record) if record else None}


def _print(figures: dict[str, Any]) -> None:
    arms = [a for a in ("baseline", "optimized") if a in figures]
    rows = [("wall time of the run (s)", "wall_s"),
            ("device-seconds, all trials", "device_seconds"),
            ("device-seconds per measured layout", "device_seconds_per_layout"),
            ("measured layouts", "measured_layouts"), ("launches", "launches"),
            ("timed steps", "timed_steps"), ("best layout", "best"),
            ("best model TFLOPS/device", "best_model_tflops_per_device"),
            ("start-up share of trial time", "startup_share"),
            ("device-seconds, with confirmation", "device_seconds_with_confirmation")]
    width = 36
    print(f"{'':{width}}" + "".join(f"{a:>30}" for a in arms))
    for label, key in rows:
        cells = []
        for a in arms:
            v = figures[a][key]
            cells.append(f"{v:>30.4g}" if isinstance(v, float) else f"{v!s:>30}")
        print(f"{label:{width}}" + "".join(cells))
    print(f"{'outcomes':{width}}" + "".join(
        f"{', '.join(f'{k} {n}' for k, n in figures[a]['by_outcome'].items() if n):>30}"
        for a in arms))
    print("\nwhere the trials' time went (seconds, summed over trials; start-up phases first):")
    for phase in PHASES:
        mark = " (start-up)" if phase in STARTUP_PHASES else ""
        print(f"  {phase + mark:{width - 2}}" + "".join(
            f"{figures[a]['breakdown_s'][phase]:>30.3f}" for a in arms))
    print(f"  {'launcher and exit, after the result':{width - 2}}" + "".join(
        f"{figures[a]['outside_trainer_s']:>30.3f}" for a in arms))
    for a in arms:
        c = figures[a]["confirmation"]
        print(f"\n{a} confirmation round: {c['device_seconds']} device-s "
              f"({c['confirmation_share']} of the search's), {c['launches']} launches, "
              f"{c['runs']} runs ({c['stopped_runs']} stopped early); {c['verdict']}")
    for a in arms:
        print(f"\n{a}: " + "; ".join(
            f"{t['layout']} {t['outcome']} {t['model_tflops_per_device'] or 0:.4g}"
            f" ({t['steps']} steps)" for t in figures[a]["trials"]))
    if "ratio" in figures:
        print(f"\nratio of device-seconds per measured layout (optimized / baseline): "
              f"{figures['ratio']:.3f} (goal <= 0.40); same best layout: "
              f"{figures['same_best']}; same number of measured layouts: "
              f"{figures['same_count']}")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    base = yaml.safe_load(Path(args.study).read_text())
    figures: dict[str, Any] = {"study": str(args.study)}
    with tempfile.TemporaryDirectory(prefix="study_cost-") as tmp_name:
        tmp = Path(tmp_name)
        for arm in ("baseline", "optimized"):
            if args.only not in (None, arm):
                continue
            path = _arm_study(base, tmp, arm, args)
            print(f"[study_cost] {arm}: autotune run {path.name} ...", file=sys.stderr,
                  flush=True)
            figures[arm] = _run_arm(path, yaml.safe_load(path.read_text())["name"])
            figures[arm]["trial_settings"] = yaml.safe_load(path.read_text())["trial"]
    if "baseline" in figures and "optimized" in figures:
        b, o = figures["baseline"], figures["optimized"]
        if b["device_seconds_per_layout"] and o["device_seconds_per_layout"] is not None:
            figures["ratio"] = round(o["device_seconds_per_layout"]
                                     / b["device_seconds_per_layout"], 3)
        figures["same_best"] = b["best"] == o["best"]
        figures["same_count"] = b["measured_layouts"] == o["measured_layouts"]
        figures["wall_ratio"] = round(o["wall_s"] / b["wall_s"], 3) if b["wall_s"] else None
    _print(figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
