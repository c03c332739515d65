"""The log lines of the programs a foreign workload runs, as regular expressions, each with
the source and commit of the format string that prints it: what
:mod:`autotune.workloads.readback` reads a step, a loss, a peak memory and the program's own
TFLOPS from (docs/own-command.md, "What autotune reads back")."""

from __future__ import annotations

import re

__all__ = ["DEEPSPEEDAI_ITERATION", "DEEPSPEEDAI_LOSS", "DEEPSPEEDAI_TFLOPS",
           "ARGONNE_ITERATION", "ARGONNE_LOSS", "ARGONNE_TFLOPS", "MEGATRON_MEMORY",
           "DEEPSPEED_PIPE"]

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_FLOAT_OR_NAN = rf"(?:{_NUM}|nan|inf)"

# -- Megatron-DeepSpeed, deepspeedai fork -------------------------------------------------
# deepspeedai/Megatron-DeepSpeed megatron/training.py, training_log() (commit
# f1feb8877d760b4ceaa0551debbf1cb4026fc9be), printed by print_rank_last (the last rank):
#   ' iteration {:8d}/{:8d} |' ... ' elapsed time per iteration (ms): {:.1f} |' ...
#   ' {}: {:.6E} |'.format(key, avg)  (key 'lm loss') ... ' TFLOPs: {:.2f} |'
DEEPSPEEDAI_ITERATION = re.compile(
    r"\biteration\s+(?P<step>\d+)/\s*(?P<total>\d+)\s*\|.*?"
    rf"elapsed time per iteration \(ms\):\s*(?P<ms>{_NUM})")
DEEPSPEEDAI_LOSS = re.compile(rf"\|\s*lm loss:\s*(?P<loss>{_FLOAT_OR_NAN})")
DEEPSPEEDAI_TFLOPS = re.compile(rf"\|\s*TFLOPs:\s*(?P<tflops>{_NUM})")
# -- Megatron-DeepSpeed, argonne-lcf fork --------------------------------------------------
# argonne-lcf/Megatron-DeepSpeed megatron/training_log.py, training_log() (commit
# b8413d98abdb30c87e607b21a663e4bfcb6c8da2; the same in megatron/training.py at
# eb8e570dbc949914a6fee5437dc6ea31f11eee95), logged by rank 0 (log.info):
#   f" iteration={iteration:8d}/{args.train_iters:8d} |" ...
#   " elapsed_time_per_iteration_ms=" f"{elapsed_time_per_iteration * 1000.0:.1f} |" ...
#   " {}={:.6f} |".format(key, avg) ... " [LM]TFLOPs={:.2f} |" " [DS]TFLOPs={:.2f} |"
# Older versions printed "[LM]-TFLOPs=" / "[DS]-TFLOPs=" (logs quoted in
# saforem2/Megatron-DeepSpeed ALCF/README.md, commit 027032123c2c630da2e755e4381427ab170bdba3).
ARGONNE_ITERATION = re.compile(
    r"\biteration=\s*(?P<step>\d+)/\s*(?P<total>\d+)\s*\|.*?"
    rf"elapsed_time_per_iteration_ms=(?P<ms>{_NUM})")
ARGONNE_LOSS = re.compile(rf"\|\s*lm loss=(?P<loss>{_FLOAT_OR_NAN})")
ARGONNE_TFLOPS = re.compile(rf"(?:\[(?P<kind>LM|DS)\]-?)?TFLOPs=(?P<tflops>{_NUM})")
# -- Megatron's memory report (both forks) ---------------------------------------------------
# deepspeedai/Megatron-DeepSpeed megatron/utils.py, report_memory() (commit
# 207b2d5aad1eea98464c37e0b991be6f8937226f), after the first iteration, data-parallel rank 0:
#   "[Rank {}] {}".format(rank, name + ' memory (MB)' + ' | allocated: {}' +
#   ' | max allocated: {}' + ' | reserved: {}' + ' | max reserved: {}')
MEGATRON_MEMORY = re.compile(
    rf"\[Rank (?P<rank>\d+)\] .*?memory \(MB\) \| allocated: (?P<alloc>{_NUM}) \| "
    rf"max allocated: (?P<max_alloc>{_NUM})")
# -- DeepSpeed PipelineEngine -----------------------------------------------------------------
# deepspeedai/DeepSpeed deepspeed/runtime/pipe/engine.py, PipelineEngine.train_batch (commit
# e787c16394e5d50a4b869386e4e4017d6b06f8eb), global rank 0, every steps_per_print steps:
#   f'steps: {self.global_steps} loss: {self.agg_train_loss:0.4f} ' ...
#   f'iter time (s): {iter_time:0.3f} samples/sec: {tput:0.3f}'
DEEPSPEED_PIPE = re.compile(
    rf"\bsteps: (?P<step>\d+) loss: (?P<loss>{_FLOAT_OR_NAN}) .*?"
    rf"iter time \(s\): (?P<seconds>{_NUM}) samples/sec:")
