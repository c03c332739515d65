"""``autotune dashboard``: optuna-dashboard on a study database, on localhost by default.

Studies are readable there as they are: the objective is named
(``model_tflops_per_device``, study user attribute ``objective``), each trial has its
per-axis parameters (tp, pp, micro_batch, zero_stage, recompute) and user attributes
(layout, outcome, reason, TFLOPS, memory, hosts), infeasible layouts carry a violated
``feasible`` constraint.

The server is started through optuna-dashboard's Python API, not its command line, so that
a database password never appears in a process list; every URL printed is masked.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import make_url

from autotune.errors import StorageError, UsageError
from autotune.storage import engine_kwargs
from autotune.storage.urls import backend_of, mask_url, resolve_url

__all__ = ["serve", "LOCALHOST"]

LOCALHOST = "127.0.0.1"


def _sqlite_file(url: str) -> Path | None:
    database = make_url(url).database
    return Path(database) if database and database != ":memory:" else None


def serve(url: str, *, host: str = LOCALHOST, port: int = 8080,
          log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> None:
    """Serve optuna-dashboard for the database ``url`` until interrupted (blocks).

    ``host`` other than localhost exposes every study in the database, unauthenticated,
    to whoever reaches the port: use an SSH tunnel to a cluster's login node instead.
    """
    resolved = resolve_url(url)
    masked = mask_url(resolved)
    if backend_of(resolved) == "sqlite":
        path = _sqlite_file(resolved)
        if path is not None and not path.is_file():
            # Opening it would create an empty database and show nothing.
            raise UsageError(f"no database at {path} (from {masked}); give the study's "
                             "storage URL, e.g. --storage sqlite:///autotune.db")
    try:
        import optuna
        from optuna_dashboard import run_server
    except ImportError:
        raise UsageError("optuna-dashboard is not installed: pip install "
                         "'autotune[dashboard]'") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(resolved,
                                                 engine_kwargs=engine_kwargs(resolved, 4))
    except Exception as err:  # a driver error may quote the URL: mask it
        first = (str(err).splitlines() or [repr(err)])[0].replace(resolved, masked)
        password = make_url(resolved).password
        if password:
            first = first.replace(str(password), "***")
        raise StorageError(f"cannot open the database {masked}: {first[:300]}") from None
    _check_port(host, port)
    shown = f"[{host}]" if ":" in host else host
    log(f"[autotune] dashboard for {masked} at http://{shown}:{port}/dashboard "
        "(Ctrl-C to stop)")
    if host not in (LOCALHOST, "localhost", "::1"):
        log(f"[autotune] warning: listening on {host}: anyone who reaches this port sees "
            "every study in the database")
    try:
        run_server(storage, host=host, port=port)
    except OSError as err:  # taken between the check and the bind
        raise UsageError(_port_message(host, port, err)) from None


def _port_message(host: str, port: int, err: OSError) -> str:
    return (f"dashboard: cannot listen on {host}:{port} ({err.strerror or err}); another "
            "program (an earlier dashboard?) holds it: choose a free one with --port N")


def _check_port(host: str, port: int) -> None:
    """A :class:`UsageError` naming ``--port`` when ``host:port`` cannot be bound (in use,
    or not an address of this machine), before anything says it is listening."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as err:
        raise UsageError(f"dashboard: --host {host!r} is not an address here "
                         f"({err.strerror or err})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does
        try:
            sock.bind(address)
        except OSError as err:
            raise UsageError(_port_message(host, port, err)) from None
