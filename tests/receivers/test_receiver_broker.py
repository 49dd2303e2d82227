"""The receiver against the real project-local RabbitMQ node.

Every test binds its own routing-key prefix (``mgmt.<tag>.#``) so parallel
traffic from other tests on the shared node never reaches it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pytest

from pipeline import broker as qmf_broker
from receivers.config import BrokerConfig
from receivers.landing import LandedMessage, LandingLog, message_key
from receivers.publisher import OutMessage, Publisher, PublishError
from receivers.receiver import (
    CaptureSink,
    LandingSink,
    QmfReceiver,
    ReceiverConfig,
    ReceiverError,
)
from tests.relay import FreezableRelay

pytestmark = pytest.mark.broker

REPO = Path(__file__).resolve().parents[2]


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``cond`` until true; a bounded wait, not a timing assertion."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def body_for(i: int) -> bytes:
    """Bodies of 0..299 bytes; together they hold every byte value many times."""
    if i == 0:
        return bytes(range(256))
    return bytes((i * 7 + j) % 256 for j in range(i % 300))


def make_messages(tag: str, n: int) -> list[OutMessage]:
    return [
        OutMessage(
            routing_key=f"mgmt.{tag}.prop.org.apache.qpid.broker.c{i % 7}",
            body=body_for(i),
            message_id=f"{tag}-{i}",
            application_properties={"seq": str(i)},
        )
        for i in range(n)
    ]


def expected_key(m: OutMessage) -> str:
    return message_key(
        LandedMessage(
            body=m.body,
            routing_key=m.routing_key,
            subject=m.routing_key,
            message_id=str(m.message_id),
            application_properties={k: str(v) for k, v in (m.application_properties or {}).items()},
        )
    )


def landed_table(root: Path) -> pa.Table:
    log = LandingLog(root)
    parts = [log.read(p, log.start_offsets()[p], end) for p, end in log.end_offsets().items()]
    return pa.concat_tables(parts) if parts else pa.table({})


def landed_rows(root: Path) -> int:
    return sum(LandingLog(root).end_offsets().values())


@pytest.fixture
def tag() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def durable_queue(broker: Any, tag: str) -> Iterator[str]:
    name = f"qmf-test-{tag}"
    qmf_broker.declare_queue(name, [("qpid.management", f"mgmt.{tag}.#")])
    try:
        yield name
    finally:
        qmf_broker.delete_queue(name)


class ReceiverProcess:
    """``qmf receive`` as a child process (python -m pipeline.cli), stderr to a file."""

    def __init__(self, tmp: Path, name: str, args: list[str]) -> None:
        self.err_path = tmp / f"{name}.stderr"
        self.err = open(self.err_path, "wb")  # closed in wait()/kill()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "receive", *args],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.err,
        )

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        wait_for(
            lambda: "ready: subscribed" in self.stderr() or self.proc.poll() is not None,
            timeout_s,
            "the receiver to subscribe",
        )
        assert self.proc.poll() is None, self.stderr()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout_s)
        finally:
            self.err.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.err.close()


@pytest.fixture
def procs() -> Iterator[list[ReceiverProcess]]:
    started: list[ReceiverProcess] = []
    yield started
    for p in started:
        p.kill()


def run_receiver_thread(cfg: ReceiverConfig, sink: Any) -> QmfReceiver:
    r = QmfReceiver(cfg, sink)
    r.start_thread()
    wait_for(lambda: r.ready.is_set() or r.error is not None, 30, "subscription")
    assert r.error is None
    return r


def test_lands_exactly_what_was_published(broker: Any, tag: str, tmp_path: Path) -> None:
    n = 1500
    msgs = make_messages(tag, n)
    cfg = ReceiverConfig(
        broker=BrokerConfig(urls=(broker.url,)),
        bindings=(("qpid.management", f"mgmt.{tag}.#"),),
        flush_count=200,
    )
    r = run_receiver_thread(cfg, LandingSink(tmp_path / "landing", "p0"))
    try:
        with Publisher(broker.url, window=500) as pub:
            assert pub.publish_many(msgs) == n
            assert (pub.accepted, pub.rejected) == (n, 0)
        wait_for(lambda: r.stats.settled >= n, 60, f"{n} settled messages")
    finally:
        r.stop()
    assert (r.stats.received, r.stats.landed, r.stats.settled) == (n, n, n)
    t = landed_table(tmp_path / "landing")
    assert t.num_rows == n
    assert t.column("offset").to_pylist() == list(range(n))
    assert t.column("body").to_pylist() == [m.body for m in msgs]
    assert t.column("routing_key").to_pylist() == [m.routing_key for m in msgs]
    assert t.column("subject").to_pylist() == [m.routing_key for m in msgs]
    assert t.column("message_id").to_pylist() == [m.message_id for m in msgs]
    assert t.column("msg_key").to_pylist() == [expected_key(m) for m in msgs]
    all_bytes = set(b"".join(t.column("body").to_pylist()))
    assert all_bytes == set(range(256))


def test_large_bodies_land_whole(broker: Any, tag: str, tmp_path: Path) -> None:
    """Real 'i' bodies reach ~100 KB: multi-frame transfers land byte for byte."""
    sizes = [100, 5_000, 100_000, 1_000_000, 4_000_000, 100] * 3
    rng = random.Random(7)
    msgs = [
        OutMessage(routing_key=f"mgmt.{tag}.stat.c{i}", body=rng.randbytes(n), message_id=f"{tag}-{i}")
        for i, n in enumerate(sizes)
    ]
    cfg = ReceiverConfig(
        broker=BrokerConfig(urls=(broker.url,)),
        bindings=(("qpid.management", f"mgmt.{tag}.#"),),
        flush_count=4,
    )
    r = run_receiver_thread(cfg, LandingSink(tmp_path / "landing", "p0"))
    try:
        with Publisher(broker.url, window=8) as pub:
            assert pub.publish_many(msgs) == len(msgs)
        wait_for(lambda: r.stats.settled >= len(msgs), 60, "every message settled")
    finally:
        r.stop()
    t = landed_table(tmp_path / "landing")
    assert t.column("body").to_pylist() == [m.body for m in msgs]
    assert t.column("msg_key").to_pylist() == [expected_key(m) for m in msgs]
    assert t.column("redelivered").to_pylist() == [False] * len(msgs)


def test_sigkill_at_five_random_points_then_restart_loses_nothing(
    broker: Any, tag: str, durable_queue: str, tmp_path: Path, procs: list[ReceiverProcess]
) -> None:
    n = 8000
    msgs = make_messages(tag, n)
    with Publisher(broker.url) as pub:
        pub.publish_many(msgs)
    root = tmp_path / "landing"
    args = [
        "--url", broker.url, "--queue", durable_queue, "--landing", str(root),
        "--partition", "p0", "--flush-count", "100", "--flush-ms", "20", "--credit", "300",
    ]  # fmt: skip
    seed = random.randrange(2**32)
    points = sorted(random.Random(seed).sample(range(n // 20, n * 17 // 20), 5))

    def distinct() -> int:
        return len(set(landed_table(root).column("msg_key").to_pylist()))

    for i, point in enumerate(points):
        p = ReceiverProcess(tmp_path, f"killed{i}", args)
        procs.append(p)
        p.wait_ready()
        wait_for(lambda: landed_rows(root) >= point, 120, f"{point} rows landed (seed {seed})")  # noqa: B023
        p.signal(signal.SIGKILL)
        assert p.wait() == -signal.SIGKILL
        assert distinct() < n, f"kill {i} at {point} rows must come mid-stream (seed {seed})"

    last = ReceiverProcess(tmp_path, "last", args)
    procs.append(last)
    last.wait_ready()
    wait_for(lambda: distinct() >= n, 120, "every message landed")
    last.signal(signal.SIGTERM)
    assert last.wait() == 0, last.stderr()

    t = landed_table(root)
    keys = t.column("msg_key").to_pylist()
    assert t.num_rows >= n
    assert set(keys) == {expected_key(m) for m in msgs}
    assert t.column("offset").to_pylist() == list(range(t.num_rows))
    # every row, duplicate or not, is an exact copy of a published message
    by_key = {expected_key(m): m for m in msgs}
    for row in t.select(["msg_key", "body", "routing_key"]).to_pylist():
        m = by_key[row["msg_key"]]
        assert (row["body"], row["routing_key"]) == (m.body, m.routing_key)
    dups = sum(c - 1 for c in Counter(keys).values())
    assert t.num_rows == n + dups
    wait_for(lambda: qmf_broker.queue_depths().get(durable_queue) == 0, 60, "an empty queue")


def test_sigterm_lands_and_settles_everything_in_hand(
    broker: Any, tag: str, durable_queue: str, tmp_path: Path, procs: list[ReceiverProcess]
) -> None:
    n = 3000
    msgs = make_messages(tag, n)
    with Publisher(broker.url) as pub:
        pub.publish_many(msgs)
    root = tmp_path / "landing"
    args = [
        "--url", broker.url, "--queue", durable_queue, "--landing", str(root),
        "--partition", "p0", "--flush-count", "100", "--flush-ms", "1000", "--credit", "300",
        # a node busy with the other tests' work (CI) has taken over 10 s to answer
        "--stop-timeout", "120",
    ]  # fmt: skip
    p = ReceiverProcess(tmp_path, "term", args)
    procs.append(p)
    p.wait_ready()
    wait_for(lambda: landed_rows(root) >= 500, 120, "500 messages landed")
    p.signal(signal.SIGTERM)
    assert p.wait(180) == 0, p.stderr()
    landed = landed_table(root)
    keys = landed.column("msg_key").to_pylist()
    assert len(keys) == len(set(keys)), "a clean stop settles all it landed: no redelivery"
    assert len(keys) < n, "the stop must come mid-stream"
    err = p.stderr()
    stopped = f"stopped: {len(keys)} received, {len(keys)} landed, {len(keys)} settled; "
    confirmed = stopped + "the broker confirmed every settlement"
    # A node starved of CPU by a parallel suite has twice (CI-22, CI-23) left the session
    # end unanswered for the whole timeout; the receiver then seals as designed. Only
    # that reason is allowed: a dropped connection or any other note still fails here,
    # and the queue's depth below still proves every settlement arrived.
    starved = re.compile(
        re.escape(stopped) + r"the broker did not confirm the close within 120\.0 s "
        r"\(unanswered: (1 session ends and )?the connection close after 1[2-9]\d\.\d s\)"
    )
    assert confirmed in err or starved.search(err), err
    # what was landed was settled, what was not is still queued: together exactly n
    seen: list[int | None] = []

    def depth_is_the_rest() -> bool:
        seen.append(qmf_broker.queue_depths().get(durable_queue))
        return seen[-1] == n - len(keys)

    try:
        wait_for(depth_is_the_rest, 60, f"queue depth {n - len(keys)}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; depths seen {seen[:3]}..{seen[-3:]}; {err}") from None


def test_a_stop_the_broker_never_answers_seals_what_it_settled_as_in_doubt(
    broker: Any, tag: str, durable_queue: str, tmp_path: Path
) -> None:
    """The last group is settled into a connection the broker no longer reads: the stop
    ends at its deadline, says so, and the next receiver's redeliveries of that group are
    matched to their landed copies (``duplicate_of``) instead of landing as new."""
    n = 300
    msgs = make_messages(tag, n)
    relay = FreezableRelay(broker.url)
    cfg = ReceiverConfig(
        broker=BrokerConfig(urls=(relay.url,)), queue=durable_queue,
        flush_count=10_000, flush_ms=600_000.0, stop_timeout_s=2.0,
    )  # fmt: skip
    root = tmp_path / "landing"
    try:
        r = run_receiver_thread(cfg, LandingSink(root, "p0"))
        with Publisher(broker.url) as pub:
            pub.publish_many(msgs)
        wait_for(lambda: r.stats.received == n, 60, f"{n} messages in hand")
        relay.freeze()
        r.stop()  # lands and settles all n, into the frozen relay
        assert (r.stats.received, r.stats.landed, r.stats.settled) == (n, n, n)
        assert r.close_note.startswith(
            "the broker did not confirm the close within 2.0 s (unanswered: 1 session ends"
            " and the connection close after 2."
        ), r.close_note
    finally:
        relay.close()
    wait_for(lambda: qmf_broker.queue_depths().get(durable_queue) == n, 60, "all n back in the queue")

    cfg = ReceiverConfig(broker=BrokerConfig(urls=(broker.url,)), queue=durable_queue, flush_count=100)
    r = run_receiver_thread(cfg, LandingSink(root, "p0"))
    try:
        wait_for(lambda: r.stats.settled == n, 60, f"{n} redeliveries settled")
    finally:
        r.stop()
    assert r.close_note == "the broker confirmed every settlement"
    t = landed_table(root)
    first = {k: f"p0:{o}" for k, o in zip(t["msg_key"].to_pylist()[:n], range(n), strict=True)}
    assert sorted(first) == sorted(expected_key(m) for m in msgs)
    assert t["redelivered"].to_pylist() == [False] * n + [True] * n
    assert t["duplicate_of"].to_pylist() == [None] * n + [first[k] for k in t["msg_key"].to_pylist()[n:]]
    wait_for(lambda: qmf_broker.queue_depths().get(durable_queue) == 0, 60, "an empty queue")


def test_a_reconnect_is_logged_once_with_the_address_and_the_time_down(
    broker: Any, tag: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lost connection is followed by one INFO line once the receiver is subscribed
    again: ``receiver: reconnected to <host:port> after <n> s``, no credentials in it."""
    relay = FreezableRelay(broker.url)
    caplog.set_level(logging.INFO, logger="qmf.receiver")
    cfg = ReceiverConfig(
        broker=BrokerConfig(urls=(relay.url,)),
        bindings=(("qpid.management", f"mgmt.{tag}.#"),),
        backoff_initial_s=0.05,
    )
    msgs = make_messages(tag, 20)
    try:
        r = run_receiver_thread(cfg, LandingSink(tmp_path / "landing", "p0"))
        try:
            assert not [m for m in caplog.messages if "reconnected" in m]  # a first connect
            relay.drop()
            wait_for(lambda: r.stats.connects == 2 and r.ready.is_set(), 60, "the reconnect")
            with Publisher(broker.url) as pub:
                pub.publish_many(msgs)  # the new subscription works
            wait_for(lambda: r.stats.settled == len(msgs), 60, "messages after the reconnect")
        finally:
            r.stop()
    finally:
        relay.close()
    lines = [m for m in caplog.messages if "reconnected" in m]
    host_port = urlsplit(relay.url).netloc.rsplit("@", 1)[-1]  # the relay's URL has guest:guest@
    [line] = lines
    assert re.fullmatch(rf"receiver: reconnected to {re.escape(host_port)} after \d+\.\d s", line)
    assert r.stats.disconnects == 1  # the whole line: a host and port, no user-info


def test_capture_replay_capture_round_trip(broker: Any, tag: str, tmp_path: Path) -> None:
    n = 1200
    msgs = [
        OutMessage(
            routing_key=f"mgmt.{tag}.event.org.apache.qpid.broker.e{i % 5}",
            body=body_for(i),
            message_id=f"{tag}-{i}" if i % 2 else None,
            correlation_id=f"c{i}" if i % 3 == 0 else None,
            reply_to="/exchange/amq.direct/replies" if i % 4 == 0 else None,
            content_type="amqp/map" if i % 5 == 0 else None,
            app_id="qmf2" if i % 6 == 0 else None,
            application_properties={"qmf.opcode": "_data_indication", "i": str(i)}
            if i % 2 == 0
            else None,
        )
        for i in range(n)
    ]
    bind = (("qpid.management", f"mgmt.{tag}.#"),)
    cfg = ReceiverConfig(broker=BrokerConfig(urls=(broker.url,)), bindings=bind)

    def capture(path: Path, publish: Callable[[], None]) -> list[dict[str, Any]]:
        sink = CaptureSink(path, "test")
        r = run_receiver_thread(cfg, sink)
        try:
            publish()
            wait_for(lambda: r.stats.settled >= n, 60, f"{n} captured")
        finally:
            r.stop()
        return [json.loads(line) for line in path.read_text().splitlines()]

    def publish_original() -> None:
        with Publisher(broker.url) as pub:
            pub.publish_many(msgs)

    first = capture(tmp_path / "first.jsonl", publish_original)

    def replay() -> None:
        out = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "replay", "--url", broker.url,
             "--input", str(tmp_path / "first.jsonl")],
            cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert f"replayed {n} messages" in out.stderr

    second = capture(tmp_path / "second.jsonl", replay)

    def stable(rec: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in rec.items() if k != "received_at"}

    assert len(first) == len(second) == n
    assert [stable(r) for r in second] == [stable(r) for r in first]
    assert first[0]["body_base64"] == base64.b64encode(bytes(range(256))).decode()
    assert first[12]["properties"] == {
        "app_id": "qmf2",
        "content_length": 12,
        "correlation_id": "c12",
        "reply_to": "/exchange/amq.direct/replies",
        "routing_key": f"mgmt.{tag}.event.org.apache.qpid.broker.e2",
        "x-capture-source": "test",
    }


def test_wrong_password_fails_fast_with_a_clear_error(broker: Any, tmp_path: Path) -> None:
    url = f"amqp://guest:wrong-password@127.0.0.1:{broker.port}"
    r = QmfReceiver(
        ReceiverConfig(broker=BrokerConfig(urls=(url,))), LandingSink(tmp_path / "l", "p0")
    )
    with pytest.raises(ReceiverError, match="amqp:unauthorized-access") as exc:
        r.run(duration_s=60)
    assert "wrong-password" not in str(exc.value)
    with pytest.raises(PublishError, match="amqp:unauthorized-access"):
        Publisher(url)
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "receive", "--url", url,
         "--landing", str(tmp_path / "l2"), "--duration", "60"],
        cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 1
    assert "Authentication failed" in out.stderr and "wrong-password" not in out.stderr


def test_publisher_reports_a_missing_exchange(broker: Any) -> None:
    with Publisher(broker.url) as pub:
        with pytest.raises(PublishError, match=r"no exchange 'not\.an\.exchange'"):
            pub.publish("k", b"x", exchange="not.an.exchange")
            pub.flush(timeout_s=30)
        pub.close(flush=False)


def test_competing_receivers_each_write_their_own_partition(
    broker: Any, tag: str, durable_queue: str, tmp_path: Path
) -> None:
    n = 2000
    msgs = make_messages(tag, n)
    root = tmp_path / "landing"
    cfg = ReceiverConfig(
        broker=BrokerConfig(urls=(broker.url,)), queue=durable_queue, credit_window=50,
        flush_count=25,
    )  # fmt: skip
    a = run_receiver_thread(cfg, LandingSink(root))
    b = run_receiver_thread(cfg, LandingSink(root))
    try:
        with Publisher(broker.url) as pub:
            pub.publish_many(msgs)
        wait_for(lambda: a.stats.settled + b.stats.settled >= n, 60, "all settled")
    finally:
        a.stop()
        b.stop()
    assert isinstance(a.sink, LandingSink) and isinstance(b.sink, LandingSink)
    assert a.sink.partition != b.sink.partition
    assert a.stats.landed > 0 and b.stats.landed > 0
    t = landed_table(root)
    assert sorted(t.column("msg_key").to_pylist()) == sorted(expected_key(m) for m in msgs)
    assert os.path.isdir(root / a.sink.partition) and os.path.isdir(root / b.sink.partition)


def test_embedded_receiver_for_the_spark_source(broker: Any, tag: str, tmp_path: Path) -> None:
    from receivers.receiver import start_embedded

    n = 1000
    msgs = make_messages(tag, n)
    root = tmp_path / "landing"
    r = start_embedded(
        str(root),
        {
            "URL": broker.url,
            "bind": f"qpid.management:mgmt.{tag}.#",
            "partition": "emb",
            "flushMs": "10",
        },
    )
    try:
        assert r.ready.is_set()
        with Publisher(broker.url) as pub:
            pub.publish_many(msgs)
        wait_for(lambda: r.stats.settled >= n, 60, f"{n} settled")
    finally:
        r.stop()
    t = landed_table(root)
    assert LandingLog(root).partitions() == ["emb"]
    assert t.column("msg_key").to_pylist() == [expected_key(m) for m in msgs]
    bad = {"url": f"amqp://guest:nope@127.0.0.1:{broker.port}"}
    with pytest.raises(ReceiverError, match="amqp:unauthorized-access"):
        start_embedded(str(tmp_path / "l2"), bad)


def test_failover_to_the_next_url(broker: Any, tag: str, tmp_path: Path) -> None:
    dead = "amqp://127.0.0.1:1"  # nothing listens on port 1
    urls = (dead, broker.url)
    n = 200
    msgs = make_messages(tag, n)
    cfg = ReceiverConfig(
        broker=BrokerConfig(urls=urls, user="guest", password="guest"),
        bindings=(("qpid.management", f"mgmt.{tag}.#"),),
        backoff_initial_s=0.05,
    )
    r = run_receiver_thread(cfg, LandingSink(tmp_path / "landing", "p0"))
    try:
        assert r.stats.connects == 1 and r.stats.disconnects == 1
        with Publisher(BrokerConfig(urls=urls, user="guest", password="guest")) as pub:
            pub.publish_many(msgs)
        wait_for(lambda: r.stats.settled >= n, 60, f"{n} settled")
    finally:
        r.stop()
    assert landed_table(tmp_path / "landing").column("msg_key").to_pylist() == [
        expected_key(m) for m in msgs
    ]
    with pytest.raises(PublishError, match=r"amqp://127\.0\.0\.1:1\b"):
        Publisher(dead, connect_timeout_s=5)


def test_the_receiver_says_in_its_partition_whether_it_is_connected(
    broker: Any, tag: str, tmp_path: Path
) -> None:
    """``<partition>/.receiver``: connected (with the broker's host:port, never the
    credentials, and its process) once subscribed; not connected, with the reason, while
    the broker is gone; ``stopped`` after a clean stop. ``qmf serve-metrics`` exposes it
    as ``qmf_receiver_connected`` (1, 0, then not at all)."""
    from pipeline.commands.metrics import MetricsState, Selection
    from receivers.landing import receiver_statuses

    def exposed() -> dict[tuple[tuple[str, str], ...], float]:
        state = MetricsState(tmp_path / "data", landing=root)
        body, _ = state.scrape(Selection(), "text/plain")
        out: dict[tuple[tuple[str, str], ...], float] = {}
        for line in body.decode().splitlines():
            if line.startswith("qmf_receiver_connected{"):
                labels, value = line[len("qmf_receiver_connected{"):].rsplit("} ", 1)
                pairs = (p.split("=", 1) for p in labels.split(","))
                out[tuple(sorted((k, v) for k, v in pairs))] = float(value)
        return out

    relay = FreezableRelay(broker.url)
    host_port = urlsplit(relay.url).netloc.rsplit("@", 1)[-1]
    root = tmp_path / "landing"
    cfg = ReceiverConfig(
        broker=BrokerConfig(urls=(relay.url,)),
        bindings=(("qpid.management", f"mgmt.{tag}.#"),),
        backoff_initial_s=0.05, backoff_max_s=0.5,
    )  # fmt: skip
    key = (("broker_name", '"default"'), ("partition", '"p0"'))
    r = run_receiver_thread(cfg, LandingSink(root, "p0"))
    try:
        [s] = receiver_statuses(root)
        assert (s.partition, s.broker_name, s.connected, s.pid, s.address, s.reason) == (
            "p0", "default", True, os.getpid(), host_port, None)
        assert exposed() == {key: 1.0}
        relay.close()  # the broker is gone: the connection drops, reconnecting is refused
        wait_for(lambda: not receiver_statuses(root)[0].connected, 60, "the disconnected status")
        [s] = receiver_statuses(root)
        assert s.reason and not s.stopped and s.pid == os.getpid()
        assert exposed() == {key: 0.0}
    finally:
        r.stop()
    [s] = receiver_statuses(root)
    assert (s.connected, s.reason) == (False, "stopped")
    assert exposed() == {}
