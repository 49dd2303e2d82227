"""Pure tests: connection settings, message mapping, capture records (no broker)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from proton import Message, symbol

from pipeline.commands.replay import parse_routes, to_out_message
from receivers.config import BrokerConfig, ConfigError, TlsConfig, read_credentials_file
from receivers.landing import LandedMessage
from receivers.publisher import APP_ID_PROPERTY, OutMessage, build_message
from receivers.receiver import (
    BODY_ENCODING_PROPERTY,
    ReceiverConfig,
    Subscription,
    capture_record,
    config_from_options,
    parse_binding,
    subscriptions,
    to_landed,
)


def test_urls_lose_their_credentials_and_env_wins_over_url() -> None:
    cfg = BrokerConfig.from_sources(
        ["amqp://alice:s3cret@host1:5672,amqp://host2"],
        env={"QMF_BROKER_USER": "bob", "QMF_BROKER_PASSWORD": "pw"},
    )
    assert cfg.urls == ("amqp://host1:5672", "amqp://host2:5672")
    assert (cfg.user, cfg.password) == ("bob", "pw")
    assert "s3cret" not in repr(cfg) and "pw" not in repr(cfg)
    assert (
        cfg.describe() == "amqp://host1:5672, amqp://host2:5672 (user bob, sasl default, tls off)"
    )
    kw = cfg.connect_kwargs()
    assert kw["urls"] == ["amqp://host1:5672", "amqp://host2:5672"]
    assert (kw["user"], kw["password"], kw["reconnect"]) == ("bob", "pw", False)


def test_url_credentials_used_when_nothing_else_given() -> None:
    cfg = BrokerConfig.from_sources(["amqp://guest:gu%40st@127.0.0.1:35672"], env={})
    assert (cfg.urls, cfg.user, cfg.password) == (("amqp://127.0.0.1:35672",), "guest", "gu@st")


def test_credentials_file_forms(tmp_path: Path) -> None:
    f1 = tmp_path / "c1"
    f1.write_text("# comment\nuser=carol\npassword=p=w:x\n")
    assert read_credentials_file(f1) == ("carol", "p=w:x")
    f2 = tmp_path / "c2"
    f2.write_text("dave:pa:ss\n")
    assert read_credentials_file(f2) == ("dave", "pa:ss")
    cfg = BrokerConfig.from_sources(
        ["amqp://x:y@h:1"], credentials_file=str(f1), env={"QMF_BROKER_USER": "env"}
    )
    assert (cfg.user, cfg.password) == ("carol", "p=w:x")
    with pytest.raises(ConfigError, match="does not exist"):
        read_credentials_file(tmp_path / "missing")


def test_sasl_and_tls_settings() -> None:
    anon = BrokerConfig(urls=("amqp://u:p@h:1",), sasl_mechanisms=("ANONYMOUS",))
    kw = anon.connect_kwargs()
    assert kw["allowed_mechs"] == "ANONYMOUS" and "user" not in kw
    with pytest.raises(ConfigError, match="SASL mechanism"):
        BrokerConfig(urls=("amqp://h:1",), sasl_mechanisms=("GSSAPI",))
    with pytest.raises(ConfigError, match="no amqps"):
        BrokerConfig(urls=("amqp://h:1",), tls=TlsConfig()).connect_kwargs()
    with pytest.raises(ConfigError, match="does not exist"):
        BrokerConfig(
            urls=("amqps://h:1",), tls=TlsConfig(ca_file="/nonexistent/ca.pem")
        ).connect_kwargs()
    assert BrokerConfig(urls=("amqps://h",)).urls == ("amqps://h:5671",)
    with pytest.raises(ConfigError, match="scheme"):
        BrokerConfig(urls=("http://h",))


def test_presets_and_bindings() -> None:
    assert subscriptions("rabbitmq") == [Subscription("/exchange/qpid.management/mgmt.#")]
    assert subscriptions("rabbitmq", queue="q1") == [Subscription("/amq/queue/q1")]
    assert subscriptions("qpidd") == [
        Subscription("qpid.management", "console.#"),
        Subscription("qpid.management", "schema.#"),
        Subscription("qmf.default.topic", "agent.ind.#"),
    ]
    assert subscriptions("qpidd", queue="q1") == [Subscription("q1")]
    assert subscriptions("rabbitmq", sources=["/queue/x"]) == [Subscription("/queue/x")]
    assert parse_binding("qmf.default.topic:agent.ind.#") == ("qmf.default.topic", "agent.ind.#")
    assert parse_binding("mgmt.#") == ("qpid.management", "mgmt.#")
    with pytest.raises(ConfigError):
        ReceiverConfig(preset="activemq")
    cfg = config_from_options(
        {"URL": "amqp://h:1", "bind": "a:b.#,c:d", "flushMs": "20", "credit": "64"}
    )
    assert cfg.bindings == (("a", "b.#"), ("c", "d"))
    assert (cfg.flush_ms, cfg.credit_window, cfg.broker.urls) == (20.0, 64, ("amqp://h:1",))
    with pytest.raises(ConfigError, match="unknown receiver options: bogus"):
        config_from_options({"bogus": "1"})


def test_console_refresh_options_of_receive_run_and_the_embedded_receiver() -> None:
    """``qmf receive --console-refresh/--console-refresh-classes``, the embedded receiver's
    ``consoleRefresh``/``consoleRefreshClasses``, and ``qmf run`` forwarding them."""
    from pipeline.cli import build_parser
    from pipeline.commands.run import _receiver_options
    from receivers.cliopts import receiver_config
    from receivers.console import BROKER_PACKAGE, DEFAULT_REFRESH_CLASSES

    parser = build_parser()
    plain = receiver_config(parser.parse_args(["receive", "--console"])).console
    assert plain is not None and (plain.refresh_s, plain.refresh_classes) == (
        20.0, DEFAULT_REFRESH_CLASSES,
    )  # fmt: skip
    assert DEFAULT_REFRESH_CLASSES == tuple(
        (BROKER_PACKAGE, c) for c in ("queue", "exchange", "broker")
    )
    args = parser.parse_args(["receive", "--console", "--console-refresh", "0",
                              "--console-refresh-classes", "queue,org.example:widget"])  # fmt: skip
    off = receiver_config(args).console
    assert off is not None and (off.refresh_s, off.refresh_classes) == (
        0.0, ((BROKER_PACKAGE, "queue"), ("org.example", "widget")),
    )  # fmt: skip
    with pytest.raises(ValueError, match="0 \\(off\\) or more seconds"):
        receiver_config(parser.parse_args(["receive", "--console", "--console-refresh", "-1"]))
    embedded = config_from_options({"console": "true", "consoleRefresh": "5",
                                    "console_refresh_classes": "exchange"}).console  # fmt: skip
    assert embedded is not None
    assert (embedded.refresh_s, embedded.refresh_classes) == (5.0, ((BROKER_PACKAGE, "exchange"),))
    default = config_from_options({"console": "true"}).console
    assert default is not None and default.refresh_s == 20.0
    run = parser.parse_args(["run", "--console", "AM2", "--console-refresh", "2.5",
                             "--console-refresh-classes", "queue"])  # fmt: skip
    opts = _receiver_options(run, "amqp://h:1", Path("w"))
    assert (opts["consoleRefresh"], opts["consoleRefreshClasses"]) == ("2.5", "queue")
    forwarded = config_from_options(opts).console
    assert forwarded is not None and forwarded.refresh_s == 2.5
    no_console = _receiver_options(
        parser.parse_args(["run", "--console-refresh", "2"]), "u", Path("w")
    )
    assert "consoleRefresh" not in no_console and "console" not in no_console
    assert "consoleRefresh" not in _receiver_options(
        parser.parse_args(["run", "--console", "AM2"]), "u", Path("w")
    )  # the embedded receiver's own default then


def test_publisher_message_round_trips_through_the_mapping() -> None:
    out = OutMessage(
        routing_key="agent.ind.data.x",
        body=bytes(range(256)),
        application_properties={"qmf.opcode": "_data_indication", "n": 7, "flag": True},
        content_type="amqp/list",
        app_id="qmf2",
        message_id="m-1",
        correlation_id=42,
        reply_to="/exchange/amq.direct/r1",
    )
    msg = build_message(out)
    assert msg.subject == "agent.ind.data.x" and msg.inferred
    assert msg.properties is not None and msg.properties[APP_ID_PROPERTY] == "qmf2"
    # what a receiver gets back after the wire
    wire = Message()
    wire.decode(msg.encode())
    wire.first_acquirer = True  # as RabbitMQ delivers a message the first time
    got = to_landed(wire, received_at_us=1_700_000_000_000_000)
    assert got == LandedMessage(
        body=bytes(range(256)),
        routing_key="agent.ind.data.x",
        subject="agent.ind.data.x",
        message_id="m-1",
        correlation_id="42",
        reply_to="/exchange/amq.direct/r1",
        app_id="qmf2",
        content_type="amqp/list",
        application_properties={"qmf.opcode": "_data_indication", "n": "7", "flag": "true"},
        received_at_us=1_700_000_000_000_000,
    )


def test_mapping_edge_cases() -> None:
    m = Message(body=b"x", inferred=True)
    got = to_landed(m, received_at_us=1)
    assert (got.content_type, got.routing_key, got.subject, got.app_id) == (None, None, None, None)
    m = Message(body=b"x", inferred=True, subject="s.1")
    m.annotations = {symbol("x-opt-routing-key"): "rk.2"}
    got = to_landed(m, received_at_us=1)
    assert (got.routing_key, got.subject) == ("rk.2", "s.1")
    m = Message(body={"a": 1}, subject="s")
    got = to_landed(m, received_at_us=1)
    assert got.application_properties == {BODY_ENCODING_PROPERTY: "amqp-1.0"}
    assert got.body[:1] == b"\xd1"  # AMQP 1.0 map32 constructor
    m = Message(body=None, subject="s")
    assert to_landed(m, received_at_us=1).body == b""


def test_capture_record_and_replay_mapping() -> None:
    lm = LandedMessage(
        body=b"\x00\xffAM2",
        routing_key="console.obj.1.0.org.apache.qpid.broker.queue",
        subject="console.obj.1.0.org.apache.qpid.broker.queue",
        message_id="id-9",
        correlation_id="c-9",
        app_id="qmf2",
        content_type="amqp/map",
        application_properties={"qmf.opcode": "_query_response"},
        received_at_us=1_763_802_150_111_153,
    )
    rec = capture_record(lm, "/exchange/qpid.management/console.#")
    assert rec == {
        "application_properties": {"qmf.opcode": "_query_response"},
        "body_base64": base64.b64encode(b"\x00\xffAM2").decode(),
        "content_type": "amqp/map",
        "properties": {
            "app_id": "qmf2",
            "content_length": 5,
            "content_type": "amqp/map",
            "correlation_id": "c-9",
            "message_id": "id-9",
            "routing_key": "console.obj.1.0.org.apache.qpid.broker.queue",
            "x-capture-source": "/exchange/qpid.management/console.#",
        },
        "received_at": "2025-11-22T09:02:30.111153Z",
        "routing_key": "console.obj.1.0.org.apache.qpid.broker.queue",
        "subject": "console.obj.1.0.org.apache.qpid.broker.queue",
    }
    out = to_out_message(json.loads(json.dumps(rec)))
    assert out == OutMessage(
        routing_key="console.obj.1.0.org.apache.qpid.broker.queue",
        body=b"\x00\xffAM2",
        application_properties={"qmf.opcode": "_query_response"},
        content_type="amqp/map",
        app_id="qmf2",
        message_id="id-9",
        correlation_id="c-9",
        exchange="qpid.management",
    )


def test_replay_of_the_qpidd_sample_records(shared_dir: str) -> None:
    path = Path(shared_dir) / "samples" / "qpidd-capture-20s.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    outs = [to_out_message(r) for r in recs]
    assert len(outs) == 863
    assert all(o.routing_key for o in outs)
    assert {o.exchange for o in outs if o.routing_key.startswith("agent.")} == {"qmf.default.topic"}
    with_reply = [o for o in outs if o.reply_to]
    assert [o.reply_to for o in with_reply] == [
        "/exchange/qmf.default.direct/cap-v2reply-0b4aa0e2",
        "/exchange/qmf.default.direct/qmfc-v2-vm.28266.1",
    ]
    with_ttl = [o for o in outs if o.ttl_s is not None]
    assert sorted(o.ttl_s or 0.0 for o in with_ttl) == [1.998] + [1.999] * 17
    assert parse_routes(["x.=ex1", "=ex2"]) == (("x.", "ex1"), ("", "ex2"))


def test_redelivery_flag_per_broker() -> None:
    """RabbitMQ sets first-acquirer on a first delivery, so false means redelivered;
    a broker that leaves it at AMQP's default (false) is judged by delivery-count."""
    first = Message(body=b"x", subject="s")
    first.first_acquirer = True
    again = Message(body=b"x", subject="s")  # first-acquirer false (RabbitMQ's redelivery)
    counted = Message(body=b"x", subject="s")
    counted.delivery_count = 1
    assert [to_landed(m, 1).redelivered for m in (first, again, counted)] == [False, True, True]
    assert [to_landed(m, 1, first_acquirer_flag=False).redelivered
            for m in (first, again, counted)] == [False, False, True]  # fmt: skip


@pytest.mark.parametrize("list_section", ["amqp-value", "amqp-sequence"])
@pytest.mark.parametrize("sample", ["default-60s", "qmf1-qmf2-60s"])
def test_replayed_amqp10_bodies_land_as_the_same_bytes(
    shared_dir: str, sample: str, list_section: str
) -> None:
    """qpidd's QMF v2 amqp-value bodies, landed AMQP 1.0 encoded and flagged: replay
    sends each as an amqp-value section again (flag not forwarded; a list as an
    amqp-sequence towards RabbitMQ), and the receiver's mapping gives back the captured
    bytes and the flag; data-section bodies stay data."""
    path = Path(shared_dir) / "samples" / "qpidd-amqp10" / f"{sample}.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    flagged = 0
    for rec in recs:
        out = to_out_message(rec)
        encoding = rec["application_properties"].get(BODY_ENCODING_PROPERTY)
        assert out.body_encoding == encoding
        assert BODY_ENCODING_PROPERTY not in (out.application_properties or {})
        msg = build_message(out, list_section)
        is_list = encoding is not None and rec["content_type"] == "amqp/list"
        assert msg.inferred is (encoding is None or (is_list and list_section == "amqp-sequence"))
        wire = Message()
        wire.decode(msg.encode())
        got = to_landed(wire, received_at_us=1)
        assert got.body == base64.b64decode(rec["body_base64"])
        assert got.application_properties == {
            k: str(v) for k, v in rec["application_properties"].items()
        }
        flagged += encoding == "amqp-1.0"
    # both captures hold 523 v2 messages (amqp-value); the rest are data sections
    assert (flagged, len(recs)) == (523, 618 if sample == "default-60s" else 1143)


def test_a_body_that_is_not_one_amqp10_value_is_refused() -> None:
    rec = {"routing_key": "agent.ind.data.x", "body_base64": base64.b64encode(b"\xd1\x00").decode(),
           "application_properties": {BODY_ENCODING_PROPERTY: "amqp-1.0"}}  # fmt: skip
    with pytest.raises(ValueError, match=r"not one AMQP 1\.0 value"):
        build_message(to_out_message(rec))
    rec["body_base64"] = base64.b64encode(b"\x40\x40").decode()  # two nulls
    with pytest.raises(ValueError, match="1 bytes after it"):
        build_message(to_out_message(rec))
    rec["application_properties"] = {BODY_ENCODING_PROPERTY: "amqp-7"}
    with pytest.raises(ValueError, match="unknown x-qmf-body-encoding 'amqp-7'"):
        to_out_message(rec)
