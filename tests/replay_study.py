"""A replay study for the robustness tests and ``benchmarks/many_workers.py``: trials cost
nothing, so what is exercised is the runner and the database.

The table is synthetic (vTrain's column format; 8 nodes of 8 A100s at global batch 256 by
default, 161 layouts; 206 on 32 nodes at 1024: every tp x pp x micro-batch that divides),
its step times a smooth function of the layout; nothing is fitted to it.
``own_pg_database`` and ``own_mysql_database`` make a database for one test or benchmark
(a newer schema must never touch the shared ``test`` database).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import yaml

HEADER = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
          "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n")


def table_rows(nodes: int = 8) -> list[tuple[int, int, int, int, int, int, float]]:
    """``(gpus, global batch, micro batch, tp, dp, pp, ms)`` of the table's layouts."""
    gpus, gb = 8 * nodes, 32 * nodes
    rows = []
    for tp in (1, 2, 4, 8, 16):
        for pp in (1, 2, 4, 8, 16, 32):
            dp = gpus // (tp * pp)
            if dp < 1:
                continue
            for mb in (1, 2, 4, 8, 16, 32, 64, 128, 256):
                if mb * dp > gb:
                    continue
                ms = 100.0 + 7.0 * tp + 11.0 * pp + 5.0 * abs(mb - 4) + 0.5 * dp
                rows.append((gpus, gb, mb, tp, dp, pp, ms))
    return rows


def write_replay_study(directory: Path, *, name: str, url: str, n_trials: int,
                       heartbeat_s: int = 1, grace_s: int = 3, seed: int = 0,
                       strategy: str = "default", nodes: int = 8) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"{g},{gb},{mb},1024,16,32,1024,{tp},{dp},{pp},{ms}"
             for g, gb, mb, tp, dp, pp, ms in table_rows(nodes)]
    (directory / "table.csv").write_text(HEADER + "\n".join(lines) + "\n")
    study: dict[str, Any] = {
        "name": name,
        "model": {"n_layer": 32, "hidden": 1024, "n_head": 16, "seq_len": 1024,
                  "vocab_size": 51200, "attention": "explicit", "name": "replay-350m"},
        "cluster": {"nodes": nodes, "devices_per_node": 8, "device": "a100-80gb"},
        "training": {"global_batch": 32 * nodes, "dtype": "bf16"},
        # confirm 0: these tests and benchmarks count the search's trials and launches
        # (the confirmation round has its own: tests/runner/test_confirm.py)
        "search": {"strategy": strategy, "seed": seed, "n_trials": n_trials, "confirm": 0},
        "storage": {"url": url, "heartbeat_interval_s": heartbeat_s, "grace_period_s": grace_s},
        "launcher": {"kind": "replay", "run_dir": str(directory / "runs"),
                     "replay": {"landscape": str(directory / "table.csv")}},
    }
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


@contextmanager
def _own_database(url: str, prefix: str, quote: str, drop_suffix: str,
                  **engine_kw: object) -> Iterator[str]:
    """A fresh database on ``url``'s server, dropped afterwards (each backend quotes and
    forces the drop its own way)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT", **engine_kw)
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {quote}{name}{quote}"))
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {quote}{name}{quote}{drop_suffix}"))
        admin.dispose()


def own_pg_database(pg_url: str, prefix: str = "robust") -> AbstractContextManager[str]:
    """A fresh PostgreSQL database on ``pg_url``'s server, dropped afterwards."""
    # pre_ping: the fault tests restart the server under it (tests/faults)
    return _own_database(pg_url, prefix, '"', " WITH (FORCE)", pool_pre_ping=True)


def own_mysql_database(mysql_url: str, prefix: str = "autotune") -> AbstractContextManager[str]:
    """A fresh MySQL/MariaDB database on ``mysql_url``'s server, dropped afterwards."""
    return _own_database(mysql_url, prefix, "`", "")
