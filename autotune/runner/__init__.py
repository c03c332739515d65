"""The study runner: propose a layout, check it, measure it, record it; resume anywhere.

========================  ==============================================================
module                    owns
========================  ==============================================================
``study.py``              the loop: :func:`~autotune.runner.study.run_study`, one worker
                          per launcher, repair, retries, claims, budget
``optuna_io.py``          reading the Optuna study: open (fingerprint), history for the
                          strategy, a layout's trial parameters
``budget.py``             the one rule that says a study is done
``outcome.py``            what a trial did → its outcome and Optuna state (the one place)
``records.py``            every key stored on trials and studies, its writers and readers;
                          the ``measurements`` row
``stop_early.py``         the study stops when trials fail alike on different layouts
                          (the program is broken); a resumed one asks first
``lifecycle.py``          lease renewals while a trial runs; SIGINT/SIGTERM
``progress.py``           progress lines, the trial table and the stop messages
========================  ==============================================================

Nothing is imported here, on purpose: readers of what the runner stored
(:mod:`autotune.report`, :mod:`autotune.results`) import :mod:`autotune.runner.records`
without loading the loop or a launcher.
"""
