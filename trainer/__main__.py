"""``python -m trainer --spec SPEC.json --result RESULT.json [--spec ... --result ...]``

Start it under ``torchrun``, ``srun`` (one task per device) or ``mpiexec``; without a
launcher it runs as a single rank. Several ``--spec/--result`` pairs run one after the
other in the same process group (same world size), which saves the start-up per trial.
Exit codes: 0 ok, 1 a trial failed (status ``error`` or ``oom``), 2 an invalid spec or
invalid arguments. ``--rotation SCHEDULE.json`` instead measures several candidates'
engines side by side in this launch (:mod:`trainer.rotation`). ``--hold WORD.json
--hold-s S`` keeps a batch's launch up after its last trial until the runner's word: a
rotation to run in these processes, or exit (:mod:`trainer.hold`). See ``docs/trainer.md``.
"""

from __future__ import annotations

import argparse
import os
import sys

import trainer.timeline  # noqa: F401  (first: it stamps the process start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", action="append", default=[], help="trial spec (JSON)")
    parser.add_argument("--result", action="append", default=[],
                        help="where rank 0 writes the result (JSON), one per --spec")
    parser.add_argument("--rotation", help="a confirmation schedule (JSON, trainer.rotation)")
    parser.add_argument("--hold", help="after the batch, wait for the runner's word in this "
                        "file (trainer.hold)")
    parser.add_argument("--hold-s", type=float, default=120.0,
                        help="how long to wait for the word before ending (default 120)")
    args = parser.parse_args(argv)
    if args.hold_s <= 0:
        parser.error(f"--hold-s: got {args.hold_s}; allowed: a number of seconds > 0")
    if args.rotation is not None:
        if args.hold is not None:
            parser.error("--rotation takes no --hold (a rotation is a launch's last work)")
        if args.spec or args.result:
            parser.error("--rotation takes no --spec/--result (the schedule names them)")
        from trainer.rotation import run_rotation

        return run_rotation(args.rotation)
    if not args.spec:
        parser.error("--spec is required (or --rotation)")
    if len(args.spec) != len(args.result):
        parser.error(f"got {len(args.spec)} --spec but {len(args.result)} --result; "
                     "give them in pairs")
    from trainer.run import run_trials

    return run_trials(list(zip(args.spec, args.result, strict=True)),
                      hold=(args.hold, args.hold_s) if args.hold is not None else None)


def _leave(code: int) -> None:
    """Exit once every result is written, without the interpreter's teardown.

    The results are files written atomically and closed; what the teardown would still
    run are the destructors and ``atexit`` hooks of DeepSpeed, torch and gloo objects of
    the launch, in no order of ours. On a loaded machine a rank failing there makes a launch
    exit 1 after rank 0 has written an ok result, so the exit code would say
    "failed" of trials that were measured. The process groups are destroyed by then
    (``trainer.launch.close_launch``); the output is flushed here."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _leave(main())
