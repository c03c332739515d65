"""Megatron-DeepSpeed arguments agree with the layout they come from."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.layout import Layout
from autotune.report.export import megatron_deepspeed_args
from autotune.workloads.megatron import FLASH_FLAGS
from tests.report import synthetic

LAYOUTS = [Layout(tp=1, pp=1, dp=8, micro_batch=4, grad_accum=1),
           Layout(tp=2, pp=4, dp=2, micro_batch=1, grad_accum=16, zero_stage=1,
                  recompute="full"),
           Layout(tp=4, pp=2, dp=1, micro_batch=2, grad_accum=8, zero_stage=0),
           Layout(tp=2, pp=2, dp=2, micro_batch=1, grad_accum=8, zero_stage=1,
                  recompute="selective", sequence_parallel=True)]
MODEL = {"n_layer": 24, "hidden": 2048, "n_head": 16, "seq_len": 2048, "ffn_hidden": None}


def _parse(args: list[str]) -> dict[str, str | bool]:
    """``--name value`` pairs and bare ``--flag``s of an argument list."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        assert args[i].startswith("--"), args[i]
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[args[i]] = args[i + 1]
            i += 2
        else:
            out[args[i]] = True
            i += 1
    return out


def assert_consistent(args: dict[str, str | bool], lay: Layout, dtype: str) -> None:
    tp, pp = int(args["--tensor-model-parallel-size"]), int(args["--pipeline-model-parallel-size"])
    mb, gb = int(args["--micro-batch-size"]), int(args["--global-batch-size"])
    assert (tp, pp, mb, int(args["--zero-stage"])) == (lay.tp, lay.pp, lay.micro_batch,
                                                       lay.zero_stage)
    # Megatron derives dp = world / (tp * pp) and grad_accum = gb / (mb * dp) from these:
    # on the layout's world size they give back the layout's dp and grad_accum.
    dp = lay.world_size // (tp * pp)
    assert dp == lay.dp and gb % (mb * dp) == 0 and gb // (mb * dp) == lay.grad_accum
    assert ("--no-pipeline-parallel" in args) == (lay.pp == 1)
    # Megatron's own recompute flags, never DeepSpeed's (issue 21 item 5).
    assert args.get("--recompute-granularity", "none") == lay.recompute
    assert ("--recompute-method" in args) == (lay.recompute == "full")
    assert "--checkpoint-activations" not in args
    assert "--deepspeed-activation-checkpointing" not in args
    assert ("--sequence-parallel" in args) == lay.sequence_parallel
    assert ("--bf16" in args) == (dtype == "bf16")


@pytest.mark.parametrize("lay", LAYOUTS, ids=str)
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_megatron_deepspeed_args_match_the_layout(lay: Layout, dtype: str) -> None:
    args = _parse(megatron_deepspeed_args(lay, dtype=dtype, model=MODEL))
    assert_consistent(args, lay, dtype)
    assert args["--num-layers"] == "24" and args["--hidden-size"] == "2048"
    assert args["--num-attention-heads"] == "16"
    assert args["--ffn-hidden-size"] == str(4 * 2048)  # Megatron's default when unset
    assert args["--seq-length"] == args["--max-position-embeddings"] == "2048"
    assert MODEL["n_head"] % lay.tp == 0  # heads split evenly over tensor-parallel ranks
    assert "--swiglu" not in args
    # The study's dropout, spelled out (Megatron's default for both would be 0.1).
    assert args["--hidden-dropout"] == args["--attention-dropout"] == "0"
    dropped = _parse(megatron_deepspeed_args(lay, dtype=dtype, model={**MODEL, "dropout": 0.1}))
    assert dropped["--hidden-dropout"] == dropped["--attention-dropout"] == "0.1"
    gated = megatron_deepspeed_args(lay, dtype=dtype, model={**MODEL, "mlp": "swiglu"})
    assert gated.count("--swiglu") == 1
    assert not set(args) & set(FLASH_FLAGS)  # no device: no fused-attention flag
    # The default attention, as tuned, in the flag that works on the study's device: the
    # op builder on an Intel Max 1550 (--use-flash-attn is FlashAttention v1, CUDA-only).
    for device, flag in (("max1550-tile", "--use-flash-attn-builder"),
                         ("h100", "--use-flash-attn-v2"), ("cpu", None)):
        on = megatron_deepspeed_args(lay, dtype=dtype, model=MODEL, device=device)
        assert [a for a in on if a in FLASH_FLAGS] == ([flag] if flag else [])
    explicit = megatron_deepspeed_args(lay, dtype=dtype, device="max1550-tile",
                                       model={**MODEL, "attention": "explicit"})
    assert not set(explicit) & set(FLASH_FLAGS)


def test_best_emit_megatron_deepspeed_is_the_best_trials_layout(
        synthetic_db: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["best", "synthetic", "--storage", f"sqlite:///{synthetic_db}",
                 "--emit", "megatron-deepspeed"]) == 0
    args = _parse(shlex.split(capsys.readouterr().out))
    best = max((t for t in synthetic.TRIALS if t[4] == "complete"), key=lambda t: t[5] or 0)
    tp, pp, mb, z = best[:4]
    dp = synthetic.WORLD // (tp * pp)
    lay = Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb,
                 grad_accum=synthetic.GLOBAL_BATCH // (dp * mb), zero_stage=z)
    assert_consistent(args, lay, "bf16")
    assert args["--num-layers"] == "24" and args["--seq-length"] == "2048"
