"""A small pipelined AMQP 1.0 publisher for tests, the simulator and ``qmf replay``.

Why not ``proton.utils.BlockingConnection``: it waits for each message's
settlement, which caps a publisher at a few hundred messages/s. This one drives
a proton reactor in the caller's thread, keeps up to ``window`` messages
unsettled, and only blocks in :meth:`Publisher.flush` (or when the window is
full), with a deadline everywhere.

Every message carries ``subject = routing key``: RabbitMQ's AMQP 1.0 plugin
routes a message sent to ``/exchange/X`` by its subject, and consumers only
see the routing key through it. AMQP 1.0 has no app-id field, so ``app_id``
travels as the application property ``x-amqp-0-10.app-id`` (qpidd's mapping);
the receiver maps it back.

Usage::

    with Publisher("amqp://guest:guest@127.0.0.1:35672") as pub:
        pub.publish("mgmt.agent1.prop.org.apache.qpid.broker.queue", body)
        pub.publish("agent.ind.data.x", body2, exchange="qmf.default.topic",
                    content_type="amqp/list", app_id="qmf2",
                    application_properties={"qmf.opcode": "_data_indication"})
    # leaving the block flushes: every message accepted, or PublishError

The object is not thread-safe: use one per thread.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from proton import Array, Condition, Data, Delivery, Described, Endpoint, Event, Message, Sender
from proton.handlers import MessagingHandler
from proton.reactor import Container

from pipeline.codec.amqp10 import BODY_ENCODING_AMQP10, BODY_ENCODING_STRING
from receivers.config import BrokerConfig

APP_ID_PROPERTY = "x-amqp-0-10.app-id"
# How a body that is not one data section travels (the receiver's flag on landed
# messages, receivers.receiver.BODY_ENCODING_PROPERTY): "amqp-1.0" = the bytes are
# the AMQP 1.0 encoding of one value, sent as an amqp-value section;
# "amqp-value:string" = UTF-8 text sent as an amqp-value string.
BODY_ENCODINGS = (BODY_ENCODING_AMQP10, BODY_ENCODING_STRING)
# RabbitMQ 3.x's AMQP 1.0 plugin ends the session on an amqp-value section that
# holds a list (its decoder takes the list for a composite type's fields). An
# amqp-sequence section holding the same list reaches a proton consumer as the
# same body (the receiver lands the same bytes, flagged the same), so towards
# RabbitMQ list values go as amqp-sequence; towards qpidd as amqp-value, as
# qpidd itself sends them.
LIST_SECTIONS = ("amqp-value", "amqp-sequence")
ADDRESS_TEMPLATES: dict[str, str] = {
    "rabbitmq": "/exchange/{exchange}",
    "qpidd": "{exchange}",
}


class PublishError(RuntimeError):
    """The broker refused a message or the connection, or settlement did not come in time."""


@dataclass(frozen=True)
class OutMessage:
    """One message to publish; ``exchange`` None means the publisher's default."""

    routing_key: str
    body: bytes
    application_properties: Mapping[str, Any] | None = None
    content_type: str | None = None
    app_id: str | None = None
    message_id: str | int | None = None
    reply_to: str | None = None
    correlation_id: str | int | None = None
    ttl_s: float | None = None
    durable: bool = False
    exchange: str | None = None
    # None: ``body`` is one data section; else one of BODY_ENCODINGS (amqp-value).
    body_encoding: str | None = None


def amqp_value(raw: bytes) -> Any:
    """The one AMQP 1.0 value ``raw`` encodes, as proton's Python types.

    Sent as a message body it is encoded by proton again; for what proton itself
    encoded (the receiver's landed bodies) that gives the same bytes back.
    """
    d = Data()
    try:
        used = d.decode(raw)
    except Exception as exc:  # proton raises DataException with a terse code
        raise ValueError(f"body is not one AMQP 1.0 value: {exc}") from exc
    if used != len(raw):
        raise ValueError(f"body is not one AMQP 1.0 value: {len(raw) - used} bytes after it")
    d.rewind()
    d.next()
    return _owned(d.get_object())


def _owned(v: Any) -> Any:
    """``v`` with every binary copied out: proton hands out memoryviews into the
    Data object's buffer, which is freed with it."""
    if isinstance(v, memoryview):
        return v.tobytes()
    if isinstance(v, dict):
        return type(v)((_owned(k), _owned(x)) for k, x in v.items())
    if isinstance(v, list):
        return [_owned(x) for x in v]
    if isinstance(v, Described):
        return Described(_owned(v.descriptor), _owned(v.value))
    if isinstance(v, Array):
        return Array(v.descriptor, v.type, *(_owned(x) for x in v.elements))
    return v


def build_message(m: OutMessage, list_section: str = "amqp-value") -> Message:
    """The proton Message for ``m``: subject = routing key; the body one data section
    or, with ``body_encoding``, an amqp-value section (as qpidd sends QMF v2 maps);
    a list value goes as ``list_section`` (see LIST_SECTIONS)."""
    if list_section not in LIST_SECTIONS:
        raise ValueError(f"list_section must be one of {LIST_SECTIONS}, not {list_section!r}")
    props: dict[str, Any] = dict(m.application_properties or {})
    if m.app_id is not None:
        props[APP_ID_PROPERTY] = m.app_id
    body: Any
    if m.body_encoding is None:
        body = bytes(m.body)
    elif m.body_encoding == BODY_ENCODING_AMQP10:
        body = amqp_value(bytes(m.body))
    elif m.body_encoding == BODY_ENCODING_STRING:
        body = bytes(m.body).decode("utf-8")
    else:
        raise ValueError(f"unknown body encoding {m.body_encoding!r} (one of {BODY_ENCODINGS})")
    msg = Message(
        body=body,
        subject=m.routing_key,
        # inferred: bytes go as a data section and lists as an amqp-sequence;
        # otherwise everything is an amqp-value
        inferred=m.body_encoding is None
        or (list_section == "amqp-sequence" and isinstance(body, list)),
        durable=m.durable,
        properties=props or None,
    )
    if m.content_type is not None:
        msg.content_type = m.content_type
    if m.message_id is not None:
        msg.id = m.message_id
    if m.correlation_id is not None:
        msg.correlation_id = m.correlation_id
    if m.reply_to is not None:
        msg.reply_to = m.reply_to
    if m.ttl_s is not None:
        msg.ttl = m.ttl_s
    return msg


def _describe(cond: Condition | None) -> str:
    if cond is None:
        return "no condition given"
    return f"{cond.name}: {cond.description}" if cond.description else str(cond.name)


class _Handler(MessagingHandler):
    """Counts outcomes and records the first failure; the Publisher does the rest."""

    def __init__(self, owner: Publisher) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
        self.owner = owner

    def on_connection_opened(self, event: Event) -> None:
        self.owner._opened = True

    def on_sendable(self, event: Event) -> None:
        self.owner._send_pending()

    def on_accepted(self, event: Event) -> None:
        if self.owner._outcome(event.delivery):
            self.owner.accepted += 1

    def on_rejected(self, event: Event) -> None:
        if not self.owner._outcome(event.delivery):
            return
        self.owner.rejected += 1
        d = event.delivery
        cond = d.remote.condition if d is not None else None
        self.owner._fail(f"message rejected by the broker ({_describe(cond)})")

    def on_released(self, event: Event) -> None:
        # MessagingHandler routes MODIFIED here too; neither means the broker took it.
        if not self.owner._outcome(event.delivery):
            return
        self.owner.rejected += 1
        d = event.delivery
        modified = d is not None and d.remote_state == Delivery.MODIFIED
        state = "modified" if modified else "released"
        self.owner._fail(f"message {state} by the broker (not routed or not taken)")

    def on_link_error(self, event: Event) -> None:
        link = event.link
        if link is not None:
            where = link.target.address or link.source.address
            self.owner._fail(f"link {where!r} refused: {_describe(link.remote_condition)}")
        else:
            self.owner._fail("link refused by the broker")

    def on_session_error(self, event: Event) -> None:
        # RabbitMQ ends the whole session when a target exchange does not exist.
        sess = event.session
        cond = sess.remote_condition if sess is not None else None
        self.owner._fail(f"session ended by the broker: {_describe(cond)}")
        if event.connection is not None:
            event.connection.close()

    def on_connection_closed(self, event: Event) -> None:
        if not self.owner._closing:
            self.owner._fail("connection closed")

    def on_connection_error(self, event: Event) -> None:
        c = event.connection
        cond = c.remote_condition if c is not None else None
        self.owner._fail(f"connection closed by the broker: {_describe(cond)}")

    def on_transport_error(self, event: Event) -> None:
        t = event.transport
        self.owner._fail(f"transport error: {_describe(t.condition if t is not None else None)}")

    def on_disconnected(self, event: Event) -> None:
        if not self.owner._closing:
            self.owner._fail("disconnected from the broker")


class Publisher:
    """Pipelined publisher to exchange addresses; blocks only when the window is full or on flush."""

    def __init__(
        self,
        broker: BrokerConfig | str | None = None,
        *,
        exchange: str = "qpid.management",
        address_template: str = ADDRESS_TEMPLATES["rabbitmq"],
        list_section: str | None = None,
        window: int = 1000,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.config = (
            broker
            if isinstance(broker, BrokerConfig)
            else BrokerConfig(urls=(broker,) if broker else ())
        )
        self.exchange = exchange
        self.address_template = address_template
        # None: amqp-sequence for RabbitMQ addressing, amqp-value otherwise (LIST_SECTIONS)
        if list_section is None:
            rabbit = address_template.startswith("/exchange/")
            list_section = "amqp-sequence" if rabbit else "amqp-value"
        if list_section not in LIST_SECTIONS:
            raise ValueError(f"list_section must be one of {LIST_SECTIONS}, not {list_section!r}")
        self.list_section = list_section
        self.window = window
        self.timeout_s = timeout_s
        self.sent = 0
        self.accepted = 0
        self.rejected = 0
        self._error: str | None = None
        self._opened = False
        self._closing = False
        self._closed = False
        self._pending: dict[Sender, deque[Message]] = {}
        self._queued = 0
        self._inflight: set[tuple[str, str]] = set()  # (link name, delivery tag)
        self._senders: dict[str, Sender] = {}
        self._last_pump = 0.0
        errors: list[str] = []
        for i in range(len(self.config.urls)):  # failover: the first URL that opens
            self._error = None
            self._closing = self._closed = False
            if self._open(self.config.for_url(i), connect_timeout_s):
                return
            errors.append(self._error or "failed")
            self._shutdown(1.0)
            if "unauthorized-access" in errors[-1]:
                break  # the same credentials will not work elsewhere either
        raise PublishError("; ".join(errors))

    def _open(self, cfg: BrokerConfig, timeout_s: float) -> bool:
        """Connect to one URL; True once the broker opened the connection."""
        self._container = Container(_Handler(self))
        self._container.timeout = 0.05
        self._conn = self._container.connect(**cfg.connect_kwargs())
        self._container.start()
        deadline = time.monotonic() + timeout_s
        while not self._opened and self._error is None:
            if time.monotonic() > deadline:
                self._error = f"no connection to {cfg.urls[0]} within {timeout_s} s"
                break
            self._container.process()
        if self._error is not None:
            self._error = f"{self._error} [{cfg.urls[0]}]"
            return False
        return True

    # --- internals -------------------------------------------------------------------------

    def _fail(self, reason: str) -> None:
        if self._error is None:
            self._error = reason

    def _check(self) -> None:
        if self._error is not None:
            raise PublishError(f"{self._error} [{', '.join(self.config.urls)}]")
        if self._closed:
            raise PublishError("publisher is closed")

    def _sender(self, exchange: str | None) -> Sender:
        address = self.address_template.format(exchange=exchange or self.exchange)
        s = self._senders.get(address)
        if s is None:
            s = self._container.create_sender(self._conn, target=address)
            self._senders[address] = s
            self._pending[s] = deque()
        return s

    @property
    def unsettled(self) -> int:
        """Messages handed to proton or queued that the broker has not settled yet."""
        return len(self._inflight) + self._queued

    def _outcome(self, d: Delivery | None) -> bool:
        """First outcome of a delivery counts; a broker may update a delivery twice."""
        if d is None:
            return False
        try:
            self._inflight.remove((d.link.name, d.tag))
        except KeyError:
            return False
        return True

    def _send_pending(self) -> None:
        """Hand queued messages to links with credit; order is kept per link."""
        for sender, queue in self._pending.items():
            if not queue or not (sender.state & Endpoint.REMOTE_ACTIVE):
                continue
            while queue and sender.credit > 0:
                d = sender.send(queue.popleft())
                assert isinstance(d, Delivery)  # a Message send always yields a delivery
                self._inflight.add((sender.name, d.tag))
                self._queued -= 1
                self.sent += 1

    def _pump(self, wait: bool) -> None:
        self._container.timeout = 0.05 if wait else 0.0
        self._container.process()
        self._last_pump = time.monotonic()

    # --- API -------------------------------------------------------------------------------

    def publish(
        self,
        routing_key: str,
        body: bytes | bytearray | memoryview,
        *,
        exchange: str | None = None,
        application_properties: Mapping[str, Any] | None = None,
        content_type: str | None = None,
        app_id: str | None = None,
        message_id: str | int | None = None,
        reply_to: str | None = None,
        correlation_id: str | int | None = None,
        ttl_s: float | None = None,
        durable: bool = False,
    ) -> None:
        """Queue one message; returns at once unless ``window`` messages are unsettled."""
        self.publish_message(
            OutMessage(
                routing_key=routing_key,
                body=bytes(body),
                application_properties=application_properties,
                content_type=content_type,
                app_id=app_id,
                message_id=message_id,
                reply_to=reply_to,
                correlation_id=correlation_id,
                ttl_s=ttl_s,
                durable=durable,
                exchange=exchange,
            )
        )

    def publish_message(self, m: OutMessage) -> None:
        """Queue an :class:`OutMessage` (see :meth:`publish`)."""
        self._check()
        self._pending[self._sender(m.exchange)].append(build_message(m, self.list_section))
        self._queued += 1
        self._send_pending()
        if self.unsettled >= self.window:
            deadline = time.monotonic() + self.timeout_s
            while self.unsettled >= self.window:
                self._check()
                if time.monotonic() > deadline:
                    raise PublishError(
                        f"{self.unsettled} messages unsettled after {self.timeout_s} s"
                    )
                self._pump(wait=True)
        elif time.monotonic() - self._last_pump > 0.005:
            self._pump(wait=False)

    def publish_many(self, msgs: Iterable[OutMessage], *, flush: bool = True) -> int:
        """Publish all of ``msgs`` (then flush, by default); returns how many."""
        n = 0
        for m in msgs:
            self.publish_message(m)
            n += 1
        if flush:
            self.flush()
        return n

    def flush(self, timeout_s: float | None = None) -> int:
        """Wait until every message so far is accepted; returns the accepted total."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            self._check()
            if self.unsettled == 0:
                return self.accepted
            if time.monotonic() > deadline:
                raise PublishError(
                    f"{self.unsettled} of {self.sent + self._queued} messages not settled "
                    f"within {timeout_s or self.timeout_s} s"
                )
            self._send_pending()
            self._pump(wait=True)

    def _shutdown(self, timeout_s: float) -> None:
        """Close the connection (never single links) and let the reactor wind down."""
        self._closing = True
        deadline = time.monotonic() + timeout_s
        self._container.timeout = 0.05
        try:
            if self._conn.state & Endpoint.LOCAL_ACTIVE:
                self._conn.close()
            while time.monotonic() < deadline and not (self._conn.state & Endpoint.REMOTE_CLOSED):
                if self._error is not None and not self._opened:
                    break
                if not self._container.process():
                    break
            self._container.stop()
            while time.monotonic() < deadline and self._container.process():
                pass
        except Exception:  # closing anyway; the first error is already recorded
            pass
        self._closed = True

    def close(self, *, flush: bool = True, timeout_s: float = 5.0) -> None:
        """Flush (unless told not to), then close the connection within ``timeout_s``."""
        if self._closed:
            return
        try:
            if flush and self._error is None:
                self.flush()
        finally:
            self._shutdown(timeout_s)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(flush=exc_type is None)


def publish_all(
    broker: BrokerConfig | str | None,
    msgs: Iterable[OutMessage],
    **kwargs: Any,
) -> int:
    """Connect, publish every message, wait until all are accepted, close."""
    with Publisher(broker, **kwargs) as pub:
        return pub.publish_many(msgs)
