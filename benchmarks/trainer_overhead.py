"""How much does the trainer cost over a plain PyTorch loop, and how close to the matmul rate?

One process (world size 1), in the same run:

1. the trainer, through the same code path as a trial (:func:`trainer.run.run_trials`:
   DeepSpeed engine, ZeRO-0, torch AdamW, step timing with device syncs);
2. a plain PyTorch loop over the same model (:class:`trainer.model.GPT`, same shapes, same
   ``torch.optim.AdamW`` settings, no DeepSpeed; bf16 via autocast);
3. a matmul micro-benchmark (``torch.mm`` of one MLP matmul's shape: micro-batch tokens x
   hidden x ffn) in the same dtype.

Printed (goal in brackets): trainer tokens/s over plain-loop tokens/s [>= 0.90], the
trainer's model TFLOPS over the matmul TFLOPS, and on a GPU the MFU [>= 40% on an H200
with ``--device cuda --dtype bf16 --preset gpt-1.3b``]. Nothing is asserted.

    python benchmarks/trainer_overhead.py                       # CPU, small-30m, fp32
    python benchmarks/trainer_overhead.py --device cuda --dtype bf16 --preset gpt-1.3b
    python benchmarks/trainer_overhead.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "xpu"])
    p.add_argument("--dtype", default=None, choices=["fp32", "bf16"],
                   help="default: fp32 on cpu (bf16 is 3-4x slower on AVX2), bf16 otherwise")
    p.add_argument("--preset", default="small-30m")
    p.add_argument("--micro-batch", type=int, default=None, help="default: 4 cpu, 8 gpu")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--measure-steps", type=int, default=5)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    return p.parse_args(argv)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "xpu":
        torch.xpu.synchronize()


def run_trainer(spec: dict[str, Any]) -> dict[str, Any]:
    """One trial through ``trainer.run.run_trials`` (world size 1, in this process)."""
    from trainer.run import run_trials

    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        code = run_trials([(str(spec_path), str(result_path))], env={})
        result = json.loads(result_path.read_text())
    if code != 0:
        raise SystemExit(f"trainer failed ({result['status']}): {result['error']}")
    return result


def run_plain(model_cfg: Any, *, device: str, dtype: str, micro_batch: int, grad_accum: int,
              warmup: int, measure: int, seed: int) -> dict[str, Any]:
    """The same model and optimizer in a textbook PyTorch loop."""
    import torch

    from trainer.data import SyntheticTokens, micro_batches
    from trainer.engine import LEARNING_RATE
    from trainer.model import GPT, LossFn
    from trainer.tp_context import TPContext

    tp = TPContext()
    model = GPT(model_cfg, tp, seed, recompute=False).to(device)
    loss_fn = LossFn(model_cfg, tp)
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    source = SyntheticTokens(model_cfg.vocab_size, model_cfg.seq_len, seed)
    times = []
    for step in range(warmup + measure):
        batches = micro_batches(source, step=step, dp=1, dp_rank=0, micro_batch=micro_batch,
                                grad_accum=grad_accum)
        _sync(device)
        start = time.perf_counter()
        for inputs, labels in batches:
            with torch.autocast(device_type=device, dtype=torch.bfloat16,
                                enabled=dtype == "bf16"):
                loss = loss_fn(model(inputs.to(device)), labels.to(device)) / grad_accum
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        if step >= warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    del model, opt
    return {"step_time_s": median, "step_times_s": times,
            "tokens_per_s": micro_batch * grad_accum * model_cfg.seq_len / median}


def run_matmul(m: int, k: int, n: int, *, device: str, dtype: str, repeats: int) -> float:
    """TFLOPS of ``torch.mm`` (m x k) @ (k x n), median of ``repeats`` timed calls."""
    import torch

    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    a = torch.randn(m, k, device=device, dtype=dt)
    b = torch.randn(k, n, device=device, dtype=dt)
    for _ in range(3):
        torch.mm(a, b)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        times.append(time.perf_counter() - start)
    return 2.0 * m * k * n / statistics.median(times) / 1e12


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    micro = args.micro_batch or (4 if args.device == "cpu" else 8)
    # One process owns the machine: let the BLAS use every core (the trainer defaults to
    # one thread per rank because ranks usually share the cores).
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    from autotune.config.model import MODEL_PRESETS

    model_cfg = MODEL_PRESETS[args.preset]
    seed = 1234
    spec = {"model": {"preset": args.preset},
            "layout": {"tp": 1, "pp": 1, "dp": 1, "micro_batch": micro,
                       "grad_accum": args.grad_accum, "zero_stage": 0, "recompute": "none"},
            "run": {"warmup_steps": args.warmup_steps, "measure_steps": args.measure_steps,
                    "measure_precision": None,
                    "dtype": dtype, "seed": seed, "device": args.device}}
    trainer = run_trainer(spec)
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if args.device == "cuda":
        torch.cuda.empty_cache()
    plain = run_plain(model_cfg, device=args.device, dtype=dtype, micro_batch=micro,
                      grad_accum=args.grad_accum, warmup=args.warmup_steps,
                      measure=args.measure_steps, seed=seed)
    mm_tflops = run_matmul(micro * model_cfg.seq_len, model_cfg.hidden, model_cfg.ffn,
                           device=args.device, dtype=dtype, repeats=20)
    figures = {
        "preset": args.preset, "device": args.device, "device_name": trainer["device_name"],
        "dtype": dtype, "micro_batch": micro, "grad_accum": args.grad_accum,
        "n_params": model_cfg.n_params(), "threads": torch.get_num_threads(),
        "trainer_tokens_per_s": trainer["tokens_per_s"],
        "trainer_step_time_s": trainer["step_time_s"],
        "trainer_step_time_iqr_s": trainer["step_time_iqr_s"],
        "plain_tokens_per_s": plain["tokens_per_s"],
        "plain_step_time_s": plain["step_time_s"],
        "trainer_over_plain": trainer["tokens_per_s"] / plain["tokens_per_s"],
        "trainer_model_tflops": trainer["model_tflops_per_device"],
        "matmul_tflops": mm_tflops,
        "trainer_over_matmul": trainer["model_tflops_per_device"] / mm_tflops,
        "mfu": trainer["mfu"],
        "peak_memory_bytes": trainer["peak_memory_bytes"],
    }
    print(f"model {args.preset}: {model_cfg.n_params() / 1e6:.1f}M parameters, "
          f"{args.device} ({trainer['device_name']}), {dtype}, micro-batch {micro} x "
          f"grad-accum {args.grad_accum} x seq {model_cfg.seq_len}, "
          f"{figures['threads']} threads")
    print(f"trainer     {figures['trainer_tokens_per_s']:10.1f} tokens/s "
          f"(step {figures['trainer_step_time_s']:.3f} s, IQR "
          f"{figures['trainer_step_time_iqr_s']:.3f} s)")
    print(f"plain loop  {figures['plain_tokens_per_s']:10.1f} tokens/s "
          f"(step {figures['plain_step_time_s']:.3f} s)")
    print(f"trainer / plain = {figures['trainer_over_plain']:.3f}  (goal >= 0.90)")
    print(f"trainer model TFLOPS {figures['trainer_model_tflops']:.4f} vs torch.mm "
          f"{micro * model_cfg.seq_len}x{model_cfg.hidden}x{model_cfg.ffn} "
          f"{mm_tflops:.4f} TFLOPS: ratio {figures['trainer_over_matmul']:.3f}")
    if figures["mfu"] is not None:
        print(f"MFU {100 * figures['mfu']:.1f}%  (goal >= 40% on an H200, bf16, gpt-1.3b)")
    else:
        print("MFU: n/a (no peak FLOPS known for this device)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
