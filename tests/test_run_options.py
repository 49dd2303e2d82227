"""`qmf run --url ...`: TLS, SASL and credentials reach the embedded receiver's config."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands.run import _receiver_options, register
from receivers.receiver import config_from_options


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_tls_and_sasl_options_configure_the_receiver(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.write_text("user=monitor\npassword=s3cret\n", encoding="utf-8")
    args = _args("--url", "amqps://qpidd.example:5671", "--preset", "qpidd", "--no-sim",
                 "--ca-file", "/etc/ssl/ca.pem", "--cert-file", "/etc/ssl/me.pem",
                 "--key-file", "/etc/ssl/me.key", "--no-verify-hostname",
                 "--credentials-file", str(creds), "--sasl", "PLAIN")  # fmt: skip
    opts = _receiver_options(args, args.url, tmp_path / "wants")
    assert "queue" not in opts  # a broker of yours: no queue is declared for you
    cfg = config_from_options(opts)
    assert cfg.preset == "qpidd"
    assert cfg.broker.urls == ("amqps://qpidd.example:5671",)
    assert cfg.broker.tls is not None
    assert (cfg.broker.tls.ca_file, cfg.broker.tls.cert_file, cfg.broker.tls.key_file) == (
        "/etc/ssl/ca.pem", "/etc/ssl/me.pem", "/etc/ssl/me.key")  # fmt: skip
    assert cfg.broker.tls.verify_hostname is False
    assert cfg.broker.sasl_mechanisms == ("PLAIN",)
    assert (cfg.broker.user, cfg.broker.password) == ("monitor", "s3cret")


def test_local_defaults_pass_no_tls() -> None:
    args = _args()
    opts = _receiver_options(args, "amqp://127.0.0.1:35672", Path("w"))
    assert opts == {"url": "amqp://127.0.0.1:35672", "preset": "rabbitmq", "queue": "qmf.pipeline"}
    assert config_from_options(opts).broker.tls is None
