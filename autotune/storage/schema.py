"""autotune's own tables, beside Optuna's in the same database.

``measurements``: one row per trial execution, failures included, with the layout, every
metric of the result, the outcome and its reason, hosts, versions and timestamps — so
that all measurements of one device type can be queried across studies with pandas::

    pd.read_sql("select * from measurements where device_type = 'max1550-tile'", engine)

``layout_claims``: which trial owns a layout in a study. A unique key makes "measure each
layout once" hold across concurrent workers on any backend.

``autotune_schema``: the schema version this package created; see :data:`SCHEMA_VERSION`.

Version history (each step a migration in :mod:`autotune.storage.db`):

1. the tables above;
2. ``measurements.workload``: what ran the trial (``builtin``: the built-in trainer;
   ``replay``: a replayed table), part of the calibration key with the device type and
   the dtype (:mod:`autotune.models.calibration`). Rows of version 1 get ``replay`` where
   their launcher was the replay launcher, ``builtin`` otherwise;
3. ``layout_claims.lease_until``, ``attempts``, ``retry``: a claim is made in
   the transaction that creates its trial and carries a lease until its result is
   recorded, so that a runner killed at any instant leaves a trial the next run repairs
   (:mod:`autotune.storage.claims`); ``retry`` marks a claim whose execution was cut short
   (killed, interrupted), ``attempts`` counts its executions. Every execution has its
   ``measurements`` row from the claim on (outcome ``running`` until it is recorded, or
   ``killed`` when it is repaired). Claims of version 2 whose trial failed unjudged or
   interrupted get ``retry`` = 1;
4. ``measurements.recompute`` widened to 16 characters (``selective`` has 9)
   and ``measurements.sequence_parallel`` (boolean, false for every earlier row: nothing
   ran with sequence parallelism before it existed);
5. ``measurements.workload`` says what ran (``builtin``, ``command``,
   ``megatron-deepspeed``, ``replay``): before, a study of the user's own program stored
   ``builtin`` (the launcher alone decided it), so that it calibrated, and was calibrated
   by, studies of the built-in trainer. Rows of version 3 labelled ``builtin`` get their
   study's own workload kind (its ``workload`` user attribute, else its fingerprint's);
6. ``measurements.energy_j_per_step``, ``energy_source``, ``joules_per_token``,
   ``model_tflops_per_watt``: a trial's energy where a counter measured it
   (:mod:`trainer.energy`, :mod:`autotune.energy`), ``NULL`` where none did (never 0).
   Older rows get ``NULL``: they were not measured;
7. ``confirmations`` and ``confirmation_runs``: the confirmation round of a
   study (:mod:`autotune.runner.confirm`) and each of its runs. Kept out of
   ``measurements`` and ``layout_claims`` on purpose: a confirmation run re-measures a
   layout already tried, so it is no new trial of the budget (the claims count those) and
   no new point of the calibration (which reads ``measurements``). Older databases simply
   get the two empty tables;
8. ``measurements.model_version``: which version of the cost and memory models made the
   row's predictions (:func:`autotune.models.version.model_version`); the warm start
   leaves out rows of another version. Older rows get ``NULL`` and are kept, as before.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.expression import false

__all__ = ["Base", "Measurement", "LayoutClaim", "SchemaVersion", "SCHEMA_VERSION",
           "ENERGY_COLUMNS", "Confirmation", "ConfirmationRun"]

SCHEMA_VERSION = 8
"""Bump with a migration in :mod:`autotune.storage.db` when a table changes."""


class Base(DeclarativeBase):
    pass


class Measurement(Base):
    __tablename__ = "measurements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_name: Mapped[str] = mapped_column(String(128), index=True)
    trial_number: Mapped[int] = mapped_column(Integer)
    trial_id: Mapped[int] = mapped_column(Integer, index=True)
    layout_key: Mapped[str] = mapped_column(String(96), index=True)
    tp: Mapped[int] = mapped_column(Integer)
    pp: Mapped[int] = mapped_column(Integer)
    dp: Mapped[int] = mapped_column(Integer)
    micro_batch: Mapped[int] = mapped_column(Integer)
    grad_accum: Mapped[int] = mapped_column(Integer)
    zero_stage: Mapped[int] = mapped_column(Integer)
    recompute: Mapped[str] = mapped_column(String(16))
    """``none``, ``selective`` or ``full`` (:data:`autotune.layout.RECOMPUTE_CHOICES`)."""
    sequence_parallel: Mapped[bool] = mapped_column(Boolean, default=False,
                                                    server_default=false())
    world_size: Mapped[int] = mapped_column(Integer)
    global_batch: Mapped[int] = mapped_column(Integer)
    model_name: Mapped[str] = mapped_column(String(64))
    n_layer: Mapped[int] = mapped_column(Integer)
    hidden: Mapped[int] = mapped_column(Integer)
    n_head: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int] = mapped_column(Integer)
    vocab_size: Mapped[int] = mapped_column(Integer)
    n_params: Mapped[int] = mapped_column(Float)  # > 2**31 for large models
    device_type: Mapped[str] = mapped_column(String(32), index=True)
    nodes: Mapped[int] = mapped_column(Integer)
    devices_per_node: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(8))
    workload: Mapped[str] = mapped_column(String(64), default="builtin",
                                          server_default="builtin")
    """What ran the trial: ``builtin`` (:data:`autotune.models.calibration.BUILTIN_WORKLOAD`),
    ``command``, ``megatron-deepspeed`` or ``replay``."""
    outcome: Mapped[str] = mapped_column(String(16), index=True)
    status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    model_tflops_per_device: Mapped[float | None] = mapped_column(Float, nullable=True)
    hardware_tflops_per_device: Mapped[float | None] = mapped_column(Float, nullable=True)
    mfu: Mapped[float | None] = mapped_column(Float, nullable=True)
    step_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    step_time_iqr_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_memory_bytes: Mapped[float | None] = mapped_column(Float, nullable=True)
    predicted_memory_bytes: Mapped[float | None] = mapped_column(Float, nullable=True)
    predicted_tflops_per_device: Mapped[float | None] = mapped_column(Float, nullable=True)
    elapsed_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    launcher: Mapped[str] = mapped_column(String(16))
    hosts: Mapped[str | None] = mapped_column(Text, nullable=True)
    versions: Mapped[str | None] = mapped_column(Text, nullable=True)
    result_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    worker: Mapped[str | None] = mapped_column(String(128), nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    energy_j_per_step: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Joules per optimizer step over the trial's devices; ``NULL``: not measured."""
    energy_source: Mapped[str | None] = mapped_column(String(32), nullable=True)
    joules_per_token: Mapped[float | None] = mapped_column(Float, nullable=True)
    model_tflops_per_watt: Mapped[float | None] = mapped_column(Float, nullable=True)
    model_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    """:func:`autotune.models.version.model_version` of the models that made the row's
    predictions; ``NULL``: written before autotune recorded it (schema v8)."""


ENERGY_COLUMNS = (("energy_j_per_step", "FLOAT"), ("energy_source", "VARCHAR(32)"),
                  ("joules_per_token", "FLOAT"), ("model_tflops_per_watt", "FLOAT"))
"""The columns schema v6 added, with their DDL types (the migration's)."""


class LayoutClaim(Base):
    __tablename__ = "layout_claims"
    __table_args__ = (UniqueConstraint("study_name", "layout_key", name="uq_claim_layout"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_name: Mapped[str] = mapped_column(String(128), index=True)
    layout_key: Mapped[str] = mapped_column(String(96))
    trial_id: Mapped[int] = mapped_column(Integer)
    worker: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    lease_until: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    """Until when the trial is alive without another heartbeat (naive UTC); ``None`` once
    its result is recorded or it was repaired."""
    attempts: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    """Executions of the layout so far (a retry adds one)."""
    retry: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """1: its last execution was cut short (killed, interrupted); the next worker re-runs
    it within the budget."""


class Confirmation(Base):
    """A study's confirmation round: claimed with a lease like a layout (one worker runs
    it), resumed by the next run when its runner died (:mod:`autotune.storage.
    confirmations`)."""

    __tablename__ = "confirmations"
    __table_args__ = (UniqueConstraint("study_name", "basis", name="uq_confirmation_basis"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_name: Mapped[str] = mapped_column(String(128), index=True)
    basis: Mapped[str] = mapped_column(String(255))
    """The candidates' trial numbers, comma-separated: a new measured layout that joins
    them makes a new round."""
    worker: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    lease_until: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="running")
    """``running`` (its rounds are being measured, or wait for the next run) or ``done``."""
    launches: Mapped[int] = mapped_column(Integer, default=0)
    device_s: Mapped[float] = mapped_column(Float, default=0.0)
    """Device-seconds of its runs: each launch's wall time times its world size."""
    decision_json: Mapped[str | None] = mapped_column(Text, nullable=True)


class ConfirmationRun(Base):
    """One run of one layout in one round of a confirmation round."""

    __tablename__ = "confirmation_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    confirmation_id: Mapped[int] = mapped_column(Integer, index=True)
    study_name: Mapped[str] = mapped_column(String(128), index=True)
    round: Mapped[int] = mapped_column(Integer)
    slot: Mapped[int] = mapped_column(Integer)
    """Its place in the round's order (rounds alternate the order: A B C, C B A)."""
    layout_key: Mapped[str] = mapped_column(String(96))
    trial_number: Mapped[int] = mapped_column(Integer)
    """The layout's own (search) trial."""
    outcome: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    model_tflops_per_device: Mapped[float | None] = mapped_column(Float, nullable=True)
    step_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    measure_precision: Mapped[float | None] = mapped_column(Float, nullable=True)
    elapsed_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    world_size: Mapped[int] = mapped_column(Integer)
    launcher: Mapped[str] = mapped_column(String(16))
    worker: Mapped[str | None] = mapped_column(String(128), nullable=True)
    run_dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class SchemaVersion(Base):
    __tablename__ = "autotune_schema"

    version: Mapped[int] = mapped_column(Integer, primary_key=True)
