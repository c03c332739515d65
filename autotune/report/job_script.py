"""``autotune best --emit slurm``: a ready SLURM job script for the production run of the
best layout, the hand-off from tuning to training.

The script holds what a person would otherwise write around the launch line: ``#SBATCH``
nodes, tasks and time (the layout's world size at the study's ranks per node), the site's
partition, GRES, CPUs per task and extra options, its ``module load`` line and environment
(oneCCL, ``ZE_FLAT_DEVICE_HIERARCHY``, affinity: ``autotune/sites/*.yaml``, the profile
campaigns render their job scripts from, :mod:`autotune.campaign.render`), the rendezvous
(``MASTER_ADDR`` the first node of the allocation), and one ``srun`` line:

* the built-in trainer: ``python -m trainer --spec OUT/production_spec.json`` with the
  user's step count (``--steps``) as its timed steps, no warm-up cut, the trial's seed and
  dtype;
* a study of a program of the user's own (``workload.kind: command``, e.g. a DeepSpeed
  script, or ``megatron-deepspeed``): its launch line as ``--emit command`` builds it
  (:func:`autotune.report.export.command_line`, ``OUT/ds_config.json``), under ``srun``,
  with ``--steps`` for its ``{train_iters}``.

Every value in the script either matched a strict pattern (site names, modules, SLURM
options) or is quoted with :func:`shlex.quote`; ``#SBATCH`` lines are refused if a value
would need quoting (sbatch reads them without a shell), as the campaign renderer does.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autotune.errors import SpecError, UsageError
from autotune.layout import Layout
from autotune.report import DEFAULT_JOB_TIME
from autotune.sites import TIME_RE, SiteProfile, list_sites, load_site
from autotune.storage import study_fingerprint, study_workload
from autotune.util.atomic import write_json_atomic

__all__ = ["JobOptions", "site_of", "render_job", "write_job", "TIME_RE"]


@dataclass(frozen=True)
class JobOptions:
    """What ``best --emit slurm`` takes from the command line."""

    site: str | None = None
    """A site profile name or file (default: the study's ``launcher.slurm.site``)."""
    steps: int | None = None
    """The production run's optimizer steps (default: ``workload.production_train_iters``)."""
    time: str = DEFAULT_JOB_TIME
    partition: str | None = None
    account: str | None = None

    def __post_init__(self) -> None:
        if not TIME_RE.fullmatch(self.time):
            raise SpecError("--time", self.time, "allowed: SLURM time, e.g. 90, 02:00:00 "
                            "or 1-12:00:00")
        for flag, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not re.fullmatch(r"[A-Za-z0-9_.,-]{1,64}", value):
                raise SpecError(flag, value, "allowed: letters, digits, '_', '.', ',', '-'")


def site_of(study: optuna.Study, name: str | None) -> SiteProfile:
    """The site profile to render for: ``name``, else the one the study's SLURM trials ran
    on; a SLURM site (a PBS one has no SLURM job to write)."""
    record = study_workload(study) or {}
    name = name or (record.get("launcher") or {}).get("site")
    if not name:
        raise UsageError("best --emit slurm: the study names no site (its trials did not "
                         "run under launcher.slurm.site); give --site, one of "
                         + ", ".join(list_sites()) + ", or a site file")
    site = load_site(str(name))
    site.require_slurm()
    return site


def _steps(options: JobOptions, record: dict[str, Any]) -> int:
    if options.steps is not None:
        return options.steps
    given = record.get("production_train_iters")
    if isinstance(given, int) and given > 0:
        return given
    raise UsageError("best --emit slurm: give --steps N, the production run's optimizer "
                     "steps (or set workload.production_train_iters in the study file)")


def _builtin_argv(study: optuna.Study, layout: Layout, steps: int, out_dir: Path) -> list[str]:
    """The built-in trainer's production spec, written to ``out_dir``, and its argv."""
    from autotune.report.export import _model
    from autotune.trial import RunConfig, TrialSpec

    fp = study_fingerprint(study)
    device = fp.get("device")
    run = RunConfig(warmup_steps=0, measure_steps=steps, measure_precision=None,
                    dtype=str(fp.get("dtype", "bf16")),
                    device="cpu" if device == "cpu" else "auto")
    spec = TrialSpec(model=_model(fp.get("model") or {}), layout=layout, run=run)
    spec_path = out_dir / "production_spec.json"
    write_json_atomic(spec_path, spec.to_dict())
    return [sys.executable, "-m", "trainer", "--spec", str(spec_path.resolve()),
            "--result", str((out_dir / "production_result.json").resolve())]


def render_job(study: optuna.Study, layout: Layout, *, options: JobOptions, out_dir: Path,
               value: float | None = None) -> str:
    """The job script's text (``out_dir`` receives the spec or ds_config it runs)."""
    from autotune.report.export import _geometry, command_line, launch_line

    record = dict(study_workload(study) or {"kind": "builtin"})
    site = site_of(study, options.site)
    steps = _steps(options, record)
    out_dir.mkdir(parents=True, exist_ok=True)
    nodes, per_node = _geometry(record, layout)
    q = shlex.quote
    opts = [f"--job-name=train-{study.study_name}"[:200], f"--nodes={nodes}",
            f"--ntasks={layout.world_size}", f"--ntasks-per-node={per_node}",
            f"--time={options.time}",
            f"--output={(out_dir / f'train-{study.study_name}-%j.out').resolve()}"]
    partition = options.partition or site.slurm.partition
    for flag, val in (("account", options.account), ("partition", partition),
                      ("gres", site.slurm.gres), ("cpus-per-task", site.slurm.cpus_per_task)):
        if val is not None:
            opts.append(f"--{flag}={val}")
    opts += list(site.slurm.sbatch_args)
    lines = ["#!/bin/bash"]
    for opt in opts:
        if opt != q(opt):
            raise SpecError("sbatch option", opt, "allowed: no spaces, quotes or shell "
                            "characters (write the job to a plain path with --out)")
        lines.append(f"#SBATCH {opt}")
    what = f"{value:.4g} model TFLOPS/device when tuned; " if value is not None else ""
    lines += [f"# autotune: production run of study {study.study_name}'s best layout "
              f"{layout.key()} ({what}{steps} optimizer steps) on site {site.name}",
              "set -euo pipefail"]
    if site.modules:
        lines.append("module load " + " ".join(q(m) for m in site.modules))
    for k, v in site.env.items():
        lines.append(f"export {k}={q(v)}")
    lines += ['export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
              "export MASTER_PORT=29500", f"cd {q(str(Path.cwd()))}"]
    kind = record.get("kind", "builtin")
    if kind == "builtin":
        srun = ["srun", f"--nodes={nodes}", f"--ntasks={layout.world_size}",
                f"--ntasks-per-node={per_node}"]
        if site.slurm.cpus_per_task:
            srun.append(f"--cpus-per-task={site.slurm.cpus_per_task}")
        srun += list(site.slurm.srun_args)
        lines.append("export OMP_NUM_THREADS=\"${OMP_NUM_THREADS:-1}\"")
        argv = srun + _builtin_argv(study, layout, steps, out_dir)
    else:
        program = command_line(study, layout, out_dir=out_dir, train_iters=steps)
        launcher = {**(record.get("launcher") or {}), "kind": "slurm"}
        launcher.setdefault("cpus_per_task", site.slurm.cpus_per_task)
        argv = launch_line({**record, "launcher": launcher}, layout, program)
        from autotune.storage.urls import mask_env

        env = {str(k): str(v) for k, v in
               {**(launcher.get("env") or {}), **(record.get("env") or {})}.items()}
        for k, v in mask_env(env).items():  # a secret is never written out
            lines.append(f"export {k}={q(v)}")
    lines.append(" ".join(f'"{w}"' if "$MASTER_ADDR" in w else q(w) for w in argv))
    return "\n".join(lines) + "\n"


def write_job(study: optuna.Study, layout: Layout, *, options: JobOptions, out_dir: Path,
              value: float | None = None) -> Path:
    """``OUT_DIR/train-STUDY.sbatch`` (atomically, executable), for ``sbatch`` as it is."""
    text = render_job(study, layout, options=options, out_dir=out_dir, value=value)
    path = out_dir / f"train-{study.study_name}.sbatch"
    tmp = path.with_suffix(".sbatch.tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    tmp.replace(path)
    return path
