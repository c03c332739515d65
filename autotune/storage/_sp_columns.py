"""Schema step 4: ``measurements.recompute`` holds ``selective`` (9 characters;
it was ``VARCHAR(8)``) and ``measurements.sequence_parallel`` exists.

Each statement checks what exists first, as every step of
:meth:`autotune.storage.db.Storage._migrate` does: workers opening one database at once
may race through it. Widening a ``VARCHAR`` keeps the values; SQLite does not enforce a
``VARCHAR`` length (https://www.sqlite.org/datatype3.html, 3.1: "SQLite does not enforce
the length of a VARCHAR"), so it needs only the new column there.
"""

from __future__ import annotations

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

__all__ = ["widen_recompute_add_sequence_parallel", "RECOMPUTE_WIDTH"]

RECOMPUTE_WIDTH = 16
"""Characters of ``measurements.recompute`` from version 4 (``selective`` is 9)."""


def widen_recompute_add_sequence_parallel(engine: Engine) -> None:
    """Bring a version-3 ``measurements`` table to version 4 (idempotent)."""
    columns = {c["name"]: c for c in inspect(engine).get_columns("measurements")}
    dialect = engine.dialect.name
    with engine.begin() as conn:
        width = getattr(columns["recompute"]["type"], "length", None)
        if dialect != "sqlite" and (width is None or width < RECOMPUTE_WIDTH):
            if dialect == "postgresql":
                ddl = f"ALTER COLUMN recompute TYPE VARCHAR({RECOMPUTE_WIDTH})"
            else:  # MySQL / MariaDB: MODIFY restates the whole column
                ddl = f"MODIFY recompute VARCHAR({RECOMPUTE_WIDTH}) NOT NULL"
            conn.execute(text(f"ALTER TABLE measurements {ddl}"))
        if "sequence_parallel" not in columns:
            # FALSE: a boolean literal on PostgreSQL, 0 on MySQL and SQLite (>= 3.23).
            conn.execute(text("ALTER TABLE measurements ADD COLUMN sequence_parallel "
                              "BOOLEAN NOT NULL DEFAULT FALSE"))
