"""The receiver's QMF v1 console role: ask for what makes content decodable.

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
QMF v2 data is self-describing by name and is not queried.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from dataclasses import dataclass, field

from pipeline.codec import v1
from pipeline.codec.message import decode_message
from pipeline.codec.records import (
    BrokerRequest,
    BrokerResponse,
    ClassIndication,
    ClassQuery,
    CommandComplete,
    PackageIndication,
    PackageQuery,
    Record,
    SchemaRequest,
    SchemaResponse,
)
from pipeline.codec.schema import SchemaKey
from pipeline.codec.seed import seeded_registry
from receivers.landing import LandedMessage
from receivers.schema_wants import SchemaWants

log = logging.getLogger("qmf.receiver.console")

CONTENT_OPCODES = frozenset(b"cige")
REPLY_OPCODES = frozenset(b"bpqsz")
V1_MAGIC = (b"AM1", b"AM2")

REPLY_SOURCES = {
    "rabbitmq": "/exchange/amq.direct/{key}",
    "qpidd": "amq.direct",  # with a topic-binding filter on the key
}
REPLY_TO = {"rabbitmq": "/exchange/amq.direct/{key}", "qpidd": "amq.direct/{key}"}
REQUEST_TARGETS = {"rabbitmq": "/exchange/{exchange}", "qpidd": "{exchange}"}


@dataclass(frozen=True)
class ConsoleConfig:
    """Console settings; ``dialect`` is what requests are encoded in (qpidd wants AM2)."""

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

    def __post_init__(self) -> None:
        if self.dialect not in ("AM1", "AM2"):
            raise ValueError(f"console dialect must be AM1 or AM2, not {self.dialect!r}")


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


class ConsoleRole:
    """Decides which requests to send; the receiver owns the link and sends them."""

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

    # --- requests ------------------------------------------------------------------------

    def _encode(self, record: Record) -> tuple[str, bytes]:
        self.sent[record.opcode] = self.sent.get(record.opcode, 0) + 1
        return self.config.command_key, v1.encode_record(record)

    def _seq_next(self) -> int:
        return next(self._seq)

    def on_connected(self) -> list[tuple[str, bytes]]:
        """A new connection (and reply queue): say hello, and forget what is unanswered."""
        self.packages_asked.clear()
        self.asked = {k: a for k, a in self.asked.items() if k in self.known}
        d = self.config.dialect
        return [self._encode(BrokerRequest(dialect=d, opcode="B", seq=self._seq_next()))]

    def _schema_request(self, key: SchemaKey, now: float) -> list[tuple[str, bytes]]:
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

    def observe(self, m: LandedMessage, now: float | None = None) -> list[tuple[str, bytes]]:
        """Look at one received message; return the requests it calls for."""
        body = m.body
        if len(body) < 8 or body[:3] not in V1_MAGIC:
            return []
        now = time.monotonic() if now is None else now
        op = body[3]
        if op in CONTENT_OPCODES:
            key = peek_class_key(body)
            return [] if key is None else self._schema_request(key, now)
        if op not in REPLY_OPCODES:
            return []
        result = decode_message(body, registry=self.registry, routing_key=m.routing_key)
        out: list[tuple[str, bytes]] = []
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

    def _wanted(self, now: float) -> list[tuple[str, bytes]]:
        """Requests for the keys silver still waits for (see ``receivers.schema_wants``).

        A wanted key this role never asked for is asked now; one it gave up on
        (``max_attempts`` used) is asked again once ``retry_s`` has passed since.
        A key answered since this role started but still wanted (silver has not
        seen the schema yet) is left alone: the answer is on its way through bronze.
        """
        if self.wants is None or now - self._wants_read_at < self.config.wants_poll_s:
            return []
        self._wants_read_at = now
        out: list[tuple[str, bytes]] = []
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

    def due(self, now: float | None = None) -> list[tuple[str, bytes]]:
        """Schema requests to repeat: no answer within ``retry_s`` (bounded attempts),
        and the keys silver still waits for."""
        now = time.monotonic() if now is None else now
        out: list[tuple[str, bytes]] = self._wanted(now)
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
        return out
