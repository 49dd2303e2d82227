"""``qmf alert-rules``: the Prometheus alert rules over ``qmf serve-metrics``, from thresholds.

Without ``--config`` the rules of the default thresholds (the file shipped as
``deploy/prometheus/qmf-alerts.rules.yml``); with it, those of a TOML file of
thresholds (keys: ``pipeline.views.alerts.AlertThresholds``; docs/alerts.md). A bad
threshold is refused before anything is written, naming the key.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "alert-rules", help="Prometheus alert rules over qmf serve-metrics", description=__doc__
    )
    p.add_argument("--config", metavar="FILE", help="thresholds (TOML); default: the defaults")
    p.add_argument("--output", "-o", metavar="FILE", default="-",
                   help="where to write the rules file (default: standard output)")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.views.alerts import AlertThresholds, ThresholdError, render

    try:
        thresholds = AlertThresholds.load(args.config) if args.config else None
    except ThresholdError as exc:
        print(f"qmf alert-rules: {exc}", file=sys.stderr)
        return 2
    text = render(thresholds)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0
