"""The new layout axes: ``recompute: selective`` and ``sequence_parallel`` (issue 22), from
the layout value object through the study file, the space, the feasibility check and the
models. Pure functions: no launch."""

from __future__ import annotations

import pytest

from autotune.config.model import MODEL_PRESETS, ModelConfig
from autotune.config.study import SearchConfig
from autotune.errors import SpecError
from autotune.feasibility import check_layout
from autotune.layout import Layout, needs_no_less_memory
from autotune.models.cost import estimate_step
from autotune.models.flops import hardware_flops_per_step, model_flops_per_step
from autotune.models.memory import estimate_memory, layer_activation_bytes
from autotune.planning.space import enumerate_layouts


def _lay(**kw) -> Layout:
    base = {"tp": 2, "pp": 1, "dp": 2, "micro_batch": 2, "grad_accum": 2}
    return Layout(**{**base, **kw})


def test_key_round_trips_with_and_without_sp() -> None:
    for lay in (_lay(), _lay(recompute="selective"), _lay(sequence_parallel=True),
                _lay(recompute="full", sequence_parallel=True)):
        assert Layout.from_key(lay.key()) == lay
        assert Layout.from_dict(lay.to_dict()) == lay
        assert Layout.from_params(lay.params(), world_size=4, global_batch=8) == lay
    assert _lay(sequence_parallel=True).key() == "tp2-pp1-dp2-mb2-ga2-z0-none-sp"
    # A key stored before either existed still reads, and means no SP.
    assert not Layout.from_key("tp2-pp1-dp2-mb2-ga2-z0-full").sequence_parallel


@pytest.mark.parametrize(("kw", "field"), [
    ({"recompute": "partial"}, "layout.recompute"),
    ({"sequence_parallel": "yes"}, "layout.sequence_parallel"),
    ({"tp": 1, "dp": 4, "sequence_parallel": True}, "layout.sequence_parallel"),
])
def test_bad_layouts_name_the_field(kw: dict, field: str) -> None:
    with pytest.raises(SpecError) as err:
        _lay(**kw)
    assert err.value.field == field
    with pytest.raises(SpecError):
        Layout.from_key("tp2-pp1-dp2-mb2-ga2-z0-none-xx")


def test_search_file_axes() -> None:
    search = SearchConfig.from_dict({"tp": [1, 2], "pp": [1], "micro_batch": [2],
                                     "zero_stage": [0], "recompute": ["none", "selective"],
                                     "sequence_parallel": [False, True]})
    lays = enumerate_layouts(search, world_size=4, global_batch=8)
    keys = sorted(lay.key() for lay in lays)
    # tp = 1 once per recompute (nothing to shard), tp = 2 with and without SP.
    assert keys == sorted(["tp1-pp1-dp4-mb2-ga1-z0-none", "tp1-pp1-dp4-mb2-ga1-z0-selective",
                           "tp2-pp1-dp2-mb2-ga2-z0-none", "tp2-pp1-dp2-mb2-ga2-z0-selective",
                           "tp2-pp1-dp2-mb2-ga2-z0-none-sp",
                           "tp2-pp1-dp2-mb2-ga2-z0-selective-sp"])
    assert SearchConfig.from_dict({"sequence_parallel": True}).sequence_parallel == (True,)
    for bad, field in (({"sequence_parallel": ["yes"]}, "search.sequence_parallel[0]"),
                       ({"sequence_parallel": []}, "search.sequence_parallel"),
                       ({"recompute": ["some"]}, "search.recompute[0]")):
        with pytest.raises(SpecError) as err:
            SearchConfig.from_dict(bad)
        assert err.value.field == field


def test_feasibility_needs_tp_to_divide_the_sequence() -> None:
    model = ModelConfig(n_layer=2, hidden=64, n_head=4, seq_len=31, vocab_size=64)
    assert [r.code for r in check_layout(_lay(sequence_parallel=True), model,
                                         world_size=4)] == ["sp_seq_len"]
    assert check_layout(_lay(), model, world_size=4) == []


def test_memory_model_orders_the_techniques() -> None:
    model = MODEL_PRESETS["gpt-1.3b"]
    peak = {name: estimate_memory(model, _lay(**kw), dtype="bf16").activations_bytes
            for name, kw in {"none": {}, "sp": {"sequence_parallel": True},
                             "selective": {"recompute": "selective"},
                             "full": {"recompute": "full"}}.items()}
    assert peak["full"] < peak["sp"] < peak["none"]
    assert peak["selective"] <= peak["none"]  # flash attention: nothing left to drop
    explicit = ModelConfig(**{**model.to_dict(), "attention": "explicit"})
    assert (layer_activation_bytes(explicit, _lay(recompute="selective"), "bf16")
            < layer_activation_bytes(explicit, _lay(), "bf16"))


def test_step_model_charges_selective_less_than_full() -> None:
    from autotune.config.cluster import ClusterConfig

    model, cluster = MODEL_PRESETS["gpt-1.3b"], ClusterConfig(device="h100", devices_per_node=4)
    t = {rc: estimate_step(model, _lay(recompute=rc), cluster).step_time_s
         for rc in ("none", "selective", "full")}
    assert t["none"] < t["selective"] < t["full"]
    flops = {rc: hardware_flops_per_step(model, 8, recompute=rc)
             for rc in ("none", "selective", "full")}
    assert flops["none"] == model_flops_per_step(model, 8) < flops["selective"] < flops["full"]


def test_sp_is_never_assumed_to_need_more_memory() -> None:
    # A measured OOM without SP says nothing about the same layout with SP, and vice versa.
    assert not needs_no_less_memory(_lay(sequence_parallel=True), _lay())
    assert needs_no_less_memory(_lay(), _lay(sequence_parallel=True))
    assert needs_no_less_memory(_lay(), _lay(recompute="selective"))
    assert not needs_no_less_memory(_lay(recompute="selective"), _lay())


def test_deepspeed_config_turns_partitioned_pipeline_sends_off_only_with_sp_and_pp() -> None:
    from autotune.dsconfig import deepspeed_config

    sp_pp = Layout(tp=2, pp=2, dp=1, micro_batch=1, grad_accum=4, sequence_parallel=True)
    assert deepspeed_config(sp_pp, "bf16")["pipeline"] == {"pipe_partitioned": False,
                                                           "grad_partitioned": False}
    for lay in (_lay(sequence_parallel=True), Layout(tp=2, pp=2, dp=1, micro_batch=1,
                                                     grad_accum=4)):
        assert "pipeline" not in deepspeed_config(lay, "bf16")
