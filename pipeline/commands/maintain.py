"""``qmf maintain``: delete rows past their retention, compact small files and vacuum old ones
in every table, streams running or not.

    qmf maintain --data data                      # every table of a `qmf run --data` folder
    qmf maintain --table data/bronze --stream data/checkpoints/silver=data/bronze
    qmf maintain --data data --table-retention retention.toml   # keeps of your own

Safe while the streams run (docs/maintenance.md): compaction commits carry
no data change (Delta's streaming source skips them), retention deletes are
skipped by the jobs' streams (skipChangeCommits), writers that remove
files share a table lock with it, app transactions are kept, and vacuum
spares every version a checkpoint may still read, plus ``--retention-hours``.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.lake.maintain import JobMaintenance


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options shared by ``qmf maintain`` and ``jobs/maintain.py``."""
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--data", help="a `qmf run --data` folder: DATA/bronze, DATA/silver/*, "
                       "DATA/gold/*, checkpoints from DATA/checkpoints")
    where.add_argument("--table", action="append", metavar="PATH",
                       help="a table to maintain (repeatable)")
    p.add_argument("--stream", action="append", default=[], metavar="CHECKPOINT[=TABLE,...]",
                   help="with --table: a streaming checkpoint and the tables it reads "
                        "(Delta's source); without =TABLES its offsets pin every table")
    p.add_argument("--retention-hours", type=int, default=None,
                   help="removed files younger than this are kept (default 168)")
    p.add_argument("--table-retention", metavar="FILE",
                   help="TOML whose [retention] table sets how long tables keep their rows "
                        "(e.g. bronze = \"3d\", statistic_rates = \"forever\"); "
                        "default: the defaults (README, docs/maintenance.md)")
    p.add_argument("--no-row-retention", action="store_true",
                   help="delete no row (compact and vacuum only)")
    p.add_argument("--target-size", type=int, default=None, metavar="BYTES",
                   help="size of compacted files (default 128 MiB)")
    p.add_argument("--min-files", type=int, default=None,
                   help="compact a table only with at least this many small files (default 10)")
    p.add_argument("--parallel", type=int, default=None,
                   help="tables maintained at once (default 2)")
    p.add_argument("--no-compact", action="store_true", help="vacuum only")
    p.add_argument("--no-vacuum", action="store_true", help="compact only")
    p.add_argument("--dry-run", action="store_true", help="report, change nothing")  # fmt: skip


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """A streaming job's own maintenance (``jobs/bronze.py``, ``silver.py``, ``gold.py``):
    its tables maintained between its micro-batches, the way for tables on a bucket."""
    g = p.add_argument_group("maintenance between micro-batches")
    g.add_argument("--maintain-every", type=float, default=None, metavar="SECONDS",
                   help="after a batch, once this long has passed since the last pass, delete "
                        "rows past their retention, compact and vacuum this job's tables "
                        "(the way on an object store, where `qmf maintain` is refused)")
    g.add_argument("--retention-hours", type=int, default=None,
                   help="removed files younger than this are kept (default 168)")
    g.add_argument("--table-retention", metavar="FILE",
                   help="TOML [retention] keeps of your own (as `qmf maintain`'s)")
    g.add_argument("--no-row-retention", action="store_true", help="delete no row")
    g.add_argument("--min-files", type=int, default=None,
                   help="compact a table only with at least this many small files (default 10)")


def job_maintenance(args: argparse.Namespace) -> JobMaintenance | None:
    """The job's ``JobMaintenance`` from ``add_job_arguments``' options (None: not asked
    for). A bad keep file raises ``RetentionError`` naming it."""
    from pipeline.lake.maintain import JobMaintenance, MaintainSettings
    from pipeline.lake.retention import RetentionPolicy

    if args.maintain_every is None:
        return None
    policy = RetentionPolicy.load(args.table_retention)
    if args.no_row_retention:
        policy = RetentionPolicy(policy.rules, enabled=False)
    given = {k: getattr(args, k) for k in ("retention_hours", "min_files")}
    settings = MaintainSettings(
        retention=policy, parallel=1, **{k: v for k, v in given.items() if v is not None}
    )
    return JobMaintenance(args.maintain_every, settings)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "maintain", help="compact and vacuum the Delta tables", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.lake.maintain import (
        MaintainSettings,
        StreamCheckpoint,
        data_streams,
        data_tables,
        maintain,
    )
    from pipeline.lake.retention import RetentionError, RetentionPolicy

    logging.basicConfig(level=logging.WARNING)
    try:
        policy = RetentionPolicy.load(args.table_retention)
    except RetentionError as exc:
        print(f"qmf maintain: {exc}")
        return 2
    if args.no_row_retention:
        policy = RetentionPolicy(policy.rules, enabled=False)
    options = ("retention_hours", "target_size", "min_files", "parallel")
    given = {k: getattr(args, k) for k in options}
    settings = MaintainSettings(
        dry_run=args.dry_run, compact=not args.no_compact, vacuum=not args.no_vacuum,
        retention=policy,
        **{k: v for k, v in given.items() if v is not None},
    )  # fmt: skip
    if args.data:
        tables, streams = data_tables(args.data), data_streams(args.data)
    else:
        tables = list(args.table)
        streams = []
        for spec in args.stream:
            ckpt, sep, reads = spec.partition("=")
            names = tuple(t for t in reads.split(",") if t) if sep else None
            streams.append(StreamCheckpoint(ckpt, names))
    reports = maintain(tables, streams, settings)
    for r in reports:
        print(r.line())
    before = sum(r.files_before for r in reports)
    after = sum(r.files_after for r in reports)
    vacuumed = sum(len(r.vacuumed) for r in reports)
    verb = "would delete" if settings.dry_run else "deleted"
    print(f"qmf maintain: {len(reports)} tables, files {before} -> {after}, {verb} {vacuumed}")
    return 1 if any(n.startswith("failed") for r in reports for n in r.notes) else 0
