"""Bad input never crashes with a traceback and never touches the database.

Exit 2 for usage errors (malformed study files, unknown keys, impossible spaces, bad
flags) with the field named; exit 1 for an unreachable database with the password masked.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from tests.helpers import run_cli, write_study


def _unchanged(db: Path) -> None:
    summaries = optuna.get_all_study_summaries(f"sqlite:///{db}")
    assert [(s.study_name, s.n_trials) for s in summaries] == [("keep", 1)]


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda s: s["model"].update(n_head=5), "model.n_head"),
    (lambda s: s["search"].update(tp=["two"]), "search.tp[0]"),
    (lambda s: s.update(colour="blue"), "colour"),
    (lambda s: s["search"].update(samplr="tpe"), "search.samplr"),
    (lambda s: s["training"].update(global_batch=-4), "training.global_batch"),
    (lambda s: s["cluster"].update(device="tpu-v9"), "cluster.device"),
    (lambda s: s.pop("training"), "training"),
    (lambda s: s["launcher"].update(kind="kubernetes"), "launcher.kind"),
    (lambda s: s["storage"].update(url="oracle://x"), "storage.url"),
    (lambda s: s.update(name="bad name; rm -rf /"), "name"),
])
def test_invalid_study_files_exit_2_naming_the_field(tmp_path: Path, seeded_db: Path,
                                                     mutate, field: str) -> None:
    path = write_study(tmp_path / "s.yaml", db=seeded_db)
    data = yaml.safe_load(path.read_text())
    mutate(data)
    path.write_text(yaml.safe_dump(data))
    proc = run_cli("run", str(path))
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr
    assert "Traceback" not in proc.stderr
    _unchanged(seeded_db)


def test_malformed_yaml_exits_2_with_the_line(tmp_path: Path, seeded_db: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nmodel: {n_layer: 2\ncluster: [\n")
    proc = run_cli("run", str(path))
    assert proc.returncode == 2
    assert "not valid YAML at line" in proc.stderr and "Traceback" not in proc.stderr


def test_missing_file_and_bad_flags_exit_2(tmp_path: Path) -> None:
    proc = run_cli("run", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "no such file" in proc.stderr
    proc = run_cli("run", str(tmp_path / "nope.yaml"), "--n-trials", "0")
    assert proc.returncode == 2 and "--n-trials" in proc.stderr


def test_impossible_space_exits_2_before_touching_the_database(tmp_path: Path,
                                                               seeded_db: Path) -> None:
    # tp must divide 4 heads and the world size; 3 does neither: nothing is feasible.
    path = write_study(tmp_path / "s.yaml", db=seeded_db, devices=3,
                       search={"tp": [3], "pp": [1], "micro_batch": [1], "n_trials": 2})
    proc = run_cli("run", str(path))
    assert proc.returncode == 2, proc.stderr
    assert "no feasible layout" in proc.stderr and "autotune plan" in proc.stderr
    _unchanged(seeded_db)


def test_unreachable_database_exits_1_and_masks_the_password(tmp_path: Path) -> None:
    path = write_study(tmp_path / "s.yaml")
    proc = run_cli("run", str(path), "--storage",
                   "postgresql+psycopg://tuner:hunter2@127.0.0.1:1/nowhere")
    assert proc.returncode == 1, proc.stderr
    assert "cannot open the database" in proc.stderr
    assert "hunter2" not in proc.stderr + proc.stdout
    assert "tuner:***@127.0.0.1:1" in proc.stderr


def test_a_different_model_under_an_existing_study_name_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    path = write_study(tmp_path / "a.yaml", name="same", db=db)
    from autotune.runner.optuna_io import open_study
    from autotune.spec import load_study
    from autotune.storage import open_storage

    spec = load_study(path)
    open_study(spec, open_storage(spec.storage))
    data = yaml.safe_load(path.read_text())
    data["model"]["n_layer"] = 4
    path.write_text(yaml.safe_dump(data))
    proc = run_cli("run", str(path))
    assert proc.returncode == 2 and "model.n_layer: 2 -> 4" in proc.stderr


def test_a_study_from_before_mlp_and_attention_reopens_unchanged(tmp_path: Path) -> None:
    from dataclasses import replace

    from autotune.errors import UsageError
    from autotune.runner.optuna_io import open_study
    from autotune.spec import load_study
    from autotune.storage import open_storage

    spec = load_study(write_study(tmp_path / "a.yaml", name="old", db=tmp_path / "x.db"))
    storage = open_storage(spec.storage)
    study = open_study(spec, storage)
    old = dict(study.user_attrs["fingerprint"])
    old["model"] = {k: v for k, v in old["model"].items()
                    if k not in ("mlp", "attention")}  # the old schema
    study.set_user_attr("fingerprint", old)
    open_study(spec, storage)  # the GELU, SDPA model it always was
    with pytest.raises(UsageError, match=r"model\.mlp: 'gelu' -> 'swiglu'"):
        open_study(replace(spec, model=replace(spec.model, mlp="swiglu")), storage)
    with pytest.raises(UsageError, match=r"model\.attention: 'flash' -> 'explicit'"):
        open_study(replace(spec, model=replace(spec.model, attention="explicit")), storage)
