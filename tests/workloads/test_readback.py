"""Reading a foreign program back, without running one: the log adapters on lines built from
the cited format strings of both Megatron-DeepSpeed forks and DeepSpeed's pipeline engine,
the metrics file (garbage skipped and counted), the score, every OOM signature, the
no-progress watch, and the command lines the launchers build for a foreign workload."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autotune.config.model import ModelConfig
from autotune.config.workload import WorkloadConfig
from autotune.launchers.local import LocalLauncher
from autotune.launchers.slurm import SlurmLauncher
from autotune.layout import Layout
from autotune.models.flops import model_flops_per_step
from autotune.trial import LaunchReport, RunConfig, TrialPaths, TrialSpec
from autotune.trial.classify import classify
from autotune.trial.outcome import find_oom_signature
from autotune.workloads.base import ProgressWatch
from autotune.workloads.oom_signatures import OOM_SIGNATURES
from autotune.workloads.readback import (
    StepCounter,
    StepRecord,
    measure,
    parse_log_line,
    read_back,
    read_metrics_file,
)
from tests.workloads.programs import megatron_standin as standin

MODEL = ModelConfig(n_layer=2, hidden=64, n_head=4, seq_len=64, vocab_size=256, ffn_hidden=256)
LAYOUT = Layout(tp=1, pp=1, dp=2, micro_batch=2, grad_accum=4)


def test_deepspeedai_iteration_line() -> None:
    # A line as deepspeedai/Megatron-DeepSpeed's training_log prints it (format strings of
    # megatron/training.py @ f1feb88, reproduced by the stand-in); "\n TeraFLOPs" is a
    # second line of the same print.
    text = standin.deepspeedai_line(3, 10, 0.0254, 10.7, 16, 64, 38.61, 2)
    first, second = text.split("\n")
    rec = parse_log_line(first)
    assert isinstance(rec, StepRecord) and rec.source == "megatron-deepspeedai"
    assert (rec.step, rec.seconds) == (3, pytest.approx(0.0254))
    assert rec.loss == pytest.approx(10.7) and rec.program_tflops == {"TFLOPs": 38.61}
    assert parse_log_line(second) is None


@pytest.mark.parametrize("old", [False, True], ids=["[LM]TFLOPs=", "[LM]-TFLOPs="])
def test_argonne_iteration_line(old: bool) -> None:
    # argonne-lcf/Megatron-DeepSpeed megatron/training_log.py @ b8413d98 (and the older
    # "-TFLOPs=" spelling), behind the logger's prefix.
    line = standin.argonne_line(7, 10, 0.1089, 11.13, 768, 4096, 49.66, 73.32, 24, old=old)
    rec = parse_log_line(line)
    assert isinstance(rec, StepRecord) and rec.source == "megatron-argonne"
    assert (rec.step, rec.seconds, rec.loss) == (7, pytest.approx(0.1089), pytest.approx(11.13))
    assert rec.program_tflops == {"[LM]TFLOPs": 49.66, "[DS]TFLOPs": 73.32}


def test_real_logged_lines_of_both_forks_parse() -> None:
    # Verbatim from logs quoted in saforem2/Megatron-DeepSpeed ALCF/README.md (027032123c).
    deepspeedai = (" iteration        2/  317892 | consumed samples:          192 | consumed "
                   "tokens:       786432 | elapsed time per iteration (ms): 20298.3 | learning "
                   "rate: 3.000E-04 | global batch size:    96 | lm loss: 2.537718E+01 | loss "
                   "scale: 1.0 | actual seqlen:  4096 | number of skipped iterations:   0 | "
                   "number of nan iterations:   0 | samples per second: 4.729 | tokens per gpu "
                   "per second(tgs): 807.159 | TFLOPs: 49.17 |")
    argonne = ("[2024-06-21 10:50:42][INFO][training:1609] -  iteration=       1/  317892 | "
               "consumed_samples=         768 | consumed_tokens=     3145728 | "
               "elapsed_time_per_iteration_ms=108893.2 | learning_rate=1.88743e-08 | "
               "global_batch_size=  768 | lm loss=11.133188 | loss_scale=1.0 | actual_seqlen= "
               "4096 | number_of_skipped_iterations=  0 | number_of_nan_iterations=  0 | "
               "samples_per_second=7.053 | tokens_per_gpu_per_second_tgs=1203.674 | "
               "[LM]-TFLOPs=49.66 | [DS]-TFLOPs=73.32 |")
    memory = ("[2024-06-21 10:50:42][INFO][utils:190] - [Rank 0] (after 1 iterations) memory "
              "(MB) | allocated: 18243.64111328125 | max allocated: 50664.2548828125 | "
              "reserved: 54556.0 | max reserved: 54556.0")
    a, b = parse_log_line(deepspeedai), parse_log_line(argonne)
    assert isinstance(a, StepRecord) and (a.step, a.seconds) == (2, pytest.approx(20.2983))
    assert a.loss == pytest.approx(25.37718) and a.program_tflops == {"TFLOPs": 49.17}
    assert isinstance(b, StepRecord) and (b.step, b.seconds) == (1, pytest.approx(108.8932))
    peak = 50664.2548828125 * 2**20
    assert parse_log_line(memory) == ("max_allocated_bytes", pytest.approx(peak))


def test_pipeline_engine_and_memory_lines() -> None:
    rec = parse_log_line(standin.pipe_line(4, 5.25, 0.321, 16))
    assert isinstance(rec, StepRecord) and rec.source == "deepspeed-pipe"
    assert (rec.step, rec.seconds, rec.loss) == (4, 0.321, 5.25)
    assert parse_log_line(standin.memory_line(0, 1, 1234.5)) == \
        ("max_allocated_bytes", 1234.5 * 2**20)
    assert parse_log_line("validation loss at iteration 10 | lm loss value: 5.1") is None


def test_metrics_file_garbage_is_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join([
        json.dumps({"step": 1, "seconds": 0.5, "loss": 5.0}),
        "not json", "[1, 2]", '{"step": "x", "seconds": 1}', '{"seconds": 1}',
        '{"step": 2, "seconds": -1}', '{"step": 2, "seconds": NaN}',
        json.dumps({"step": 2, "seconds": 0.25, "tokens": 1024, "peak_memory_bytes": 77}),
        json.dumps({"step": 2, "seconds": 9.0}),  # a repeated step
        "", '{"step": 3, "seconds": 0.3', json.dumps({"step": 3, "seconds": 0.3})]))
    records, garbage = read_metrics_file(path)
    assert [(r.step, r.seconds) for r in records] == [(1, 0.5), (2, 0.25), (3, 0.3)]
    assert garbage == 8
    assert records[1].tokens == 1024 and records[1].peak_memory_bytes == 77


def test_the_score_is_ours(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": i, "seconds": s}) + "\n"
                               for i, s in enumerate([9.0, 0.4, 0.5, 0.45], start=1)))
    log = tmp_path / "stdout.log"
    log.write_text(standin.deepspeedai_line(1, 4, 1.0, 5.0, 16, 64, 99.0, 2) + "\n")
    rb = read_back(metrics, [log], drop=1)
    assert rb.source == "metrics-file" and [r.step for r in rb.steady] == [2, 3, 4]
    res = measure(rb, model=MODEL, layout=LAYOUT, dtype="fp32", device="cpu",
                  peak_flops=None, expected_steps=4)
    assert res is not None and res.step_time_s == pytest.approx(0.45)
    expected = model_flops_per_step(MODEL, LAYOUT.global_batch) / (0.45 * 2) / 1e12
    assert res.model_tflops_per_device == pytest.approx(expected)
    assert res.step_times_s == [0.4, 0.5, 0.45] and res.extra["all_step_times_s"][0] == 9.0
    # Without a metrics file the Megatron line is the source, and its TFLOPs an extra only.
    rb = read_back(tmp_path / "none.jsonl", [log], drop=0)
    res = measure(rb, model=MODEL, layout=LAYOUT, dtype="fp32", device="cpu",
                  peak_flops=None, expected_steps=1)
    assert rb.source == "megatron-deepspeedai" and res is not None
    assert res.extra["program_tflops_per_device"] == {"TFLOPs": 99.0}
    assert not math.isclose(res.model_tflops_per_device or 0, 99.0)


def test_a_program_figure_printed_as_zero_is_below_its_precision(tmp_path: Path) -> None:
    # A tiny model on a CPU: Megatron prints "TFLOPs: 0.00" (two decimals).
    log = tmp_path / "stdout.log"
    log.write_text("".join(standin.deepspeedai_line(i, 3, 0.08, 5.0, 16, 64, 0.0, 2) + "\n"
                           for i in (1, 2, 3)))
    rb = read_back(tmp_path / "none.jsonl", [log], drop=1)
    res = measure(rb, model=MODEL, layout=LAYOUT, dtype="fp32", device="cpu",
                  peak_flops=None, expected_steps=3)
    assert res is not None and res.extra["program_tflops_per_device"] == {}
    assert res.extra["program_tflops_below_printed_precision"] == ["TFLOPs"]


def _report(**kw: object) -> LaunchReport:
    base: dict = {"result": None, "returncode": 1, "workload": "command",
                  "readback": {"source": None, "steps": 0, "expected": 4}}
    base.update(kw)
    return LaunchReport(**base)


@pytest.mark.parametrize("sig", OOM_SIGNATURES, ids=lambda s: s.text)
def test_every_oom_signature_is_classified_oom(sig: object) -> None:
    text = f"Traceback (most recent call last):\n  ...\nSomeError: ... {sig.text} ...\n"  # type: ignore[attr-defined]
    assert find_oom_signature(text, OOM_SIGNATURES) is not None
    outcome = classify(_report(log_text=text), OOM_SIGNATURES)
    assert outcome.kind == "oom" and outcome.infeasible
    # ... also when the program then hung and was killed for it (a consequence).
    assert classify(_report(log_text=text, no_progress=True), OOM_SIGNATURES).kind == "oom"


def test_foreign_outcomes_without_oom() -> None:
    assert classify(_report(interrupted=True)).kind == "interrupted"
    assert classify(_report(timed_out=True)).kind == "timeout"
    stalled = classify(_report(no_progress=True, no_progress_reason="no new step after step 2"))
    assert stalled.kind == "timeout" and "no new step" in stalled.reason
    crashed = classify(_report(returncode=-9, stderr_tail="boom"))
    assert crashed.kind == "error" and "SIGKILL" in crashed.reason and "boom" in crashed.reason
    assert classify(_report(scheduler_state="OUT_OF_MEMORY")).kind == "oom"


def test_no_progress_watch(tmp_path: Path) -> None:
    now = [0.0]
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("")
    watch = ProgressWatch(StepCounter([metrics]), first_step_s=10, no_progress_s=3,
                          expected_steps=3, clock=lambda: now[0])
    now[0] = 9.0
    assert not watch.stalled()          # start-up may take 10 s
    with open(metrics, "a") as fh:
        fh.write('{"step": 1, "seconds": 0.1}\n{"step": 2, "sec')  # half a line
    assert not watch.stalled() and watch.counter.steps == 1
    now[0] = 12.5
    assert watch.stalled() and "after step 1" in watch.describe()
    with open(metrics, "a") as fh:
        fh.write('onds": 0.1}\n{"step": 3, "seconds": 0.1}\n')
    assert not watch.stalled() and watch.counter.steps == 3
    now[0] = 1000.0
    assert not watch.stalled()          # every step seen: it is finishing


def _spec(layout: Layout = LAYOUT) -> TrialSpec:
    return TrialSpec(model=MODEL, layout=layout, run=RunConfig(device="cpu", measure_precision=None,
                                                               warmup_steps=1,
                                                               measure_steps=3))


def test_local_command_line_of_a_command_workload(tmp_path: Path) -> None:
    from autotune.config.cluster import ClusterConfig
    from autotune.workloads.foreign import CommandWorkload

    cfg = WorkloadConfig(kind="command", argv=("python", "-c", "pass", "{micro_batch}",
                                               "{ds_config}", "{train_iters}"))
    launcher = LocalLauncher()
    launcher.workload = CommandWorkload(cfg, ClusterConfig(devices_per_node=2, device="cpu"))
    paths = TrialPaths(tmp_path / "t")
    cmd = launcher.command(_spec(), paths)
    assert cmd[cmd.index("--no-python") + 1:] == ["python", "-c", "pass", "2",
                                                  str(paths.ds_config), "4"]
    assert "--nproc-per-node=2" in cmd
    none = CommandWorkload(WorkloadConfig(kind="command", outer="none", argv=(
        "python", "-c", "pass", "--nproc={ranks_per_node}", "--port={master_port}")),
        ClusterConfig(devices_per_node=2, device="cpu"))
    launcher.workload = none
    cmd = launcher.command(_spec(), paths)
    assert cmd[:4] == ["python", "-c", "pass", "--nproc=2"] and "torch.distributed.run" \
        not in " ".join(cmd)


def test_slurm_step_of_foreign_workloads(tmp_path: Path) -> None:
    from autotune.config.cluster import ClusterConfig
    from autotune.workloads.foreign import MegatronWorkload

    script = tmp_path / "pretrain_gpt.py"
    script.write_text("")
    cluster = ClusterConfig(nodes=2, devices_per_node=4, device="h100")
    launcher = SlurmLauncher(devices_per_node=4, env={"SLURM_JOB_ID": "42",
                                                      "SLURM_JOB_NODELIST": "n[1-4]"})
    launcher.workload = MegatronWorkload(
        WorkloadConfig(kind="megatron-deepspeed", script=str(script),
                       args=("--data-path", "d", "--tensorboard-dir", "{trial_dir}/tb")),
        cluster)
    lay = Layout(tp=2, pp=2, dp=2, micro_batch=1, grad_accum=4, recompute="full")
    paths = TrialPaths(tmp_path / "s" / "trial-00001-k")
    cmd = launcher.command(_spec(lay), paths, timeout_s=600)
    assert "--ntasks=8" in cmd and "--ntasks-per-node=4" in cmd
    assert not any(a.startswith("--nodelist") for a in cmd)  # SLURM picks, rank_env reads
    program = cmd[cmd.index("autotune.workloads.rank_env") + 2:]
    assert program[1] == str(script) and program[2:6] == ["--data-path", "d",
                                                          "--tensorboard-dir",
                                                          f"{paths.root}/tb"]
    for flag in ("--tensor-model-parallel-size", "--recompute-granularity", "--train-iters",
                 "--deepspeed_config", "--num-layers"):
        assert flag in program
    assert "--no-pipeline-parallel" not in program and "--save" not in program
    assert program[program.index("--eval-iters") + 1] == "0"
    # outer: none: one task per node, pinned, so that {master_addr} is the step's first node.
    launcher.workload = MegatronWorkload(
        WorkloadConfig(kind="megatron-deepspeed", script=str(script), outer="none",
                       python="python", args=("--data-path", "d", "--host", "{master_addr}")),
        cluster)
    cmd = launcher.command(_spec(lay), paths, timeout_s=600)
    assert "--ntasks=2" in cmd and "--ntasks-per-node=1" in cmd and "--nodelist=n1,n2" in cmd
    assert cmd[cmd.index("--host") + 1] == "n1" and "autotune.workloads.rank_env" not in cmd
