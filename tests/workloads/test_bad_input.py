"""A bad workload section exits 2 naming the field, before any database or launcher: an
unknown placeholder, a flag autotune owns given by the user (both named), a missing script,
a command not found; and the other load-time checks of ``workload``."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.config.workload import WorkloadConfig
from autotune.errors import SpecError
from autotune.spec import parse_study
from tests.helpers import run_cli, write_study


def _script(tmp_path: Path) -> str:
    script = tmp_path / "pretrain_gpt.py"
    script.write_text("")
    return str(script)


CASES = {
    "unknown placeholder": (
        lambda tmp: {"kind": "command", "argv": [sys.executable, "-c", "pass", "--mb",
                                                 "{micro_batchh}"]},
        "workload.argv[4]", ["unknown placeholder {micro_batchh}", "{micro_batch}"]),
    "a precision flag": (
        lambda tmp: {"kind": "megatron-deepspeed", "script": _script(tmp),
                     "args": ["--data-path", "x", "--fp16"]},
        "workload.args[2]", ["--fp16 conflicts with training.dtype",
                             "no precision flag with fp32"]),
    "conflicting owned flag": (
        lambda tmp: {"kind": "megatron-deepspeed", "script": _script(tmp),
                     "args": ["--data-path", "x", "--recompute-granularity", "full"]},
        "workload.args[2]", ["got '--recompute-granularity'", "autotune sets for every trial"]),
    "missing script": (
        lambda tmp: {"kind": "megatron-deepspeed", "script": str(tmp / "nope" / "pretrain.py")},
        "workload.script", ["no such script"]),
    "command not found": (
        lambda tmp: {"kind": "command", "argv": ["no-such-trainer-4711", "--mb", "1"]},
        "workload.argv[0]", ["command not found"]),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_workload_exits_2_naming_the_field_and_stores_nothing(
        case: str, tmp_path: Path, seeded_db: Path) -> None:
    workload, field, words = CASES[case]
    path = write_study(tmp_path / "s.yaml", db=seeded_db, workload=workload(tmp_path))
    proc = run_cli("run", str(path), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"{field}:" in proc.stderr and "Traceback" not in proc.stderr
    for word in words:
        assert word in proc.stderr
    summaries = optuna.get_all_study_summaries(f"sqlite:///{seeded_db}")
    assert [(s.study_name, s.n_trials) for s in summaries] == [("keep", 1)]
    assert not (tmp_path / "runs").exists()


def _load(tmp_path: Path, workload: dict) -> None:
    path = write_study(tmp_path / "w.yaml", workload=workload)
    parse_study(yaml.safe_load(path.read_text()), base_dir=tmp_path)


@pytest.mark.parametrize(("workload", "field", "text"), [
    ({"kind": "command", "argv": [sys.executable, "missing_train.py"]}, "workload.argv[1]",
     "no such script"),
    ({"kind": "command", "argv": [sys.executable, "-c", "{tp"]}, "workload.argv[2]",
     "malformed placeholder"),
    ({"kind": "command", "argv": ["{tp}"]}, "workload.argv[0]", "without placeholders"),
    ({"kind": "command"}, "workload.argv", "required"),
    ({"kind": "kubeflow"}, "workload.kind", "allowed"),
    ({"kind": "command", "argv": [sys.executable], "script": "x.py"}, "workload.script",
     "megatron-deepspeed"),
    ({"kind": "command", "argv": [sys.executable], "ds_config": {"train_batch_size": 8}},
     "workload.ds_config.train_batch_size", "conflicts"),
    ({"kind": "command", "argv": [sys.executable], "no_progress_s": 0}, "workload.no_progress_s",
     "allowed"),
    ({"kind": "builtin", "outer": "none"}, "workload.outer", "built-in"),
    # The built-in trainer writes its own DeepSpeed config: extras were silently ignored.
    ({"kind": "builtin", "ds_config": {"data_types": {"grad_accum_dtype": "fp32"}}},
     "workload.ds_config", "allowed only with workload.kind 'command' or 'megatron-deepspeed'"),
    ({"kind": "command", "argv": [sys.executable], "colour": 1}, "workload.colour",
     "unknown key"),
])
def test_other_workload_checks(tmp_path: Path, workload: dict, field: str, text: str) -> None:
    with pytest.raises(SpecError) as err:
        _load(tmp_path, workload)
    assert err.value.field == field and text in str(err.value)


def test_megatron_model_flags_must_agree_with_the_study_model(tmp_path: Path) -> None:
    script = _script(tmp_path)
    with pytest.raises(SpecError) as err:  # the study's model has 2 layers
        _load(tmp_path, {"kind": "megatron-deepspeed", "script": script,
                         "args": ["--data-path", "x", "--num-layers", "24"]})
    assert err.value.field == "workload.args[2]" and "model.n_layer 2" in str(err.value)
    with pytest.raises(SpecError, match="--micro-batch-size conflicts with --micro-batch-size"):
        _load(tmp_path, {"kind": "megatron-deepspeed", "script": script,
                         "args": ["--micro-batch-size=4"]})
    _load(tmp_path, {"kind": "megatron-deepspeed", "script": script,  # agreeing: accepted
                     "args": ["--data-path", "x", "--num-layers", "2", "--hidden-size", "32"]})


def test_dropout_is_allowed_for_every_workload(tmp_path: Path) -> None:
    model = {"n_layer": 2, "hidden": 32, "n_head": 4, "seq_len": 16, "vocab_size": 64,
             "dropout": 0.1}
    study = parse_study(yaml.safe_load(write_study(tmp_path / "a.yaml", model=model)
                                       .read_text()))
    assert study.model.dropout == 0.1 and study.workload.kind == "builtin"
    with pytest.raises(SpecError, match=r"model\.dropout"):
        parse_study(yaml.safe_load(write_study(tmp_path / "c.yaml",
                                               model={**model, "dropout": 1.0}).read_text()))
    path = write_study(tmp_path / "b.yaml", model=model,
                       workload={"kind": "command", "argv": [sys.executable, "-c", "pass"]})
    assert parse_study(yaml.safe_load(path.read_text())).workload.kind == "command"


_HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**6, max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=300),
    st.lists(st.one_of(st.text(max_size=20), st.integers(), st.none()), max_size=4),
    st.dictionaries(st.text(max_size=4), st.one_of(st.integers(), st.text(max_size=4)),
                    max_size=2))


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(sorted(WorkloadConfig.__dataclass_fields__)), value=_HOSTILE,
       kind=st.sampled_from(["builtin", "command", "megatron-deepspeed"]))
def test_no_workload_value_raises_anything_but_a_spec_error(key: str, value: object,
                                                            kind: str) -> None:
    data = {"kind": kind, key: value}
    if kind == "command" and key != "argv":
        data["argv"] = [sys.executable, "-c", "pass"]
    if kind == "megatron-deepspeed" and key != "script":
        data["script"] = __file__
    try:
        WorkloadConfig.from_dict(data)
    except SpecError as err:
        assert err.field.startswith("workload")
    except TypeError:  # a wrong-shaped value past the checks: parse_study turns it into one
        pass
