"""Energy figures on the service side: ``sacct``'s step energy and how energy is shown.

The trainer reads the device counters itself (:mod:`trainer.energy`). Under SLURM with
energy accounting (``AcctGatherEnergyType``, e.g. ``acct_gather_energy/rapl`` or
``/xcc`` on Lenovo nodes such as SuperMUC-NG's), the job step's ``ConsumedEnergyRaw`` is
another source: joules over the whole step, all its nodes, sampled every
``EnergyIPMIFrequency`` / ``AcctGatherNodeFreq`` seconds (SLURM's ``sacct`` man page,
"ConsumedEnergyRaw: Total energy consumed by all tasks in a job, in joules"; empty where
the site does not account energy). A step runs start-up, warm-up and the timed steps,
so :func:`sacct_energy_j_per_step` takes the step's mean power (energy / ``ElapsedRaw``)
times the median step time: an estimate that assumes constant power over the step, and
is labelled ``sacct``.

Every output that shows energy goes through :func:`energy_text`, so that "not measured"
reads the same everywhere and never as 0.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NOT_MEASURED", "energy_text", "SacctEnergy", "parse_sacct_energy",
           "sacct_energy_j_per_step", "SACCT_FIELDS"]

NOT_MEASURED = "energy: not measured (no counter)"
SACCT_FIELDS = "JobID,ConsumedEnergyRaw,ElapsedRaw"
"""``sacct -n -P -j JOB.STEP -o`` these (``-P``: ``|``-separated, no padding)."""


def energy_text(j_per_step: float | None, source: str | None,
                joules_per_token: float | None = None) -> str:
    """``energy: 41.2 J/step, 0.0101 J/token (nvml)`` or :data:`NOT_MEASURED`.

    >>> energy_text(None, None)
    'energy: not measured (no counter)'
    >>> energy_text(41.2, "nvml", 0.0101)
    'energy: 41.2 J/step, 0.0101 J/token (nvml)'
    """
    if j_per_step is None or not j_per_step > 0:
        return NOT_MEASURED
    per_token = f", {joules_per_token:.4g} J/token" if joules_per_token else ""
    return f"energy: {j_per_step:.4g} J/step{per_token} ({source or 'unknown'})"


@dataclass(frozen=True)
class SacctEnergy:
    """One job step's line of ``sacct -P -o JobID,ConsumedEnergyRaw,ElapsedRaw``."""

    step: str
    energy_j: float | None
    """``None``: the field is empty (no energy accounting) or 0 (nothing sampled yet)."""
    elapsed_s: float | None


def parse_sacct_energy(text: str) -> dict[str, SacctEnergy]:
    """The lines of ``sacct -n -P -o JobID,ConsumedEnergyRaw,ElapsedRaw`` by job id.

    >>> out = "4711|118|31\\n4711.batch|97|31\\n4711.0|86400|12\\n4711.1||5\\n"
    >>> rows = parse_sacct_energy(out)
    >>> rows["4711.0"], rows["4711.1"].energy_j
    (SacctEnergy(step='4711.0', energy_j=86400.0, elapsed_s=12.0), None)
    """
    rows: dict[str, SacctEnergy] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0]:
            continue
        rows[parts[0]] = SacctEnergy(parts[0], _positive(parts[1]), _positive(parts[2]))
    return rows


def _positive(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 else None


def sacct_energy_j_per_step(row: SacctEnergy | None, step_time_s: float | None,
                            ) -> float | None:
    """The step's mean power times the median step time (module docstring); ``None``
    where sacct has no energy for it.

    >>> sacct_energy_j_per_step(SacctEnergy("1.0", 86400.0, 12.0), 0.5)
    3600.0
    """
    if row is None or row.energy_j is None or row.elapsed_s is None or not step_time_s:
        return None
    return row.energy_j / row.elapsed_s * step_time_s
