"""Sequence parallelism and selective recompute in the built-in trainer (fp32, CPU, tp = 2):
the losses equal the plain layout's and the peak memory falls as the memory model predicts.

One torchrun launch of the layouts of ``benchmarks/sp_selective_memory.py`` (which prints
the same figures), in increasing predicted peak (see its docstring for why).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.sp_selective_memory import LAYOUTS, TOLERANCE, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return run(Path(tmp_path_factory.mktemp("sp")), LAYOUTS)


def test_losses_equal_the_plain_layouts(figures: dict[str, dict]) -> None:
    for name, case in LAYOUTS.items():
        got, plain = figures[name]["losses"], figures[case.plain]["losses"]
        assert len(got) == 2  # the warm-up step's loss and the one after an update
        assert got == pytest.approx(plain, abs=1e-4), name


def test_peak_memory_falls_as_the_model_predicts(figures: dict[str, dict]) -> None:
    measured = {k: f for k, f in figures.items() if f["measured_bytes"] is not None}
    assert len(measured) >= 6, "fewer than 6 trials raised the process peak"
    for name, case in LAYOUTS.items():
        if name == case.plain:
            continue
        row, plain = figures[name], figures[case.plain]
        # Its reading is its own peak: it ran before the plain layout, which raised it.
        assert row["measured_bytes"] is not None and plain["measured_bytes"] is not None, name
        # The model's live bytes: the launch's mmap threshold removes the allocator's
        # retention that its CPU runtime allowance holds (see the benchmark's docstring).
        fall_p = plain["predicted_live_bytes"] - row["predicted_live_bytes"]
        fall_m = plain["measured_bytes"] - row["measured_bytes"]
        print(f"{name:24s} fall predicted {fall_p / 2**20:6.1f} MiB  measured "
              f"{fall_m / 2**20:6.1f} MiB  ({(fall_p - fall_m) / fall_m:+.1%})")
        assert fall_p > 0 and fall_m > 0, name
        assert abs(fall_p - fall_m) <= TOLERANCE * fall_m, name
