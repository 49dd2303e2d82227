"""``qmf replay``: publish a capture file to a broker, routing keys as subjects.

RabbitMQ shows consumers the routing key only through ``subject``, so every
message is sent with ``subject = routing key``. The exchange is chosen per
message by routing-key prefix (``--route PREFIX=EXCHANGE``, first match wins;
by default ``agent.`` goes to ``qmf.default.topic``, as QMF v2 agents publish
there), else ``--exchange``.

A body the receiver landed AMQP 1.0 encoded (application property
``x-qmf-body-encoding``: qpidd's QMF v2 maps and lists arrive as an amqp-value
section) is sent as that amqp-value again, without the property: the receiver
then lands the same bytes and sets the flag itself, as for the original.
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pipeline.codec.amqp10 import BODY_ENCODING_PROPERTY
from receivers.publisher import BODY_ENCODINGS, OutMessage

DEFAULT_ROUTES: tuple[tuple[str, str], ...] = (("agent.", "qmf.default.topic"),)


def register(subparsers: Any) -> None:
    """Hook for pipeline.cli."""
    from receivers.cliopts import add_broker_args

    p: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="publish a capture file to the broker",
        description="Publish every message of a JSON-lines capture with its routing key "
        "(as subject too), properties and application properties; waits until the broker "
        "accepted all of them.",
    )
    add_broker_args(p)
    p.add_argument("--input", "-i", required=True, help="capture file (JSON lines)")
    p.add_argument(
        "--exchange", default="qpid.management", help="default exchange (qpid.management)"
    )
    p.add_argument(
        "--route",
        action="append",
        default=[],
        metavar="PREFIX=EXCHANGE",
        help="send routing keys starting with PREFIX to EXCHANGE (repeatable; replaces "
        "the default agent.=qmf.default.topic)",
    )
    p.add_argument(
        "--address-template",
        default="/exchange/{exchange}",
        help="target address for an exchange (qpidd: '{exchange}')",
    )
    p.add_argument(
        "--reply-template",
        default="/exchange/{exchange}/{routing_key}",
        help="address for a 0-10 reply-to {exchange, routing_key} (qpidd: "
        "'{exchange}/{routing_key}')",
    )
    p.add_argument(
        "--list-section",
        choices=("auto", "amqp-value", "amqp-sequence"),
        default="auto",
        help="section for an AMQP 1.0 list body (qpidd's v2 data indications): amqp-value as "
        "qpidd sends it, or amqp-sequence (RabbitMQ 3.x drops a session on an amqp-value list; "
        "a consumer sees the same body); auto: amqp-sequence for /exchange/ addresses",
    )
    p.add_argument("--limit", type=int, default=None, help="publish at most N messages")
    p.add_argument("--rate", type=float, default=None, help="at most R messages/s")
    p.add_argument("--window", type=int, default=1000, help="unsettled messages in flight")
    p.set_defaults(func=run)


def read_capture(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of a capture file (``pipeline.codec.capture``; errors name the line)."""
    from pipeline.codec.capture import read_capture as read_captured

    for m in read_captured(path):
        yield m.to_json()


def _routing_key(rec: dict[str, Any]) -> str:
    props = rec.get("properties") or {}
    for value in (rec.get("routing_key"), props.get("routing_key"), rec.get("subject")):
        if value:
            return str(value)
    return ""


def _id(value: Any) -> str | int | None:
    if value is None or isinstance(value, str | int):
        return value
    return str(value)


def _reply_to(value: Any, template: str) -> str | None:
    """A 0-10 reply-to ({exchange, routing_key}) becomes an AMQP 1.0 address."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        ex = str(value.get("exchange") or "amq.direct")
        return template.format(exchange=ex, routing_key=str(value.get("routing_key") or ""))
    return str(value)


def to_out_message(
    rec: dict[str, Any],
    *,
    exchange: str = "qpid.management",
    routes: Sequence[tuple[str, str]] = DEFAULT_ROUTES,
    reply_template: str = "/exchange/{exchange}/{routing_key}",
) -> OutMessage:
    """The message a capture record describes, with the exchange chosen by ``routes``."""
    props = rec.get("properties") or {}
    key = _routing_key(rec)
    target = next((ex for prefix, ex in routes if key.startswith(prefix)), exchange)
    ttl = props.get("ttl")
    app_props = dict(rec.get("application_properties") or {})
    encoding = app_props.pop(BODY_ENCODING_PROPERTY, None)
    if encoding is not None and encoding not in BODY_ENCODINGS:
        raise ValueError(f"unknown {BODY_ENCODING_PROPERTY} {encoding!r} on {key!r}")
    return OutMessage(
        routing_key=key,
        body=base64.b64decode(rec.get("body_base64") or ""),
        application_properties=app_props or None,
        body_encoding=encoding,
        content_type=rec.get("content_type") or props.get("content_type"),
        app_id=props.get("app_id"),
        message_id=_id(props.get("message_id")),
        correlation_id=_id(props.get("correlation_id")),
        reply_to=_reply_to(props.get("reply_to"), reply_template),
        ttl_s=float(ttl) / 1000.0 if isinstance(ttl, int | float) and ttl > 0 else None,
        exchange=target,
    )


def parse_routes(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``PREFIX=EXCHANGE`` items; none given means the defaults."""
    out: list[tuple[str, str]] = []
    for item in items:
        prefix, sep, ex = item.partition("=")
        if not sep or not ex:
            raise ValueError(f"route {item!r} must be PREFIX=EXCHANGE")
        out.append((prefix, ex))
    return tuple(out) if out else DEFAULT_ROUTES


def run(args: argparse.Namespace) -> int:
    """Publish the file; 1 with a clear message if the broker refuses anything."""
    from receivers.cliopts import broker_config
    from receivers.config import ConfigError
    from receivers.publisher import Publisher, PublishError

    try:
        routes = parse_routes(args.route)
        cfg = broker_config(args)
    except (ConfigError, ValueError) as exc:
        print(f"qmf replay: {exc}", file=sys.stderr)
        return 2
    sent = 0
    start = time.monotonic()
    try:
        with Publisher(
            cfg,
            exchange=args.exchange,
            address_template=args.address_template,
            list_section=None if args.list_section == "auto" else args.list_section,
            window=args.window,
        ) as pub:
            for rec in read_capture(args.input):
                if args.limit is not None and sent >= args.limit:
                    break
                if args.rate:
                    due = start + sent / args.rate
                    if due > time.monotonic():
                        pub.flush()
                    while (wait := due - time.monotonic()) > 0:
                        time.sleep(min(wait, 0.5))
                out = to_out_message(
                    rec,
                    exchange=args.exchange,
                    routes=routes,
                    reply_template=args.reply_template,
                )
                pub.publish_message(out)
                sent += 1
            pub.flush()
    except (PublishError, ValueError, TypeError, OSError) as exc:
        print(f"qmf replay: {exc} (after {sent} messages)", file=sys.stderr)
        return 1
    dt = time.monotonic() - start
    print(f"replayed {sent} messages in {dt:.2f} s", file=sys.stderr)
    return 0
