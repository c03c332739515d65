"""The groups of a landscape file, one summary each: what ``autotune landscapes FILE``
prints, so that a user replaying a table can see which group a study file must match
(``launcher.replay``: model, world size and global batch, or ``group: INDEX``) without
reading the CSV. A study that matches no group is told the closest; this lists them all.

>>> import io
>>> text = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,"
...         "sequence length,tensor parallelism,data parallelism,pipeline parallelism,"
...         "iteration time (ms)\\n"
...         "2,8,1,1024,16,24,1024,1,2,1,500\\n2,8,2,1024,16,24,1024,2,1,1,400\\n")
>>> from autotune.landscape import load_landscape
>>> [row] = group_summaries(load_landscape(io.StringIO(text)))
>>> row["index"], row["devices"], row["global_batch"], row["ok"], row["best_layout"]
(0, 2, 8, 2, 'tp2-pp1-dp1-mb2-ga4-z0-full')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.landscape import LandscapeGroup

__all__ = ["SUMMARY_COLUMNS", "group_summaries"]

SUMMARY_COLUMNS: tuple[str, ...] = (
    "index", "name", "device", "devices", "devices_per_node", "global_batch", "n_layer",
    "hidden", "n_head", "seq_len", "vocab_size", "dtype", "attention", "stack", "rows", "ok",
    "oom", "best_layout", "best_model_tflops_per_device")
"""The keys of one group's summary, in order: what ``autotune landscapes --format json``
prints (its table shows the ones that tell groups apart)."""


def group_summaries(groups: Sequence[LandscapeGroup]) -> list[dict[str, Any]]:
    """One summary per group, in file order: its index (``launcher.replay.group``), the
    model, cluster and batch a study must have to match it, how many rows ran or ran out of
    memory, and its fastest measured layout (``None`` where no row ran)."""
    out: list[dict[str, Any]] = []
    for index, g in enumerate(groups):
        ok = g.ok()
        best = g.best() if ok else None
        out.append({
            "index": index, "name": g.name, "device": g.cluster.device,
            "devices": g.world_size, "devices_per_node": g.cluster.devices_per_node,
            "global_batch": g.global_batch, "n_layer": g.model.n_layer,
            "hidden": g.model.hidden, "n_head": g.model.n_head, "seq_len": g.model.seq_len,
            "vocab_size": g.model.vocab_size, "dtype": g.dtype,
            "attention": g.model.attention, "stack": g.stack,
            "rows": len(g.measurements), "ok": len(ok),
            "oom": sum(m.status == "oom" for m in g.measurements),
            "best_layout": best.layout.key() if best else None,
            "best_model_tflops_per_device": (round(best.model_tflops_per_device, 3)
                                             if best and best.model_tflops_per_device
                                             else None),
        })
    return out
