"""The receiver's QMF console role: ask for what makes content decodable, refresh what is watched.

Agents broadcast their schemas when they start; a pipeline started later would
land content it can never decode. So the receiver also speaks as a console, on
a reply queue of its own (a temporary subscription to ``amq.direct`` with a
unique key, landed like everything else, so schema responses end up in the
landing log next to the content they describe):

* on every (re)connection: Broker Request ``B`` -> ``b``; then Package Query
  ``P`` -> ``p``...; Class Query ``Q`` per package -> ``q``...;
* Schema Request ``S`` for every class key (package, class, hash) it has not
  seen a schema response ``s`` for: from class indications (replies or the
  ``schema.#`` broadcasts) and from content/event records whose key is new.

A request that got no schema back is retried after ``retry_s``, at most
``max_attempts`` times. Requests and replies use the codec
(``pipeline.codec``); content records are only peeked at (their class key
follows the 8-byte header), never decoded, to keep the receiver's hot path cheap.

The role also *refreshes* the objects people watch (``refresh_classes``: queue,
exchange, broker) by query every ``refresh_s``. qpidd publishes an object only
when it changed since its last publish, and any console's query of an object
(qpid-stat, qpid-config, ours) clears that changed flag: after a load stops, a
queue's final counts may never be published again. The answers to our queries
land like everything else and carry the exact current values. A v1 Get Query
``G`` per class goes to the command key once v1 publications (``c``, ``i``,
``e``, ``h``) were seen; a QMF v2 ``_query_request`` per class goes to each v2
agent by its own name (learned from its heartbeats), so that the answers name
that agent (qpidd answers a query sent to the alias ``broker`` as ``broker``).
Requests go out from the receiver's timer (``due``), never from the delivery path.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeline.codec import v1, v2
from pipeline.codec.message import decode_message
from pipeline.codec.records import (
    BrokerRequest,
    BrokerResponse,
    ClassIndication,
    ClassQuery,
    CommandComplete,
    GetQuery,
    Heartbeat,
    PackageIndication,
    PackageQuery,
    Record,
    SchemaRequest,
    SchemaResponse,
    V2Message,
)
from pipeline.codec.schema import SchemaKey
from pipeline.codec.seed import seeded_registry
from pipeline.codec.types import TypedMap
from receivers.landing import LandedMessage
from receivers.publisher import APP_ID_PROPERTY
from receivers.schema_wants import SchemaWants

log = logging.getLogger("qmf.receiver.console")

CONTENT_OPCODES = frozenset(b"cige")
REPLY_OPCODES = frozenset(b"bpqsz")
# What an agent publishes by itself: seeing one says it speaks v1 ('g' only answers a G).
V1_PUBLISH_OPCODES = frozenset(b"cieh")
V1_MAGIC = (b"AM1", b"AM2")
V2_HEARTBEAT = "_agent_heartbeat_indication"
V2_QUERY = "_query_request"
V2_ANSWERS = frozenset({"_query_response", "_exception"})
STR16 = 0x95  # AMQP 0-10 str16 (UTF-8): how qpid's consoles send text in a query map

REPLY_SOURCES = {
    "rabbitmq": "/exchange/amq.direct/{key}",
    "qpidd": "amq.direct",  # with a topic-binding filter on the key
}
REPLY_TO = {"rabbitmq": "/exchange/amq.direct/{key}", "qpidd": "amq.direct/{key}"}
REQUEST_TARGETS = {"rabbitmq": "/exchange/{exchange}", "qpidd": "{exchange}"}

BROKER_PACKAGE = "org.apache.qpid.broker"
# The classes whose counters people watch (depth, enqueues, routed, connections).
DEFAULT_REFRESH_CLASSES: tuple[tuple[str, str], ...] = (
    (BROKER_PACKAGE, "queue"),
    (BROKER_PACKAGE, "exchange"),
    (BROKER_PACKAGE, "broker"),
)
# No longer than a few of qpidd's publish intervals (--mgmt-pub-interval: 10 s by
# default, 1-2 s in tests): a final count not republished is in hand within 20 s.
DEFAULT_REFRESH_S = 20.0


def parse_refresh_classes(text: str) -> tuple[tuple[str, str], ...]:
    """``package:class`` or ``class`` (package ``org.apache.qpid.broker``), comma or space
    separated, as (package, class) pairs in the order given, each once."""
    out: dict[tuple[str, str], None] = {}
    for item in text.replace(",", " ").split():
        package, sep, name = item.rpartition(":")
        if sep and not (package and name):
            raise ValueError(f"refresh class {item!r} must be PACKAGE:CLASS or CLASS")
        out[(package or BROKER_PACKAGE, name)] = None
    return tuple(out)


def format_refresh_classes(classes: tuple[tuple[str, str], ...]) -> str:
    """The text form ``parse_refresh_classes`` reads (package left out when it is the broker's)."""
    return ",".join(n if p == BROKER_PACKAGE else f"{p}:{n}" for p, n in classes)


@dataclass(frozen=True)
class ConsoleConfig:
    """Console settings; ``dialect`` is what v1 requests are encoded in (qpidd wants AM2)."""

    dialect: str = "AM2"
    exchange: str = "qpid.management"
    command_key: str = "broker"
    reply_key: str = field(default_factory=lambda: f"qmf-receiver-{uuid.uuid4().hex[:12]}")
    retry_s: float = 30.0
    max_attempts: int = 3
    # Folder of schema keys the silver job still waits for (receivers.schema_wants);
    # read every ``wants_poll_s``: each wanted key is asked for again.
    wants: str | None = None
    wants_poll_s: float = 5.0
    # Refresh by query every refresh_s (0: never) the objects of these classes.
    refresh_s: float = DEFAULT_REFRESH_S
    refresh_classes: tuple[tuple[str, str], ...] = DEFAULT_REFRESH_CLASSES
    # QMF v2 agents listen on this direct exchange, keyed by their own name.
    v2_exchange: str = "qmf.default.direct"
    # An agent (or the v1 side) not heard from this long is no longer refreshed:
    # what went away is not asked forever (a restarted qpidd has a new v2 name).
    forget_s: float = 300.0

    def __post_init__(self) -> None:
        if self.dialect not in ("AM1", "AM2"):
            raise ValueError(f"console dialect must be AM1 or AM2, not {self.dialect!r}")
        if not self.refresh_s >= 0:
            raise ValueError(
                f"console refresh must be 0 (off) or more seconds, not {self.refresh_s}"
            )


@dataclass(frozen=True)
class ConsoleRequest:
    """One request as it goes on the wire: the receiver sends ``body`` on a sender link
    to ``target`` with subject ``key`` (the routing key) and the other fields as given."""

    target: str
    key: str
    body: bytes
    reply_to: str
    properties: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None
    correlation_id: str | None = None


def peek_class_key(body: bytes) -> SchemaKey | None:
    """(package, class, hash) of the first record of a v1 content/event/'q'/'s' message."""
    if len(body) < 8 or body[:3] not in V1_MAGIC:
        return None
    off = 8
    if body[3] in b"qs" and body[2:3] == b"2":
        off += 1  # AM2 class kind
    try:
        n = body[off]
        package = body[off + 1 : off + 1 + n].decode("utf-8")
        off += 1 + n
        n = body[off]
        name = body[off + 1 : off + 1 + n].decode("utf-8")
        off += 1 + n
    except (IndexError, UnicodeDecodeError):
        return None
    h = body[off : off + 16]
    if len(h) != 16:
        return None
    return SchemaKey(package, name, bytes(h))


@dataclass
class _Asked:
    at: float
    attempts: int


@dataclass
class _Heard:
    """A source of publications to refresh: when it was last heard, when it is due."""

    at: float
    due: float


class ConsoleRole:
    """Decides which requests to send; the receiver owns the links and sends them."""

    def __init__(self, config: ConsoleConfig, preset: str = "rabbitmq") -> None:
        if preset not in REPLY_SOURCES:
            raise ValueError(f"no console addressing for preset {preset!r}")
        self.config = config
        self.preset = preset
        # Decodes replies only (which schemas to ask for is `known`); seeded like every
        # decode path, so a reply that carries content still decodes.
        self.registry = seeded_registry()
        self.known: set[SchemaKey] = set()
        self.asked: dict[SchemaKey, _Asked] = {}
        self.packages_asked: set[str] = set()
        self.sent: dict[str, int] = {}
        self.replies: dict[str, int] = {}
        # Answers to refresh queries, by opcode ('g' messages, v2 _query_response/_exception).
        self.refreshed: dict[str, int] = {}
        # Who is refreshed: v2 agents by name, and the v1 side (one command key).
        self.v2_agents: dict[str, _Heard] = {}
        self.v1_heard: _Heard | None = None
        self._seq = itertools.count(1)
        self.wants = None if config.wants is None else SchemaWants(config.wants)
        self._wants_read_at = float("-inf")

    # --- addressing ----------------------------------------------------------------------

    @property
    def reply_source(self) -> str:
        return REPLY_SOURCES[self.preset].format(key=self.config.reply_key)

    @property
    def reply_filter(self) -> str | None:
        """The binding key for a filter-based reply subscription (qpidd)."""
        return self.config.reply_key if self.preset == "qpidd" else None

    @property
    def reply_to(self) -> str:
        return REPLY_TO[self.preset].format(key=self.config.reply_key)

    @property
    def request_target(self) -> str:
        return REQUEST_TARGETS[self.preset].format(exchange=self.config.exchange)

    @property
    def v2_request_target(self) -> str:
        """QMF v2 requests: the direct exchange, the agent's name as subject (routing key)."""
        return REQUEST_TARGETS[self.preset].format(exchange=self.config.v2_exchange)

    # --- requests ------------------------------------------------------------------------

    def _encode(self, record: Record) -> ConsoleRequest:
        self.sent[record.opcode] = self.sent.get(record.opcode, 0) + 1
        return ConsoleRequest(
            self.request_target, self.config.command_key, v1.encode_record(record), self.reply_to
        )

    def _seq_next(self) -> int:
        return next(self._seq)

    def on_connected(self) -> list[ConsoleRequest]:
        """A new connection (and reply queue): say hello, and forget what is unanswered."""
        self.packages_asked.clear()
        self.asked = {k: a for k, a in self.asked.items() if k in self.known}
        d = self.config.dialect
        return [self._encode(BrokerRequest(dialect=d, opcode="B", seq=self._seq_next()))]

    def _schema_request(self, key: SchemaKey, now: float) -> list[ConsoleRequest]:
        if key in self.known:
            return []
        asked = self.asked.get(key)
        if asked is not None:
            return []
        self.asked[key] = _Asked(now, 1)
        rec = SchemaRequest(
            dialect=self.config.dialect,
            opcode="S",
            seq=self._seq_next(),
            package=key.package,
            class_name=key.name,
            schema_hash=key.hash,
        )
        return [self._encode(rec)]

    def _get_query(self, package: str, name: str) -> ConsoleRequest:
        """v1 'G' for every object of one class (qpidd reads ``_class``; ``_package`` narrows)."""
        query = TypedMap(
            {"_class": name, "_package": package}, {"_class": STR16, "_package": STR16}
        )
        rec = GetQuery(dialect=self.config.dialect, opcode="G", seq=self._seq_next(), query=query)
        return self._encode(rec)

    def _query_v2(self, agent: str, package: str, name: str) -> ConsoleRequest:
        """A QMF v2 OBJECT query for one class, to ``agent`` by name, app-id ``qmf2``.

        qpidd's agent takes a v2 request only with app-id ``qmf2`` (over AMQP 1.0 the
        property ``x-amqp-0-10.app-id``), reads ``qmf.opcode`` and the 0-10 map body.
        """
        sid = TypedMap(
            {"_class_name": name, "_package_name": package},
            {"_class_name": STR16, "_package_name": STR16},
        )
        body = TypedMap({"_schema_id": sid, "_what": "OBJECT"}, {"_what": STR16})
        enc = v2.encode_v2([V2Message(dialect="V2", opcode=V2_QUERY, content=None, body=body)])
        props = {str(k): str(v) for k, v in enc.application_properties.items()}
        props[APP_ID_PROPERTY] = "qmf2"
        self.sent[V2_QUERY] = self.sent.get(V2_QUERY, 0) + 1
        return ConsoleRequest(
            target=self.v2_request_target,
            key=agent,
            body=enc.body,
            reply_to=self.reply_to,
            properties=props,
            content_type=enc.content_type,
            correlation_id=f"{self.config.reply_key}-{self._seq_next()}",
        )

    def _heard_v2(self, m: LandedMessage, now: float) -> None:
        """A v2 heartbeat: its agent (``qmf.agent``, else the body's ``_values._name``)."""
        name = m.application_properties.get("qmf.agent")
        if not name:
            res = decode_message(
                m.body,
                registry=self.registry,
                application_properties=m.application_properties,
                content_type=m.content_type,
                app_id=m.app_id,
            )
            name = next((r.agent for r in res.records if isinstance(r, Heartbeat)), None)
            if not name:
                return
        heard = self.v2_agents.get(name)
        if heard is not None:
            heard.at = now
            return
        self.v2_agents[name] = _Heard(now, now)
        if self.config.refresh_s > 0:
            log.info("console: QMF v2 agent %s: refreshing %s every %g s", name,
                     format_refresh_classes(self.config.refresh_classes), self.config.refresh_s)  # fmt: skip

    def _observe_v2(self, m: LandedMessage, opcode: str, now: float | None) -> list[ConsoleRequest]:
        """v2 data is self-describing: only heartbeats (who to refresh) and our answers
        (counted) matter, and nothing is sent from here (the timer sends)."""
        if opcode == V2_HEARTBEAT:
            self._heard_v2(m, time.monotonic() if now is None else now)
        elif opcode in V2_ANSWERS:
            self.refreshed[opcode] = self.refreshed.get(opcode, 0) + 1
        return []

    def observe(self, m: LandedMessage, now: float | None = None) -> list[ConsoleRequest]:
        """Look at one received message; return the requests it calls for."""
        body = m.body
        props = m.application_properties
        if props:
            v2_opcode = props.get("qmf.opcode")
            if v2_opcode is not None:
                return self._observe_v2(m, v2_opcode, now)
        if len(body) < 8 or body[:3] not in V1_MAGIC:
            return []
        now = time.monotonic() if now is None else now
        op = body[3]
        if op in V1_PUBLISH_OPCODES:
            if self.v1_heard is None:
                self.v1_heard = _Heard(now, now)
                if self.config.refresh_s > 0:
                    log.info("console: QMF v1 publications seen: refreshing %s on %r every %g s",
                             format_refresh_classes(self.config.refresh_classes),
                             self.config.command_key, self.config.refresh_s)  # fmt: skip
            else:
                self.v1_heard.at = now
        elif op == ord("g"):
            self.refreshed["g"] = self.refreshed.get("g", 0) + 1
        if op in CONTENT_OPCODES:
            key = peek_class_key(body)
            return [] if key is None else self._schema_request(key, now)
        if op not in REPLY_OPCODES:
            return []
        result = decode_message(body, registry=self.registry, routing_key=m.routing_key)
        out: list[ConsoleRequest] = []
        for r in result.records:
            self.replies[r.opcode] = self.replies.get(r.opcode, 0) + 1
            if isinstance(r, SchemaResponse):
                self.known.add(r.schema.key)
                self.asked.pop(r.schema.key, None)
                if self.wants is not None:
                    self.wants.done([r.schema.key])
            elif isinstance(r, ClassIndication):
                key = SchemaKey(r.package, r.class_name, r.schema_hash)
                out.extend(self._schema_request(key, now))
            elif isinstance(r, BrokerResponse):
                out.append(
                    self._encode(
                        PackageQuery(dialect=self.config.dialect, opcode="P", seq=self._seq_next())
                    )
                )
            elif isinstance(r, PackageIndication):
                if r.package not in self.packages_asked:
                    self.packages_asked.add(r.package)
                    q = ClassQuery(
                        dialect=self.config.dialect,
                        opcode="Q",
                        seq=self._seq_next(),
                        package=r.package,
                    )
                    out.append(self._encode(q))
            elif isinstance(r, CommandComplete) and r.code != 0:
                log.info("console request %d answered with code %d: %s", r.seq, r.code, r.text)
        if result.problems:
            log.debug("console could not read a reply: %s", result.problems[0])
        return out

    def _wanted(self, now: float) -> list[ConsoleRequest]:
        """Requests for the keys silver still waits for (see ``receivers.schema_wants``).

        A wanted key this role never asked for is asked now; one it gave up on
        (``max_attempts`` used) is asked again once ``retry_s`` has passed since.
        A key answered since this role started but still wanted (silver has not
        seen the schema yet) is left alone: the answer is on its way through bronze.
        """
        if self.wants is None or now - self._wants_read_at < self.config.wants_poll_s:
            return []
        self._wants_read_at = now
        out: list[ConsoleRequest] = []
        for key in self.wants.pending():
            if key in self.known:
                continue
            asked = self.asked.get(key)
            if asked is not None and (
                asked.attempts < self.config.max_attempts or now - asked.at < self.config.retry_s
            ):
                continue  # still within its own retries
            self.asked.pop(key, None)
            log.info("silver waits for schema %s:%s(%s): asking", key.package, key.name,
                     key.hash.hex())  # fmt: skip
            out.extend(self._schema_request(key, now))
        return out

    def _refresh(self, now: float) -> list[ConsoleRequest]:
        """The refresh queries due now: a G per class to the command key while v1
        publications come, a v2 query per class to each v2 agent heard from."""
        cfg = self.config
        if cfg.refresh_s <= 0 or not cfg.refresh_classes:
            return []
        out: list[ConsoleRequest] = []
        v1_side = self.v1_heard
        if v1_side is not None and now - v1_side.at > cfg.forget_s:
            log.info("console: no QMF v1 publication for %g s: v1 refresh stops", cfg.forget_s)
            self.v1_heard = v1_side = None
        if v1_side is not None and now >= v1_side.due:
            v1_side.due = now + cfg.refresh_s
            out += [self._get_query(p, n) for p, n in cfg.refresh_classes]
        for name, heard in list(self.v2_agents.items()):
            if now - heard.at > cfg.forget_s:
                log.info("console: QMF v2 agent %s silent for %g s: no longer refreshed",
                         name, cfg.forget_s)  # fmt: skip
                del self.v2_agents[name]
            elif now >= heard.due:
                heard.due = now + cfg.refresh_s
                out += [self._query_v2(name, p, n) for p, n in cfg.refresh_classes]
        return out

    def due(self, now: float | None = None) -> list[ConsoleRequest]:
        """What the timer sends now: schema requests to repeat (no answer within
        ``retry_s``, bounded attempts), the keys silver still waits for, and the
        refresh queries whose time has come."""
        now = time.monotonic() if now is None else now
        out: list[ConsoleRequest] = self._wanted(now)
        for key, asked in self.asked.items():
            if (
                key not in self.known
                and asked.attempts < self.config.max_attempts
                and now - asked.at >= self.config.retry_s
            ):
                asked.at = now
                asked.attempts += 1
                rec = SchemaRequest(
                    dialect=self.config.dialect,
                    opcode="S",
                    seq=self._seq_next(),
                    package=key.package,
                    class_name=key.name,
                    schema_hash=key.hash,
                )
                out.append(self._encode(rec))
        out += self._refresh(now)
        return out
