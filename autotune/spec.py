"""Study files: the only place raw YAML is read.

A study file has the sections ``name``, ``model``, ``cluster``, ``training``, ``search``,
``trial``, ``storage``, ``launcher`` and ``workload`` (``docs/guide.md``, section 1;
``docs/own-command.md`` for ``workload``). :func:`load_study`
turns it into a :class:`StudySpec` of typed, validated configs, or raises
:class:`~autotune.errors.SpecError` naming the field, the value and what is allowed.

Study files come from users, so reading one is bounded: :func:`read_yaml`
(also used for campaign and site files) refuses a file over :data:`MAX_FILE_BYTES` and
parses with :class:`StudyLoader`, which refuses duplicate keys, nesting deeper than
:data:`MAX_DEPTH`, a list or mapping of more than :data:`MAX_ITEMS` entries, more than
:data:`MAX_NODES` values in all (an alias counts as every value it repeats: no
"billion laughs"), numbers longer than :data:`MAX_NUMBER_CHARS` characters and the YAML 1.1
numbers that YAML 1.2 reads otherwise or not at all (``1:0``, ``0x10``, ``010``). Aliases
are allowed (``yaml.safe_dump`` writes them for shared objects) but cannot expand a file.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from autotune.config._fields import check_keys, optional_section
from autotune.config.cluster import ClusterConfig
from autotune.config.launcher import LauncherConfig
from autotune.config.model import ModelConfig
from autotune.config.run_defaults import step_cap
from autotune.config.sqlite_file import next_to
from autotune.config.study import (
    SearchConfig,
    StorageConfig,
    TrainingConfig,
    TrialConfig,
    check_fp16_replay,
)
from autotune.config.workload import WorkloadConfig
from autotune.errors import SpecError
from autotune.landscape import table_stack
from autotune.models.profile import LayerProfile, load_cluster_profile
from autotune.models.stacks import known_grad_accum_dtype, resolve_stack
from autotune.planning.space import check_space_size
from autotune.trial import RunConfig

__all__ = ["StudySpec", "load_study", "parse_study", "read_yaml", "StudyLoader",
           "STUDY_NAME_RE", "MAX_FILE_BYTES", "MAX_DEPTH", "MAX_ITEMS", "MAX_NODES",
           "MAX_NUMBER_CHARS"]

SECTIONS = ("name", "model", "cluster", "training", "search", "trial", "storage", "launcher",
            "workload")
STUDY_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
"""Study names travel into directory names, job names and SQL: keep them plain (matched
whole: ``match`` with ``$`` would accept a trailing newline)."""

MAX_FILE_BYTES = 1 << 20
"""Largest study, campaign or site file read (1 MiB; the shipped ones are 0.5-2 KiB)."""
MAX_DEPTH = 32
"""Most lists and mappings nested in one another (a study file nests 3 deep)."""
MAX_ITEMS = 1_000
"""Most entries of one list or mapping (a search axis lists a few values)."""
MAX_NODES = 10_000
"""Most values (scalars, lists, mappings) in one file, an alias counting as all the values
it repeats (the shipped files have 30-100)."""
MAX_NUMBER_CHARS = 100
"""Longest integer or float literal (Python's ``int()`` refuses 4,300 digits and a
sexagesimal literal costs quadratic time; every bound of a field is far below 10**100)."""
_MERGE_TAG = "tag:yaml.org,2002:merge"
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)"
                           r"(?:[eE][-+]?[0-9]+)?"
                           r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")
"""The numbers YAML 1.1 and 1.2 read alike. PyYAML is YAML 1.1: ``global_batch: 1:0`` is
sexagesimal 60, ``0x10`` 16, ``010`` 8 and ``1_000`` 1000; those are refused,
by their key path, rather than read as a number nobody wrote."""


class _LimitError(yaml.YAMLError):
    """A document over one of the loader's limits; ``path`` is where (``search.tp[3]``)."""

    def __init__(self, problem: str, allowed: str, mark: Any, path: str) -> None:
        super().__init__(problem)
        self.problem, self.allowed, self.mark, self.path = problem, allowed, mark, path


class StudyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with the limits of this module, checked while composing, so a
    hostile document is refused after at most :data:`MAX_NODES` values, never expanded
    or recursed into (PyYAML composes recursively and would hit a ``RecursionError``)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._at: list[str] = []  # path elements of the collections being composed
        self._nodes = 0
        self._sized: dict[int, tuple[int, int]] = {}  # id(node): (values, nesting height)

    def _path(self) -> str:
        path = "".join(p if p.startswith("[") or i == 0 else "." + p
                       for i, p in enumerate(self._at)) or "the top level"
        return path if len(path) <= 120 else path[:120] + "..."

    def _refuse(self, problem: str, allowed: str, mark: Any) -> _LimitError:
        return _LimitError(problem, allowed, mark, self._path())

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > MAX_NODES:
            raise self._refuse(f"more than {MAX_NODES} values", f"at most {MAX_NODES} values,"
                               " an alias counting as every value it repeats", mark)

    def _too_deep(self, mark: Any, how: str = "") -> _LimitError:
        return self._refuse(f"lists and mappings nested deeper than {MAX_DEPTH} levels{how}",
                            f"at most {MAX_DEPTH} levels", mark)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()
            node = self.anchors.get(event.anchor)
            if node is None:
                raise yaml.composer.ComposerError(None, None, f"found undefined alias "
                                                  f"{event.anchor[:40]!r}", event.start_mark)
            if id(node) not in self._sized:  # still being composed: it contains itself
                raise self._refuse(f"alias *{event.anchor[:40]} inside its own anchor",
                                   "aliases of values complete before them (no recursive "
                                   "structures)", event.start_mark)
            values, height = self._sized[id(node)]
            self._count(values, event.start_mark)
            if len(self._at) + height > MAX_DEPTH:
                raise self._too_deep(event.start_mark, f" (through alias *{event.anchor[:40]})")
            return node
        return super().compose_node(parent, index)

    def compose_scalar_node(self, anchor: Any) -> Any:
        self._count(1, self.peek_event().start_mark)
        node = super().compose_scalar_node(anchor)
        if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
            raise self._refuse(f"a number of {len(node.value)} characters",
                               f"at most {MAX_NUMBER_CHARS} characters (no field takes a "
                               "larger number)", node.start_mark)
        if node.tag in _NUMBER_TAGS and node.style is None \
                and not _PLAIN_NUMBER.fullmatch(node.value):
            raise self._refuse(
                f"{node.value[:40]!r}, a YAML 1.1 number (read as "
                f"{str(self.construct_object(node))[:40]}: sexagesimal, hex, octal, binary "
                "or with '_')", "a decimal number (write it out, or quote it for text)",
                node.start_mark)
        self._sized[id(node)] = (1, 0)
        return node

    def _collection(self, anchor: Any, node_class: Any, end_event: Any) -> Any:
        start = self.get_event()
        if len(self._at) >= MAX_DEPTH:
            raise self._too_deep(start.start_mark)
        before = self._nodes
        self._count(1, start.start_mark)
        tag = start.tag
        if tag is None or tag == "!":
            tag = self.resolve(node_class, None, start.implicit)
        node = node_class(tag, [], start.start_mark, None, flow_style=start.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
        seen: dict[Any, int] = {}
        while not self.check_event(end_event):
            if len(node.value) >= MAX_ITEMS:
                raise self._refuse(f"a list or mapping of more than {MAX_ITEMS} entries",
                                   f"at most {MAX_ITEMS} entries", self.peek_event().start_mark)
            if node_class is yaml.SequenceNode:
                index = len(node.value)
                self._at.append(f"[{index}]")
                node.value.append(self.compose_node(node, index))
            else:
                self._at.append("?")  # a key may be a collection too: it nests as deep
                key = self.compose_node(node, None)
                self._at[-1] = self._key_text(key)
                self._check_unique(key, seen)
                node.value.append((key, self.compose_node(node, key)))
            self._at.pop()
        node.end_mark = self.get_event().end_mark
        children = [n for item in node.value
                    for n in (item if isinstance(item, tuple) else (item,))]
        height = 1 + max((self._sized[id(c)][1] for c in children), default=0)
        self._sized[id(node)] = (self._nodes - before, height)
        return node

    def compose_sequence_node(self, anchor: Any) -> Any:
        return self._collection(anchor, yaml.SequenceNode, yaml.SequenceEndEvent)

    def compose_mapping_node(self, anchor: Any) -> Any:
        return self._collection(anchor, yaml.MappingNode, yaml.MappingEndEvent)

    @staticmethod
    def _key_text(key: Any) -> str:
        if isinstance(key, yaml.ScalarNode):
            return key.value if len(key.value) <= 40 else key.value[:40] + "..."
        return "?"

    def _check_unique(self, key: Any, seen: dict[Any, int]) -> None:
        """Keys that load equal (``1`` and ``0x1`` too) are one key twice: YAML would keep
        the last silently. ``<<`` (merge) keys are not keys of the mapping."""
        if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE_TAG:
            return
        value = self.construct_object(key)
        try:
            if value in seen:
                raise self._refuse(f"a duplicate key (the first is at line {seen[value] + 1})",
                                   "each key once (YAML would keep the last one silently)",
                                   key.start_mark)
            seen[value] = key.start_mark.line
        except TypeError:  # unhashable: the constructor refuses it with its own message
            return


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
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    """The training program of the trials: the built-in trainer or the user's own."""
    profile: LayerProfile | None = None
    """The measured layer times ``cluster.profile`` names, read and checked once at load
    (:func:`~autotune.models.profile.load_cluster_profile`); callers hand it to the cost
    model. ``None``: the study names none, or was loaded with ``read_profile=False``."""
    source: str | None = None
    """The file it was loaded from (for messages)."""

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    def run_config(self, best_model_tflops_per_device: float | None = None) -> RunConfig:
        """How each of the study's trainer runs goes (the ``run`` object of a trial spec);
        ``best_model_tflops_per_device``: the study's best so far (the early stop's bar)."""
        trial = self.trial
        return RunConfig(warmup_steps=trial.warmup_steps,
                         measure_steps=trial.measure_steps, dtype=self.training.dtype,
                         seed=self.search.seed, device=trial.device,
                         collective_timeout_s=trial.collective_timeout_s,
                         measure_precision=trial.measure_precision,
                         max_measure_steps=step_cap(trial.measure_steps,
                                                    trial.measure_precision,
                                                    trial.max_measure_steps)
                         if trial.measure_precision is not None else None,
                         early_stop_tolerance=trial.early_stop_tolerance,
                         best_model_tflops_per_device=best_model_tflops_per_device
                         if trial.early_stop_tolerance is not None else None)

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
        if not isinstance(name, str) or not STUDY_NAME_RE.fullmatch(name):
            raise SpecError("name", name, "allowed: 1-100 characters of letters, digits, "
                            "'_', '.', '-', starting with a letter or digit")
        spec = StudySpec(
            name=name,
            model=ModelConfig.from_dict(data["model"]),
            cluster=ClusterConfig.from_dict(data["cluster"], base_dir=base_dir),
            training=TrainingConfig.from_dict(data["training"]),
            search=SearchConfig.from_dict(optional_section(data, "search")),
            trial=TrialConfig.from_dict(optional_section(data, "trial")),
            storage=_storage(optional_section(data, "storage"), base_dir),
            launcher=LauncherConfig.from_dict(optional_section(data, "launcher")),
            workload=WorkloadConfig.from_dict(optional_section(data, "workload")),
            source=source,
        )
        check_megatron_flags(spec.workload, spec.model)
        check_fp16_replay(spec.training.dtype, spec.launcher.kind)
        # training.stack: auto is the workload's, or a replayed table's (the memory model
        # never sees "auto"); DeepSpeed's recipe, where autotune writes its config.
        replay = spec.launcher.kind == "replay"
        spec = replace(spec, training=replace(spec.training, stack=resolve_stack(
            spec.training.stack, spec.workload.kind, replay=replay,
            table_stack=table_stack(spec.launcher.replay.landscape, base_dir)
            if spec.launcher.replay is not None else None),
            grad_accum_dtype=known_grad_accum_dtype(spec.workload.kind, spec.training.dtype,
                                                    spec.workload.ds_config, replay=replay)))
        if read_profile:
            # Read once, here: a bad file fails the load, before any database or launcher.
            spec = replace(spec, profile=load_cluster_profile(spec.cluster, spec.model,
                                                              spec.training.dtype))
        # Refused here, before any command works with the study: a space too large to plan.
        check_space_size(spec.search, spec.world_size, spec.training.global_batch)
        return spec
    except SpecError as err:
        raise SpecError(err.field, err.value, err.allowed, source=source) from None
    except TypeError as err:  # a dataclass got a wrong-shaped value past the checks
        raise SpecError("study", None, f"malformed ({str(err)[:200]})", source=source) from None


def read_yaml(path: str | os.PathLike[str], *, field: str = "STUDY") -> Any:
    """The document of the YAML file ``path``, read within this module's limits; a
    :class:`SpecError` on ``field`` (the file) or on the key path that broke a limit."""
    p = Path(path)
    try:
        if not stat.S_ISREG(p.stat().st_mode):
            # Opening a FIFO blocks until a writer comes (for ever); a device or
            # a directory is no study file either.
            raise SpecError(field, str(p), "not a regular file (a FIFO, device or "
                            "directory); allowed: a YAML file")
        with p.open("rb") as f:  # read one byte more than allowed: the size is not trusted
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(field, str(p), "no such file") from None
    except OSError as err:
        raise SpecError(field, str(p), f"cannot read it ({err.__class__.__name__}: "
                        f"{err.strerror})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(field, str(p), f"more than {MAX_FILE_BYTES} bytes; allowed: at most "
                        f"{MAX_FILE_BYTES} bytes (1 MiB; a study file is a few KiB)")
    try:
        # Decoded here: PyYAML's reader re-slices a bytes buffer per chunk (quadratic).
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise SpecError(field, str(p), f"not UTF-8 text (byte {err.start})") from None
    try:
        return yaml.load(text, Loader=StudyLoader)
    except _LimitError as err:
        where = f" at line {err.mark.line + 1}, column {err.mark.column + 1}" if err.mark else ""
        raise SpecError(field, str(p), f"{err.problem}{where} (in {err.path}); allowed: "
                        f"{err.allowed}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(field, str(p), f"not valid YAML{where}") from None


def load_study(path: str | os.PathLike[str], *, read_profile: bool = True) -> StudySpec:
    """Read and validate a YAML study file (``read_profile``: see :func:`parse_study`)."""
    p = Path(path)
    data = read_yaml(p)
    if data is None:
        raise SpecError("STUDY", str(p), "the file is empty; see studies/cpu_demo.yaml")
    return parse_study(data, default_name=re.sub(r"[^A-Za-z0-9_.-]", "-", p.stem) or "study",
                       source=str(p), base_dir=p.parent, read_profile=read_profile)

def _storage(data: Any, base_dir: str | Path | None) -> StorageConfig:
    """The storage section; a relative SQLite file lies next to the study file."""
    storage = StorageConfig.from_dict(data)
    if base_dir is None:
        return storage
    return replace(storage, url=next_to(storage.url, base_dir))


def check_megatron_flags(workload: WorkloadConfig, model: ModelConfig) -> None:
    """A ``megatron-deepspeed`` workload's ``args`` give no flag autotune owns, and their
    model flags agree with the study's ``model`` (the score is computed from it). Checked
    here, by the loader, and not in ``config/``: the flags are the workload's
    (:mod:`autotune.workloads.megatron`), and config imports nothing above it."""
    if workload.kind != "megatron-deepspeed":
        return
    from autotune.workloads.megatron import conflicting_flag, model_mismatch

    args = workload.args
    clash = conflicting_flag(args)
    if clash is not None:
        index, flag, owned = clash
        if owned == "--bf16":  # the precision: a flag only at bf16, none at fp32
            raise SpecError(f"workload.args[{index}]", args[index],
                            f"{flag} conflicts with training.dtype: autotune gives the "
                            "trials their precision (--bf16 with training.dtype bf16, "
                            "no precision flag with fp32); set training.dtype instead")
        raise SpecError(f"workload.args[{index}]", args[index],
                        f"{flag} conflicts with {owned}, which autotune sets for every "
                        "trial (from the layout, training.dtype or the trial settings); "
                        "remove it")
    mismatch = model_mismatch(args, model)
    if mismatch is not None:
        index, given, study = mismatch
        raise SpecError(f"workload.args[{index}]", given,
                        f"disagrees with the study's {study}: the score's FLOPs are the "
                        "study model's; make them equal (or leave the flag out: autotune "
                        "adds it)")
