"""Energy of the timed steps, from the counters the platform has.

A rank reads its counter right before its first timed step and right after its last one
(both follow a device synchronisation: every step ends with one,
:class:`trainer.measure.StepClock`); the difference over the timed steps is the trial's
energy. Counters, with their unit, range and resolution as their drivers document them:

* **NVML** (``nvidia-ml-py``, imported only when a CUDA rank asks):
  ``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver was last
  reloaded, an unsigned 64-bit count (no wrap in practice), Volta and newer (NVML API
  reference, "Device Queries"). Per GPU.
* **hwmon** of Intel's i915/xe drivers: ``energy1_input``, microjoules (the hwmon sysfs
  ABI, ``Documentation/hwmon/sysfs-interface.rst``; ``i915_hwmon.c`` scales the
  hardware's 32-bit energy register by ``SF_ENERGY`` = 10**6 and accumulates its
  overflows in software into a 64-bit count, printed as a ``long``). Read modulo 2**64:
  a value printed negative is the same count, and an end below the start has wrapped
  once. Device (card) level under the hwmon named ``i915`` or ``xe`` (xe registers one
  hwmon per device, its ``energy1_input`` the card's: "drm/xe/hwmon: Treat hwmon as a
  per-device concept", 2024); tile level under i915's ``i915_gt<N>`` where the platform
  has per-tile energy (Max 1550: 2 tiles per card).
  Resolution: the register's unit, 1/2**14 J on Ponte Vecchio (``scl_shift_energy``).
* **RAPL** through powercap (``Documentation/power/powercap/powercap.rst``):
  ``/sys/class/powercap/intel-rapl:<N>/energy_uj``, microjoules per CPU package, wrapping
  at ``max_energy_range_uj`` (an end below the start: ``end + range - start``). Per host,
  whatever runs on it.

A counter several ranks share (a card's counter under its two tiles, a host's packages
under all its ranks) is counted once: each reading carries a ``key`` naming the physical
counter (host and path, or the GPU's UUID), and :func:`total_j` sums distinct keys.
A rank with no counter makes the trial's energy unknown (``None``), never a partial sum
and never 0. ``sacct``'s ``ConsumedEnergyRaw`` is read by the SLURM launcher after the
step ends (:mod:`autotune.energy`), not here.

The counters are looked up under :data:`ENERGY_ROOT_ENV` (default ``/``), so that tests
point the readers at a directory laid out like sysfs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ENERGY_ROOT_ENV", "Counter", "Reading", "EnergyMeter", "counter_delta_j",
           "hwmon_counters", "rapl_counters", "nvml_counter", "total_j"]

ENERGY_ROOT_ENV = "AUTOTUNE_ENERGY_ROOT"
"""Directory the sysfs paths are read under (``/`` when unset)."""

HWMON_WRAP_J = 2**64 / 1e6
"""hwmon's energy count is a 64-bit number of microjoules."""


@dataclass(frozen=True)
class Counter:
    """One physical energy counter as one rank sees it."""

    source: str
    """``nvml``, ``hwmon`` or ``rapl`` (the result's ``energy_source``)."""
    key: str
    """Names the physical counter across ranks (host and path, or GPU UUID)."""
    read_j: Callable[[], float]
    """The raw count, in joules."""
    wrap_j: float | None = None
    """The count's range in joules (``None``: it does not wrap)."""


@dataclass(frozen=True)
class Reading:
    """What one counter measured over the timed steps."""

    source: str
    key: str
    joules: float


def counter_delta_j(start_j: float, end_j: float, wrap_j: float | None) -> float:
    """Energy between two reads of a counter that wraps at ``wrap_j`` (at most once
    between them: the shortest wrap period of these counters, RAPL's ~60 min at 70 W
    on a 262 kJ range, is far longer than a trial's timed steps).

    >>> counter_delta_j(10.0, 25.5, None)
    15.5
    >>> counter_delta_j(262_000.0, 5.0, 262_143.328850)
    148.32885
    """
    if end_j >= start_j:
        return end_j - start_j
    if wrap_j is None:
        raise ValueError(f"energy counter went backwards ({start_j} J -> {end_j} J) and "
                         "does not wrap")
    return round(end_j + wrap_j - start_j, 9)


def _root(root: str | os.PathLike[str] | None) -> Path:
    return Path(root if root is not None else os.environ.get(ENERGY_ROOT_ENV) or "/")


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


def _uj_reader(path: Path, modulo: int | None = None) -> Callable[[], float]:
    def read() -> float:
        value = _read_int(path)
        return (value % modulo if modulo else value) / 1e6
    return read


def hwmon_counters(card: int, tile: int | None, *,
                   root: str | os.PathLike[str] | None = None) -> Counter | None:
    """The i915/xe hwmon counter of ``card`` (the n-th Intel GPU by PCI address): its
    ``tile``'s where the driver has tile-level counters, else the card's (shared by its
    tiles); ``None`` where there is none."""
    base = _root(root) / "sys" / "class" / "hwmon"
    cards: dict[str, dict[str, Path]] = {}
    for hw in sorted(base.glob("hwmon*")):
        try:
            name = (hw / "name").read_text().strip()
        except OSError:
            continue
        if not name.startswith(("i915", "xe")) or not (hw / "energy1_input").is_file():
            continue
        device = os.path.realpath(hw / "device") if (hw / "device").exists() else str(hw)
        cards.setdefault(device, {})[name] = hw / "energy1_input"
    ordered = [cards[d] for d in sorted(cards)]
    if card >= len(ordered):
        return None
    found = ordered[card]
    if tile is not None:
        for name in (f"i915_gt{tile}",):
            if name in found:
                return Counter("hwmon", f"{socket.gethostname()}:{found[name]}",
                               _uj_reader(found[name], 2**64), HWMON_WRAP_J)
    for name in ("i915", "xe"):
        if name in found:
            return Counter("hwmon", f"{socket.gethostname()}:{found[name]}",
                           _uj_reader(found[name], 2**64), HWMON_WRAP_J)
    return None


def rapl_counters(*, root: str | os.PathLike[str] | None = None) -> list[Counter]:
    """The host's RAPL package counters (``intel-rapl:<N>``, not their sub-zones, which
    the package's count includes); empty where powercap has none or cannot be read
    (Linux >= 5.10 lets only root read ``energy_uj``)."""
    base = _root(root) / "sys" / "class" / "powercap"
    out = []
    for zone in sorted(base.glob("intel-rapl:*")):
        if zone.name.count(":") != 1:
            continue
        energy, top = zone / "energy_uj", zone / "max_energy_range_uj"
        try:
            _read_int(energy)
            wrap_j = _read_int(top) / 1e6
        except (OSError, ValueError):
            continue
        out.append(Counter("rapl", f"{socket.gethostname()}:{energy}", _uj_reader(energy),
                           wrap_j))
    return out


def nvml_counter(index: int, uuid: str | None = None) -> Counter | None:
    """The NVML total-energy counter of a GPU (by UUID where known: CUDA's index under
    ``CUDA_VISIBLE_DEVICES`` is not NVML's); ``None`` without ``nvidia-ml-py`` or where
    the GPU has no such counter (before Volta)."""
    try:
        import pynvml  # nvidia-ml-py: optional, imported only on CUDA ranks
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        if uuid:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-"))
                                                      else f"GPU-{uuid}")
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        key = pynvml.nvmlDeviceGetUUID(handle)
    except pynvml.NVMLError:
        return None
    key = key.decode() if isinstance(key, bytes) else str(key)

    def read() -> float:
        return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1e3  # mJ -> J

    return Counter("nvml", key, read)


class EnergyMeter:
    """This rank's counters, read at the start and the end of the timed steps."""

    def __init__(self, counters: Sequence[Counter]) -> None:
        self.counters = tuple(counters)
        self._start: list[float] | None = None

    def start(self) -> None:
        self._start = self._read()

    def _read(self) -> list[float] | None:
        try:
            return [c.read_j() for c in self.counters]
        except (OSError, ValueError, RuntimeError):  # a counter that vanished: not measured
            return None

    def stop(self) -> list[Reading] | None:
        """What each counter measured since :meth:`start`; ``None`` with no counter or
        when a read failed."""
        if not self.counters or self._start is None:
            return None
        end = self._read()
        if end is None:
            return None
        try:
            return [Reading(c.source, c.key, counter_delta_j(s, e, c.wrap_j))
                    for c, s, e in zip(self.counters, self._start, end, strict=True)]
        except ValueError:
            return None


def total_j(per_rank: Iterable[list[Reading] | None]) -> tuple[float, str] | None:
    """(joules, source) over all ranks, each physical counter once; ``None`` when any
    rank measured nothing (a partial sum would undercount).

    >>> a = [Reading("rapl", "n1:pkg0", 5.0)]
    >>> total_j([a, a, [Reading("rapl", "n2:pkg0", 4.0)]])
    (9.0, 'rapl')
    >>> total_j([a, None]) is None
    True
    """
    seen: dict[str, Reading] = {}
    for readings in per_rank:
        if not readings:
            return None
        for r in readings:
            seen.setdefault(r.key, r)
    if not seen:
        return None
    sources = sorted({r.source for r in seen.values()})
    return sum(r.joules for r in seen.values()), "+".join(sources)
