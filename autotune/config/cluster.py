"""The machine a study runs on: nodes, devices per node, device type and link overrides.

It also names the machine's layer profile (``cluster.profile``), by its path only: reading
the file is the models layer's job (``load_cluster_profile`` in ``models/profile.py``, called
by the study loader), so that the config layer never imports the models layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.config._fields import check_float, check_int, check_keys, check_text
from autotune.errors import SpecError
from autotune.hardware import DeviceSpec, GiB, LinkSpec, NetworkSpec, get_device

__all__ = ["ClusterConfig", "LinkConfig", "profile_path"]

_LEVELS = ("intra_card", "intra_node", "inter_node")
MAX_NODES = 100_000
"""Most nodes of one trial (the largest machines have ~10,000; the bound keeps the
planner's enumeration and arithmetic small)."""
MAX_DEVICES_PER_NODE = 1_024
"""Most devices per node (8-12 on today's nodes)."""
MAX_MEMORY_GB = 1e6
"""Largest ``memory_gb`` override (GiB per device; today's devices have 16-192)."""
MAX_PEAK_TFLOPS = 1e6
"""Largest ``peak_tflops`` override (today's devices have at most a few thousand)."""
MAX_LINK_GBPS = 1e6
MAX_LINK_LATENCY_US = 1e6


@dataclass(frozen=True)
class LinkConfig:
    """Overrides of the table's link hierarchy (``None``: use the device table's value)."""

    intra_card_gbps: float | None = None
    """Device to device on one card (tile to tile), GB/s per direction."""
    intra_node_gbps: float | None = None
    """Card to card within a node, GB/s per direction."""
    inter_node_gbps: float | None = None
    """Node to node, per device, GB/s per direction: a device's share of its node's NICs
    when all the node's devices send across nodes at once (node NIC bandwidth / devices
    per node). Without ``node_nic_gbps``, the node's NICs are this times
    ``devices_per_node``."""
    intra_card_latency_us: float | None = None
    """Device to device on one card, latency per message in microseconds."""
    intra_node_latency_us: float | None = None
    """Card to card within a node, latency per message in microseconds."""
    inter_node_latency_us: float | None = None
    """Node to node, latency per message in microseconds."""
    node_nic_gbps: float | None = None
    """All NICs of one node together, GB/s per direction (DGX A100: 8 x 25 = 200). Shared by
    the node's devices that cross the network at the same time (docs/models.md, "Across
    nodes"). Default: ``inter_node_gbps`` times ``devices_per_node``."""
    nic_gbps: float | None = None
    """The most one device can drive into the network while fewer of its node's devices
    use it (one NIC's bandwidth), GB/s per direction. Default: the device table's
    ``nic_gbps``; never below the per-device share."""

    @classmethod
    def from_dict(cls, data: Any) -> LinkConfig:
        allowed = [f"{lvl}_{unit}" for lvl in _LEVELS for unit in ("gbps", "latency_us")]
        allowed += ["node_nic_gbps", "nic_gbps"]
        data = check_keys("cluster.links", data, allowed)
        values = {k: check_float(f"cluster.links.{k}", v, strict=True,
                                 maximum=MAX_LINK_GBPS if k.endswith("gbps")
                                 else MAX_LINK_LATENCY_US)
                  for k, v in data.items()}
        return cls(**values)


@dataclass(frozen=True)
class ClusterConfig:
    """Where the trials run."""

    nodes: int = 1
    """Nodes available to one trial (the study's world size is ``nodes * devices_per_node``)."""
    devices_per_node: int = 1
    """PyTorch devices per node (8 on SuperMUC-NG Phase 2 in FLAT mode, 12 on Aurora)."""
    device: str = "cpu"
    """A name from :data:`autotune.hardware.HARDWARE`."""
    memory_gb: float | None = None
    """Override of the device memory (GiB)."""
    peak_tflops: float | None = None
    """Override of the dense peak per device (TFLOPS, in the study's dtype)."""
    links: LinkConfig = field(default_factory=LinkConfig)
    """Overrides of the link table."""
    profile_path: Path | None = None
    """``cluster.profile``, resolved: the layer-profile file written by ``autotune
    profile`` (it may not exist yet: ``autotune profile`` writes there by default). Its
    measured layer times replace the cost model's analytic ones for the shapes they cover;
    the study loader reads it (``StudySpec.profile``)."""

    def __post_init__(self) -> None:
        check_int("cluster.nodes", self.nodes, maximum=MAX_NODES)
        check_int("cluster.devices_per_node", self.devices_per_node,
                  maximum=MAX_DEVICES_PER_NODE)
        spec = get_device(self.device)
        if self.devices_per_node % spec.devices_per_card and self.devices_per_node > 1:
            raise SpecError("cluster.devices_per_node", self.devices_per_node,
                            f"allowed: a multiple of {spec.devices_per_card} "
                            f"({self.device} has {spec.devices_per_card} devices per card)")

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    def device_spec(self) -> DeviceSpec:
        """The table entry with this cluster's overrides applied."""
        spec = get_device(self.device)
        changes: dict[str, Any] = {}
        if self.memory_gb is not None:
            changes["memory_bytes"] = int(self.memory_gb * GiB)
        if self.peak_tflops is not None:
            changes["peak_bf16_tflops"] = self.peak_tflops
            changes["peak_fp32_tflops"] = self.peak_tflops
        for level in _LEVELS:
            base: LinkSpec = getattr(spec, level)
            gbps = getattr(self.links, f"{level}_gbps")
            lat = getattr(self.links, f"{level}_latency_us")
            if gbps is not None or lat is not None:
                changes[level] = LinkSpec(gbps if gbps is not None else base.gbps,
                                          lat if lat is not None else base.latency_us)
        return replace(spec, **changes) if changes else spec

    def network(self) -> NetworkSpec:
        """The node's NICs as the cost model's cross-node terms see them: ``links.node_nic_gbps``
        (else the per-device ``inter_node`` share times ``devices_per_node``), one device's
        reach ``links.nic_gbps`` (else the table's ``nic_gbps``; at least the per-device
        share, at most the node's), the ``inter_node`` latency.

        >>> net = ClusterConfig(nodes=8, devices_per_node=8, device="a100-80gb").network()
        >>> net.node_gbps, net.device_gbps  # 8 HDR200 NICs, 24 of 25 GB/s each as NCCL moves it
        (192.0, 24.0)
        """
        spec = self.device_spec()
        share = spec.inter_node.gbps
        node = (self.links.node_nic_gbps if self.links.node_nic_gbps is not None
                else share * self.devices_per_node)
        reach = (self.links.nic_gbps if self.links.nic_gbps is not None
                 else max(spec.nic_gbps or share, share))
        return NetworkSpec(node_gbps=node, device_gbps=min(reach, node),
                           latency_us=spec.inter_node.latency_us)

    @classmethod
    def from_dict(cls, data: Any, *, base_dir: str | Path | None = None) -> ClusterConfig:
        """Validate a ``cluster`` section. A relative ``profile`` path is tried from the
        working directory, then from ``base_dir`` (the study file's folder); the file is
        not read here."""
        data = dict(check_keys("cluster", data, ("nodes", "devices_per_node", "device",
                                                 "memory_gb", "peak_tflops", "links",
                                                 "profile")))
        if "profile" in data:
            data["profile_path"] = profile_path(data.pop("profile"), base_dir)
        if "links" in data:
            data["links"] = LinkConfig.from_dict(data["links"])
        for key, top in (("memory_gb", MAX_MEMORY_GB), ("peak_tflops", MAX_PEAK_TFLOPS)):
            if data.get(key) is not None:
                data[key] = check_float(f"cluster.{key}", data[key], strict=True, maximum=top)
        if "device" in data and not isinstance(data["device"], str):
            raise SpecError("cluster.device", data["device"], "allowed: a device name string")
        return cls(**data)


def profile_path(value: Any, base_dir: str | Path | None) -> Path:
    """``cluster.profile``'s file: as given if it exists from the working directory (or is
    absolute), else beside the study file, as the replayed tables are found."""
    if not isinstance(value, str) or not value:
        raise SpecError("cluster.profile", value, "allowed: the path of a layer-profile "
                        "JSON file (written by autotune profile)")
    path = Path(check_text("cluster.profile", value)).expanduser()
    try:
        if not path.is_absolute() and not path.exists() and base_dir is not None:
            path = Path(base_dir) / path
    except (OSError, ValueError):  # a name the file system refuses (too long, say)
        raise SpecError("cluster.profile", value, "allowed: the path of a layer-profile "
                        "JSON file (written by autotune profile)") from None
    return path

