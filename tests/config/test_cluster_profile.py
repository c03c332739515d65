"""``cluster.profile`` in a study file: where a relative path is read from, what the
planner does with it, and the errors that name ``cluster.profile``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.config.cluster import ClusterConfig
from autotune.errors import SpecError
from autotune.layout import Layout
from autotune.models.profile import (
    LayerProfile,
    LayerShape,
    ProfileEntry,
    load_cluster_profile,
    load_profile,
)
from autotune.planning.plan import plan_study
from autotune.spec import load_study
from tests.helpers import TINY, write_study

CPU = {"nodes": 1, "devices_per_node": 2, "device": "cpu"}
# the helpers' study: TINY on 2 CPU devices in fp32; tp 1 and micro-batch 1 is measured
MEASURED = LayerShape.of(TINY, Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=4),
                         device="cpu", dtype="fp32", tp_link="none")


def profiled_study(tmp_path: Path, profile: LayerProfile | None, ref: str = "prof.json",
                   ) -> Path:
    """``study/study.yaml`` with ``cluster.profile: ref``, and ``profile`` in
    ``study/prof.json``; the working directory is moved to ``elsewhere/``."""
    folder = tmp_path / "study"
    folder.mkdir()
    if profile is not None:
        profile.save(folder / "prof.json")
    (tmp_path / "elsewhere").mkdir()
    return write_study(folder / "study.yaml", cluster={**CPU, "profile": ref})


def test_a_relative_profile_is_read_beside_the_study_and_used_by_plan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    prof = LayerProfile((ProfileEntry(MEASURED, 1e-4),), source="test")
    path = profiled_study(tmp_path, prof)
    monkeypatch.chdir(tmp_path / "elsewhere")
    spec = load_study(path)
    assert spec.profile == prof
    rows = plan_study(spec, top=1000).rows
    assert {(r.layout.tp, r.layout.micro_batch) for r in rows if r.step.profiled} == {(1, 1)}
    assert any(not r.step.profiled for r in rows)
    assert main(["plan", str(path), "--top", "1000", "--format", "json"]) == 0
    feasible = json.loads(capsys.readouterr().out)["feasible"]
    assert {r["key"] for r in feasible if r["step"]["profiled"]} == {
        r.layout.key() for r in rows if r.step.profiled}


def test_a_profile_found_from_the_working_directory_comes_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = profiled_study(tmp_path, LayerProfile((ProfileEntry(MEASURED, 1e-4),)))
    here = LayerProfile((ProfileEntry(MEASURED, 2e-4),))
    here.save(tmp_path / "elsewhere" / "prof.json")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert load_study(path).profile == here


@pytest.mark.parametrize("profile, needle", [
    (None, "no such file"),
    (LayerProfile((ProfileEntry(replace(MEASURED, hidden=64), 1e-4),)), "model's layer"),
    (LayerProfile((ProfileEntry(replace(MEASURED, device="a100-80gb"), 1e-4),)), "on cpu"),
    (LayerProfile((ProfileEntry(replace(MEASURED, dtype="bf16"), 1e-4),)), "in fp32"),
], ids=["missing", "other-model", "other-device", "other-dtype"])
def test_cli_plan_refuses_a_profile_it_cannot_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        profile: LayerProfile | None, needle: str) -> None:
    path = profiled_study(tmp_path, profile)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cluster.profile" in err and needle in err, err
    assert "Traceback" not in err


def test_cluster_section_errors_name_cluster_profile(tmp_path: Path) -> None:
    for value in (3, "", None, ["prof.json"]):
        with pytest.raises(SpecError) as err:
            ClusterConfig.from_dict({**CPU, "profile": value})
        assert err.value.field == "cluster.profile"
    bad = LayerProfile((ProfileEntry(MEASURED, 1e-4),)).to_dict()
    bad["entries"][0]["layer_time_s"] = -1.0
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    # The config keeps the path only; the models layer reads the file.
    cluster = ClusterConfig.from_dict({**CPU, "profile": "bad.json"}, base_dir=tmp_path)
    assert cluster.profile_path == tmp_path / "bad.json"
    with pytest.raises(SpecError) as err:
        load_cluster_profile(cluster, TINY, "fp32")
    # The field is the study's; the message names the file and the entry's field.
    assert err.value.field == "cluster.profile"
    assert err.value.value == str(tmp_path / "bad.json")
    assert "entries[0].layer_time_s" in str(err.value)
    good = tmp_path / "good.json"
    LayerProfile((ProfileEntry(MEASURED, 1e-4),)).save(good)
    cluster = ClusterConfig.from_dict({**CPU, "profile": str(good)})  # absolute: as given
    assert load_cluster_profile(cluster, TINY, "fp32") == load_profile(good)
    assert load_cluster_profile(ClusterConfig(**CPU), TINY, "fp32") is None


def test_a_layer_time_no_device_could_give_is_refused(tmp_path: Path) -> None:
    # 1e-300 s made the plan rank by a layer of infinite TFLOPS; 1e308 s made every step
    # time infinite (and the JSON plan print Infinity and NaN). Both loaded before.
    for seconds, needle in ((1e-300, "gives 1.28e+294 model TFLOPS per device; allowed: a "
                                     "time that gives at most 100000"),
                            (1e-13, "model TFLOPS per device; allowed: a time"),
                            (1e308, "entries[0].layer_time_s: got 1e+308; allowed: a "
                                    "positive number of seconds, at most 86400")):
        data = LayerProfile((ProfileEntry(MEASURED, 1e-4),)).to_dict()
        data["entries"][0]["layer_time_s"] = seconds
        (tmp_path / "p.json").write_text(json.dumps(data))
        cluster = ClusterConfig.from_dict({**CPU, "profile": "p.json"}, base_dir=tmp_path)
        with pytest.raises(SpecError) as err:
            load_cluster_profile(cluster, TINY, "fp32")
        assert err.value.field == "cluster.profile" and needle in str(err.value), err.value
    # The bound is the results' and the tables' (autotune.hardware.MAX_TFLOPS_PER_DEVICE):
    # a fast but believable layer (TINY's 1e-7 s is about 13 TFLOPS) still loads.
    fast = tmp_path / "fast.json"
    LayerProfile((ProfileEntry(MEASURED, 1e-7),)).save(fast)
    assert load_cluster_profile(ClusterConfig.from_dict({**CPU, "profile": str(fast)}),
                                TINY, "fp32") is not None


def test_the_config_layer_imports_no_model() -> None:
    """``cluster.profile`` is a path in the config; the models layer reads the file. No
    module of ``autotune/config/`` imports ``autotune.models``, not even lazily."""
    import ast

    import autotune.config

    offenders = []
    for path in sorted(Path(autotune.config.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names
                          if n == "autotune.models" or n.startswith("autotune.models.")]
    assert offenders == []
