"""``qmf top``: the busiest queues now, refreshed as the gold tables grow.

What qpid-stat shows for "now", read from the lake a running ``qmf run``
writes (``--data``, its layout): per queue, named as gold names it (its broker
and queue name), the latest enqueue and dequeue rates (the last gold interval
of msgTotalEnqueues/msgTotalDequeues), depth (msgDepth) and consumers
(consumerCount), then the latest events. A broker publishing both QMF v1 and
v2 (qpidd) gives each queue once: the agent with the newest sample (V2 on a
tie); ``--json`` lists every agent. Each refresh reads only what the tables
gained (``pipeline.views.live``). Queues whose object has ended (deleted, or lost
with its agent) leave the table. A queue its agent stopped republishing
(qpidd publishes an object only when it changed) shows 0 msg/s once the agent
was seen more than 1.5 publish cycles after the queue's latest interval
(``pipeline.views.live.with_quiet``). On a terminal the table is redrawn in place
(rich); otherwise each frame is printed as plain text.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pipeline.views.live import LiveView, QueueRow, data_location, severity_name

PLAIN_WIDTH = 10_000  # plain frames are as wide as their rows: nothing cut, nothing wrapped


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "top", help="live console table of the busiest queues (reads the gold tables)",
        description=__doc__,
    )  # fmt: skip
    p.add_argument("--data", default="data", help="folder qmf run writes (./data), or a bucket (s3a://bucket/prefix)")
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


def _count(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


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


def _fit(widths: list[int], room: int) -> list[int]:
    """Widths of text columns sharing ``room`` characters: each its natural width when all
    fit, else the widest cut first (at least 8 each)."""
    out = list(widths)
    while sum(out) > max(room, 8 * len(out)) and max(out) > 8:
        i = out.index(max(out))
        out[i] -= 1
    return out


def _table(rows: list[QueueRow], width: int | None) -> Table:
    """The queue table. ``width``: the terminal's; broker and queue names are cut to fit
    (ending in an ellipsis), the figures never. None: nothing cut (plain output)."""
    t = Table(box=None, show_edge=False, pad_edge=False, header_style="bold")
    cells = [
        (format_rate(q.enqueue_rate), format_rate(q.dequeue_rate), _count(q.depth),
         _count(q.consumers), _time(q.end_ns)[11:])
        for q in rows
    ]  # fmt: skip
    figures = ("ENQ/S", "DEQ/S", "DEPTH", "CONSUMERS", "SAMPLE")
    fixed = [max([len(n)] + [len(c[i]) for c in cells]) for i, n in enumerate(figures)]
    names = [max([6] + [len(q.broker) for q in rows]), max([5] + [len(q.name) for q in rows])]
    if width is not None:  # two spaces between columns
        names = _fit(names, width - sum(fixed) - 2 * (len(fixed) + 1))
    for name, w in zip(("BROKER", "QUEUE"), names, strict=True):
        t.add_column(name, no_wrap=True, overflow="ellipsis", width=w)
    for name, w in zip(figures, fixed, strict=True):
        t.add_column(name, justify="left" if name == "SAMPLE" else "right", no_wrap=True, width=w)
    for q, c in zip(rows, cells, strict=True):
        t.add_row(q.broker, q.name, *c, style="dim" if q.quiet else None)
    return t


def _events(events: list[dict[str, Any]], width: int | None) -> Table:
    t = Table(box=None, show_edge=False, pad_edge=False, show_header=False)
    rows = [
        (_time(e["timestamp_ns"]), e["broker"] or "-", severity_name(e["severity"]), _event_text(e))
        for e in events
    ]
    widths = [max([1] + [len(r[i]) for r in rows]) for i in range(4)]
    if width is not None:
        widths[1], widths[3] = _fit([widths[1], widths[3]], width - widths[0] - widths[2] - 6)
    for w in widths:
        t.add_column(no_wrap=True, overflow="ellipsis", width=w)
    for r in rows:
        t.add_row(*r)
    return t


def render(
    view: LiveView, limit: int, sort: str, n_events: int, width: int | None = None
) -> RenderableType:
    """One screen: a header, the queue table, the latest events (``width``: cut to it)."""
    queues = view.queues(sort=sort)
    newest = max((q.end_ns for q in queues), default=None)
    version = view.rates_version if view.rates_version is not None else "-"
    parts: list[RenderableType] = [
        Text(
            f"qmf top  {view.root}  gold v{version}  latest sample {_time(newest)}  "
            f"{len(queues)} queues (sorted by {sort})\n"
        )
    ]
    if queues:
        parts.append(_table(queues[:limit], width))
    else:
        parts.append(Text("(no queue rates yet: gold writes its first batch after a few samples)"))
    events = view.latest_events(n_events)
    parts += [Text("\nLATEST EVENTS", style="bold"), _events(events, width) if events else Text("(none)")]
    return Group(*parts)


def frame(view: LiveView, limit: int, sort: str, n_events: int) -> str:
    """One screen as plain text (no escape codes, nothing cut)."""
    out = io.StringIO()
    console = Console(file=out, width=PLAIN_WIDTH, color_system=None, force_terminal=False,
                      highlight=False, emoji=False)  # fmt: skip
    console.print(render(view, limit, sort, n_events))
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"


def frame_data(view: LiveView, limit: int, sort: str, n_events: int) -> dict[str, Any]:
    """The frame as data (``--once --json``): exact rates and values, names and agents."""
    events = [
        {k: v for k, v in e.items() if k != "event_time"} for e in view.latest_events(n_events)
    ]
    return {
        "rates_version": view.rates_version,
        "state_version": view.state_tail.version,
        "queues": [q.as_dict() for q in view.queues(sort=sort, limit=limit)],
        "events": events,
    }


def run(args: argparse.Namespace) -> int:
    view = LiveView(data_location(args.data), max_events=max(args.events, 0))
    if args.once:
        view.refresh()
        if args.json:
            print(json.dumps(frame_data(view, args.limit, args.sort, args.events), indent=1))
        else:
            sys.stdout.write(frame(view, args.limit, args.sort, args.events))
        return 0
    try:
        if sys.stdout.isatty():
            console = Console()
            with Live(console=console, auto_refresh=False, transient=False) as live:
                while True:
                    view.refresh()
                    shown = render(view, args.limit, args.sort, args.events, console.width)
                    live.update(shown, refresh=True)
                    time.sleep(args.interval)
        while True:
            view.refresh()
            sys.stdout.write(frame(view, args.limit, args.sort, args.events) + "\n")
            sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
