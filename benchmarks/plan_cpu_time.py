"""CPU time of ``autotune plan``: what a user waits for before asking for 128 nodes.

Runs the shipped command (``python -m autotune plan STUDY``) as a child process, several
times, and reads each child's CPU time (user + system) from the kernel (``os.wait4``),
so imports, the study file's validation, the ranking and the printing all count, as they
do for a user. Four ways side by side, on the same machine in one run:

* ``no database``: the study has not run (its SQLite file does not exist): nothing is
  opened or imported of the database layer;
* ``with database``: the same study with an (empty) database beside it: the plan opens it
  to calibrate, which loads SQLAlchemy's ORM, Alembic and Optuna's storage;
* ``--scaling weak``: the four sizes 16, 32, 64, 128 nodes, one plan each;
* ``--scaling, with database``: the same beside the (empty) database: each size also reads
  the memory correction its run would start from (``scaling.table``).

The issue's goal (#32): ``autotune plan`` on the 175B study under 2 s of CPU time.

    .venv/bin/python benchmarks/plan_cpu_time.py [--study studies/lrz_gpt175b.yaml] [--runs 5]

``--baseline DIR``: the same commands also in another checkout of the project (e.g.
``git worktree add /tmp/before HEAD~3``), with the same interpreter, interleaved run by run
with this one, and the ratio this / baseline of the medians: a change's effect measured
side by side on the same machine in one run (the child imports ``autotune`` from the
folder it runs in, as ``python -m`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(argv: list[str], root: Path = ROOT) -> float:
    """One child's user + system CPU time, its output discarded (a failure is an error);
    ``root``: the checkout whose ``autotune`` it runs."""
    proc = subprocess.Popen([sys.executable, "-m", "autotune", *argv], cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"autotune {' '.join(argv)} failed:\n{err}")
    return usage.ru_utime + usage.ru_stime


def with_database(study: Path, folder: Path) -> Path:
    """A copy of ``study`` whose storage is an empty database that exists."""
    from autotune.config.storage import StorageConfig
    from autotune.storage import Storage

    data = yaml.safe_load(study.read_text())
    url = f"sqlite:///{folder / 'plan.db'}"
    data["storage"] = {"url": url}
    Storage(StorageConfig(url=url)).close()  # creates the schema, as a first trial would
    copy = folder / study.name
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--study", type=Path, default=ROOT / "studies" / "lrz_gpt175b.yaml")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--baseline", type=Path,
                        help="another checkout of the project, timed side by side")
    args = parser.parse_args(argv)
    study = args.study.resolve()
    baseline = args.baseline.resolve() if args.baseline is not None else None
    if baseline is not None and not (baseline / "autotune" / "__main__.py").is_file():
        parser.error(f"--baseline {args.baseline}: not a checkout of the project (no "
                     "autotune/__main__.py in it)")
    with tempfile.TemporaryDirectory() as tmp:
        with_db = str(with_database(study, Path(tmp)))
        ways = {"no database": ["plan", str(study)],
                "with database": ["plan", with_db],
                "--scaling weak (4 sizes)": ["plan", str(study), "--scaling", "weak",
                                             "--nodes", "16,32,64,128"],
                "--scaling, with database": ["plan", with_db,
                                             "--scaling", "weak", "--nodes", "16,32,64,128"]}
        roots = {"": ROOT, **({"baseline": baseline} if baseline is not None else {})}
        for root in roots.values():
            cpu_seconds(ways["no database"], root)  # byte-compiles, fills the page cache
        times: dict[str, dict[str, list[float]]] = {
            tag: {name: [] for name in ways} for tag in roots}
        for _ in range(args.runs):  # interleaved: a load change hits every way alike
            for name, command in ways.items():
                for tag, root in roots.items():
                    times[tag][name].append(cpu_seconds(command, root))
    print(f"autotune plan {study.name}: CPU seconds (user + system) of the command, "
          f"{args.runs} runs each")
    print(f"{'way':<26} {'median':>7} {'min':>7} {'max':>7}"
          + (f" {'baseline':>9} {'ratio':>6}" if baseline is not None else ""))
    figures = {}
    for name, values in times[""].items():
        figures[name] = {"median_s": statistics.median(values), "min_s": min(values),
                         "max_s": max(values)}
        line = f"{name:<26} {figures[name]['median_s']:7.2f} {min(values):7.2f} " \
               f"{max(values):7.2f}"
        if baseline is not None:
            base = statistics.median(times["baseline"][name])
            figures[name].update(baseline_median_s=base,
                                 ratio=figures[name]["median_s"] / base)
            line += f" {base:9.2f} {figures[name]['ratio']:6.2f}"
        print(line)
    if baseline is not None:
        print(f"baseline: {baseline} (median of {args.runs}); ratio = this / baseline")
    print("goal: the plan under 2 s of CPU time")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
