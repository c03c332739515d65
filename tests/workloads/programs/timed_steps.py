"""A stand-in program whose step times are given: the adaptive measurement's tests.

``--times 0.5,0.1,0.3`` are the seconds it reports for steps 1, 2, 3, ... (the list
repeats); each step really takes ``--pause`` seconds, so that autotune follows the steps
as they come. It runs ``--steps`` steps, reports each in the metrics file and prints it,
then prints ``done`` and exits 0; a SIGTERM ends it at once with 143, printing
``terminated``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from types import FrameType

from autotune.metrics_writer import MetricsWriter


def _terminated(signum: int, frame: FrameType | None) -> None:
    print("terminated", flush=True)
    sys.exit(128 + signum)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--times", required=True)
    p.add_argument("--pause", type=float, default=0.1)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, _terminated)
    times = [float(t) for t in a.times.split(",")]
    metrics = MetricsWriter()
    for step in range(1, a.steps + 1):
        time.sleep(a.pause)
        seconds = times[(step - 1) % len(times)]
        metrics.step(step, seconds, loss=1.0 / step)
        print(f"step {step} {seconds:.6f}", flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
