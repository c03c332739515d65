"""Single-process checks of the trainer's pieces (no launcher, no DeepSpeed engine)."""

from __future__ import annotations

import math

import pytest
import torch

from autotune.config.model import ModelConfig
from trainer.data import MemmapTokens, SyntheticTokens, micro_batches
from trainer.measure import flops_rates, summarize_step_times
from trainer.model import GPT, LossFn
from trainer.run import result_status_of_exception
from trainer.tensor_parallel import vocab_parallel_cross_entropy
from trainer.tp_context import TPContext

TINY = ModelConfig(n_layer=2, hidden=32, n_head=4, seq_len=16, vocab_size=64)


def test_parameter_count_matches_model_config() -> None:
    gpt = GPT(TINY, TPContext(), seed=1, recompute=False)
    assert sum(p.numel() for p in gpt.parameters()) == TINY.n_params()
    gqa = ModelConfig(n_layer=2, hidden=32, n_head=4, n_kv_head=2, seq_len=16, vocab_size=64)
    assert sum(p.numel() for p in GPT(gqa, TPContext(), 1, recompute=False).parameters()) \
        == gqa.n_params()
    swiglu = ModelConfig(n_layer=2, hidden=32, n_head=4, seq_len=16, vocab_size=64,
                         ffn_hidden=48, mlp="swiglu")
    assert sum(p.numel() for p in GPT(swiglu, TPContext(), 1, recompute=False).parameters()) \
        == swiglu.n_params()


def test_swiglu_block_computes_down_silu_gate_times_up() -> None:
    from trainer.model import Block

    m = ModelConfig(n_layer=1, hidden=32, n_head=4, seq_len=16, vocab_size=64, ffn_hidden=48,
                    mlp="swiglu")
    block = Block(m, TPContext(), seed=2, layer_index=1)
    assert block.fc1.bias is None and block.fc2.bias is None
    x = torch.randn(3, 32)
    gate, up = block.fc1.weight[:48], block.fc1.weight[48:]
    expected = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ block.fc2.weight.T
    assert torch.allclose(block.fc2(block._activation(block.fc1(x))), expected, atol=1e-6)


def _loss_and_grads(model: ModelConfig, *, seed: int, recompute: bool,
                    data_seed: int) -> tuple[float, torch.Tensor]:
    """One forward and backward of a 1-rank GPT: the loss and all gradients, flattened."""
    tokens = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(data_seed))
    gpt = GPT(model, TPContext(), seed=seed, recompute=recompute)
    loss = LossFn(model, TPContext())(gpt(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    return loss.item(), torch.cat([p.grad.flatten() for p in gpt.parameters()])


def test_explicit_attention_equals_sdpa_forward_and_backward() -> None:
    from dataclasses import replace

    (l0, g0), (l1, g1) = (_loss_and_grads(replace(TINY, attention=a), seed=4, recompute=False,
                                          data_seed=1) for a in ("flash", "explicit"))
    assert l0 == pytest.approx(l1, rel=1e-6)
    assert torch.allclose(g0, g1, atol=1e-6)


def test_tp1_loss_is_cross_entropy_and_recompute_changes_nothing() -> None:
    (l0, g0), (l1, g1) = (_loss_and_grads(TINY, seed=3, recompute=r, data_seed=0)
                          for r in (False, True))
    assert l0 == pytest.approx(l1, rel=1e-6)
    assert torch.allclose(g0, g1, atol=1e-6)
    assert l0 == pytest.approx(math.log(64), rel=0.05)  # near-uniform at init


def test_vocab_parallel_ce_without_group_is_plain_ce() -> None:
    logits = torch.randn(2, 5, 11)
    target = torch.randint(0, 11, (2, 5))
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
    assert vocab_parallel_cross_entropy(logits, target, TPContext()).item() == \
        pytest.approx(expected.item())


def test_global_batch_is_layout_independent() -> None:
    src = SyntheticTokens(vocab_size=100, seq_len=8, seed=5)
    one = micro_batches(src, step=2, dp=1, dp_rank=0, micro_batch=4, grad_accum=2)
    all_one = torch.cat([x for x, _ in one])
    parts = [x for d in range(4) for x, _ in
             micro_batches(src, step=2, dp=4, dp_rank=d, micro_batch=1, grad_accum=2)]
    assert sorted(map(tuple, all_one.tolist())) == sorted(map(tuple, torch.cat(parts).tolist()))


def test_memmap_tokens(tmp_path) -> None:
    import numpy as np

    path = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    src = MemmapTokens(str(path), seq_len=8, dtype="uint16")
    batch = src.global_batch(step=1, n_sequences=3)
    assert batch.shape == (3, 9) and batch.dtype == torch.int64
    assert batch[0].tolist() == list(range(24, 33))  # sequence 3 starts at token 3 * 8


def test_flops_rates_formula() -> None:
    from autotune.models.flops import model_flops_per_step

    r = flops_rates(TINY, global_batch=8, step_time_s=0.25, world_size=4, recompute=True,
                    device_name="NVIDIA H100 80GB HBM3", dtype="bf16")
    assert r.model_tflops_per_device == pytest.approx(
        model_flops_per_step(TINY, 8) / (0.25 * 4) / 1e12)
    assert r.hardware_tflops_per_device > r.model_tflops_per_device  # recompute forward
    assert r.mfu == pytest.approx(r.model_tflops_per_device / 989.0)
    assert r.tokens_per_s == pytest.approx(8 * 16 / 0.25)


def test_median_and_iqr_never_best_step() -> None:
    median, iqr = summarize_step_times([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (median, iqr) == (3.0, 2.0)


@pytest.mark.parametrize("err, status", [
    (None, "ok"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), "oom"),
    (MemoryError(), "oom"),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate"), "oom"),
    (RuntimeError("XPU out of memory"), "oom"),
    (RuntimeError("Timed out waiting 20000ms for recv"), "error"),
    (ValueError("bad"), "error"),
])
def test_result_status_of_exception(err: BaseException | None, status: str) -> None:
    assert result_status_of_exception(err) == status
