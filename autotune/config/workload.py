"""Which training program a study's trials run: the ``workload`` section of a study file.

* ``builtin`` (the default): autotune's own trainer, ``python -m trainer``.
* ``command``: the user's own program, an argv template with placeholders
  (:data:`PLACEHOLDERS`) that autotune fills per trial; the program reports its steps in
  the metrics file (``docs/own-command.md``) or prints them in a log format autotune reads.
* ``megatron-deepspeed``: the user's ``pretrain_gpt.py`` with their own arguments; autotune
  adds the flags it owns (:mod:`autotune.workloads.megatron`).

Everything is checked at load time, before any database or launcher is touched: an unknown
placeholder, a command that is not found, a script that does not exist, a user argument
that gives a flag autotune owns (both are named), a model flag that contradicts the study's
``model``; each is a :class:`~autotune.errors.SpecError` (exit code 2).
"""

from __future__ import annotations

import json
import os
import shutil
import string
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.config._fields import check_choice, check_float, check_int, check_keys, check_text
from autotune.config.launcher import _str_map
from autotune.errors import SpecError

__all__ = ["WorkloadConfig", "WORKLOAD_KINDS", "OUTER_CHOICES", "PLACEHOLDERS",
           "OWNED_DS_CONFIG_KEYS", "placeholders_in"]

WORKLOAD_KINDS: tuple[str, ...] = ("builtin", "command", "megatron-deepspeed")
OUTER_CHOICES: tuple[str, ...] = ("per-device", "none")
PLACEHOLDERS: dict[str, str] = {
    "tp": "tensor-parallel degree", "pp": "pipeline-parallel degree",
    "dp": "data-parallel degree", "micro_batch": "sequences per micro-batch per replica",
    "grad_accum": "micro-batches per optimizer step",
    "global_batch": "sequences per optimizer step (dp x micro_batch x grad_accum)",
    "zero_stage": "ZeRO stage 0-3", "recompute": "'none', 'selective' or 'full'",
    "sequence_parallel": "'true' or 'false' (sequence parallelism, only with tp > 1)",
    "ds_config": "path of the trial's DeepSpeed config (JSON)",
    "trial_dir": "the trial's directory", "train_iters": "optimizer steps to run",
    "metrics_file": "path of the trial's metrics file (also $AUTOTUNE_METRICS_FILE)",
    "world_size": "ranks of the trial (tp x pp x dp)", "nodes": "nodes of the trial",
    "ranks_per_node": "ranks per node", "master_addr": "rendezvous host",
    "master_port": "rendezvous port",
}
"""Every ``{name}`` an argv template may hold, with what it is replaced by."""
OWNED_DS_CONFIG_KEYS: tuple[str, ...] = (
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "zero_optimization", "bf16", "fp16")
"""DeepSpeed config keys the layout sets: ``workload.ds_config`` may add others only."""
MAX_NO_PROGRESS_S = 30 * 86_400
MAX_PRODUCTION_ITERS = 10**9
_PYTHON_NAMES = ("python", "python3")


def placeholders_in(field_name: str, text: str) -> list[str]:
    """The ``{name}`` fields of ``text``; a :class:`SpecError` on ``field_name`` for an
    unknown name or unbalanced braces (``{{`` and ``}}`` are literal braces).

    >>> placeholders_in("argv[1]", "--mb={micro_batch} {{x}}")
    ['micro_batch']
    """
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as err:
        raise SpecError(field_name, text, f"malformed placeholder ({err}); write {{{{ and "
                        "}} for literal braces") from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS or spec or conversion:
            raise SpecError(field_name, text, f"unknown placeholder {{{name}}}; allowed: "
                            + ", ".join("{" + p + "}" for p in PLACEHOLDERS))
        names.append(name)
    return names


def _str_list(field_name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, (str, int, float))
                                              and not isinstance(a, bool) for a in value):
        raise SpecError(field_name, value, "allowed: a list of strings")
    items = tuple(check_text(f"{field_name}[{i}]", str(a)) for i, a in enumerate(value))
    for i, item in enumerate(items):
        placeholders_in(f"{field_name}[{i}]", item)
    return items


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # a name too long for the file system is no file either
        return False


def _found(command: str) -> bool:
    """A program name on ``PATH`` or an existing file (relative: from the working
    directory, where the trials are started)."""
    if os.sep in command or command.startswith("."):
        return _is_file(command)
    try:
        return shutil.which(command) is not None
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class WorkloadConfig:
    """The training program of a study's trials (``docs/own-command.md``)."""

    kind: str = "builtin"
    """``builtin``, ``command`` or ``megatron-deepspeed``."""
    argv: tuple[str, ...] = ()
    """``command``: the program and its arguments, with ``{placeholder}`` fields."""
    script: str | None = None
    """``megatron-deepspeed``: the training script (``pretrain_gpt.py``); relative paths
    from the directory autotune runs in."""
    args: tuple[str, ...] = ()
    """``megatron-deepspeed``: the user's own arguments (data, tokenizer, model flags...);
    placeholders allowed, owned flags refused."""
    python: str | None = None
    """``megatron-deepspeed``: the interpreter of the script (default: the launcher's)."""
    outer: str = "per-device"
    """``per-device``: autotune starts one process per device (torchrun here, one srun task
    per device on SLURM, rendezvous variables set). ``none``: autotune starts the command
    as it is (once; on SLURM once per node) and the command launches its own ranks, e.g.
    ``deepspeed ...`` or ``torchrun ...`` with ``{ranks_per_node}``, ``{master_port}``."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables of the program."""
    ds_config: dict[str, Any] = field(default_factory=dict)
    """``command`` and ``megatron-deepspeed``: DeepSpeed config keys added to each trial's
    ``ds_config.json`` (never the ones the layout sets: :data:`OWNED_DS_CONFIG_KEYS`)."""
    no_progress_s: float = 300.0
    """A trial that reports no new step for this long is killed with all its processes
    (ranks on other nodes would otherwise hang for the collectives' timeout)."""
    startup_s: float | None = None
    """How long the first step may take from the launch (imports, data index, compile);
    default: ``no_progress_s``."""
    production_train_iters: int | None = None
    """The optimizer steps of your production run: what ``autotune best --emit command``
    puts for ``{train_iters}`` (and Megatron-DeepSpeed's ``--train-iters``). Trials never
    use it (they run warm-up + the step cap and are stopped once measured). ``null``: the
    line keeps ``{train_iters}`` for you to fill."""

    def __post_init__(self) -> None:
        check_choice("workload.kind", self.kind, WORKLOAD_KINDS)
        check_choice("workload.outer", self.outer, OUTER_CHOICES)
        check_float("workload.no_progress_s", self.no_progress_s, strict=True,
                    maximum=MAX_NO_PROGRESS_S)
        if self.startup_s is not None:
            check_float("workload.startup_s", self.startup_s, strict=True,
                        maximum=MAX_NO_PROGRESS_S)
        if self.production_train_iters is not None:
            check_int("workload.production_train_iters", self.production_train_iters,
                      maximum=MAX_PRODUCTION_ITERS)
        if self.kind == "command":
            self._check_command()
        elif self.kind == "megatron-deepspeed":
            self._check_megatron()
        else:
            # ds_config too: the built-in trainer writes its own DeepSpeed config from the
            # layout (autotune.dsconfig) and would silently ignore the extras.
            for name in ("argv", "script", "args", "python", "ds_config"):
                if getattr(self, name):
                    raise SpecError(f"workload.{name}", getattr(self, name),
                                    "allowed only with workload.kind 'command' or "
                                    "'megatron-deepspeed'")
        if self.kind == "builtin" and self.outer != "per-device":
            raise SpecError("workload.outer", self.outer,
                            "allowed: 'per-device' for the built-in trainer")
        for key in self.ds_config:
            if key in OWNED_DS_CONFIG_KEYS:
                raise SpecError(f"workload.ds_config.{key}", self.ds_config[key],
                                f"conflicts with the DeepSpeed key autotune sets from the "
                                f"layout and training.dtype ({', '.join(OWNED_DS_CONFIG_KEYS)})")

    def _check_command(self) -> None:
        if not self.argv:
            raise SpecError("workload.argv", list(self.argv),
                            "required with workload.kind 'command': the program and its "
                            "arguments, e.g. [python, train.py, --mb, '{micro_batch}']")
        for name in ("script", "args", "python"):
            if getattr(self, name):
                raise SpecError(f"workload.{name}", getattr(self, name),
                                "allowed only with workload.kind 'megatron-deepspeed' "
                                "(a command says everything in workload.argv)")
        command = self.argv[0]
        if placeholders_in("workload.argv[0]", command):
            raise SpecError("workload.argv[0]", command,
                            "allowed: a program name or path without placeholders")
        if not _found(command):
            raise SpecError("workload.argv[0]", command,
                            "command not found: not on PATH and no such file (relative "
                            "paths are read from the directory autotune runs in)")
        if Path(command).name.startswith(_PYTHON_NAMES) and len(self.argv) > 1:
            script = self.argv[1]
            if script.endswith(".py") and not placeholders_in("workload.argv[1]", script) \
                    and not _is_file(script):
                raise SpecError("workload.argv[1]", script, "no such script (relative paths "
                                f"are read from the directory autotune runs in: {os.getcwd()})")

    def _check_megatron(self) -> None:
        if self.argv:
            raise SpecError("workload.argv", list(self.argv),
                            "allowed only with workload.kind 'command'; a "
                            "megatron-deepspeed workload takes script and args")
        if not self.script:
            raise SpecError("workload.script", self.script,
                            "required with workload.kind 'megatron-deepspeed': the path of "
                            "pretrain_gpt.py (or your copy of it)")
        if not _is_file(self.script):
            raise SpecError("workload.script", self.script, "no such script (relative paths "
                            f"are read from the directory autotune runs in: {os.getcwd()})")
        if self.python is not None and not _found(self.python):
            raise SpecError("workload.python", self.python,
                            "command not found: not on PATH and no such file")

    @property
    def foreign(self) -> bool:
        """Whether the program is the user's (not autotune's trainer)."""
        return self.kind != "builtin"

    @property
    def first_step_s(self) -> float:
        return self.startup_s if self.startup_s is not None else self.no_progress_s

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["argv"], out["args"] = list(self.argv), list(self.args)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> WorkloadConfig:
        data = dict(check_keys("workload", data, cls.__dataclass_fields__))
        for name in ("argv", "args"):
            if name in data:
                data[name] = _str_list(f"workload.{name}", data[name])
        for name in ("script", "python"):
            if data.get(name) is not None:
                check_text(f"workload.{name}", data[name])
        if "env" in data:
            data["env"] = _str_map("workload.env", data["env"])
        if "ds_config" in data:
            extra = data["ds_config"]
            try:
                ok = isinstance(extra, dict) and json.dumps(extra, allow_nan=False) != ""
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise SpecError("workload.ds_config", extra, "allowed: a mapping of DeepSpeed "
                                "config keys with JSON values (finite numbers, text, lists, "
                                "mappings)")
        return cls(**data)
