"""One short, measured GPT training trial under torchrun, srun or mpiexec.

Run: ``torchrun --nproc-per-node 4 -m trainer --spec trial.json --result result.json``
(``docs/trainer.md``). The package imports nothing heavy; torch and DeepSpeed are imported
after the spec has been validated, so that a bad spec fails in well under a second.
"""
