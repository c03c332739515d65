"""The ZeRO-3 variants (MiCS, hpZ) and DeepSpeed-Ulysses as layout axes: keys, parameters,
the study file's refusals (exit 2, field named), the feasibility reasons, the space, and
MiCS refused with its reason where the trials' DeepSpeed has none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.config.launcher import LauncherConfig, LocalOptions
from autotune.config.model import MODEL_PRESETS, ModelConfig
from autotune.config.study import SearchConfig
from autotune.config.workload import WorkloadConfig
from autotune.errors import SpecError
from autotune.feasibility import REASON_CODES, check_layout
from autotune.feasibility.strategies import DeepSpeedRuntime
from autotune.layout import Layout
from autotune.planning.space import enumerate_layouts
from autotune.workloads.deepspeed_version import deepspeed_for_study, deepspeed_in
from tests.helpers import run_cli, write_study

TINY = MODEL_PRESETS["tiny"]


def test_keys_round_trip_and_old_keys_still_parse() -> None:
    for lay in (Layout(tp=1, pp=1, dp=4, micro_batch=1, grad_accum=2, zero_stage=3,
                       zero_variant="hpz", zero_shard=2),
                Layout(tp=2, pp=1, dp=2, micro_batch=1, grad_accum=2, ulysses=2),
                Layout(tp=1, pp=1, dp=12, micro_batch=1, grad_accum=1, zero_stage=3,
                       zero_variant="mics", zero_shard=12, ulysses=2)):
        assert Layout.from_key(lay.key()) == lay
        assert "-sp" not in lay.key()
    old = Layout.from_key("tp2-pp1-dp2-mb2-ga4-z1-selective-sp")
    assert (old.sequence_parallel, old.zero_variant, old.zero_shard, old.ulysses) == \
        (True, "none", 1, 1)
    assert Layout.from_key("tp1-pp1-dp4-mb1-ga2-z3-none-hpz4").zero_variant == "hpz"
    for bad in ("tp1-pp1-dp4-mb1-ga2-z3-none-zz4", "tp1-pp1-dp4-mb1-ga2-z3-none-uly2-sp"):
        with pytest.raises(SpecError):
            Layout.from_key(bad)


def test_ulysses_multiplies_into_the_world_size_and_old_params_read_back() -> None:
    lay = Layout(tp=2, pp=1, dp=2, micro_batch=2, grad_accum=2, ulysses=2)
    assert (lay.world_size, lay.global_batch, lay.zero_group) == (8, 8, 4)
    assert Layout.from_params(lay.params(), world_size=8, global_batch=8) == lay
    old = {"tp": 2, "pp": 1, "micro_batch": 2, "zero_stage": 1, "recompute": "none"}
    assert Layout.from_params(old, world_size=8, global_batch=8).key() == \
        "tp2-pp1-dp4-mb2-ga1-z1-none"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"zero_stage": 2, "zero_variant": "mics", "zero_shard": 2}, "layout.zero_variant"),
    ({"zero_stage": 3, "zero_variant": "hpz", "zero_shard": 1}, "layout.zero_shard"),
    ({"zero_stage": 3, "zero_shard": 2}, "layout.zero_shard"),
    ({"zero_stage": 3, "zero_variant": "zpp", "zero_shard": 2}, "layout.zero_variant"),
    ({"tp": 2, "sequence_parallel": True, "ulysses": 2}, "layout.ulysses"),
    ({"ulysses": 0}, "layout.ulysses"),
])
def test_layout_refuses_meaningless_combinations(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"tp": 1, "pp": 1, "dp": 4, "micro_batch": 1, "grad_accum": 1}
    with pytest.raises(SpecError) as err:
        Layout(**{**args, **kwargs})
    assert err.value.field == field


@pytest.mark.parametrize(("search", "field"), [
    ({"zero_stage": [0, 1], "zero_variant": ["none", "mics"]}, "search.zero_variant"),
    ({"zero_stage": [3], "zero_variant": ["zpp"]}, "search.zero_variant[0]"),
    ({"zero_stage": [3], "zero_shard_size": [2]}, "search.zero_shard_size"),
    ({"zero_stage": [3], "zero_variant": ["hpz"], "zero_shard_size": [1]},
     "search.zero_shard_size[0]"),
    ({"ulysses": [2], "sequence_parallel": True}, "search.ulysses"),
    ({"ulysses": [0]}, "search.ulysses[0]"),
])
def test_the_study_file_refuses_each_invalid_combination_with_exit_2(
        tmp_path: Path, search: dict[str, Any], field: str) -> None:
    path = write_study(tmp_path / "s.yaml")
    data = yaml.safe_load(path.read_text())
    data["search"].update(search)
    path.write_text(yaml.safe_dump(data))
    proc = run_cli("plan", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert field in proc.stderr and "Traceback" not in proc.stderr


def _model(**kw: Any) -> ModelConfig:
    return ModelConfig(**{"n_layer": 2, "hidden": 64, "n_head": 4, "seq_len": 64,
                          "vocab_size": 256, "ffn_hidden": 256, **kw})


def test_each_rule_has_a_reason() -> None:
    shard = Layout(tp=1, pp=1, dp=6, micro_batch=1, grad_accum=1, zero_stage=3,
                   zero_variant="hpz", zero_shard=4)
    assert [r.code for r in check_layout(shard, _model(), world_size=6)] == ["zero_shard"]
    heads = Layout(tp=1, pp=1, dp=1, micro_batch=1, grad_accum=1, ulysses=4)
    assert [r.code for r in check_layout(heads, _model(n_head=6, hidden=60))] == \
        ["ulysses_heads"]
    tp = Layout(tp=2, pp=1, dp=1, micro_batch=1, grad_accum=1, ulysses=2)
    assert [r.code for r in check_layout(tp, _model())] == ["ulysses_tp_pp"]
    seq = Layout(tp=1, pp=1, dp=1, micro_batch=1, grad_accum=1, ulysses=4)
    assert [r.code for r in check_layout(seq, _model(seq_len=66))] == ["ulysses_seq_len"]
    ok = Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=1, zero_stage=3,
                zero_variant="mics", zero_shard=2, ulysses=2)
    assert check_layout(ok, _model(), world_size=4) == []
    for code in ("zero_shard", "ulysses_heads", "ulysses_seq_len", "ulysses_tp_pp",
                 "mics_deepspeed"):
        assert code in REASON_CODES


def test_mics_is_refused_with_the_reason_where_deepspeed_has_none() -> None:
    mics = Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=1, zero_stage=3,
                  zero_variant="mics", zero_shard=2)
    new = check_layout(mics, _model(), deepspeed=DeepSpeedRuntime("0.19.8", "here"))
    assert [str(r) for r in new] == ["MiCS needs DeepSpeed < 0.19; found 0.19.8 (here)"]
    assert check_layout(mics, _model(), deepspeed=DeepSpeedRuntime("0.18.9", "here")) == []
    assert check_layout(mics, _model(), deepspeed=DeepSpeedRuntime("0.17.5", "here")) == []
    none = check_layout(mics, _model(), deepspeed=DeepSpeedRuntime(None, "here"))
    assert [r.code for r in none] == ["mics_deepspeed"] and "found none" in str(none[0])


def test_the_builtin_trainers_deepspeed_is_the_project_environments() -> None:
    import importlib.metadata

    search = SearchConfig(zero_stage=(3,), zero_variant=("none", "mics"))
    found = deepspeed_for_study(search, WorkloadConfig(), LauncherConfig())
    assert found is not None
    assert found.version == importlib.metadata.version("deepspeed")
    assert "project environment" in found.source
    assert deepspeed_for_study(SearchConfig(), WorkloadConfig(), LauncherConfig()) is None


def test_a_users_pythonpath_decides_which_deepspeed_runs(tmp_path: Path) -> None:
    """The version is read in the workload's own environment: a DeepSpeed 0.18.9 first on
    the workload's PYTHONPATH (as the test-only Megatron environment puts it) is the one."""
    info = tmp_path / "site" / "deepspeed-0.18.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.18.9\n")
    script = tmp_path / "pretrain_gpt.py"
    script.write_text("")
    workload = WorkloadConfig(kind="megatron-deepspeed", script=str(script),
                              env={"PYTHONPATH": str(tmp_path / "site")})
    search = SearchConfig(zero_stage=(3,), zero_variant=("mics",))
    deepspeed_in.cache_clear()
    found = deepspeed_for_study(search, workload, LauncherConfig(local=LocalOptions()))
    assert found is not None and found.version == "0.18.9" and found.has_mics()


def test_the_space_has_the_variants_at_stage_3_only_and_no_sp_with_ulysses() -> None:
    search = SearchConfig(tp=(1, 2), pp=(1,), micro_batch=(1,), zero_stage=(1, 3),
                          recompute=("none",), sequence_parallel=(False, True),
                          zero_variant=("none", "mics", "hpz"), ulysses=(1, 2))
    lays = enumerate_layouts(search, world_size=8, global_batch=8, devices_per_node=4)
    assert all(lay.zero_stage == 3 for lay in lays if lay.zero_variant != "none")
    assert {lay.zero_shard for lay in lays if lay.zero_variant != "none"} == {4}
    assert not any(lay.sequence_parallel and lay.ulysses > 1 for lay in lays)
    assert {lay.world_size for lay in lays} == {8}
    assert any(lay.ulysses == 2 and lay.zero_variant == "hpz" for lay in lays)
    assert len(set(lays)) == len(lays)
    # Without the new axes the space is the one it was.
    plain = SearchConfig(tp=(1, 2), pp=(1,), micro_batch=(1,), zero_stage=(1, 3),
                         recompute=("none",))
    assert [lay.key() for lay in enumerate_layouts(plain, 8, 8)] == [
        "tp1-pp1-dp8-mb1-ga1-z1-none", "tp1-pp1-dp8-mb1-ga1-z3-none",
        "tp2-pp1-dp4-mb1-ga2-z1-none", "tp2-pp1-dp4-mb1-ga2-z3-none"]


def test_the_optuna_distributions_are_appended() -> None:
    from autotune.runner.optuna_io import layout_params
    from autotune.spec import parse_study

    spec = parse_study({"name": "d", "model": {"preset": "tiny"},
                        "cluster": {"nodes": 1, "devices_per_node": 4, "device": "cpu"},
                        "training": {"global_batch": 8}})
    lay = Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=4, zero_stage=3,
                 zero_variant="hpz", zero_shard=2, ulysses=2)
    params = layout_params(lay, spec)
    assert list(params)[:6] == ["tp", "pp", "micro_batch", "zero_stage", "recompute",
                                "sequence_parallel"]
    assert params["zero_variant"][0] == "hpz" and params["ulysses"][0] == 2
    # Declared over the study's own values (a constant axis is single-valued), each in
    # its stable order, the layout's own value always included.
    order = {"recompute": ("none", "full", "selective"), "zero_variant": ("none", "mics", "hpz")}
    for axis, stable in order.items():
        choices = params[axis][1].choices  # type: ignore[attr-defined]
        assert params[axis][0] in choices
        assert list(choices) == [c for c in stable if c in choices]
    assert params["zero_shard"][1].low <= 2 <= params["zero_shard"][1].high  # type: ignore


def test_the_space_size_counts_variants_at_stage_3_only() -> None:
    """GPT-175B on 1,024 tiles with every new axis: the (stage, variant, shard) triples and
    the (tp, pp, ulysses) combinations that divide the world are counted, not the product
    of the axes' lengths (156,816, over the limit), and the count bounds the enumeration."""
    from autotune.planning.space import MAX_LAYOUTS, space_size

    search = SearchConfig(zero_stage=(0, 1, 3), zero_variant=("none", "mics", "hpz"),
                          ulysses=(1, 2, 4, 8), recompute=("none", "selective", "full"),
                          sequence_parallel=(False, True))
    n, how = space_size(search, 1024, 1536)
    assert n <= MAX_LAYOUTS and "(zero_stage, zero_variant, shard)" in how
    assert len(enumerate_layouts(search, 1024, 1536, devices_per_node=8)) <= n
