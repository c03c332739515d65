"""The study runner: propose a layout, check it, measure it, record it; resume anywhere.

Nothing is imported here, on purpose: readers of what the runner stored
(:mod:`autotune.report`, :mod:`autotune.results`) import :mod:`autotune.runner.records`
without loading the loop or a launcher.
"""
