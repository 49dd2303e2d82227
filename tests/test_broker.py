"""The project-local RabbitMQ node, against real nodes (no mocks).

Tests that stop or restart a node use a *private* node (own QMF_HOME and ports), so the
shared node other test modules use stays up; that also proves two nodes never collide.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import ConnectionException, Message, Timeout
from proton.utils import BlockingConnection

from pipeline import broker as b
from pipeline.cli import main as cli_main

pytestmark = pytest.mark.broker

ENV_KEYS = ("QMF_HOME", "QMF_BROKER_MEMORY", "QMF_BROKER_PORT", "QMF_BROKER_TLS_PORT", "QMF_BROKER_DIST_PORT",
            "QMF_BROKER_EPMD_PORT", "QMF_BROKER_URL", "QMF_RABBITMQ_BIN")


@pytest.fixture(scope="module")
def private_cfg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[b.BrokerConfig]:
    """A second node: own state dir and free ports; stopped at module end."""
    cfg = b.isolated_config(tmp_path_factory.mktemp("qmfhome"))
    yield cfg
    b.stop_broker(cfg=cfg)


@pytest.fixture
def private(private_cfg: b.BrokerConfig, monkeypatch: pytest.MonkeyPatch) -> b.BrokerConfig:
    """Also point the environment (hence the `qmf` CLI) at the private node for one test."""
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    for key, value in b.config_env(private_cfg).items():
        monkeypatch.setenv(key, value)
    assert b.load_config() == private_cfg
    return private_cfg


def _body(msg: Message) -> bytes:
    """proton hands binary bodies back as memoryview."""
    assert isinstance(msg.body, bytes | memoryview), type(msg.body)
    return bytes(msg.body)


def _drain(conn: BlockingConnection, address: str, n: int) -> list[Message]:
    receiver = conn.create_receiver(address, credit=min(n, 500))
    got: list[Message] = []
    for _ in range(n):
        got.append(receiver.receive(timeout=10))
        receiver.accept()
    return got


# ------------------------------------------------------------------ the shared node


def test_ensure_broker_is_idempotent_and_fast(broker: b.BrokerInfo) -> None:
    assert broker.local
    assert broker.url == f"amqp://guest:guest@127.0.0.1:{broker.port}"
    assert broker.host == "127.0.0.1"
    t0 = time.monotonic()
    again = b.ensure_broker()
    assert time.monotonic() - t0 < 5.0
    assert again.url == broker.url and again.node == broker.node


def test_status_running(broker: b.BrokerInfo) -> None:
    status = b.broker_status()
    assert status.running and status.amqp10 and status.managed
    assert status.node == broker.node
    assert status.node is not None and status.node.startswith("qmf-")
    assert status.node.endswith("@localhost")
    assert status.pid is not None and status.pid > 1
    assert status.ports["amqp_port"] == broker.port


def test_cli_status(broker: b.BrokerInfo, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["broker", "status"]) == 0
    out = capsys.readouterr().out
    assert "broker: running" in out
    assert f"node: {broker.node}" in out


def test_listens_on_loopback_only(broker: b.BrokerInfo) -> None:
    """Every listening socket of the node is bound to 127.0.0.1."""
    assert broker.paths is not None
    pid = b.broker_status().pid
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed since the listing: a node's fds come and go
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    listening = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        if cols[3] == "0A" and cols[9] in inodes:  # 0A = LISTEN
            addr, port = cols[1].split(":")
            listening.append((addr, int(port, 16)))
    assert broker.tls_port is not None
    assert sorted(listening) == sorted(
        ("0100007F", p) for p in (broker.port, broker.tls_port, b.load_config().dist_port)
    )


def test_publish_to_exchange_with_subject_reaches_topic_subscriber(
    broker: b.BrokerInfo,
) -> None:
    """mgmt.# sees our mgmt.x.y message intact and not the console.x.y one.

    The shared node carries other tests' traffic too, so messages are told apart by id.
    """
    token = uuid.uuid4().hex
    body = bytes(range(256)) * 4 + b"\x00AM1"
    conn = BlockingConnection(broker.url, timeout=10)
    try:
        receiver = conn.create_receiver("/exchange/qpid.management/mgmt.#", credit=50)
        sender = conn.create_sender("/exchange/qpid.management/mgmt.x.y")
        sender.send(Message(id=f"{token}-1", body=body, subject="mgmt.x.y",
                            content_type="application/octet-stream",
                            properties={"qmf.agent": "x"}))
        # A key outside the binding must not arrive; a later in-binding marker bounds
        # how long to wait for it.
        other = conn.create_sender("/exchange/qpid.management")
        other.send(Message(id=f"{token}-2", body=b"not for you", subject="console.x.y"))
        other.send(Message(id=f"{token}-3", body=b"marker", subject="mgmt.x.z"))
        mine: dict[str, Message] = {}
        deadline = time.monotonic() + 15
        while f"{token}-3" not in mine and time.monotonic() < deadline:
            msg = receiver.receive(timeout=10)
            receiver.accept()
            if isinstance(msg.id, str) and msg.id.startswith(token):
                mine[msg.id] = msg
        settle = time.monotonic() + 0.5
        with contextlib.suppress(Timeout):
            while (left := settle - time.monotonic()) > 0:
                msg = receiver.receive(timeout=left)
                receiver.accept()
                if isinstance(msg.id, str) and msg.id.startswith(token):
                    mine[msg.id] = msg
        assert sorted(mine) == [f"{token}-1", f"{token}-3"]
        msg = mine[f"{token}-1"]
        assert _body(msg) == body
        assert msg.subject == "mgmt.x.y"
        assert msg.content_type == "application/octet-stream"
        assert msg.properties == {"qmf.agent": "x"}
        assert mine[f"{token}-3"].subject == "mgmt.x.z"
    finally:
        conn.close()


def test_topology_exchanges_and_gen_queue_policy(broker: b.BrokerInfo) -> None:
    rows = b.rabbitmqctl("list_exchanges", "--no-table-headers", "name", "type", "durable")
    exchanges = {tuple(line.split("\t")) for line in rows.splitlines()}
    assert ("qpid.management", "topic", "true") in exchanges
    assert ("qmf.default.topic", "topic", "true") in exchanges
    assert ("qmf.default.direct", "direct", "true") in exchanges
    conn = BlockingConnection(broker.url, timeout=10)
    try:
        conn.create_receiver("/exchange/qmf.default.topic/agent.ind.#", credit=1)
        rows = b.rabbitmqctl("list_queues", "--no-table-headers", "name", "policy")
    finally:
        conn.close()
    gen = [line.split("\t") for line in rows.splitlines() if line.startswith("amq.gen-")]
    assert gen, rows
    assert {row[1] for row in gen} == {"qmf-expire-amq-gen"}
    policies = b.rabbitmqctl("list_policies", "--no-table-headers")
    assert policies.splitlines() == [
        '/\tqmf-expire-amq-gen\t^amq\\.gen-\tqueues\t{"expires":60000}\t0'
    ]


def test_tls_with_sasl_plain_external_and_wrong_password(broker: b.BrokerInfo) -> None:
    files = b.ensure_tls()  # the state dir's certificates: no restart
    assert files.exist()
    assert broker.tls_port is not None
    tls_url = f"amqps://127.0.0.1:{broker.tls_port}"
    assert broker.extra_user and broker.extra_password
    plain = BlockingConnection(
        f"amqps://{broker.extra_user}:{broker.extra_password}@127.0.0.1:{broker.tls_port}",
        timeout=10, ssl_domain=b.client_ssl_domain(files, client_cert=False),
        allowed_mechs="PLAIN",
    )
    plain.create_sender("/exchange/qpid.management")
    plain.close()
    external = BlockingConnection(tls_url, timeout=10, ssl_domain=b.client_ssl_domain(files),
                                  allowed_mechs="EXTERNAL")
    external.create_sender("/exchange/qpid.management")
    external.close()
    t0 = time.monotonic()
    with pytest.raises(ConnectionException, match="Authentication failed"):
        BlockingConnection(
            f"amqps://{broker.extra_user}:wrong@127.0.0.1:{broker.tls_port}", timeout=10,
            ssl_domain=b.client_ssl_domain(files, client_cert=False), allowed_mechs="PLAIN",
        )
    assert time.monotonic() - t0 < 8.0


def test_add_user_then_plain_login(broker: b.BrokerInfo) -> None:
    b.add_user("qmf-test-user", "s3cret pass")
    conn = BlockingConnection(f"amqp://qmf-test-user:s3cret%20pass@127.0.0.1:{broker.port}",
                              timeout=10, allowed_mechs="PLAIN")
    conn.create_sender("/exchange/qpid.management")
    conn.close()


def test_external_url_only_checks_reachability(
    broker: b.BrokerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QMF_BROKER_URL", f"amqp://guest:guest@127.0.0.1:{broker.port}")
    info = b.ensure_broker()
    assert not info.local and info.port == broker.port and info.user == "guest"
    assert b.broker_status().running
    port = b.free_port()
    monkeypatch.setenv("QMF_BROKER_URL", f"amqp://127.0.0.1:{port}")
    with pytest.raises(b.BrokerError, match="not reachable"):
        b.ensure_broker()
    assert not b.broker_status().running


# ------------------------------------------------------------------ a private node


@pytest.mark.slow
def test_private_node_lifecycle_and_durable_queue_survives_restart(
    broker: b.BrokerInfo, private: b.BrokerConfig, capsys: pytest.CaptureFixture[str],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = private
    # The explicit cfg wins over QMF_BROKER_URL (which points at the shared node here).
    monkeypatch.setenv("QMF_BROKER_URL", broker.url)
    info = b.ensure_broker(cfg=cfg)
    monkeypatch.delenv("QMF_BROKER_URL")
    assert info.local and info.node == cfg.node
    state_tls = b.TlsFiles(*(cfg.paths.tls_dir / n for n in (
        "ca.pem", "server.pem", "server.key", "client.pem", "client.key")))
    assert info.tls == state_tls and info.tls_port == cfg.tls_port
    tls = BlockingConnection(f"amqps://127.0.0.1:{info.tls_port}", timeout=10,
                             ssl_domain=b.client_ssl_domain(state_tls),
                             allowed_mechs="EXTERNAL")
    tls.close()
    assert info.port == cfg.port != broker.port
    assert info.node != broker.node
    assert info.paths == cfg.paths
    assert b.broker_status(cfg).running

    b.declare_queue("qmf-durable-test", [("qpid.management", "mgmt.#")], cfg=cfg)
    bodies = [f"msg-{i}".encode() * 10 for i in range(200)]
    conn = BlockingConnection(info.url, timeout=10)
    sender = conn.create_sender("/exchange/qpid.management")
    for i, body in enumerate(bodies):
        sender.send(Message(body=body, subject=f"mgmt.a{i % 3}.t", durable=True))
    conn.close()
    assert b.queue_depths(cfg)["qmf-durable-test"] == 200

    b.add_user("restart-user", "pw-1", cfg=cfg)
    before = b.broker_status(cfg).pid
    b.restart_broker(cfg=cfg)
    # Users added live come back from the boot definitions too.
    login = BlockingConnection(f"amqp://restart-user:pw-1@127.0.0.1:{cfg.port}", timeout=10,
                               allowed_mechs="PLAIN")
    login.close()
    assert b.broker_status(cfg).pid != before
    assert b.queue_depths(cfg)["qmf-durable-test"] == 200

    # Certificates this test creates: the listener only reads them at boot -> restart.
    before = b.broker_status(cfg).pid
    files = b.ensure_tls(tmp_path / "certs", cfg=cfg)
    assert files.ca == tmp_path / "certs" / "ca.pem"
    assert b.broker_status(cfg).pid != before
    assert b.local_info(cfg).tls == files
    tls = BlockingConnection(f"amqps://127.0.0.1:{cfg.tls_port}", timeout=10,
                             ssl_domain=b.client_ssl_domain(files), allowed_mechs="EXTERNAL")
    tls.close()
    with pytest.raises(ConnectionException, match="certificate verify failed"):
        BlockingConnection(f"amqps://127.0.0.1:{cfg.tls_port}", timeout=10,
                           ssl_domain=b.client_ssl_domain(state_tls), allowed_mechs="EXTERNAL")
    assert b.queue_depths(cfg)["qmf-durable-test"] == 200
    conn = BlockingConnection(info.url, timeout=10)
    try:
        got = _drain(conn, "/amq/queue/qmf-durable-test", 200)
    finally:
        conn.close()
    assert [_body(m) for m in got] == bodies
    assert [m.subject for m in got] == [f"mgmt.a{i % 3}.t" for i in range(200)]

    assert cli_main(["broker", "stop"]) == 0
    assert "broker stopped" in capsys.readouterr().out
    status = b.broker_status()
    assert not status.running and status.pid is None
    assert cli_main(["broker", "status"]) == 3
    assert "broker: stopped" in capsys.readouterr().out
    assert b.stop_broker() is False
    # The shared node was not touched.
    assert b.amqp10_handshake("127.0.0.1", broker.port)


def test_port_in_use_fails_with_clear_message(
    private: b.BrokerConfig, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        monkeypatch.setenv("QMF_HOME", str(tmp_path))
        monkeypatch.setenv("QMF_BROKER_PORT", str(squatter.getsockname()[1]))
        with pytest.raises(b.BrokerError, match=r"AMQP port 127\.0\.0\.1:\d+ is already in use"):
            b.start_broker(timeout=10)


def test_an_isolated_node_picks_new_ports_when_one_is_taken_before_it_binds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of parallel tests: a port free when picked, bound by someone else (here a
    socket bound but not listening, as a client's source port is) before the node's bind."""
    real = b.free_port
    with socket.socket() as taker:
        taker.bind(("127.0.0.1", 0))
        taken = int(taker.getsockname()[1])
        picks: list[int] = []

        def first_one_taken(span: int = 1) -> int:
            picks.append(taken if not picks else real(span))
            return picks[-1]

        monkeypatch.setattr(b, "free_port", first_one_taken)
        with pytest.raises(b.BrokerError, match="eaddrinuse"):
            b.start_isolated(tmp_path / "once", timeout=60, attempts=1)
        assert picks[0] == taken
        picks.clear()
        cfg = b.start_isolated(tmp_path / "retried", timeout=60)
        try:
            assert picks[0] == taken and len(picks) == 8  # two picks of four ports
            assert cfg.port == picks[4] != taken
            assert b.broker_status(cfg).running
        finally:
            b.stop_broker(cfg=cfg)


def test_free_ports_lie_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = b.free_port(10)
        assert 10000 <= port and port + 10 <= low


def test_epmd_port_taken_by_something_else(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        cfg = dataclasses.replace(b.isolated_config(tmp_path),
                                  epmd_port=int(squatter.getsockname()[1]))
        with pytest.raises(b.BrokerError, match=r"epmd port .* is taken by something that is "
                                                r"not epmd; choose another"):
            b.start_broker(timeout=10, cfg=cfg)
    assert not b.broker_status(cfg).running


def test_bad_settings_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Things RabbitMQ itself would accept silently (and then misbehave)."""
    monkeypatch.setenv("QMF_BROKER_MEMORY", "lots")
    with pytest.raises(b.BrokerError, match="QMF_BROKER_MEMORY='lots'"):
        b.load_config(tmp_path)
    monkeypatch.setenv("QMF_BROKER_MEMORY", "512MiB")
    assert b.load_config(tmp_path).memory_limit == "512MiB"
    bad = tmp_path / "badtls"
    bad.mkdir()
    for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key"):
        (bad / name).write_text("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    cfg = b.isolated_config(tmp_path)
    with pytest.raises(b.BrokerError, match="unusable TLS files"):
        b.ensure_tls(bad, cfg=cfg)
    assert not cfg.paths.tls_choice.exists()


def test_boot_failure_reports_the_reason_and_log_tail(tmp_path: Path) -> None:
    """A real boot failure (corrupt state: the node's Mnesia dir is a file)."""
    cfg = b.isolated_config(tmp_path)
    cfg.paths.mnesia.mkdir(parents=True)
    (cfg.paths.mnesia / cfg.node).write_text("not a directory")
    with pytest.raises(b.BrokerError) as err:
        b.start_broker(timeout=60, cfg=cfg)
    text = str(err.value)
    assert text.startswith(f"local RabbitMQ node {cfg.node} failed to start: rabbitmq-server "
                           "exited (code 0) before accepting AMQP 1.0 connections")
    assert "--- key lines\n" in text and "BOOT FAILED" in text
    assert "cannot_create_mnesia_dir" in text
    assert f"--- tail of {cfg.paths.log_file}" in text
    assert not b.broker_status(cfg).running
