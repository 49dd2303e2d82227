"""``qmf capture``: write what the receiver gets to a JSON-lines capture file.

Same subscription and settlement rules as ``qmf receive`` (a group is fsynced
to the file before its messages are settled), but the sink is the capture
interchange format of ``../shared/samples`` instead of the landing log.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Hook for pipeline.cli."""
    from receivers.cliopts import add_broker_args, add_console_args, add_subscription_args

    p: argparse.ArgumentParser = subparsers.add_parser(
        "capture",
        help="capture QMF messages to a JSON-lines file",
        description="Subscribe like `qmf receive` and write each message to FILE.jsonl "
        "(capture format). A FILE that already holds something is refused unless --append. "
        "Stops after --count messages, --duration seconds, or on SIGTERM/SIGINT.",
    )
    add_broker_args(p)
    add_subscription_args(p)
    add_console_args(p)
    p.add_argument("--output", "-o", required=True,
                   help="capture file (new, or empty; see --append)")  # fmt: skip
    p.add_argument("--append", action="store_true",
                   help="add to an existing capture file (without it one is refused)")  # fmt: skip
    p.add_argument("--count", type=int, default=None, help="stop once N messages are captured")
    p.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Capture until the count, the duration or a signal; 1 on fatal errors."""
    from pipeline.outputs import refusal
    from receivers.cliopts import receiver_config
    from receivers.config import ConfigError
    from receivers.receiver import CaptureSink, QmfReceiver, ReceiverError, replace_config

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        cfg = receiver_config(args)
    except (ConfigError, ValueError) as exc:
        print(f"qmf capture: {exc}", file=sys.stderr)
        return 2
    refused = refusal(args.output, "--append", args.append, "add to it")
    if refused:
        print(f"qmf capture: {refused}", file=sys.stderr)
        return 2
    try:
        sink = CaptureSink(args.output)
    except OSError as exc:
        print(f"qmf capture: {exc}", file=sys.stderr)
        return 2
    receiver: QmfReceiver

    def on_group(msgs: Any) -> None:
        del msgs
        if args.count is not None and sink.count >= args.count:
            receiver.request_stop()

    # The count is checked per group, so use groups no larger than what is left.
    if args.count is not None:
        cfg = replace_config(cfg, flush_count=max(1, min(cfg.flush_count, args.count)))
    receiver = QmfReceiver(cfg, sink, on_group=on_group)
    sink.source = ",".join(receiver.sources)
    receiver.on_ready = lambda r: print(
        f"ready: subscribed to {', '.join(r.sources)}", file=sys.stderr, flush=True
    )
    receiver.install_signal_handlers()
    print(
        f"capturing from {cfg.broker.describe()} [{sink.source}] into {args.output}"
        + (" (appending)" if args.append and sink.path.stat().st_size else ""),
        file=sys.stderr,
        flush=True,
    )
    try:
        receiver.run(args.duration)
    except ReceiverError as exc:
        print(f"qmf capture: {exc}", file=sys.stderr)
        return 1
    print(f"captured {sink.count} messages", file=sys.stderr)
    return 0
