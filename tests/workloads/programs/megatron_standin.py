"""Stands in for Megatron-DeepSpeed's ``pretrain_gpt.py``, which cannot be installed here.

It accepts exactly the arguments a ``megatron-deepspeed`` trial is given (the user's, here
``--data-path`` and ``--standin-fork``, and the ones autotune owns), checks that the
DeepSpeed config agrees with them, and prints per iteration the line Megatron-DeepSpeed
prints, built from the format strings of ``--standin-fork``:

* ``deepspeedai``: deepspeedai/Megatron-DeepSpeed megatron/training.py ``training_log``
  (commit f1feb8877d760b4ceaa0551debbf1cb4026fc9be), by the last rank;
* ``argonne``: argonne-lcf/Megatron-DeepSpeed megatron/training_log.py ``training_log``
  (commit b8413d98abdb30c87e607b21a663e4bfcb6c8da2), by rank 0, through a logger prefix;
* ``argonne-old``: the same with the older ``[LM]-TFLOPs=``/``[DS]-TFLOPs=`` spelling
  (saforem2/Megatron-DeepSpeed ALCF/README.md, commit 027032123c2c630da2e755e4381427ab170bdba3);
* ``pipe``: only DeepSpeed's PipelineEngine line (deepspeedai/DeepSpeed
  deepspeed/runtime/pipe/engine.py, commit e787c16394e5d50a4b869386e4e4017d6b06f8eb);

and Megatron's memory report (megatron/utils.py ``report_memory``, commit
207b2d5aad1eea98464c37e0b991be6f8937226f) after the first iteration. An iteration is a
sleep of ``--standin-ms`` (the first one longer: start-up), timed and printed as Megatron
would. Standard library only.
"""

# The lines are built with the format strings as the cited sources write them.
# ruff: noqa: UP032
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

STARTUP_EXTRA_S = 0.05


def deepspeedai_line(iteration: int, train_iters: int, elapsed_s: float, loss: float,
                     batch: int, seq: int, tflops: float, world: int) -> str:
    samples_per_sec = batch / elapsed_s
    log_string = ' iteration {:8d}/{:8d} |'.format(iteration, train_iters)
    log_string += ' consumed samples: {:12d} |'.format(iteration * batch)
    log_string += ' consumed tokens: {:12d} |'.format(iteration * batch * seq)
    log_string += ' elapsed time per iteration (ms): {:.1f} |'.format(elapsed_s * 1000.0)
    log_string += ' learning rate: {:.3E} |'.format(3e-4)
    log_string += ' global batch size: {:5d} |'.format(batch)
    log_string += ' {}: {:.6E} |'.format('lm loss', loss)
    log_string += ' loss scale: {:.1f} |'.format(1.0)
    log_string += ' actual seqlen: {:5d} |'.format(seq)
    log_string += ' number of skipped iterations: {:3d} |'.format(0)
    log_string += ' number of nan iterations: {:3d} |'.format(0)
    log_string += ' samples per second: {:.3f} |'.format(samples_per_sec)
    log_string += ' tokens per gpu per second (tgs): {:.3f} |'.format(
        samples_per_sec * seq / world)
    log_string += ' TFLOPs: {:.2f} |'.format(tflops)
    log_string += ' \n TeraFLOPs: {:.2f} |'.format(tflops)
    log_string += ' params(B): {:.2f} |'.format(0.01)
    log_string += ' moe params(B): {:.2f}|'.format(0.0)
    return log_string


def argonne_line(iteration: int, train_iters: int, elapsed_s: float, loss: float,
                 batch: int, seq: int, tflops_lm: float, tflops_ds: float, world: int,
                 *, old: bool = False) -> str:
    samples_per_sec = batch / elapsed_s
    consumed_samples, consumed_tokens = iteration * batch, iteration * batch * seq
    log_string = f" iteration={iteration:8d}/{train_iters:8d} |"
    log_string += f" consumed_samples={consumed_samples:12d} |"
    log_string += f" consumed_tokens={consumed_tokens:12d} |"
    log_string += (" elapsed_time_per_iteration_ms="
                   f"{elapsed_s * 1000.0:.1f} |")
    log_string += f" learning_rate={3e-4:.6g} |"
    log_string += f" global_batch_size={batch:5d} |"
    log_string += " {}={:.6f} |".format("lm loss", loss)
    log_string += " loss_scale={:.1f} |".format(1.0)
    log_string += " actual_seqlen={:5d} |".format(seq)
    log_string += " number_of_skipped_iterations={:3d} |".format(0)
    log_string += " number_of_nan_iterations={:3d} |".format(0)
    log_string += " samples_per_second={:.3f} |".format(samples_per_sec)
    log_string += " tokens_per_gpu_per_second_tgs={:.3f} |".format(
        samples_per_sec * seq / world)
    if old:
        log_string += " [LM]-TFLOPs={:.2f} |".format(tflops_lm)
        log_string += " [DS]-TFLOPs={:.2f} |".format(tflops_ds)
    else:
        log_string += " [LM]TFLOPs={:.2f} |".format(tflops_lm)
        log_string += " [DS]TFLOPs={:.2f} |".format(tflops_ds)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return f"[{stamp}][INFO][training_log:642] - {log_string}"


def memory_line(rank: int, iteration: int, max_allocated_mb: float) -> str:
    name = '(after {} iterations)'.format(iteration)
    string = name + ' memory (MB)'
    string += ' | allocated: {}'.format(max_allocated_mb / 2)
    string += ' | max allocated: {}'.format(max_allocated_mb)
    string += ' | reserved: {}'.format(max_allocated_mb * 1.25)
    string += ' | max reserved: {}'.format(max_allocated_mb * 1.25)
    return "[Rank {}] {}".format(rank, string)


def pipe_line(step: int, loss: float, iter_time_s: float, batch: int) -> str:
    log_str = f'steps: {step} loss: {loss:0.4f} '
    log_str += f'iter time (s): {iter_time_s:0.3f} samples/sec: {batch / iter_time_s:0.3f}'
    return log_str


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False)
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                 "--micro-batch-size", "--global-batch-size", "--zero-stage", "--train-iters",
                 "--log-interval", "--eval-iters", "--eval-interval", "--num-layers",
                 "--hidden-size", "--num-attention-heads", "--seq-length", "--ffn-hidden-size",
                 "--max-position-embeddings"):
        p.add_argument(flag, type=int, required=flag not in ("--ffn-hidden-size",))
    for flag in ("--no-pipeline-parallel", "--checkpoint-activations",
                 "--deepspeed-activation-checkpointing", "--bf16", "--deepspeed", "--swiglu",
                 "--sequence-parallel"):
        p.add_argument(flag, action="store_true")
    # Megatron-DeepSpeed's own recompute flags (megatron/arguments.py, as defined there).
    p.add_argument("--recompute-granularity", choices=("full", "selective"), default=None)
    p.add_argument("--recompute-method", choices=("uniform", "block"), default=None)
    p.add_argument("--recompute-num-layers", type=int, default=1)
    p.add_argument("--hidden-dropout", type=float, default=0.1)  # Megatron's defaults
    p.add_argument("--attention-dropout", type=float, default=0.1)
    p.add_argument("--deepspeed_config", required=True)
    p.add_argument("--data-path", required=True)
    p.add_argument("--standin-fork", choices=("deepspeedai", "argonne", "argonne-old", "pipe"),
                   required=True)
    p.add_argument("--standin-ms", type=float, default=40.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    tp, pp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    dp = world // (tp * pp)
    ds = json.load(open(a.deepspeed_config))  # Megatron reads it with json.load
    problems = []
    if tp * pp * dp != world:
        problems.append(f"tp {tp} x pp {pp} does not divide world {world}")
    if ds["train_batch_size"] != a.global_batch_size:
        problems.append("train_batch_size != --global-batch-size")
    if ds["train_micro_batch_size_per_gpu"] != a.micro_batch_size:
        problems.append("train_micro_batch_size_per_gpu != --micro-batch-size")
    if ds["gradient_accumulation_steps"] * a.micro_batch_size * dp != a.global_batch_size:
        problems.append("gradient_accumulation_steps x micro x dp != global batch")
    if ds["zero_optimization"]["stage"] != a.zero_stage:
        problems.append("zero stage differs")
    if (pp == 1) != a.no_pipeline_parallel or a.log_interval != 1 or a.eval_iters != 0:
        problems.append("pipeline / log-interval / eval-iters flags")
    if problems:
        print("standin: inconsistent arguments: " + "; ".join(problems), file=sys.stderr)
        return 3
    printer = rank == (world - 1 if a.standin_fork == "deepspeedai" else 0)
    for it in range(1, a.train_iters + 1):
        start = time.perf_counter()
        time.sleep(a.standin_ms / 1000.0 + (STARTUP_EXTRA_S if it == 1 else 0.0))
        elapsed = time.perf_counter() - start
        loss = 11.0 - 0.1 * it
        if printer and a.standin_fork == "deepspeedai":
            print(deepspeedai_line(it, a.train_iters, elapsed, loss, a.global_batch_size,
                                   a.seq_length, 38.61, world), flush=True)
        elif printer and a.standin_fork in ("argonne", "argonne-old"):
            print(argonne_line(it, a.train_iters, elapsed, loss, a.global_batch_size,
                               a.seq_length, 49.66, 73.32, world,
                               old=a.standin_fork == "argonne-old"), flush=True)
        elif printer:
            print(pipe_line(it, loss, elapsed, a.global_batch_size), flush=True)
        if it == 1 and a.standin_fork != "pipe" and rank == 0:
            print(memory_line(rank, it, 1234.5), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
