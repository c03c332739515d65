"""``autotune``: the command line. Thin: parse, call the library, map errors to exit codes.

Exit codes: 0 ok; 1 failure (a database that cannot be reached, a study whose trials all
failed); 2 usage error (bad flags, bad study file, impossible search space); 130 when
interrupted by Ctrl-C (the running trial is killed and left to be retried).
"""

from __future__ import annotations

import argparse
import errno
import sys
from collections.abc import Sequence

from autotune.cli.commands import (
    EXIT_FAIL,
    EXIT_INTERRUPT,
    EXIT_OK,
    EXIT_USAGE,
    Handler,
    cmd_plan,
    quiet_optuna,
)
from autotune.cli.parser import build_parser
from autotune.errors import AutotuneError, UsageError

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_FAIL", "EXIT_USAGE", "EXIT_INTERRUPT"]

_PATH_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                          errno.EROFS, errno.ENAMETOOLONG, errno.EEXIST})
"""A path the user named that cannot be used as one (a usage error, exit 2); any other
failure of a file (a full disk, an I/O error) exits 1."""


def main(argv: Sequence[str] | None = None) -> int:
    from autotune.util.streams import closed_pipes_survived

    with closed_pipes_survived():  # first: a reader that goes away never ends the run
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.func is not cmd_plan:  # `plan` quiets Optuna only where it opens a database
        quiet_optuna()
    handler: Handler = args.func
    try:
        _refuse_empty(args)
        return handler(args)
    except UsageError as err:
        print(f"autotune: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except AutotuneError as err:
        print(f"autotune: error: {err}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPT
    except BrokenPipeError:  # a stream not wrapped by survive_closed_pipes (a library's)
        return EXIT_OK
    except OSError as err:
        if err.filename is None:  # not a file the command was told to read or write
            raise
        # An output folder that cannot be made, a file that cannot be written (--out /proc/x,
        # a read-only or full filesystem): the path and the system's reason, not a traceback.
        print(f"autotune: error: {err.filename}: {err.strerror}", file=sys.stderr)
        return EXIT_USAGE if err.errno in _PATH_ERRNOS else EXIT_FAIL
    except Exception as err:
        # The storage wraps every database call (autotune.storage.guarded); one that
        # escaped it is still a database failure, never a traceback.
        from autotune.storage import database_error, one_line

        if not database_error(err):
            raise
        print(f"autotune: error: database error: {one_line(err)}", file=sys.stderr)
        return EXIT_FAIL


_POSITIONALS = {"study": "STUDY", "table": "CSV", "file": "CAMPAIGN"}
"""The positional arguments' names in the usage lines (their ``metavar``)."""


def _refuse_empty(args: argparse.Namespace) -> None:
    """An empty value (``--storage "$URL"`` with ``URL`` unset) is an error naming the
    option: the commands read an empty string as the option left out, so ``--storage ""``
    used the study file's database and ``--out ""`` the default folder, silently."""
    for dest, value in vars(args).items():
        if isinstance(value, str) and not value.strip():
            name = _POSITIONALS.get(dest, "--" + dest.replace("_", "-"))
            raise UsageError(f"{name}: got {value!r}; allowed: a non-empty value (an unset "
                             "shell variable?)")


if __name__ == "__main__":
    sys.exit(main())
