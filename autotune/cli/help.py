"""The words of ``autotune --help``: what the tool is for, the first commands to try, the
exit codes, ``--version``, and help texts that several commands share."""

from __future__ import annotations

import argparse

from autotune import __version__

__all__ = ["DESCRIPTION", "EPILOG", "STORAGE_HELP", "EMIT_HELP", "OUT_HELP", "top_parser"]

DESCRIPTION = ("Find the fastest parallel layout (tensor, pipeline and data parallelism,\n"
               "micro-batch, ZeRO, recompute) of a GPT training job: measure short trials,\n"
               "store every result, hand off the best.")
EPILOG = """first steps:
  autotune plan studies/cpu_demo.yaml     rank the layouts by the cost model (no run)
  autotune run studies/cpu_demo.yaml      measure them (Ctrl-C stops; run again resumes)
  autotune status                         what the database holds
  autotune report cpu-demo --format html  plots and tables
  autotune best cpu-demo --emit slurm --site NAME --steps N
                                          a job script for the production run
exit codes: 0 ok, 1 failure, 2 usage error, 130 interrupted; docs/guide.md"""

STORAGE_HELP = ("database URL (default: the study file's, else sqlite:///autotune.db); "
                "a SQLite file must exist")
EMIT_HELP = ("command: the launch line of the study's own workload (workload.kind command or "
             "megatron-deepspeed); slurm: a job script for the production run (docs/guide.md)")
OUT_HELP = ("where --emit deepspeed/command writes ds_config.json and --emit slurm its job "
            "script (default: .)")


def top_parser() -> argparse.ArgumentParser:
    """The ``autotune`` parser, before its commands: description, first steps, version."""
    p = argparse.ArgumentParser(prog="autotune", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"autotune {__version__}")
    return p
