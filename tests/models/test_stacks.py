"""Memory by training stack (``autotune/models/stacks.py``): what each allocates per
parameter, and which stack a study resolves to."""

from __future__ import annotations

import pytest

from autotune.config.model import ModelConfig
from autotune.config.study import TrainingConfig
from autotune.errors import SpecError
from autotune.feasibility import MemoryBudget
from autotune.hardware import get_device
from autotune.landscape import AURORA_COLUMNS
from autotune.layout import Layout
from autotune.models.memory import COMM_BUCKET_ELEMENTS, estimate_memory, optimizer_temp_bytes
from autotune.models.memory_uncertainty import estimate_uncertainty
from autotune.models.stacks import REPLAY_STACK, STACKS, known_grad_accum_dtype, resolve_stack
from autotune.spec import parse_study

# A 3.6B GPT (3.7B with its output layer untied) in pure data parallelism on 64 A100
# 80GB, full recompute, no ZeRO.
GPT_3_6B = ModelConfig(n_layer=30, hidden=3072, n_head=32, seq_len=2048, vocab_size=51200,
                       attention="explicit", dropout=0.1)
PURE_DP = Layout(tp=1, pp=1, dp=64, micro_batch=1, grad_accum=1, zero_stage=0,
                 recompute="full")


def _states(stack: str, layout: Layout = PURE_DP) -> tuple[int, int]:
    est = estimate_memory(GPT_3_6B, layout, dtype="bf16", device="a100-80gb", stack=stack)
    return est.model_state_bytes, est.params_per_rank


def test_megatron_optimizer_keeps_18_bytes_and_the_distributed_one_6_plus_12_over_dp() -> None:
    states, n = _states("megatron")
    assert states == 18 * n  # bf16 weights, fp32 main_grad, fp32 main copy + 2 moments
    states, n = _states("megatron-distributed")
    assert states == pytest.approx((6 + 12 / 64) * n, rel=1e-9)
    # Megatron has no ZeRO: the stage does not change what it allocates.
    assert _states("megatron", Layout(**{**PURE_DP.to_dict(), "zero_stage": 1}))[0] == 18 * n
    deepspeed, n = _states("deepspeed")
    assert deepspeed == 20 * n  # ZeRO-0 bf16: + the fp32 accumulation buffer (2 + 6 + 12)


def test_megatron_ties_the_output_layer_to_the_embedding_where_a_rank_holds_both() -> None:
    """Megatron's GPT shares one V x h matrix between the word embedding and the output
    layer (no --untie-embeddings-and-output-weights); the built-in trainer unties them."""
    from autotune.models.memory import params_per_rank
    from autotune.models.stacks import ties_embeddings

    assert not ties_embeddings("deepspeed")
    assert all(ties_embeddings(s) for s in STACKS if s != "deepspeed")
    matrix = GPT_3_6B.vocab_size * GPT_3_6B.hidden  # t = 1: unpadded
    untied, tied = (params_per_rank(GPT_3_6B, PURE_DP, "only", tied=t) for t in (False, True))
    assert untied - tied == matrix
    assert _states("megatron")[1] == _states("deepspeed-fused-adam")[1] == tied
    assert _states("deepspeed")[1] == untied
    # With a pipeline each end keeps its own matrix: the stages' counts do not change.
    piped = Layout(tp=1, pp=2, dp=32, micro_batch=1, grad_accum=1, recompute="full")
    for stage in ("first", "last"):
        assert (params_per_rank(GPT_3_6B, piped, stage, tied=True)
                == params_per_rank(GPT_3_6B, piped, stage, tied=False))


def test_either_stack_fits_with_the_mean_of_both_stacks_probabilities() -> None:
    """A table that does not say whether Megatron-DeepSpeed ran under DeepSpeed's engine
    or Megatron's own optimizer: P(fit) is the mixture's, the peak shown the engine's."""
    from autotune.models.stacks import EITHER, EITHER_STACKS, memory_stacks

    assert memory_stacks(EITHER) == EITHER_STACKS == ("deepspeed-fused-adam", "megatron")
    assert memory_stacks("megatron") == ("megatron",)
    cap = get_device("a100-80gb").memory_bytes
    for mb in (1, 8):
        lay = Layout(**{**PURE_DP.to_dict(), "micro_batch": mb})
        v = {s: MemoryBudget(cap, dtype="bf16", device="a100-80gb", stack=s)
             .verdict(GPT_3_6B, lay) for s in (*EITHER_STACKS, EITHER)}
        assert v[EITHER].p_fit == pytest.approx(
            (v["deepspeed-fused-adam"].p_fit + v["megatron"].p_fit) / 2)
        assert v[EITHER].predicted_bytes == v["deepspeed-fused-adam"].predicted_bytes
        assert v["deepspeed-fused-adam"].p_fit < v[EITHER].p_fit < v["megatron"].p_fit
    # The step time is the DeepSpeed engine's.
    from autotune.config.cluster import ClusterConfig
    from autotune.models.cost import estimate_step

    cluster = ClusterConfig(nodes=8, devices_per_node=8, device="a100-80gb")
    assert (estimate_step(GPT_3_6B, PURE_DP, cluster, stack=EITHER)
            == estimate_step(GPT_3_6B, PURE_DP, cluster, stack="deepspeed-fused-adam"))


def test_only_torch_adamw_has_its_temporary_and_only_deepspeed_its_buckets() -> None:
    ests = {s: estimate_memory(GPT_3_6B, PURE_DP, dtype="bf16", device="a100-80gb", stack=s)
            for s in STACKS}
    n = ests["deepspeed"].params_per_rank
    assert (ests["deepspeed"].buffers_bytes - ests["deepspeed-fused-adam"].buffers_bytes
            == optimizer_temp_bytes(n, PURE_DP))
    assert ests["megatron"].buffers_bytes == 0 < ests["deepspeed-fused-adam"].buffers_bytes


def test_the_fastest_pure_dp_rows_fit_under_the_stack_that_ran_them() -> None:
    """The built-in trainer's stack predicts 88 GiB and P(fit) ~0.16 on 80 GB; under a
    fused Adam or Megatron's own optimizer the layout is likelier than not to fit."""
    cap = get_device("a100-80gb").memory_bytes
    p = {s: MemoryBudget(cap, dtype="bf16", device="a100-80gb", stack=s)
         .verdict(GPT_3_6B, PURE_DP).p_fit for s in STACKS}
    assert p["deepspeed"] < 0.25
    assert p["deepspeed"] < p["deepspeed-fused-adam"] < p["megatron"] < p["megatron-distributed"]
    assert p["deepspeed-fused-adam"] > 0.5 and p["megatron"] > 0.9


def _study(**extra: object) -> dict:
    return {"model": {"preset": "tiny"}, "cluster": {"device": "cpu"},
            "training": {"global_batch": 4, "dtype": "fp32"}, **extra}


def test_auto_resolves_from_the_workload_or_the_table(tmp_path) -> None:
    assert parse_study(_study()).training.stack == "deepspeed"
    csv = tmp_path / "t.csv"
    csv.write_text("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,"
                   "sequence length,tensor parallelism,data parallelism,pipeline parallelism,"
                   "iteration time (ms)\n1,4,1,64,4,4,64,1,1,1,10\n")
    replay = parse_study(_study(launcher={"kind": "replay", "replay": {"landscape": str(csv)}}))
    # vTrain's format does not say whether DeepSpeed's engine ran: either stack.
    assert replay.training.stack == "megatron-deepspeed-either"
    # Found beside the study file, as the replay launcher finds it.
    beside = parse_study(_study(launcher={"kind": "replay", "replay": {"landscape": "t.csv"}}),
                         base_dir=tmp_path)
    assert beside.training.stack == "megatron-deepspeed-either"
    aurora = tmp_path / "a.csv"
    aurora.write_text(",".join(AURORA_COLUMNS) + "\n")
    replay = parse_study(_study(launcher={"kind": "replay", "replay": {"landscape": str(aurora)}}))
    assert replay.training.stack == REPLAY_STACK == "deepspeed-fused-adam"
    # A table that cannot be read: the launcher says why; the stack is the default.
    missing = _study(launcher={"kind": "replay", "replay": {"landscape": "nowhere.csv"}})
    assert parse_study(missing).training.stack == REPLAY_STACK
    assert resolve_stack("auto", "megatron-deepspeed") == "deepspeed-fused-adam"
    given = _study()
    given["training"]["stack"] = "megatron-distributed"
    assert parse_study(given).training.stack == "megatron-distributed"
    with pytest.raises(SpecError, match=r"training\.stack: got 'apex'"):
        TrainingConfig(global_batch=4, stack="apex")


def test_the_gradient_reduction_moves_what_the_stack_reduces() -> None:
    # Megatron's own DDP all-reduces its fp32 gradient buffer (bf16 forces fp32
    # accumulation): twice DeepSpeed's bf16 bytes; the distributed optimizer's
    # reduce-scatter of fp32 gradients and all-gather of bf16 weights: 1.5 times. The
    # same layout, the same cluster; only the stack differs.
    from autotune.config.cluster import ClusterConfig
    from autotune.models.communication import dp_reduce_time_s
    from autotune.models.cost import estimate_step
    from autotune.models.memory import params_per_rank

    cluster = ClusterConfig(nodes=8, devices_per_node=8, device="a100-80gb")
    step = {s: estimate_step(GPT_3_6B, PURE_DP, cluster, stack=s)
            for s in ("deepspeed", "megatron", "megatron-distributed")}
    n = params_per_rank(GPT_3_6B, PURE_DP, "only")
    bf16 = dp_reduce_time_s(n, PURE_DP, cluster, "bf16")
    assert step["deepspeed"].dp_comm_s == pytest.approx(bf16)  # ZeRO-0: after the backward
    # Megatron's GPT reduces one embedding matrix (tied to the output layer): n less V h.
    n = params_per_rank(GPT_3_6B, PURE_DP, "only", tied=True)
    fp32 = dp_reduce_time_s(n, PURE_DP, cluster, "bf16", bytes_per_param=4)
    three = dp_reduce_time_s(n, PURE_DP, cluster, "bf16", bytes_per_param=3)
    bf16 = dp_reduce_time_s(n, PURE_DP, cluster, "bf16")
    assert step["megatron"].dp_comm_s == pytest.approx(fp32)
    assert step["megatron-distributed"].dp_comm_s == pytest.approx(three)
    # Bandwidth-bound at 3.7 GB of gradients: the bytes' ratio, within the latency terms.
    assert fp32 / bf16 == pytest.approx(2.0, rel=0.01)
    assert three / bf16 == pytest.approx(1.5, rel=0.01)
    assert (step["megatron"].model_tflops_per_device
            < step["megatron-distributed"].model_tflops_per_device
            < step["deepspeed"].model_tflops_per_device)
    # Megatron's optimizer has no ZeRO: a ZeRO stage in the layout changes nothing there.
    zero1 = Layout(tp=1, pp=1, dp=64, micro_batch=1, grad_accum=1, zero_stage=1,
                   recompute="full")
    assert estimate_step(GPT_3_6B, zero1, cluster, stack="megatron").dp_comm_s == \
        pytest.approx(step["megatron"].dp_comm_s)


def test_a_study_plans_with_its_stack() -> None:
    from autotune.planning.plan import plan_study

    def doc(stack: str) -> dict[str, object]:
        return {"name": "s", "model": {"n_layer": 30, "hidden": 3072, "n_head": 32,
                                       "seq_len": 2048, "attention": "explicit"},
                "cluster": {"nodes": 8, "devices_per_node": 8, "device": "a100-80gb"},
                "training": {"global_batch": 512, "dtype": "bf16", "stack": stack},
                "search": {"tp": [1], "pp": [1], "micro_batch": [1], "zero_stage": [0],
                           "recompute": ["full"]}}

    # Both run Megatron's GPT (one embedding matrix): only the bytes a parameter differ.
    plans = {s: plan_study(parse_study(doc(s))) for s in ("deepspeed-fused-adam", "megatron")}
    top = {s: p.rows[0] for s, p in plans.items()}
    # The plan says which stack it predicted for.
    import json

    from autotune.planning.plan import render_plan

    assert "(bf16, stack megatron)" in render_plan(plans["megatron"]).splitlines()[0]
    assert json.loads(render_plan(plans["megatron"], "json"))["stack"] == "megatron"
    assert top["megatron"].step.dp_comm_s == pytest.approx(
        2.0 * top["deepspeed-fused-adam"].step.dp_comm_s, rel=0.01)


def test_the_gradient_accumulation_dtype_is_known_where_autotune_writes_the_config(
        tmp_path) -> None:
    """DeepSpeed's engine accumulates gradients in ``data_types.grad_accum_dtype``, else the
    model's dtype (``get_data_types``, 0.19.8): known for the built-in trainer (autotune's
    config alone) and a Megatron-DeepSpeed trial (autotune's config plus
    ``workload.ds_config``); not for a user's command or a replayed table."""
    bf16 = {**_study(), "training": {"global_batch": 4, "dtype": "bf16"}}
    assert parse_study(bf16).training.grad_accum_dtype == "bf16"
    script = tmp_path / "train.py"
    script.write_text("")
    command = {**bf16, "workload": {"kind": "command", "argv": ["python", str(script)]}}
    assert parse_study(command).training.grad_accum_dtype is None
    csv = tmp_path / "t.csv"
    csv.write_text("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,"
                   "sequence length,tensor parallelism,data parallelism,pipeline parallelism,"
                   "iteration time (ms)\n1,4,1,64,4,4,64,1,1,1,10\n")
    replay = {**bf16, "launcher": {"kind": "replay", "replay": {"landscape": str(csv)}}}
    assert parse_study(replay).training.grad_accum_dtype is None
    fp32 = {"data_types": {"grad_accum_dtype": "fp32"}}
    assert known_grad_accum_dtype("megatron-deepspeed", "bf16", fp32) == "fp32"
    assert known_grad_accum_dtype("megatron-deepspeed", "bf16", {}) == "bf16"
    assert known_grad_accum_dtype("megatron-deepspeed", "bf16",
                                  {"data_types": {"grad_accum_dtype": "int8"}}) is None


def test_deepspeeds_wrapper_gradients_with_a_known_recipe() -> None:
    """bf16 below ZeRO-2 with gradients accumulated in bf16 (DeepSpeed's default): ZeRO-1
    is DeepSpeedZeroOptimizer (2 + 2/dp), ZeRO-0 with a pipeline BF16_Optimizer with a bf16
    buffer (2 + 2), without one FP16_Optimizer (2, and an 8-byte step: the fp32 copies and
    their flat buffer, after the activations are gone). Not known: 2 + 4, as before, with
    the other recipes in the error bar."""
    z1 = Layout(**{**PURE_DP.to_dict(), "zero_stage": 1})
    pipe = Layout(**{**PURE_DP.to_dict(), "pp": 2, "dp": 32, "grad_accum": 4})
    for layout, grads in ((z1, 2 + 2 / 64), (pipe, 4), (PURE_DP, 2)):
        known = estimate_memory(GPT_3_6B, layout, dtype="bf16", device="a100-80gb",
                                stack="deepspeed-fused-adam", grad_accum_dtype="bf16")
        unknown = estimate_memory(GPT_3_6B, layout, dtype="bf16", device="a100-80gb",
                                  stack="deepspeed-fused-adam")
        assert known.grads_bytes == pytest.approx(grads * known.params_per_rank, rel=1e-6)
        assert unknown.grads_bytes == 6 * unknown.params_per_rank
        assert [k for k, _ in estimate_uncertainty(GPT_3_6B, layout, known).terms].count(
            "grad_accumulation") == 0
        assert "grad_accumulation" in dict(estimate_uncertainty(GPT_3_6B, layout,
                                                                unknown).terms)
    # ZeRO-0 without a pipeline: the step's 8 bytes per parameter beyond the backward's
    # activations and buckets, whichever phase is larger.
    known = estimate_memory(GPT_3_6B, PURE_DP, dtype="bf16", device="a100-80gb",
                            stack="deepspeed-fused-adam", grad_accum_dtype="bf16")
    n = known.params_per_rank
    assert known.activations_bytes + known.buffers_bytes == max(
        8 * n, known.activations_bytes + min(n, COMM_BUCKET_ELEMENTS) * 2 * 2)
    assert known.peak_bytes == known.model_state_bytes + max(
        8 * n, known.activations_bytes + min(n, COMM_BUCKET_ELEMENTS) * 2 * 2) \
        + known.runtime_bytes


def test_fp16_has_one_recipe_per_stack_and_its_step_holds_fp32_gradients() -> None:
    """fp16 (a table measured so, as vTrain's): DeepSpeed's engine wraps ZeRO-0 in
    FP16_Optimizer with or without a pipeline (2 bytes of gradients, an 8-byte step),
    ZeRO-1 in DeepSpeedZeroOptimizer (2 + 2/dp); Megatron's optimizer keeps an fp16
    main_grad (16 bytes of states, not bf16's 18) and hands Adam fp32 copies of it at the
    step (4 more, 4/dp distributed). No recipe is unknown: no grad_accumulation term."""
    pipe = Layout(**{**PURE_DP.to_dict(), "pp": 2, "dp": 32, "grad_accum": 4})
    z1 = Layout(**{**PURE_DP.to_dict(), "zero_stage": 1})
    for layout, grads in ((PURE_DP, 2), (pipe, 2), (z1, 2 + 2 / 64)):
        est = estimate_memory(GPT_3_6B, layout, dtype="fp16", device="a100-80gb",
                              stack="deepspeed-fused-adam")
        n = est.params_per_rank
        assert est.grads_bytes == pytest.approx(grads * n, rel=1e-6)
        assert est.optimizer_bytes == pytest.approx(12 * n / (64 if layout is z1 else 1),
                                                    rel=1e-6)
        assert "grad_accumulation" not in dict(estimate_uncertainty(
            GPT_3_6B, layout, est, dtype="fp16", stack="deepspeed-fused-adam").terms)
        if layout.zero_stage == 0:  # FP16_Optimizer's step, the larger phase
            assert est.activations_bytes + est.buffers_bytes >= 8 * n
    for stack, excess in (("megatron", 4.0), ("megatron-distributed", 4 / 64)):
        fp16 = estimate_memory(GPT_3_6B, PURE_DP, dtype="fp16", device="a100-80gb",
                               stack=stack)
        bf16 = estimate_memory(GPT_3_6B, PURE_DP, dtype="bf16", device="a100-80gb",
                               stack=stack)
        n = fp16.params_per_rank
        assert bf16.model_state_bytes - fp16.model_state_bytes == 2 * n  # main_grad 4 -> 2
        assert bf16.buffers_bytes == 0  # bf16's main_grad is fp32 already: no copy
        # The step's copies replace the backward's activations where they are larger.
        assert fp16.buffers_bytes == max(0, int(excess * n) - fp16.activations_bytes
                                         - fp16.logits_bytes)


def test_fp16_is_a_replayed_tables_dtype_only() -> None:
    assert TrainingConfig(global_batch=8, dtype="fp16").dtype == "fp16"
    assert get_device("a100-80gb").peak_tflops("fp16") == get_device(
        "a100-80gb").peak_tflops("bf16") == 312.0
    study = {"model": {"preset": "tiny"}, "training": {"global_batch": 8, "dtype": "fp16"},
             "cluster": {"nodes": 1, "devices_per_node": 2, "device": "a100-80gb"}}
    with pytest.raises(SpecError, match=r"'fp16' only with launcher\.kind: replay"):
        parse_study(study)
