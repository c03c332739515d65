"""The machine a study runs on: nodes, devices per node, device type and link overrides."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config._fields import check_float, check_int, check_keys
from autotune.errors import SpecError
from autotune.hardware import DeviceSpec, GiB, LinkSpec, get_device

if TYPE_CHECKING:
    from autotune.models.profile import LayerProfile

__all__ = ["ClusterConfig", "LinkConfig", "profile_path"]

_LEVELS = ("intra_card", "intra_node", "inter_node")


@dataclass(frozen=True)
class LinkConfig:
    """Overrides of the table's link hierarchy (``None``: use the device table's value)."""

    intra_card_gbps: float | None = None
    """Device to device on one card (tile to tile), GB/s per direction."""
    intra_node_gbps: float | None = None
    """Card to card within a node, GB/s per direction."""
    inter_node_gbps: float | None = None
    """Node to node, per device, GB/s per direction."""
    intra_card_latency_us: float | None = None
    """Device to device on one card, latency per message in microseconds."""
    intra_node_latency_us: float | None = None
    """Card to card within a node, latency per message in microseconds."""
    inter_node_latency_us: float | None = None
    """Node to node, latency per message in microseconds."""

    @classmethod
    def from_dict(cls, data: Any) -> LinkConfig:
        allowed = [f"{lvl}_{unit}" for lvl in _LEVELS for unit in ("gbps", "latency_us")]
        data = check_keys("cluster.links", data, allowed)
        values = {k: check_float(f"cluster.links.{k}", v, strict=True) for k, v in data.items()}
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
    profile: LayerProfile | None = None
    """Measured layer times (``cluster.profile``: the path of a file written by
    ``autotune profile``): the cost model uses them in place of its analytic layer time
    for the shapes they cover (:mod:`autotune.models.profile`)."""
    profile_path: Path | None = field(default=None, compare=False)
    """Where ``cluster.profile`` points, resolved (it may not exist yet: ``autotune
    profile`` writes there by default)."""

    def __post_init__(self) -> None:
        check_int("cluster.nodes", self.nodes)
        check_int("cluster.devices_per_node", self.devices_per_node)
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

    @classmethod
    def from_dict(cls, data: Any, *, base_dir: str | Path | None = None,
                  read_profile: bool = True) -> ClusterConfig:
        """Validate a ``cluster`` section. A relative ``profile`` path is tried from the
        working directory, then from ``base_dir`` (the study file's folder).
        ``read_profile=False`` resolves the path without reading the file (``autotune
        profile`` is what creates or extends it)."""
        data = dict(check_keys("cluster", data, ("nodes", "devices_per_node", "device",
                                                 "memory_gb", "peak_tflops", "links",
                                                 "profile")))
        if "profile" in data:
            data["profile_path"] = profile_path(data.pop("profile"), base_dir)
            if read_profile:
                data["profile"] = _load_profile(data["profile_path"])
        if "links" in data:
            data["links"] = LinkConfig.from_dict(data["links"])
        for key in ("memory_gb", "peak_tflops"):
            if data.get(key) is not None:
                data[key] = check_float(f"cluster.{key}", data[key], strict=True)
        if "device" in data and not isinstance(data["device"], str):
            raise SpecError("cluster.device", data["device"], "allowed: a device name string")
        return cls(**data)


def profile_path(value: Any, base_dir: str | Path | None) -> Path:
    """``cluster.profile``'s file: as given if it exists from the working directory (or is
    absolute), else beside the study file, as the replayed tables are found."""
    if not isinstance(value, str) or not value:
        raise SpecError("cluster.profile", value, "allowed: the path of a layer-profile "
                        "JSON file (written by autotune profile)")
    path = Path(value).expanduser()
    if not path.is_absolute() and not path.exists() and base_dir is not None:
        path = Path(base_dir) / path
    return path


def _load_profile(path: Path) -> LayerProfile:
    from autotune.models.profile import load_profile  # local: configs import light

    try:
        return load_profile(path)
    except SpecError as err:
        if err.field == "profile":  # the file itself: missing, unreadable
            raise SpecError("cluster.profile", err.value, err.allowed) from None
        # Something inside the file: name the file and the entry's field.
        raise SpecError("cluster.profile", str(path),
                        f"in the file, {err.field}: got {err.value!r}; {err.allowed}") from None
