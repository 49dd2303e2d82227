"""spark-submit entry point: retention, compaction and vacuum of the Delta tables, safe while
the streams run.

    spark-submit jobs/maintain.py --data DATA [--table-retention FILE] [--dry-run]
    spark-submit jobs/maintain.py --table T [--table T2 ...] [--stream CKPT=T,...]

Delta's DELETE (rows past their table's retention), OPTIMIZE and VACUUM
(delta-spark) delete rows and rewrite and delete the files, in
this job's session (it also runs as ``qmf maintain`` and from cron). Only
argument wiring lives here; the logic is in ``pipeline.lake.maintain``
(docs/maintenance.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pipeline.commands.maintain import add_arguments, run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="maintain", description=__doc__.splitlines()[0])
    add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
