#!/usr/bin/env bash
# Set up and run the main job: a real autotune study of a tiny GPT on this machine's CPU
# (DeepSpeed trials under torchrun, gloo, SQLite storage in ./autotune.db), then print the
# best layout and write its DeepSpeed config. A second run resumes the same study.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/autotune run studies/cpu_demo.yaml "$@"
.venv/bin/autotune best studies/cpu_demo.yaml --emit deepspeed --out runs/cpu-demo
