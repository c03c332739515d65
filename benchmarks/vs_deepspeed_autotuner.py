"""autotune and DeepSpeed's Autotuner on the same program and the same space, in one run.

The program: ``examples/deepspeed_gpt/`` on 2 CPU ranks (autotune runs ``train.py`` through
``examples/deepspeed_gpt/vs_deepspeed.yaml``; the autotuner runs ``train_ds_autotuner.py``,
the same model, data and step, taking its batch and ZeRO stage from the autotuner's
base64 config). The space: ZeRO {0,1,2} x micro-batch {1,2,4,8} at a fixed global batch.

1. A ground truth: every point measured side by side in one launch
   (``benchmarks/_ground_truth_ranks.py``), ``--truth-rounds`` rounds of ``--truth-steps``
   steps each, the points in a new order each round; median samples/s per point. Measured
   ``--truth-repeats`` times (default 2): the benchmark states whether the measurements
   agree on the best and the top 3 (``truth_repeatability``), pools them (the median per
   point) and scores the tools (``within_5pct``) only against a truth that repeats; one
   that does not leaves ``within_5pct`` null and says so.
2. ``--repetitions`` times (the order of the two tools alternating): DeepSpeed's Autotuner
   for real (``deepspeed --autotuning tune`` through ``benchmarks/_ds_autotuner_local.py``,
   its clean-up replaced for a local run; its best read from its ``ds_config_optimal.json``),
   and ``autotune run`` + ``autotune best --emit json`` for real on a fresh SQLite study.
3. Per tool: launches, device-seconds (wall x ranks of every launch), the best it named,
   that best's ground-truth throughput relative to the true best's, and how many
   repetitions named a best within 5 % of it. ``--json OUT`` writes CONTRACTS.md's shape.

    python benchmarks/vs_deepspeed_autotuner.py --json vs_ds.json          # 30-60 min here
    python benchmarks/vs_deepspeed_autotuner.py --zero 0 --micro-batch 4 8 \\
        --repetitions 1 --truth-rounds 2 --truth-steps 2                    # a smoke run

Environment workarounds the autotuner needs here are in docs/vs-deepspeed-autotuner.md.
Progress lines go to stderr; the table to stdout.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._vs_deepspeed import (
    WITHIN,
    BenchmarkError,
    autotune_best_key,
    autotune_cost,
    autotuner_config,
    parse_point,
    parse_truth,
    read_autotuner_best,
    read_autotuner_metrics,
    read_launches,
    relative_to_best,
    space_points,
    train_py_truth_line,
    truth_repeatability,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "deepspeed_gpt"
STUDY = EXAMPLE / "vs_deepspeed.yaml"
TOOLS = ("autotune", "deepspeed")


def log(text: str) -> None:
    print(f"[vs-deepspeed {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def usage_error(text: str) -> NoReturn:
    """Bad input: one line naming the flag, the value and what is allowed; exit 2."""
    print(f"vs_deepspeed_autotuner.py: error: {text}", file=sys.stderr)
    raise SystemExit(2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--zero", type=int, nargs="+", default=[0, 1, 2], metavar="Z")
    p.add_argument("--micro-batch", type=int, nargs="+", default=[1, 2, 4, 8], metavar="MB")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repetitions", type=int, default=3,
                   help="runs of each tool (default 3; 0: the ground truth only)")
    p.add_argument("--truth-rounds", type=int, default=10,
                   help="ground-truth rounds over every point (default 10)")
    p.add_argument("--truth-steps", type=int, default=5,
                   help="steps per point and round (default 5)")
    p.add_argument("--truth-mode", choices=("one-launch", "launches"), default="one-launch",
                   help="one-launch: every point's engine side by side in one launch; "
                   "launches: round-robin launches of train.py, one per point and round "
                   "(as the tools measure, at one launch's start-up per point and round)")
    p.add_argument("--truth-repeats", type=int, default=2,
                   help="measurements of the ground truth, to check it repeats (default 2; "
                   "1: not checked, no tool scored)")
    p.add_argument("--truth-from", type=Path, default=None, metavar="JSON",
                   help="reuse the ground truth of an earlier run's --json OUT instead of "
                   "measuring one (its points must cover this space)")
    p.add_argument("--n-trials", type=int, default=None,
                   help="autotune's trial budget (default: the study file's)")
    p.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    p.add_argument("--work-dir", type=Path, default=None,
                   help="keep every run's folders here (default: a temp dir, removed)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    a = p.parse_args(argv)
    if a.repetitions < 0:
        p.error(f"--repetitions: {a.repetitions} is not allowed (allowed: an integer >= 0)")
    for name in ("truth_rounds", "truth_steps", "truth_repeats", "ranks", "global_batch"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')}: {getattr(a, name)} is not allowed "
                    "(allowed: an integer >= 1)")
    if a.n_trials is not None and a.n_trials < 1:
        p.error(f"--n-trials: {a.n_trials} is not allowed (allowed: an integer >= 1)")
    try:
        a.points = space_points(a.zero, a.micro_batch, global_batch=a.global_batch,
                                ranks=a.ranks)
    except BenchmarkError as err:
        p.error(str(err))
    if "deepspeed" in a.tools and importlib.util.find_spec("tabulate") is None:
        p.error("--tools deepspeed: DeepSpeed's Autotuner needs the package tabulate "
                "(allowed: install it, pip install tabulate, or the dev extra; or --tools "
                "autotune)")
    return a


def base_env(work: Path, ranks: int) -> dict[str, str]:
    env = dict(os.environ)
    # The tools' own commands say ``python`` (the example study's argv) and ``deepspeed``
    # (the Autotuner's launcher): the ones beside this interpreter, so that
    # ``.venv/bin/python benchmarks/...`` without an activated environment measures the
    # same installation (it ran both tools on the system python: no module 'deepspeed').
    bin_dir = str(Path(sys.executable).parent)
    env.update(PATH=os.pathsep.join(p for p in (bin_dir, env.get("PATH")) if p),
               DS_ACCELERATOR=env.get("DS_ACCELERATOR", "cpu"),
               # DeepSpeed counts CPU "devices" from LOCAL_SIZE (else NUMA nodes: 1 here)
               LOCAL_SIZE=str(ranks),
               # its CPU comm op, built for this DeepSpeed only (no clash with another's)
               TORCH_EXTENSIONS_DIR=env.get("TORCH_EXTENSIONS_DIR",
                                            str(work / "torch_extensions")),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH"))
                                          if p))
    return env


def run_logged(cmd: list[str], *, env: dict[str, str], cwd: Path, log_path: Path,
               what: str) -> subprocess.CompletedProcess[str]:
    start = time.time()
    with open(log_path, "w", encoding="utf-8") as out:
        proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=out,
                              text=True, check=False)
    log(f"{what}: exit {proc.returncode} after {time.time() - start:.0f} s (log {log_path})")
    return proc


def ground_truth(a: argparse.Namespace, work: Path, env: dict[str, str]) -> dict[str, float]:
    log(f"ground truth: {len(a.points)} points x {a.truth_rounds} rounds x {a.truth_steps} "
        "steps, side by side in one launch")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(a.ranks),
           "--master-port", str(free_port()), str(ROOT / "benchmarks" / "_ground_truth_ranks.py"),
           "--points", ",".join(a.points), "--global-batch", str(a.global_batch),
           "--rounds", str(a.truth_rounds), "--steps", str(a.truth_steps)]
    proc = run_logged(cmd, env=env, cwd=work, log_path=work / "truth.log", what="ground truth")
    (work / "truth.out").write_text(proc.stdout, encoding="utf-8")  # every round's steps
    truth = parse_truth(proc.stdout.splitlines(), global_batch=a.global_batch)
    missing = [p for p in a.points if p not in truth]
    if proc.returncode or missing:
        raise SystemExit(f"ground truth failed (exit {proc.returncode}; points missing: "
                         f"{missing}): see {work / 'truth.log'}")
    return truth


def launches_truth(a: argparse.Namespace, work: Path, env: dict[str, str]
                   ) -> dict[str, float]:
    """``--truth-mode launches``: ``--truth-rounds`` rounds, in each one launch of
    ``train.py`` per point (a new order each round), ``--truth-steps`` + 1 steps (the
    first of each launch dropped)."""
    import random

    order, lines = list(a.points), []
    shuffle = random.Random(0)
    for rnd in range(1, a.truth_rounds + 1):
        shuffle.shuffle(order)
        for key in order:
            zero, mb = parse_point(key)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                   str(a.ranks), "--master-port", str(free_port()), str(EXAMPLE / "train.py"),
                   "--micro-batch-size", str(mb), "--grad-accum",
                   str(a.global_batch // (mb * a.ranks)), "--zero-stage", str(zero),
                   "--steps", str(a.truth_steps + 1)]
            proc = run_logged(cmd, env=env, cwd=work, log_path=work / f"truth-{key}-{rnd}.log",
                              what=f"ground truth round {rnd}/{a.truth_rounds} {key}")
            if proc.returncode:
                raise SystemExit(f"ground truth: {key} failed (exit {proc.returncode}): see "
                                 f"{work / f'truth-{key}-{rnd}.log'}")
            lines.append(train_py_truth_line(key, rnd, proc.stdout))
    (work / "truth.out").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return parse_truth(lines, global_batch=a.global_batch, warmup_every_line=True)


def earlier_truth(a: argparse.Namespace) -> dict[str, float]:
    """``--truth-from``: the ``ground_truth`` of an earlier run's JSON, on these points."""
    try:
        truth = json.loads(a.truth_from.read_text(encoding="utf-8"))["ground_truth"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        usage_error(f"--truth-from: {a.truth_from} has no readable ground_truth ({err}; "
                    "allowed: the --json OUT of an earlier run)")
    missing = [p for p in a.points if p not in truth]
    if missing:
        usage_error(f"--truth-from: {a.truth_from} lacks the points {missing} (allowed: "
                    "a run over a space that covers this one)")
    log(f"ground truth from {a.truth_from}")
    return {p: float(truth[p]) for p in a.points}


def earlier_truths(a: argparse.Namespace) -> list[dict[str, float]]:
    """``--truth-from``: every ground-truth measurement of an earlier run's JSON (its
    ``ground_truths`` where it has them, else its one ``ground_truth``)."""
    try:
        found = json.loads(a.truth_from.read_text(encoding="utf-8")).get("ground_truths")
    except (OSError, ValueError, AttributeError):
        found = None
    if not isinstance(found, list) or not found:
        return [earlier_truth(a)]
    missing = [p for p in a.points if any(p not in t for t in found)]
    if missing:
        usage_error(f"--truth-from: {a.truth_from} lacks the points {missing} (allowed: "
                    f"a JSON whose ground truths cover {a.points})")
    return [{p: float(t[p]) for p in a.points} for t in found]


def run_deepspeed(a: argparse.Namespace, rep_dir: Path, env: dict[str, str]
                  ) -> dict[str, Any]:
    rep_dir.mkdir(parents=True)
    config = autotuner_config(a.zero, a.micro_batch, global_batch=a.global_batch,
                              ranks=a.ranks, results_dir=rep_dir / "results",
                              exps_dir=rep_dir / "exps")
    (rep_dir / "ds_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    launches_path = rep_dir / "launches.jsonl"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "_ds_autotuner_local.py"),
           "--autotuning", "tune", "--num_gpus", str(a.ranks), "--master_port",
           str(free_port()), str(EXAMPLE / "train_ds_autotuner.py"),
           "--deepspeed_config", "ds_config.json", "--steps", "10"]
    start = time.time()
    proc = run_logged(cmd, env={**env, "AUTOTUNE_BENCH_LAUNCHES": str(launches_path)},
                      cwd=rep_dir, log_path=rep_dir / "autotuner.log", what="DeepSpeed's Autotuner")
    (rep_dir / "autotuner.stdout").write_text(proc.stdout, encoding="utf-8")
    launches, device_s = read_launches(launches_path)
    return {"best": read_autotuner_best(rep_dir / "results"), "launches": launches,
            "device_seconds": device_s, "wall_s": time.time() - start,
            "measured": read_autotuner_metrics(rep_dir / "results")}


def run_autotune(a: argparse.Namespace, rep_dir: Path, env: dict[str, str], name: str
                 ) -> dict[str, Any]:
    rep_dir.mkdir(parents=True)
    study = yaml.safe_load(STUDY.read_text(encoding="utf-8"))
    db = rep_dir / "study.db"
    study.update(name=name)
    study["storage"]["url"] = f"sqlite:///{db}"
    study["launcher"]["run_dir"] = str(rep_dir / "runs")
    study["search"].update(zero_stage=list(a.zero), micro_batch=list(a.micro_batch))
    study["training"]["global_batch"] = a.global_batch
    study["cluster"]["devices_per_node"] = a.ranks
    if a.n_trials is not None:
        study["search"]["n_trials"] = a.n_trials
    path = rep_dir / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False), encoding="utf-8")
    autotune = [sys.executable, "-m", "autotune"]
    start = time.time()
    # cwd: the checkout's root, where the study's argv (examples/...) is relative to
    run = run_logged([*autotune, "run", str(path)], env=env, cwd=ROOT,
                     log_path=rep_dir / "run.log", what="autotune run")
    wall = time.time() - start
    best = run_logged([*autotune, "best", str(path), "--emit", "json"], env=env, cwd=ROOT,
                      log_path=rep_dir / "best.log", what="autotune best")
    launches, device_s = autotune_cost(db, name, rep_dir / "runs")
    named = autotune_best_key(best.stdout) if best.returncode == 0 and run.returncode == 0 \
        else None
    return {"best": named, "launches": launches, "device_seconds": device_s, "wall_s": wall}


def report(a: argparse.Namespace, truths: list[dict[str, float]],
           reps: list[dict[str, dict[str, Any]]], *, show: bool = True) -> dict[str, Any]:
    """CONTRACTS.md's JSON (plus ``ground_truth``, ``truth_repeatability``, per tool
    ``relative`` and ``wall_s``) of the repetitions so far; with ``show`` the tables on
    stdout as well. ``truths``: each measurement of the ground truth."""
    text = sys.stdout if show else io.StringIO()
    repeat = truth_repeatability(truths)
    truth = repeat.pop("pooled")
    true_best = max(truth, key=lambda k: truth[k])
    if repeat["repeats"]:
        print(f"ground truth repeats: {repeat['measurements']} measurements agree on the "
              f"best ({true_best}) and the top 3 (largest spread of a point "
              f"{repeat['max_spread']:.1%})", file=text)
    else:
        print(f"ground truth does NOT repeat ({repeat['measurements']} measurement(s): "
              f"bests {repeat['bests']}, top 3 {repeat['top3']}): no tool is scored "
              "against it", file=text)
    print(f"\nground truth (median samples/s, {a.truth_rounds} interleaved rounds):",
          file=text)
    for key in sorted(truth, key=lambda k: -truth[k]):
        print(f"  {key:8s} {truth[key]:9.2f}  {truth[key] / truth[true_best]:6.1%}", file=text)
    out: dict[str, Any] = {"ground_truth_best": true_best, "repetitions": len(reps),
                           "ground_truth": truth, "ground_truths": truths,
                           "truth_repeatability": repeat, "tools": {}}
    print(f"\n{'tool':10s} {'rep':>3s} {'launches':>8s} {'device_s':>9s} {'wall_s':>7s} "
          f"{'best':8s} {'vs true best':>12s}", file=text)
    for tool in a.tools:
        rows = [rep[tool] for rep in reps]
        for i, row in enumerate(rows, 1):
            row["relative"] = relative_to_best(truth, row["best"])
            print(f"{tool:10s} {i:3d} {row['launches']:8d} {row['device_seconds']:9.0f} "
                  f"{row['wall_s']:7.0f} {row['best'] or '-':8s} {row['relative']:12.1%}",
                  file=text)
        within = (sum(1 for r in rows if r["relative"] >= 1 - WITHIN) if repeat["repeats"]
                  else None)
        out["tools"][tool] = {
            "launches": sum(r["launches"] for r in rows),
            "device_seconds": round(sum(r["device_seconds"] for r in rows), 1),
            "best": [r["best"] for r in rows], "within_5pct": within,
            "relative": [round(r["relative"], 4) for r in rows],
            "wall_s": round(sum(r["wall_s"] for r in rows), 1)}
        print(f"{tool:10s} total {out['tools'][tool]['launches']} launches, "
              f"{out['tools'][tool]['device_seconds']:.0f} device-s; "
              + (f"best within 5 % of {true_best} in {within} of {len(rows)} repetitions"
                 if within is not None else "not scored (the ground truth does not repeat)"),
              file=text)
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    work = a.work_dir.resolve() if a.work_dir else Path(tempfile.mkdtemp(prefix="vs-ds-"))
    work.mkdir(parents=True, exist_ok=True)
    env = base_env(work, a.ranks)
    try:
        truths = (earlier_truths(a) if a.truth_from else
                  [launches_truth(a, work, env) if a.truth_mode == "launches" else
                   ground_truth(a, work, env) for _ in range(a.truth_repeats)])
        for truth in truths:
            log("ground truth: " + ", ".join(f"{k} {v:.1f}" for k, v in truth.items()))
        reps: list[dict[str, dict[str, Any]]] = []
        for rep in range(1, a.repetitions + 1):
            order = a.tools if rep % 2 else list(reversed(a.tools))
            results: dict[str, dict[str, Any]] = {}
            for tool in order:
                log(f"repetition {rep}/{a.repetitions}: {tool}")
                rep_dir = work / f"rep{rep}-{tool}"
                results[tool] = (run_deepspeed(a, rep_dir, env) if tool == "deepspeed" else
                                 run_autotune(a, rep_dir, env, f"vs-ds-rep{rep}"))
                log(f"repetition {rep}: {tool} named {results[tool]['best']} after "
                    f"{results[tool]['launches']} launches, "
                    f"{results[tool]['device_seconds']:.0f} device-s")
            reps.append(results)
            if a.json:  # after every repetition: a long run cut short keeps what it did
                a.json.write_text(json.dumps(report(a, truths, reps, show=False), indent=1)
                                  + "\n", encoding="utf-8")
                log(f"wrote {a.json} ({rep} of {a.repetitions} repetitions)")
        report(a, truths, reps)
    finally:
        if a.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
