"""Command-line options shared by ``qmf receive``, ``qmf capture`` and ``qmf replay``.

Kept here (not in each command) so the three commands connect, authenticate and
subscribe identically. Secrets are never accepted as option values: passwords
come from ``QMF_BROKER_PASSWORD``, a credentials file, or the URL.
"""

from __future__ import annotations

import argparse
import os

from receivers.config import BrokerConfig, TlsConfig
from receivers.console import (
    DEFAULT_REFRESH_CLASSES,
    DEFAULT_REFRESH_S,
    ConsoleConfig,
    format_refresh_classes,
    parse_refresh_classes,
)
from receivers.receiver import PRESETS, ReceiverConfig, parse_binding

DEFAULT_LANDING_ENV = "QMF_LANDING_DIR"


def default_landing_root() -> str:
    """``$QMF_LANDING_DIR``, else ``$QMF_HOME/landing``, else ``.qmf/landing``."""
    if os.environ.get(DEFAULT_LANDING_ENV):
        return os.environ[DEFAULT_LANDING_ENV]
    home = os.environ.get("QMF_HOME", ".qmf")
    return os.path.join(home, "landing")


def add_broker_args(p: argparse.ArgumentParser) -> None:
    """URL(s), TLS files, SASL mechanisms, credentials file."""
    g = p.add_argument_group("broker connection")
    g.add_argument(
        "--url",
        action="append",
        default=[],
        help="broker URL (repeat or comma-separate for failover); default $QMF_BROKER_URL "
        "or the project-local node",
    )
    g.add_argument(
        "--credentials-file",
        help="file with user=/password= lines (or user:password); "
        "else $QMF_BROKER_USER/$QMF_BROKER_PASSWORD, else the URL",
    )
    g.add_argument(
        "--sasl",
        action="append",
        default=[],
        metavar="MECH",
        help="allowed SASL mechanism(s): PLAIN, ANONYMOUS, EXTERNAL (repeatable)",
    )
    g.add_argument("--ca-file", help="CA certificate(s) to trust (amqps)")
    g.add_argument("--cert-file", help="client certificate (amqps, SASL EXTERNAL)")
    g.add_argument("--key-file", help="client private key")
    g.add_argument(
        "--no-verify-hostname",
        action="store_true",
        help="check the server certificate against the CA but not its host name",
    )
    g.add_argument("--heartbeat", type=float, default=None, help="idle timeout in seconds")


def broker_config(args: argparse.Namespace) -> BrokerConfig:
    """The BrokerConfig the broker options describe."""
    tls = None
    if args.ca_file or args.cert_file or args.key_file:
        tls = TlsConfig(
            ca_file=args.ca_file,
            cert_file=args.cert_file,
            key_file=args.key_file,
            verify_hostname=not args.no_verify_hostname,
        )
    mechs = [m for s in args.sasl for m in s.replace(",", " ").split()]
    return BrokerConfig.from_sources(
        args.url,
        credentials_file=args.credentials_file,
        sasl_mechanisms=mechs,
        tls=tls,
        heartbeat_s=args.heartbeat,
    )


def add_subscription_args(p: argparse.ArgumentParser) -> None:
    """Preset, bindings, durable queue or raw source addresses, credit and group commit."""
    g = p.add_argument_group("subscription")
    g.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="rabbitmq",
        help="address conventions: rabbitmq (/exchange/X/KEY, /amq/queue/Q) or qpidd "
        "(exchange address + topic-binding filter)",
    )
    g.add_argument(
        "--bind",
        action="append",
        default=[],
        metavar="EXCHANGE:KEY",
        help="temporary subscription binding (repeatable); default per preset",
    )
    g.add_argument("--queue", help="consume this durable queue instead (competing consumers)")
    g.add_argument(
        "--source", action="append", default=[], help="raw AMQP 1.0 source address (repeatable)"
    )
    g.add_argument("--credit", type=int, default=2000, help="credit window (default 2000)")
    g.add_argument(
        "--flush-count", type=int, default=500, help="group commit after N messages (500)"
    )
    g.add_argument("--flush-ms", type=float, default=50.0, help="... or after T ms in hand (50)")
    g.add_argument(
        "--stop-timeout",
        type=float,
        default=10.0,
        help="on a stop, wait this long for the broker to confirm the close (10 s); what it"
        " has not confirmed by then is sealed as in doubt",
    )
    g.add_argument(
        "--max-connect-attempts",
        type=int,
        default=None,
        help="give up after this many failed connection attempts in a row (default: never)",
    )


def add_console_args(p: argparse.ArgumentParser) -> None:
    """The console role (Broker Request, Class Query, Schema Requests; refresh queries)."""
    g = p.add_argument_group("console role")
    g.add_argument(
        "--console",
        action="store_true",
        help="also act as a QMF console: B/P/Q on connect, S for unseen schema hashes, "
        "refresh queries (--console-refresh), replies on a reply queue of its own (landed too)",
    )
    g.add_argument("--console-dialect", choices=("AM1", "AM2"), default="AM2")
    g.add_argument(
        "--console-key", default="broker", help="routing key of requests (broker or agent.<bank>)"
    )
    g.add_argument("--console-exchange", default="qpid.management")
    g.add_argument(
        "--console-wants", default=None, metavar="DIR",
        help="folder where the silver job lists schemas it still waits for "
        "(silver --schema-wants); each is asked for again",
    )  # fmt: skip
    g.add_argument(
        "--console-refresh", type=float, default=DEFAULT_REFRESH_S, metavar="SECONDS",
        help="query the watched objects every SECONDS, 0: never (default 20, a few of qpidd's "
        "10 s publish intervals): qpidd publishes an object only when it changed and any "
        "console's query clears that flag, so final counts may never be published; a v1 G to "
        "--console-key while v1 publications come, a QMF v2 query to each v2 agent heard from",
    )  # fmt: skip
    g.add_argument(
        "--console-refresh-classes", default=format_refresh_classes(DEFAULT_REFRESH_CLASSES),
        metavar="LIST",
        help="classes the refresh queries, PACKAGE:CLASS or CLASS (package "
        "org.apache.qpid.broker), comma-separated",
    )  # fmt: skip


def console_config(args: argparse.Namespace) -> ConsoleConfig | None:
    if not getattr(args, "console", False):
        return None
    return ConsoleConfig(
        dialect=args.console_dialect,
        exchange=args.console_exchange,
        command_key=args.console_key,
        wants=args.console_wants,
        refresh_s=args.console_refresh,
        refresh_classes=parse_refresh_classes(args.console_refresh_classes),
    )


def receiver_config(args: argparse.Namespace) -> ReceiverConfig:
    """The ReceiverConfig the subscription and broker options describe."""
    return ReceiverConfig(
        console=console_config(args),
        broker=broker_config(args),
        preset=args.preset,
        bindings=tuple(parse_binding(b) for s in args.bind for b in s.split(",") if b),
        queue=args.queue,
        sources=tuple(args.source),
        credit_window=args.credit,
        flush_count=args.flush_count,
        flush_ms=args.flush_ms,
        max_connect_attempts=args.max_connect_attempts,
        stop_timeout_s=args.stop_timeout,
    )
