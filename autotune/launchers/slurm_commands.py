"""SLURM's own commands as :class:`~autotune.launchers.slurm.SlurmLauncher` asks them:
``sacct`` (a step's state and its energy), ``sinfo`` (nodes marked down), a free port, and
waiting for ``srun``. Each call's failure is one :class:`~autotune.errors.LaunchError`."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from dataclasses import replace

from autotune.energy import SACCT_FIELDS, parse_sacct_energy, sacct_energy_j_per_step
from autotune.errors import LaunchError
from autotune.trial import LaunchReport

__all__ = ["_wait", "_down_nodes", "_with_sacct_energy", "_sacct_step", "_slurm",
           "_pick_port"]


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    try:
        proc.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def _down_nodes(hosts: list[str], *, wait_s: float) -> list[str]:
    """``host: state (reason)`` of each of ``hosts`` that the controller has marked down,
    failed or not responding (``sinfo``'s ``*``); polled for ``wait_s`` until one is."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            out = _slurm(["sinfo", "-h", "-N", "-n", ",".join(hosts), "-o", "%N|%T|%E"])
        except LaunchError:
            return []
        down = []
        for line in out.splitlines():
            name, _, rest = line.partition("|")
            st, _, reason = rest.partition("|")
            st = st.strip().lower()
            if st.startswith(("down", "fail")) or st.endswith("*"):
                down.append(f"{name.strip()}: {st}" + (f" ({reason.strip()})"
                                                       if reason.strip() not in ("", "none")
                                                       else ""))
        if down or time.monotonic() >= deadline:
            return sorted(set(down))
        time.sleep(1.0)


def _with_sacct_energy(reports: list[LaunchReport], step: str | None) -> list[LaunchReport]:
    """Reports whose ``ok`` result has no device energy get the step's from ``sacct``
    (:mod:`autotune.energy`: mean power times the median step time), where the site
    accounts energy; the others are returned as they are."""
    if step is None or not any(r.result is not None and r.result.status == "ok"
                               and r.result.energy_j_per_step is None for r in reports):
        return reports
    try:
        out = _slurm(["sacct", "-n", "-P", "-j", step, "-o", SACCT_FIELDS])
    except LaunchError:
        return reports
    row = parse_sacct_energy(out).get(step)
    done = []
    for report in reports:
        res = report.result
        per_step = sacct_energy_j_per_step(row, res.step_time_s) if res is not None \
            and res.status == "ok" and res.energy_j_per_step is None else None
        if res is not None and per_step is not None:
            tokens = res.extra.get("tokens_per_step")
            flops = res.extra.get("model_flops_per_step")
            res = replace(res, energy_j_per_step=per_step, energy_source="sacct",
                          joules_per_token=per_step / tokens if tokens else None,
                          model_tflops_per_watt=flops / per_step / 1e12 if flops else None)
            report = replace(report, result=res)
        done.append(report)
    return done


def _sacct_step(step: str) -> tuple[str | None, str]:
    try:
        out = _slurm(["sacct", "-j", step, "--format=JobIDRaw,State,NodeList", "--parsable2",
                      "-n"])
    except LaunchError:
        return None, ""
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and parts[0] == step:
            return parts[1] or None, parts[2]
    return None, ""


def _slurm(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise LaunchError(f"{cmd[0]} failed: {err}") from err
    if done.returncode != 0:
        raise LaunchError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _pick_port() -> int:
    """A port free on this host, from a range away from the ephemeral ports of most Linux
    systems (32768-60999), so that a rendezvous on another node rarely collides either."""
    for _ in range(50):
        port = random.randint(20000, 32000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise LaunchError("no free TCP port for the trial's rendezvous in 20000-32000")
