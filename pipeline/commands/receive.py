"""``qmf receive``: run the receiver, landing messages durably before settling them."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Hook for pipeline.cli."""
    from receivers.cliopts import (
        add_broker_args,
        add_console_args,
        add_subscription_args,
        default_landing_root,
    )

    p: argparse.ArgumentParser = subparsers.add_parser(
        "receive",
        help="receive QMF messages into the landing log",
        description="Subscribe to the broker and land every message (fsynced Arrow "
        "segments) before settling it. Stops cleanly on SIGTERM/SIGINT.",
    )
    add_broker_args(p)
    add_subscription_args(p)
    add_console_args(p)
    p.add_argument("--landing", default=None, help="landing log root (default .qmf/landing)")
    p.add_argument(
        "--partition",
        default=None,
        help="landing partition (default <host>-<n>, the first one no other receiver holds)",
    )
    p.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    p.add_argument("--stats-interval", type=float, default=0.0, help="log counters every S seconds")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=run, _landing_default=default_landing_root)


def run(args: argparse.Namespace) -> int:
    """Run until signalled (or ``--duration``); exit 1 with a clear message on fatal errors."""
    from receivers.cliopts import receiver_config
    from receivers.config import ConfigError
    from receivers.receiver import LandingSink, QmfReceiver, ReceiverError

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    log = logging.getLogger("qmf.receive")
    try:
        cfg = receiver_config(args)
        sink = LandingSink(args.landing or args._landing_default(), args.partition)
    except (ConfigError, ReceiverError, ValueError) as exc:
        print(f"qmf receive: {exc}", file=sys.stderr)
        return 2
    receiver = QmfReceiver(cfg, sink)
    receiver.on_ready = lambda r: print(
        f"ready: subscribed to {', '.join(r.sources)}", file=sys.stderr, flush=True
    )
    receiver.install_signal_handlers()
    print(
        f"receiving from {cfg.broker.describe()} [{', '.join(receiver.sources)}] into "
        f"partition {sink.partition} at offset {sink.next_offset}",
        file=sys.stderr,
        flush=True,
    )
    try:
        receiver.run(
            args.duration,
            report_every_s=args.stats_interval or None,
            report=lambda st: log.warning("stats %s", st),
        )
    except ReceiverError as exc:
        print(f"qmf receive: {exc}", file=sys.stderr)
        return 1
    s = receiver.stats
    print(
        f"stopped: {s.received} received, {s.landed} landed, {s.settled} settled; "
        f"{receiver.close_note}",
        file=sys.stderr,
    )
    return 0
