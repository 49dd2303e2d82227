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
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="a fleet file (TOML, one [[broker]] table per broker; docs/cluster.md): one "
        "receiver per broker, each into partitions <name>-<n>; the broker, subscription and "
        "console options above are then the file's",
    )
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
    if args.config:
        return run_fleet(args)
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


def run_fleet(args: argparse.Namespace) -> int:
    """One receiver per broker of ``--config`` until signalled (or ``--duration``); a broker
    that is down or refuses us is retried and never stops the others."""
    import signal
    import threading

    from receivers.config import ConfigError
    from receivers.fleet import FleetReceivers, load_fleet

    if args.url or args.partition or args.console or args.bind or args.queue or args.source:
        print("qmf receive: --config names the brokers and their subscriptions: no --url, "
              "--partition, --bind, --queue, --source or --console beside it", file=sys.stderr)  # fmt: skip
        return 2
    try:
        fleet = load_fleet(args.config)
    except ConfigError as exc:
        print(f"qmf receive: {exc}", file=sys.stderr)
        return 2
    root = args.landing or args._landing_default()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    receivers = FleetReceivers(fleet, root, wants=None).start()
    for name, st in receivers.status().items():
        state = "subscribed" if st["subscribed"] else "connecting"
        if not st["subscribed"] and st["last_error"]:
            state = f"failed ({st['last_error']}); retried"
        print(f"broker {name}: {state}, partition {st['partition']}", file=sys.stderr, flush=True)
    print(f"ready: {len(fleet.brokers)} brokers, landing under {root}", file=sys.stderr, flush=True)
    stop.wait(args.duration)
    receivers.stop()
    for m in receivers.members:
        r = m.receiver
        counts = "not running" if r is None else (
            f"{r.stats.received} received, {r.stats.landed} landed, {r.stats.settled} settled"
        )
        print(f"stopped {m.broker.name}: {counts}; {m.starts} start(s)"
              + (f"; last error: {m.last_error}" if m.last_error else ""), file=sys.stderr)  # fmt: skip
    return 0
