"""Many workers on one study: do more workers finish sooner, store no junk, stay within the
server's connections? (issue #17)

One replay study (trials cost nothing: what is measured is the runner and the database;
206 layouts, budget 200) run by 1, 16 and 64 ``autotune run`` processes on PostgreSQL in
a database of its own on the server's default ``max_connections``, and by 8 on SQLite,
side by side. Per row: wall time (first start to last exit), failed workers (non-zero
exit), stored trials per measured layout (every trial in the study over the distinct
COMPLETE layouts; 1.0 is no junk), peak connections to the study's database
(``pg_stat_activity``, polled every 0.1 s) and per worker.

Goal at 64 workers: 0 failed, <= 1.1 trials per layout, <= 2 connections per worker, wall
time no worse than 1 worker's. Nothing is asserted.

    python benchmarks/many_workers.py                       # PG 1, 16, 64 and SQLite 8
    python benchmarks/many_workers.py --rows pg:1,pg:64 --json out.json
    python benchmarks/many_workers.py --pg-url postgresql+psycopg://postgres@127.0.0.1/test

Workers are separate processes, started at once (``--start exec``: each pays Python's and
autotune's import, as a job array's would; ``--start fork``: forked from this process
after the imports, to see the loop alone; ``--start exec,fork``: both, row by row: the
figure with and without interpreter start-up). The start-up itself is measured first: one
interpreter importing what ``autotune run`` of a replay study imports (wall and CPU
seconds), and each ``exec`` row states the share of its wall time that ``workers`` such
start-ups take on this machine's cores (``startup_share``; issue 23).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.replay_study import own_pg_database, write_replay_study  # noqa: E402

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
N_TRIALS = 200
NODES = 32  # 206 layouts


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="pg:1,pg:16,pg:64,sqlite:8",
                   help="BACKEND:WORKERS,... (backend pg or sqlite)")
    p.add_argument("--pg-url", default=os.environ.get("AUTOTUNE_TEST_PG_URL", DEFAULT_PG),
                   help="a server to create the study's own database on")
    p.add_argument("--n-trials", type=int, default=N_TRIALS)
    p.add_argument("--start", default="exec", help="exec, fork or exec,fork (both)")
    p.add_argument("--timeout", type=float, default=900, help="per row, seconds")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="cProfile every worker into DIR/ROW-N.prof (exec: python -m "
                        "cProfile; fork: cProfile around the run) and print the top "
                        "functions of the first worker of each row")
    return p.parse_args(argv)


class _ConnectionPoll:
    """Peak connections to one PostgreSQL database, polled in a thread, and the CPU seconds
    its server processes used (``/proc/PID/stat`` of each backend, last seen before it
    exits; a server on this machine only): on a loaded machine CPU seconds compare runs
    that wall time cannot."""

    def __init__(self, admin_url: str, database: str) -> None:
        from sqlalchemy import create_engine

        self.engine = create_engine(admin_url, pool_size=1, max_overflow=0)
        self.database, self.peak = database, 0
        self._ticks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from sqlalchemy import text

        with self.engine.connect() as conn:
            while not self._stop.wait(0.1):
                pids = [int(p) for p in conn.execute(text(
                    "select pid from pg_stat_activity where datname = :d"),
                    {"d": self.database}).scalars()]
                self.peak = max(self.peak, len(pids))
                conn.commit()
                for pid in pids:
                    self._ticks[pid] = max(self._ticks.get(pid, 0), _cpu_ticks(pid))

    @property
    def server_cpu_s(self) -> float:
        return sum(self._ticks.values()) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> _ConnectionPoll:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.engine.dispose()


def _cpu_ticks(pid: int) -> int:
    """User + system clock ticks of a process so far (0 if gone or not on this machine)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime (proc(5) fields 14, 15)
    except (OSError, IndexError, ValueError):
        return 0


def _children_cpu_s() -> float:
    import resource

    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


STARTUP_IMPORTS = ("autotune.cli", "autotune.runner.study", "autotune.runner.progress",
                   "autotune.launchers", "autotune.launchers.replay", "autotune.spec",
                   "autotune.storage.db")
"""What a replay worker imports before its first query (``python -X importtime -m autotune
run STUDY`` lists it: Optuna, SQLAlchemy, Alembic, NumPy, PyYAML; no torch)."""


def measure_startup(repeat: int = 3) -> dict[str, float]:
    """Median wall and CPU seconds of one interpreter importing :data:`STARTUP_IMPORTS`."""
    import resource
    import statistics

    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code = "; ".join(f"import {m}" for m in STARTUP_IMPORTS)
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        walls.append(time.monotonic() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return {"startup_wall_s": round(statistics.median(walls), 2),
            "startup_cpu_s": round(statistics.median(cpus), 2)}


def uncompiled_modules() -> list[str]:
    """autotune's modules without current bytecode: where PYTHONDONTWRITEBYTECODE is set,
    each worker compiles them again (``scripts/setup.sh`` compiles them; a module edited
    since is not), which a job array's task on an installed autotune never does."""
    import importlib.util

    stale = []
    for source in sorted((REPO / "autotune").rglob("*.py")):
        cached = Path(importlib.util.cache_from_source(str(source)))
        if not cached.exists() or cached.stat().st_mtime < source.stat().st_mtime:
            stale.append(str(source.relative_to(REPO)))
    return stale


def _fork_worker(study: str, profile: str | None) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")
    from autotune.cli import main

    if profile is None:
        os._exit(main(["run", study, "--quiet"]))
    import cProfile

    prof = cProfile.Profile(time.process_time)  # CPU, not wall: 64 workers share 2 cores
    code = prof.runcall(main, ["run", study, "--quiet"])
    prof.dump_stats(profile)
    os._exit(code)


def _run_workers(study: Path, n: int, start: str, timeout: float,
                 profile: str | None = None) -> tuple[float, list[int], list[str], float]:
    """Wall time, exit codes, last error lines and CPU seconds (user + system, all of
    them together) of ``n`` workers; with ``profile`` (a
    path prefix), worker ``i`` writes its cProfile stats to ``{profile}-{i}.prof``."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.monotonic()
    cpu0 = _children_cpu_s()
    if start == "fork":
        import importlib

        for module in STARTUP_IMPORTS:  # before the fork: each worker starts imported
            importlib.import_module(module)
        fork = multiprocessing.get_context("fork")
        procs = [fork.Process(target=_fork_worker, args=(
            str(study), f"{profile}-{i}.prof" if profile else None)) for i in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
        return time.monotonic() - t0, [p.exitcode if p.exitcode is not None else -1
                                       for p in procs], [], _children_cpu_s() - cpu0
    popen = [subprocess.Popen([sys.executable, *(["-m", "cProfile", "-o", f"{profile}-{i}.prof"]
                                                  if profile else []),
                               "-m", "autotune", "run", str(study), "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
             for i in range(n)]
    codes, errors = [], []
    for w in popen:
        try:
            _, err = w.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            w.kill()
            _, err = w.communicate()
        codes.append(w.returncode)
        if w.returncode != 0:
            errors.append((err or b"").decode(errors="replace").strip().splitlines()[-1:][0]
                          if err else f"exit {w.returncode}")
    return time.monotonic() - t0, codes, errors, _children_cpu_s() - cpu0


def _study_counts(url: str, name: str) -> dict[str, Any]:
    import optuna
    from optuna.trial import TrialState

    trials = optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)
    layouts = {t.user_attrs.get("layout") for t in trials if t.state == TrialState.COMPLETE}
    return {"stored_trials": len(trials), "measured_layouts": len(layouts),
            "running": sum(t.state == TrialState.RUNNING for t in trials),
            "trials_per_layout": round(len(trials) / len(layouts), 3) if layouts else None}


def run_row(backend: str, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="many-workers-") as tmp:
        directory = Path(tmp)
        row: dict[str, Any] = {"backend": backend, "workers": workers}
        profile = _profile_prefix(args, backend, workers)
        if backend == "sqlite":
            url = f"sqlite:///{directory / 'study.db'}"
            study = write_replay_study(directory, name="many", url=url,
                                       n_trials=args.n_trials, heartbeat_s=5, grace_s=60,
                                       nodes=NODES)
            wall, codes, errors, cpu = _run_workers(study, workers, args.start, args.timeout,
                                               profile)
            row["peak_connections"] = None
        else:
            from sqlalchemy import create_engine, text
            from sqlalchemy.engine import make_url

            engine = create_engine(args.pg_url)
            with engine.connect() as conn:
                row["max_connections"] = int(conn.execute(text("show max_connections"))
                                             .scalar() or 0)
            engine.dispose()
            with own_pg_database(args.pg_url, "many_workers") as url:
                study = write_replay_study(directory, name="many", url=url,
                                           n_trials=args.n_trials, heartbeat_s=5, grace_s=60,
                                           nodes=NODES)
                with _ConnectionPoll(args.pg_url, str(make_url(url).database)) as poll:
                    wall, codes, errors, cpu = _run_workers(study, workers, args.start,
                                                       args.timeout, profile)
                row.update(_study_counts(url, "many"))
                row["peak_connections"] = poll.peak
                row["server_cpu_s"] = round(poll.server_cpu_s, 1)
        if backend == "sqlite":
            row.update(_study_counts(url, "many"))
        row["wall_s"] = round(wall, 1)
        row["worker_cpu_s"] = round(cpu, 1)
        row["load_average"] = round(os.getloadavg()[0], 1)
        row["failed_workers"] = sum(c != 0 for c in codes)
        row["errors"] = sorted(set(errors))[:5]
        peak = row.get("peak_connections")
        row["connections_per_worker"] = round(peak / workers, 2) if peak else None
        return row


def _profile_prefix(args: argparse.Namespace, backend: str, workers: int) -> str | None:
    if args.profile is None:
        return None
    Path(args.profile).mkdir(parents=True, exist_ok=True)
    return str(Path(args.profile) / f"{backend}{workers}-{args.start}")


def _print_profile(prefix: str, top: int = 25) -> None:
    """The first worker's most expensive functions (cumulative), for where the loop goes."""
    import pstats

    path = Path(f"{prefix}-0.prof")
    if not path.exists():
        print(f"(no profile at {path})")
        return
    stats = pstats.Stats(str(path))
    print(f"profile of worker 0: {path} ({stats.total_tt:.1f} s CPU)")  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    starts = args.start.split(",")
    if not starts or any(s not in ("exec", "fork") for s in starts):
        print(f"--start: got {args.start!r}; allowed: exec, fork or exec,fork", file=sys.stderr)
        return 2
    startup = measure_startup()
    cores = os.cpu_count() or 1
    print(f"start-up of one worker: {startup['startup_wall_s']} s wall, "
          f"{startup['startup_cpu_s']} s CPU ({cores} cores; load average "
          f"{os.getloadavg()[0]:.1f})", flush=True)
    stale = uncompiled_modules()
    if stale and os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print(f"warning: {len(stale)} of autotune's modules have no current bytecode and "
              f"PYTHONDONTWRITEBYTECODE is set: every worker compiles them (e.g. "
              f"{stale[0]}); run scripts/setup.sh (python -m compileall autotune) first",
              flush=True)
    startup["uncompiled_modules"] = len(stale)
    rows = []
    for item in args.rows.split(","):
        backend, _, n = item.partition(":")
        if backend not in ("pg", "sqlite") or not n.isdigit():
            print(f"--rows: got {item!r}; allowed: pg:N or sqlite:N", file=sys.stderr)
            return 2
        for start in starts:
            args.start = start
            row = {**run_row(backend, int(n), args), "start": start}
            if start == "exec":
                row["startup_share"] = round(min(1.0, int(n) * startup["startup_cpu_s"]
                                                 / cores / row["wall_s"]), 2)
            rows.append(row)
            _print_row(row)
            prefix = _profile_prefix(args, backend, int(n))
            if prefix is not None:
                _print_profile(prefix)
    header = ["backend", "workers", "start", "wall_s", "worker_cpu_s", "server_cpu_s",
              "load_average", "startup_share", "failed_workers",
              "trials_per_layout", "stored_trials", "measured_layouts", "peak_connections",
              "connections_per_worker"]
    print("\n" + " | ".join(header))
    for r in rows:
        print(" | ".join(str(r.get(h)) for h in header))
    if args.json:
        Path(args.json).write_text(json.dumps({"n_trials": args.n_trials, "start": starts,
                                               **startup, "rows": rows}, indent=2))
    return 0


def _print_row(r: dict[str, Any]) -> None:
    print(f"{r['backend']:>6} {r['workers']:>3} workers ({r['start']}): "
          f"{r['wall_s']:>7.1f} s, "
          f"{r['failed_workers']} failed, {r['trials_per_layout']} trials/layout "
          f"({r['stored_trials']} stored, {r['measured_layouts']} measured), peak "
          f"connections {r['peak_connections']} ({r['connections_per_worker']}/worker); "
          f"CPU {r['worker_cpu_s']} s workers, {r.get('server_cpu_s')} s server; load "
          f"{r['load_average']}"
          + (f", start-up {r['startup_share']:.0%} of it" if "startup_share" in r else "")
          + (f"; errors: {r['errors']}" if r["errors"] else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main())
