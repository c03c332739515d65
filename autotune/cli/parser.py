"""The ``autotune`` command line's flags: one subparser per command, each bound to its
handler in :mod:`autotune.cli.commands`."""

from __future__ import annotations

import argparse

from autotune.cli import commands as c
from autotune.planning import DEFAULT_TOP
from autotune.util.argtypes import positive_int

__all__ = ["build_parser"]


# -- parser ---------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from autotune.cli.help import EMIT_HELP, OUT_HELP, STORAGE_HELP, top_parser
    from autotune.report.job_flags import add_job_flags
    from autotune.runner.confirm_options import add_confirm_arguments

    p = top_parser()
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("run", help="run (or resume) a study: measure layouts, store results")
    r.add_argument("study", metavar="STUDY.yaml")
    r.add_argument("--storage", metavar="URL", help="database URL (overrides the study file)")
    r.add_argument("--n-trials", type=positive_int, metavar="N",
                   help="total measured trials the study should reach (resumes count)")
    r.add_argument("--timeout", type=c._positive_float, metavar="S",
                   help="stop after S seconds (the confirmation round included)")
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    add_confirm_arguments(r)
    r.add_argument("--retry-failed", action="store_true",
                   help="resume a study stopped because its trials failed alike "
                   "(search.stop_on_repeated_error), measuring those layouts again")
    r.add_argument("--no-learn", action="store_true",
                   help="do not warm-start the calibration from earlier studies in the "
                   "database (search.learn_from_database: false)")
    r.set_defaults(func=c.cmd_run)

    s = sub.add_parser("status", help="trials by outcome, best so far, running trials")
    s.add_argument("study", nargs="?", metavar="STUDY", help="study file or name (default: all)")
    s.add_argument("--storage", metavar="URL", help=STORAGE_HELP)
    s.set_defaults(func=c.cmd_status)

    b = sub.add_parser("best", help="the best layout, as JSON or a ready launch config")
    b.add_argument("study", metavar="STUDY", help="study file or name")
    b.add_argument("--storage", metavar="URL", help=STORAGE_HELP)
    b.add_argument("--emit", choices=("json", "deepspeed", "megatron-deepspeed", "command",
                                      "slurm"), default="json", help=EMIT_HELP)
    b.add_argument("--out", metavar="DIR", help=OUT_HELP)
    add_job_flags(b)
    b.set_defaults(func=c.cmd_best)

    pl = sub.add_parser("plan", help="rank every layout by the cost model; list exclusions")
    pl.add_argument("study", metavar="STUDY.yaml")
    pl.add_argument("--top", type=positive_int, metavar="K",
                    help=f"list the K best predicted layouts (default: {DEFAULT_TOP})")
    pl.add_argument("--storage", metavar="URL",
                    help="database to calibrate from (overrides the study file)")
    pl.add_argument("--format", choices=("table", "csv", "json"), default="table")
    pl.add_argument("--no-learn", action="store_true",
                    help="calibrate on the study's own measurements only, not on earlier "
                    "studies' (search.learn_from_database: false)")
    pl.add_argument("--scaling", choices=("weak", "strong"),
                    help="the scaling curve instead: the best layout predicted at each size "
                    "(docs/scaling.md), measured beside it where the database has it")
    pl.add_argument("--nodes", metavar="N1,N2", help="with --scaling: the node counts "
                    "(default: 1, 2, 4, ... up to the study's cluster)")
    pl.add_argument("--devices", metavar="D1,D2",
                    help="with --scaling: devices of one node instead of nodes")
    pl.add_argument("--reference", action="append", metavar="SIZE=PCT",
                    help="with --scaling: a published efficiency to show beside the "
                    "prediction, e.g. 128=93 (repeatable)")
    pl.set_defaults(func=c.cmd_plan)

    sc = sub.add_parser("scaling", help="tune the study at several sizes (weak or strong "
                        "scaling); the table, its CSV and plot")
    sc.add_argument("study", metavar="STUDY.yaml")
    sc.add_argument("--mode", choices=("weak", "strong"), required=True,
                    help="weak: the global batch grows with the size; strong: it is fixed")
    sc.add_argument("--nodes", metavar="N1,N2", help="node counts, e.g. 1,2,4")
    sc.add_argument("--devices", metavar="D1,D2",
                    help="devices of one node instead, e.g. 1,2,4")
    sc.add_argument("--storage", metavar="URL", help="database URL (overrides the study file)")
    sc.add_argument("--n-trials", type=positive_int, metavar="N",
                    help="measured trials per size (resumes count)")
    sc.add_argument("--csv", metavar="FILE", help="write the table as CSV")
    sc.add_argument("--report", metavar="DIR", help="write scaling.md/.html, .png, .csv")
    sc.add_argument("--format", choices=("md", "html"),
                    help="with --report: the report's format (default: md)")
    sc.add_argument("--no-predict", action="store_true",
                    help="measured rows only (no cost-model curve)")
    sc.add_argument("--table-only", action="store_true",
                    help="run nothing: the table of what the database has")
    sc.add_argument("--campaign-studies", action="store_true",
                    help="run nothing: print the studies: entries of a campaign file that "
                    "runs each size as its own study (one job array per size)")
    sc.add_argument("--quiet", action="store_true", help="no progress lines")
    sc.set_defaults(func=c.cmd_scaling)

    pf = sub.add_parser("profile", help="measure the layer times of a study's shapes (or "
                        "fit them from a measured table) for the cost model")
    pf.add_argument("study", nargs="?", metavar="STUDY.yaml")
    pf.add_argument("--out", metavar="FILE", help="profile file to write or extend "
                    "(default: the study's cluster.profile, else profiles/STUDY-NAME.json)")
    pf.add_argument("--layers", type=c._layer_counts, metavar="L1,L2",
                    help="layer counts of the runs (default: 1,3)")
    pf.add_argument("--top", type=positive_int, metavar="K",
                    help="only the shapes of the K best predicted layouts")
    pf.add_argument("--from-landscape", metavar="CSV",
                    help="fit from a measured table (vTrain or Aurora format; a path or a "
                    "shipped table's name) instead")
    _table_arguments(pf, "with --from-landscape: ")
    pf.add_argument("--quiet", action="store_true", help="no progress lines")
    pf.set_defaults(func=c.cmd_profile)

    ls = sub.add_parser("landscapes", help="the groups of a measured table (vTrain or "
                        "Aurora CSV) a replayed study can match")
    ls.add_argument("table", metavar="CSV", help="the table's path, or the name of a "
                    "shipped one (data/landscapes/: vtrain_a100_single_node.csv, "
                    "aurora_pvc_70b.csv)")
    _table_arguments(ls, "")
    ls.add_argument("--format", choices=("table", "json"), default="table")
    ls.set_defaults(func=c.cmd_landscapes)

    rp = sub.add_parser("report", help="a study's report: tables, plots, CSV/Parquet exports")
    rp.add_argument("study", nargs="?", metavar="STUDY", help="study file or name")
    rp.add_argument("--storage", metavar="URL", help=STORAGE_HELP)
    rp.add_argument("--out", metavar="DIR",
                    help="report directory (default: reports/STUDY, reports/campaign)")
    rp.add_argument("--format", choices=("md", "html"), default="md")
    rp.add_argument("--all", action="store_true",
                    help="cross-study view of every measurement in the database")
    rp.add_argument("--device-type", metavar="NAME", help="with --all: only this device type")
    rp.add_argument("--model", metavar="NAME", help="with --all: only this model name")
    rp.add_argument("--quiet", action="store_true", help="no progress lines")
    rp.set_defaults(func=c.cmd_report)

    d = sub.add_parser("dashboard", help="optuna-dashboard on the study database (localhost)")
    d.add_argument("study", nargs="?", metavar="STUDY.yaml",
                   help="take the storage URL from this study file")
    d.add_argument("--storage", metavar="URL", help="database URL (default: the study "
                   "file's, else sqlite:///autotune.db)")
    d.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only)")
    d.add_argument("--port", type=c._port, default=8080,
                   help="port to listen on (default: 8080; one in use is refused)")
    d.set_defaults(func=c.cmd_dashboard)

    from autotune.campaign.cli import add_parser as add_campaign_parser

    add_campaign_parser(sub).set_defaults(func=c.cmd_campaign)
    return p


def _table_arguments(parser: argparse.ArgumentParser, when: str) -> None:
    """What a table's file does not say about its runs (``load_landscape``'s options)."""
    parser.add_argument("--hardware", metavar="NAME",
                        help=f"{when}device of a table that does not name it")
    parser.add_argument("--devices-per-node", type=positive_int, metavar="N",
                        help=f"{when}node size of a table that does not give it")
    parser.add_argument("--vocab-size", type=positive_int, metavar="V",
                        help=f"{when}vocabulary of the runs (default: the format's, 51200 "
                        "for vTrain, 32000 for Aurora)")
    parser.add_argument("--attention", choices=("flash", "explicit"),
                        help=f"{when}attention of the runs (default: the format's, "
                        "explicit for vTrain, flash for Aurora)")
