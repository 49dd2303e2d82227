"""The fleet file (receivers.fleet) and what a broker's name does on the landing log.

Pure code and files: the two-broker run with real nodes is
``tests/integration/test_fleet.py``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from receivers.config import ConfigError
from receivers.fleet import load_fleet, parse_fleet
from receivers.landing import LandedMessage, LandingError, LandingLog, LandingWriter
from receivers.receiver import LandingSink, ReceiverError

FLEET = """
[defaults]
preset = "qpidd"
heartbeat_interval = 10
sasl = ["PLAIN"]

[[broker]]
name = "east"
url = "amqps://east.example.com:5671"
ca_file = "certs/ca.pem"
credentials_file = "east.credentials"
console = "AM2"
console_refresh = 30

[[broker]]
name = "west-2"
urls = ["amqp://w1:5672", "amqp://w2:5672"]
preset = "rabbitmq"
queue = "qmf.pipeline"
heartbeat_interval = 5
partition = "west-main"
"""


def test_a_fleet_file_gives_each_broker_its_receiver_options(tmp_path: Path) -> None:
    (tmp_path / "fleet.toml").write_text(FLEET, encoding="utf-8")
    (tmp_path / "east.credentials").write_text("user=qmf\npassword=s3cret\n", encoding="utf-8")
    fleet = load_fleet(tmp_path / "fleet.toml")
    east, west = fleet.brokers
    assert fleet.names() == ["east", "west-2"]
    assert dict(east.options) == {
        "preset": "qpidd",
        "saslMechanisms": "PLAIN",
        "urls": "amqps://east.example.com:5671",
        "caFile": str(tmp_path / "certs" / "ca.pem"),  # relative to the file
        "credentialsFile": str(tmp_path / "east.credentials"),
        "consoleDialect": "AM2",
        "console": "true",
        "consoleRefresh": "30",
    }
    assert east.receiver_options("/w")["consoleWants"] == "/w"
    assert "consoleWants" not in west.receiver_options("/w")  # no console, no wants
    assert dict(west.options) == {
        "preset": "rabbitmq",
        "saslMechanisms": "PLAIN",
        "urls": "amqp://w1:5672,amqp://w2:5672",
        "queue": "qmf.pipeline",
    }
    assert (east.partition, west.partition) == (None, "west-main")
    assert fleet.heartbeat_intervals() == {"east": 10.0, "west-2": 5.0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no [[broker]] table"),
        ("[[broker]]\nname = 'a'\n", "broker 1 (a): a url is required"),
        ("[[broker]]\nname = 'a b'\nurl = 'amqp://h'\n", "name must be letters"),
        ("[[broker]]\nname = 'a'\nurl = 'amqp://h'\npassword = 'x'\n",
         "no password in the file: use credentials_file"),
        ("[[broker]]\nname = 'a'\nurl = 'amqp://h'\nprefetch = 1\n", "unknown key 'prefetch'"),
        ("[[broker]]\nname = 'a'\nurl = 'amqp://h'\n[[broker]]\nname = 'a'\nurl = 'amqp://g'\n",
         "two brokers named 'a'"),
        ("[[broker]]\nname = 'a'\nurl = 'amqp://h'\nheartbeat_interval = 0\n",
         "heartbeat_interval must be positive"),
        ("[[broker]]\nname = 'a'\nurl = 'amqp://h'\nconsole = 'V2'\n", "console must be AM1 or AM2"),
        ("[[broker]]\nname = 'a'\nurl = 'amqp://h'\npreset = 'kafka'\n", "unknown preset 'kafka'"),
        ("[[broker]]\nname = 'a'\nurl = 'http://h'\n", "unsupported URL scheme 'http'"),
        ("[[broker]]\nname = 'a'\nurl = 'amqp://h'\ncredit = 'many'\n", "credit must be a number"),
        ("[defaults]\nname = 'a'\n[[broker]]\nname = 'b'\nurl = 'amqp://h'\n",
         "[defaults] cannot set name"),
        ("[brokers]\n", "unknown table(s) brokers"),
        ("[[broker]\n", "not valid TOML"),
    ],
)  # fmt: skip
def test_a_bad_fleet_file_is_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_fleet(text, path="fleet.toml")
    assert message in str(err.value)
    assert str(err.value).startswith("fleet.toml")


def test_a_missing_fleet_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"fleet configuration .*nope.toml does not exist"):
        load_fleet(tmp_path / "nope.toml")


def _msg(i: int) -> LandedMessage:
    return LandedMessage(body=f"m{i}".encode(), routing_key=f"mgmt.a.q{i}", received_at_us=i + 1)


def test_each_broker_lands_in_partitions_of_its_own_with_its_name(tmp_path: Path) -> None:
    east = LandingSink(tmp_path, broker="east")
    east2 = LandingSink(tmp_path, broker="east")  # a second receiver of the same broker
    west = LandingSink(tmp_path, broker="west")
    assert (east.partition, east2.partition, west.partition) == ("east-0", "east-1", "west-0")
    east.append([_msg(0), _msg(1)])
    west.append([_msg(2)])
    for s in (east, east2, west):
        s.close()
    log = LandingLog(tmp_path)
    assert log.read("east-0", 0, 2).column("broker_name").to_pylist() == ["east", "east"]
    assert log.read("west-0", 0, 1).column("broker_name").to_pylist() == ["west"]
    # A restarted receiver continues its broker's partition, never another's.
    again = LandingSink(tmp_path, broker="west")
    assert again.partition == "west-0" and again.next_offset == 1
    again.close()
    with pytest.raises(ReceiverError, match=r"holds broker 'east'.s messages, not 'west'.s"):
        LandingSink(tmp_path, "east-0", broker="west")
    # The lock of the refused sink was released: east's own receiver takes it.
    LandingSink(tmp_path, "east-0", broker="east").close()


def test_segments_landed_before_fleets_are_the_default_brokers(tmp_path: Path) -> None:
    w = LandingWriter(tmp_path, "p0")
    w.append([_msg(0)])
    seg = next((tmp_path / "p0").glob("*.arrow"))
    t = ipc.open_file(pa.memory_map(str(seg))).read_all().drop_columns(["broker_name"])
    with ipc.new_file(str(seg), t.schema) as f:  # a segment of the release before fleets
        f.write_table(t)
    (tmp_path / "p0" / ".broker").unlink()
    assert LandingLog(tmp_path).read("p0", 0, 1).column("broker_name").to_pylist() == ["default"]
    with pytest.raises(LandingError, match="holds broker 'default'"):
        LandingWriter(tmp_path, "p0", broker="east")
    LandingWriter(tmp_path, "p0").append([_msg(1)])  # the unnamed broker continues it


def test_a_redelivery_is_matched_only_to_its_own_brokers_messages(tmp_path: Path) -> None:
    """Two brokers may carry identical messages: one's redelivery is never the other's."""
    east = LandingSink(tmp_path, broker="east")
    east.append([_msg(0)])
    east.close()  # died before settling: offset 0 is in doubt
    west = LandingSink(tmp_path, broker="west")
    again = LandedMessage(body=b"m0", routing_key="mgmt.a.q0", received_at_us=9, redelivered=True)
    west.append([again])
    west.close()
    assert LandingLog(tmp_path).read("west-0", 0, 1).column("duplicate_of").to_pylist() == [None]
    east = LandingSink(tmp_path, broker="east")  # east's own redelivery matches
    east.append([again])
    east.close()
    assert LandingLog(tmp_path).read("east-0", 1, 2).column("duplicate_of").to_pylist() == [
        "east-0:0"
    ]


@pytest.mark.broker
def test_the_sparks_sources_embedded_fleet_lands_each_brokers_messages(
    broker: object, tmp_path: Path
) -> None:
    """``qmf run --config``'s path: the source's ``start_embedded`` with a fleet file."""
    import uuid

    from pipeline.broker import declare_queue, delete_queue
    from receivers.config import BrokerConfig
    from receivers.fleet import FleetReceivers
    from receivers.publisher import OutMessage, Publisher
    from receivers.receiver import start_embedded
    from tests.integration.e2e import wait_for

    url = broker.url  # type: ignore[attr-defined]
    tag = uuid.uuid4().hex[:8]
    fleet = tmp_path / "fleet.toml"
    text = "".join(f'[[broker]]\nname = "{n}"\nurl = "{url}"\nqueue = "fleet-{tag}-{n}"\n'
                   for n in ("east", "west"))  # fmt: skip
    fleet.write_text(text, encoding="utf-8")
    for n in ("east", "west"):
        declare_queue(f"fleet-{tag}-{n}", [("qpid.management", f"mgmt.{tag}.{n}")])
    try:
        fr = start_embedded(str(tmp_path / "landing"), {"config": str(fleet)})
        assert isinstance(fr, FleetReceivers)
        assert {k: v["subscribed"] for k, v in fr.status().items()} == {"east": True, "west": True}
        with Publisher(BrokerConfig(urls=(url,))) as pub:
            for n, count in (("east", 3), ("west", 2)):
                msgs = [OutMessage(f"mgmt.{tag}.{n}", f"{n}{i}".encode(),
                                   exchange="qpid.management") for i in range(count)]  # fmt: skip
                assert pub.publish_many(msgs) == count
        log = LandingLog(tmp_path / "landing")
        wait_for(lambda: log.end_offsets() == {"east-0": 3, "west-0": 2}, 30, "both landed")
        fr.stop()
        assert log.read("west-0", 0, 2).column("broker_name").to_pylist() == ["west", "west"]
        assert log.read("east-0", 0, 3).column("body").to_pylist() == [b"east0", b"east1", b"east2"]
    finally:
        for n in ("east", "west"):
            delete_queue(f"fleet-{tag}-{n}")
