"""``qmf broker start|stop|status|restart``: manage the project-local RabbitMQ node."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Hook for pipeline.cli: adds `broker` with its actions."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "broker",
        help="run the project-local RabbitMQ node",
        description="Start, stop or inspect the project-local RabbitMQ node "
        "(state under .qmf/broker, or $QMF_HOME/broker).",
    )
    parser.add_argument(
        "action", choices=("start", "stop", "status", "restart", "tls", "url"),
        help="start/stop/restart the node, show its status, set up TLS, print the URL",
    )
    parser.add_argument(
        "--url", default=None,
        help="use this broker instead of the local node (same as QMF_BROKER_URL)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None,
        help="seconds to wait for the node to accept AMQP 1.0 (default 120)",
    )
    parser.add_argument(
        "--tls-dir", default=None,
        help="for `tls`: certificate folder to create/use (default: the state dir's); a "
             "folder with only some of the five PEM files is refused (see --overwrite)",
    )
    parser.add_argument(
        "--overwrite", action="store_true",
        help="for `tls --tls-dir`: generate a new set over the files already there",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Dispatch one action; errors print a clear message and return 1."""
    from pipeline import broker

    if args.url:
        os.environ["QMF_BROKER_URL"] = args.url
    if args.action == "tls" and args.tls_dir and not args.overwrite:
        partial = partial_tls(args.tls_dir)
        if partial:
            print(f"qmf broker tls: {args.tls_dir} holds {', '.join(partial)} but not the whole "
                  "set (ca.pem, server.pem/.key, client.pem/.key): generating one would replace "
                  "them; --overwrite to do so, or give a folder with all five or none",
                  file=sys.stderr)  # fmt: skip
            return 2
    try:
        if args.action == "start":
            info = broker.ensure_broker(args.timeout)
            where = "external broker reachable" if not info.local else "broker running"
            print(f"{where}: {broker._redact(info.url)}")
            if info.local and info.tls_port:
                print(f"tls: {info.tls_url}")
        elif args.action == "stop":
            if broker.external_url() is not None:
                print("external broker (QMF_BROKER_URL): nothing to stop", file=sys.stderr)
                return 1
            was = broker.stop_broker()
            print("broker stopped" if was else "broker was not running")
        elif args.action == "restart":
            if broker.external_url() is not None:
                print("external broker (QMF_BROKER_URL): cannot restart", file=sys.stderr)
                return 1
            info = broker.restart_broker(args.timeout)
            print(f"broker restarted: {info.url}")
        elif args.action == "status":
            status = broker.broker_status()
            print(status.describe())
            return 0 if status.running else 3
        elif args.action == "tls":
            files = broker.ensure_tls(args.tls_dir)
            for name in ("ca", "server_cert", "server_key", "client_cert", "client_key"):
                print(f"{name}: {getattr(files, name)}")
        elif args.action == "url":
            print(_url(broker))
    except broker.BrokerError as exc:
        print(f"qmf broker {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0


# What ``pipeline.broker.generate_tls`` writes into a folder (the five PEM files it is
# about, the CA key, its serial and the openssl extensions file).
TLS_SET = ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")
TLS_WRITES = (*TLS_SET, "ca.key", "ca.srl", "ext.cnf")


def partial_tls(directory: str | os.PathLike[str]) -> list[str]:
    """Files of ``directory`` that generating a TLS set there would replace: those it
    writes, when the set is incomplete (a complete set is used as it is)."""
    from pipeline.outputs import holds_data

    d = os.fspath(directory)
    if all(holds_data(os.path.join(d, n)) for n in TLS_SET):
        return []
    return [n for n in TLS_WRITES if holds_data(os.path.join(d, n))]


def _url(broker: Any) -> str:
    """The URL clients should use, without starting anything."""
    ext = broker.external_url()
    return str(ext) if ext is not None else str(broker.local_info().url)
