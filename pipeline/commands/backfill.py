"""``qmf backfill``: re-derive silver and gold for a time range from bronze (as jobs/backfill.py)."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from pipeline.backfill import add_arguments

    p = subparsers.add_parser(
        "backfill",
        help="re-derive silver and gold for a time range from bronze (idempotent)",
        description=__doc__,
    )
    add_arguments(p)
    p.add_argument(
        "--keep-spark", action="store_true", help=argparse.SUPPRESS
    )  # in-process callers (tests) keep their SparkSession
    p.set_defaults(func=backfill)


def backfill(args: argparse.Namespace) -> int:
    from pipeline.backfill import run_from_args

    return run_from_args(args, "qmf backfill", stop_spark=not args.keep_spark)
