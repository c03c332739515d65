"""Analytic models: FLOPs (:mod:`.flops`), memory (:mod:`.memory`), step time (:mod:`.cost`).

Every formula lives in one documented function that cites its source.
"""
