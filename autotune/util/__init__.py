"""Small helpers every layer shares, none of which knows autotune's concepts: writing a
file atomically (:mod:`~autotune.util.atomic`), SLURM's compressed host lists
(:mod:`~autotune.util.hostlist`), and standard streams that survive a closed pipe
(:mod:`~autotune.util.streams`)."""
