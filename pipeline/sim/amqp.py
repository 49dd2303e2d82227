"""AMQP 1.0 plumbing of the simulator: the agents' command listener, a console and a raw subscriber.

RabbitMQ facts this relies on: a receiver on ``/exchange/X/K`` gets a private
queue bound to X with key K; consumers learn the routing key only through the
message subject; there are no dynamic (temporary) addresses, so a console
names its reply key and puts ``/exchange/amq.direct/<key>`` in reply-to.
Receivers are created with no credit and fed explicitly (``flow``); we close
connections, never single links. Every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proton import Message
from proton.utils import BlockingConnection, BlockingReceiver

from pipeline.codec.message import decode_message
from pipeline.codec.records import Record
from pipeline.codec.schema import SchemaRegistry
from receivers.publisher import APP_ID_PROPERTY

log = logging.getLogger(__name__)

CREDIT = 64


def _body(m: Message) -> tuple[bytes, str | None]:
    """The body as the receiver lands it: a data section as is, an amqp-value (a v2
    console or agent over AMQP 1.0) AMQP 1.0 encoded with its ``x-qmf-body-encoding``."""
    from receivers.receiver import landed_body

    b = m.body
    if isinstance(b, memoryview | bytearray | bytes):
        return bytes(b), None
    return landed_body(b)


@dataclass
class Received:
    """A message as a subscriber saw it: routing key (subject), properties and body."""

    routing_key: str | None
    body: bytes
    content_type: str | None
    application_properties: dict[str, Any]
    reply_to: str | None = None
    correlation_id: Any = None
    app_id: str | None = None

    def decode(self, registry: SchemaRegistry) -> list[Record]:
        res = decode_message(
            self.body,
            registry=registry,
            application_properties=self.application_properties,
            content_type=self.content_type,
            app_id=self.app_id,
            routing_key=self.routing_key,
        )
        if res.problems:
            raise ValueError(f"undecodable message on {self.routing_key!r}: {res.problems}")
        return res.records


def to_received(m: Message) -> Received:
    from pipeline.codec.amqp10 import BODY_ENCODING_PROPERTY

    props: dict[str, Any] = dict(m.properties or {})
    app_id = props.pop(APP_ID_PROPERTY, None)
    body, encoding = _body(m)
    if encoding is not None:
        props[BODY_ENCODING_PROPERTY] = encoding
    return Received(
        routing_key=m.subject,
        body=body,
        content_type=m.content_type,
        application_properties=props,
        reply_to=m.reply_to,
        correlation_id=m.correlation_id,
        app_id=app_id if isinstance(app_id, str) else None,
    )


class Subscriber:
    """Receivers on several addresses of one connection, with explicit credit."""

    def __init__(self, url: str, addresses: Sequence[str], timeout_s: float = 10.0) -> None:
        self.conn = BlockingConnection(url, timeout=timeout_s)
        self.receivers: list[tuple[str, BlockingReceiver]] = []
        try:
            for a in addresses:
                r = self.conn.create_receiver(a, credit=0)
                r.link.flow(CREDIT)
                self.receivers.append((a, r))
        except Exception:
            self.conn.close()
            raise

    def poll(self, timeout_s: float) -> list[tuple[str, Received]]:
        """Messages that arrived within ``timeout_s`` (each accepted), with their address."""
        out: list[tuple[str, Received]] = []

        def ready() -> bool:
            return any(r.fetcher is not None and r.fetcher.has_message for _, r in self.receivers)

        if not ready():
            try:
                self.conn.wait(ready, timeout=max(timeout_s, 0.001))
            except Exception as exc:  # proton raises Timeout when nothing came
                if type(exc).__name__ != "Timeout":
                    raise
        for a, r in self.receivers:
            f = r.fetcher
            while f is not None and f.has_message:
                m = f.pop()
                r.accept()
                r.link.flow(1)
                out.append((a, to_received(m)))
        return out

    def collect(
        self,
        until: int | None = None,
        idle_s: float = 1.0,
        max_s: float = 30.0,
        match: Callable[[Received], bool] | None = None,
    ) -> list[Received]:
        """Collect until ``until`` matching messages, ``idle_s`` of silence, or ``max_s`` in all.

        ``match`` keeps only the messages it accepts (a shared broker carries others' traffic).
        """
        got: list[Received] = []
        deadline = time.monotonic() + max_s
        last = time.monotonic()
        while time.monotonic() < deadline:
            batch = [m for _, m in self.poll(0.1) if match is None or match(m)]
            if batch:
                got.extend(batch)
                last = time.monotonic()
                if until is not None and len(got) >= until:
                    break
            elif time.monotonic() - last >= idle_s:
                break
        return got

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Request:
    """A console request as an agent sees it."""

    key: str  # the command key it came on
    record: Record
    reply_to: str | None
    correlation_id: Any = None


class CommandListener:
    """The agents' side: one receiver per (address, key) their requests come on.

    The simulator services this connection only between intervals, so a busy
    one (10,000 queues) can miss the broker's heartbeats and be closed: a lost
    connection is reopened on the next poll (at most every ``retry_s``), and
    requests sent while it was down are lost, as with a restarted agent
    (consoles ask again).
    """

    def __init__(
        self,
        url: str,
        addresses: Iterable[tuple[str, str]],
        registry: SchemaRegistry,
        retry_s: float = 1.0,
    ) -> None:
        self.url = url
        self.addresses = dict(addresses)  # address -> key
        self.registry = registry
        self.retry_s = retry_s
        self.reconnects = 0
        self._next_try = 0.0
        self.sub: Subscriber | None = Subscriber(url, list(self.addresses))

    def _messages(self, timeout_s: float) -> list[tuple[str, Received]]:
        """This poll's messages; [] (after waiting) while the connection is down."""
        if self.sub is None:
            if time.monotonic() < self._next_try:
                time.sleep(max(0.0, timeout_s))
                return []
            try:
                self.sub = Subscriber(self.url, list(self.addresses))
            except Exception as exc:
                self._next_try = time.monotonic() + self.retry_s
                log.warning("simulator: request listener reconnect failed (%s)", exc)
                time.sleep(max(0.0, timeout_s))
                return []
            self.reconnects += 1
            log.warning("simulator: request listener reconnected (%d so far)", self.reconnects)
        try:
            return self.sub.poll(timeout_s)
        except Exception as exc:  # ConnectionException, LinkDetached, ...: the broker closed it
            log.warning("simulator: request listener lost its connection (%s)", exc)
            with contextlib.suppress(Exception):
                self.sub.close()
            self.sub = None
            self._next_try = 0.0
            return []

    def poll(self, timeout_s: float) -> list[Request]:
        out: list[Request] = []
        for address, m in self._messages(timeout_s):
            res = decode_message(
                m.body,
                registry=self.registry,
                application_properties=m.application_properties,
                content_type=m.content_type,
                app_id=m.app_id,
                routing_key=m.routing_key,
            )
            for rec in res.records:  # a bad request is dropped, like qpidd does
                out.append(Request(self.addresses[address], rec, m.reply_to, m.correlation_id))
        return out

    def close(self) -> None:
        """Close the connection; one the broker dropped may time out closing: not an error."""
        if self.sub is not None:
            try:
                self.sub.close()
            except Exception as exc:
                log.warning("simulator: request listener did not close cleanly (%s)", exc)
            self.sub = None


@dataclass
class Console:
    """A minimal v1 console: sends requests to a command key and gathers the replies."""

    url: str
    registry: SchemaRegistry
    reply_key: str = field(default_factory=lambda: f"sim-console-{uuid.uuid4().hex[:12]}")
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        from receivers.publisher import Publisher

        self._seq = itertools.count(1)
        self.v2_replies: Subscriber | None = None
        self.replies = Subscriber(self.url, [f"/exchange/amq.direct/{self.reply_key}"])
        try:
            self.pub = Publisher(self.url)
        except Exception:
            self.replies.close()
            raise

    @property
    def reply_to(self) -> str:
        return f"/exchange/amq.direct/{self.reply_key}"

    def next_seq(self) -> int:
        return next(self._seq)

    def send(self, key: str, body: bytes) -> None:
        self.pub.publish(key, body, exchange="qpid.management", reply_to=self.reply_to)
        self.pub.flush()

    def request(
        self, key: str, body: bytes, seq: int, final: str = "z", count: int | None = None
    ) -> list[Record]:
        """Send one request; gather replies with its seq until an opcode in ``final`` (or ``count``)."""
        self.send(key, body)
        got: list[Record] = []
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for _, m in self.replies.poll(0.1):
                for r in m.decode(self.registry):
                    if r.seq != seq:
                        continue
                    got.append(r)
                    if r.opcode in final or (count is not None and len(got) >= count):
                        return got
        raise TimeoutError(
            f"no complete reply to seq {seq} on {key!r} within {self.timeout_s} s: {got}"
        )

    def request_v2(
        self, key: str, opcode: str, body: Any, exchange: str = "qmf.default.direct"
    ) -> list[Record]:
        """Send one QMF v2 request to ``key``; the records of the reply with our correlation id.

        The reply address is ``/exchange/qmf.default.direct/<reply key>`` (a v2 console
        subscribes there as well as on ``amq.direct``).
        """
        from pipeline.codec import v2
        from pipeline.codec.records import V2Message

        if self.v2_replies is None:
            self.v2_replies = Subscriber(
                self.url, [f"/exchange/qmf.default.direct/{self.reply_key}"]
            )
        corr = f"{self.reply_key}-{self.next_seq()}"
        enc = v2.encode_v2([V2Message(dialect="V2", opcode=opcode, content=None, body=body)])
        self.pub.publish(
            key,
            enc.body,
            exchange=exchange,
            application_properties=enc.application_properties,
            content_type=enc.content_type,
            app_id="qmf2",
            reply_to=f"/exchange/qmf.default.direct/{self.reply_key}",
            correlation_id=corr,
        )
        self.pub.flush()
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for _, m in self.v2_replies.poll(0.1):
                if m.correlation_id == corr:
                    return m.decode(self.registry)
        raise TimeoutError(f"no v2 reply to {opcode} on {key!r} within {self.timeout_s} s")

    def close(self) -> None:
        if self.v2_replies is not None:
            self.v2_replies.close()
        try:
            self.pub.close()
        finally:
            self.replies.close()

    def __enter__(self) -> Console:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
