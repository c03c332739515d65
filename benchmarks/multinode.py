"""Multi-node figures on the namespace cluster of ``.ci/cluster.sh``, side by side.

Real trainer trials through the SLURM launcher (DeepSpeed, gloo, CPU ranks), in one
4-node allocation that the script takes (``salloc --no-shell``) and gives back:

1. **TP inside one node vs split across two nodes.** The same layout (``tp2-pp1-dp1``)
   with both ranks on one node (its TP all-reduces over the node's loopback) and with one
   rank on each of two nodes whose links are slowed (``.ci/cluster.sh slow RATE [DELAY]``:
   tbf rate, and netem delay where the kernel has it, on both ends of every node's veth),
   measured step time beside the cost model's prediction for a cluster told the same link
   speed (``cluster.links``: ``inter_node_gbps = node_nic_gbps = nic_gbps`` = RATE;
   ``inter_node_latency_us`` = twice DELAY, a packet crossing two shaped interfaces, else
   the device table's). The motivating finding (LRZ; Narayanan et al. 2021, fig. 13): TP
   across nodes is slow; both must rank "inside" first.
2. **Trial start-up on 1 vs 2 nodes**: launcher wall time of a tiny ``tp1-pp1-dp2`` trial of
   one warm-up and one timed step (nearly all start-up: srun, imports, rendezvous,
   DeepSpeed), 2 ranks on one node vs one rank on each of two nodes, unshaped links.
3. **Side by side vs in sequence**: two 2-node trials at once on disjoint node pairs (one
   launcher per pair, as the runner's node groups) against the same two one after the other.

Nothing is asserted; run as root with the cluster up (``bash .ci/cluster.sh``)::

    python benchmarks/multinode.py                         # 100mbit (tbf)
    python benchmarks/multinode.py --rate 50mbit --json out.json
    python benchmarks/multinode.py --delay 1ms             # where sch_netem exists

``--json OUT``: ``{"tp_placement": {"rate": ..., "delay": ..., "inside": {"step_time_s",
"step_time_iqr_s", "predicted_step_time_s", "hosts"}, "across": {...}, "measured_faster",
"predicted_faster", "same_ranking"}, "startup_s": {"1_node": s, "2_nodes": s},
"side_by_side": {"parallel_wall_s", "sequential_wall_s", "ratio"}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.config.cluster import ClusterConfig, LinkConfig  # noqa: E402
from autotune.config.model import ModelConfig  # noqa: E402
from autotune.launchers.slurm import SlurmLauncher  # noqa: E402
from autotune.layout import Layout  # noqa: E402
from autotune.models.cost import estimate_step  # noqa: E402
from autotune.trial import (  # noqa: E402
    LaunchReport,
    RunConfig,
    TrialPaths,
    TrialSpec,
)

CLUSTER_SH = REPO / ".ci" / "cluster.sh"
TINY = ModelConfig(n_layer=2, hidden=32, n_head=4, seq_len=16, vocab_size=64,
                   ffn_hidden=128, name="mn-tiny")
TP_MODEL = ModelConfig(n_layer=2, hidden=256, n_head=4, seq_len=128, vocab_size=256,
                       ffn_hidden=1024, name="mn-tp")
"""Big enough that a step's TP all-reduces (8 per layer and micro-batch of 2 x 128 x 256
fp32 values, 256 KiB each) weigh against its compute on a 100 Mbit/s link."""


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="100mbit", help="netem rate of each node's link")
    p.add_argument("--delay", default=None,
                   help="netem delay on each end of a node's link (needs sch_netem)")
    p.add_argument("--measure-steps", type=int, default=5, help="timed steps (TP runs)")
    p.add_argument("--env", default="/tmp/autotune-mn/env", help="the cluster's env file")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    return p.parse_args(argv)


def _rate_gbps(rate: str) -> float:
    """``100mbit`` → 0.0125 (GB/s, the unit of ``cluster.links``; tc's units, bits)."""
    m = re.fullmatch(r"([\d.]+)\s*([kmg]?)bit", rate.lower())
    if not m:
        raise SystemExit(f"--rate {rate!r}: allowed: a tc rate in bits, e.g. 100mbit")
    scale = {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1.0}[m.group(2)]
    return float(m.group(1)) * scale / 8


def _delay_us(delay: str) -> float:
    m = re.fullmatch(r"([\d.]+)\s*(us|ms|s)", delay.lower())
    if not m:
        raise SystemExit(f"--delay {delay!r}: allowed: a tc time, e.g. 1ms")
    return float(m.group(1)) * {"us": 1.0, "ms": 1e3, "s": 1e6}[m.group(2)]


def _cluster_env(path: str) -> dict[str, str]:
    env = {}
    if Path(path).is_file():
        for line in Path(path).read_text().splitlines():
            if line.startswith("export ") and "=" in line:
                k, _, v = line[7:].partition("=")
                env[k] = v
    if "AUTOTUNE_MN_SLURM_CONF" not in env:
        raise SystemExit(f"no multi-node cluster ({path} missing): run `bash .ci/cluster.sh`")
    return env


class Allocation:
    """``salloc --no-shell -N4``, exported into this process for the launchers."""

    def __init__(self, nodes: int) -> None:
        done = subprocess.run(["salloc", "--no-shell", f"-N{nodes}", "--ntasks-per-node=2",
                               "-t", "30", "-J", "autotune-mn-bench"], capture_output=True,
                              text=True, timeout=120, check=False)
        job = next((w for w in done.stderr.split() if w.isdigit()), None)
        if done.returncode != 0 or job is None:
            raise SystemExit(f"salloc failed: {done.stderr.strip()}")
        self.job = job
        self.nodes = subprocess.run(["scontrol", "show", "hostnames", subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True,
            check=True).stdout.strip()], capture_output=True, text=True,
            check=True).stdout.split()
        os.environ.update(SLURM_JOB_ID=job, SLURM_JOB_NODELIST=",".join(self.nodes))

    def close(self) -> None:
        subprocess.run(["scancel", self.job], check=False)


def _trial(launcher: SlurmLauncher, root: Path, name: str, model: ModelConfig,
           layout: Layout, measure_steps: int) -> LaunchReport:
    spec = TrialSpec(model=model, layout=layout,
                     run=RunConfig(device="cpu", warmup_steps=1, measure_steps=measure_steps,
                                   measure_precision=None))
    report = launcher.run(spec, TrialPaths(root / name), timeout_s=300)
    if report.result is None or report.result.status != "ok":
        raise SystemExit(f"trial {name} failed: {report.scheduler_state} "
                         f"{report.stderr_tail[-2000:]}")
    return report


def _launcher(per_node: int, nodes: list[str]) -> SlurmLauncher:
    return SlurmLauncher(devices_per_node=per_node, nodelist=nodes)


def tp_placement(alloc: Allocation, root: Path, rate: str, delay: str | None,
                 steps: int) -> dict[str, Any]:
    lay = Layout(tp=2, pp=1, dp=1, micro_batch=2, grad_accum=1)
    gbps = _rate_gbps(rate)
    lat_us = 2 * _delay_us(delay) if delay else None
    clusters = {
        "inside": (ClusterConfig(nodes=1, devices_per_node=2, device="cpu"),
                   _launcher(2, alloc.nodes[:1])),
        "across": (ClusterConfig(nodes=2, devices_per_node=1, device="cpu",
                                 links=LinkConfig(inter_node_gbps=gbps, node_nic_gbps=gbps,
                                                  nic_gbps=gbps, inter_node_latency_us=lat_us)),
                   _launcher(1, alloc.nodes[:2])),
    }
    out: dict[str, Any] = {"rate": rate, "delay": delay, "layout": lay.key()}
    subprocess.run(["bash", str(CLUSTER_SH), "slow", rate, *([delay] if delay else [])],
                   check=True)
    try:
        for name, (cluster, launcher) in clusters.items():
            rep = _trial(launcher, root, f"tp-{name}", TP_MODEL, lay, steps)
            assert rep.result is not None
            out[name] = {"step_time_s": rep.result.step_time_s,
                         "step_time_iqr_s": rep.result.step_time_iqr_s,
                         "predicted_step_time_s": estimate_step(TP_MODEL, lay, cluster,
                                                                dtype="fp32").step_time_s,
                         "hosts": rep.result.hosts}
    finally:
        subprocess.run(["bash", str(CLUSTER_SH), "unslow"], check=False)
    faster = {k: min(("inside", "across"), key=lambda n: out[n][k])
              for k in ("step_time_s", "predicted_step_time_s")}
    out.update(measured_faster=faster["step_time_s"],
               predicted_faster=faster["predicted_step_time_s"],
               same_ranking=faster["step_time_s"] == faster["predicted_step_time_s"])
    return out


def startup(alloc: Allocation, root: Path, repeats: int = 2) -> dict[str, float]:
    lay = Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=1)
    out = {}
    for name, launcher in (("1_node", _launcher(2, alloc.nodes[:1])),
                           ("2_nodes", _launcher(1, alloc.nodes[:2]))):
        out[name] = statistics.median(
            _trial(launcher, root, f"start-{name}-{i}", TINY, lay, 1).elapsed_s
            for i in range(repeats))
    return out


def side_by_side(alloc: Allocation, root: Path) -> dict[str, float]:
    pairs = [alloc.nodes[0:2], alloc.nodes[2:4]]
    layouts = [Layout(tp=2, pp=1, dp=2, micro_batch=2, grad_accum=1),
               Layout(tp=2, pp=2, dp=1, micro_batch=2, grad_accum=2)]
    t0 = time.monotonic()
    for i, lay in enumerate(layouts):
        _trial(_launcher(2, pairs[0]), root, f"seq-{i}", TINY, lay, 2)
    sequential = time.monotonic() - t0
    t0 = time.monotonic()
    threads = [threading.Thread(target=_trial, args=(_launcher(2, pairs[i]), root,
                                                     f"par-{i}", TINY, lay, 2))
               for i, lay in enumerate(layouts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parallel = time.monotonic() - t0
    return {"parallel_wall_s": parallel, "sequential_wall_s": sequential,
            "ratio": parallel / sequential}


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    env = _cluster_env(args.env)
    os.environ["SLURM_CONF"] = env["AUTOTUNE_MN_SLURM_CONF"]
    for var in [v for v in os.environ if v.startswith("SLURM_") and v != "SLURM_CONF"]:
        del os.environ[var]  # an enclosing allocation of another cluster must not leak in
    alloc = Allocation(4)
    figures: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="mn-bench-") as tmp:
            root = Path(tmp)
            figures["tp_placement"] = tp_placement(alloc, root, args.rate, args.delay,
                                                   args.measure_steps)
            figures["startup_s"] = startup(alloc, root)
            figures["side_by_side"] = side_by_side(alloc, root)
    finally:
        alloc.close()
    tp = figures["tp_placement"]
    extra = f" +{args.delay} per end" if args.delay else ""
    print(f"TP group of {tp['layout']} on links of {args.rate}{extra}:")
    print(f"  {'placement':<10} {'measured step_s':>16} {'iqr':>8} {'predicted step_s':>17}")
    for name in ("inside", "across"):
        r = tp[name]
        print(f"  {name:<10} {r['step_time_s']:>16.4f} {r['step_time_iqr_s'] or 0:>8.4f} "
              f"{r['predicted_step_time_s']:>17.4f}")
    print(f"  faster: measured {tp['measured_faster']}, predicted {tp['predicted_faster']} "
          f"(same ranking: {tp['same_ranking']})")
    st = figures["startup_s"]
    print(f"trial start-up (1 warm-up + 1 step, launcher wall): 1 node {st['1_node']:.1f} s, "
          f"2 nodes {st['2_nodes']:.1f} s")
    sb = figures["side_by_side"]
    print(f"two 2-node trials: side by side {sb['parallel_wall_s']:.1f} s, in sequence "
          f"{sb['sequential_wall_s']:.1f} s (ratio {sb['ratio']:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
