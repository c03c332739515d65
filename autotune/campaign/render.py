"""Rendering a campaign's study into files: the study document and its sbatch script.

The on-disk layout of a campaign is defined once, in :class:`CampaignPaths`::

    <campaign file stem>.campaign/
      state.json               submitted job ids per study (written atomically)
      studies/<study>.yaml     the merged study the workers run
      scripts/<study>.sbatch   the job script (array = workers; continuations reuse it)
      logs/<study>-<job>_<task>.out
      runs/                    per-trial directories (spec, result, logs)

Shell safety: the script is built from values that either matched a strict pattern when
the campaign was loaded (names, modules, SLURM options) or are passed through
:func:`shlex.quote` here (paths, URLs, environment values); nothing is interpolated into
the script unquoted, and no value may contain a newline. The database URL is rendered as
written in the campaign (no password; ``${VAR}`` stays unexpanded for autotune to expand at
run time), and the password reaches the job only through ``AUTOTUNE_DB_PASSWORD`` in the
submitting environment or ``AUTOTUNE_DB_PASSWORD_FILE``.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune.campaign.config import CampaignSpec, CampaignStudy
from autotune.errors import SpecError

__all__ = ["CampaignPaths", "Commands", "render_script", "study_document", "sbatch_options",
           "write_script", "write_study"]

@dataclass(frozen=True)
class CampaignPaths:
    root: Path

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    def study_file(self, study: str) -> Path:
        return self.root / "studies" / f"{study}.yaml"

    def script(self, study: str) -> Path:
        return self.root / "scripts" / f"{study}.sbatch"

    def log_pattern(self, study: str) -> Path:
        return self.root / "logs" / f"{study}-%A_%a.out"

    @property
    def run_dir(self) -> Path:
        return self.root / "runs"

    @classmethod
    def of(cls, campaign: CampaignSpec) -> CampaignPaths:
        return cls(campaign.workdir)


def study_document(campaign: CampaignSpec, study: CampaignStudy) -> dict[str, Any]:
    """The study file the workers run: the merged study, the shared storage, the launcher."""
    doc = dict(study.document)
    doc["storage"] = {**(doc.get("storage") or {}), "url": campaign.storage_url}
    launcher = dict(doc.get("launcher") or {})
    launcher["kind"] = campaign.launcher
    launcher["run_dir"] = str(CampaignPaths.of(campaign).run_dir)
    if campaign.launcher == "slurm":
        slurm = dict(launcher.get("slurm") or {})
        slurm.setdefault("site", campaign.site.name if _shipped(campaign) else None)
        if slurm["site"] is None:
            del slurm["site"]
        launcher["slurm"] = slurm
    doc["launcher"] = launcher
    return doc


def _shipped(campaign: CampaignSpec) -> bool:
    from autotune.sites import list_sites

    return campaign.site.name in list_sites()


def write_study(campaign: CampaignSpec, study: CampaignStudy) -> Path:
    path = CampaignPaths.of(campaign).study_file(study.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(study_document(campaign, study), sort_keys=False)
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(f"# Rendered by `autotune campaign submit` from {study.base_file}\n{text}")
    tmp.replace(path)
    return path


def sbatch_options(campaign: CampaignSpec, study: CampaignStudy) -> list[str]:
    """The ``#SBATCH`` options of one study's worker array (already validated values)."""
    cl = study.spec.cluster
    site, res = campaign.site, campaign.slurm
    paths = CampaignPaths.of(campaign)
    opts = [f"--job-name=at-{campaign.name}-{study.name}"[:200],
            f"--nodes={cl.nodes}", f"--ntasks-per-node={cl.devices_per_node}",
            f"--time={res.time}", f"--array=0-{res.workers - 1}",
            f"--signal=B:TERM@{res.signal_s}",
            f"--output={paths.log_pattern(study.name)}", "--open-mode=append"]
    partition = res.partition or site.slurm.partition
    for flag, value in (("account", res.account), ("partition", partition), ("qos", res.qos),
                        ("gres", site.slurm.gres), ("cpus-per-task", site.slurm.cpus_per_task)):
        if value is not None:
            opts.append(f"--{flag}={value}")
    return opts + list(site.slurm.sbatch_args) + list(res.sbatch_args)


@dataclass(frozen=True)
class Commands:
    """How a job calls autotune: the worker (``autotune run``) and the budget check."""

    autotune: tuple[str, ...] = ("autotune",)
    python: str = "python3"

    @classmethod
    def here(cls) -> Commands:
        """This interpreter and its ``autotune`` script (the same install on a shared FS)."""
        exe = Path(sys.executable)
        script = exe.parent / "autotune"
        return cls(autotune=(str(script),) if script.exists() else ("autotune",),
                   python=str(exe))


def render_script(campaign: CampaignSpec, study: CampaignStudy,
                  commands: Commands | None = None) -> str:
    """The job script of one study's workers (and of its continuations)."""
    commands = commands or Commands()
    paths = CampaignPaths.of(campaign)
    q = shlex.quote
    lines = ["#!/bin/bash"]
    for opt in sbatch_options(campaign, study):
        # sbatch reads #SBATCH lines itself, without a shell: refuse anything that would
        # need quoting there (every value was validated; paths are the only risk).
        if opt != q(opt):
            raise SpecError("sbatch option", opt, "allowed: no spaces, quotes or shell "
                            "characters (move the campaign to a plain path)")
        lines.append(f"#SBATCH {opt}")
    lines += [
        f"# autotune campaign {campaign.name}: study {study.name}, "
        f"budget {study.n_trials} trials shared by {campaign.slurm.workers} workers",
        "set -euo pipefail",
    ]
    if campaign.site.modules:
        lines.append("module load " + " ".join(q(m) for m in campaign.site.modules))
    if campaign.venv:
        lines.append(f"source {q(str(Path(campaign.venv).expanduser()))}/bin/activate")
    for k, v in {**campaign.site.env, **campaign.env}.items():
        lines.append(f"export {k}={q(v)}")
    if campaign.password_file:
        lines.append(f"export AUTOTUNE_DB_PASSWORD_FILE={q(campaign.password_file)}")
    exe = " ".join(q(a) for a in commands.autotune)
    check = f"{q(commands.python)} -m autotune.campaign check"
    study_file, url = q(str(paths.study_file(study.name))), q(campaign.storage_url)
    n = study.n_trials
    lines += [
        f"cd {q(str(campaign.source.parent))}",
        "echo \"autotune worker: job ${SLURM_JOB_ID} task ${SLURM_ARRAY_TASK_ID:-0} "
        "on $(hostname)\"",
        "# A continuation whose study is done exits at once (bounds the dependency chain).",
        f"if {check} {study_file} --storage {url} --n-trials {n}; then",
        "  echo 'budget met: nothing to do'",
        "  exit 0",
        "fi",
        "# exec: the worker itself receives --signal=B:TERM, stops launching, cancels its",
        "# running trial (retried later) and exits 0; the continuation job resumes the study.",
        f"exec {exe} run {study_file} --storage {url} --n-trials {n}",
    ]
    return "\n".join(lines) + "\n"


def write_script(campaign: CampaignSpec, study: CampaignStudy,
                 commands: Commands | None = None) -> Path:
    path = CampaignPaths.of(campaign).script(study.name)
    for d in (path.parent, CampaignPaths.of(campaign).log_pattern(study.name).parent):
        d.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".sbatch.tmp")
    tmp.write_text(render_script(campaign, study, commands))
    tmp.replace(path)
    return path
