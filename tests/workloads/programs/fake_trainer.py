"""A stand-in training program for the failure tests: no torch, instant start.

It "trains" ``--steps`` steps of ``--seconds`` each (a sleep, timed), reports each one in
the metrics file through :mod:`autotune.metrics_writer` and prints it. Failure modes:

* ``--stall-if-micro-batch M``: with ``--micro-batch M`` it stops after ``--stall-after``
  steps and hangs, having started a child process that hangs too (the whole tree must die);
* ``--garbage N``: N lines of garbage are written into the metrics file between the steps;
* ``--print-oom TEXT``: prints TEXT to stderr after the first step and exits 1.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from autotune.metrics_writer import ENV_VAR, MetricsWriter


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--seconds", type=float, default=0.05)
    p.add_argument("--stall-if-micro-batch", type=int, default=None)
    p.add_argument("--stall-after", type=int, default=2)
    p.add_argument("--garbage", type=int, default=0)
    p.add_argument("--print-oom", default=None)
    p.add_argument("--marker", default="", help="put on the child's command line too")
    a = p.parse_args()
    metrics = MetricsWriter()
    for step in range(1, a.steps + 1):
        if a.micro_batch == a.stall_if_micro_batch and step > a.stall_after:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)",
                                      a.marker])
            print(f"stalled; child {child.pid}", flush=True)
            while True:
                time.sleep(3600)
        start = time.perf_counter()
        time.sleep(a.seconds)
        seconds = time.perf_counter() - start
        print(f"step {step} {seconds:.6f}", flush=True)
        metrics.step(step, seconds, loss=1.0 / step)
        if a.garbage and metrics.enabled:
            with open(os.environ[ENV_VAR], "a") as fh:
                for i in range(a.garbage):
                    fh.write(["not json", '{"step": "x"}', "[1, 2]", '{"seconds": 1}',
                              '{"step": 1, "seconds": 0.5}'][i % 5] + "\n")
        if a.print_oom:
            print(a.print_oom, file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
