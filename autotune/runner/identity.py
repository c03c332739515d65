"""A study's identity: one program on one cluster. Its fingerprint, the comparison that
refuses another program or cluster under the same name, and the one line a changed
search space alone is resumed with.

The fingerprint holds what makes two measurements comparable: the model, the training
(global batch, dtype), the cluster's shape (nodes, devices per node, device) and the
workload (its kind, argv, script and its arguments, DeepSpeed config, and the environment
autotune passes: the workload's and the launcher's). Two study files that differ in any
of these under one name would rank two programs' results together, so the second is
refused (exit 2), naming what differs. Studies stored before a field was added lack it:
it takes its old meaning (not compared), and the first open after the change stores it.
"""

from __future__ import annotations

from typing import Any

from autotune.config.launcher import LauncherConfig
from autotune.errors import UsageError
from autotune.spec import StudySpec

__all__ = ["fingerprint_of", "space_of", "differences", "check_identity", "OLD_MEANING",
           "launcher_record"]

OLD_MEANING: dict[str, Any] = {"workload": "builtin"}
"""What a field absent from an old fingerprint meant (before workloads: the built-in
trainer). Fields absent and not here were not compared then and are not now."""


def launcher_record(launcher: LauncherConfig) -> dict[str, Any]:
    """What ``best --emit command`` needs of the study's launcher: its kind, the
    environment it gives the program and, on SLURM, the options of its steps."""
    out: dict[str, Any] = {"kind": launcher.kind}
    if launcher.kind == "local":
        out["env"] = dict(launcher.local.env)
    elif launcher.kind == "slurm":
        slurm = launcher.slurm
        out.update(env=dict(slurm.env), site=slurm.site, gpus_per_node=slurm.gpus_per_node,
                   cpus_per_task=slurm.cpus_per_task, extra_args=list(slurm.extra_args))
    return out


def _program(spec: StudySpec) -> dict[str, Any]:
    w = spec.workload
    return {"kind": w.kind, "argv": list(w.argv), "script": w.script, "args": list(w.args),
            "ds_config": dict(w.ds_config),
            "env": {**launcher_record(spec.launcher).get("env", {}), **w.env}}


def fingerprint_of(spec: StudySpec) -> dict[str, Any]:
    """What a study measures (module docstring); a study name is refused for another."""
    cluster = spec.cluster
    return {"model": spec.model.to_dict(), "device": cluster.device,
            "world_size": spec.world_size, "global_batch": spec.training.global_batch,
            "dtype": spec.training.dtype, "workload": spec.workload.kind,
            "nodes": cluster.nodes, "devices_per_node": cluster.devices_per_node,
            "program": _program(spec)}


def space_of(spec: StudySpec) -> dict[str, Any]:
    """The search space's axes as the study file gives them (``auto`` or the values)."""
    from autotune.layout import Layout

    # The shard size's study-file key is ``zero_shard_size`` (None: the node's devices).
    fields = {"zero_shard": "zero_shard_size"}
    out: dict[str, Any] = {}
    for axis in Layout.SEARCH_AXES:
        value = getattr(spec.search, fields.get(axis, axis))
        out[axis] = value if value is None or isinstance(value, str) else list(value)
    return out


def differences(stored: dict[str, Any], fingerprint: dict[str, Any]) -> list[str]:
    """``field: stored -> now`` for each field of ``stored`` (with :data:`OLD_MEANING`)
    that ``fingerprint`` gives another value; a program's fields one by one."""
    stored = {**OLD_MEANING, **stored}
    out: list[str] = []
    for key, now in fingerprint.items():
        if key not in stored:
            continue  # a field added since: its old meaning was "not compared"
        was = stored[key]
        if key == "program" and isinstance(was, dict) and isinstance(now, dict):
            out += [f"workload.{k}: {was.get(k)!r} -> {now.get(k)!r}"
                    for k in now if k in was and was[k] != now[k]]
        elif key == "model" and isinstance(was, dict) and isinstance(now, dict):
            out += [f"model.{k}: {was.get(k)!r} -> {now.get(k)!r}"
                    for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]
        elif was != now:
            out.append(f"{key}: {was!r} -> {now!r}")
    return out


def check_identity(spec: StudySpec, where: str, stored: dict[str, Any],
                   stored_space: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Refuse ``spec`` for a study stored with fingerprint ``stored`` that differs
    (:class:`UsageError`, exit 2); else ``(the fingerprint to store, or None when it is
    stored already; the line a changed space is resumed with, or None)``."""
    fingerprint = fingerprint_of(spec)
    diff = differences(stored, fingerprint)
    if diff:
        raise UsageError(
            f"study {spec.name!r} in {where} measured another program or cluster "
            f"({'; '.join(diff)}): a study is one program on one cluster; give this one "
            "a new name (name: in the study file)")
    upgrade = None if all(k in stored for k in fingerprint) else {**fingerprint, **{
        k: v for k, v in stored.items() if k in fingerprint}}
    space = space_of(spec)
    note = None
    if isinstance(stored_space, dict) and stored_space != space:
        changed = [f"{a} {stored_space.get(a)} -> {space[a]}" for a in space
                   if stored_space.get(a) != space[a]]
        note = (f"study {spec.name!r}: resumed with a changed search space "
                f"({'; '.join(changed)}); its trials so far stay")
    return upgrade, note
