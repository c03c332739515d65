"""Which launcher runs the trials, and its own options (one dataclass per launcher kind)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.config._drift import drift_rules
from autotune.config._fields import (
    check_choice,
    check_float,
    check_int,
    check_keys,
    check_text,
)
from autotune.errors import SpecError

if TYPE_CHECKING:
    from autotune.config._drift import DriftRule

__all__ = ["LauncherConfig", "LocalOptions", "SlurmOptions", "ReplayOptions", "LAUNCHER_KINDS"]

LAUNCHER_KINDS: tuple[str, ...] = ("local", "slurm", "replay")


def _str_map(section: str, data: Any) -> dict[str, str]:
    if not isinstance(data, dict):
        raise SpecError(section, data, "expected a mapping of names to strings")
    out = {}
    for k, v in data.items():
        if not isinstance(k, str) or not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise SpecError(f"{section}.{k}", v, "allowed: a string (or number) value")
        if isinstance(v, int) and abs(v).bit_length() > 256:  # str() of it is quadratic
            raise SpecError(f"{section}.{k}", v, "allowed: a string (or number) value")
        check_text(f"{section} key", k, max_chars=256)
        out[k] = check_text(f"{section}.{k}", str(v), max_chars=65_536)
    return out


@dataclass(frozen=True)
class LocalOptions:
    """``torchrun`` on this machine."""

    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for every rank."""
    python: str | None = None
    """Interpreter for the trial (default: the one running autotune)."""

    @classmethod
    def from_dict(cls, data: Any) -> LocalOptions:
        data = dict(check_keys("launcher.local", data, ("env", "python")))
        if "env" in data:
            data["env"] = _str_map("launcher.local.env", data["env"])
        if data.get("python") is not None:
            check_text("launcher.local.python", data["python"])
        return cls(**data)


@dataclass(frozen=True)
class SlurmOptions:
    """``srun`` job steps inside an allocation (see ``docs/hpc.md``)."""

    site: str | None = None
    """A site profile (``autotune/sites/*.yaml`` name or a file path): modules, env, GRES."""
    gpus_per_node: str | None = None
    """GRES request per node, e.g. ``gpu:4`` (None: no GRES)."""
    cpus_per_task: int | None = None
    """``srun --cpus-per-task`` of each rank (None: SLURM's default)."""
    extra_args: tuple[str, ...] = ()
    """Further ``srun`` arguments, passed as separate argv items (never through a shell)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for every rank (over the site profile's)."""

    @classmethod
    def from_dict(cls, data: Any) -> SlurmOptions:
        data = dict(check_keys("launcher.slurm", data,
                               ("site", "gpus_per_node", "cpus_per_task", "extra_args", "env")))
        if "env" in data:
            data["env"] = _str_map("launcher.slurm.env", data["env"])
        if "cpus_per_task" in data:
            check_int("launcher.slurm.cpus_per_task", data["cpus_per_task"], maximum=100_000)
        for key in ("site", "gpus_per_node"):
            if data.get(key) is not None:
                check_text(f"launcher.slurm.{key}", data[key])
        if "extra_args" in data:
            args = data["extra_args"]
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise SpecError("launcher.slurm.extra_args", args, "allowed: a list of strings")
            data["extra_args"] = tuple(check_text(f"launcher.slurm.extra_args[{i}]", a)
                                       for i, a in enumerate(args))
        return cls(**data)


@dataclass(frozen=True)
class ReplayOptions:
    """Answer trials from a table of measured layouts instead of running them."""

    landscape: str = ""
    """CSV in the vTrain or Aurora format (``data/landscapes/`` ships two)."""
    group: int | None = None
    """Which landscape group of the file (index as listed by ``autotune landscapes``);
    None: the group matching the study's model, world size and global batch."""
    drift: tuple[DriftRule, ...] = ()
    """Injected drift (tests and benchmarks of noisy machines): each rule
    multiplies the step time of ``layout`` (``*``: every layout) by ``factors[n]`` at the
    launcher's n-th answer of the run (0-based, over all layouts; the last factor holds
    after), and divides its TFLOPS and tokens per second by the same, as a neighbour's job
    slowing the machine would. Rules that match multiply. Empty: the table as measured."""

    study_check: bool = True
    """Check the table's rows as a real study of this cluster would (the default, so that
    a replay behaves as the study it stands for, and ``autotune run`` on a table gives
    what ``benchmarks/search_efficiency.py`` does): the placement and memory rules
    exclude rows (a row that ran may be excluded), and each kept row is weighed by its
    probability of fitting, conditioned on the study's OOMs and runs. ``false``: only the
    structural rules (every row of the table is a candidate, each fits with probability
    1), what ``search_efficiency.py --no-study-check`` replays."""
    build_s: float = 60.0
    """Seconds a replayed trial spends before its first step (process start, imports,
    rendezvous, model build), which a table does not record: a failed build (an OOM)
    costs this, a layout that ran this plus its steps (``timings_s`` of each replayed
    result; device-seconds = seconds x devices). An assumption, not a measurement."""

    @classmethod
    def from_dict(cls, data: Any) -> ReplayOptions:
        data = dict(check_keys("launcher.replay", data, ("landscape", "group", "drift",
                                                          "study_check", "build_s")))
        if "drift" in data:
            data["drift"] = drift_rules(data["drift"])
        if not data.get("landscape"):
            raise SpecError("launcher.replay.landscape", data.get("landscape"),
                            "required: path of a measured-landscape CSV")
        check_text("launcher.replay.landscape", data["landscape"])
        if data.get("group") is not None:
            check_int("launcher.replay.group", data["group"], minimum=0, maximum=1_000_000)
        if "study_check" in data and not isinstance(data["study_check"], bool):
            raise SpecError("launcher.replay.study_check", data["study_check"],
                            "allowed: true or false")
        if "build_s" in data:
            check_float("launcher.replay.build_s", data["build_s"], maximum=86_400.0)
        return cls(**data)


@dataclass(frozen=True)
class LauncherConfig:
    """Which launcher runs the trials, and the options of each kind."""

    kind: str = "local"
    """``local`` (torchrun here), ``slurm`` (srun steps) or ``replay`` (measured table)."""
    run_dir: str = "runs"
    """Per-trial directories (spec, result, logs) go under ``<run_dir>/<study>/``."""
    local: LocalOptions = field(default_factory=LocalOptions)
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    replay: ReplayOptions | None = None

    def __post_init__(self) -> None:
        check_choice("launcher.kind", self.kind, LAUNCHER_KINDS)
        if self.kind == "replay" and self.replay is None:
            raise SpecError("launcher.replay", None, "required when launcher.kind is 'replay'")

    @classmethod
    def from_dict(cls, data: Any) -> LauncherConfig:
        data = dict(check_keys("launcher", data, ("kind", "run_dir", "local", "slurm", "replay")))
        if "local" in data:
            data["local"] = LocalOptions.from_dict(data["local"])
        if "slurm" in data:
            data["slurm"] = SlurmOptions.from_dict(data["slurm"])
        if "replay" in data:
            data["replay"] = ReplayOptions.from_dict(data["replay"])
        if "run_dir" in data and not isinstance(data["run_dir"], str):
            raise SpecError("launcher.run_dir", data["run_dir"], "allowed: a directory path")
        if "run_dir" in data:
            check_text("launcher.run_dir", data["run_dir"])
        return cls(**data)
