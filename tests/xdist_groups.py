"""Which tests share a pytest-xdist worker (``scripts/test.sh``: ``-n 2 --dist loadgroup``).

A test module stays whole on one worker, so that its module fixtures (several real trainer
launches, tens of seconds) run once, not once per worker. Tests that share a service that
two tests cannot use at once run one after the other on one worker, whatever module they
are in:

* ``slurm`` and ``multinode`` (:data:`SLURM_GROUP`): one SLURM controller, one node whose
  CPUs a module's ``allocation`` holds, and 4 namespaced nodes that each ``multinode`` test
  needs whole (one of them kills a node's ``slurmd``);
* ``megatron`` (:data:`MEGATRON_GROUP`): their fixture runs ``scripts/megatron_env.sh``,
  which deletes the build locks of the test-only DeepSpeed's op as stale, because no trial
  runs beside it; a trial of another worker would lose its lock mid-load.

Tests marked ``alone`` run with nothing beside them: their worker waits for the other's
test to end, and the other waits for them (:func:`pytest_runtest_protocol`). They compare
timings measured in separate launches, which another test's load, coming and going,
distorts by up to 2x (a CI run's ``autotune profile`` of a tiny layer: one of its four runs
twice as slow, the fit's slope negative).

This module is a plugin (``tests/conftest.py`` registers it). The groups are the markers',
read where the markers are: on the workers, each of which writes its node id -> group map
to :data:`GROUPS_ENV`'s folder at collection. The controller's scheduler
(:func:`pytest_xdist_make_scheduler`) reads the map when it schedules, after every worker
has collected. pytest-xdist's own ``loadgroup`` puts the group into the node id
(``item._nodeid``), which pytest 9 no longer reads (``Node.nodeid`` comes from ``_id``):
under it every test was scheduled alone, and two ``multinode`` tests ran at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from autotune.util.atomic import write_json_atomic

GROUPS_ENV = "AUTOTUNE_TEST_XDIST_GROUPS"
"""The folder the workers write their maps to; set by the controller before it starts them."""
_OWN_FOLDER = pytest.StashKey[str]()
SLURM_GROUP = "slurm"
MEGATRON_GROUP = "megatron"


def group_of(item: pytest.Item) -> str:
    """The group ``item`` runs in: a service's, else its module's."""
    if item.get_closest_marker("slurm") or item.get_closest_marker("multinode"):
        return SLURM_GROUP
    if item.get_closest_marker("megatron"):
        return MEGATRON_GROUP
    return module_of(item.nodeid)


def module_of(nodeid: str) -> str:
    """``tests/x/test_y.py::test_z[a]`` -> ``tests/x/test_y.py``."""
    return nodeid.split("::", 1)[0]


def pytest_configure(config: pytest.Config) -> None:
    """On the controller of an xdist run, the folder the workers will write to (they
    inherit the environment when they start, after ``pytest_configure``)."""
    if getattr(config, "workerinput", None) is None and config.getoption("numprocesses",
                                                                         None):
        folder = tempfile.mkdtemp(prefix="autotune-xdist-groups-")
        config.stash[_OWN_FOLDER] = os.environ[GROUPS_ENV] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the folder this controller made (a pytest started by a test inherits the
    variable, and must leave the outer run's folder alone)."""
    folder = config.stash.get(_OWN_FOLDER, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get(GROUPS_ENV) == folder:
            del os.environ[GROUPS_ENV]


@pytest.hookimpl(trylast=True)  # after every hook that marks tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker, write this worker's map (atomically: the controller may read it)."""
    worker: dict[str, Any] | None = getattr(config, "workerinput", None)
    folder = os.environ.get(GROUPS_ENV)
    if worker is None or not folder:
        return
    write_json_atomic(Path(folder) / f"{worker['workerid']}.json",
                      {item.nodeid: group_of(item) for item in items})


def read_groups(folder: str | None) -> dict[str, str]:
    """Every worker's map, merged (they collect the same tests)."""
    groups: dict[str, str] = {}
    for path in sorted(Path(folder).glob("[!.]*.json")) if folder else ():  # not a temporary
        groups.update(json.loads(path.read_text()))
    return groups


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling (a scope's tests go to one worker, largest scopes first)
    with the scopes above; ``None`` (xdist's own choice) for any other ``--dist``."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = read_groups(os.environ.get(GROUPS_ENV))
            return self._groups.get(nodeid) or module_of(nodeid)

    return GroupScheduling(config, log)


@contextmanager
def _turn(folder: Path, *, alone: bool) -> Iterator[None]:
    """Hold the workers' shared lock (``alone``: exclusively) for one test. Whoever waits
    for the lock holds the turnstile meanwhile, so that the other worker's next tests
    queue behind an ``alone`` test instead of keeping the lock shared for ever."""
    with open(folder / "turnstile", "a") as turnstile, open(folder / "tests", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, object, object]:
    """On a worker, a test's whole run (its fixtures' set-up and tear-down included) holds
    the workers' lock: shared, or exclusive for an ``alone`` test."""
    folder = os.environ.get(GROUPS_ENV)
    if getattr(item.config, "workerinput", None) is None or not folder:
        return (yield)
    with _turn(Path(folder), alone=item.get_closest_marker("alone") is not None):
        return (yield)
