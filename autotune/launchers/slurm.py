"""SLURM launcher: each trial is one ``srun`` job step inside the current allocation.

Run ``autotune run`` inside ``salloc``/``sbatch`` (``SLURM_JOB_ID`` set). A trial of
world size W on nodes of D devices becomes::

    srun -v --nodes=N --ntasks=W --ntasks-per-node=min(W, D) --exact --kill-on-bad-exit=1 \\
         --time=ceil(timeout/60) --job-name=at-STUDY-trial-00003-KEY [site/--gres ...] \\
         python -m trainer --spec S --result R

one task per device; the trainer reads ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``
and takes the first node of ``SLURM_STEP_NODELIST`` as rendezvous host (``MASTER_ADDR`` is
set here only when the launcher is pinned to nodes); ``MASTER_PORT`` is a fresh port per
step so that side-by-side steps never collide.

A foreign workload (:mod:`autotune.workloads`) runs the same way, one task per device, its
program behind :mod:`autotune.workloads.rank_env`, which exports the same rendezvous as
torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``). With ``workload.outer: none`` the step has one task per node and the
command launches its ranks itself (``torchrun``, ``deepspeed``); the step is then pinned to
known nodes so that ``{master_addr}`` is the step's first node.

srun runs in its own process session. Its step id (``JOB.STEP``) is read from the
``srun: launching StepId=J.S`` line that ``-v`` prints to the trial's stderr, or failing
that from ``squeue --steps`` by the unique step name. :meth:`_kill` cancels that step with
``scancel J.S`` (SLURM kills every rank on every node) and then the local srun group;
:meth:`_finish` asks ``sacct`` for the step's final state (``COMPLETED``, ``FAILED``,
``OUT_OF_MEMORY``, ``TIMEOUT``, ``NODE_FAIL``, ``CANCELLED``) and its hosts, which
:func:`autotune.trial.classify.classify` maps to an outcome when the trainer wrote no result.

Side-by-side trials: when a trial needs fewer nodes than the allocation has,
:func:`node_groups` splits the allocation into disjoint groups; the runner makes one
``SlurmLauncher(nodelist=group)`` per group and runs each in its own thread (``--exact``
keeps the steps from sharing CPUs; ``--nodelist`` keeps them on disjoint nodes; ``--overlap``
lets a group's steps start after the allocation lost a node of another group).

A node that dies under a step (``salloc --no-kill`` keeps the allocation alive without it):
sacct records the step as ``RESIZING`` (SLURM 22.05), so :meth:`_finish` asks ``sinfo`` for
the state of the step's nodes and reports ``NODE_FAIL <node>: down* (Not responding)``; the
trial is retried and the runner stops the worker of that node group.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.config.launcher import SlurmOptions
from autotune.errors import LaunchError
from autotune.launchers.base import Launcher
from autotune.launchers.launch_record import write_launch_record
from autotune.launchers.local import trainer_env
from autotune.launchers.slurm_commands import (
    _down_nodes,
    _pick_port,
    _sacct_step,
    _slurm,
    _wait,
    _with_sacct_energy,
)
from autotune.sites import SiteProfile, load_site
from autotune.trial import LaunchReport, TrialPaths, TrialSpec
from autotune.util.hostlist import parse_hostlist
from autotune.workloads.base import Placement

if TYPE_CHECKING:
    from autotune.config.cluster import ClusterConfig

__all__ = ["SlurmLauncher", "allocation_job_id", "expand_hostlist", "node_groups",
           "step_name", "TERMINAL_STATES"]

_KILL_GRACE_S = 10.0
_SACCT_WAIT_S = 20.0
"""slurmdbd records a step's end a few seconds after srun returns."""
_NODE_WAIT_S = 30.0
"""How long a failed step whose job lost a node waits for the controller to mark it DOWN."""
_STEP_RE = re.compile(r"launching StepId=(\d+)\.(\d+)")
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
TERMINAL_STATES = ("COMPLETED", "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL",
                   "CANCELLED", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
_RESIZED = "RESIZING"
"""sacct's final state of a step whose allocation (``--no-kill``) lost a node: SLURM 22.05
removes the failed node from the job and records the step killed with it as RESIZING, not
NODE_FAIL (slurmctld log: "Removing failed node mn2 from JobId=6", "Killing JobId=6
StepId=0 due to failed node mn2"; measured on the CI cluster of .ci/cluster.sh)."""


def allocation_job_id(env: dict[str, str] | None = None) -> str:
    """The job id of the allocation we run in; a clear error outside one."""
    env = dict(os.environ) if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job or not job.isdigit():
        raise LaunchError("the slurm launcher runs trials as job steps inside an allocation, "
                          "but SLURM_JOB_ID is not set: start `autotune run` inside salloc or "
                          "an sbatch script (see docs/hpc.md), or use launcher.kind: local")
    return job


def expand_hostlist(hostlist: str) -> list[str]:
    """Host names of a SLURM host list (``node[01-03]``): ``scontrol show hostnames``, the
    authority, or where it is not installed, :func:`autotune.util.hostlist.parse_hostlist`."""
    if shutil.which("scontrol") is None:
        return parse_hostlist(hostlist)
    out = _slurm(["scontrol", "show", "hostnames", hostlist])
    return [h for h in out.split() if h]


def node_groups(nodes_per_trial: int, env: dict[str, str] | None = None) -> list[list[str]]:
    """The allocation's nodes split into disjoint groups of ``nodes_per_trial``.

    One group per concurrent trial: the runner makes ``SlurmLauncher(nodelist=g)`` for
    each group ``g`` and runs them in threads. Nodes left over are unused.
    """
    env = dict(os.environ) if env is None else env
    allocation_job_id(env)
    nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    if nodes_per_trial < 1 or len(nodes) < nodes_per_trial:
        raise LaunchError(f"a trial needs {nodes_per_trial} nodes; the allocation has "
                          f"{len(nodes)} ({', '.join(nodes) or 'none'})")
    n = len(nodes) // nodes_per_trial
    return [nodes[i * nodes_per_trial:(i + 1) * nodes_per_trial] for i in range(n)]


def step_name(paths: TrialPaths) -> str:
    """A job-step name unique per trial: ``at-<study>-<trial dir>``, plain characters only."""
    raw = f"at-{paths.root.parent.name}-{paths.root.name}"
    return _NAME_BAD.sub("-", raw)[:120]


@dataclass
class _Step:
    proc: subprocess.Popen[bytes]
    job_id: str
    name: str
    paths: TrialPaths
    step_id: str | None = None
    hosts: list[str] = field(default_factory=list)


class SlurmLauncher(Launcher):
    """Runs each trial as an ``srun`` job step of the current allocation."""

    kind = "slurm"
    supports_batches = True

    def __init__(self, options: SlurmOptions | None = None, *,
                 devices_per_node: int | None = None,
                 site: SiteProfile | None = None, nodelist: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        super().__init__()
        self.options = options or SlurmOptions()
        self.site = site or (load_site(self.options.site) if self.options.site else None)
        if self.site is not None:
            self.site.require_slurm()
        self.nodelist = list(nodelist or [])
        self._env = dict(os.environ) if env is None else env
        self.job_id = allocation_job_id(self._env)
        self.devices_per_node = devices_per_node or self._default_devices_per_node()
        self._timeout_s = 0.0
        self._port = 0
        self._last_step: str | None = None  # JOB.STEP of the last launch (its energy)

    @classmethod
    def for_study(cls, options: SlurmOptions, cluster: ClusterConfig) -> SlurmLauncher:
        """The launcher a study file asks for: its ``launcher.slurm`` options and the node
        size of its ``cluster``."""
        return cls(options, devices_per_node=cluster.devices_per_node)

    def _default_devices_per_node(self) -> int:
        """Ranks per node when not given: the allocation's ``--ntasks-per-node`` (campaign
        jobs set it to the study's devices per node), else the site's, else 1."""
        m = re.match(r"\d+", self._env.get("SLURM_NTASKS_PER_NODE", ""))
        if m:
            return int(m.group(0))
        return self.site.devices_per_node if self.site is not None else 1

    # -- the step command -----------------------------------------------------------------

    def _geometry(self, spec: TrialSpec) -> tuple[int, int, list[str]]:
        """(nodes, ranks per node, the nodes the step is pinned to: none = SLURM picks)."""
        world = spec.layout.world_size
        per_node = min(world, self.devices_per_node)
        nodes = math.ceil(world / per_node)
        if self.nodelist and len(self.nodelist) < nodes:
            raise LaunchError(f"the trial needs {nodes} nodes of {per_node} ranks; this "
                              f"launcher is pinned to {len(self.nodelist)}: {self.nodelist}")
        pinned = self.nodelist[:nodes]
        if not pinned and not self.workload.per_device:
            # The command rendezvouses itself ({master_addr}): it must know the host first.
            alloc = self._env.get("SLURM_JOB_NODELIST") or self._env.get("SLURM_NODELIST") or ""
            pinned = expand_hostlist(alloc)[:nodes] if alloc else []
        return nodes, per_node, pinned

    def placement(self, spec: TrialSpec) -> Placement:
        nodes, per_node, pinned = self._geometry(spec)
        return Placement(python=sys.executable, nodes=nodes, ranks_per_node=per_node,
                         master_addr=pinned[0] if pinned else "",
                         master_port=self._port or _pick_port(),
                         rank_env=(sys.executable, "-m", "autotune.workloads.rank_env", "--"))

    def command(self, spec: TrialSpec, paths: TrialPaths, *, timeout_s: float) -> list[str]:
        world = spec.layout.world_size
        nodes, per_node, pinned = self._geometry(spec)
        tasks, tasks_per_node = (world, per_node) if self.workload.per_device else (nodes, 1)
        site_slurm = self.site.slurm if self.site else None
        gres = self.options.gpus_per_node or (site_slurm.gres if site_slurm else None)
        cpus = self.options.cpus_per_task or (site_slurm.cpus_per_task if site_slurm else None)
        minutes = max(1, math.ceil(timeout_s / 60))  # srun --time is whole minutes
        cmd = ["srun", "-v", f"--jobid={self.job_id}", f"--nodes={nodes}", f"--ntasks={tasks}",
               f"--ntasks-per-node={tasks_per_node}", "--exact", "--kill-on-bad-exit=1",
               f"--time={minutes}", f"--job-name={step_name(paths)}", "--export=ALL",
               f"--output={paths.stdout}", f"--error={paths.stderr}"]
        if gres:
            cmd.append(f"--gres={gres}")
        if cpus:
            cmd.append(f"--cpus-per-task={cpus}")
        if pinned:
            cmd.append(f"--nodelist={','.join(pinned)}")
        if self.nodelist:
            # The node group is this launcher's alone, so SLURM's bookkeeping of CPUs between
            # steps adds nothing; and in 22.05, once a --no-kill allocation has lost a node,
            # the CPUs of every step that ends are never given back ("_step_dealloc_lps:
            # unable to update job's core use information due to job resizing"): a later
            # plain step pends for ever, an --overlap step starts (measured, .ci/cluster.sh).
            cmd.append("--overlap")
        cmd += list(site_slurm.srun_args if site_slurm else ()) + list(self.options.extra_args)
        return [*cmd, *self.workload.argv(spec, paths, self.placement(spec))]

    def step_env(self, spec: TrialSpec, paths: TrialPaths | None = None) -> dict[str, str]:
        extra = dict(self.site.env) if self.site else {}
        extra.update(self.options.env)
        if paths is not None:
            extra.update(self.workload.env(spec, paths))
        extra["MASTER_PORT"] = str(self._port or _pick_port())
        if self.nodelist:
            extra["MASTER_ADDR"] = self.nodelist[0]
        env = trainer_env(spec, extra)
        # Step geometry comes from the srun options, not from the allocation's defaults
        # (an sbatch -n 8 exports SLURM_NTASKS=8, which srun would otherwise inherit).
        for var in ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE",
                    "SLURM_CPUS_PER_TASK", "SLURM_NNODES", "SLURM_DISTRIBUTION"):
            env.pop(var, None)
        return env

    # -- hooks ----------------------------------------------------------------------------

    def run(self, spec: TrialSpec, paths: TrialPaths, *, timeout_s: float) -> LaunchReport:
        self._timeout_s = timeout_s  # the step's --time backstop needs it in _start
        self._port = _pick_port()  # one rendezvous port per step: command and env agree
        try:
            return _with_sacct_energy([super().run(spec, paths, timeout_s=timeout_s)],
                                      self._last_step)[0]
        finally:
            self._port = 0

    def run_batch(self, specs: Sequence[TrialSpec], paths: Sequence[TrialPaths], *,
                  timeout_s: float, hold: bool = False) -> list[LaunchReport]:
        # Never held (supports_hold is off): the step's backstop and energy read end with
        # its last trial.
        # One step for the batch: its --time backstop covers every trial of it (the
        # per-trial timeout is the base class's, from the last result written).
        self._timeout_s = timeout_s * max(1, len(specs))
        self._port = _pick_port()
        try:
            return _with_sacct_energy(super().run_batch(specs, paths, timeout_s=timeout_s),
                                      self._last_step)
        finally:
            self._port = 0

    def _start(self, spec: TrialSpec, paths: TrialPaths) -> _Step:
        cmd = self.command(spec, paths, timeout_s=self._timeout_s)
        env = self.step_env(spec, paths)
        write_launch_record(paths, argv=cmd, env=env)
        try:
            # srun's own messages (-v) go to a separate log: it is where the step id is read.
            with open(paths.root / "srun.log", "wb") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                        env=env, start_new_session=True)
        except OSError as err:
            raise LaunchError(f"could not start srun: {err}") from err
        return _Step(proc=proc, job_id=self.job_id, name=step_name(paths), paths=paths)

    def _poll(self, handle: _Step) -> int | None:
        return handle.proc.poll()

    def _kill(self, handle: _Step) -> None:
        step = self._discover(handle, wait_s=3.0)
        if step is not None:  # SLURM kills every rank on every node, then srun exits
            subprocess.run(["scancel", step], capture_output=True, check=False, timeout=30)
            if _wait(handle.proc, _KILL_GRACE_S):
                return
        for sig in (signal.SIGTERM, signal.SIGKILL):  # srun forwards SIGTERM to its ranks
            try:
                os.killpg(handle.proc.pid, sig)
            except ProcessLookupError:
                return
            if _wait(handle.proc, _KILL_GRACE_S):
                return

    def _finish(self, handle: _Step) -> tuple[str | None, list[str]]:
        step = self._discover(handle, wait_s=0.0)
        self._last_step = step
        if step is None:
            return None, []
        state, nodelist = None, ""
        ok = handle.proc.returncode == 0  # then only COMPLETED is possible: do not wait long
        deadline = time.monotonic() + (3.0 if ok else _SACCT_WAIT_S)
        while time.monotonic() < deadline:
            state, nodelist = _sacct_step(step)
            if state is not None and state.split(" ")[0] in (*TERMINAL_STATES, _RESIZED):
                break
            time.sleep(0.5)
        else:
            state = "COMPLETED" if ok else state
        hosts = expand_hostlist(nodelist) if nodelist and nodelist != "None assigned" else []
        if not ok and hosts and (state or "").split(" ")[0] != "NODE_FAIL":
            # A step killed with a node reads FAILED, CANCELLED or RESIZING in sacct: the
            # node's own state is the scheduler's reason (sinfo: down*, "Not responding").
            wait_s = _NODE_WAIT_S if (state or "").startswith(_RESIZED) else 0.0
            down = _down_nodes(hosts, wait_s=wait_s)
            if down:
                state = f"NODE_FAIL {'; '.join(down)} (sacct step state {state})"
        return state, hosts

    def describe(self) -> dict[str, Any]:
        return {"launcher": self.kind, "job_id": self.job_id,
                "site": self.site.name if self.site else None, "nodelist": self.nodelist,
                **self.workload.describe()}

    # -- step discovery -------------------------------------------------------------------

    def _discover(self, handle: _Step, *, wait_s: float) -> str | None:
        """``JOB.STEP`` of this trial: from srun's -v log, else ``squeue --steps`` by name."""
        deadline = time.monotonic() + wait_s
        while handle.step_id is None:
            try:
                m = _STEP_RE.search((handle.paths.root / "srun.log").read_text(errors="replace"))
            except FileNotFoundError:
                m = None
            if m:
                handle.step_id = f"{m.group(1)}.{m.group(2)}"
                break
            try:
                out = _slurm(["squeue", "--steps", "-h", "-j", handle.job_id, "-o", "%i|%j"])
            except LaunchError:
                out = ""
            for line in out.splitlines():
                sid, _, name = line.partition("|")
                if name.strip() == handle.name:
                    handle.step_id = sid.strip()
            if handle.step_id is None and time.monotonic() >= deadline:
                break
            if handle.step_id is None:
                time.sleep(0.3)
        return handle.step_id
