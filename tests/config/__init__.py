"""Tests of autotune/config/ (one file per module where the module has its own) and of the
study-file loader that builds those configs (autotune/spec.py)."""
