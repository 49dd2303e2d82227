"""``qmf top``: the busiest queues now, refreshed as the gold tables grow.

What qpid-stat shows for "now", read from the lake a running ``qmf run``
writes (``--data``, its layout): per queue the latest enqueue and dequeue
rates (the last gold interval of msgTotalEnqueues/msgTotalDequeues), depth
(msgDepth) and consumers (consumerCount), then the latest events. Each
refresh reads only what the tables gained (``pipeline.live``). Queues whose
object has ended (deleted, or lost with its agent) leave the table. A queue
its agent stopped republishing (qpidd publishes an object only when it
changed) shows 0 msg/s once the agent was seen more than 1.5 publish cycles
after the queue's latest interval (``pipeline.live.with_quiet``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.live import LiveView, severity_name

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: plain ANSI, no curses


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "top", help="live console table of the busiest queues (reads the gold tables)",
        description=__doc__,
    )  # fmt: skip
    p.add_argument("--data", default="data", help="folder qmf run writes (./data)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    p.add_argument("--limit", type=int, default=20, help="queues shown")
    p.add_argument("--events", type=int, default=8, help="latest events shown")
    p.add_argument("--sort", choices=("enqueue", "dequeue", "depth"), default="enqueue")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--json", action="store_true",
                   help="with --once: the frame's data as JSON (exact values)")  # fmt: skip
    p.set_defaults(func=run)


def format_rate(value: float | None) -> str:
    """How a rate or gauge is shown: two decimals, thousands separated; '-' when unknown
    (a counter reset interval has no rate)."""
    return "-" if value is None else f"{value:,.2f}"


def _time(ns: int | None) -> str:
    if ns is None or ns < 0:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def _event_text(e: dict[str, Any]) -> str:
    args = e.get("arguments")
    try:
        parsed = json.loads(args) if args else {}
    except ValueError:
        parsed = {"arguments": args}
    shown = " ".join(f"{k}={v}" for k, v in parsed.items() if k != "args")
    return f"{e['event_name']} {shown}".strip()


def frame(view: LiveView, limit: int, sort: str, n_events: int, width: int = 120) -> str:
    """One screen: a header, the queue table, the latest events."""
    queues = view.queues(sort=sort)
    shown = queues[:limit]
    newest = max((q.end_ns for q in queues), default=None)
    lines = [
        f"qmf top  {view.root}  gold v{view.rates_version if view.rates_version is not None else '-'}"
        f"  latest sample {_time(newest)}  {len(queues)} queues (sorted by {sort})",
        "",
        f"{'AGENT':<8} {'QUEUE':<28} {'ENQ/S':>12} {'DEQ/S':>12} {'DEPTH':>12} "
        f"{'CONSUMERS':>9}  {'SAMPLE':<13}",
    ]
    for q in shown:
        lines.append(
            f"{q.agent[:8]:<8} {q.name[:28]:<28} {format_rate(q.enqueue_rate):>12} "
            f"{format_rate(q.dequeue_rate):>12} {_count(q.depth):>12} {_count(q.consumers):>9}  "
            f"{_time(q.end_ns)[11:]:<13}"
        )
    if not queues:
        lines.append("(no queue rates yet: gold writes its first batch after a few samples)")
    lines += ["", "LATEST EVENTS"]
    for e in view.latest_events(n_events):
        text = (
            f"{_time(e['timestamp_ns'])}  {(e['agent'] or '-')[:8]:<8} "
            f"{severity_name(e['severity']):<6} {_event_text(e)}"
        )
        lines.append(text[:width])
    if not view.events.num_rows:
        lines.append("(none)")
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _count(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def frame_data(view: LiveView, limit: int, sort: str, n_events: int) -> dict[str, Any]:
    """The frame as data (``--once --json``): exact rates and values."""

    events = [
        {k: v for k, v in e.items() if k != "event_time"} for e in view.latest_events(n_events)
    ]
    return {
        "rates_version": view.rates_version,
        "queues": [q.as_dict() for q in view.queues(sort=sort, limit=limit)],
        "events": events,
    }


def run(args: argparse.Namespace) -> int:
    view = LiveView(Path(args.data), max_events=max(args.events, 1))
    if args.once:
        view.refresh()
        if args.json:
            print(json.dumps(frame_data(view, args.limit, args.sort, args.events), indent=1))
        else:
            sys.stdout.write(frame(view, args.limit, args.sort, args.events))
        return 0
    try:
        while True:
            view.refresh()
            sys.stdout.write(CLEAR + frame(view, args.limit, args.sort, args.events))
            sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
