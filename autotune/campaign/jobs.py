"""Submitting a campaign, checking a study's budget, and reporting progress.

``submit`` renders each study's files, then per study: skip it when its budget is met or
when jobs recorded for it are still queued or running; otherwise submit the worker array
(``sbatch --parsable``) and ``max_continuations`` follow-up arrays, each
``--dependency=afterany:<previous>``, and record every job id in the state file
(atomically, after each submission). Submitting again therefore never duplicates work.

The SLURM command-line tools are the only interface (pyslurm is not installable
everywhere); :class:`SlurmCli` wraps them and is replaced by a fake in unit tests.
"""

from __future__ import annotations

import json
import subprocess
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autotune.campaign.config import SQLITE_WARNING, CampaignSpec, CampaignStudy
from autotune.campaign.render import CampaignPaths, Commands, write_script, write_study
from autotune.config.study import StorageConfig
from autotune.errors import AutotuneError, LaunchError, StorageError
from autotune.runner.budget import study_done
from autotune.util.atomic import write_json_atomic

__all__ = ["SlurmCli", "StudyProgress", "CampaignRow", "submit", "status", "study_progress",
           "budget_met", "load_state", "format_status"]

_LIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
                "RESIZING", "SIGNALING", "STAGE_OUT")


class SlurmCli:
    """``sbatch``/``squeue``/``sacct`` through their parsable output."""

    def _run(self, cmd: list[str]) -> str:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise LaunchError(f"{cmd[0]} failed: {err}") from err
        if done.returncode != 0:
            raise LaunchError(f"{' '.join(cmd)} exited {done.returncode}: "
                              f"{done.stderr.strip()[:500]}")
        return done.stdout

    def sbatch(self, script: Path, *, dependency: str | None = None) -> str:
        cmd = ["sbatch", "--parsable"]
        if dependency:
            cmd.append(f"--dependency=afterany:{dependency}")
        out = self._run([*cmd, str(script)]).strip()
        job = out.split(";")[0]  # "JOBID" or "JOBID;CLUSTER"
        if not job.isdigit():
            raise LaunchError(f"sbatch printed {out!r}, not a job id")
        return job

    def job_states(self, job_ids: list[str]) -> dict[str, list[str]]:
        """States of every array task of the given jobs (queued/running from squeue)."""
        if not job_ids:
            return {}
        out = self._run(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%F|%T"])
        states: dict[str, list[str]] = {j: [] for j in job_ids}
        for line in out.splitlines():
            job, _, state = line.strip().partition("|")
            if job in states:
                states[job].append(state)
        return states

    def finished_states(self, job_ids: list[str]) -> dict[str, list[str]]:
        """Final states from accounting (``sacct``), for the status report."""
        if not job_ids:
            return {}
        try:
            out = self._run(["sacct", "-X", "-n", "--parsable2", "-j", ",".join(job_ids),
                             "--format=JobID,State"])
        except LaunchError:
            return {}
        states: dict[str, list[str]] = {j: [] for j in job_ids}
        for line in out.splitlines():
            jid, _, state = line.partition("|")
            base = jid.split("_")[0]
            if base in states:
                states[base].append(state.split(" ")[0])
        return states


# -- state file ---------------------------------------------------------------------------

def load_state(paths: CampaignPaths) -> dict[str, Any]:
    try:
        data = json.loads(paths.state.read_text())
    except FileNotFoundError:
        return {"studies": {}}
    except json.JSONDecodeError as err:
        raise AutotuneError(f"{paths.state}: not valid JSON ({err}); remove it only if no "
                            "job of this campaign is queued") from None
    data.setdefault("studies", {})
    return dict(data)


def _record(paths: CampaignPaths, state: dict[str, Any], study: str, job: str,
            kind: str) -> None:
    jobs = state["studies"].setdefault(study, {"jobs": []})["jobs"]
    jobs.append({"job_id": job, "kind": kind,
                 "submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    write_json_atomic(paths.state, state)


# -- progress from the database -----------------------------------------------------------

@dataclass
class StudyProgress:
    claimed: int = 0
    """Layouts measured or being measured (what the runner's budget counts)."""
    complete: int = 0
    running: int = 0
    waiting: int = 0
    best_value: float | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    exists: bool = False
    search_stop: dict[str, Any] | None = None
    """The study's recorded early stop
    (:func:`autotune.storage.study_records.search_stop_record`)."""

    def done(self, n_trials: int, min_improvement: float | None) -> bool:
        """Whether the study is done: the runner's rule,
        :func:`autotune.runner.budget.study_done`."""
        return study_done(claimed=self.claimed, running=self.running, waiting=self.waiting,
                          search_stop=self.search_stop, n_trials=n_trials,
                          min_improvement=min_improvement)


def study_progress(url: str, study: str) -> StudyProgress:
    """Counts and the best trial of one study, from the shared database (none yet where
    its SQLite file does not exist: ``campaign status`` and ``check`` read, and create no
    database; the workers' runs do)."""
    import optuna

    from autotune.config.sqlite_file import nothing_to_read
    from autotune.report.results import study_status
    from autotune.storage import Storage, claim_counts, repair_stale

    if nothing_to_read(url):
        return StudyProgress()
    storage = Storage(StorageConfig(url=url))
    try:
        # Fail dead runners' trials first (their claims then wait for a retry), then count:
        # a study whose last trial was killed is not done.
        repair_stale(storage, study)
        counts = claim_counts(storage, study)
        prog = StudyProgress(claimed=counts.claimed)
        try:
            s = optuna.load_study(study_name=study, storage=storage.optuna)
        except KeyError:
            return prog
        st = study_status(s)
        prog.exists = True
        prog.search_stop = st.search_stop_record
        prog.complete = st.by_state.get("COMPLETE", 0)
        st.retries = counts.retries
        prog.running, prog.waiting = len(st.running), st.waiting
        if st.best is not None:
            prog.best_value, prog.best_params = st.best.value, dict(st.best.params)
        return prog
    finally:
        storage.close()


def budget_met(url: str, study: str, n_trials: int,
               min_improvement: float | None = None) -> bool:
    """Whether the study is done (:meth:`StudyProgress.done`): budget, or a search stop."""
    return study_progress(url, study).done(n_trials, min_improvement)


# -- submit and status --------------------------------------------------------------------

@dataclass
class CampaignRow:
    """One study of a campaign: its budget, progress and jobs, and what ``submit`` did."""

    study: str
    target: int
    progress: StudyProgress | None
    jobs: dict[str, list[str]]
    """Job id -> array-task states (live from squeue, else final from sacct)."""
    action: str = ""
    """What ``submit`` did: ``submitted``, ``skipped: budget met``, ``skipped: jobs live``."""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        p = self.progress
        return {"study": self.study, "target": self.target, "action": self.action,
                "claimed": p.claimed if p else None, "complete": p.complete if p else None,
                "best_value": p.best_value if p else None,
                "best_params": p.best_params if p else None,
                "jobs": self.jobs, "error": self.error}


def _live(states: dict[str, list[str]]) -> list[str]:
    return [j for j, ss in states.items() if any(s in _LIVE_STATES for s in ss)]


def submit(campaign: CampaignSpec, *, slurm: SlurmCli | None = None,
           commands: Commands | None = None, dry_run: bool = False,
           check_budget: bool = True) -> list[CampaignRow]:
    """Render every study and submit what is not done or running (see module docstring)."""
    slurm = slurm or SlurmCli()
    commands = commands or Commands.here()
    paths = CampaignPaths.of(campaign)
    if campaign.backend == "sqlite":
        warnings.warn(SQLITE_WARNING, UserWarning, stacklevel=2)
    state = load_state(paths)
    out: list[CampaignRow] = []
    for study in campaign.studies:
        write_study(campaign, study)
        script = write_script(campaign, study, commands)
        recorded = [j["job_id"] for j in state["studies"].get(study.name, {}).get("jobs", [])]
        live = _live(slurm.job_states(recorded)) if recorded else []
        st = CampaignRow(study.name, study.n_trials, None, {j: ["live"] for j in live})
        if live:
            st.action = f"skipped: jobs live ({', '.join(live)})"
        elif check_budget and _met(campaign, study, st):
            st.action = "skipped: budget met"
        elif dry_run:
            st.action = f"would submit {script}"
        else:
            previous = None
            for link in range(campaign.slurm.max_continuations + 1):
                job = slurm.sbatch(script, dependency=previous)
                _record(paths, state, study.name, job, "workers" if link == 0
                        else f"continuation-{link}")
                st.jobs[job] = ["submitted"]
                previous = job
            st.action = "submitted"
        out.append(st)
    return out


def _met(campaign: CampaignSpec, study: CampaignStudy, st: CampaignRow) -> bool:
    try:
        st.progress = study_progress(campaign.storage_url, study.name)
    except (StorageError, AutotuneError) as err:
        st.error = str(err)
        return False
    return st.progress.done(study.n_trials, study.spec.search.min_improvement)


def status(campaign: CampaignSpec, *, slurm: SlurmCli | None = None) -> list[CampaignRow]:
    """Per study: trials claimed/complete vs the budget, best so far, and its jobs' states."""
    slurm = slurm or SlurmCli()
    state = load_state(CampaignPaths.of(campaign))
    out = []
    for study in campaign.studies:
        jobs = [j["job_id"] for j in state["studies"].get(study.name, {}).get("jobs", [])]
        try:
            live = slurm.job_states(jobs)
        except LaunchError:
            live = {}
        done = slurm.finished_states([j for j in jobs if not live.get(j)])
        states = {j: live.get(j) or done.get(j) or ["unknown"] for j in jobs}
        st = CampaignRow(study.name, study.n_trials, None, states)
        try:
            st.progress = study_progress(campaign.storage_url, study.name)
        except (StorageError, AutotuneError) as err:
            st.error = str(err)
        out.append(st)
    return out


def format_status(rows: list[CampaignRow]) -> str:
    """A table for humans: study, claimed/target, complete, best, job states."""
    lines = [f"{'study':<32} {'trials':>9} {'complete':>8} {'best TFLOPS/dev':>15}  jobs"]
    for r in rows:
        p = r.progress
        trials = f"{p.claimed}/{r.target}" if p else f"?/{r.target}"
        best = f"{p.best_value:.4g}" if p and p.best_value is not None else "-"
        jobs = ", ".join(f"{j}:{_summary(s)}" for j, s in r.jobs.items()) or "none"
        lines.append(f"{r.study:<32} {trials:>9} {p.complete if p else '?':>8} {best:>15}  "
                     f"{jobs}")
        if r.error:
            lines.append(f"  error: {r.error}")
    return "\n".join(lines)


def _summary(states: list[str]) -> str:
    counts: dict[str, int] = {}
    for s in states:
        counts[s] = counts.get(s, 0) + 1
    return "+".join(f"{n}x{s}" if n > 1 else s for s, n in counts.items())

