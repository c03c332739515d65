"""What does a trial's bookkeeping cost through Optuna's gRPC storage proxy, against
autotune's own two transactions? (issue #17: "support it, or show with a measurement why
not")

On a PostgreSQL database of its own, per trial of a replay study (no launch), timed over
``--trials`` trials, the median, and the server's commits (``pg_stat_database.
xact_commit``) per trial:

* ``direct``: what the runner does: :func:`autotune.storage.claim_first` (trial,
  parameters, claim with its lease, measurements row) and
  :func:`~autotune.storage.record_execution` (values, attributes, constraint,
  state, measurement, claim), one transaction each;
* ``optuna_api``: the same trial written through Optuna's storage API on the same
  database (``create_new_trial`` with its parameters, one ``set_trial_user_attr`` per
  attribute, the constraint, ``set_trial_state_values``), one commit per call;
* ``grpc_proxy``: the same calls through ``GrpcStorageProxy`` to an
  ``optuna.storages.run_grpc_proxy_server`` in a thread of this process, on the same
  database.

The proxy serves Optuna's ``BaseStorage`` API only: it cannot hold a claim, its lease and
the trial's creation in one transaction, nor a record's values, attributes, state and
measurement in another, which is what makes a SIGKILL at any instant harmless (docs/hpc.md).
Needs ``grpcio`` and ``protobuf`` (``pip install optuna[grpc]``-style extras).

    python benchmarks/grpc_proxy.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.replay_study import own_pg_database, write_replay_study  # noqa: E402

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pg-url", default=os.environ.get("AUTOTUNE_TEST_PG_URL", DEFAULT_PG))
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _commits(engine: Any, database: str) -> int:
    from sqlalchemy import text

    with engine.connect() as conn:
        conn.execute(text("select pg_stat_clear_snapshot()"))
        return int(conn.execute(text("select xact_commit from pg_stat_database where datname "
                                     "= :d"), {"d": database}).scalar() or 0)


def _measure(name: str, fn: Callable[[int], None], n: int, admin: Any, database: str,
             engines: list[Any]) -> dict[str, Any]:
    """``engines``: whose connections to close before each count (a backend reports its
    commits to pg_stat_database when it exits, an idle one only every 10 s)."""
    def settle() -> int:
        for engine in engines:
            engine.dispose()
        time.sleep(1.5)
        return _commits(admin, database)

    times = []
    before = settle()
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    after = settle()
    return {"mode": name, "trials": n, "ms_per_trial": round(1000 * statistics.median(times), 1),
            "commits_per_trial": round((after - before) / n, 1)}


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    import optuna
    from optuna.trial import FrozenTrial, TrialState
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from autotune.layout import Layout
    from autotune.runner.optuna_io import layout_params, open_study
    from autotune.spec import load_study
    from autotune.storage import (
        CONSTRAINT_ATTR,
        ClaimRequest,
        Refused,
        TrialFacts,
        claim_first,
        measurement_row,
        open_storage,
        record_execution,
        user_attrs,
    )
    from autotune.trial import TrialResult
    from autotune.trial.outcome import Verdict
    from tests.replay_study import table_rows

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        import grpc  # noqa: F401
        from optuna.storages import GrpcStorageProxy, run_grpc_proxy_server
    except ImportError as err:
        print(f"needs grpcio and protobuf: {err}", file=sys.stderr)
        return 2
    admin = create_engine(args.pg_url, isolation_level="AUTOCOMMIT")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, own_pg_database(args.pg_url, "grpc") as url:
        database = str(make_url(url).database)
        spec = load_study(write_replay_study(Path(tmp), name="grpc", url=url,
                                             n_trials=10_000))
        storage = open_storage(spec.storage)
        open_study(spec, storage)
        layouts = [Layout.from_params({"tp": tp, "pp": pp, "micro_batch": mb, "zero_stage": 0,
                                       "recompute": "full"}, world_size=g, global_batch=gb)
                   for g, gb, mb, tp, dp, pp, ms in table_rows()]
        result = TrialResult(status="ok", model_tflops_per_device=20.0, step_time_s=0.1,
                             world_size=64, device="a100")
        now = datetime.now(timezone.utc).replace(tzinfo=None)

        def facts(lay: Layout, trial_id: int, number: int, outcome: Verdict) -> TrialFacts:
            return TrialFacts(study_name=spec.name, trial_number=number, trial_id=trial_id,
                              layout=lay, outcome=outcome, result=result, launcher="replay",
                              worker="bench", started_at=now, finished_at=now, elapsed_s=0.1,
                              hosts=["h"], predicted_tflops_per_device=21.0,
                              predicted_memory_bytes=1e9)

        def row_of(f: TrialFacts) -> dict[str, Any]:
            return measurement_row(f, model=spec.model, cluster=spec.cluster,
                                   global_batch=spec.training.global_batch,
                                   dtype=spec.training.dtype, workload="replay")

        def direct(i: int) -> None:
            lay = layouts[i]
            request = ClaimRequest(lay.key(), layout_params(lay, spec), {"layout": lay.key()},
                                   row_of(facts(lay, 0, 0, Verdict("killed"))))
            got = claim_first(storage, study_name=spec.name, requests=[request],
                              n_trials=10_000, worker="bench")
            assert not isinstance(got, Refused)
            claimed = got[1]
            done = facts(lay, claimed.trial_id, claimed.number, Verdict("complete", 20.0))
            record_execution(storage, trial_id=claimed.trial_id, state=TrialState.COMPLETE,
                             value=20.0, user_attrs=user_attrs(done),
                             system_attrs={CONSTRAINT_ATTR: 0.0}, measurement=row_of(done),
                             retry=False)

        def through(backend: Any, offset: int) -> Callable[[int], None]:
            study_id = backend.get_study_id_from_name(spec.name)

            def one(i: int) -> None:
                lay = layouts[offset + i]
                params = layout_params(lay, spec)
                template = FrozenTrial(
                    number=0, state=TrialState.RUNNING, value=None, datetime_start=now,
                    datetime_complete=None, params={k: v for k, (v, _) in params.items()},
                    distributions={k: d for k, (_, d) in params.items()}, user_attrs={},
                    system_attrs={}, intermediate_values={}, trial_id=0)
                trial_id = backend.create_new_trial(study_id, template_trial=template)
                for key, value in user_attrs(facts(lay, trial_id, 0, Verdict("complete",
                                                                             20.0))).items():
                    backend.set_trial_user_attr(trial_id, key, value)
                backend.set_trial_system_attr(trial_id, CONSTRAINT_ATTR, 0.0)
                backend.set_trial_state_values(trial_id, TrialState.COMPLETE, [20.0])
            return one

        n = min(args.trials, len(layouts) // 3)
        rows.append(_measure("direct", direct, n, admin, database, [storage.engine]))
        rows.append(_measure("optuna_api", through(storage.optuna, n), n, admin, database,
                             [storage.engine]))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        backend = optuna.storages.RDBStorage(url)
        server = threading.Thread(target=run_grpc_proxy_server, daemon=True,
                                  args=(backend,),
                                  kwargs={"host": "127.0.0.1", "port": port})
        server.start()
        time.sleep(1.0)
        proxy = GrpcStorageProxy(host="127.0.0.1", port=port)
        proxy.wait_server_ready(timeout=30)
        rows.append(_measure("grpc_proxy", through(proxy, 2 * n), n, admin, database,
                             [storage.engine, backend.engine]))
        proxy.close()
        storage.close()
    admin.dispose()
    for r in rows:
        print(f"{r['mode']:>11}: {r['ms_per_trial']:>6} ms/trial, {r['commits_per_trial']:>5} "
              f"commits/trial ({r['trials']} trials)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
