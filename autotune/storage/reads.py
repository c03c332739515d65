"""The narrow reads of autotune's own tables that a :class:`~autotune.storage.db.Storage`
answers: measurements of one key (what a calibration fits), and the study's claims read
incrementally. Each read goes through the storage's one retry layer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from autotune.storage.schema import LayoutClaim, Measurement

__all__ = ["MeasurementReads"]

T = TypeVar("T")


class MeasurementReads:
    """Reads of ``measurements`` and ``layout_claims`` (mixed into ``Storage``, which
    gives the session scope and the retry layer)."""

    def session(self) -> AbstractContextManager[Session]:
        raise NotImplementedError

    def retrying(self, what: str, fn: Callable[[], T]) -> T:
        raise NotImplementedError

    # -- measurements -------------------------------------------------------------------

    def add_measurement(self, row: dict[str, Any]) -> None:
        with self.session() as s:
            s.add(Measurement(**row))

    def measurement_rows(self, columns: Sequence[str], *, device_type: str, dtype: str,
                         workload: str, outcomes: Sequence[str], study: str | None = None,
                         other_than: str | None = None,
                         limit: int | None = None) -> list[dict[str, Any]]:
        """``columns`` (and only those) of the measurements of one device type, dtype and
        workload with one of ``outcomes``, oldest first: of ``study`` alone, or of every
        study but ``other_than``; at most the ``limit`` most recent. One query, narrowed
        by the ``device_type`` (or ``study_name``) index."""
        try:
            selected = [getattr(Measurement, c) for c in columns]
        except AttributeError as err:
            raise ValueError(f"measurement_rows: no column {err.name!r}") from None
        query = select(*selected).where(
            Measurement.device_type == device_type, Measurement.dtype == dtype,
            Measurement.workload == workload, Measurement.outcome.in_(list(outcomes)))
        if study is not None:
            query = query.where(Measurement.study_name == study)
        if other_than is not None:
            query = query.where(Measurement.study_name != other_than)
        query = query.order_by(Measurement.id.desc())
        if limit is not None:
            query = query.limit(limit)
        def read() -> list[Any]:
            with self.session() as s:
                return list(s.execute(query).all())

        # Through the retry layer, as every call is: the end-of-run refit reads this
        # outside any retried step.
        rows = self.retrying("reading the measurements", read)
        return [dict(zip(columns, row, strict=True)) for row in reversed(rows)]

    def study_measurements(self, study: str, columns: Sequence[str], *,
                           outcome: str | None = None) -> list[dict[str, Any]]:
        """``columns`` of every measurement of ``study`` (of one ``outcome``, if given),
        oldest first; one query through the retry layer."""
        try:
            selected = [getattr(Measurement, c) for c in columns]
        except AttributeError as err:
            raise ValueError(f"study_measurements: no column {err.name!r}") from None
        query = select(*selected).where(Measurement.study_name == study)
        if outcome is not None:
            query = query.where(Measurement.outcome == outcome)
        query = query.order_by(Measurement.id)

        def read() -> list[Any]:
            with self.session() as s:
                return list(s.execute(query).all())

        rows = self.retrying("reading the study's measurements", read)
        return [dict(zip(columns, row, strict=True)) for row in rows]

    # -- layout claims (autotune.storage.claims owns the writes) ------------------------

    def claims_since(self, study: str, after_id: int) -> list[tuple[int, str, int]]:
        """``(claim id, layout key, trial id)`` of the study's claims newer than
        ``after_id``: a worker keeps the keys it has seen (claims are never deleted, only
        passed on to a retry) and reads only the new ones each step."""
        with self.session() as s:
            rows = s.execute(select(LayoutClaim.id, LayoutClaim.layout_key,
                                    LayoutClaim.trial_id).where(
                LayoutClaim.study_name == study, LayoutClaim.id > after_id)
                .order_by(LayoutClaim.id)).all()
        return [(int(i), str(k), int(t)) for i, k, t in rows]

    def claimed_keys(self, study: str) -> dict[str, int]:
        with self.session() as s:
            rows = s.execute(select(LayoutClaim.layout_key, LayoutClaim.trial_id).where(
                LayoutClaim.study_name == study)).all()
        return {k: t for k, t in rows}
