"""A real study on one accelerator, measured against what the plan predicted for it.

Run where a CUDA (or XPU) device is at hand; on a CPU-only machine it says so and exits 2.
In one run:

1. **The layer's GEMMs by shape.** Every GEMM of one transformer layer of ``--preset``
   (QKV, projection, MLP up and down: ``(tokens x k) @ (k x n)`` as the trainer's
   ``F.linear`` runs them) at each micro-batch of the study, forward and the backward's two
   (input and weight gradients), timed with device events (5 warm-ups, the median of 20),
   beside the efficiency the cost model gives that shape
   (:func:`autotune.models.compute.shaped_gemm_time_s`) and one large square GEMM
   (8192^3) as the device's ceiling.
2. **A real study.** ``python -m autotune run`` on a study file written here: the
   built-in trainer (DeepSpeed, bf16, flash attention) of ``--preset`` on this one device,
   a grid over micro-batch (1, 2, 4, 8) and recompute (none, full), every trial in one
   launch, no early stop, no confirmation round, nothing learned from other studies. From
   its database: each trial's measured model TFLOPS and peak memory beside the
   predictions the study stored for it (``predicted_tflops_per_device``,
   ``predicted_memory_bytes``: the cost and memory models a real study ranks with), their
   ratio, and the median.

    python benchmarks/gpu_study_check.py                     # gpt-1.3b on the local GPU
    python benchmarks/gpu_study_check.py --preset gpt-3.6b --json out.json

Nothing is asserted: the figures are for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MICRO_BATCHES = (1, 2, 4, 8)
RECOMPUTE = ("none", "full")


def _args(argv: list[str] | None) -> argparse.Namespace:
    from autotune.config.model import MODEL_PRESETS

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="gpt-1.3b", choices=sorted(MODEL_PRESETS))
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--cpu", action="store_true",
                   help="a smoke run of the study on this CPU (fp32, no GEMMs): checks the "
                        "script, not the device")
    p.add_argument("--skip-gemms", action="store_true", help="only the study")
    p.add_argument("--skip-study", action="store_true", help="only the GEMMs")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    return p.parse_args(argv)


def _device(cpu: bool) -> tuple[str, str] | None:
    """(torch device kind, its name) of the local accelerator, chosen as the trainer
    chooses it (:func:`trainer.distributed.accelerator_kind`); ``None``: there is none."""
    import torch

    from trainer.distributed import accelerator_kind

    if cpu:
        return "cpu", "cpu"
    kind = accelerator_kind("auto")
    return None if kind == "cpu" else (kind, getattr(torch, kind).get_device_name(0))


def _dtype(kind: str) -> str:
    """The study's dtype: bf16 on an accelerator, fp32 on the CPU (bf16 is 3-4x slower
    than fp32 on AVX2)."""
    return "fp32" if kind == "cpu" else "bf16"


def _time_gemm(kind: str, m: int, n: int, k: int, reps: int = 20) -> float:
    """Median seconds of ``(m x k) @ (k x n)`` in bf16 on the device (device events)."""
    import torch

    dev = torch.device(kind)
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    events = torch.cuda if kind == "cuda" else torch.xpu
    times = []
    for i in range(5 + reps):
        start, end = events.Event(enable_timing=True), events.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b)
        end.record()
        end.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def gemm_rows(kind: str, spec: Any, model: Any) -> dict[str, Any]:
    """Measured against modelled efficiency of every layer GEMM at each micro-batch."""
    from autotune.models.compute import shaped_gemm_time_s

    peak = spec.peak_flops_or_fallback("bf16")
    h, f = model.hidden, model.ffn
    big = 8192
    ceiling = 2.0 * big ** 3 / _time_gemm(kind, big, big, big) / peak
    print(f"[gemm] {big}^3 bf16: {ceiling:.1%} of the datasheet peak "
          f"({peak / 1e12:.0f} TFLOPS); the table's gemm_efficiency_max "
          f"{spec.gemm_efficiency_max:.2f}", flush=True)
    rows = []
    for mb in MICRO_BATCHES:
        tokens = mb * model.seq_len
        for name, n, k in (("qkv", 3 * h, h), ("proj", h, h), ("mlp_up", f, h),
                           ("mlp_down", h, f)):
            flops = 2.0 * tokens * n * k
            modelled = flops / shaped_gemm_time_s(tokens, n, k, peak, spec) / peak
            measured = {"forward": flops / _time_gemm(kind, tokens, n, k) / peak,
                        "input_grad": flops / _time_gemm(kind, tokens, k, n) / peak,
                        "weight_grad": flops / _time_gemm(kind, n, k, tokens) / peak}
            rows.append({"micro_batch": mb, "gemm": name, "m": tokens, "n": n, "k": k,
                         "modelled": modelled, **measured})
            print(f"[gemm] mb {mb} {name:8s} ({tokens}x{k})@({k}x{n}): modelled "
                  f"{modelled:.1%}, measured fwd {measured['forward']:.1%} dgrad "
                  f"{measured['input_grad']:.1%} wgrad {measured['weight_grad']:.1%}",
                  flush=True)
    mean = statistics.mean((r["forward"] + r["input_grad"] + r["weight_grad"]) / 3
                           for r in rows)
    print(f"[gemm] layer GEMMs: mean measured {mean:.1%} of peak against modelled "
          f"{statistics.mean(r['modelled'] for r in rows):.1%}", flush=True)
    return {"square_8192": ceiling, "table_gemm_efficiency_max": spec.gemm_efficiency_max,
            "mean_measured": mean, "rows": rows}


def _study(directory: Path, kind: str, spec: Any, preset: str, global_batch: int) -> Path:
    doc = {"name": "gpu-check",
           "model": {"preset": preset},
           "cluster": {"nodes": 1, "devices_per_node": 1, "device": spec.name},
           "training": {"global_batch": global_batch, "dtype": _dtype(kind)},
           "search": {"strategy": "grid", "tp": [1], "pp": [1],
                      "micro_batch": list(MICRO_BATCHES), "zero_stage": [0],
                      "recompute": list(RECOMPUTE),
                      "n_trials": len(MICRO_BATCHES) * len(RECOMPUTE), "confirm": 0,
                      "learn_from_database": False},
           "trial": {"warmup_steps": 2, "measure_steps": 5, "device": kind,
                     "batch_size": len(MICRO_BATCHES) * len(RECOMPUTE),
                     "early_stop_tolerance": None, "timeout_s": 900},
           "storage": {"url": f"sqlite:///{directory / 'gpu-check.db'}"},
           "launcher": {"kind": "local", "run_dir": str(directory / "runs")}}
    path = directory / "study.yaml"
    path.write_text(json.dumps(doc, indent=1))  # JSON is YAML
    return path


def study_rows(kind: str, spec: Any, preset: str, global_batch: int) -> dict[str, Any]:
    """Run the study (what ``autotune run`` does) and read measured against predicted."""
    from autotune.spec import load_study
    from autotune.storage import open_storage

    with tempfile.TemporaryDirectory() as tmp:
        path = _study(Path(tmp), kind, spec, preset, global_batch)
        code = subprocess.call([sys.executable, "-m", "autotune", "run", str(path)],
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
        study = load_study(path)
        storage = open_storage(study.storage)
        rows = storage.study_measurements(study.name, (
            "layout_key", "outcome", "model_tflops_per_device", "predicted_tflops_per_device",
            "peak_memory_bytes", "predicted_memory_bytes", "step_time_s"))
    gib = 2.0 ** 30
    peak = spec.peak_flops_or_fallback(_dtype(kind))
    out = []
    for r in rows:
        tf, ptf = r["model_tflops_per_device"], r["predicted_tflops_per_device"]
        mem, pmem = r["peak_memory_bytes"], r["predicted_memory_bytes"]
        row = {"layout": r["layout_key"], "outcome": r["outcome"], "tflops": tf,
               "predicted_tflops": ptf,
               "mfu": tf * 1e12 / peak if tf else None,
               "tflops_ratio": ptf / tf if tf and ptf else None,
               "peak_gib": mem / gib if mem else None,
               "predicted_gib": pmem / gib if pmem else None,
               "memory_ratio": pmem / mem if mem and pmem else None}
        out.append(row)
        print(f"[study] {row['layout']:30s} {row['outcome']:9s} measured "
              f"{tf or 0:8.4g} TFLOPS (MFU {row['mfu'] or 0:.1%}), predicted {ptf or 0:8.4g} "
              f"(x{row['tflops_ratio'] or 0:.2f}); peak {row['peak_gib'] or 0:6.2f} GiB, "
              f"predicted {row['predicted_gib'] or 0:6.2f} (x{row['memory_ratio'] or 0:.2f})",
              flush=True)
    ratios = [r["tflops_ratio"] for r in out if r["tflops_ratio"]]
    mems = [r["memory_ratio"] for r in out if r["memory_ratio"]]
    med_tf = statistics.median(ratios) if ratios else None
    med_mem = statistics.median(mems) if mems else None
    best = max((r["mfu"] or 0.0) for r in out) if out else None
    summary = {"exit": code, "rows": out, "median_tflops_ratio": med_tf,
               "median_memory_ratio": med_mem, "best_mfu": best}

    def fmt(x: float | None, how: str) -> str:
        return "-" if x is None else format(x, how)

    print(f"[study] exit {code}; predicted over measured: TFLOPS median "
          f"x{fmt(med_tf, '.2f')}, peak memory median x{fmt(med_mem, '.2f')}; best MFU "
          f"{fmt(best, '.1%')}", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    import torch

    from autotune.config.model import MODEL_PRESETS
    from autotune.hardware import HARDWARE, device_spec_for_name

    found = _device(args.cpu)
    if found is None:
        print("gpu_study_check: no CUDA or XPU device here; run it where one is",
              file=sys.stderr)
        return 2
    kind, name = found
    spec = HARDWARE["cpu"] if kind == "cpu" else device_spec_for_name(name)
    if spec is None:
        print(f"gpu_study_check: {name!r} is not in autotune.hardware.HARDWARE "
              f"(known: {', '.join(HARDWARE)})", file=sys.stderr)
        return 2

    model = MODEL_PRESETS[args.preset]
    print(f"gpu_study_check: {name} ({spec.name}), torch {torch.__version__}, "
          f"{args.preset}", flush=True)
    figures: dict[str, Any] = {"device": name, "hardware": spec.name,
                               "torch": torch.__version__, "preset": args.preset}
    if not args.skip_gemms and kind != "cpu":
        figures["gemms"] = gemm_rows(kind, spec, model)
    if not args.skip_study:
        figures["study"] = study_rows(kind, spec, args.preset, args.global_batch)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
