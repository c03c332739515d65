"""Schema step 5: the ``measurements`` rows of a study of the user's own program say so.

Up to schema 3 a row's ``workload`` was decided by the launcher alone (``replay`` or
``builtin``), so that a ``command`` or ``megatron-deepspeed`` study stored ``builtin`` and
calibrated the built-in trainer's studies. The study itself knows better: its ``workload``
user attribute (``{"kind": ..., ...}``, written by every run since workloads exist) or,
failing that, its fingerprint's ``workload``. Optuna keeps both as JSON text in
``study_user_attributes`` (Optuna's ``models.py``: ``StudyUserAttributeModel``), read here
in Python so that one statement serves SQLite, PostgreSQL and MySQL alike.
"""

from __future__ import annotations

import json

from sqlalchemy import text
from sqlalchemy.engine import Connection

__all__ = ["relabel_workloads", "study_workload_kinds"]

_KINDS = ("command", "megatron-deepspeed")
"""The labels a ``builtin`` row may be wrong about (``replay`` rows were always right)."""


def study_workload_kinds(conn: Connection) -> dict[str, str]:
    """Study name -> the workload kind its user attributes record (studies that record
    one of :data:`_KINDS`)."""
    rows = conn.execute(text(
        "SELECT s.study_name, a.key, a.value_json FROM studies s JOIN study_user_attributes a "
        "ON a.study_id = s.study_id WHERE a.key IN ('workload', 'fingerprint')")).all()
    found: dict[str, dict[str, str]] = {}
    for name, key, value in rows:
        try:
            record = json.loads(value)
        except (TypeError, ValueError):
            continue
        kind = record.get("kind" if key == "workload" else "workload") \
            if isinstance(record, dict) else None
        if isinstance(kind, str):
            found.setdefault(name, {})[key] = kind
    kinds = {name: by.get("workload", by.get("fingerprint", "")) for name, by in found.items()}
    return {name: kind for name, kind in kinds.items() if kind in _KINDS}


def relabel_workloads(conn: Connection) -> int:
    """Give each ``builtin`` row of a study of the user's own program its study's workload
    kind (replayed rows stay ``replay``); returns the rows changed."""
    changed = 0
    for name, kind in study_workload_kinds(conn).items():
        done = conn.execute(text(
            "UPDATE measurements SET workload = :kind WHERE study_name = :name "
            "AND workload = 'builtin' AND launcher <> 'replay'"), {"kind": kind, "name": name})
        changed += done.rowcount or 0
    return changed
