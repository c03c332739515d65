"""Study files: the only place raw YAML is read.

A study file has the sections ``name``, ``model``, ``cluster``, ``training``, ``search``,
``trial``, ``storage`` and ``launcher`` (``docs/study-files.md``). :func:`load_study`
turns it into a :class:`StudySpec` of typed, validated configs, or raises
:class:`~autotune.errors.SpecError` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from autotune.config._fields import check_keys
from autotune.config.cluster import ClusterConfig
from autotune.config.launcher import LauncherConfig
from autotune.config.model import ModelConfig
from autotune.config.study import SearchConfig, StorageConfig, TrainingConfig, TrialConfig
from autotune.errors import SpecError
from autotune.models.profile import LayerProfile, load_cluster_profile
from autotune.trial import RunConfig

__all__ = ["StudySpec", "load_study", "parse_study", "STUDY_NAME_RE"]

SECTIONS = ("name", "model", "cluster", "training", "search", "trial", "storage", "launcher")
STUDY_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
"""Study names travel into directory names, job names and SQL: keep them plain."""


@dataclass(frozen=True)
class StudySpec:
    """A whole study, one validated config per concern."""

    name: str
    model: ModelConfig
    cluster: ClusterConfig
    training: TrainingConfig
    search: SearchConfig = field(default_factory=SearchConfig)
    trial: TrialConfig = field(default_factory=TrialConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    profile: LayerProfile | None = None
    """The measured layer times ``cluster.profile`` names, read and checked once at load
    (:func:`~autotune.models.profile.load_cluster_profile`); callers hand it to the cost
    model. ``None``: the study names none, or was loaded with ``read_profile=False``."""
    source: str | None = None
    """The file it was loaded from (for messages)."""

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    def run_config(self) -> RunConfig:
        """How each of the study's trainer runs goes (the ``run`` object of a trial spec)."""
        return RunConfig(warmup_steps=self.trial.warmup_steps,
                         measure_steps=self.trial.measure_steps, dtype=self.training.dtype,
                         seed=self.search.seed, device=self.trial.device,
                         collective_timeout_s=self.trial.collective_timeout_s)

    def with_storage_url(self, url: str) -> StudySpec:
        return replace(self, storage=replace(self.storage, url=url))


def parse_study(data: Any, *, default_name: str = "study", source: str | None = None,
                base_dir: str | Path | None = None, read_profile: bool = True) -> StudySpec:
    """Validate an already-parsed mapping (YAML document) into a :class:`StudySpec`.

    ``base_dir`` is the folder relative paths in it are read from (the study file's);
    ``read_profile=False`` leaves ``cluster.profile`` unread (``autotune profile`` writes
    that file, so it may not exist or fit the model yet)."""
    try:
        data = check_keys("study", data, SECTIONS)
        for required in ("model", "cluster", "training"):
            if required not in data:
                raise SpecError(required, None, "required section is missing")
        name = data.get("name", default_name)
        if not isinstance(name, str) or not STUDY_NAME_RE.match(name):
            raise SpecError("name", name, "allowed: 1-100 characters of letters, digits, "
                            "'_', '.', '-', starting with a letter or digit")
        spec = StudySpec(
            name=name,
            model=ModelConfig.from_dict(data["model"]),
            cluster=ClusterConfig.from_dict(data["cluster"], base_dir=base_dir),
            training=TrainingConfig.from_dict(data["training"]),
            search=SearchConfig.from_dict(data.get("search") or {}),
            trial=TrialConfig.from_dict(data.get("trial") or {}),
            storage=StorageConfig.from_dict(data.get("storage") or {}),
            launcher=LauncherConfig.from_dict(data.get("launcher") or {}),
            source=source,
        )
        if read_profile:
            # Read once, here: a bad file fails the load, before any database or launcher.
            spec = replace(spec, profile=load_cluster_profile(spec.cluster, spec.model,
                                                              spec.training.dtype))
        if spec.model.dropout > 0 and spec.launcher.kind != "replay":
            # Local and SLURM trials run the built-in trainer, which has no dropout: a
            # study must not tune (and predict memory for) a model it will not run.
            raise SpecError("model.dropout", spec.model.dropout,
                            "allowed: 0 with the built-in trainer (launcher.kind "
                            f"{spec.launcher.kind!r}); dropout only describes replayed runs")
        return spec
    except SpecError as err:
        raise SpecError(err.field, err.value, err.allowed, source=source) from None
    except TypeError as err:  # a dataclass got a wrong-shaped value past the checks
        raise SpecError("study", None, f"malformed ({err})", source=source) from None


def load_study(path: str | os.PathLike[str], *, read_profile: bool = True) -> StudySpec:
    """Read and validate a YAML study file (``read_profile``: see :func:`parse_study`)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise SpecError("STUDY", str(p), "no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise SpecError("STUDY", str(p), f"cannot read it ({err.__class__.__name__})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError("STUDY", str(p), f"not valid YAML{where}") from None
    if data is None:
        raise SpecError("STUDY", str(p), "the file is empty; see studies/cpu_demo.yaml")
    return parse_study(data, default_name=re.sub(r"[^A-Za-z0-9_.-]", "-", p.stem) or "study",
                       source=str(p), base_dir=p.parent, read_profile=read_profile)
