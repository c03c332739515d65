"""DeepSpeed-Ulysses sequence parallelism (Jacobs et al. 2023, "DeepSpeed Ulysses: System
Optimizations for Enabling Training of Extreme Long Sequence Transformer Models",
arXiv:2309.14509): memory and time terms.

Each of ``u = ulysses`` ranks holds ``s / u`` positions of every sequence. Around the
attention core, an all-to-all turns the query, key and value shards (``N/u`` positions,
all heads) into all positions of ``heads / u`` heads, and a fourth all-to-all turns the
attention output back (section 3.1, fig. 2); the backward pass runs the four in reverse,
so a layer moves 8 all-to-alls per micro-batch (12 with full recompute). Everything else
(the GEMMs, element-wise work, activations) is the layer's on ``s / u`` positions:
compute and stored activations per rank are ``1/u`` of the full sequence's (attention
on all positions of ``heads / u`` heads is ``1/u`` too). The weights are replicated over
the ``u`` ranks, so ZeRO partitions over ``dp * u`` (:mod:`autotune.models.zero_variants`).

>>> from autotune.layout import Layout
>>> from autotune.config.model import MODEL_PRESETS
>>> lay = Layout(tp=1, pp=1, dp=1, micro_batch=2, grad_accum=1, ulysses=4)
>>> alltoall_bytes_per_layer(MODEL_PRESETS["tiny"], lay, "bf16") > 0
True
"""

from __future__ import annotations

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.layout import Layout
from autotune.models.links import link_level, link_spec
from autotune.models.network import network_link

__all__ = ["alltoall_bytes_per_layer", "ulysses_layer_time_s", "ulysses_share"]


def ulysses_share(n_bytes_or_s: float, layout: Layout) -> float:
    """A per-rank quantity of the full sequence (activation bytes, compute seconds) on one
    of the ``u`` sequence ranks: ``1/u`` of it."""
    return n_bytes_or_s / layout.ulysses


def alltoall_bytes_per_layer(model: ModelConfig, layout: Layout, dtype: str) -> float:
    """Bytes one rank sends in one layer's all-to-alls of one micro-batch: each of the
    forward's q, k, v and output tensors (``b (s/u) h`` elements per rank; k and v with the
    key/value heads' width) leaves the rank but for its own ``1/u``; the backward sends the
    same again, full recompute repeats the forward's."""
    u = layout.ulysses
    if u <= 1:
        return 0.0
    elem = 4 if dtype == "fp32" else 2
    tokens = layout.micro_batch * model.seq_len / u
    width = model.hidden * (2 + 2 * model.kv_heads / model.n_head)  # q, out + k, v
    per_pass = tokens * width * elem * (u - 1) / u
    passes = 3 if layout.recompute == "full" else 2
    return passes * per_pass


def ulysses_layer_time_s(model: ModelConfig, layout: Layout, cluster: ClusterConfig,
                         dtype: str) -> float:
    """The all-to-alls of one layer and micro-batch: their bytes at the link the ``u``
    consecutive ranks share (the network at the node's NIC share when they span nodes:
    every rank of the node sends at once), plus ``u - 1`` message latencies per
    all-to-all (pairwise exchange)."""
    u = layout.ulysses
    if u <= 1:
        return 0.0
    spec = cluster.device_spec()
    level = link_level(u, cluster, spec.devices_per_card)
    link = (network_link(cluster.devices_per_node, cluster.network()) if level == "inter_node"
            else link_spec(spec, level))
    count = 12 if layout.recompute == "full" else 8
    return (alltoall_bytes_per_layer(model, layout, dtype) / (link.gbps * 1e9)
            + count * (u - 1) * link.latency_us * 1e-6)
