"""Planning a study: its layout space, the cost model's ranking of it, ``autotune plan``.

==================  ================================================================
module              owns
==================  ================================================================
``space.py``        every layout of a study's search axes that makes whole numbers
``candidates.py``   the feasible layouts, ranked by the cost model (what the search
                    draws from)
``plan.py``         ``autotune plan``: the ranked space and why each layout is out
==================  ================================================================
"""

DEFAULT_TOP = 20
"""Layouts ``autotune plan`` lists without ``--top`` (here, not in ``plan.py``: the
command line's help reads it without loading the cost model)."""
