"""spark-submit entry point: re-derive silver and gold for a time range from bronze.

    spark-submit jobs/backfill.py --data DATA --from 2027-01-15T08:00:00Z --to 2027-01-15T09:00:00Z \
        [--dry-run] [--layers silver,gold] [--bronze B --silver S --gold G]

The range is ``[from, to)``; a rerun replaces it exactly (one Delta commit per
table, app transaction ``qmf-backfill-<from>-<to>``). Only argument wiring
lives here; the logic and the range semantics are in ``pipeline.backfill``
(docs/backfill.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pipeline.backfill import add_arguments, run_from_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="backfill", description=__doc__.splitlines()[0])
    add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run_from_args(build_parser().parse_args(argv), "backfill")


if __name__ == "__main__":
    sys.exit(main())
