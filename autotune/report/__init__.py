"""Seeing and using results: reports, plots and exporters of the best layout."""

DEFAULT_JOB_TIME = "01:00:00"
"""The production job's time limit without ``best --emit slurm --time`` (``JobOptions``'
default; here, not in ``job_script.py``: the command line's help reads it without
loading Optuna)."""
