"""The study runner: propose a layout, check it, measure it, record it; resume anywhere.

========================  ==============================================================
module                    owns
========================  ==============================================================
``study.py``              the loop: :func:`~autotune.runner.study.run_study`, one worker
                          per launcher, repair, retries, claims, budget
``optuna_io.py``          reading the Optuna study: open (fingerprint), history for the
                          strategy, a layout's trial parameters
``budget.py``             the one rule that says a study is done
``learning.py``           the calibration warm start from earlier studies' measurements,
                          refit after each trial; the calibrated constraints and candidates
``recovered.py``          a cut-short execution's finished result, recorded by its retry
``stop_early.py``         the study stops when trials fail alike on different layouts
                          (the program is broken); a resumed one asks first
``lifecycle.py``          lease renewals while a trial or a confirmation round runs (a
                          lost lease abandons its launch); SIGINT/SIGTERM
``progress.py``           progress lines, the trial table and the stop messages
``param_space.py``        the distributions a trial's parameters are stored with
``verdict_note.py``       the confirmation verdict as a user attribute and dashboard note
========================  ==============================================================

What a trial is and how its outcome is decided live below the runner
(:mod:`autotune.trial`); the keys it stores and the ``measurements`` row live in
:mod:`autotune.storage.records`, so that readers of a study (the report, ``status``) read
storage, never the runner. Nothing is imported here, on purpose.
"""
