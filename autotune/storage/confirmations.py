"""A study's confirmation round in the database: claimed with a lease, resumed, recorded.

The same mechanism as a layout's claim (:mod:`autotune.storage.claims`): under the study's
row lock one transaction checks the round's claim and writes it with its lease; the
worker's heartbeat renews the lease; a round whose lease ran out (or whose runner was a
process of this host that no longer exists) is taken over by the next worker, which keeps
the rounds already stored and goes on. The round's row names its holder: the runner it
was taken from finds its renewal refused at its next heartbeat, and every write it would
still make (a round, the release, the verdict) is refused the same way. No Optuna trial is
created: a killed confirmation round leaves no RUNNING trial, only a claim whose lease runs
out.

Each round is stored in one transaction (all its runs, the round's cost), so a kill leaves
whole rounds only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update

from autotune.storage import _optuna_rdb as rdb
from autotune.storage.leases import Lease, dead_here, utcnow
from autotune.storage.schema import Confirmation, ConfirmationRun

if TYPE_CHECKING:
    from autotune.storage.db import Storage

__all__ = ["ConfirmClaimed", "ConfirmRefused", "claim_confirmation", "confirmation_lease",
           "renew_confirmation",
           "release_confirmation", "record_round", "finish_confirmation", "stored_runs",
           "decided_record", "unfinished_line", "confirmation_cost", "ConfirmationCost",
           "RUN_COLUMNS"]

RUN_COLUMNS = ("round", "slot", "layout_key", "trial_number", "outcome", "reason",
               "model_tflops_per_device", "step_time_s", "measure_precision", "elapsed_s",
               "world_size", "launcher", "worker", "run_dir")


@dataclass(frozen=True)
class ConfirmClaimed:
    id: int
    launches: int
    """Launches (and device-seconds) its earlier runners spent, when resumed."""
    device_s: float
    resumed: bool


class ConfirmRefused(Enum):
    DONE = "done"
    """This round (these candidates) was decided already."""
    TAKEN = "taken"
    """Another live worker runs it."""
    NO_STUDY = "no-study"


def claim_confirmation(storage: Storage, *, study_name: str, basis: str,
                       worker: str) -> ConfirmClaimed | ConfirmRefused:
    """Claim the confirmation round of ``basis`` (its candidates) for ``worker``."""
    now = utcnow()
    lease = now + timedelta(seconds=storage.config.grace_period_s)
    with storage.session() as s:
        study_id = rdb.study_id_of(s, study_name)
        if study_id is None:
            return ConfirmRefused.NO_STUDY
        rdb.lock_study(s, study_id)
        row = s.scalars(select(Confirmation).where(
            Confirmation.study_name == study_name, Confirmation.basis == basis)
            .with_for_update()).first()
        if row is None:
            row = Confirmation(study_name=study_name, basis=basis, worker=worker,
                               created_at=now, lease_until=lease, state="running",
                               launches=0, device_s=0.0)
            s.add(row)
            s.flush()
            return ConfirmClaimed(row.id, 0, 0.0, resumed=False)
        if row.state == "done":
            return ConfirmRefused.DONE
        alive = (row.lease_until is not None and row.lease_until >= now
                 and not dead_here(row.worker))
        if alive and row.worker != worker:
            return ConfirmRefused.TAKEN
        row.worker, row.lease_until = worker, lease
        return ConfirmClaimed(row.id, row.launches, row.device_s, resumed=True)


def confirmation_lease(storage: Storage, confirmation_id: int,
                       worker: str | None = None) -> Lease:
    """The round's lease (the same :class:`~autotune.storage.leases.Lease` as a claim's);
    ``worker``: its holder, whose renewal is refused once another worker claimed the round
    (a takeover keeps the row, so the lease alone would still renew)."""
    return Lease(storage, Confirmation, Confirmation.id, confirmation_id,
                 "the confirmation round",
                 holder=None if worker is None else (Confirmation.worker, worker))


def renew_confirmation(storage: Storage, confirmation_id: int,
                       worker: str | None = None) -> bool:
    return confirmation_lease(storage, confirmation_id, worker).renew()


def _held_by(worker: str | None) -> list[Any]:
    """The condition that the round is still ``worker``'s (none without a worker): a
    runner whose round was taken over writes nothing into its new holder's row."""
    return [] if worker is None else [Confirmation.worker == worker]


def release_confirmation(storage: Storage, confirmation_id: int,
                         worker: str | None = None) -> bool:
    """Give the round up unfinished (Ctrl-C, SIGTERM): the next run goes on at once.
    ``False``: not ``worker``'s any more (nothing changed)."""
    with storage.session() as s:
        done = s.execute(update(Confirmation).where(
            Confirmation.id == confirmation_id, Confirmation.state == "running",
            *_held_by(worker)).values(lease_until=None))
    return getattr(done, "rowcount", 0) == 1


def record_round(storage: Storage, confirmation_id: int, *, study_name: str,
                 runs: Sequence[Mapping[str, Any]], launches: int, device_s: float,
                 worker: str | None = None) -> bool:
    """One round's runs (:data:`RUN_COLUMNS`) and its cost, in one transaction;
    ``False`` (nothing written) when the round is not ``worker``'s any more."""
    now = utcnow()
    with storage.session() as s:
        row = s.get(Confirmation, confirmation_id, with_for_update=True)
        if row is None or (worker is not None and row.worker != worker):
            return False
        for run in runs:
            s.add(ConfirmationRun(confirmation_id=confirmation_id, study_name=study_name,
                                  finished_at=now, **{k: run.get(k) for k in RUN_COLUMNS}))
        row.launches += launches
        row.device_s += device_s
    return True


def finish_confirmation(storage: Storage, confirmation_id: int,
                        decision: Mapping[str, Any], worker: str | None = None) -> bool:
    """Store the verdict; ``False`` (nothing written) when the round is not ``worker``'s
    any more: its new holder decides it."""
    with storage.session() as s:
        done = s.execute(update(Confirmation).where(
            Confirmation.id == confirmation_id, *_held_by(worker))
            .values(state="done", lease_until=None, decision_json=json.dumps(dict(decision))))
    return getattr(done, "rowcount", 0) == 1


def stored_runs(storage: Storage, confirmation_id: int) -> list[dict[str, Any]]:
    """The round's runs stored so far, in order."""
    cols = [getattr(ConfirmationRun, c) for c in RUN_COLUMNS]
    with storage.session() as s:
        rows = s.execute(select(*cols).where(
            ConfirmationRun.confirmation_id == confirmation_id)
            .order_by(ConfirmationRun.round, ConfirmationRun.slot)).all()
    return [dict(zip(RUN_COLUMNS, r, strict=True)) for r in rows]


def decided_record(storage: Storage, study_name: str, basis: str) -> dict[str, Any] | None:
    """The verdict stored when the round of ``basis`` was decided (``None``: not yet)."""
    with storage.session() as s:
        text = s.scalar(select(Confirmation.decision_json).where(
            Confirmation.study_name == study_name, Confirmation.basis == basis,
            Confirmation.state == "done"))
    found = json.loads(text) if text else None
    return found if isinstance(found, dict) else None


def unfinished_line(storage: Storage, study_name: str) -> str | None:
    """A round begun and not decided, in words (for ``autotune status``), else ``None``."""
    now = utcnow()
    with storage.session() as s:
        row = s.execute(select(Confirmation.id, Confirmation.worker, Confirmation.lease_until)
                        .where(Confirmation.study_name == study_name,
                               Confirmation.state == "running")
                        .order_by(Confirmation.id.desc())).first()
        if row is None:
            return None
        rounds = len({r for (r,) in s.execute(select(ConfirmationRun.round).where(
            ConfirmationRun.confirmation_id == row.id))})
    live = row.lease_until is not None and row.lease_until >= now and not dead_here(row.worker)
    return (f"running in {row.worker}, {rounds} round(s) stored" if live else
            f"unfinished, {rounds} round(s) stored; the next `autotune run` goes on")


@dataclass(frozen=True)
class ConfirmationCost:
    """What a study's confirmation rounds spent, all of them (each set of candidates)."""

    runs: int
    launches: int
    device_s: float
    wall_s: float
    """Its runs' elapsed time, summed (a batch's launch split between its runs)."""


def confirmation_cost(storage: Storage, study_name: str) -> ConfirmationCost:
    """The study's confirmation rounds' cost, for the report's tuning cost."""
    with storage.session() as s:
        launches, device_s = s.execute(select(
            func.coalesce(func.sum(Confirmation.launches), 0),
            func.coalesce(func.sum(Confirmation.device_s), 0.0))
            .where(Confirmation.study_name == study_name)).one()
        runs, wall = s.execute(select(func.count(ConfirmationRun.id),
                                      func.coalesce(func.sum(ConfirmationRun.elapsed_s), 0.0))
                               .where(ConfirmationRun.study_name == study_name)).one()
    return ConfirmationCost(int(runs or 0), int(launches or 0), float(device_s or 0.0),
                            float(wall or 0.0))
