"""Exporters of the best layout: JSON, a DeepSpeed config, Megatron-DeepSpeed arguments, and
the launch line of the study's own workload (``--emit command``).

Megatron-DeepSpeed's flags come from :mod:`autotune.workloads.megatron`, the module the
``megatron-deepspeed`` workload builds its trials' argv from: what is exported is what ran.

>>> from autotune.layout import Layout
>>> lay = Layout(tp=2, pp=4, dp=2, micro_batch=1, grad_accum=16, zero_stage=1,
...              recompute="full")
>>> megatron_deepspeed_args(lay, dtype="bf16")[:8]  # doctest: +NORMALIZE_WHITESPACE
['--tensor-model-parallel-size', '2', '--pipeline-model-parallel-size', '4',
 '--micro-batch-size', '1', '--global-batch-size', '32']
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.config.model import ModelConfig
from autotune.dsconfig import deepspeed_config
from autotune.errors import UsageError
from autotune.layout import Layout
from autotune.storage import TrialAttr, study_fingerprint, study_workload
from autotune.util.atomic import write_json_atomic
from autotune.workloads import megatron

__all__ = ["emit_best", "megatron_deepspeed_args", "best_json", "command_line", "launch_line",
           "production_iters"]


def megatron_deepspeed_args(layout: Layout, *, dtype: str,
                            model: dict[str, Any] | None = None,
                            device: str | None = None) -> list[str]:
    """Megatron-DeepSpeed (``pretrain_gpt.py``) arguments for ``layout`` (and ``model``, a
    study fingerprint's model): :func:`autotune.workloads.megatron.layout_args` and
    :func:`~autotune.workloads.megatron.model_args`, the flags its trials ran with; the
    fused-attention flag is the study ``device``'s
    (:func:`~autotune.workloads.megatron.flash_attention_flag`)."""
    # MiCS runs only under argonne-lcf's pretrain_gpt_alcf.py --use-mics (strategy_flags).
    args = megatron.layout_args(layout, dtype=dtype, use_mics=layout.zero_variant == "mics")
    if model:
        args += megatron.model_args(_model(model), device=device)
    return args


def _script_for(layout: Layout) -> str:
    """The Megatron-DeepSpeed script that runs ``layout``: MiCS needs argonne-lcf's
    ``pretrain_gpt_alcf.py`` (:mod:`autotune.workloads.strategy_flags`)."""
    return "pretrain_gpt_alcf.py" if layout.zero_variant == "mics" else "pretrain_gpt.py"


def _model(data: dict[str, Any]) -> ModelConfig:
    known = {k: v for k, v in data.items() if k in ModelConfig.__dataclass_fields__}
    return ModelConfig(**known)


def command_line(study: optuna.Study, layout: Layout, *, out_dir: Path,
                 train_iters: int | None = None) -> list[str]:
    """The study's own program for ``layout``: the ``command`` template filled, or the
    Megatron-DeepSpeed script with the user's arguments and the layout's flags, with
    ``OUT_DIR/ds_config.json`` as the DeepSpeed config. The step count is the production
    run's (``train_iters``, else :func:`production_iters`), never a trial's short run."""
    from autotune.trial import RunConfig, TrialPaths, TrialSpec
    from autotune.workloads.base import Placement
    from autotune.workloads.foreign import fill, placeholder_values, trial_ds_config

    record = study_workload(study)
    if record is None or record.get("kind", "builtin") == "builtin":
        raise UsageError(f"study {study.study_name!r} ran the built-in trainer: there is no "
                         "command of your own to emit; use --emit deepspeed or "
                         "megatron-deepspeed")
    fp = study_fingerprint(study)
    dtype = fp.get("dtype", "bf16")
    run = RunConfig(dtype=dtype, warmup_steps=0, measure_steps=int(record["train_iters"]))
    spec = TrialSpec(model=_model(fp.get("model") or {}), layout=layout, run=run)
    paths = TrialPaths(out_dir)
    # As recorded (not re-validated: the script need not exist where `best` runs).
    write_json_atomic(paths.ds_config, trial_ds_config(spec, dict(record.get("ds_config") or {})))
    nodes, per_node = _geometry(record, layout)
    placement = Placement(python="python", nodes=nodes, ranks_per_node=per_node,
                          master_addr="$MASTER_ADDR", master_port=29500)
    iters = train_iters if train_iters is not None else production_iters(record)
    values = {**placeholder_values(spec, paths, placement), "train_iters": iters}
    if record["kind"] == "command":
        return fill(list(record.get("argv") or []), values)
    user = fill(list(record.get("args") or []), values)
    script = str(record.get("script"))
    return [record.get("python") or "python", script, *user,
            *megatron.layout_args(layout, dtype=dtype,
                                  use_mics=megatron.script_has_use_mics(script)),
            *megatron.model_args(spec.model, given=user, kernels=False),
            "--train-iters", str(iters), "--deepspeed", "--deepspeed_config",
            str(paths.ds_config)]


TRAIN_ITERS = "{train_iters}"
"""What the production line keeps for the step count when the study names none."""


def production_iters(record: dict[str, Any]) -> int | str:
    """The production run's optimizer steps: ``workload.production_train_iters``, else the
    placeholder ``{train_iters}`` left for the user to fill. A trial's step count (warm-up
    + cap) is autotune's own value: it is never printed. (A literal step count in the
    user's argv is printed as written: autotune never replaces one; Megatron-DeepSpeed's
    ``--train-iters`` is refused in ``workload.args``, so there is none to restore.)"""
    given = record.get("production_train_iters")
    return int(given) if isinstance(given, int) and given > 0 else TRAIN_ITERS


def _geometry(record: dict[str, Any], layout: Layout) -> tuple[int, int]:
    """(nodes, ranks per node) of the layout, as the study's trials were placed."""
    per_node = min(layout.world_size, int(record.get("ranks_per_node") or layout.world_size))
    return -(-layout.world_size // per_node), per_node


def launch_line(record: dict[str, Any], layout: Layout, argv: list[str]) -> list[str]:
    """``argv`` behind the study's launcher, geometry filled: ``torchrun --nnodes N
    --nproc-per-node P --no-python ...`` (local; one command per node where N > 1), ``srun
    --nodes N --ntasks W --ntasks-per-node P ...`` with the rank variables autotune's
    trials got (:mod:`autotune.workloads.rank_env`), or the command as it is where it
    launches its own ranks (``workload.outer: none``; on SLURM once per node)."""
    launcher = record.get("launcher") or {"kind": "local"}
    per_device = record.get("outer", "per-device") == "per-device"
    nodes, per_node = _geometry(record, layout)
    if launcher.get("kind") == "slurm":
        tasks, tasks_per_node = (layout.world_size, per_node) if per_device else (nodes, 1)
        cmd = ["srun", f"--nodes={nodes}", f"--ntasks={tasks}",
               f"--ntasks-per-node={tasks_per_node}"]
        if launcher.get("gpus_per_node"):
            cmd.append(f"--gres={launcher['gpus_per_node']}")
        if launcher.get("cpus_per_task"):
            cmd.append(f"--cpus-per-task={launcher['cpus_per_task']}")
        cmd += [str(a) for a in launcher.get("extra_args") or []]
        prefix = ["python", "-m", "autotune.workloads.rank_env", "--"] if per_device else []
        return [*cmd, *prefix, *argv]
    if not per_device:
        return argv
    rendezvous = ["--standalone"] if nodes == 1 else [
        "--rdzv-backend=c10d", "--rdzv-endpoint=$MASTER_ADDR:29500"]
    return ["torchrun", *rendezvous, f"--nnodes={nodes}", f"--nproc-per-node={per_node}",
            "--no-python", *argv]


def _quote(word: str) -> str:
    """A shell word; ``$MASTER_ADDR`` stays expandable (double quotes), the rest is
    quoted as :func:`shlex.quote` does."""
    if "$MASTER_ADDR" in word and '"' not in word and "`" not in word:
        return f'"{word}"'
    return shlex.quote(word)


def _with_env(env: dict[str, Any], argv: list[str]) -> str:
    """The shell line ``K=V ... argv``: the study's ``workload.env`` is part of what ran
    (``PYTHONPATH``, ``LOCAL_SIZE``...), secrets masked (never printed)."""
    from autotune.storage.urls import mask_env

    assignments = [f"{k}={shlex.quote(v)}" for k, v in
                   mask_env({str(k): str(v) for k, v in env.items()}).items()]
    return " ".join([*assignments, *(_quote(w) for w in argv)])


def best_json(study: optuna.Study, layout: Layout, trial: FrozenTrial) -> dict[str, Any]:
    keys = (TrialAttr.MODEL_TFLOPS, TrialAttr.HARDWARE_TFLOPS, TrialAttr.MFU,
            TrialAttr.STEP_TIME_S, TrialAttr.TOKENS_PER_S, TrialAttr.PEAK_MEMORY_GIB,
            TrialAttr.DEVICE_NAME)
    from autotune.report.results import confirmation_of
    from autotune.trial.paired import equivalence_text

    confirmation = confirmation_of(study)
    return {"study": study.study_name, "trial": trial.number, "layout": layout.to_dict(),
            "world_size": layout.world_size, "global_batch": layout.global_batch,
            **{k: trial.user_attrs[k] for k in keys if k in trial.user_attrs},
            "confirmation": confirmation,
            "equivalence": equivalence_text(confirmation) if confirmation else None}


def emit_best(study: optuna.Study, layout: Layout, trial: FrozenTrial, *, fmt: str,
              out_dir: Path) -> str:
    """Text to print for ``autotune best --emit FMT``; ``deepspeed`` also writes
    ``OUT_DIR/ds_config.json`` (atomically)."""
    fp = study_fingerprint(study)
    dtype = fp.get("dtype", "bf16")
    summary = best_json(study, layout, trial)
    if fmt == "json":
        return json.dumps(summary, indent=2)
    deepspeed_args = ["--deepspeed", "--deepspeed_config", "ds_config.json"]
    if fmt == "deepspeed":
        path = out_dir / "ds_config.json"
        write_json_atomic(path, deepspeed_config(layout, dtype))
        mega = megatron_deepspeed_args(layout, dtype=dtype, model=fp.get("model"),
                                       device=fp.get("device"))
        # Megatron refuses --sequence-parallel on CUDA without it (megatron.SP_ENV).
        env = "".join(f"{k}={v} " for k, v in megatron.SP_ENV.items()
                      ) if layout.sequence_parallel else ""
        return "\n".join([
            f"wrote {path} for {layout.key()} "
            f"({trial.value:.4g} model TFLOPS/device, trial #{trial.number})",
            "launch (Megatron-DeepSpeed):",
            f"  {env}deepspeed {_script_for(layout)} " + shlex.join(mega + deepspeed_args),
            f"tensor parallel {layout.tp} x pipeline {layout.pp} x data parallel {layout.dp}"
            f" = {layout.world_size} devices",
        ])
    if fmt == "command":
        argv = command_line(study, layout, out_dir=out_dir)
        record = study_workload(study) or {}
        launcher = record.get("launcher") or {}
        program_env = {**(launcher.get("env") or {}), **(record.get("env") or {})}
        lines = [f"# best: {layout.key()} ({trial.value:.4g} model TFLOPS/device, trial "
                 f"#{trial.number}); wrote {out_dir / 'ds_config.json'}; the production run"]
        if production_iters(record) == TRAIN_ITERS:
            lines.append(f"# fill in {TRAIN_ITERS}: your run's optimizer steps (or set "
                         "workload.production_train_iters in the study file)")
        if record.get("outer", "per-device") != "per-device":
            lines.append("# the command launches its own ranks"
                         + (" (srun: once per node)" if launcher.get("kind") == "slurm"
                            else ""))
        elif _geometry(record, layout)[0] > 1 and launcher.get("kind", "local") == "local":
            lines.append("# run it on each node, MASTER_ADDR set to the first")
        return "\n".join([*lines, _with_env(program_env, launch_line(record, layout, argv))])
    mega = megatron_deepspeed_args(layout, dtype=dtype, model=fp.get("model"),
                                       device=fp.get("device"))
    return shlex.join(mega)
