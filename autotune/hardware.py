"""The device table: every per-device figure, one :class:`DeviceSpec` entry per device.

Peaks, memory and link bandwidths (the planner, the trainer's MFU), the cost model's GEMM
efficiency, memory bandwidth and per-kernel costs (:mod:`autotune.models.cost`), and the
memory model's runtime allowance (:mod:`autotune.models.memory`): adding a device is one
entry in :data:`HARDWARE` (``docs/clusters.md``). Every number cites where it comes from;
numbers that public sources do not confirm are marked ``estimate``. A study file may
override the peak, the memory and the links (``cluster.peak_tflops``,
``cluster.memory_gb``, ``cluster.links``); see ``docs/clusters.md``.

Bandwidths are per device, per direction, in GB/s (1e9 bytes/s), the figure that an
NCCL/oneCCL ring all-reduce's bus bandwidth approaches. Between nodes the table's
``inter_node`` is a device's share of its node's NICs when all the node's devices send at
once; a :class:`NetworkSpec` (the node's NICs together, one device's reach) is what the
cross-node terms of the cost model use (``ClusterConfig.network``). A "card" is what sits in one
socket: a Max 1550 card holds two tiles, and in FLAT mode (``ZE_FLAT_DEVICE_HIERARCHY=FLAT``)
each tile is one PyTorch device.

>>> get_device("max1550-tile").devices_per_card
2
>>> peak_flops_for_device_name("NVIDIA H100 80GB HBM3", "bf16") / 1e12
989.0
>>> peak_flops_for_device_name("Intel(R) Data Center GPU Max 1550", "bf16") / 1e12
419.0
>>> get_device("cpu").peak_flops_or_fallback("bf16") / 1e12  # no datasheet peak: assumed
0.05
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

from autotune.errors import SpecError

__all__ = ["DeviceSpec", "LinkSpec", "NetworkSpec", "HARDWARE", "get_device",
           "device_spec_for_name", "peak_flops_for_device_name", "GiB", "MiB",
           "DEFAULT_RUNTIME_BYTES", "MAX_TFLOPS_PER_DEVICE"]

MiB = 1024**2
GiB = 1024**3
"""Binary byte units: the project's one definition (memory sizes, reports, records)."""

MAX_TFLOPS_PER_DEVICE = 1e5
"""Most model or hardware TFLOPS per device believed (100 PFLOPS: about 50 times the dense
bf16 peak of the fastest devices in :data:`HARDWARE`). A ``{"seconds": 1e-300}``
step of a small model divides to a finite 2e295 TFLOPS, as wrong as an infinite one."""

DEFAULT_RUNTIME_BYTES = 1536 * MiB
"""An accelerator rank's fixed runtime allowance: the CUDA/Level-Zero context (~0.5-1 GiB,
outside the caching allocator but inside the device's capacity) plus the NCCL/oneCCL
channel buffers. The default of :attr:`DeviceSpec.runtime_bytes`."""


@dataclass(frozen=True)
class LinkSpec:
    """Bandwidth and latency of one level of the link hierarchy."""

    gbps: float
    """Per-device, per-direction bandwidth in GB/s."""
    latency_us: float
    """Per-message latency in microseconds."""


@dataclass(frozen=True)
class NetworkSpec:
    """A node's attachment to the network between nodes, as the cost model's cross-node
    terms use it (:mod:`autotune.models.network`); built by
    :meth:`autotune.config.cluster.ClusterConfig.network` from the device entry, the
    node's device count and the study's ``cluster.links`` overrides.

    >>> dgx_a100 = NetworkSpec(node_gbps=8 * 25.0, device_gbps=25.0, latency_us=10.0)
    >>> dgx_a100.node_gbps / 8  # every GPU of the node sending at once: one HDR NIC each
    25.0
    """

    node_gbps: float
    """All the node's NICs together, per direction, GB/s (DGX A100: 8 x HDR200 = 200)."""
    device_gbps: float
    """The most one device can drive into the network while fewer of its node's devices
    communicate across nodes (its own NIC or its host link), GB/s per direction."""
    latency_us: float
    """Per-message latency of one network hop, microseconds."""


@dataclass(frozen=True)
class DeviceSpec:
    """One kind of device, as a PyTorch rank sees it: everything the planner, the cost and
    memory models and the trainer's MFU know about it."""

    name: str
    peak_bf16_tflops: float | None
    """Dense BF16 peak per device (``None``: unknown, e.g. a CPU)."""
    peak_fp32_tflops: float | None
    """Dense FP32 (non-tensor-core) peak per device."""
    memory_bytes: int
    """Device memory per device."""
    devices_per_card: int
    """Devices sharing one card (2 for Max 1550 tiles in FLAT mode)."""
    intra_card: LinkSpec
    """Between devices of one card (tile to tile)."""
    intra_node: LinkSpec
    """Between cards of one node (Xe Link, NVLink)."""
    inter_node: LinkSpec
    """Between nodes (Slingshot, InfiniBand), per device: the device's share of its node's
    NICs when every device of the node sends across nodes at once, i.e. the node's NIC
    bandwidth over its devices (DGX A100: 8 x 25 GB/s over 8 GPUs = 25)."""
    gemm_efficiency_max: float
    """Fraction of the dense peak a large GEMM reaches (published measurements)."""
    hbm_gbps: float
    """Device memory bandwidth a memory-bound kernel reaches, GB/s (element-wise kernels,
    the attention scores' passes, the optimizer step): the datasheet's figure times
    :data:`HBM_EFFECTIVE`, as the links carry what NCCL moves, not line rates."""
    kernel_overhead_s: float = 5e-6
    """Fixed cost per kernel: launch latency plus the eager-mode dispatch (~3-5 us on
    CUDA, NVIDIA's CUDA C++ Best Practices Guide; similar for Level Zero)."""
    host_op_s: float = 15e-6
    """Host time to dispatch one framework operator (eager PyTorch)."""
    fallback_peak_tflops: float | None = None
    """Peak to assume when the datasheet has none (CPU): see :meth:`peak_flops_or_fallback`."""
    runtime_bytes: int = DEFAULT_RUNTIME_BYTES
    """Fixed per-rank memory of the runtime (context, communication channels), charged by
    the memory model (:func:`autotune.models.memory.runtime_bytes`)."""
    nic_gbps: float | None = None
    """One device's reach into the network, GB/s per direction: what it can drive while
    fewer of its node's devices use the NICs (one NIC: NCCL binds a device to its nearest
    NIC). ``None``: ``inter_node.gbps`` (sharing less gains nothing)."""
    flash_efficiency: float | None = None
    """Fraction of the dense peak a fused (flash) attention kernel reaches on the FLOPs it
    executes, published for the kernel PyTorch's SDPA runs there; ``None``: none is
    published (the model then prices the kernel as one GEMM of the full score square)."""
    gemm_units: int | None = None
    """Compute units a GEMM's output tiles are spread over, one tile per unit per wave
    (NVIDIA: streaming multiprocessors; NVIDIA, "Matrix Multiplication Background User's
    Guide", "Wave quantization"); ``None``: not modelled (the tiling is not published)."""
    speed_sd: float = 0.0
    """Spread of the speed of devices of this kind across a cluster, an sd as a fraction of
    the median device's (:data:`GPU_SPEED_SD` for GPUs; 0: none published): a synchronous
    step waits for its slowest device (:mod:`autotune.models.stragglers`)."""
    torch_names: tuple[str, ...] = ()
    """Substrings of ``torch.<device>.get_device_name()``, most specific first."""
    source: str = ""
    """Where the figures come from."""

    def peak_tflops(self, dtype: str) -> float | None:
        """The dense peak in ``dtype``, ``None`` where it is unknown: FP16 runs on the same
        matrix engines at the BF16 rate on every device of :data:`HARDWARE` (A100: 312
        TFLOPS each, H100/H200 SXM: 989 each, NVIDIA's datasheets; Max 1550: 832 per card
        each, Intel's), so ``fp16`` takes :attr:`peak_bf16_tflops`; else FP32."""
        return self.peak_bf16_tflops if dtype in ("bf16", "fp16") else self.peak_fp32_tflops

    def peak_flops_or_fallback(self, dtype: str) -> float:
        """The dense peak FLOP/s the cost model computes with: :meth:`peak_tflops`, else
        :attr:`fallback_peak_tflops`, else 1 TFLOPS (an entry with neither)."""
        return (self.peak_tflops(dtype) or self.fallback_peak_tflops or 1.0) * 1e12


# GPUs of one SKU in one cluster differ in speed: "8% (max 22%) average performance
# variation", outliers "up to 1.5X slower than the median GPU", over more than 90% of the
# GPUs of five clusters, NVIDIA and AMD, air- and water-cooled (Sinha et al., arXiv:2208.11035v3,
# abstract; the SC22 proceedings' abstract, over four clusters, said 32%: the later figure
# is taken, with the definition of the script that plots the fifth). The authors' artifact
# defines the percent variability as the box plot's fence-to-fence range over the median,
# "(q3 + 1.5 * iqr) - (q1 - 1.5 * iqr)" / q2, i.e. 4 IQR / median
# (hal-uw/gpu_variability_sc22_artifact, plot_script/plot_aggregated.py@bc84e72). For a
# normal spread the IQR is 1.349 sd, so 8% is an sd of 8% / (4 x 1.349) = 1.48% of the
# median speed (autotune.models.stragglers: what that costs a step over N devices). The
# Max 1550 takes the same figure: none is published for it, and the paper finds the spread
# "regardless of the application, cluster, GPU vendor, and cooling method".
NORMAL_IQR = 2.0 * NormalDist().inv_cdf(0.75)
GPU_SPEED_SD = 0.08 / (4.0 * NORMAL_IQR)


# Link figures are what NCCL moves (nccl-tests' busbw), not line rates. NVLink4 (H100,
# H200): "450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get an
# effective NVLink bandwidth of 370GB/s" (NCCL's maintainer, NVIDIA/nccl-tests#212,
# 2024-05-06): 370/450 of the line rate. NVLink3 (A100) has its own figure from the same
# source: "Each NVLink has a line rate of 25GB/s (in each direction) which converts to
# ~20GB/s effective bandwidth with a 128B payload size [...] The total effective bandwidth
# should therefore be 240GB/s on A100, but some other bottlenecks on the GPUs limits it to
# ~230GB/s" (nccl-tests#149, 2023-07-05; users measure 200-233 GB/s all-reduce busbw on 8
# A100 SXM4, nccl-tests#149, #175 and #178). Before, the H100's ratio gave the A100 246.7.
# InfiniBand: "We usually consider 24GB/s is the peak performance per 200G NIC (12 GB/s
# for 100G NICs)" (the same, NVIDIA/nccl-tests#119, 2022-11-17): 24/25 of the line rate.
NVLINK_EFFECTIVE = 370.0 / 450.0
A100_NVLINK_GBPS = 230.0
IB_EFFECTIVE = 24.0 / 25.0
# HBM: a streaming kernel reads an A100 80GB SXM's memory at 1.80 of its datasheet 2.04
# TB/s, 88% by Nsight Compute too, and "the maximum memory bandwidth achieved by any kernel
# was around 90%" in an NVIDIA GTC talk (NVIDIA developer forums, "Trouble to reach peak
# bandwidth of A100", thread 339083). The memory-bound kernels of a step (LayerNorm,
# bias-dropout-add, softmax, the optimizer) run at what HBM delivers, not at its line rate:
# the same ratio for every HBM device, the only one published here (datasheet x ratio).
HBM_EFFECTIVE = 1.80 / 2.04
_NVLINK3 = LinkSpec(gbps=A100_NVLINK_GBPS, latency_us=5.0)  # A100: 12 links, 25 GB/s a way
_NVLINK4 = LinkSpec(gbps=450.0 * NVLINK_EFFECTIVE, latency_us=5.0)  # H100/H200: 450 a way
# Between nodes, per device = the node's NIC bandwidth over its devices (NetworkSpec): DGX
# A100 has 8 single-port ConnectX-6 HDR InfiniBand 200 Gb/s (25 GB/s per direction) for the
# compute fabric, one per GPU (NVIDIA DGX A100 User Guide, "Hardware Overview"); DGX H100
# and DGX H200 8 ConnectX-7 at 400 Gb/s NDR (50 GB/s), one per GPU (NVIDIA DGX H100/H200
# User Guide, "Hardware Overview"). A GPU alone reaches one NIC (nic_gbps): NCCL's topology
# search binds each GPU to its nearest NIC (NCCL docs, "Environment variables",
# NCCL_CROSS_NIC), and an A100's PCIe Gen4 x16 link (~32 GB/s raw) leaves little beyond one.
_HDR_NIC_GBPS = 25.0 * IB_EFFECTIVE                # HDR200: 25 GB/s a way, NCCL gets 24
_NDR_NIC_GBPS = 50.0 * IB_EFFECTIVE                # NDR400: 50 GB/s a way, NCCL gets 48
_IB_HDR = LinkSpec(gbps=_HDR_NIC_GBPS, latency_us=10.0)  # one HDR200 NIC per GPU (DGX A100)
_IB_NDR = LinkSpec(gbps=_NDR_NIC_GBPS, latency_us=10.0)  # one NDR400 NIC per GPU (DGX H100)
# Max 1550: tile<->tile on one card ~185 GB/s, card<->card over Xe Link 15-19 GB/s per pair
# (ALCF Aurora node performance overview, data/landscapes/README.md). Inter-node: an Aurora
# node has 8 HPE Slingshot-11 NICs of 200 Gb/s (25 GB/s per direction) for 6 cards = 12
# tiles (ALCF, "Aurora Machine Overview"): 200 GB/s per node, 200/12 = 16.7 GB/s per tile,
# 200/6 = 33.3 per card, one NIC (25 GB/s) the most one tile drives. SuperMUC-NG Phase 2
# (4 Max 1550 per node, LRZ) does not publish its NICs in the sources at hand: estimate,
# Aurora's per-tile share (8 tiles: 133 GB/s per node); a site that knows its NICs sets
# cluster.links.node_nic_gbps (docs/clusters.md).
_XE_TILE = LinkSpec(gbps=185.0, latency_us=10.0)
_XE_LINK = LinkSpec(gbps=18.0, latency_us=15.0)
_SLINGSHOT_NODE_GBPS = 8 * 25.0                     # Aurora: 8 Slingshot-11 NICs per node
_SLINGSHOT = LinkSpec(gbps=_SLINGSHOT_NODE_GBPS / 12, latency_us=20.0)  # per tile
_SLINGSHOT_NIC_GBPS = 25.0

# Large-GEMM efficiency (gemm_efficiency_max): A100 cuBLAS BF16/FP16 ~250 of 312 TFLOPS
# (NVIDIA, "A100 Tensor Core GPU architecture" whitepaper and cuBLAS benchmarks); H100 SXM
# ~700-750 of 989 (NVIDIA Hopper tuning guide, cuBLAS 12). Both below the best matmul rate
# a shape search measures (stas00/ml-engineering, compute/accelerator/README.md: MAMF A100
# SXM 271.2, H100 SXM 794.5, a burst; docs/models.md). Max 1550 tile: 207 of 419 per tile
# with the node busy (ALCF, data/landscapes/README.md). HBM (hbm_gbps): A100-40GB 1,555
# GB/s, A100-80GB 2,039, H100 3,350, H200 4,800 (NVIDIA datasheets); Max 1550 3,277 GB/s
# per card, half per tile (Intel datasheet); each times HBM_EFFECTIVE. CPU: a rank's share
# of a small host (estimate). GEMM units (gemm_units): 108 SMs on an A100, 132 on an
# H100/H200 SXM (NVIDIA A100 and H100 whitepapers); the Max 1550's oneMKL tiling is not
# published: None.
# Flash attention (flash_efficiency): FlashAttention-2 reaches 50-73% of the A100's peak in
# the forward (Dao 2023, arXiv 2307.08691, abstract and section 4.1), the low end for the
# causal, short-sequence and backward cases: 0.50; on the H100, without Hopper-specific
# instructions, up to 335 of 989 TFLOPS (same paper, section 4.1): 0.34. The Max 1550's
# kernel (DeepSpeed's op builder) has no published figure: None.
# Runtime allowance (runtime_bytes) on CPU, measured here: `python -c "import torch,
# deepspeed, torch.distributed"` peaks at ~245 MiB RSS (torch 2.13 CPU, DeepSpeed 0.19); a
# trainer rank adds the gloo process group, the DeepSpeed engine and autograd bookkeeping.
# Calibrated once against the trainer's peak RSS of a near-empty model
# (tests/models/test_memory_vs_trainer.py). Accelerators: DEFAULT_RUNTIME_BYTES.

HARDWARE: dict[str, DeviceSpec] = {
    "max1550-tile": DeviceSpec(
        name="max1550-tile", peak_bf16_tflops=419.0, peak_fp32_tflops=26.2,
        memory_bytes=64 * GiB, devices_per_card=2,
        intra_card=_XE_TILE, intra_node=_XE_LINK, inter_node=_SLINGSHOT,
        nic_gbps=_SLINGSHOT_NIC_GBPS,
        gemm_efficiency_max=0.49, hbm_gbps=1638.0 * HBM_EFFECTIVE, kernel_overhead_s=8e-6,
        torch_names=("Max 1550", "Data Center GPU Max"),
        speed_sd=GPU_SPEED_SD,
        source="Intel datasheet: 832 BF16 TFLOPS per 2-tile card at 1.6 GHz; 128 GB HBM2e",
    ),
    "max1550-card": DeviceSpec(
        name="max1550-card", peak_bf16_tflops=838.0, peak_fp32_tflops=52.4,
        memory_bytes=128 * GiB, devices_per_card=1,
        intra_card=_XE_TILE, intra_node=_XE_LINK,
        inter_node=LinkSpec(_SLINGSHOT_NODE_GBPS / 6, 20.0),  # per card: 8 NICs over 6
        gemm_efficiency_max=0.49, hbm_gbps=3277.0 * HBM_EFFECTIVE, kernel_overhead_s=8e-6,
        speed_sd=GPU_SPEED_SD,
        source="Intel datasheet (COMPOSITE mode: one device = one card)",
    ),
    "a100-40gb": DeviceSpec(
        name="a100-40gb", peak_bf16_tflops=312.0, peak_fp32_tflops=19.5,
        memory_bytes=40 * GiB, devices_per_card=1,
        intra_card=_NVLINK3, intra_node=_NVLINK3, inter_node=_IB_HDR, nic_gbps=_HDR_NIC_GBPS,
        gemm_efficiency_max=0.80, hbm_gbps=1555.0 * HBM_EFFECTIVE,
        gemm_units=108, flash_efficiency=0.50,
        torch_names=("A100-SXM4-40GB", "A100-PCIE-40GB"),
        speed_sd=GPU_SPEED_SD,
        source="NVIDIA A100 datasheet",
    ),
    "a100-80gb": DeviceSpec(
        name="a100-80gb", peak_bf16_tflops=312.0, peak_fp32_tflops=19.5,
        memory_bytes=80 * GiB, devices_per_card=1,
        intra_card=_NVLINK3, intra_node=_NVLINK3, inter_node=_IB_HDR, nic_gbps=_HDR_NIC_GBPS,
        gemm_efficiency_max=0.80, hbm_gbps=2039.0 * HBM_EFFECTIVE,
        gemm_units=108, flash_efficiency=0.50,
        torch_names=("A100",),
        speed_sd=GPU_SPEED_SD,
        source="NVIDIA A100 datasheet",
    ),
    "h100": DeviceSpec(
        name="h100", peak_bf16_tflops=989.0, peak_fp32_tflops=67.0,
        memory_bytes=80 * GiB, devices_per_card=1,
        intra_card=_NVLINK4, intra_node=_NVLINK4, inter_node=_IB_NDR, nic_gbps=_NDR_NIC_GBPS,
        gemm_efficiency_max=0.72, hbm_gbps=3350.0 * HBM_EFFECTIVE,
        gemm_units=132, flash_efficiency=0.34,
        torch_names=("H100",),
        speed_sd=GPU_SPEED_SD,
        source="NVIDIA H100 SXM datasheet (dense, without sparsity)",
    ),
    "h200": DeviceSpec(
        name="h200", peak_bf16_tflops=989.0, peak_fp32_tflops=67.0,
        memory_bytes=141 * 10**9, devices_per_card=1,
        intra_card=_NVLINK4, intra_node=_NVLINK4, inter_node=_IB_NDR, nic_gbps=_NDR_NIC_GBPS,
        gemm_efficiency_max=0.72, hbm_gbps=4800.0 * HBM_EFFECTIVE,
        gemm_units=132, flash_efficiency=0.34,
        torch_names=("H200",),
        speed_sd=GPU_SPEED_SD,
        source="NVIDIA H200 SXM datasheet (dense, without sparsity)",
    ),
    "cpu": DeviceSpec(
        name="cpu", peak_bf16_tflops=None, peak_fp32_tflops=None,
        memory_bytes=8 * GiB, devices_per_card=1,
        intra_card=LinkSpec(5.0, 50.0), intra_node=LinkSpec(5.0, 50.0),
        inter_node=LinkSpec(1.0, 100.0),
        gemm_efficiency_max=0.5, hbm_gbps=10.0, kernel_overhead_s=20e-6,
        fallback_peak_tflops=0.05, runtime_bytes=420 * MiB,
        source="estimate: gloo over loopback; a rank's memory share of a small host",
    ),
}


def get_device(name: str, field: str = "cluster.device") -> DeviceSpec:
    """The table entry for ``name``; the error names ``field`` (where the name was read)
    and lists the known names."""
    try:
        return HARDWARE[name]
    except (KeyError, TypeError):  # TypeError: a YAML list or mapping is unhashable
        raise SpecError(field, name,
                        f"allowed: one of {', '.join(sorted(HARDWARE))}") from None


def device_spec_for_name(device_name: str) -> DeviceSpec | None:
    """The table entry of a device name as PyTorch reports it, or ``None`` if unknown.

    Entries are tried most specific first (``A100-SXM4-40GB`` before ``A100``), as
    nanochat's ``get_peak_flops`` does. A Max 1550 device is taken as one tile (FLAT mode).
    """
    candidates = [(pat, spec) for spec in HARDWARE.values() for pat in spec.torch_names]
    candidates.sort(key=lambda item: len(item[0]), reverse=True)
    for pattern, spec in candidates:
        if pattern.lower() in device_name.lower():
            return spec
    return None


def peak_flops_for_device_name(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s for a device name as PyTorch reports it, or ``None`` if unknown
    (:func:`device_spec_for_name`)."""
    spec = device_spec_for_name(device_name)
    peak = spec.peak_tflops(dtype) if spec else None
    return None if peak is None else peak * 1e12
