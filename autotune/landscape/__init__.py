"""Measured landscapes: published throughput of real layouts, loaded as typed groups.

A *landscape group* is a set of measured layouts of one model on one device count at one
global batch, so that every layout does the same work per step and the fastest one is the
best. The search benchmark replays a group as if each row were a trial
(:mod:`autotune.launchers.replay`); the cost-model benchmark ranks a group's layouts.

Two file formats are read (``data/landscapes/README.md``, which also gives the sources and
licences of the two published tables shipped there: :func:`shipped_landscape`):

* **vTrain** (Bang et al., MICRO 2024; ``ground_truth_single.csv``): columns ``# GPUs,
  global batch, micro batch, hidden size, attention heads, # layers, sequence length,
  tensor parallelism, data parallelism, pipeline parallelism, iteration time (ms)``; extra
  columns (a leading ``Parameters (billion)``) are ignored. The file lacks the vocabulary
  (GPT-2's, padded: :data:`DEFAULT_VTRAIN_VOCAB`), the device (default ``a100-80gb``: every
  row ran, so the larger A100 never makes a memory model refuse a measured layout) and
  the node size (default 8: one DGX A100). The runs were fp16 (vTrain's profiler builds
  its model under ``torch.set_default_dtype(torch.float16)``, ``create_model`` in
  ``src/predictor.py``, VIA-Research/vTrain@f8dda847): ``dtype="fp16"``, the BF16 peak
  and fp16's optimizer in the memory model; activation recomputation was on (Megatron's
  default then), so ``recompute="full"``; ZeRO was off (``zero_stage=0``); attention was
  Megatron's fused softmax over a materialised score matrix, before FlashAttention reached
  Megatron (``attention="explicit"``), with Megatron's default dropout of 0.1 (``dropout=0.1``).
  Throughput is model FLOPs over time:
  ``model_flops_per_step(model, global_batch) / (iteration_s * world) / 1e12``
  (:func:`autotune.models.flops.tflops_per_device`).
* **Aurora** (``aurora_pvc_70b.csv``, argonne-lcf/Megatron-DeepSpeed notes): one row per
  run with the model, the layout, ``status`` (``ok``/``oom``) and Megatron-DeepSpeed's
  logged per-tile TFLOPS. Those count the recompute forward pass (hardware FLOPs), so
  they are converted to model TFLOPS with the ratio of :func:`model_flops_per_step` to
  :func:`hardware_flops_per_step`. Attention is flash (``attention="flash"``:
  Megatron-DeepSpeed on Aurora runs a fused SDPA kernel). Device ``max1550-tile``; devices per node
  ``devices / nodes`` (12). OOM rows are kept (``status="oom"``, no throughput). Rows are
  grouped also by the ``table`` column, because the tables were measured with different
  software (PyTorch 2.5 vs 2.8, a second operator's stack): one layout gave 10.3 and
  54.7 TFLOPS per tile across them, so mixing tables would compare software, not layouts.
  Its ``zero_variant`` column (``mics``, ``hpz12``) is the layout's ZeRO-3 variant
  (:mod:`autotune.landscape.zero`: a bare ``mics`` shards over the devices of a node).
  The vocabulary is Llama 2's 32,000 tokens (:data:`DEFAULT_AURORA_VOCAB`).

Within a group, rows with the same layout are merged: the mean of the ``ok`` rows' values
(an ``oom`` row of a layout that also ran ``ok`` is dropped: it ran), else the first row.

>>> import io
>>> text = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,"
...         "sequence length,tensor parallelism,data parallelism,pipeline parallelism,"
...         "iteration time (ms)\\n"
...         "2,8,1,1024,16,24,1024,1,2,1,500\\n2,8,2,1024,16,24,1024,2,1,1,400\\n")
>>> [group] = load_landscape(io.StringIO(text))
>>> group.name, group.cluster.world_size, len(group.measurements)
('vtrain-2gpu-h1024-a16-l24-s1024-gb8', 2, 2)
>>> group.best().layout.key()
'tp2-pp1-dp1-mb2-ga4-z0-full'
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import IO, Any

from autotune.config._fields import check_choice
from autotune.config.cluster import ClusterConfig
from autotune.config.model import ATTENTION_KINDS, ModelConfig
from autotune.errors import SpecError
from autotune.landscape.rows import Row, check_columns, read_text
from autotune.landscape.zero import ZERO_VARIANT_FORM, zero_variant_of
from autotune.layout import Layout
from autotune.models.flops import (
    hardware_flops_per_step,
    model_flops_per_step,
    tflops_per_device,
)
from autotune.models.stacks import EITHER, REPLAY_STACK

__all__ = ["Measurement", "LandscapeGroup", "load_landscape", "merge_duplicates", "VTRAIN_COLUMNS",
           "AURORA_COLUMNS", "DEFAULT_VTRAIN_HARDWARE", "DEFAULT_AURORA_HARDWARE",
           "DEFAULT_VTRAIN_VOCAB", "DEFAULT_AURORA_VOCAB",
           "LANDSCAPES_DIR", "SHIPPED_LANDSCAPES", "shipped_landscape", "table_stack",
           "find_table", "FORMAT_STACKS"]

VTRAIN_COLUMNS: tuple[str, ...] = (
    "# GPUs", "global batch", "micro batch", "hidden size", "attention heads", "# layers",
    "sequence length", "tensor parallelism", "data parallelism", "pipeline parallelism",
    "iteration time (ms)",
)
AURORA_COLUMNS: tuple[str, ...] = (
    "model", "n_layer", "hidden", "ffn_hidden", "heads", "kv_heads", "seq_len", "nodes",
    "devices", "pp", "dp", "tp", "micro_batch", "grad_accum", "global_batch", "zero_stage",
    "activation_checkpointing", "status", "tflops_per_device", "samples_per_s", "table",
)
DEFAULT_VTRAIN_HARDWARE = "a100-80gb"
DEFAULT_AURORA_HARDWARE = "max1550-tile"
DEFAULT_VTRAIN_DEVICES_PER_NODE = 8
DEFAULT_VTRAIN_VOCAB = 51200
"""GPT-2's 50,257 tokens (vTrain's ``vTrainConfig`` default, ``src/config.py``,
VIA-Research/vTrain@f8dda847) as Megatron pads them at tp 8 (to a multiple of 128 x tp;
50,304 at tp 1): one vocabulary for every layout of a group, the largest padding."""
DEFAULT_AURORA_VOCAB = 32000
"""ALCF's Megatron-DeepSpeed runs tokenize with ``Llama2Tokenizer`` unless told otherwise
(``ALCF/helpers.sh``, ``setup``: ``tok="${TOKENIZER_TYPE:-Llama2Tokenizer}"``;
argonne-lcf/Megatron-DeepSpeed@16e5551d4984bd69f2bfd7c166973de09b9fd3a0), whose
vocabulary is 32,000 tokens, a multiple of Megatron's padding (128 x tp for tp <= 2). The
table's own ``params_b`` confirms it: 68.98 billion is Llama-2-70B's count, with 32,000
tokens in an untied embedding and output layer (the same script's ``llama_flags``), and
51,200 would make it 69.29 (``tests/test_landscape.py``)."""

LANDSCAPES_DIR = Path(__file__).resolve().parents[2] / "data" / "landscapes"
"""The checkout's ``data/landscapes/``: the published tables the docs, tests and benchmarks
use. Read relative to the checkout (like ``studies/``), not installed as package data."""
SHIPPED_LANDSCAPES: tuple[str, ...] = ("vtrain_a100_single_node.csv", "aurora_pvc_70b.csv")
"""The tables in :data:`LANDSCAPES_DIR`, in the order the benchmarks read them by default."""


def shipped_landscape(name: str) -> Path:
    """The path of a shipped table (a name of :data:`SHIPPED_LANDSCAPES`).

    >>> shipped_landscape("aurora_pvc_70b.csv").name
    'aurora_pvc_70b.csv'
    """
    if name not in SHIPPED_LANDSCAPES:
        raise SpecError("landscape", name,
                        f"allowed: one of {', '.join(SHIPPED_LANDSCAPES)} (data/landscapes/)")
    path = LANDSCAPES_DIR / name
    if not path.is_file():
        raise SpecError("landscape", name, "not found in the checkout's data/landscapes/ "
                        "(an installed package ships no tables: run from a clone)")
    return path


@dataclass(frozen=True)
class Measurement:
    """One measured layout: ``status`` is ``ok`` (with throughput) or ``oom``/``error``."""

    layout: Layout
    status: str
    model_tflops_per_device: float | None
    """Model (not hardware) TFLOPS per device; ``None`` unless ``status == "ok"``."""
    iteration_time_s: float | None
    """Seconds per optimizer step, when the source gives (or implies) it."""


@dataclass(frozen=True)
class LandscapeGroup:
    """Measured layouts of one model, device count and global batch (same work per step)."""

    name: str
    model: ModelConfig
    cluster: ClusterConfig
    global_batch: int
    dtype: str
    measurements: tuple[Measurement, ...]
    stack: str = REPLAY_STACK
    """The training stack that measured it (``training.stack``'s values,
    :mod:`autotune.models.stacks`): ``deepspeed-fused-adam`` for the Aurora format (its rows
    give DeepSpeed's ZeRO stage), ``megatron-deepspeed-either`` for vTrain's, which does
    not say whether Megatron-DeepSpeed ran under DeepSpeed's engine (:func:`table_stack`)."""

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    def ok(self) -> tuple[Measurement, ...]:
        """The measurements that ran, with a throughput."""
        return tuple(m for m in self.measurements
                     if m.status == "ok" and m.model_tflops_per_device is not None)

    def best(self) -> Measurement:
        """The fastest measured layout (highest model TFLOPS per device)."""
        ok = self.ok()
        if not ok:
            raise SpecError(f"landscape group {self.name}", len(self.measurements),
                            "has no 'ok' measurement, so no best layout")
        return max(ok, key=lambda m: m.model_tflops_per_device or 0.0)

    def layouts(self) -> tuple[Layout, ...]:
        """Every measured layout (ok or not), in file order."""
        return tuple(m.layout for m in self.measurements)

    def lookup(self, layout: Layout) -> Measurement | None:
        """The measurement of ``layout``, ``None`` when the group has none."""
        for m in self.measurements:
            if m.layout == layout:
                return m
        return None


# ----------------------------------------------------------------------------- reading


def load_landscape(
    path: str | os.PathLike[str] | IO[str],
    *,
    hardware: str | None = None,
    devices_per_node: int | None = None,
    vocab_size: int | None = None,
    attention: str | None = None,
    field: str = "--landscape",
) -> list[LandscapeGroup]:
    """Read a vTrain-format or Aurora-format CSV into landscape groups (file order).

    ``hardware`` and ``devices_per_node`` apply where the file lacks them (the vTrain
    format lacks both; the Aurora format has its node size); ``hardware`` also overrides
    the Aurora default. ``vocab_size`` and ``attention`` (``"flash"`` or ``"explicit"``)
    apply to both formats (neither file has a column for them); by default each format's
    runs' own: :data:`DEFAULT_VTRAIN_VOCAB` and explicit attention for vTrain,
    :data:`DEFAULT_AURORA_VOCAB` and flash attention for Aurora. ``field``: the option the
    file was named by, for the error of a file that cannot be read as text.
    """
    if attention is not None:
        check_choice("attention", attention, ATTENTION_KINDS)
    source, text = read_text(path, field)
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise SpecError("landscape", source, "the file is empty") from None
    rows = [(i, row) for i, row in enumerate(reader, start=2) if any(c.strip() for c in row)]
    kind = _format_of(header)
    if kind == "vtrain":
        return _load_vtrain(header, rows, source, hardware=hardware or DEFAULT_VTRAIN_HARDWARE,
                            devices_per_node=devices_per_node or DEFAULT_VTRAIN_DEVICES_PER_NODE,
                            vocab_size=vocab_size or DEFAULT_VTRAIN_VOCAB,
                            attention=attention or "explicit")
    if kind == "aurora":
        return _load_aurora(header, rows, source, hardware=hardware or DEFAULT_AURORA_HARDWARE,
                            vocab_size=vocab_size or DEFAULT_AURORA_VOCAB,
                            attention=attention or "flash")
    raise SpecError("landscape header", ",".join(header),
                    "unknown format; expected the vTrain columns (" + ", ".join(VTRAIN_COLUMNS)
                    + ") or the Aurora columns (" + ", ".join(AURORA_COLUMNS) + ")",
                    source=source)


def _load_vtrain(header: list[str], rows: list[tuple[int, list[str]]], source: str, *,
                 hardware: str, devices_per_node: int, vocab_size: int,
                 attention: str) -> list[LandscapeGroup]:
    check_columns(header, VTRAIN_COLUMNS, source)
    groups: dict[tuple, dict[str, Any]] = {}
    for line, cells in rows:
        row = Row(header, line, cells, source)
        gpus, gb = row.integer("# GPUs"), row.integer("global batch")
        h, a, nl, s = (row.integer(c) for c in ("hidden size", "attention heads", "# layers",
                                            "sequence length"))
        tp, dp, pp, mb = (row.integer(c) for c in ("tensor parallelism", "data parallelism",
                                               "pipeline parallelism", "micro batch"))
        iter_s = row.number("iteration time (ms)") / 1e3  # type: ignore[operator]
        if tp * pp * dp != gpus:
            raise row._err("# GPUs", f"expected tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp}")
        if gb % (dp * mb):
            raise row._err("global batch", f"expected a multiple of data parallelism x "
                                           f"micro batch = {dp * mb}")
        key = (gpus, gb, h, a, nl, s)
        if key not in groups:
            model = row.build("model", ModelConfig, n_layer=nl, hidden=h, n_head=a, seq_len=s,
                              vocab_size=vocab_size, attention=attention, dropout=0.1,
                              name=f"gpt-h{h}-l{nl}")
            dpn = min(devices_per_node, gpus)
            if gpus % dpn:
                raise row._err("# GPUs", f"expected a multiple of devices_per_node={dpn}")
            cluster = row.build("cluster", ClusterConfig, nodes=gpus // dpn,
                                devices_per_node=dpn, device=hardware)
            groups[key] = {"name": f"vtrain-{gpus}gpu-h{h}-a{a}-l{nl}-s{s}-gb{gb}",
                           "model": model, "cluster": cluster, "global_batch": gb, "rows": []}
        g = groups[key]
        layout = row.build("layout", Layout, tp=tp, pp=pp, dp=dp, micro_batch=mb,
                           grad_accum=gb // (dp * mb), zero_stage=0, recompute="full")
        tflops = row.throughput("iteration time (ms)", tflops_per_device(
            model_flops_per_step(g["model"], gb), iter_s, gpus))
        g["rows"].append(Measurement(layout, "ok", tflops, iter_s))
    return [_finish(g, "fp16", FORMAT_STACKS["vtrain"]) for g in groups.values()]


def _load_aurora(header: list[str], rows: list[tuple[int, list[str]]], source: str, *,
                 hardware: str, vocab_size: int, attention: str) -> list[LandscapeGroup]:
    check_columns(header, AURORA_COLUMNS, source)
    groups: dict[tuple, dict[str, Any]] = {}
    for line, cells in rows:
        row = Row(header, line, cells, source)
        name, table = row.text("model"), row.text("table")
        nodes, devices = row.integer("nodes"), row.integer("devices")
        gb = row.integer("global_batch")
        if devices % nodes:
            raise row._err("devices", f"expected a multiple of nodes={nodes}")
        tp, pp, dp, mb, ga = (row.integer(c) for c in ("tp", "pp", "dp", "micro_batch",
                                                   "grad_accum"))
        if tp * pp * dp != devices:
            raise row._err("devices", f"expected tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp}")
        if dp * mb * ga != gb:
            raise row._err("global_batch", f"expected dp*micro_batch*grad_accum = "
                                            f"{dp * mb * ga}")
        recompute = row.flag("activation_checkpointing")
        status = row.text("status")
        if status not in ("ok", "oom", "error"):
            raise row._err("status", "allowed: 'ok', 'oom' or 'error'")
        key = (name, devices, gb, table)
        if key not in groups:
            model = row.build("model", ModelConfig, n_layer=row.integer("n_layer"),
                              hidden=row.integer("hidden"), n_head=row.integer("heads"),
                              seq_len=row.integer("seq_len"), vocab_size=vocab_size,
                              ffn_hidden=row.integer("ffn_hidden"),
                              n_kv_head=row.integer("kv_heads"),
                              # AuroraGPT is Llama-style: gated SwiGLU MLP (3 matrices).
                              mlp="swiglu", attention=attention, name=name)
            cluster = row.build("cluster", ClusterConfig, nodes=nodes,
                                devices_per_node=devices // nodes, device=hardware)
            groups[key] = {"name": f"{name}-{devices}dev-gb{gb}-{table}", "model": model,
                           "cluster": cluster, "global_batch": gb, "rows": []}
        g = groups[key]
        try:
            variant, shard = zero_variant_of(row.values.get("zero_variant", ""), devices // nodes,
                                             dp)
        except ValueError:
            raise row._err("zero_variant", ZERO_VARIANT_FORM) from None
        layout = row.build("layout", Layout, tp=tp, pp=pp, dp=dp, micro_batch=mb,
                           grad_accum=ga, zero_stage=row.integer("zero_stage", minimum=0),
                           recompute="full" if recompute else "none",
                           zero_variant=variant, zero_shard=shard)
        tflops = iter_s = None
        if status == "ok":
            hw = row.number("tflops_per_device")
            ratio = (model_flops_per_step(g["model"], gb)
                     / hardware_flops_per_step(g["model"], gb, recompute=recompute))
            tflops = row.throughput("tflops_per_device", hw * ratio)  # type: ignore[operator]
            sps = row.number("samples_per_s", optional=True)
            iter_s = gb / sps if sps else None
        g["rows"].append(Measurement(layout, status, tflops, iter_s))
    return [_finish(g, "bf16", FORMAT_STACKS["aurora"]) for g in groups.values()]


def _finish(g: dict[str, Any], dtype: str, stack: str) -> LandscapeGroup:
    return LandscapeGroup(name=g["name"], model=g["model"], cluster=g["cluster"],
                          global_batch=g["global_batch"], dtype=dtype,
                          measurements=merge_duplicates(g["rows"]), stack=stack)


FORMAT_STACKS: dict[str, str] = {"vtrain": EITHER, "aurora": REPLAY_STACK}
"""The stack that measured each format's tables (:attr:`LandscapeGroup.stack`)."""


def _format_of(header: list[str]) -> str | None:
    """``"vtrain"``, ``"aurora"`` or ``None``: which format a header is, by a column only
    that format has."""
    if "iteration time (ms)" in header:
        return "vtrain"
    return "aurora" if "tflops_per_device" in header else None


def find_table(path: str | os.PathLike[str], base_dir: str | os.PathLike[str] | None) -> Path:
    """Where a table named in a study file is: ``path`` from the working directory, or,
    relative and not found there, from ``base_dir`` (the study file's folder)."""
    found = Path(path).expanduser()
    if not found.is_absolute() and not found.exists() and base_dir is not None:
        found = Path(base_dir) / found
    return found


def table_stack(path: str | os.PathLike[str], base_dir: str | os.PathLike[str] | None = None
                ) -> str | None:
    """The stack that measured the table at ``path`` (found by :func:`find_table`), read
    from its header alone; ``None`` where the file cannot be read or has neither format's
    header (loading it then says why)."""
    try:
        with open(find_table(path, base_dir), newline="", encoding="utf-8-sig") as f:
            header = [h.strip() for h in next(csv.reader(f), [])]
    except (OSError, UnicodeDecodeError):
        return None
    kind = _format_of(header)
    return FORMAT_STACKS[kind] if kind is not None else None


def merge_duplicates(rows: list[Measurement]) -> tuple[Measurement, ...]:
    """Merge rows of one layout: the mean of its ``ok`` rows, else its first row."""
    by_layout: dict[Layout, list[Measurement]] = {}
    for m in rows:
        by_layout.setdefault(m.layout, []).append(m)
    out = []
    for layout, ms in by_layout.items():
        ok = [m for m in ms if m.status == "ok" and m.model_tflops_per_device is not None]
        if len(ms) == 1 or not ok:
            out.append(ms[0])
            continue
        times = [m.iteration_time_s for m in ok if m.iteration_time_s is not None]
        out.append(Measurement(layout, "ok", fmean(m.model_tflops_per_device or 0.0 for m in ok),
                               fmean(times) if times else None))
    return tuple(out)
