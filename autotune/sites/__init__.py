"""Site profiles: what a machine needs around a trial (modules, environment, SLURM options).

A profile is a YAML file in this folder (``supermuc-ng-phase2``, ``aurora``,
``generic-cuda``, ``local-ci``) or any file given by path. :func:`load_site` validates it
into a :class:`SiteProfile`. Every string in a profile ends up in a job script or an
``srun`` argv, so names are checked against strict patterns here (:data:`NAME_RE`,
:data:`ENV_NAME_RE`, :data:`MODULE_RE`) and no value may contain a newline; the campaign
renderer shell-quotes whatever free text remains.

>>> load_site("local-ci").scheduler
'slurm'
>>> load_site("supermuc-ng-phase2").env["ZE_FLAT_DEVICE_HIERARCHY"]
'FLAT'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.config._fields import check_choice, check_int, check_keys
from autotune.errors import SpecError
from autotune.hardware import get_device
from autotune.spec import read_yaml

__all__ = ["SiteProfile", "SiteSlurm", "load_site", "list_sites", "check_name", "check_text",
           "name_list", "env_map", "SRUN_ARG_RE",
           "NAME_RE", "ENV_NAME_RE", "MODULE_RE", "SCHEDULERS", "TIME_RE"]

SITES_DIR = Path(__file__).parent
SCHEDULERS = ("slurm", "pbs")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""Names that travel into job names, file names and SLURM options (account, partition)."""
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MODULE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+/@-]{0,127}$")
GRES_RE = re.compile(r"^[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)*(,[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)*)*$")
SRUN_ARG_RE = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:/=+@-]+)?$")
"""Extra ``srun``/``sbatch`` options: long options only, with a plain value."""
TIME_RE = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")
"""SLURM ``--time``: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM:SS`` (SLURM's
``time_str2secs`` adds the fields up, so ``99:99`` is 99 minutes 99 seconds: SchedMD/slurm
``src/common/parse_time.c`` @01cec7fa): the campaign's ``slurm.time`` and ``best --emit
slurm --time`` alike."""


def check_name(field_name: str, value: Any, pattern: re.Pattern[str] = NAME_RE) -> str:
    """A string matching ``pattern`` (no quotes, spaces, ``$``, backticks, newlines)."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise SpecError(field_name, value, f"allowed: a string matching {pattern.pattern} "
                        "(letters, digits and a few of _ . - ; no spaces, quotes or $)")
    return value


def check_text(field_name: str, value: Any) -> str:
    """Free text for a script (shell-quoted later): any printable line, no newline/NUL."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SpecError(field_name, value, "allowed: a string")
    text = str(value)
    if any(c in text for c in "\n\r\x00") or not text.isprintable():
        raise SpecError(field_name, value, "allowed: one line of printable text (no newline)")
    return text


def name_list(field_name: str, value: Any, pattern: re.Pattern[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SpecError(field_name, value, "allowed: a list of strings")
    return tuple(check_name(f"{field_name}[{i}]", v, pattern) for i, v in enumerate(value))


def env_map(field_name: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(field_name, value, "expected a mapping of variable names to values")
    return {check_name(f"{field_name} key", k, ENV_NAME_RE): check_text(f"{field_name}.{k}", v)
            for k, v in value.items()}


@dataclass(frozen=True)
class SiteSlurm:
    """SLURM defaults of a site; a campaign or a study's ``launcher.slurm`` may override."""

    partition: str | None = None
    gres: str | None = None
    """GRES per node, e.g. ``gpu:4`` (``None``: whole nodes, no GRES)."""
    cpus_per_task: int | None = None
    srun_args: tuple[str, ...] = ()
    """Extra ``srun`` options for every trial step (``--cpu-bind=cores``)."""
    sbatch_args: tuple[str, ...] = ()
    """Extra ``#SBATCH`` options for campaign jobs (``--constraint=xeon``)."""

    @classmethod
    def from_dict(cls, data: Any) -> SiteSlurm:
        data = check_keys("site.slurm", {} if data is None else data, cls.__dataclass_fields__)
        out: dict[str, Any] = {}
        if data.get("partition") is not None:
            out["partition"] = check_name("site.slurm.partition", data["partition"])
        if data.get("gres") is not None:
            out["gres"] = check_name("site.slurm.gres", data["gres"], GRES_RE)
        if data.get("cpus_per_task") is not None:
            out["cpus_per_task"] = check_int("site.slurm.cpus_per_task", data["cpus_per_task"])
        for key in ("srun_args", "sbatch_args"):
            out[key] = name_list(f"site.slurm.{key}", data.get(key), SRUN_ARG_RE)
        return cls(**out)


@dataclass(frozen=True)
class SiteProfile:
    """Modules, environment and scheduler defaults of one machine."""

    name: str
    description: str = ""
    scheduler: str = "slurm"
    """``slurm``, or ``pbs`` (Aurora): campaigns and the SLURM launcher refuse ``pbs``."""
    device: str = "cpu"
    """The device table entry of one rank (:mod:`autotune.hardware`)."""
    devices_per_node: int = 1
    slurm: SiteSlurm = field(default_factory=SiteSlurm)
    modules: tuple[str, ...] = ()
    """``module load`` names, in order."""
    env: dict[str, str] = field(default_factory=dict)
    """Exported for every rank (and into campaign job scripts, shell-quoted)."""

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> SiteProfile:
        try:
            data = check_keys("site", data, cls.__dataclass_fields__)
            if "name" not in data:
                raise SpecError("site.name", None, "required")
            device = data.get("device", "cpu")
            get_device(device, "site.device")  # a SpecError listing the known devices
            return cls(
                name=check_name("site.name", data["name"]),
                description=check_text("site.description", data.get("description", "")),
                scheduler=check_choice("site.scheduler", data.get("scheduler", "slurm"),
                                       SCHEDULERS),
                device=device,
                devices_per_node=check_int("site.devices_per_node",
                                           data.get("devices_per_node", 1)),
                slurm=SiteSlurm.from_dict(data.get("slurm")),
                modules=name_list("site.modules", data.get("modules"), MODULE_RE),
                env=env_map("site.env", data.get("env")),
            )
        except SpecError as err:
            raise SpecError(err.field, err.value, err.allowed, source=source) from None

    def require_slurm(self) -> None:
        if self.scheduler != "slurm":
            raise SpecError("site", self.name, f"this site is scheduled by {self.scheduler}, "
                            "not SLURM: use its env part in a hand-written job script "
                            "(docs/hpc.md); SLURM sites: "
                            + ", ".join(n for n in list_sites() if load_site(n).scheduler
                                        == "slurm"))


def list_sites() -> list[str]:
    """Names of the profiles shipped with autotune."""
    return sorted(p.stem for p in SITES_DIR.glob("*.yaml"))


def load_site(name_or_path: str, *, base_dir: str | Path | None = None) -> SiteProfile:
    """A shipped profile by name, or a YAML file by path (relative to ``base_dir``)."""
    if not isinstance(name_or_path, str) or not name_or_path:
        raise SpecError("site", name_or_path, f"allowed: one of {list_sites()} or a file path")
    if NAME_RE.fullmatch(name_or_path) and (SITES_DIR / f"{name_or_path}.yaml").exists():
        path = SITES_DIR / f"{name_or_path}.yaml"
    else:
        path = Path(name_or_path)
        if base_dir is not None and not path.is_absolute():
            path = Path(base_dir) / path
        if not path.is_file():
            raise SpecError("site", name_or_path,
                            f"allowed: one of {', '.join(list_sites())} or a YAML file path")
    data = read_yaml(path, field="site")
    return SiteProfile.from_dict(data, source=str(path))
