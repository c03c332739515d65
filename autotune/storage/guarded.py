"""Optuna's storage calls, waited out and translated like autotune's own.

A database failure inside an Optuna call (``study.get_trials``, ``set_user_attr``,
``best_trial``, ...) surfaced as Optuna's ``StorageInternalError`` (or the driver's raw
``OperationalError``), about 170 lines of traceback, and ended the worker even when the
database was back a second later. :class:`GuardedStorage` wraps the storage every
``optuna.Study`` of autotune's is opened on: each call is retried while it fails
transiently (:func:`autotune.storage.transient.retrying`), and any other database error
becomes a one-line :class:`~autotune.errors.StorageError`. Optuna's own errors that are
answers, not failures (no such study, a duplicated one, a finished trial), pass as they
are.

Optuna 5.0's ``storages.get_storage`` wraps an ``RDBStorage`` in its ``_CachedStorage``
and passes any other :class:`~optuna.storages.BaseStorage` through: the wrapped storage is
the cached one, so reads keep Optuna's cache. Every call of the storage API is one
transaction or one read, so running one again is safe; one that wrote before its
connection dropped is answered by Optuna's own checks (``create_new_study`` raises
``DuplicatedStudyError``, which ``create_study(load_if_exists=True)`` expects).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import optuna
from optuna.storages import BaseStorage
from sqlalchemy.exc import SQLAlchemyError

__all__ = ["GuardedStorage", "guard", "database_error", "one_line"]

Retry = Callable[[str, Callable[[], Any]], Any]
"""``retry(what, fn)``: :meth:`autotune.storage.db.Storage.retrying`."""


class GuardedStorage(BaseStorage):
    """``inner``'s storage API, each call through ``retry``. Built by
    :class:`autotune.storage.db.Storage`; pass it to ``optuna.create_study`` /
    ``load_study`` as ``storage``."""

    def __init__(self, inner: BaseStorage, retry: Retry) -> None:
        self._inner = inner
        self._retry = retry

    def __getattr__(self, name: str) -> Any:
        # Anything not in the storage API (an RDBStorage attribute, say) is the inner one's.
        return getattr(self._inner, name)


def _guarded(name: str) -> Callable[..., Any]:
    def call(self: GuardedStorage, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self._inner, name)
        return self._retry(f"optuna {name}", lambda: method(*args, **kwargs))

    functools.update_wrapper(call, getattr(BaseStorage, name))
    return call


_API = [name for name, member in inspect.getmembers(BaseStorage, inspect.isfunction)
        if not name.startswith("_")]
for _name in _API:
    setattr(GuardedStorage, _name, _guarded(_name))
GuardedStorage.__abstractmethods__ = frozenset()


def guard(inner: BaseStorage, retry: Retry) -> BaseStorage:
    """``inner`` with every storage call through ``retry``."""
    # The API's methods are set above, in a loop (mypy sees the class as abstract).
    return GuardedStorage(inner, retry)  # type: ignore[abstract]


def database_error(err: BaseException) -> bool:
    """Whether ``err`` is a failure of the database (to be shown as one line), not one of
    Optuna's answers such as ``KeyError`` for a missing study."""
    return isinstance(err, (SQLAlchemyError, optuna.exceptions.StorageInternalError))


def one_line(err: BaseException) -> str:
    """The driver's first line of ``err`` (without SQLAlchemy's SQL and background link),
    passwords masked as ``mask_url`` does."""
    from autotune.storage.transient import driver_message
    from autotune.storage.urls import mask_url

    text = driver_message(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    return " ".join(mask_url(w) if "://" in w else w for w in first.split(" "))[:500]
