"""Measured layer times: what the analytic layer model cannot know about a device.

The cost model (:mod:`autotune.models.cost`) composes one transformer layer's time into a
step: pipeline bubble, point-to-point sends, data-parallel reduction, optimizer. Its layer
time is analytic (GEMM efficiency, memory-bound passes, TP all-reduces, host dispatch),
and on a real stack some layer shapes run 20-25% off it: kernel selection per GEMM shape,
how well the host's dispatch hides behind the device. vTrain (Bang et al., MICRO 2024)
closes that gap by profiling the layer's operators on the target GPU and simulating the
rest. A :class:`LayerProfile` is that idea at layer granularity: the measured time of one
layer for one micro-batch (forward, backward and recompute, with its TP all-reduces and
exposed host time), keyed by everything that shapes it (:class:`LayerShape`). Where a
layout's shape is in the profile the cost model uses the measured time; elsewhere the
analytic one.

Where the numbers come from (:mod:`autotune.models.profile_fit`): steps measured at two or more
layer counts with everything else equal. In 1F1B with ``m`` micro-batches over ``p``
stages the critical path holds ``(m + p - 1) * ceil(L / p)`` layer-micro-batch slots
(Narayanan et al. 2021, section 2.2.1), so the slope of step time over that count is the
layer time, and embeddings, logits, optimizer and per-step overheads fall into the
intercept. ``autotune profile`` measures such pairs with the trainer on ``tp`` devices;
``--from-landscape`` reads them from a published table.

``autotune profile`` also measures each shape's peak memory at both layer counts: the
slope is one layer's bytes, its model states plus the activations it stores for one
micro-batch (:class:`LayerMemory`; the fit is :func:`autotune.models.profile_fit.
fit_layer_profile`'s, the split into states and activations the memory model's,
:func:`autotune.models.memory.measured_layer_activation`).

A profile is a tagged JSON file (``"kind": "autotune-layer-profile"``), written atomically.
Version 2 adds the optional ``memory`` of an entry; a version-1 file (times only) still
reads, without memory. A study names one in ``cluster.profile``;
:func:`load_cluster_profile` reads it once, when the study is loaded, and its callers hand
it to the cost model (``estimate_step(..., profile=...)``) and the memory model
(``estimate_memory(..., profile=...)``, through the study's
:class:`~autotune.feasibility.MemoryBudget`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.config._fields import check_choice, check_float, check_int, check_keys
from autotune.config.cluster import ClusterConfig
from autotune.config.model import ATTENTION_KINDS, MLP_KINDS, ModelConfig
from autotune.errors import SpecError, short_repr
from autotune.hardware import HARDWARE, MAX_TFLOPS_PER_DEVICE
from autotune.layout import RECOMPUTE_CHOICES, Layout, Recompute
from autotune.models.flops import layer_forward_flops
from autotune.util.atomic import write_json_atomic

__all__ = ["LayerShape", "LayerMemory", "ProfileEntry", "LayerProfile", "PROFILE_KIND",
           "PROFILE_VERSION", "PEAK_KINDS", "load_profile", "load_cluster_profile"]

PROFILE_KIND = "autotune-layer-profile"
DTYPES = ("fp32", "bf16", "fp16")
TP_LINKS = ("none", "intra_card", "intra_node", "inter_node")
"""The links of :func:`autotune.models.links.link_level`."""
PROFILE_VERSION = 2
"""Version 2: entries may carry ``memory``. Version 1 files (no memory) are still read."""
READABLE_VERSIONS = (1, 2)
MAX_LAYER_TIME_S = 86400.0
"""Most seconds one layer and micro-batch is believed to take (``1e308`` made steps inf)."""
PEAK_KINDS = ("allocated", "rss")
"""What a measured peak is: the caching allocator's peak allocated bytes (GPU/XPU) or the
process's peak resident set (CPU; :func:`trainer.distributed.peak_memory`)."""


@dataclass(frozen=True, order=True)
class LayerShape:
    """Everything that sets one layer's time for one micro-batch on one TP rank."""

    device: str
    """Device-table name (:mod:`autotune.hardware`)."""
    dtype: str
    hidden: int
    n_head: int
    kv_heads: int
    ffn: int
    seq_len: int
    mlp: str
    attention: str
    dropout: float
    tp: int
    tp_link: str
    """Link the TP group crosses (:func:`autotune.models.links.link_level`): a shape
    measured inside a node says nothing about TP over the network."""
    micro_batch: int
    recompute: Recompute
    sequence_parallel: bool = False
    """Measured with sequence parallelism (files written before it existed: false)."""

    def __post_init__(self) -> None:
        # Profiles come from files: a mistyped field must be an error, not a shape that
        # silently never matches (the cost model would quietly ignore it).
        for name in ("hidden", "n_head", "kv_heads", "ffn", "seq_len", "tp", "micro_batch"):
            check_int(name, getattr(self, name))
        check_choice("device", self.device, tuple(sorted(HARDWARE)))
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("mlp", self.mlp, MLP_KINDS)
        check_choice("attention", self.attention, ATTENTION_KINDS)
        check_choice("tp_link", self.tp_link, TP_LINKS)
        check_choice("recompute", self.recompute, RECOMPUTE_CHOICES)
        check_float("dropout", self.dropout, maximum=1.0)
        if not isinstance(self.sequence_parallel, bool):
            raise SpecError("sequence_parallel", self.sequence_parallel, "allowed: true or false")

    @classmethod
    def of(cls, model: ModelConfig, layout: Layout, *, device: str, dtype: str,
           tp_link: str) -> LayerShape:
        return cls(device=device, dtype=dtype, hidden=model.hidden, n_head=model.n_head,
                   kv_heads=model.kv_heads, ffn=model.ffn, seq_len=model.seq_len,
                   mlp=model.mlp, attention=model.attention, dropout=model.dropout,
                   tp=layout.tp, tp_link=tp_link, micro_batch=layout.micro_batch,
                   recompute=layout.recompute, sequence_parallel=layout.sequence_parallel)

    def label(self) -> str:
        return (f"{self.device} {self.dtype} h{self.hidden} a{self.n_head} s{self.seq_len} "
                f"tp{self.tp}({self.tp_link}) mb{self.micro_batch} {self.recompute}"
                + (" sp" if self.sequence_parallel else ""))


@dataclass(frozen=True)
class LayerMemory:
    """One layer's measured bytes: the slope of the peak over the layer count.

    ``layer_bytes`` is what one more layer adds to a ``pp = dp = 1``, ZeRO-0 step's peak:
    its model states (weights, gradients, Adam states) and the activations it stores for
    one micro-batch, as the device measured them (``peak``). Which part is which is the
    memory model's to say (:func:`autotune.models.memory.measured_layer_activation`): the
    file holds the measurement, not an attribution that would go stale with the model.
    """

    layer_bytes: float
    """Bytes per layer (model states + stored activations of one micro-batch)."""
    stderr_bytes: float | None = None
    """Standard error of ``layer_bytes`` (``None`` when only one series measured it)."""
    peak: str = "allocated"
    """What was measured: ``"allocated"`` (the allocator's peak, GPU/XPU) or ``"rss"``
    (peak resident set, CPU): see :data:`PEAK_KINDS`."""

    def __post_init__(self) -> None:
        b = self.layer_bytes
        if isinstance(b, bool) or not (isinstance(b, (int, float)) and b > 0
                                       and math.isfinite(b)):
            raise SpecError("layer_bytes", b, "allowed: a positive number of bytes")
        if self.stderr_bytes is not None:
            check_float("stderr_bytes", self.stderr_bytes)
        check_choice("peak", self.peak, PEAK_KINDS)

    def to_dict(self) -> dict[str, Any]:
        return {"layer_bytes": self.layer_bytes, "stderr_bytes": self.stderr_bytes,
                "peak": self.peak}

    @classmethod
    def from_dict(cls, data: Any) -> LayerMemory:
        item = check_keys("memory", data, ("layer_bytes", "stderr_bytes", "peak"))
        if "layer_bytes" not in item:
            raise SpecError("memory.layer_bytes", None, "required key is missing")
        try:
            return cls(item["layer_bytes"], item.get("stderr_bytes"),
                       item.get("peak", "allocated"))
        except SpecError as err:
            raise SpecError(f"memory.{err.field}", err.value, err.allowed) from None


@dataclass(frozen=True)
class ProfileEntry:
    """One measured layer time (and, from ``autotune profile``, the layer's bytes)."""

    shape: LayerShape
    layer_time_s: float
    """Seconds per layer and micro-batch: forward, backward, recompute, TP all-reduces and
    the host time the device did not hide."""
    n_fits: int = 1
    """Independent slopes the median was taken over."""
    spread: float = 0.0
    """(max - min) / median of those slopes: how well they agreed."""
    stderr_s: float | None = None
    """Standard error of ``layer_time_s`` from the spread of the timed steps behind it
    (``None`` when the source gave single numbers, e.g. a published table)."""
    memory: LayerMemory | None = None
    """The layer's measured bytes (``None``: not measured, e.g. a version-1 file or a
    published table)."""

    @property
    def noisy(self) -> bool:
        """The error bar is over a tenth of the value: more measured steps would help."""
        return self.stderr_s is not None and self.stderr_s > 0.1 * self.layer_time_s

    def __post_init__(self) -> None:
        t = self.layer_time_s
        if isinstance(t, bool) or not (isinstance(t, (int, float)) and 0 < t
                                       <= MAX_LAYER_TIME_S):
            raise SpecError("layer_time_s", self.layer_time_s,
                            f"allowed: a positive number of seconds, at most "
                            f"{MAX_LAYER_TIME_S:g} ({self.shape.label()})")


@dataclass(frozen=True)
class LayerProfile:
    """Measured layer times by shape; an immutable lookup table."""

    entries: tuple[ProfileEntry, ...] = ()
    source: str = ""
    """Where the measurements came from (a study, a landscape file)."""
    path: str = field(default="", compare=False)
    """The file it was read from, if any."""
    _index: dict[LayerShape, ProfileEntry] = field(default_factory=dict, init=False,
                                                   repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        index = {e.shape: e for e in self.entries}
        if len(index) != len(self.entries):
            raise SpecError("entries", len(self.entries), "allowed: one entry per layer shape")
        object.__setattr__(self, "_index", index)

    @property
    def label(self) -> str:
        """How to name it to a user: its file, else its source."""
        return self.path or self.source or "layer profile"

    def __len__(self) -> int:
        return len(self.entries)

    def entry(self, shape: LayerShape) -> ProfileEntry | None:
        """The measurement of ``shape``, or ``None`` if it was not measured."""
        return self._index.get(shape)

    def layer_time_s(self, shape: LayerShape) -> float | None:
        """The measured time of ``shape``, or ``None`` if it was not measured."""
        entry = self._index.get(shape)
        return entry.layer_time_s if entry is not None else None

    def layer_memory(self, model: ModelConfig, layout: Layout, *, device: str,
                     dtype: str) -> LayerMemory | None:
        """The measured bytes of ``model``'s layer in ``layout``'s shape on ``device``, or
        ``None``. The TP link is not part of the match: the tensors a layer holds do not
        depend on the link its all-reduces cross (of several links, the first entry in
        the profile's order answers)."""
        probe = LayerShape.of(model, layout, device=device, dtype=dtype, tp_link="none")
        for e in self.entries:
            if e.memory is not None and replace(e.shape, tp_link="none") == probe:
                return e.memory
        return None

    def layer_entries(self, model: ModelConfig, *, device: str, dtype: str
                      ) -> list[ProfileEntry]:
        """The entries for this model's layer on this device and dtype (any layout)."""
        probe = LayerShape.of(model, Layout(1, 1, 1, 1, 1), device=device, dtype=dtype,
                              tp_link="none")
        return [e for e in self.entries if _same_layer(e.shape, probe)]

    def covers(self, model: ModelConfig, *, device: str, dtype: str) -> bool:
        """Whether any entry is for this model's layer on this device and dtype."""
        return bool(self.layer_entries(model, device=device, dtype=dtype))

    def merged(self, other: LayerProfile) -> LayerProfile:
        """This profile with ``other``'s entries added; ``other`` wins on a shared shape."""
        index = {**self._index, **other._index}
        parts = [p for s in (self.source, other.source) for p in s.split("; ") if p]
        return LayerProfile(tuple(index[k] for k in sorted(index)),
                            source="; ".join(dict.fromkeys(parts)))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": PROFILE_KIND, "version": PROFILE_VERSION, "source": self.source,
                "entries": [{**asdict(e.shape), "layer_time_s": e.layer_time_s,
                             "n_fits": e.n_fits, "spread": e.spread, "stderr_s": e.stderr_s,
                             **({"memory": e.memory.to_dict()} if e.memory else {})}
                            for e in self.entries]}

    def save(self, path: str | os.PathLike[str]) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "profile") -> LayerProfile:
        if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
            raise SpecError("kind", data.get("kind") if isinstance(data, dict) else data,
                            f"allowed: {PROFILE_KIND!r} (a file written by autotune profile)",
                            source=source)
        version = data.get("version")
        if isinstance(version, bool) or version not in READABLE_VERSIONS:
            raise SpecError("version", version,
                            f"allowed: {' or '.join(map(str, READABLE_VERSIONS))}",
                            source=source)
        raw = data.get("entries")
        if not isinstance(raw, list):
            raise SpecError("entries", raw, "allowed: a list of entries", source=source)
        names = [f for f in LayerShape.__dataclass_fields__]
        # Version 1 knew no memory: a "memory" key there is as unknown as a typo.
        keys = [*names, "layer_time_s", "n_fits", "spread", "stderr_s",
                *(["memory"] if version >= 2 else [])]
        entries = []
        for i, item in enumerate(raw):
            where = f"entries[{i}]"
            try:
                item = check_keys(where, item, keys)
                missing = [n for n in (*names, "layer_time_s")
                           if n not in item and n not in _OPTIONAL_FIELDS]
                if missing:
                    raise SpecError(f"{where}.{missing[0]}", None, "required key is missing")
                shape = LayerShape(**{n: item[n] for n in names if n in item})
                se = item.get("stderr_s")
                if se is not None:
                    se = check_float("stderr_s", se)
                raw_memory = item.get("memory")
                memory = LayerMemory.from_dict(raw_memory) if raw_memory is not None else None
                entries.append(ProfileEntry(shape, item["layer_time_s"],
                                            check_int("n_fits", item.get("n_fits", 1)),
                                            check_float("spread", item.get("spread", 0.0)),
                                            stderr_s=se, memory=memory))
            except SpecError as err:
                field_ = err.field if err.field.startswith(where) else f"{where}.{err.field}"
                raise SpecError(field_, err.value, err.allowed, source=source) from None
            except (TypeError, ValueError) as err:
                raise SpecError(where, item, f"malformed ({err})", source=source) from None
        try:
            return cls(tuple(entries), source=str(data.get("source", "")))
        except SpecError as err:  # two entries for one shape
            raise SpecError(err.field, err.value, err.allowed, source=source) from None


_LAYOUT_FIELDS = ("tp", "tp_link", "micro_batch", "recompute", "sequence_parallel")
"""The fields of a :class:`LayerShape` that the layout sets; the others are the layer's."""


_OPTIONAL_FIELDS = ("sequence_parallel",)
"""Shape fields a file may leave out (added after version 2; their default holds)."""


def _same_layer(a: LayerShape, b: LayerShape) -> bool:
    """Same model layer on the same device and dtype (any tp, micro-batch, recompute)."""
    return all(getattr(a, f) == getattr(b, f) for f in LayerShape.__dataclass_fields__
               if f not in _LAYOUT_FIELDS)


def load_profile(path: str | os.PathLike[str]) -> LayerProfile:
    """Read a profile file; a missing or malformed file raises :class:`SpecError`."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise SpecError("profile", str(p), "no such file (write one with autotune profile)"
                        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError("profile", str(p), f"cannot read it ({err.__class__.__name__})"
                        ) from None
    except json.JSONDecodeError as err:
        raise SpecError("profile", str(p), f"not valid JSON ({err.msg}, line {err.lineno})"
                        ) from None
    return replace(LayerProfile.from_dict(data, source=str(p)), path=str(p))


def load_cluster_profile(cluster: ClusterConfig, model: ModelConfig,
                         dtype: str) -> LayerProfile | None:
    """The profile ``cluster.profile`` names (``None`` if it names none), read and checked
    against the study's layer. Every error is a :class:`SpecError` of ``cluster.profile``:
    the file missing or unreadable, an entry malformed (the message names the file and
    the entry's field), or no entry for ``model``'s layer on this device in ``dtype`` (a
    profile of another model would silently do nothing)."""
    path = cluster.profile_path
    if path is None:
        return None
    try:
        profile = load_profile(path)
    except SpecError as err:
        if err.field == "profile":  # the file itself: missing, unreadable
            raise SpecError("cluster.profile", err.value, err.allowed) from None
        # Something inside the file: name the file and the entry's field.
        raise SpecError("cluster.profile", str(path),
                        f"in the file, {err.field}: got {short_repr(err.value)}; "
                        f"{err.allowed}") from None
    entries = profile.layer_entries(model, device=cluster.device, dtype=dtype)
    for e in entries:  # faster than results and table rows may be: the plan would rank by it
        tflops = 3.0 * layer_forward_flops(model, e.shape.micro_batch) / e.shape.tp \
            / e.layer_time_s / 1e12
        if tflops > MAX_TFLOPS_PER_DEVICE:
            raise SpecError("cluster.profile", profile.label,
                            f"in the file, layer_time_s: got {e.layer_time_s:g} "
                            f"({e.shape.label()}); gives {tflops:.3g} model TFLOPS per "
                            f"device; allowed: a time that gives at most "
                            f"{MAX_TFLOPS_PER_DEVICE:g}")
    if not entries:
        raise SpecError("cluster.profile", profile.label,
                        f"allowed: a profile with entries for this model's layer "
                        f"(hidden {model.hidden}, {model.n_head} heads, "
                        f"sequence {model.seq_len}) on {cluster.device} in "
                        f"{dtype}; this one has {len(profile)} entries "
                        "for other layers (autotune profile STUDY measures them)")
    return profile

