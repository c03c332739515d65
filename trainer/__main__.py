"""``python -m trainer --spec SPEC.json --result RESULT.json [--spec ... --result ...]``

Start it under ``torchrun``, ``srun`` (one task per device) or ``mpiexec``; without a
launcher it runs as a single rank. Several ``--spec/--result`` pairs run one after the
other in the same process group (same world size), which saves the start-up per trial.
Exit codes: 0 ok, 1 a trial failed (status ``error`` or ``oom``), 2 an invalid spec or
invalid arguments. See ``docs/trainer.md``.
"""

from __future__ import annotations

import argparse
import sys

import trainer.timeline  # noqa: F401  (first: it stamps the process start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", action="append", required=True, help="trial spec (JSON)")
    parser.add_argument("--result", action="append", required=True,
                        help="where rank 0 writes the result (JSON), one per --spec")
    args = parser.parse_args(argv)
    if len(args.spec) != len(args.result):
        parser.error(f"got {len(args.spec)} --spec but {len(args.result)} --result; "
                     "give them in pairs")
    from trainer.run import run_trials

    return run_trials(list(zip(args.spec, args.result, strict=True)))


if __name__ == "__main__":
    sys.exit(main())
