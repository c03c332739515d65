"""Sequence parallelism and selective recompute: the trainer's losses and peak memory
against the memory model, on the CPU (fp32, gloo, 2 ranks).

    PYTHONPATH=. python benchmarks/sp_selective_memory.py [--json OUT]

One torchrun launch runs every layout of :data:`LAYOUTS` (tp = 2 on two ranks) in order of
increasing predicted peak: the trainer reports the process's lifetime peak RSS
(``ru_maxrss``), so a reading is its own trial's peak only where it raised the peak of the
trials before it (the others are left out, as in ``tests/models/test_memory_vs_trainer.py``).

The launch sets glibc's ``MALLOC_MMAP_THRESHOLD_`` (mallopt(3), ``M_MMAP_THRESHOLD``) to
128 KiB: blocks above it are mapped and unmapped, never kept in the heap (with 1 MiB the
1 MiB tensors here, a rank's Q, K, V and sequence shards, still came from the heap, and the
falls of full recompute read 6-17 MiB above the model's from run to run; with 128 KiB they
repeat within 0.2 MiB). By default glibc
raises that threshold each time a large block is freed, after which activations and score
matrices come from the heap, whose freed holes stay resident: the peak RSS then carries
some 20-200 MiB of retention that depends on the order of allocations, more than the falls
measured here (e.g. the explicit layouts read 23-27 % above the model by default, the flash
ones 1-6 %). With the fixed threshold the *falls* between layouts are the allocations'
own, so each is compared with the fall of the model's live bytes (its peak less the
runtime allowance, which on CPU holds the default allocator's retention,
:data:`~autotune.models.memory.CPU_ALLOCATOR_OVERHEAD`: with it the selective falls read
10-28 % above the measured ones); the absolute peaks read 22-26 % below the model's,
whose allowance is calibrated on the default allocator. Measured (fall predicted /
measured, MiB): sp 18.0 / 15.6, full-sp 68.0 / 69.1, selective 48.0 / 46.8,
selective-sp 64.0 / 62.4, and with ``--all`` full 60.0 / 62.4, explicit sp 16.0 / 15.6,
explicit full-sp 108.0 / 111.1.
It prints, per layout, the predicted and measured peak (MiB), the error, the predicted
(live bytes) and measured fall from the plain layout (the same model without either
technique), and the largest difference of its losses from the plain layout's.
``tests/models/test_memory_sp_selective.py`` asserts the same figures for the same layouts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from autotune.config.model import ModelConfig
from autotune.layout import Layout, Recompute
from autotune.models.memory import estimate_memory

REPO = Path(__file__).resolve().parents[1]
MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"
MMAP_THRESHOLD_BYTES = 2**17

TOLERANCE = 0.25
"""The memory model's stated error against the trainer's peak RSS on CPU (the tolerance of
``tests/models/test_memory_vs_trainer.py``), here applied to each fall from the plain
layout (as that file does for the score matrices' term)."""

# Activations dominate: 4 layers of s b h = 512 x 4 x 256 (fp32: ~10 MB per layer and
# micro-batch without either technique), states ~25 MB per rank. The explicit model's score
# matrices (2 a s / h = 16 per s b h, over t = 2) are what selective recompute removes.
FLASH = ModelConfig(n_layer=4, hidden=256, n_head=8, seq_len=512, vocab_size=512,
                    name="sp-flash")
EXPLICIT = ModelConfig(n_layer=4, hidden=256, n_head=8, seq_len=512, vocab_size=512,
                       attention="explicit", name="sp-explicit")


@dataclass(frozen=True)
class Case:
    model: ModelConfig
    layout: Layout
    plain: str
    """The case of the same model and micro-batch without either technique."""


def _lay(recompute: Recompute = "none", sp: bool = False) -> Layout:
    return Layout(tp=2, pp=1, dp=1, micro_batch=4, grad_accum=1, recompute=recompute,
                  sequence_parallel=sp)


LAYOUTS: dict[str, Case] = {
    "flash-none": Case(FLASH, _lay(), "flash-none"),
    "flash-sp": Case(FLASH, _lay(sp=True), "flash-none"),
    "flash-full-sp": Case(FLASH, _lay("full", sp=True), "flash-none"),
    "explicit-none": Case(EXPLICIT, _lay(), "explicit-none"),
    "explicit-selective": Case(EXPLICIT, _lay("selective"), "explicit-none"),
    "explicit-selective-sp": Case(EXPLICIT, _lay("selective", sp=True), "explicit-none"),
}
"""The layouts the test runs (``tests/models/test_memory_sp_selective.py``)."""

MORE: dict[str, Case] = {
    "flash-full": Case(FLASH, _lay("full"), "flash-none"),
    "explicit-sp": Case(EXPLICIT, _lay(sp=True), "explicit-none"),
    "explicit-full-sp": Case(EXPLICIT, _lay("full", sp=True), "explicit-none"),
}
"""What the script adds (``--all``): each costs some 10 s of two CPU cores."""


def predicted(case: Case) -> tuple[int, int]:
    """The model's peak, and its live bytes: the peak less the runtime allowance, what the
    launch's mmap threshold leaves the peak RSS to measure (the allowance's allocator
    retention is gone)."""
    est = estimate_memory(case.model, case.layout, dtype="fp32", device="cpu")
    return est.peak_bytes, est.peak_bytes - est.runtime_bytes


def _spec(case: Case) -> dict:
    return {"model": case.model.to_dict(), "layout": case.layout.to_dict(),
            "run": {"warmup_steps": 1, "measure_steps": 1, "measure_precision": None,
                    "dtype": "fp32", "seed": 3,
                    "device": "cpu"}}


def run(tmp: Path, cases: dict[str, Case]) -> dict[str, dict]:
    """Launch ``cases`` in increasing predicted peak; per case its predicted and measured
    peak (``None`` where the reading is not its own), its losses (warm-up step and timed
    step: the second one follows an update, so it checks the gradients too) and status."""
    sys.path.insert(0, str(REPO / "tests" / "trainer"))
    from trainer_launch import launch  # the tests' torchrun helper

    peaks = {k: predicted(c) for k, c in cases.items()}
    order = sorted(cases, key=lambda k: peaks[k][0])
    saved = os.environ.get(MMAP_ENV)
    os.environ[MMAP_ENV] = str(MMAP_THRESHOLD_BYTES)  # launch() passes os.environ on
    try:
        code, results = launch(tmp, 2, {k: _spec(cases[k]) for k in order}, timeout_s=900)
    finally:
        if saved is None:
            os.environ.pop(MMAP_ENV, None)
        else:
            os.environ[MMAP_ENV] = saved
    if code != 0:
        raise RuntimeError({k: r.get("error") for k, r in results.items()})
    out: dict[str, dict] = {}
    running_max = 0
    for k in order:
        r = results[k]
        peak = int(r["peak_memory_bytes"])
        out[k] = {"predicted_bytes": peaks[k][0], "predicted_live_bytes": peaks[k][1],
                  "measured_bytes": peak if peak > running_max else None,
                  "losses": r["losses"], "status": r["status"]}
        running_max = max(running_max, peak)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--all", action="store_true", help="also the layouts of MORE")
    args = parser.parse_args(argv)
    cases = {**LAYOUTS, **(MORE if args.all else {})}
    with tempfile.TemporaryDirectory() as tmp:
        out = run(Path(tmp), cases)
    mib = 2**20
    print(f"{'layout':24s} {'predicted':>10s} {'measured':>10s} {'error':>7s} "
          f"{'fall pred':>10s} {'fall meas':>10s} {'|loss-plain|':>13s}")
    for k, case in cases.items():
        row, plain = out[k], out[case.plain]
        p, m = row["predicted_bytes"], row["measured_bytes"]
        err = f"{(p - m) / m:+.1%}" if m else "-"
        fall_p = (plain["predicted_live_bytes"] - row["predicted_live_bytes"]) / mib
        fall_m = ((plain["measured_bytes"] - m) / mib
                  if m and plain["measured_bytes"] else None)
        dloss = max(abs(a - b) for a, b in zip(row["losses"], plain["losses"], strict=True))
        print(f"{k:24s} {p / mib:10.1f} {(m or 0) / mib:10.1f} {err:>7s} {fall_p:10.1f} "
              f"{'-' if fall_m is None else f'{fall_m:.1f}':>10s} {dloss:13.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
