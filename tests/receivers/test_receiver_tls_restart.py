"""TLS + SASL (PLAIN, EXTERNAL) and a broker restart, on a throw-away RabbitMQ node.

The node is the ``isolated_broker`` fixture (own ports and state), so restarting
it and swapping its certificates for ones this test creates never disturbs the
shared node.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import broker as qmf_broker
from receivers.config import BrokerConfig, TlsConfig
from receivers.landing import LandingLog
from receivers.publisher import OutMessage, Publisher
from receivers.receiver import LandingSink, QmfReceiver, ReceiverConfig, ReceiverError
from tests.receivers.test_receiver_broker import (
    expected_key,
    landed_table,
    make_messages,
    run_receiver_thread,
    wait_for,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.fixture(scope="module")
def tls_node(
    isolated_broker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Any, qmf_broker.TlsFiles]]:
    """The isolated node serving TLS with a CA and certificates created here."""
    files = qmf_broker.ensure_tls(tmp_path_factory.mktemp("certs"), cfg=isolated_broker)
    info = qmf_broker.local_info(isolated_broker)
    assert info.tls_port is not None and info.extra_user and info.extra_password
    yield isolated_broker, info, files


def tls_config(info: Any, files: qmf_broker.TlsFiles, **kw: Any) -> BrokerConfig:
    return BrokerConfig(
        urls=(f"amqps://localhost:{info.tls_port}",),
        tls=TlsConfig(ca_file=str(files.ca), **kw.pop("tls", {})),
        **kw,
    )


def round_trip(cfg: BrokerConfig, root: Path, n: int) -> None:
    """Receive n messages published over the same connection settings; exact contents."""
    tag = f"t{uuid.uuid4().hex[:10]}"
    msgs = make_messages(tag, n)
    rcfg = ReceiverConfig(broker=cfg, bindings=(("qpid.management", f"mgmt.{tag}.#"),))
    r = run_receiver_thread(rcfg, LandingSink(root, "p0"))
    try:
        with Publisher(cfg) as pub:
            pub.publish_many(msgs)
        wait_for(lambda: r.stats.settled >= n, 60, f"{n} settled")
    finally:
        r.stop()
    t = landed_table(root)
    assert t.column("body").to_pylist() == [m.body for m in msgs]
    assert t.column("msg_key").to_pylist() == [expected_key(m) for m in msgs]


def test_tls_with_sasl_plain(tls_node: Any, tmp_path: Path) -> None:
    _, info, files = tls_node
    cfg = tls_config(
        info, files, user=info.extra_user, password=info.extra_password, sasl_mechanisms=("PLAIN",)
    )
    round_trip(cfg, tmp_path / "landing", 300)


def test_tls_with_sasl_external_client_certificate(tls_node: Any, tmp_path: Path) -> None:
    _, info, files = tls_node
    cfg = tls_config(
        info,
        files,
        sasl_mechanisms=("EXTERNAL",),
        tls={"cert_file": str(files.client_cert), "key_file": str(files.client_key)},
    )
    round_trip(cfg, tmp_path / "landing", 200)


def test_tls_wrong_password_fails_fast(tls_node: Any, tmp_path: Path) -> None:
    _, info, files = tls_node
    cfg = tls_config(
        info, files, user=info.extra_user, password="not-the-password", sasl_mechanisms=("PLAIN",)
    )
    r = QmfReceiver(ReceiverConfig(broker=cfg), LandingSink(tmp_path / "l", "p0"))
    with pytest.raises(ReceiverError, match="amqp:unauthorized-access") as exc:
        r.run(duration_s=60)
    assert "not-the-password" not in str(exc.value)


def test_untrusted_server_certificate_is_refused(tls_node: Any, tmp_path: Path) -> None:
    _, info, _ = tls_node
    other = qmf_broker.generate_tls(tmp_path / "other-ca")  # a CA the server does not use
    cfg = tls_config(
        info, other, user=info.extra_user, password=info.extra_password, sasl_mechanisms=("PLAIN",)
    )
    r = QmfReceiver(ReceiverConfig(broker=cfg), LandingSink(tmp_path / "l", "p0"))
    with pytest.raises(ReceiverError, match="certificate verify failed"):
        r.run(duration_s=60)


def test_broker_restart_with_a_durable_queue_loses_nothing(tls_node: Any, tmp_path: Path) -> None:
    node, info, _ = tls_node
    tag = f"t{uuid.uuid4().hex[:10]}"
    queue = f"qmf-restart-{tag}"
    qmf_broker.declare_queue(queue, [("qpid.management", f"mgmt.{tag}.#")], cfg=node)
    n = 3000
    msgs = [
        OutMessage(m.routing_key, m.body, m.application_properties, message_id=m.message_id,
                   durable=True)
        for m in make_messages(tag, n)
    ]  # fmt: skip
    cfg = BrokerConfig(urls=(info.url,))
    root = tmp_path / "landing"
    r = run_receiver_thread(
        ReceiverConfig(
            broker=cfg, queue=queue, backoff_initial_s=0.2, backoff_max_s=1.0,
            credit_window=200, flush_count=100,
        ),
        LandingSink(root, "p0"),
    )  # fmt: skip
    try:
        with Publisher(cfg) as pub:
            pub.publish_many(msgs[: n // 2])
        wait_for(lambda: r.stats.landed >= n // 8, 60, "some messages landed")
        qmf_broker.restart_broker(cfg=node)
        with Publisher(cfg) as pub:
            pub.publish_many(msgs[n // 2 :])

        def distinct() -> int:
            return len(set(landed_table(root).column("msg_key").to_pylist()))

        wait_for(lambda: distinct() >= n, 120, "every message landed after the restart")
    finally:
        r.stop()
    assert r.stats.connects >= 2 and r.stats.disconnects >= 1
    keys = landed_table(root).column("msg_key").to_pylist()
    assert set(keys) == {expected_key(m) for m in msgs}
    assert sum(LandingLog(root).end_offsets().values()) == len(keys)
    wait_for(lambda: qmf_broker.queue_depths(cfg=node).get(queue) == 0, 60, "an empty queue")
