"""Campaign files: many studies, one shared database, SLURM job arrays of workers.

A campaign file (``studies/campaigns/*.yaml``, schema in ``docs/hpc.md``)::

    name: max1550-sweep
    storage:
      url: postgresql+psycopg://tuner@db.example.org:5432/tuning   # no password here
      password_file: ~/.autotune/dbpass                            # or AUTOTUNE_DB_PASSWORD
    site: supermuc-ng-phase2
    slurm: {account: pn12ab, partition: general, time: "02:00:00", workers: 4,
            max_continuations: 3}
    studies:
      - file: ../gpt-1b.yaml
      - file: ../gpt-1b.yaml
        name: gpt-1b-2n
        overrides: {cluster: {nodes: 2}, search: {n_trials: 30}}
        matrix: {model.preset: [gpt-350m, gpt-1b]}      # one study per value (× ...)

:func:`load_campaign` validates it into a :class:`CampaignSpec` whose studies are fully
validated :class:`~autotune.spec.StudySpec` objects. Every string that reaches a job script
is checked here against a strict pattern or is shell-quoted by the renderer; a literal
password in the URL is refused (it would land in scripts and ``scontrol show job``).
"""

from __future__ import annotations

import copy
import itertools
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from autotune.config._fields import check_int, check_keys, optional_section
from autotune.config.cluster import profile_path
from autotune.errors import SpecError
from autotune.sites import (
    NAME_RE,
    SRUN_ARG_RE,
    TIME_RE,
    SiteProfile,
    check_name,
    check_text,
    env_map,
    load_site,
    name_list,
)
from autotune.spec import StudySpec, parse_study, read_yaml
from autotune.storage.urls import backend_of, mask_url

__all__ = ["CampaignSpec", "CampaignStudy", "CampaignSlurm", "load_campaign",
           "SQLITE_WARNING", "TIME_RE"]

_URL_RE = re.compile(r"^[A-Za-z0-9+]+://[A-Za-z0-9_.~%@:/?=&,{}$+-]*$")
SQLITE_WARNING = ("storage is SQLite: workers on several nodes write to one file; SQLite over "
                  "a shared filesystem loses trials under concurrent writers (16 workers lose "
                  "some). Use PostgreSQL or MySQL for campaigns (docs/hpc.md)")


@dataclass(frozen=True)
class CampaignSlurm:
    """SLURM resources of every worker job (one array per study)."""

    account: str | None = None
    partition: str | None = None
    """Default: the site profile's partition, else the cluster default."""
    qos: str | None = None
    time: str = "01:00:00"
    """Walltime of each job; continuations pick up where it stops."""
    workers: int = 1
    """Array size: concurrent workers per study, all on the same study and database."""
    max_continuations: int = 2
    """Follow-up jobs (``--dependency=afterany``) per study; bounds the chain."""
    signal_s: int = 120
    """SIGTERM this many seconds before the walltime (``--signal=B:TERM@N``)."""
    sbatch_args: tuple[str, ...] = ()
    """Extra long options (``--constraint=...``), validated, one per ``#SBATCH`` line."""

    @classmethod
    def from_dict(cls, data: Any) -> CampaignSlurm:
        data = check_keys("slurm", {} if data is None else data, cls.__dataclass_fields__)
        out: dict[str, Any] = {}
        for key in ("account", "partition", "qos"):
            if data.get(key) is not None:
                out[key] = check_name(f"slurm.{key}", data[key])
        if "time" in data:
            out["time"] = check_name("slurm.time", str(data["time"]), TIME_RE)
        if "workers" in data:
            out["workers"] = check_int("slurm.workers", data["workers"])
        if "max_continuations" in data:
            out["max_continuations"] = check_int("slurm.max_continuations",
                                                 data["max_continuations"], minimum=0)
        if "signal_s" in data:
            out["signal_s"] = check_int("slurm.signal_s", data["signal_s"], minimum=10)
        out["sbatch_args"] = name_list("slurm.sbatch_args", data.get("sbatch_args"),
                                       SRUN_ARG_RE)
        return cls(**out)


@dataclass(frozen=True)
class CampaignStudy:
    """One study of the campaign, validated, with the budget its workers share."""

    spec: StudySpec
    base_file: str
    """The study file it came from (overrides applied on top)."""
    document: dict[str, Any]
    """The merged study document, written next to the campaign for the jobs to run."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def n_trials(self) -> int:
        return self.spec.search.n_trials


@dataclass(frozen=True)
class CampaignSpec:
    name: str
    storage_url: str
    """As written (``${VAR}`` unexpanded, no password): safe to render."""
    password_file: str | None
    site: SiteProfile
    slurm: CampaignSlurm
    studies: tuple[CampaignStudy, ...]
    source: Path
    """The campaign file; its state and scripts go to ``<file stem>.campaign/`` beside it."""
    env: dict[str, str] = field(default_factory=dict)
    venv: str | None = None
    """A virtual environment to activate in every job (``source VENV/bin/activate``)."""
    launcher: str = "slurm"
    """``slurm``: trials are job steps of the worker's allocation; ``local``: torchrun."""

    @property
    def workdir(self) -> Path:
        return self.source.parent / f"{self.source.stem}.campaign"

    @property
    def backend(self) -> str:
        return backend_of(self.storage_url.replace("${", "").replace("}", ""))


def _check_url(url: Any) -> str:
    if not isinstance(url, str) or not _URL_RE.fullmatch(url):
        raise SpecError("storage.url", mask_url(str(url)),
                        "allowed: a database URL of plain characters, e.g. "
                        "postgresql+psycopg://user@host:5432/db (${VAR} allowed)")
    probe = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", "x", url)
    backend_of(probe)  # a supported driver
    if "${" not in url.split("@")[0] and make_url(probe).password not in (None, ""):
        raise SpecError("storage.url", mask_url(url),
                        "a literal password would be written into job scripts: remove it and "
                        "set AUTOTUNE_DB_PASSWORD, storage.password_file, or use ${VAR}")
    return url


def _set_dotted(doc: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    cur = doc
    for k in keys[:-1]:
        nxt = cur.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise SpecError(f"matrix.{dotted}", value, f"{k} is not a section")
        cur = nxt
    cur[keys[-1]] = value


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _expand_study(i: int, entry: Any, base_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    where = f"studies[{i}]"
    entry = check_keys(where, entry, ("file", "name", "overrides", "matrix"))
    if "file" not in entry or not isinstance(entry["file"], str):
        raise SpecError(f"{where}.file", entry.get("file"), "required: a study file path")
    path = base_dir / entry["file"]
    base = read_yaml(path, field=f"{where}.file")
    if not isinstance(base, dict):
        raise SpecError(f"{where}.file", str(path), "expected a study mapping")
    overrides = optional_section(entry, "overrides")
    if not isinstance(overrides, dict):
        raise SpecError(f"{where}.overrides", overrides,
                        "allowed: a mapping of study-file sections, e.g. {search: {seed: 1}}")
    doc = _merge(base, overrides)
    if "name" in entry:
        doc["name"] = check_name(f"{where}.name", entry["name"])
    doc.setdefault("name", re.sub(r"[^A-Za-z0-9_.-]", "-", path.stem))
    matrix = optional_section(entry, "matrix")
    if not isinstance(matrix, dict) or not all(isinstance(v, list) and v
                                               for v in matrix.values()):
        raise SpecError(f"{where}.matrix", matrix, "allowed: a mapping of dotted keys to lists")
    out = []
    keys = list(matrix)
    for combo in itertools.product(*(matrix[k] for k in keys)):
        d = copy.deepcopy(doc)
        for k, v in zip(keys, combo, strict=True):
            check_name(f"{where}.matrix key", k, re.compile(r"^[a-z_]+(\.[a-z_]+)+$"))
            _set_dotted(d, k, v)
        if keys:  # one study name per point: base name + the values
            suffix = "-".join(k.split(".")[-1].replace("_", "") + re.sub(r"[^A-Za-z0-9_.]",
                                                                          "", str(v))
                              for k, v in zip(keys, combo, strict=True))
            d["name"] = f"{doc['name']}-{suffix}"[:100]
        out.append((str(path), d))
    return out


def _absolute_profile(doc: dict[str, Any], base_dir: Path) -> None:
    """Pin a relative ``cluster.profile`` to the file the study's own folder gives: the
    rendered study the workers run lives in the campaign's folder, not the study's."""
    cluster = doc.get("cluster")
    if isinstance(cluster, dict) and isinstance(cluster.get("profile"), str) \
            and cluster["profile"]:
        doc["cluster"] = {**cluster, "profile": str(
            profile_path(cluster["profile"], base_dir).resolve())}


def load_campaign(path: str | Path) -> CampaignSpec:
    """Read and validate a campaign file (and every study it lists)."""
    src = Path(path).resolve()
    data = read_yaml(path, field="CAMPAIGN")
    try:
        return _parse(data, src)
    except SpecError as err:
        raise SpecError(err.field, err.value, err.allowed, source=str(path)) from None


def _parse(data: Any, src: Path) -> CampaignSpec:
    data = check_keys("campaign", data, ("name", "storage", "site", "slurm", "studies", "env",
                                         "venv", "launcher"))
    name = check_name("name", data.get("name", src.stem))
    storage = check_keys("storage", optional_section(data, "storage"), ("url", "password_file"))
    if "url" not in storage:
        raise SpecError("storage.url", None, "required: the shared database URL")
    url = _check_url(storage["url"])
    pw_file = storage.get("password_file")
    if pw_file is not None:
        pw_file = check_text("storage.password_file", pw_file)
    site = load_site(data.get("site", "local-ci"), base_dir=src.parent)
    site.require_slurm()
    launcher = data.get("launcher", "slurm")
    if launcher not in ("slurm", "local"):
        raise SpecError("launcher", launcher, "allowed: 'slurm' (job steps) or 'local'")
    venv = check_text("venv", data["venv"]) if data.get("venv") else None
    entries = data.get("studies")
    if not isinstance(entries, list) or not entries:
        raise SpecError("studies", entries, "required: a non-empty list of studies")
    studies: list[CampaignStudy] = []
    for i, entry in enumerate(entries):
        for base_file, doc in _expand_study(i, entry, src.parent):
            doc["storage"] = {**(doc.get("storage") or {}), "url": url}
            _absolute_profile(doc, Path(base_file).parent)
            study = parse_study(doc, source=f"{src.name}: studies[{i}] ({base_file})",
                                base_dir=Path(base_file).parent)
            check_name(f"studies[{i}].name", study.name, NAME_RE)
            studies.append(CampaignStudy(spec=study, base_file=base_file, document=doc))
    names = [s.name for s in studies]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SpecError("studies", dup, "study names must be unique: set `name:` per entry")
    campaign = CampaignSpec(name=name, storage_url=url, password_file=pw_file, site=site,
                        slurm=CampaignSlurm.from_dict(data.get("slurm")),
                        studies=tuple(studies), source=src,
                        env=env_map("env", data.get("env")), venv=venv, launcher=launcher)
    if campaign.backend == "sqlite":
        warnings.warn(SQLITE_WARNING, UserWarning, stacklevel=3)
    return campaign
