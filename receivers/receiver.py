"""The AMQP 1.0 receiver: land every message durably, then settle it.

Why this shape:

* **Nothing is settled before it is durable.** Messages are held (unsettled) in
  hand until a group commit writes them to the sink (the landing log: one
  fsynced Arrow segment per group); only then are their deliveries accepted and
  settled. A crash at any point leaves the broker holding every message that is
  not on disk, so delivery is at-least-once. A redelivery of a message already
  landed is recognised here, not downstream: the broker flags it
  (``first-acquirer`` false) and ``receivers.indoubt`` matches it to a landed,
  in-doubt first copy; it lands with ``duplicate_of`` set and bronze skips it.
  Twins (identical messages sent twice) are not flagged, so each lands.
* **Group commit:** a group is flushed when ``flush_count`` messages are in hand
  or the oldest has waited ``flush_ms``: one fsync per group, not per message.
* **Explicit credit:** prefetch 0, and the receiver tops credit up to
  ``credit_window`` itself; RabbitMQ's AMQP 1.0 plugin is reliable that way
  (never ``drain``).
* **We drive the reactor** (``Container.process()``) instead of ``run()``, so
  the same object runs in the foreground (``qmf receive``), in a thread (the
  Spark source's embedded receiver) or in a subprocess, and stops cleanly:
  land what is in hand, settle it, close the *connection* (closing a receiver
  link hangs on RabbitMQ).
* **Reconnect** with exponential backoff, rotating through the URLs
  (failover). Authentication failures are fatal at once: retrying a wrong
  password only hides it.
* Each receiver holds an exclusive lock on its own landing partition, so
  several receivers can compete on one durable queue without sharing files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import queue
import re
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, Protocol

from cproton import (
    pn_message_get_content_type,
    pn_message_get_reply_to,
    pn_message_get_subject,
)
from proton import (
    Connection,
    Data,
    Delivery,
    Described,
    Endpoint,
    Event,
    Handler,
    Message,
    Receiver,
    Sender,
    Session,
    symbol,
)
from proton.handlers import EndpointStateHandler, MessagingHandler
from proton.reactor import Container, Filter

# Bodies that are not one data section (amqp-value / amqp-sequence) are landed
# as their AMQP 1.0 encoding and flagged with BODY_ENCODING_PROPERTY.
from pipeline.codec.amqp10 import BODY_ENCODING_PROPERTY
from pipeline.codec.capture import CapturedMessage, iso_utc, write_capture
from receivers.aliases import AliasNamer
from receivers.config import BrokerConfig, ConfigError, host_port
from receivers.console import ConsoleConfig, ConsoleRequest, ConsoleRole, parse_refresh_classes
from receivers.indoubt import InDoubtLedger, seal, write_marker
from receivers.landing import (
    PARTITION_RE,
    LandedMessage,
    LandingError,
    LandingWriter,
    partition_broker,
    to_table,
    write_receiver_status,
)
from receivers.publisher import APP_ID_PROPERTY
from schemas.tables import DEFAULT_BROKER

if TYPE_CHECKING:
    from receivers.fleet import FleetReceivers

log = logging.getLogger("qmf.receiver")

ROUTING_KEY_ANNOTATIONS = ("x-opt-routing-key", "x-amqp-0-10.routing-key")
QPIDD_TOPIC_FILTER = "apache.org:legacy-amqp-topic-binding:string"
FATAL_CONDITIONS = ("amqp:unauthorized-access",)
# A broker refusal with one of these conditions would be refused again on every
# retry (a misspelt exchange, a duplicate link name, an unsupported filter): the
# receiver stops with the broker's own words instead of reconnecting forever.
# Losses (connection refused, amqp:connection:forced, internal errors, a broker
# restart) are retried with back-off. See docs/receiver.md.
REFUSAL_CONDITIONS = frozenset(
    {
        "amqp:invalid-field",
        "amqp:not-found",
        "amqp:unauthorized-access",
        "amqp:not-implemented",
        "amqp:decode-error",
        "amqp:not-allowed",
        "amqp:precondition-failed",
    }
)
REFUSAL_HINTS = {
    "amqp:invalid-field": "the broker rejected a field of our request (qpidd says this of a "
    "duplicate link name)",
    "amqp:not-found": "check the exchange or queue name (--bind, --queue, --source) and --preset",
    "amqp:not-implemented": "the broker does not support this address or filter: check --preset",
    "amqp:decode-error": "the broker could not read our request",
    "amqp:not-allowed": "the broker does not allow this subscription for this user",
    "amqp:precondition-failed": "the queue or exchange exists with other settings",
}
LINK_NAME_TEXT = re.compile(r"[^A-Za-z0-9_.:-]+")
QUIET_RESTATE_S = 5.0
# A group's settlement counts as seen by the broker this long after we settled
# it (the disposition is on the wire within one reactor round); the settle
# marker is rewritten at most every MARKER_EVERY_S.
SETTLE_GRACE_S = 0.5
MARKER_EVERY_S = 0.25
# When a connection is lost (not closed by us), a broker that was going away
# may have dropped dispositions it had not processed yet: groups settled this
# long before the loss are sealed as in doubt too, whatever the marker says.
LOST_DOUBT_S = 10.0
# Console requests waiting for a sender's credit; beyond this new ones are dropped (a
# broker that withholds credit for long, e.g. under a memory alarm): the refresh is
# periodic and a schema request is asked again, so nothing is lost for good.
MAX_QUEUED_REQUESTS = 1000


class ReceiverError(RuntimeError):
    """The receiver cannot go on (authentication refused, sink failure, bad settings)."""


# --------------------------------------------------------------------------- addressing


@dataclass(frozen=True)
class Preset:
    """How one broker family spells subscriptions."""

    exchange_source: str
    queue_source: str
    topic_filter: bool
    default_bindings: tuple[tuple[str, str], ...]
    reply_exchange_target: str
    # Whether a first delivery carries first-acquirer true, so false means
    # "redelivered". AMQP 1.0's default is false ("may have been acquired
    # before"), so a broker that leaves it unset is judged by delivery-count alone.
    sets_first_acquirer: bool = False


PRESETS: dict[str, Preset] = {
    # RabbitMQ 3.x AMQP 1.0 plugin: the binding key is part of the address; a
    # private amq.gen-* queue is declared per link (left behind on close).
    "rabbitmq": Preset(
        exchange_source="/exchange/{exchange}/{key}",
        queue_source="/amq/queue/{queue}",
        topic_filter=False,
        default_bindings=(("qpid.management", "mgmt.#"),),
        reply_exchange_target="/exchange/{exchange}",
        sets_first_acquirer=True,  # 3.10: true on a first delivery, false on a redelivery
    ),
    # qpidd: the exchange is the address; the binding key goes in a legacy
    # topic-binding filter. AM2 publishes on console.# / schema.#, QMF v2
    # agents on qmf.default.topic agent.ind.#.
    "qpidd": Preset(
        exchange_source="{exchange}",
        queue_source="{queue}",
        topic_filter=True,
        default_bindings=(
            ("qpid.management", "console.#"),
            ("qpid.management", "schema.#"),
            ("qmf.default.topic", "agent.ind.#"),
        ),
        reply_exchange_target="{exchange}",
    ),
}


@dataclass(frozen=True)
class Subscription:
    """One receiver link: its source address and optional binding-key filter."""

    address: str
    binding_key: str | None = None

    def describe(self) -> str:
        """``address`` or ``address [KEY]``: how errors name the link."""
        return self.address if self.binding_key is None else f"{self.address} [{self.binding_key}]"


def link_name(prefix: str, index: int, sub: Subscription) -> str:
    """A link name unique on its connection: prefix, index, address and binding key.

    qpidd closes the connection on a second attach with a name already attached
    (``amqp:invalid-field``); proton's default name (container id + address) is
    the same for two bindings on one exchange. The index alone makes names
    unique; address and key (runs of other characters replaced by ``_``) keep
    them readable in the broker's management views.
    """
    text = sub.address if sub.binding_key is None else f"{sub.address}-{sub.binding_key}"
    return f"{prefix}-{index}-{LINK_NAME_TEXT.sub('_', text).strip('_')}"


def subscriptions(
    preset: str,
    *,
    bindings: Sequence[tuple[str, str]] = (),
    queue: str | None = None,
    sources: Sequence[str] = (),
) -> list[Subscription]:
    """The links to open: raw ``sources`` win, then a durable ``queue``, then bindings."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r} (one of {', '.join(PRESETS)})")
    p = PRESETS[preset]
    if sources:
        return [Subscription(s) for s in sources]
    if queue:
        return [Subscription(p.queue_source.format(queue=queue))]
    out: list[Subscription] = []
    # The same binding twice would be two links, so two temporary queues on RabbitMQ:
    # every message landed twice, and counted twice downstream.
    for exchange, key in dict.fromkeys(bindings or p.default_bindings):
        if p.topic_filter:
            out.append(Subscription(p.exchange_source.format(exchange=exchange, key=key), key))
        else:
            out.append(Subscription(p.exchange_source.format(exchange=exchange, key=key)))
    return out


def parse_binding(text: str, default_exchange: str = "qpid.management") -> tuple[str, str]:
    """``EXCHANGE:KEY`` or just ``KEY`` (on the default exchange)."""
    exchange, sep, key = text.rpartition(":")
    if not sep:
        return default_exchange, text
    if not exchange or not key:
        raise ConfigError(f"binding {text!r} must be EXCHANGE:KEY")
    return exchange, key


# --------------------------------------------------------------------------- mapping


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | memoryview | bytearray):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.hex()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def landed_body(body: Any) -> tuple[bytes, str | None]:
    """(bytes, encoding flag): a data section as is; anything else AMQP 1.0 encoded."""
    if body is None:
        return b"", None
    if isinstance(body, bytes | memoryview | bytearray):
        return bytes(body), None
    if isinstance(body, str):
        return body.encode("utf-8"), "amqp-value:string"
    d = Data()
    d.put_object(body)
    return bytes(d.encode()), "amqp-1.0"


def _text(value: Any) -> str | None:
    """Fast path of :func:`_as_text` for the common plain-str case."""
    return value if value is None or type(value) is str else _as_text(value)


def to_landed(
    msg: Message, received_at_us: int | None = None, *, first_acquirer_flag: bool = True
) -> LandedMessage:
    """Map a proton Message onto the landing contract (all text fields as str).

    Hot path (once per message on the reactor thread): string properties are
    read straight from the C message, which also avoids proton's getter that
    turns an absent content-type into ``symbol('None')``.
    """
    impl = msg._msg
    props: dict[str, str] = {}
    app_id: str | None = None
    raw_props: Mapping[Any, Any] | None = msg.properties
    if raw_props:
        for k, v in raw_props.items():
            if k == APP_ID_PROPERTY:
                app_id = _text(v)
                continue
            text = _text(v)
            props[str(k)] = "" if text is None else text
    subject: str | None = pn_message_get_subject(impl)
    routing_key = subject
    annotations: Mapping[Any, Any] | None = msg.annotations
    if annotations:
        for name in ROUTING_KEY_ANNOTATIONS:
            if annotations.get(name) is not None:
                routing_key = _as_text(annotations[name])
                break
    body: Any = msg.body  # proton types it narrowly; a data section arrives as memoryview
    if type(body) is memoryview or type(body) is bytes:
        raw = bytes(body)
    else:
        raw, encoding = landed_body(body)
        if encoding is not None:
            props[BODY_ENCODING_PROPERTY] = encoding
    # RabbitMQ flags a redelivery with first-acquirer false (delivery-count stays
    # 0); other brokers count deliveries (``first_acquirer_flag``: see Preset).
    redelivered = bool(msg.delivery_count) or (first_acquirer_flag and not msg.first_acquirer)
    return LandedMessage(
        body=raw,
        routing_key=routing_key,
        subject=subject,
        message_id=_text(msg.id),
        correlation_id=_text(msg.correlation_id),
        reply_to=pn_message_get_reply_to(impl),
        app_id=app_id,
        content_type=pn_message_get_content_type(impl),
        application_properties=props,
        received_at_us=received_at_us if received_at_us is not None else time.time_ns() // 1000,
        redelivered=redelivered,
    )


# --------------------------------------------------------------------------- sinks


class Sink(Protocol):
    """Where landed groups go; ``append`` must be durable when it returns."""

    def append(self, msgs: Sequence[LandedMessage]) -> None: ...

    def close(self) -> None: ...


class LandingSink:
    """The landing log partition this receiver owns (exclusive lock held while open)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        partition: str | None = None,
        broker: str = DEFAULT_BROKER,
    ) -> None:
        self.root = Path(root)
        self.broker = broker
        self._lock_fd: int | None = None
        if partition is None:
            partition = self._claim_default()
        else:
            if not PARTITION_RE.match(partition):
                raise ConfigError(f"partition {partition!r} must match {PARTITION_RE.pattern}")
            if not self._lock(partition):
                raise ReceiverError(
                    f"landing partition {partition!r} under {self.root} is held by another receiver"
                )
        self.partition = partition
        try:
            self.writer = LandingWriter(self.root, partition, broker=broker)
        except LandingError as exc:
            self._unlock()  # refused: no status to leave in a partition not ours
            raise ReceiverError(str(exc)) from exc
        # What the previous session of this partition left in doubt, then the
        # in-doubt messages of every partition of this broker, for matching redeliveries.
        seal(self.root, partition)
        self.ledger = InDoubtLedger(self.root, own=partition, broker=broker)
        self.ledger.refresh()

    def _lock(self, partition: str) -> bool:
        d = self.root / partition
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def _claim_default(self) -> str:
        """``<broker>-<n>`` (``<host>-<n>`` for the unnamed broker): the lowest n not locked
        and not another broker's, so a restarted receiver continues its partition."""
        prefix = self.broker
        if self.broker == DEFAULT_BROKER:
            prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "receiver"
        for n in range(1024):
            name = f"{prefix}-{n}"
            if partition_broker(self.root / name) not in (None, self.broker):
                continue
            if self._lock(name):
                return name
        raise ReceiverError(f"no free landing partition under {self.root}")

    @property
    def next_offset(self) -> int:
        return self.writer.next_offset

    def append(self, msgs: Sequence[LandedMessage]) -> None:
        """Land ``msgs``; a redelivery matched to a landed first copy lands marked."""
        again = [i for i, m in enumerate(msgs) if m.redelivered]
        if again:
            base = self.writer.next_offset  # each flagged copy's landing offset goes in its claim
            firsts = self.ledger.match([msgs[i].key() for i in again], [base + i for i in again])
            out = list(msgs)
            for i, first in zip(again, firsts, strict=True):
                if first is not None:
                    out[i] = dataclasses.replace(out[i], duplicate_of=first)
            msgs = out
        self.writer.append(msgs)

    def mark_settled(self, offset: int) -> None:
        """Every message below ``offset`` is settled and the broker has seen it."""
        write_marker(self.writer.dir, offset)

    def seal(self, start: int | None = None) -> None:
        """After a lost connection: what is landed but unconfirmed is in doubt
        (from ``start`` on if that is before the settle marker)."""
        seal(self.root, self.partition, start=start)
        self.ledger.refresh()

    def warm_up(self) -> None:
        """Build one table in memory: pyarrow's lazy imports (~1 s) happen now, not mid-stream."""
        to_table(self.partition, 0, [LandedMessage(body=b"")], self.broker)

    def report(self, connected: bool, address: str | None = None, reason: str | None = None) -> None:
        """Say in the partition whether its receiver is connected (``qmf serve-metrics``
        exposes it for the alert on a disconnected receiver)."""
        write_receiver_status(self.writer.dir, connected, address, reason)

    def close(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                self.report(False, reason="stopped")
            self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def to_captured(m: LandedMessage, source: str | None = None) -> CapturedMessage:
    """The capture-format record of a landed message (``pipeline.codec.capture``)."""
    props: dict[str, Any] = {"content_length": len(m.body)}
    for name in ("message_id", "correlation_id", "reply_to", "app_id", "content_type"):
        value = getattr(m, name)
        if value is not None:
            props[name] = value
    if m.routing_key is not None:
        props["routing_key"] = m.routing_key
    if source is not None:
        props["x-capture-source"] = source
    return CapturedMessage(
        body=m.body,
        routing_key=m.routing_key,
        subject=m.subject,
        content_type=m.content_type,
        properties=props,
        application_properties=dict(m.application_properties),
        received_at=iso_utc(datetime.fromtimestamp(m.received_at_us / 1_000_000, tz=UTC)),
    )


def capture_record(m: LandedMessage, source: str | None = None) -> dict[str, Any]:
    """One capture-format object (see DESIGN.md and ``shared/samples``)."""
    return to_captured(m, source).to_json()


class CaptureSink:
    """JSON lines in the capture format, flushed and fsynced per group."""

    def __init__(self, path: str | os.PathLike[str], source: str | None = None) -> None:
        self.path = Path(path)
        self.source = source
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] | None = open(self.path, "a", encoding="utf-8")
        self.count = 0

    def append(self, msgs: Sequence[LandedMessage]) -> None:
        if self._f is None:
            raise ReceiverError("capture file already closed")
        write_capture(self._f, [to_captured(m, self.source) for m in msgs])
        self._f.flush()
        os.fsync(self._f.fileno())
        self.count += len(msgs)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


# --------------------------------------------------------------------------- receiver


@dataclass(frozen=True)
class ReceiverConfig:
    """Everything a receiver needs; ``broker`` carries URLs, TLS, SASL and credentials."""

    broker: BrokerConfig = field(default_factory=BrokerConfig)
    preset: str = "rabbitmq"
    bindings: tuple[tuple[str, str], ...] = ()
    queue: str | None = None
    sources: tuple[str, ...] = ()
    credit_window: int = 2000
    flush_count: int = 500
    flush_ms: float = 50.0
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 10.0
    max_connect_attempts: int | None = None
    stop_timeout_s: float = 10.0
    console: ConsoleConfig | None = None

    def __post_init__(self) -> None:
        if self.credit_window < 1 or self.flush_count < 1 or self.flush_ms <= 0:
            raise ConfigError("credit_window, flush_count and flush_ms must be positive")
        if self.stop_timeout_s <= 0:
            raise ConfigError("stop_timeout_s must be positive")
        subscriptions(self.preset, bindings=self.bindings, queue=self.queue, sources=self.sources)

    def subscriptions(self) -> list[Subscription]:
        return subscriptions(
            self.preset, bindings=self.bindings, queue=self.queue, sources=self.sources
        )


@dataclass
class ReceiverStats:
    """Counters an operator (or a test) can read while the receiver runs."""

    received: int = 0
    landed: int = 0
    settled: int = 0
    groups: int = 0
    connects: int = 0
    disconnects: int = 0
    unsettled_dropped: int = 0
    last_error: str | None = None


class _Handler(MessagingHandler):
    """Forwards proton events to the Receiver; all state lives there.

    MessagingHandler's endpoint handling is kept (opened/closed/error
    callbacks), but its per-delivery helpers are replaced by one lean
    ``on_delivery``: one reused Message, no auto-accept or flow-control layers,
    no extra dispatch per message. That is most of the receiver's per-message
    overhead over a bare consumer.
    """

    def __init__(self, owner: QmfReceiver) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True, peer_close_is_error=True)
        children: Any = self.handlers  # a plain list here (proton types it loosely)
        self.handlers = [h for h in children if isinstance(h, EndpointStateHandler)]
        self.owner = owner
        self._msg = Message()

    def on_connection_opened(self, event: Event) -> None:
        self.owner._on_opened(event)

    def on_delivery(self, event: Event) -> None:
        d = event.delivery
        if d is None:
            return
        link = d.link
        if link.is_receiver:
            if d.aborted:
                d.settle()
            elif d.readable and not d.partial:
                data = link.recv(d.pending)
                link.advance()
                if data is None:
                    return
                msg = self._msg
                msg.decode(data)
                self.owner._on_message(d, msg)
        elif d.updated:
            d.settle()  # a console request: the broker has decided, forget it

    def on_link_flow(self, event: Event) -> None:
        link = event.link
        if link is not None and link.is_sender and link.credit > 0:
            self.owner._pump_requests()

    def on_link_opened(self, event: Event) -> None:
        self.owner._on_link_opened(event)

    def on_link_error(self, event: Event) -> None:
        link = event.link
        if link is not None:
            cond = link.remote_condition
            what = self.owner._describe_link(link)
            self.owner._on_error(
                f"broker refused the link {what}: {_cond(cond)}", cond, event.connection, True
            )

    def on_session_error(self, event: Event) -> None:
        # RabbitMQ ends the session (not just the link) for a missing queue or exchange.
        sess = event.session
        cond = sess.remote_condition if sess is not None else None
        waiting = self.owner._unattached(event.connection)
        during = f" (while attaching {', '.join(waiting)})" if waiting else ""
        self.owner._on_error(
            f"broker ended the session{during}: {_cond(cond)}", cond, event.connection, True
        )

    def on_connection_error(self, event: Event) -> None:
        c = event.connection
        cond = c.remote_condition if c is not None else None
        self.owner._on_error(f"broker closed the connection: {_cond(cond)}", cond, c, True)

    def on_transport_error(self, event: Event) -> None:
        t = event.transport
        cond = t.condition if t is not None else None
        url = self.owner.config.broker.for_url(self.owner._url_index).urls[0]
        self.owner._on_error(
            f"transport error ({url}): {_cond(cond)}", cond, event.connection, False
        )

    def on_disconnected(self, event: Event) -> None:
        self.owner._on_disconnected(event.connection)

    def on_transport_closed(self, event: Event) -> None:
        # MessagingHandler reports a disconnect only for a connection still open
        # locally; after we closed it on an error, the socket's end is news too.
        self.owner._on_disconnected(event.connection)

    def on_connection_closed(self, event: Event) -> None:
        self.owner._on_closed(event.connection)


def _cond(cond: Any) -> str:
    if cond is None:
        return "no condition given"
    return f"{cond.name}: {cond.description}" if cond.description else str(cond.name)


class _Tick(Handler):
    """Periodic timer: keeps an otherwise idle reactor alive and drives time-based flushes."""

    def __init__(self, owner: QmfReceiver) -> None:
        super().__init__()
        self.owner = owner

    def on_timer_task(self, event: Event) -> None:
        self.owner._on_tick()


@dataclass
class _Job:
    """What the writer thread sees of a group: messages only, never proton objects.

    A proton wrapper's last reference dropped on another thread would run
    ``pn_decref`` there, racing the reactor (cffi releases the GIL in C calls).
    """

    msgs: list[LandedMessage]
    error: BaseException | None = None
    end: int | None = None  # the sink's next offset after this group (landing sinks)


@dataclass
class _Group:
    """One flush group on its way to the sink; settled only if its connection still lives."""

    items: list[tuple[LandedMessage, Delivery]]
    generation: int
    settle: bool
    job: _Job


class _Writer:
    """The sink's own thread: appends groups in order, one at a time.

    fsync takes milliseconds; doing it here lets the reactor keep receiving
    (and the next group keep growing) while the previous group is made durable.
    The reactor thread polls ``done`` after every event round (a few ms while a
    group is pending) and settles the group there,
    since proton objects belong to the reactor thread.
    """

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.done: queue.Queue[_Job] = queue.Queue()
        self._todo: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="qmf-landing-writer", daemon=True)
        self._thread.start()

    def submit(self, job: _Job) -> None:
        self._todo.put(job)

    def _run(self) -> None:
        warm_up = getattr(self.sink, "warm_up", None)
        if warm_up is not None:
            with contextlib.suppress(Exception):
                warm_up()
        while True:
            job = self._todo.get()
            if job is None:
                return
            try:
                self.sink.append(job.msgs)
                job.end = getattr(self.sink, "next_offset", None)
            except BaseException as exc:  # reported to the reactor thread, which stops
                job.error = exc
            self.done.put(job)

    def close(self, timeout_s: float) -> None:
        self._todo.put(None)
        self._thread.join(timeout_s)


class QmfReceiver:
    """Embeddable receiver: ``start()``, then ``run()`` / ``run_for(s)``, then ``stop()``.

    ``run()`` blocks until :meth:`request_stop` (signal-safe, thread-safe) and
    then shuts down cleanly. :meth:`start_thread` runs it in a daemon thread.
    """

    def __init__(
        self,
        config: ReceiverConfig,
        sink: Sink,
        *,
        on_group: Callable[[Sequence[LandedMessage]], None] | None = None,
        on_ready: Callable[[QmfReceiver], None] | None = None,
    ) -> None:
        self.config = config
        self.sink = sink
        self.stats = ReceiverStats()
        self.on_group = on_group
        self.on_ready = on_ready
        # Set once every subscription link is attached (bindings exist): publish after this.
        self.ready = threading.Event()
        self._links_open = 0
        self.error: BaseException | None = None
        self._subs = config.subscriptions()
        self._first_acquirer_flag = PRESETS[config.preset].sets_first_acquirer
        self._aliases = AliasNamer()
        self.console: ConsoleRole | None = None
        if config.console is not None:
            self.console = ConsoleRole(config.console, config.preset)
            self._subs.append(Subscription(self.console.reply_source, self.console.reply_filter))
        # Console requests: one sender per target (the v1 exchange, the v2 direct
        # exchange), the requests waiting for credit with their target.
        self._request_senders: dict[str, Sender] = {}
        self._requests: deque[tuple[str, Message]] = deque()
        self._requests_dropped = 0
        self._in_hand: list[tuple[LandedMessage, Delivery]] = []
        self._first_in_hand = 0.0
        self._pending: deque[_Group] = deque()  # submitted to the writer, not yet durable
        # Landed groups not yet under the settle marker: (end offset, settled at or None).
        self._landed: deque[tuple[int, float | None]] = deque()
        # Groups settled in the last LOST_DOUBT_S: (first offset, settled at).
        self._recent: deque[tuple[int, float]] = deque()
        self._lost_at: float | None = None
        self._marker_due: int | None = None
        self._marker_at = 0.0
        self._pending_count = 0
        self._since_top_up = 0
        self._received_at_check = 0
        self._quiet_since = time.monotonic()
        # credit is checked every window/8 messages: it can never run dry in between
        self._top_up_every = max(1, config.credit_window // 8)
        self._writer: _Writer | None = None
        self._container: Container | None = None
        self._conn: Connection | None = None
        self._receivers: list[Receiver] = []
        self._fatal: str | None = None
        self._stop_requested = False
        self._stopped = False
        self._close_note = "no connection was open"
        self._stopped_receiving = False
        self._url_index = 0
        self._generation = 0
        self._attempts = 0
        self._reconnect_at: float | None = None
        self._thread: threading.Thread | None = None
        # Since when the receiver is without a subscribed connection after losing one
        # (for the "reconnected" line), and the address of the connection it opened.
        self._down_since: float | None = None
        self._address = ""
        self._tick_s = max(0.005, min(0.1, config.flush_ms / 2000))
        self.sources = [s.address for s in self._subs]
        self.container_id = f"qmf-receiver-{uuid.uuid4()}"
        # One name per link, unique on the connection (qpidd refuses a duplicate).
        self.link_names = [link_name(self.container_id, i, s) for i, s in enumerate(self._subs)]
        self._link_subs = dict(zip(self.link_names, self._subs, strict=True))
        # The broker's own condition for the current connection's trouble (close,
        # session end, link refusal): reported instead of the transport error that
        # usually follows it.
        self._cause: str | None = None

    # ---- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Create the reactor and begin connecting (no blocking I/O here)."""
        if self._container is not None:
            raise ReceiverError("receiver already started")
        self._container = Container(_Handler(self))
        self._container.container_id = self.container_id
        self._container.timeout = self._tick_s
        self._container.start()
        self._container.schedule(self._tick_s, _Tick(self))
        # The writer thread never touches proton: cffi releases the GIL inside
        # proton's C calls, so only this thread may call into the engine.
        self._writer = _Writer(self.sink)
        self._connect()

    def _connect(self) -> None:
        assert self._container is not None
        cfg = self.config.broker.for_url(self._url_index)
        self._attempts += 1
        log.info("connecting to %s", cfg.describe())
        self._address = host_port(cfg.urls[0])
        conn = self._container.connect(**cfg.connect_kwargs())
        self._generation += 1
        conn.qmf_generation = self._generation  # stored in proton's record: survives re-wrapping
        self._conn = conn
        self._links_open = 0
        self._receivers = []
        self._cause = None
        for name, sub in zip(self.link_names, self._subs, strict=True):
            options: Filter | None = None
            if sub.binding_key is not None:
                options = Filter(
                    {
                        symbol("subject-filter"): Described(
                            symbol(QPIDD_TOPIC_FILTER), sub.binding_key
                        )
                    }
                )
            r = self._container.create_receiver(conn, sub.address, name=name, options=options)
            r.flow(self.config.credit_window)
            self._receivers.append(r)
        self._requests.clear()
        self._request_senders = {}
        if self.console is not None:
            self._request_sender(self.console.request_target)

    def _request_sender(self, target: str) -> Sender | None:
        """The current connection's sender to ``target``, attached on first use.

        The v1 exchange's is attached with the subscriptions; the v2 direct exchange's
        only once a v2 agent was heard (where v2 agents are, the exchange exists).
        """
        s = self._request_senders.get(target)
        if s is not None or self._container is None or self._conn is None:
            return s
        name = f"{self.container_id}-console-requests"
        if self.console is None or target != self.console.request_target:
            name += "-" + LINK_NAME_TEXT.sub("_", target).strip("_")
        s = self._container.create_sender(self._conn, target=target, name=name)
        self._request_senders[target] = s
        return s

    def run_for(self, seconds: float) -> None:
        """Process events for ``seconds`` (or until a stop is requested); no shutdown."""
        self._loop(time.monotonic() + seconds)

    def run(
        self,
        duration_s: float | None = None,
        *,
        report_every_s: float | None = None,
        report: Callable[[ReceiverStats], None] | None = None,
    ) -> None:
        """Process events until a stop is requested (or ``duration_s``), then shut down cleanly."""
        end = None if duration_s is None else time.monotonic() + duration_s
        try:
            while not self._stop_requested:
                step = report_every_s or 3600.0
                if end is not None:
                    step = min(step, end - time.monotonic())
                    if step <= 0:
                        break
                self._loop(time.monotonic() + step)
                if report is not None and report_every_s:
                    report(self.stats)
        finally:
            self._shutdown()

    @property
    def stopping(self) -> bool:
        """True once a stop was requested (signal, another thread, or a fatal error)."""
        return self._stop_requested

    def request_stop(self) -> None:
        """Ask the loop to stop; safe from signal handlers and other threads."""
        self._stop_requested = True

    def stop(self, timeout_s: float | None = None) -> None:
        """Land and settle what is in hand, close the connection, release the sink."""
        self.request_stop()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout_s if timeout_s is not None else self.config.stop_timeout_s + 5)
            if t.is_alive():
                raise ReceiverError("receiver thread did not stop in time")
        else:
            self._shutdown()
        if self.error is not None and not isinstance(self.error, ReceiverError):
            raise ReceiverError(str(self.error)) from self.error

    @property
    def ended(self) -> bool:
        """True once ``start_thread``'s thread has ended (a stop, or a fatal error)."""
        return self._thread is not None and not self._thread.is_alive()

    def start_thread(self, name: str = "qmf-receiver") -> threading.Thread:
        """``start()`` and ``run()`` in a daemon thread; ``stop()`` joins it."""
        self.start()

        def target() -> None:
            try:
                self.run()
            except BaseException as exc:
                self.error = exc
                log.error("receiver stopped on error: %s", exc)

        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()
        return self._thread

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT request a clean stop (main thread only)."""

        def handler(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping", signum)
            self.request_stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    # ---- loop -------------------------------------------------------------------------

    def _loop(self, deadline: float | None) -> None:
        if self._container is None:
            self.start()
        c = self._container
        assert c is not None
        while not self._stop_requested:
            if self._fatal is not None:
                raise ReceiverError(self._fatal)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            if self._reconnect_at is not None and now >= self._reconnect_at:
                self._reconnect_at = None
                self._reseal()
                self._connect()
            c.timeout = 0.002 if self._pending else self._tick_s
            c.process()
            self._complete()
            self._maybe_flush()
        if self._fatal is not None:
            raise ReceiverError(self._fatal)

    def _maybe_flush(self) -> None:
        """Submit the group in hand if it is big or old enough and the writer is idle."""
        if (
            self._in_hand
            and not self._pending
            and (
                len(self._in_hand) >= self.config.flush_count
                or time.monotonic() - self._first_in_hand >= self.config.flush_ms / 1000
            )
        ):
            self._submit(settle=True)

    def _submit(self, settle: bool) -> None:
        items = self._in_hand
        msgs = self._aliases.name_all([m for m, _ in items], time.monotonic())
        group = _Group(items, self._generation, settle, _Job(msgs))
        self._in_hand = []
        self._pending.append(group)
        self._pending_count += len(items)
        assert self._writer is not None
        self._writer.submit(group.job)

    def _finish(self, job: _Job) -> None:
        """A group came back from the writer: durable now, so settle it (reactor thread)."""
        g = self._pending.popleft()
        assert g.job is job, "the writer completes groups in order"
        self._pending_count -= len(g.items)
        msgs = job.msgs
        if job.error is not None:
            # Nothing of it settled: the broker keeps these messages. Stop receiving.
            self._fatal = f"landing failed, {len(msgs)} messages left unsettled: {job.error}"
            self.stats.last_error = self._fatal
            self._stop_requested = True
            if self._conn is not None and self._conn.state & Endpoint.LOCAL_ACTIVE:
                self._conn.close()
            return
        self.stats.landed += len(msgs)
        self.stats.groups += 1
        settled_at: float | None = None
        if g.settle and g.generation == self._generation and self._conn is not None:
            accepted = Delivery.ACCEPTED
            for _, d in g.items:
                d.update(accepted)
                d.settle()
            self.stats.settled += len(g.items)
            settled_at = time.monotonic()
        if job.end is not None:
            self._landed.append((job.end, settled_at))
            if settled_at is not None:
                self._recent.append((job.end - len(msgs), settled_at))
                while self._recent and settled_at - self._recent[0][1] > LOST_DOUBT_S:
                    self._recent.popleft()
        if self.on_group is not None:
            self.on_group(msgs)

    def _complete(self) -> None:
        """Settle every group the writer finished, then top up credit and flush again."""
        if self._writer is None:
            return
        done = False
        while True:
            try:
                g = self._writer.done.get_nowait()
            except queue.Empty:
                break
            self._finish(g)
            done = True
        if done:
            self._top_up()
            self._maybe_flush()

    def _wait_writer(self, timeout_s: float) -> None:
        """Block until every submitted group is durable (shutdown, disconnect)."""
        deadline = time.monotonic() + timeout_s
        while self._pending and self._writer is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ReceiverError(f"landing did not finish within {timeout_s} s")
            try:
                g = self._writer.done.get(timeout=left)
            except queue.Empty:
                continue
            self._finish(g)

    def _flush(self, settle: bool = True) -> None:
        """Land everything in hand now and settle it (blocking; shutdown and tests)."""
        if self._in_hand:
            self._submit(settle)
        self._wait_writer(self.config.stop_timeout_s)

    def _advance_marker(self, grace_s: float = SETTLE_GRACE_S, force: bool = False) -> None:
        """Move the settle marker over the landed groups whose settlement the broker has.

        It stops at the first group landed but not settled (connection lost):
        that one is sealed as in doubt at the reconnect.
        """
        mark = getattr(self.sink, "mark_settled", None)
        if mark is None:
            return
        now = time.monotonic()
        while self._landed:
            end, at = self._landed[0]
            if at is None or now - at < grace_s:
                break
            self._landed.popleft()
            self._marker_due = end
        if self._marker_due is not None and (force or now - self._marker_at >= MARKER_EVERY_S):
            mark(self._marker_due)
            self._marker_due = None
            self._marker_at = now

    def _reseal(self) -> None:
        """Before reconnecting: what was landed but not confirmed settled is in doubt now."""
        seal_fn = getattr(self.sink, "seal", None)
        if seal_fn is None:
            return
        self._wait_writer(self.config.stop_timeout_s)
        lost = self._lost_at if self._lost_at is not None else time.monotonic()
        doubtful = [first for first, at in self._recent if at >= lost - LOST_DOUBT_S]
        seal_fn(start=doubtful[0] if doubtful else None)
        self._landed.clear()
        self._recent.clear()
        self._marker_due = None
        self._lost_at = None

    def _held(self) -> int:
        return len(self._in_hand) + self._pending_count

    def _top_up(self) -> None:
        """Grant credit back up to the window unless too much is held unsettled."""
        self._since_top_up = 0
        if self._held() >= 2 * self.config.credit_window:
            return
        low = self.config.credit_window - self._top_up_every
        for r in self._receivers:
            if r.state & Endpoint.LOCAL_ACTIVE and r.credit <= low:
                r.flow(self.config.credit_window - r.credit)

    def _restate_credit(self) -> None:
        """After a quiet spell, send one flow frame per link (one more credit).

        Insurance against the broker and us disagreeing about the credit left:
        a flow frame re-states it. Idle subscriptions are normal, so this is
        cheap by design: at most one frame per link per quiet interval, and
        never beyond window + 64.
        """
        if self._held() >= self.config.credit_window:
            return
        for r in self._receivers:
            if r.state & Endpoint.LOCAL_ACTIVE and r.credit < self.config.credit_window + 64:
                r.flow(1)

    # ---- events -----------------------------------------------------------------------

    def _is_current(self, conn: Connection | None) -> bool:
        """Proton re-wraps C objects per event, so compare our generation tag, not identity."""
        return (
            conn is not None
            and self._conn is not None
            and getattr(conn, "qmf_generation", None) == self._generation
        )

    def _describe_link(self, link: Any) -> str:
        """How a refused link is named in errors: its address and binding key."""
        sub = self._link_subs.get(link.name)
        if sub is not None:
            return repr(sub.describe())
        return repr(link.source.address or link.target.address)

    def _unattached(self, conn: Connection | None) -> list[str]:
        """Our links the broker has not answered yet: what a session end refers to."""
        out: list[str] = []
        if conn is None:
            return out
        link = conn.link_head(Endpoint.REMOTE_UNINIT)
        while link is not None:
            out.append(self._describe_link(link))
            link = link.next(Endpoint.REMOTE_UNINIT)
        return out

    def _on_opened(self, event: Event) -> None:
        self.stats.connects += 1
        log.info("connected; attaching %s", ", ".join(s.describe() for s in self._subs))

    def _on_link_opened(self, event: Event) -> None:
        link = event.link
        if link is None or not link.is_receiver or not self._is_current(event.connection):
            return
        self._links_open += 1
        if self._links_open == len(self._subs):
            # Attempts count until every link is attached, not until the connection
            # opens: a broker that accepts connections but refuses a link would be
            # retried at the first back-off step forever.
            self._attempts = 0
        if self._links_open == len(self._subs) and not self.ready.is_set():
            log.info("subscribed to %s", ", ".join(s.describe() for s in self._subs))
            if self._down_since is not None:
                # host:port only: the URLs hold no credentials, and the line says no more
                log.info("receiver: reconnected to %s after %.1f s", self._address,
                         time.monotonic() - self._down_since)  # fmt: skip
                self._down_since = None
            if self.console is not None:
                self._send_requests(self.console.on_connected())
            self._report(True)
            self.ready.set()
            if self.on_ready is not None:
                self.on_ready(self)

    def _on_message(self, d: Delivery, msg: Message) -> None:
        # Hot path: no per-message connection check (proton would wrap the
        # connection for it). A connection's messages reach _in_hand only while it
        # is current: _lost_connection submits them before the next _connect.
        if self._stop_requested or self._conn is None:
            return  # left unsettled: the broker redelivers
        if not self._in_hand:
            self._first_in_hand = time.monotonic()
        landed = to_landed(msg, first_acquirer_flag=self._first_acquirer_flag)
        self._in_hand.append((landed, d))
        if self.console is not None:
            self._send_requests(self.console.observe(landed))
        self.stats.received += 1
        self._since_top_up += 1
        if self._since_top_up >= self._top_up_every:
            self._top_up()
        self._maybe_flush()

    def _send_requests(self, requests: Sequence[ConsoleRequest]) -> None:
        """Queue console requests (subject = routing key, reply-to = our reply queue)."""
        if not requests or self.console is None:
            return
        for req in requests:
            if len(self._requests) >= MAX_QUEUED_REQUESTS:
                self._requests_dropped += 1
                if self._requests_dropped == 1:
                    log.warning("console: %d requests wait for the broker's credit; dropping "
                                "new ones until they go", len(self._requests))  # fmt: skip
                continue
            msg = Message(
                body=req.body,
                subject=req.key,
                reply_to=req.reply_to,
                correlation_id=req.correlation_id,
                content_type=req.content_type,
                properties=dict(req.properties) or None,
                inferred=True,
            )
            self._requests.append((req.target, msg))
        self._pump_requests()

    def _pump_requests(self) -> None:
        """Send what waits, in order per target, as far as each sender has credit."""
        if not self._requests:
            return
        waiting: deque[tuple[str, Message]] = deque()
        for target, msg in self._requests:  # a sender's credit only falls here: order is kept
            s = self._request_sender(target)
            if s is not None and s.credit > 0:
                s.send(msg)
            else:
                waiting.append((target, msg))
        self._requests = waiting
        if not waiting:
            self._requests_dropped = 0

    def _on_tick(self) -> None:
        self._maybe_flush()
        if not self._stop_requested:
            # While stopping, only the broker's answer to the close moves the marker: a
            # broker that stopped answering may not have read the last dispositions.
            self._advance_marker()
        now = time.monotonic()
        if self.stats.received != self._received_at_check:
            self._received_at_check = self.stats.received
            self._quiet_since = now
        elif now - self._quiet_since >= QUIET_RESTATE_S and self.ready.is_set():
            self._quiet_since = now
            self._restate_credit()
        if self.console is not None and self.ready.is_set():
            self._send_requests(self.console.due())
        if self._container is not None and not self._stopped:
            self._container.schedule(self._tick_s, _Tick(self))

    def _on_error(
        self, text: str, cond: Any, conn: Connection | None, from_broker: bool = False
    ) -> None:
        """One line per trouble, in the broker's own words when it gave any.

        The broker's condition (connection close, session end, link detach) is
        kept as the cause of this connection's loss: the transport error that
        follows it (often just ``connection aborted``) is logged at info level
        only. Refusals that would come again on retry are fatal.
        """
        name = getattr(cond, "name", None)
        current = conn is None or self._is_current(conn)
        if from_broker and current and self._cause is None:
            self._cause = text
        self.stats.last_error = self._cause if current and self._cause is not None else text
        urls = ", ".join(self.config.broker.urls)
        if name in FATAL_CONDITIONS or (
            name is not None
            and "SSL" in str(getattr(cond, "description", ""))
            and "certificate verify failed" in str(getattr(cond, "description", ""))
        ):
            self._fatal = text if urls in text else f"{text} [{urls}]"
            if name == "amqp:unauthorized-access":
                self._fatal += (
                    f": the broker refused user {self.config.broker.user or '(anonymous)'!r}; "
                    "check QMF_BROKER_USER/QMF_BROKER_PASSWORD, --credentials-file or the URL"
                )
            return
        if from_broker and name in REFUSAL_CONDITIONS and current:
            self._fatal = (
                f"{text} [{urls}]; not retried, the broker would refuse it again: "
                f"{REFUSAL_HINTS.get(str(name), 'see the broker log')}"
            )
            if self._in_hand:  # other links' deliveries: land them, as a lost connection does
                self.stats.unsettled_dropped += len(self._in_hand)
                self._submit(settle=False)
            return
        if from_broker or (current and self._cause is None):
            log.warning("%s", text)
        else:  # after the broker's own condition, or a connection already given up
            log.info("then %s", text)
        if conn is not None and self._is_current(conn) and conn.state & Endpoint.LOCAL_ACTIVE:
            conn.close()  # a refused link: drop the connection and retry the whole set

    def _on_disconnected(self, conn: Connection | None) -> None:
        if self._is_current(conn) and not self._stopped_receiving:
            self._lost_connection()

    def _on_closed(self, conn: Connection | None) -> None:
        if self._is_current(conn) and not self._stop_requested:
            self._lost_connection()

    def _transport_text(self) -> str | None:
        """The current connection's transport condition (set before its error event)."""
        t = self._conn.transport if self._conn is not None else None
        cond = t.condition if t is not None else None
        if cond is None:
            return None
        url = self.config.broker.for_url(self._url_index).urls[0]
        return f"transport error ({url}): {_cond(cond)}"  # which URL, when several are tried

    def _lost_connection(self) -> None:
        if self._conn is None:
            return
        # this loss's reason: the broker's condition, else this transport's
        reason = self._cause or self._transport_text()
        if reason is not None:
            self.stats.last_error = reason
        self.stats.disconnects += 1
        self._lost_at = time.monotonic()
        if self.ready.is_set() and self._down_since is None:
            self._down_since = self._lost_at  # a subscribed connection lost: say when it is back
        self.ready.clear()
        # The deliveries are gone, but a temporary subscription's queue is too:
        # land what we hold (a durable queue redelivers it; msg_key de-duplicates).
        if self._in_hand:
            self.stats.unsettled_dropped += len(self._in_hand)
            self._submit(settle=False)
        self._conn = None
        self._receivers = []
        self._request_senders = {}
        if self._stop_requested or self._fatal is not None:
            return
        limit = self.config.max_connect_attempts
        if limit is not None and self._attempts >= limit:
            self._fatal = (
                f"gave up after {self._attempts} connection attempts: {self.stats.last_error}; "
                "is the broker running and the URL right (--url, QMF_BROKER_URL)?"
            )
            return
        delay = min(
            self.config.backoff_max_s,
            self.config.backoff_initial_s * (2 ** max(0, self._attempts - 1)),
        )
        self._url_index += 1
        why = reason or self.stats.last_error or "connection lost"
        if self._links_open < len(self._subs) and self._cause is None:
            why = f"{why}; {self._links_open} of {len(self._subs)} links were attached"
        log.warning("disconnected (%s); reconnecting in %.1f s", why, delay)
        self._report(False, why)
        self._reconnect_at = time.monotonic() + delay

    def _report(self, connected: bool, reason: str | None = None) -> None:
        """Tell a sink that keeps a status (the landing log's partition) whether we are
        connected; a status that cannot be written costs a warning, not the receiver."""
        report = getattr(self.sink, "report", None)
        if report is None:
            return
        try:
            report(connected, self._address or None, reason)
        except OSError as exc:
            log.warning("could not write the receiver status: %s", exc)

    @property
    def close_note(self) -> str:
        """How the last stop ended the connection: whether the broker confirmed it."""
        return self._close_note

    def _close_in_order(self, c: Container, conn: Connection | None, deadline: float) -> str | None:
        """End the sessions, then close the connection, each on the broker's answer.

        None once the broker has answered both, else what it left unanswered. A broker
        handles a session's frames in order and answers its ``end`` after the
        dispositions sent before it (RabbitMQ 3.10 acks each of them to its queue
        first), so the answer means every settlement arrived. Closing the connection
        right after the last dispositions leaves the broker to tear the session down
        with them perhaps unread: those messages would come again to the next receiver.
        """
        if conn is None or not (conn.state & Endpoint.LOCAL_ACTIVE) or conn.transport is None:
            return "no open connection"
        sessions: list[Session] = []
        ssn = conn.session_head(Endpoint.LOCAL_ACTIVE)
        while ssn is not None:
            sessions.append(ssn)
            ssn = ssn.next(Endpoint.LOCAL_ACTIVE)  # type: ignore[no-untyped-call]
        for ssn in sessions:
            ssn.close()
        ended = self._process_until(
            c, conn, lambda: all(s.state & Endpoint.REMOTE_CLOSED for s in sessions), deadline
        )
        conn.close()
        closed = self._process_until(
            c, conn, lambda: bool(conn.state & Endpoint.REMOTE_CLOSED), deadline
        )
        if ended and closed:
            return None
        open_ends = sum(1 for s in sessions if not s.state & Endpoint.REMOTE_CLOSED)
        unanswered = [f"{open_ends} session ends"] if open_ends else []
        if not closed:
            unanswered.append("the connection close")
        gone = "; the transport went" if conn.transport is None else ""
        return f"unanswered: {' and '.join(unanswered)}{gone}"

    @staticmethod
    def _process_until(
        c: Container, conn: Connection, done: Callable[[], bool], deadline: float
    ) -> bool:
        """Run the reactor until ``done()``, the transport goes or the deadline passes."""
        while not done():
            if time.monotonic() >= deadline or conn.transport is None or not c.process():
                return False
        return True

    def _shutdown(self) -> None:
        """Land what is in hand, settle, close the connection, wind the reactor down."""
        if self._stopped:
            return
        self._stop_requested = True
        c = self._container
        try:
            if self._fatal is None:
                self._flush()
            else:
                self._wait_writer(self.config.stop_timeout_s)
        finally:
            self._stopped_receiving = True
            deadline = time.monotonic() + self.config.stop_timeout_s
            if c is not None:
                unconfirmed: str | None = "the close failed"
                t_close = time.monotonic()
                try:
                    unconfirmed = self._close_in_order(c, self._conn, deadline)
                except Exception as exc:  # a broken transport: the broker keeps what it lacks
                    log.warning("closing the connection failed: %s", exc)
                if unconfirmed is None:
                    # The broker ended the session after every disposition we sent.
                    self._advance_marker(grace_s=0.0, force=True)
                    self._close_note = "the broker confirmed every settlement"
                elif self._conn is not None:
                    # As for a lost connection: what was settled lately is in doubt too.
                    self._reseal()
                    self._close_note = (
                        f"the broker did not confirm the close within {self.config.stop_timeout_s} s"
                        f" ({unconfirmed} after {time.monotonic() - t_close:.1f} s):"
                        " what landed since the settle marker, and what was settled in the"
                        f" last {LOST_DOUBT_S:.0f} s, is sealed as in doubt"
                    )
                self._stopped = True
                with contextlib.suppress(Exception):
                    c.stop()
                with contextlib.suppress(Exception):
                    while time.monotonic() < deadline and c.process():
                        pass
            self._stopped = True
            if self._writer is not None:
                self._writer.close(self.config.stop_timeout_s)
            self.sink.close()
            log.info(
                "stopped: %d received, %d landed, %d settled; %s",
                self.stats.received,
                self.stats.landed,
                self.stats.settled,
                self._close_note,
            )


# --------------------------------------------------------------------------- embedding


def _norm(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "").replace(".", "")


def config_from_options(options: Mapping[str, str]) -> ReceiverConfig:
    """A ReceiverConfig from string options (Spark ``receiver.*`` options, case-insensitive)."""
    from receivers.config import TlsConfig

    o = {_norm(k): v for k, v in options.items()}
    known = {
        "url",
        "urls",
        "preset",
        "bind",
        "bindings",
        "queue",
        "source",
        "sources",
        "credit",
        "creditwindow",
        "flushcount",
        "flushms",
        "saslmechanisms",
        "sasl",
        "cafile",
        "certfile",
        "keyfile",
        "credentialsfile",
        "verifyhostname",
        "partition",
        "console",
        "consoledialect",
        "consolekey",
        "consolewants",
        "consolerefresh",
        "consolerefreshclasses",
    }
    unknown = sorted(set(o) - known)
    if unknown:
        raise ConfigError(f"unknown receiver options: {', '.join(unknown)}")

    def split(v: str | None) -> tuple[str, ...]:
        return tuple(x.strip() for x in (v or "").split(",") if x.strip())

    urls = split(o.get("urls") or o.get("url"))
    tls = None
    if any(k in o for k in ("cafile", "certfile", "keyfile")):
        tls = TlsConfig(
            ca_file=o.get("cafile"),
            cert_file=o.get("certfile"),
            key_file=o.get("keyfile"),
            verify_hostname=o.get("verifyhostname", "true").lower() != "false",
        )
    broker = BrokerConfig.from_sources(
        urls,
        credentials_file=o.get("credentialsfile"),
        sasl_mechanisms=split(o.get("saslmechanisms") or o.get("sasl")),
        tls=tls,
    )
    kwargs: dict[str, Any] = {}
    if "credit" in o or "creditwindow" in o:
        kwargs["credit_window"] = int(o.get("creditwindow") or o["credit"])
    if "flushcount" in o:
        kwargs["flush_count"] = int(o["flushcount"])
    if "flushms" in o:
        kwargs["flush_ms"] = float(o["flushms"])
    console = None
    if o.get("console", "false").lower() in ("1", "true", "yes"):
        refresh: dict[str, Any] = {}
        if "consolerefresh" in o:
            refresh["refresh_s"] = float(o["consolerefresh"])
        if "consolerefreshclasses" in o:
            refresh["refresh_classes"] = parse_refresh_classes(o["consolerefreshclasses"])
        console = ConsoleConfig(
            dialect=o.get("consoledialect", "AM2"),
            command_key=o.get("consolekey", "broker"),
            wants=o.get("consolewants") or None,
            **refresh,
        )
    return ReceiverConfig(
        broker=broker,
        console=console,
        preset=o.get("preset", "rabbitmq"),
        bindings=tuple(parse_binding(b) for b in split(o.get("bindings") or o.get("bind"))),
        queue=o.get("queue") or None,
        sources=split(o.get("sources") or o.get("source")),
        **kwargs,
    )


def start_embedded(root: str, options: Mapping[str, str]) -> QmfReceiver | FleetReceivers:
    """Start a receiver in a daemon thread landing into ``root`` (the Spark source's default),
    or with ``config`` (a fleet file, ``receivers.fleet``) one per broker.

    Waits (``readyTimeout`` seconds, default 30) until the subscriptions exist,
    so messages published after this returns are not missed; raises on a fatal
    error (e.g. authentication), and returns anyway if the broker is merely
    unreachable (the receiver keeps retrying). A fleet raises only for a bad file:
    one broker's refusal is that broker's (its receiver is started again later).
    """
    from receivers.fleet import FleetReceivers, load_fleet

    o = {_norm(k): v for k, v in options.items()}
    partition = o.get("partition")
    ready_timeout = float(o.get("readytimeout", "30"))
    if "config" in o:
        fleet = load_fleet(o["config"])
        return FleetReceivers(fleet, root, wants=o.get("consolewants")).start(ready_timeout)
    own = ("partition", "readytimeout", "broker")
    rest = {k: v for k, v in options.items() if _norm(k) not in own}
    cfg = config_from_options(rest)
    receiver = QmfReceiver(cfg, LandingSink(root, partition, o.get("broker", DEFAULT_BROKER)))
    receiver.start_thread()
    deadline = time.monotonic() + ready_timeout
    while not receiver.ready.wait(0.05):
        if receiver.error is not None:  # the thread ended: it already shut down
            raise ReceiverError(str(receiver.error))
        if time.monotonic() > deadline:
            log.warning(
                "embedded receiver not subscribed after %.0f s; still trying", ready_timeout
            )
            break
    return receiver


def replace_config(cfg: ReceiverConfig, **changes: Any) -> ReceiverConfig:
    """``dataclasses.replace`` for callers that only import this module."""
    return dataclasses.replace(cfg, **changes)
