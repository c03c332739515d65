"""The energy counters' readers against directories laid out like sysfs (values in the
drivers' documented formats: decimal microjoules and a newline), wrap-around included,
and ``sacct``'s energy fields as SLURM prints them with ``-P``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.energy import (
    NOT_MEASURED,
    energy_text,
    parse_sacct_energy,
    sacct_energy_j_per_step,
)
from trainer.energy import (
    ENERGY_ROOT_ENV,
    EnergyMeter,
    Reading,
    counter_delta_j,
    hwmon_counters,
    rapl_counters,
    total_j,
)
from trainer.results import energy_figures

RAPL_RANGE_UJ = 262143328850  # max_energy_range_uj of a Xeon package (2**32 * 61.04 uJ)


def _write(path: Path, value: int | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")
    return path


def _rapl(root: Path, zone: str, energy_uj: int) -> Path:
    base = root / "sys" / "class" / "powercap" / zone
    _write(base / "name", "package-0" if zone.count(":") == 1 else "core")
    _write(base / "max_energy_range_uj", RAPL_RANGE_UJ)
    return _write(base / "energy_uj", energy_uj)


def _pvc_card(root: Path, hwmon: int, pci: str, *, tiles: bool) -> dict[str, Path]:
    """One Max 1550 card as i915 shows it: the card's hwmon ``i915`` and, with ``tiles``,
    one ``i915_gt<N>`` per tile, all linked to the card's PCI device."""
    device = root / "sys" / "devices" / "pci0000:00" / pci
    device.mkdir(parents=True, exist_ok=True)
    names = ["i915"] + (["i915_gt0", "i915_gt1"] if tiles else [])
    out = {}
    for i, name in enumerate(names):
        hw = root / "sys" / "class" / "hwmon" / f"hwmon{hwmon + i}"
        _write(hw / "name", name)
        out[name] = _write(hw / "energy1_input", 1_000_000 * (hwmon + i + 1))
        os.symlink(device, hw / "device")
    return out


def test_rapl_packages_only_and_the_wrap_at_max_energy_range(tmp_path: Path) -> None:
    pkg = _rapl(tmp_path, "intel-rapl:0", RAPL_RANGE_UJ - 2_000_000)  # 2 J below the top
    _rapl(tmp_path, "intel-rapl:0:0", 5)  # the core sub-zone: inside the package's count
    _rapl(tmp_path, "intel-rapl:1", 10_000_000)
    counters = rapl_counters(root=tmp_path)
    assert [c.key.rsplit("/", 2)[-2] for c in counters] == ["intel-rapl:0", "intel-rapl:1"]
    meter = EnergyMeter(counters)
    meter.start()
    _write(pkg, 3_000_000)  # wrapped: 2 J to the top, then 3 J
    _write(tmp_path / "sys/class/powercap/intel-rapl:1/energy_uj", 10_500_000)
    readings = meter.stop()
    assert readings is not None
    assert [round(r.joules, 6) for r in readings] == [5.0, 0.5]


def test_the_root_comes_from_the_environment(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _rapl(tmp_path, "intel-rapl:0", 7)
    monkeypatch.setenv(ENERGY_ROOT_ENV, str(tmp_path))
    assert len(rapl_counters()) == 1
    monkeypatch.setenv(ENERGY_ROOT_ENV, str(tmp_path / "nothing"))
    assert rapl_counters() == []


def test_hwmon_prefers_the_tile_and_falls_back_to_the_card(tmp_path: Path) -> None:
    first = _pvc_card(tmp_path, 0, "0000:29:00.0", tiles=True)
    second = _pvc_card(tmp_path, 3, "0000:3a:00.0", tiles=False)
    tile1 = hwmon_counters(0, 1, root=tmp_path)
    assert tile1 is not None and tile1.key.endswith(str(first["i915_gt1"]))
    card = hwmon_counters(1, 0, root=tmp_path)  # no tile-level counters on this card
    assert card is not None and card.key.endswith(str(second["i915"]))
    assert card.read_j() == 4.0  # 4,000,000 uJ
    # Both tiles of the second card read the one card counter: counted once.
    other_tile = hwmon_counters(1, 1, root=tmp_path)
    assert other_tile is not None and other_tile.key == card.key
    assert hwmon_counters(2, 0, root=tmp_path) is None


def test_hwmon_wraps_modulo_2_64_and_a_negative_long_is_the_same_count(tmp_path: Path) -> None:
    path = _pvc_card(tmp_path, 0, "0000:29:00.0", tiles=False)["i915"]
    _write(path, 2**64 - 1_500_000)  # 1.5 J below the top
    counter = hwmon_counters(0, None, root=tmp_path)
    assert counter is not None
    meter = EnergyMeter([counter])
    meter.start()
    _write(path, 2_500_000)
    (reading,) = meter.stop() or []
    assert reading.joules == pytest.approx(4.0)
    _write(path, -1_000_000)  # printed as a signed long: 2**64 - 1 J
    assert counter.read_j() == pytest.approx((2**64 - 1_000_000) / 1e6)


def test_a_counter_that_goes_backwards_without_a_range_is_not_a_measurement() -> None:
    with pytest.raises(ValueError, match="backwards"):
        counter_delta_j(10.0, 5.0, None)
    assert counter_delta_j(262_000.0, 5.0, 262_143.32885) == pytest.approx(148.32885)


def test_a_vanished_counter_or_no_counter_measures_nothing(tmp_path: Path) -> None:
    pkg = _rapl(tmp_path, "intel-rapl:0", 100)
    meter = EnergyMeter(rapl_counters(root=tmp_path))
    meter.start()
    pkg.unlink()
    assert meter.stop() is None
    empty = EnergyMeter([])
    empty.start()
    assert empty.stop() is None


def test_shared_counters_count_once_and_one_rank_without_makes_it_unknown() -> None:
    card = Reading("hwmon", "n1:/sys/class/hwmon/hwmon0/energy1_input", 30.0)
    other = Reading("hwmon", "n1:/sys/class/hwmon/hwmon3/energy1_input", 20.0)
    assert total_j([[card], [card], [other], [other]]) == (50.0, "hwmon")
    assert total_j([[card], None]) is None
    assert total_j([]) is None


def test_not_measured_is_never_zero() -> None:
    figures = energy_figures(None, 3, flops_per_step=1e9, tokens_per_step=128)
    assert set(figures.values()) == {None}
    assert energy_figures((0.0, "rapl"), 3, flops_per_step=1e9,
                          tokens_per_step=128)["energy_j_per_step"] is None
    assert energy_text(None, None) == NOT_MEASURED == "energy: not measured (no counter)"
    assert energy_text(0.0, "rapl") == NOT_MEASURED


# What `sacct -n -P -j 4711 -o JobID,ConsumedEnergyRaw,ElapsedRaw` prints on a site that
# accounts energy (acct_gather_energy/xcc on SuperMUC-NG) and on one that does not.
SACCT_ACCOUNTED = """4711|1234567|95
4711.batch|1234567|95
4711.extern|1234601|96
4711.0|907200|63
4711.1|0|2
"""
SACCT_UNACCOUNTED = """4712||40
4712.batch||40
4712.0||31
"""


def test_sacct_energy_as_slurm_prints_it() -> None:
    rows = parse_sacct_energy(SACCT_ACCOUNTED)
    assert rows["4711.0"].energy_j == 907200.0 and rows["4711.0"].elapsed_s == 63.0
    assert rows["4711.1"].energy_j is None  # 0: nothing sampled yet, not "0 J"
    # 907.2 kJ over 63 s = 14.4 kW over the step's nodes; a 0.25 s step: 3.6 kJ.
    assert sacct_energy_j_per_step(rows["4711.0"], 0.25) == pytest.approx(3600.0)
    unaccounted = parse_sacct_energy(SACCT_UNACCOUNTED)
    assert sacct_energy_j_per_step(unaccounted["4712.0"], 0.25) is None
    assert sacct_energy_j_per_step(None, 0.25) is None
    assert parse_sacct_energy("") == {}


def test_the_slurm_launcher_fills_in_sacct_energy_only_where_devices_measured_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.launchers import slurm
    from autotune.trial import LaunchReport, TrialResult

    asked: list[list[str]] = []

    def fake_slurm(cmd: list[str]) -> str:
        asked.append(cmd)
        return SACCT_ACCOUNTED

    monkeypatch.setattr(slurm, "_slurm", fake_slurm)

    monkeypatch.setattr("autotune.launchers.slurm_commands._slurm", fake_slurm)
    extra = {"tokens_per_step": 1000, "model_flops_per_step": 7.2e15}
    bare = TrialResult(status="ok", step_time_s=0.25, extra=extra)
    measured = TrialResult(status="ok", step_time_s=0.25, energy_j_per_step=50.0,
                           energy_source="hwmon", extra=extra)
    failed = TrialResult(status="oom")
    reports = [LaunchReport(result=r, returncode=0) for r in (bare, measured, failed)]
    out = slurm._with_sacct_energy(reports, "4711.0")
    assert asked == [["sacct", "-n", "-P", "-j", "4711.0", "-o",
                      "JobID,ConsumedEnergyRaw,ElapsedRaw"]]
    first = out[0].result
    assert first is not None and first.energy_source == "sacct"
    assert first.energy_j_per_step == pytest.approx(3600.0)  # 907.2 kJ / 63 s x 0.25 s
    assert first.joules_per_token == pytest.approx(3.6)
    assert first.model_tflops_per_watt == pytest.approx(2.0)
    assert out[1].result is measured and out[2].result is failed
    monkeypatch.setattr(slurm, "_slurm", lambda cmd: SACCT_UNACCOUNTED)
    monkeypatch.setattr("autotune.launchers.slurm_commands._slurm", lambda cmd: SACCT_UNACCOUNTED)
    assert slurm._with_sacct_energy(reports, "4712.0")[0].result is bare
    assert slurm._with_sacct_energy(reports, None)[0].result is bare
