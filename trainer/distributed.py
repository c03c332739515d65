"""Launcher environment, device and backend choice: the only device-specific module.

Everything that differs between CPU/gloo, CUDA/nccl and XPU/xccl lives here, so that the
model, the engine and the measurement code never test a device type themselves.

Launchers, read in this order (the first one whose variables are present wins):

* ``torchrun``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``.
* ``srun`` (one task per device): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``;
  the rendezvous host is the first node of ``SLURM_NODELIST`` (``node[01-03,07]`` is
  expanded by :func:`autotune.util.hostlist.parse_hostlist`, without calling ``scontrol``);
  ``MASTER_PORT`` from the environment or
  :data:`DEFAULT_MASTER_PORT`.
* ``mpiexec`` with PMI/PALS (Aurora-like): ``PMI_RANK``, ``PMI_SIZE``,
  ``PALS_LOCAL_RANKID`` or ``PMI_LOCAL_RANK``; ``MASTER_ADDR`` must be exported by the job
  script (PALS does not publish a head node).
* none: a single process, rank 0 of 1 on localhost (``python -m trainer`` directly).

>>> env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
...        "SLURM_NODELIST": "gpu[07-09]"}
>>> le = launch_env_from(env)
>>> (le.launcher, le.rank, le.world_size, le.local_rank, le.master_addr, le.master_port)
('slurm', 5, 8, 1, 'gpu07', 29500)
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import resource
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.util.hostlist import parse_hostlist

__all__ = ["LaunchEnv", "DeviceInfo", "launch_env_from", "pick_device", "accelerator_kind",
           "prepare_environment", "init_process_group", "release_memory", "set_group_timeout",
           "synchronize", "reset_peak_memory", "peak_memory", "energy_meter",
           "DEFAULT_MASTER_PORT"]

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in the job, as its launcher told it."""

    launcher: str
    """``torchrun``, ``slurm``, ``pmi`` or ``none``."""
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def _int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        from autotune.errors import LaunchError
        raise LaunchError(f"environment variable {name}={value!r} is not an integer") from None


def launch_env_from(env: Mapping[str, str]) -> LaunchEnv:
    """Read rank, world size, local rank and the rendezvous address from ``env``."""
    port = int(env.get("MASTER_PORT", DEFAULT_MASTER_PORT))
    if "RANK" in env and "WORLD_SIZE" in env:
        return LaunchEnv("torchrun", _int(env, "RANK"), _int(env, "WORLD_SIZE"),
                         int(env.get("LOCAL_RANK", "0")), env.get("MASTER_ADDR", "127.0.0.1"),
                         port)
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
        addr = env.get("MASTER_ADDR") or parse_hostlist(nodelist)[0]
        return LaunchEnv("slurm", _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"),
                         int(env.get("SLURM_LOCALID", "0")), addr, port)
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        local = env.get("PALS_LOCAL_RANKID", env.get("PMI_LOCAL_RANK", "0"))
        return LaunchEnv("pmi", _int(env, "PMI_RANK"), _int(env, "PMI_SIZE"), int(local),
                         env.get("MASTER_ADDR", "127.0.0.1"), port)
    return LaunchEnv("none", 0, 1, 0, "127.0.0.1", int(env.get("MASTER_PORT", _free_port())))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class DeviceInfo:
    """The device this rank trains on and how it talks to its peers."""

    kind: str
    """``cpu``, ``cuda`` or ``xpu``."""
    backend: str
    """torch.distributed backend: ``gloo``, ``nccl``, ``xccl`` or ``ccl``."""
    name: str
    """Marketing name as torch reports it (looked up in :mod:`autotune.hardware`)."""
    index: int

    @property
    def torch_device(self) -> str:
        return "cpu" if self.kind == "cpu" else f"{self.kind}:{self.index}"


def accelerator_kind(requested: str) -> str:
    """Resolve ``auto`` to xpu, then cuda, then cpu (without importing DeepSpeed)."""
    import torch

    if requested != "auto":
        return requested
    if importlib.util.find_spec("intel_extension_for_pytorch") is not None:
        import intel_extension_for_pytorch  # noqa: F401  (optional; registers XPU ops)
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def prepare_environment(requested_device: str) -> str:
    """Set the environment DeepSpeed and the BLAS read at import; return the device kind.

    Must run before ``import deepspeed``: its accelerator is chosen once, at import, from
    ``DS_ACCELERATOR``.
    """
    kind = accelerator_kind(requested_device)
    os.environ["DS_ACCELERATOR"] = kind
    # One BLAS thread per rank, unless the user chose: ranks share the cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if kind == "cpu":
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    return kind


def pick_device(kind: str, local_rank: int) -> DeviceInfo:
    """Bind this rank to its device and choose the collective backend."""
    import torch

    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        return DeviceInfo("cuda", "nccl", torch.cuda.get_device_name(local_rank), local_rank)
    if kind == "xpu":
        torch.xpu.set_device(local_rank)
        backend = "xccl"
        # torch >= 2.8 ships xccl; older stacks need oneCCL's bindings registering "ccl".
        if not _has_backend("xccl") and importlib.util.find_spec("oneccl_bindings_for_pytorch"):
            import oneccl_bindings_for_pytorch  # noqa: F401
            backend = "ccl"
        return DeviceInfo("xpu", backend, torch.xpu.get_device_name(local_rank), local_rank)
    return DeviceInfo("cpu", "gloo", _cpu_name(), 0)


def _has_backend(name: str) -> bool:
    import torch.distributed as dist

    return name in getattr(dist.Backend, "backend_list", [])


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def init_process_group(launch: LaunchEnv, device: DeviceInfo, timeout_s: int) -> None:
    """Initialise torch.distributed ourselves, then hand it to DeepSpeed.

    The launcher's values are exported as the ``env://`` variables, so that one init path
    serves every launcher (and torchrun's agent store is reused when it offers one).
    DeepSpeed's ``init_distributed`` on CPU JIT-compiles a shared-memory all-reduce op
    (37-80 s on 2 cores) in ``TorchBackend.__init__``; we stop it from building that op:
    gloo is what a CPU trial measures, and the op only speeds up small all-reduces.
    """
    import torch.distributed as dist

    os.environ.update({"RANK": str(launch.rank), "WORLD_SIZE": str(launch.world_size),
                       "LOCAL_RANK": str(launch.local_rank),  # PipelineModule reads it
                       "MASTER_ADDR": launch.master_addr, "MASTER_PORT": str(launch.master_port)})
    set_group_timeout(timeout_s)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=device.backend, init_method="env://",
            rank=launch.rank, world_size=launch.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            **({"device_id": _torch_device(device)} if device.kind == "cuda" else {}),
        )
    import deepspeed
    import deepspeed.comm.torch  # loads the module patched below

    if device.kind == "cpu":
        # sys.modules, not attribute access: deepspeed.comm re-exports the name ``torch``
        # (the torch package), which shadows the submodule as an attribute.
        ds_comm_torch: Any = sys.modules["deepspeed.comm.torch"]
        ds_comm_torch.build_shm_op = lambda: None  # no JIT build
    deepspeed.init_distributed(dist_backend=device.backend, dist_init_required=False,
                               timeout=datetime.timedelta(seconds=timeout_s))


def set_group_timeout(timeout_s: int) -> None:
    """Make groups created from now on (DeepSpeed's grid, ZeRO's) time out after ``timeout_s``.

    ``dist.new_group`` without a ``timeout`` falls back to torch's module default (30 min),
    not to the world group's timeout, and DeepSpeed creates its groups without one. A
    rank blocked on a dead peer in such a group would wait half an hour.
    """
    import torch.distributed.distributed_c10d as c10d

    timeout = datetime.timedelta(seconds=timeout_s)
    c10d.default_pg_timeout = timeout
    if hasattr(c10d, "default_pg_nccl_timeout"):
        c10d.default_pg_nccl_timeout = timeout


def _torch_device(device: DeviceInfo) -> Any:
    import torch

    return torch.device(device.torch_device)


def synchronize(device: DeviceInfo) -> None:
    """Wait for the device's queued work (a no-op on CPU, where ops are synchronous)."""
    import torch

    if device.kind == "cuda":
        torch.cuda.synchronize()
    elif device.kind == "xpu":
        torch.xpu.synchronize()


def reset_peak_memory(device: DeviceInfo) -> None:
    import torch

    if device.kind == "cuda":
        torch.cuda.reset_peak_memory_stats()
    elif device.kind == "xpu":
        torch.xpu.reset_peak_memory_stats()


def release_memory(device: DeviceInfo) -> None:
    """Give back what a finished (or out-of-memory) trial held, before the next one of the
    launch builds: Python's garbage, then the caching allocator's unused blocks."""
    import gc

    import torch

    gc.collect()
    if device.kind == "cuda":
        torch.cuda.empty_cache()
    elif device.kind == "xpu":
        torch.xpu.empty_cache()


def peak_memory(device: DeviceInfo) -> tuple[int, int | None]:
    """(peak allocated, peak reserved) bytes on an accelerator; (peak RSS, None) on CPU.

    On CPU there is no allocator to ask, so the process's high-water resident set
    (``ru_maxrss``, KiB on Linux, bytes on macOS) stands in; it includes the Python runtime.
    """
    import torch

    if device.kind == "cuda":
        return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    if device.kind == "xpu":
        return torch.xpu.max_memory_allocated(), torch.xpu.max_memory_reserved()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (rss if sys.platform == "darwin" else rss * 1024), None


def _tiles_per_card(name: str) -> int:
    """Tiles one Intel card shows as devices (``ZE_FLAT_DEVICE_HIERARCHY=FLAT``, the
    default: each tile of a Max 1550 is one XPU device)."""
    flat = os.environ.get("ZE_FLAT_DEVICE_HIERARCHY", "FLAT").upper() == "FLAT"
    return 2 if flat and "1550" in name else 1


def energy_meter(device: DeviceInfo) -> Any:
    """This rank's energy counters (:mod:`trainer.energy`): NVML on CUDA, the i915/xe
    hwmon of its card (its tile's where present) on XPU, the host's RAPL packages on
    CPU. A meter without counters measures nothing (the result says so)."""
    from trainer import energy

    counters: list[energy.Counter] = []
    if device.kind == "cuda":
        import torch

        uuid = getattr(torch.cuda.get_device_properties(device.index), "uuid", None)
        found = energy.nvml_counter(device.index, str(uuid) if uuid else None)
        counters = [found] if found else []
    elif device.kind == "xpu":
        tiles = _tiles_per_card(device.name)
        found = energy.hwmon_counters(device.index // tiles,
                                      device.index % tiles if tiles > 1 else None)
        counters = [found] if found else []
    else:
        counters = energy.rapl_counters()
    return energy.EnergyMeter(counters)
