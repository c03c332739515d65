"""A stand-in trainer for CLI tests (``launcher.local.python``; torchrun starts it as the
built-in trainer's rank): each member of its launch gets a result at once, its throughput
the micro-batch size, and the launch is noted in ``launched.jsonl`` beside the script.
While a file ``hold`` lies beside it, a launch sleeps instead (to be interrupted)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

SCRIPT = """#!{python}
import json, os, sys
args = sys.argv[1:]
specs = [args[i + 1] for i, a in enumerate(args) if a == "--spec"]
results = [args[i + 1] for i, a in enumerate(args) if a == "--result"]
with open({launched!r}, "a") as fh:
    fh.write(json.dumps([json.load(open(s))["layout"]["micro_batch"] for s in specs]) + "\\n")
if os.path.exists({hold!r}):
    import time
    time.sleep(300)  # until the runner's interrupt ends the launch
for index, (spec_path, result_path) in enumerate(zip(specs, results)):
    layout = json.load(open(spec_path))["layout"]
    result = {{"status": "ok", "model_tflops_per_device": float(layout["micro_batch"]),
              "step_time_s": 0.1, "step_times_s": [0.1, 0.1, 0.1], "layout": layout,
              "peak_memory_bytes": 2 ** 28 * layout["micro_batch"], "world_size": 1,
              "batch_index": index, "batch_size": len(specs), "elapsed_s": 0.5}}
    with open(result_path + ".tmp", "w") as fh:
        json.dump(result, fh)
    os.replace(result_path + ".tmp", result_path)
"""


def fake_trainer(folder: Path) -> tuple[Path, Path]:
    """The script's path and its launch log."""
    script, launched = folder / "fake-python", folder / "launched.jsonl"
    script.write_text(SCRIPT.format(python=sys.executable, launched=str(launched),
                                    hold=str(folder / "hold")))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, launched
