"""Link names and broker refusals (issue 21, item 1).

qpidd closes the connection when a second link with an already attached name
arrives (``amqp:invalid-field``): every link of a receiver needs its own name.
A refusal that would come again on retry (a missing exchange or queue) ends the
receiver with the broker's own words; the real RabbitMQ node refuses an attach
to a missing exchange or queue by ending the session with ``amqp:not-found``.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from receivers.config import BrokerConfig
from receivers.console import ConsoleConfig
from receivers.publisher import OutMessage, Publisher
from receivers.receiver import (
    PRESETS,
    CaptureSink,
    LandingSink,
    QmfReceiver,
    ReceiverConfig,
    ReceiverError,
    Subscription,
    link_name,
    parse_binding,
)
from tests.receivers.test_receiver_broker import REPO, landed_table, run_receiver_thread, wait_for


def _names(cfg: ReceiverConfig, tmp_path: Path) -> list[str]:
    r = QmfReceiver(cfg, CaptureSink(tmp_path / f"{uuid.uuid4().hex}.jsonl"))
    try:
        assert len(r.link_names) == len(r.sources)
        return r.link_names
    finally:
        r.sink.close()


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_default_subscription_has_its_own_link_name(preset: str, tmp_path: Path) -> None:
    for console in (None, ConsoleConfig()):
        cfg = ReceiverConfig(preset=preset, console=console)
        names = _names(cfg, tmp_path)
        assert len(names) == len(PRESETS[preset].default_bindings) + (console is not None)
        assert len(set(names)) == len(names), names
    # qpidd's two bindings on one exchange were the case qpidd refused
    qpidd = _names(ReceiverConfig(preset="qpidd"), tmp_path)
    assert [n.split("-", 7)[-1] for n in qpidd] == [
        "0-qpid.management-console.",
        "1-qpid.management-schema.",
        "2-qmf.default.topic-agent.ind.",
    ]


def test_bind_lists_get_distinct_link_names(tmp_path: Path) -> None:
    """Keys that read the same once sanitized get distinct names; the same binding twice
    is one link (two would land every message twice on RabbitMQ)."""
    binds = ["qpid.management:a.#", "qpid.management:a.*", "qpid.management:a/#",
             "qpid.management:a.#", "qmf.default.topic:agent.ind.#", "x:#", "x:*"]  # fmt: skip
    for preset in sorted(PRESETS):
        cfg = ReceiverConfig(preset=preset, bindings=tuple(parse_binding(b) for b in binds))
        names = _names(cfg, tmp_path)
        assert len(names) == len(binds) - 1 and len(set(names)) == len(names), names
    assert link_name("r", 3, Subscription("qpid.management", "console.#")) == (
        "r-3-qpid.management-console."
    )
    assert link_name("r", 0, Subscription("/exchange/qpid.management/mgmt.#")) == (
        "r-0-exchange_qpid.management_mgmt."
    )


def _message(tag: str, part: str, i: int) -> OutMessage:
    return OutMessage(routing_key=f"mgmt.{tag}.{part}.k{i}", body=f"{part}-{i}".encode())


@pytest.mark.broker
def test_two_bindings_on_one_exchange_both_receive(broker: Any, tmp_path: Path) -> None:
    tag = f"t{uuid.uuid4().hex[:10]}"
    cfg = ReceiverConfig(
        broker=BrokerConfig(urls=(broker.url,)),
        bindings=(("qpid.management", f"mgmt.{tag}.a.#"), ("qpid.management", f"mgmt.{tag}.b.#")),
    )
    r = run_receiver_thread(cfg, LandingSink(tmp_path / "landing", "p0"))
    try:
        assert r.ready.is_set() and len(set(r.link_names)) == 2
        with Publisher(broker.url) as pub:
            pub.publish_many([_message(tag, part, i) for i in range(50) for part in "abc"])
        wait_for(lambda: r.stats.settled >= 100, 60, "100 settled")
    finally:
        r.stop()
    keys = landed_table(tmp_path / "landing").column("routing_key").to_pylist()
    assert Counter(k.split(".")[2] for k in keys) == {"a": 50, "b": 50}
    assert r.stats.connects == 1 and r.stats.disconnects == 0


@pytest.mark.broker
def test_a_missing_exchange_ends_the_receiver_with_the_brokers_words(
    broker: Any, tmp_path: Path
) -> None:
    missing = f"no-such-exchange-{uuid.uuid4().hex[:8]}"
    cfg = ReceiverConfig(
        broker=BrokerConfig(urls=(broker.url,)),
        bindings=(("qpid.management", "mgmt.none.#"), (missing, "k.#")),
        backoff_initial_s=0.05,
    )
    r = QmfReceiver(cfg, LandingSink(tmp_path / "landing", "p0"))
    with pytest.raises(ReceiverError) as exc:
        r.run(duration_s=120)
    text = str(exc.value)
    assert text.startswith(
        f"broker ended the session (while attaching '/exchange/{missing}/k.#'): "
        f"amqp:not-found: NOT_FOUND - no exchange '{missing}' in vhost '/' ["
    )
    assert "not retried" in text and "--bind" in text
    # refused once, not retried: one connection, never a reconnect
    assert (r.stats.connects, r.stats.disconnects) == (1, 0)
    assert r.stats.last_error is not None and "amqp:not-found" in r.stats.last_error


@pytest.mark.broker
def test_qmf_receive_on_a_missing_queue_exits_1_naming_the_condition(
    broker: Any, tmp_path: Path
) -> None:
    queue = f"no-such-queue-{uuid.uuid4().hex[:8]}"
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "receive", "--url", broker.url, "--queue", queue,
         "--landing", str(tmp_path / "l"), "--duration", "120"],
        cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"qmf receive: broker ended the session (while attaching '/amq/queue/{queue}'): "
        f"amqp:not-found: NOT_FOUND - no queue '{queue}' in vhost '/'"
    ), out.stderr
    assert "reconnecting" not in out.stderr


@pytest.mark.broker
def test_a_deleted_queue_ends_the_receiver_after_one_reconnect(
    broker: Any, tmp_path: Path
) -> None:
    """RabbitMQ drops the connection of a consumer whose queue is deleted (a transient
    loss: reconnect); the reconnect is refused with amqp:not-found: that ends it."""
    from pipeline import broker as qmf_broker

    queue = f"qmf-test-deleted-{uuid.uuid4().hex[:8]}"
    qmf_broker.declare_queue(queue, [("qpid.management", f"mgmt.{queue}.#")])
    cfg = ReceiverConfig(broker=BrokerConfig(urls=(broker.url,)), queue=queue)
    r = run_receiver_thread(cfg, LandingSink(tmp_path / "landing", "p0"))
    try:
        qmf_broker.delete_queue(queue)
        wait_for(lambda: r.error is not None, 60, "the receiver to give up")
    finally:
        r.stop()  # the thread ended on the error: nothing left to stop
    assert isinstance(r.error, ReceiverError)
    assert str(r.error).startswith(
        f"broker ended the session (while attaching '/amq/queue/{queue}'): amqp:not-found: "
        f"NOT_FOUND - no queue '{queue}' in vhost '/' ["
    )
    assert (r.stats.connects, r.stats.disconnects) == (2, 1)


@pytest.mark.broker
def test_embedded_receiver_start_raises_on_a_refused_binding(broker: Any, tmp_path: Path) -> None:
    """The Spark source's entry point (what `qmf run --bind` feeds) fails at once."""
    from receivers.receiver import start_embedded

    missing = f"no-such-exchange-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ReceiverError, match=f"no exchange '{missing}'"):
        start_embedded(str(tmp_path / "l"), {"url": broker.url, "bind": f"{missing}:k.#"})
