"""Issue 23 (G): batch launches under CPU load end as they measured.

CI had a solo launch of ``tp1-pp2`` exit 1 although its result said ``ok``, with other work
on the same 2 cores. Here 20 batch launches (two world-size-2 layouts each, one of them
``tp1-pp2``) run beside one busy-loop process per core, and every rank of every launch must
exit 0 with both results ``ok``.

Each launch is the trainer's own code from ``main`` to its exit (``trainer.__main__._leave``),
with two ranks in a gloo process group, but without paying torch's and DeepSpeed's import
per rank (5 CPU-seconds each on this machine, 300 s for the 40 ranks): a server process
imports them once and forks the ranks of each launch, as torchrun would start them (the
``RANK``/``WORLD_SIZE``/``MASTER_*`` variables), one launch after the other.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_launch import REPO, spec

pytestmark = [pytest.mark.slow, pytest.mark.faults]

LAUNCHES = 20
RUN = {"warmup_steps": 0, "measure_steps": 1, "measure_precision": None}
TWO_LAYERS = {"n_layer": 2, "hidden": 32, "n_head": 4, "seq_len": 16, "vocab_size": 64}
SPECS = {"pp2": spec(1, 2, 1, model=TWO_LAYERS, **RUN),
         "tp2": spec(2, 1, 1, model=TWO_LAYERS, **RUN)}

_SERVER = """
import json, os, socket, sys
from trainer import distributed
distributed.prepare_environment("cpu")
import torch, deepspeed  # once, before the ranks are forked, with what a rank imports later
import deepspeed.comm.torch, deepspeed.runtime.engine, deepspeed.runtime.pipe.engine
import trainer.data, trainer.engine, trainer.measure, trainer.results, trainer.run
from trainer.__main__ import _leave, main

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

root, launches, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for i in range(launches):
    port, argv, pids = free_port(), [], []
    for name in names:
        argv += ["--spec", f"{root}/{name}.json", "--result", f"{root}/{i}-{name}.out.json"]
    for rank in range(2):
        pid = os.fork()
        if pid == 0:
            try:
                os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                _leave(main(argv))
            finally:
                os._exit(70)  # main raised: its traceback is on stderr
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    print(json.dumps({"launch": i, "codes": codes}), flush=True)
"""


def _busy() -> None:
    while True:
        pass


def test_batch_launches_under_cpu_load_end_as_they_measured(tmp_path: Path) -> None:
    for name, sp in SPECS.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(sp))
    hogs = [multiprocessing.get_context("spawn").Process(target=_busy, daemon=True)
            for _ in range(os.cpu_count() or 2)]
    for hog in hogs:
        hog.start()
    try:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-c", _SERVER, str(tmp_path), str(LAUNCHES),
                               *SPECS], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=900)
    finally:
        for hog in hogs:
            hog.kill()
            hog.join()
    launches = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and len(launches) == LAUNCHES, done.stderr[-4000:]
    failed = [x for x in launches if x["codes"] != [0, 0]]
    assert not failed, (failed, done.stderr[-4000:])
    for i in range(LAUNCHES):
        for name in SPECS:
            result = json.loads((tmp_path / f"{i}-{name}.out.json").read_text())
            assert result["status"] == "ok", result.get("error")
