"""A study is one program on one cluster: the same name with another argv, environment or
cluster shape is refused (exit 2, naming what differs); a changed space alone goes on
with one line; a study stored before the fingerprint held these fields keeps opening."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from autotune import cli
from autotune.errors import UsageError
from autotune.runner.optuna_io import open_study
from autotune.spec import load_study
from autotune.storage import open_storage
from autotune.storage.keys import StudyAttr
from tests.helpers import write_study

ARGV = [sys.executable, "-c", "pass", "--mb", "{micro_batch}", "--lr", "0.1"]


def _file(tmp_path: Path, name: str, **sections: Any) -> Path:
    return write_study(tmp_path / f"{name}.yaml", name="same", db=tmp_path / "s.db",
                       **sections)


def _open(path: Path) -> optuna.Study:
    spec = load_study(path)
    storage = open_storage(spec.storage)
    try:
        return open_study(spec, storage)
    finally:
        storage.close()


def test_another_argv_under_the_same_name_is_refused_naming_it(tmp_path: Path) -> None:
    _open(_file(tmp_path, "a", workload={"kind": "command", "argv": ARGV}))
    other = [*ARGV[:-1], "0.2"]
    with pytest.raises(UsageError) as err:
        _open(_file(tmp_path, "b", workload={"kind": "command", "argv": other}))
    message = str(err.value)
    assert "workload.argv:" in message and "'0.1'" in message and "'0.2'" in message
    assert "one program on one cluster" in message and "new name" in message
    with pytest.raises(UsageError, match=r"workload\.env"):
        _open(_file(tmp_path, "c", workload={"kind": "command", "argv": ARGV,
                                             "env": {"OMP_NUM_THREADS": "4"}}))


def test_another_cluster_shape_of_the_same_world_size_is_refused_with_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _open(_file(tmp_path, "a", cluster={"nodes": 2, "devices_per_node": 1, "device": "cpu"}))
    path = _file(tmp_path, "b", cluster={"nodes": 1, "devices_per_node": 2, "device": "cpu"})
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "nodes: 2 -> 1" in err and "devices_per_node: 1 -> 2" in err


def test_a_changed_space_alone_goes_on_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _open(_file(tmp_path, "a"))
    capsys.readouterr()
    doc = yaml.safe_load(_file(tmp_path, "b").read_text())
    doc["search"]["micro_batch"] = [1, 2]
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(doc))
    study = _open(path)
    lines = [line for line in capsys.readouterr().err.splitlines() if "search space" in line]
    assert len(lines) == 1 and "micro_batch [1, 2, 4] -> [1, 2]" in lines[0]
    assert study.user_attrs[StudyAttr.SPACE]["micro_batch"] == [1, 2]


def test_an_old_study_keeps_opening_and_then_holds_the_new_fields(tmp_path: Path) -> None:
    study = _open(_file(tmp_path, "a", workload={"kind": "command", "argv": ARGV}))
    fp = dict(study.user_attrs[StudyAttr.FINGERPRINT])
    for added in ("nodes", "devices_per_node", "program"):
        fp.pop(added)
    study.set_user_attr(StudyAttr.FINGERPRINT, fp)  # as a study stored before them
    study.set_user_attr(StudyAttr.SPACE, None)
    other = [*ARGV[:-1], "0.2"]  # not compared then: it opens, and is stored
    reopened = _open(_file(tmp_path, "b", workload={"kind": "command", "argv": other}))
    assert reopened.user_attrs[StudyAttr.FINGERPRINT]["program"]["argv"] == other
    with pytest.raises(UsageError, match=r"workload\.argv"):
        _open(_file(tmp_path, "c", workload={"kind": "command", "argv": ARGV}))
