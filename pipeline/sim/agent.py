"""One simulated QMF agent: identity, object ids per dialect, and the records it publishes.

The agent turns its ``SimBroker`` state into codec records (``ObjectSample``,
``Event``, ``Heartbeat``, ``SchemaResponse`` ...) with the identity each
dialect uses: AM1 a 64-bit id (boot sequence, bank, object) and keys
``mgmt.<uuid>.*``; AM2 a 128-bit id (flags, epoch, broker bank, agent bank,
object) and keys ``console.obj.1.0.*`` like qpidd; V2 object names
(``<package>:<class>:<index values>``) with the agent epoch and keys
``agent.ind.*`` on ``qmf.default.topic``. Console requests are answered here
too (``handle``), so replies come from the same state the manifest records.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.codec import v1
from pipeline.codec.errors import CodecError
from pipeline.codec.records import (
    BrokerRequest,
    BrokerResponse,
    ClassIndication,
    ClassQuery,
    CommandComplete,
    ConsoleAdded,
    Event,
    GetQuery,
    Heartbeat,
    MethodRequest,
    MethodResponse,
    ObjectSample,
    PackageIndication,
    PackageQuery,
    QmfException,
    Record,
    SchemaRequest,
    SchemaResponse,
    V2Message,
)
from pipeline.codec.schema import KIND_EVENT, KIND_TABLE, ClassSchema, Element, v2_name
from pipeline.codec.types import Am1ObjectId, Am2ObjectId, ObjectId, V2ObjectId
from pipeline.qmfxml import ManagementSchema, XmlClass
from pipeline.sim.model import PKG, EventSpec, LoadConfig, SimBroker, SimObject, SimRef

DIALECTS = ("am1", "am2", "v2")
CODEC_DIALECT = {"am1": "AM1", "am2": "AM2", "v2": "V2"}

# AM1 routing-key severity words (critical | error | warning | info).
AM1_SEVERITY = {0: "critical", 1: "critical", 2: "critical", 3: "error", 4: "warning"}
# qpid's v2 severity names, as in agent.ind.event.<pkg>.<event>.<severity>.*
V2_SEVERITY = ("emerg", "alert", "crit", "error", "warn", "notice", "info", "debug")

V2_LOCATE_KEY = "console.request.agent_locate"

STATUS_OK = 0
STATUS_UNKNOWN_OBJECT = 1
STATUS_UNKNOWN_METHOD = 2
STATUS_NOT_IMPLEMENTED = 3
STATUS_PARAMETER_INVALID = 4  # qpid's ManagementAgent codes beyond the M3 spec
STATUS_EXCEPTION = 7
STATUS_TEXT = {
    STATUS_OK: "OK",
    STATUS_UNKNOWN_OBJECT: "UnknownObject",
    STATUS_UNKNOWN_METHOD: "UnknownMethod",
    STATUS_NOT_IMPLEMENTED: "NotImplemented",
    STATUS_PARAMETER_INVALID: "InvalidParameter",
    STATUS_EXCEPTION: "Exception",
}


@dataclass(frozen=True)
class Published:
    """A record with the routing key it is published under (exchange None = the dialect's)."""

    record: Record
    routing_key: str
    exchange: str | None = None


class SimAgent:
    """A qpidd-like management agent over a ``SimBroker``."""

    def __init__(
        self,
        index: int,
        dialect: str,
        schema: ManagementSchema,
        load: LoadConfig,
        seed: int,
        boot_seq: int = 1,
        first_bank: int = 1,
        broker_key: bool = True,
        epoch_refs: bool = False,
    ) -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"unknown dialect {dialect!r} (use {', '.join(DIALECTS)})")
        self.index = index
        self.dialect = dialect
        self.codec_dialect = CODEC_DIALECT[dialect]
        self.schema = schema
        self.rng = random.Random(f"{seed}:{index}")
        self.uuid = uuid.UUID(int=self.rng.getrandbits(128), version=4)
        self.broker_bank = 1
        self.agent_bank = first_bank + index
        self.broker_key = broker_key and index == 0
        self.boot_seq = boot_seq
        self.model = SimBroker(schema, self.rng, load)
        self.force_all = True  # publish everything at the next interval (boot, B, 'x')
        self.booted = False  # boot events (clientConnect) published
        self.send_schema = True
        # v2 references carry the agent epoch too (qpidd's AMQP 1.0 module sends them so)
        self.epoch_refs = epoch_refs

    # ------------------------------------------------------------------ identity

    @property
    def agent_key(self) -> str:
        """The ``<agent>`` of AM1 keys; codec ``agent`` field of AM1 records."""
        return str(self.uuid)

    @property
    def v2_name(self) -> str:
        return f"apache.org:qpidd:{self.uuid}"

    @property
    def record_agent(self) -> str:
        """What a decoder reports as ``agent`` for this agent's records."""
        if self.dialect == "am1":
            return self.agent_key
        if self.dialect == "am2":
            return f"{self.broker_bank}.{self.agent_bank}"
        return self.v2_name

    @property
    def command_keys(self) -> list[str]:
        """The keys whose requests this agent answers (only the first agent answers ``broker``)."""
        keys = [f"agent.{self.agent_bank}"]
        if self.broker_key:
            keys.insert(0, "broker")
        return keys

    @property
    def command_addresses(self) -> list[tuple[str, str]]:
        """(AMQP 1.0 source address, key) pairs this agent listens on for console requests.

        v1: ``qpid.management`` with the command keys. v2: ``qmf.default.direct`` with
        the agent name (and ``broker`` for agent 0), plus agent-locate on the topic.
        """
        if self.dialect != "v2":
            return [(f"/exchange/qpid.management/{k}", k) for k in self.command_keys]
        keys = [self.v2_name] + (["broker"] if self.broker_key else [])
        return [(f"/exchange/qmf.default.direct/{k}", k) for k in keys] + [
            (f"/exchange/qmf.default.topic/{V2_LOCATE_KEY}", V2_LOCATE_KEY)
        ]

    def answers(self, key: str) -> bool:
        return any(k == key for _, k in self.command_addresses)

    def oid(self, num: int) -> ObjectId:
        """The object's id; qpidd's start-up (persistent) objects carry epoch 0, not the boot's."""
        obj = self.model.objects.get(num)
        epoch = 0 if obj is not None and obj.persistent else self.boot_seq
        if self.dialect == "am1":
            return Am1ObjectId(epoch & 0x7FFF, self.agent_bank, num)
        if self.dialect == "am2":
            return Am2ObjectId(0, epoch & 0xFFF, self.broker_bank, self.agent_bank, num)
        name = self.object_name(obj) if obj is not None else str(num)
        # qpidd leaves _agent_epoch out of a persistent object's id (its epoch is 0)
        return V2ObjectId(object_name=name, agent_name=self.v2_name, epoch=epoch or None)

    def object_name(self, obj: SimObject) -> str:
        """qpidd's v2 object name: ``<package>:<class>:<index values joined by ','>``."""
        if obj.object_name is not None:
            return obj.object_name
        parts: list[str] = []
        for p in obj.cls.index_properties:
            v = obj.props.get(p.name)
            if isinstance(v, SimRef):
                target = self.model.objects.get(v.object_num)
                parts.append(self.object_name(target) if target is not None else str(v.object_num))
            else:
                parts.append(str(v))
        obj.object_name = f"{obj.cls.package}:{obj.cls.name}:{','.join(parts)}"
        return obj.object_name

    def find_object(self, oid: ObjectId) -> SimObject | None:
        if isinstance(oid, V2ObjectId):
            for o in self.model.objects.values():
                if self.object_name(o) == oid.object_name:
                    return o
            return None
        obj = self.model.objects.get(oid.object_num)
        return obj if obj is not None and self.oid(obj.object_num) == oid else None

    # ------------------------------------------------------------------ values

    def wire_value(self, v: Any) -> Any:
        if isinstance(v, SimRef):
            if self.dialect == "v2":  # qpidd: a reference is a map holding the object name
                obj = self.model.objects.get(v.object_num)
                name = self.object_name(obj) if obj is not None else str(v.object_num)
                if self.epoch_refs and not (obj is not None and obj.persistent):
                    return {"_agent_epoch": self.boot_seq, "_object_name": name}
                return {"_object_name": name}
            return self.oid(v.object_num)
        return v

    def values(self, obj: SimObject, which: str) -> dict[str, Any]:
        """Element values of a 'c' (properties), 'i' (statistics) or 'g' (both) record."""
        out: dict[str, Any] = {}
        if which in ("c", "g"):
            for p in obj.cls.schema.properties:
                if p.name in obj.props:  # absent optional properties: presence bit clear
                    out[p.name] = self.wire_value(obj.props[p.name])
        if which in ("i", "g"):
            stats = obj.cls.schema.statistics
            names = {s.name for s in stats}
            for s in stats:  # v2 maps name min/max/average statistics as qpidd does
                key = v2_name(s.name, names) if self.dialect == "v2" else s.name
                out[key] = obj.stats[s.name]
        return out

    # ------------------------------------------------------------------ records

    def sample(self, obj: SimObject, which: str, update_ns: int, seq: int = 0) -> ObjectSample:
        key = obj.cls.key
        return ObjectSample(
            dialect=self.codec_dialect,
            opcode=which if self.dialect != "v2" else "_data_indication",
            seq=seq,
            package=key.package,
            class_name=key.name,
            schema_hash=key.hash,
            update_ns=update_ns,
            create_ns=obj.create_ns,
            delete_ns=obj.delete_ns,
            object_id=self.oid(obj.object_num),
            values=self.values(obj, which),
            agent=self.record_agent,
        )

    @staticmethod
    def update_time(obj: SimObject, now_ns: int) -> int:
        """The update time an object's record carries when encoded at ``now_ns``.

        qpidd's ``setUpdateTime``: it moves to now only when the object changed since
        it was last encoded (publication or query); an unchanged object (a forced
        republication) keeps the old one, and so does a deleted object's last record
        (qpidd encodes it without touching the time: a stale update time). A deleted
        object never encoded before (a transient queue) carries ``now_ns``.
        """
        if not obj.update_ns or (not obj.deleted and (obj.prop_dirty or obj.stat_dirty)):
            obj.update_ns = now_ns
        return obj.update_ns

    def query_sample(self, obj: SimObject, now_ns: int, seq: int = 0) -> ObjectSample:
        """A console's get/query of one object, as qpidd answers it.

        Encoding the object for the reply (qpid's generated ``writeProperties``,
        ``writeStatistics``, ``mapEncodeValues``) clears its changed flags
        (``configChanged``, ``instChanged``) and resets its hi-lo watermarks, so the
        next periodic publication skips it unless it changes again after the query.
        """
        rec = self.sample(obj, "g", self.update_time(obj, now_ns), seq)
        obj.prop_dirty = obj.stat_dirty = False
        self.model.reset_watermarks(obj)
        return rec

    def obj_key(self, cls: XmlClass, kind: str) -> str:
        pkg, name = cls.package, cls.name
        if self.dialect == "am1":
            return f"mgmt.{self.agent_key}.{kind}.{pkg}.{name}"
        if self.dialect == "am2":
            return f"console.obj.1.0.{pkg}.{name}"
        return f"agent.ind.data.{pkg.replace('.', '_')}.{name}.apache_org.qpidd.{self.uuid}"

    def event_key(self, cls: XmlClass) -> str:
        sev = cls.severity if cls.severity is not None else 6
        pkg, name = cls.package, cls.name
        if self.dialect == "am1":
            return f"mgmt.{self.agent_key}.event.{pkg}.{name}.{AM1_SEVERITY.get(sev, 'info')}"
        if self.dialect == "am2":
            return f"console.event.1.0.{pkg}.{name}"
        return (
            f"agent.ind.event.{pkg.replace('.', '_')}.{name}."
            f"{V2_SEVERITY[sev].replace('inform', 'info')}.apache_org.qpidd.{self.uuid}"
        )

    @property
    def heartbeat_key(self) -> str:
        if self.dialect == "am1":
            return f"mgmt.{self.agent_key}.heartbeat"
        if self.dialect == "am2":
            return "console.heartbeat.1.0"
        return f"agent.ind.heartbeat.apache_org.qpidd.{self.uuid}"

    def heartbeat(self, now_ns: int, interval_s: int) -> Published:
        attrs: dict[str, Any] | None = None
        if self.dialect == "v2":
            attrs = {
                "_epoch": self.boot_seq,
                "_heartbeat_interval": interval_s,
                "_instance": str(self.uuid),
                "_name": self.v2_name,
                "_product": "qpidd",
                "_timestamp": now_ns,
                "_vendor": "apache.org",
            }
        opcode = "h" if self.dialect != "v2" else "_agent_heartbeat_indication"
        hb = Heartbeat(
            dialect=self.codec_dialect,
            opcode=opcode,
            timestamp_ns=now_ns,
            agent=None if self.dialect == "am2" else self.record_agent,  # AM2 'h' names no agent
            attributes=attrs,
        )
        return Published(hb, self.heartbeat_key)

    def event(self, spec: EventSpec) -> Published:
        cls = spec.cls
        ev = Event(
            dialect=self.codec_dialect,
            opcode="e" if self.dialect != "v2" else "_data_indication",
            package=cls.package,
            event_name=cls.name,
            schema_hash=cls.key.hash,
            timestamp_ns=spec.timestamp_ns,
            severity=cls.severity if cls.severity is not None else 6,
            arguments=dict(spec.arguments),
            agent=None if self.dialect == "am2" else self.record_agent,  # AM2 'e' names no agent
        )
        return Published(ev, self.event_key(cls))

    def schema_records(self, seq: int = 0) -> Iterator[Published]:
        """The schema broadcast: AM1 's' per class and event class, AM2 'p' and 'q'; V2 none."""
        if self.dialect == "am1":
            # every class, events included: AM1's 's' has no class kind, so an event
            # class travels as one event record named like it (v1.schema_response_for)
            for c in self.schema:
                yield Published(
                    self.schema_response(c.schema, seq),
                    f"mgmt.{self.agent_key}.schema.{c.package}.{c.name}",
                )
        elif self.dialect == "am2":
            for p in self.schema.packages:
                yield Published(
                    PackageIndication(dialect="AM2", opcode="p", seq=seq, package=p),
                    "schema.package",
                )
            for c in self.schema:
                yield Published(self.class_indication(c, seq), "schema.class")

    def schema_response(self, schema: ClassSchema, seq: int) -> SchemaResponse:
        return v1.schema_response_for(schema, self.codec_dialect, seq)

    def class_indication(self, c: XmlClass, seq: int) -> ClassIndication:
        kind = None if self.dialect == "am1" else c.schema.kind
        return ClassIndication(
            dialect=self.codec_dialect,
            opcode="q",
            seq=seq,
            class_kind=kind,
            package=c.package,
            class_name=c.name,
            schema_hash=c.key.hash,
        )

    # ------------------------------------------------------------------ requests

    def complete(self, seq: int, code: int = 0, text: str = "OK") -> CommandComplete:
        return CommandComplete(
            dialect=self.codec_dialect, opcode="z", seq=seq, code=code, text=text
        )

    def handle(self, req: Record, now_ns: int) -> list[Record]:
        """Answer one v1 console request; the replies, in order, all with the request's seq."""
        seq = req.seq
        d = self.codec_dialect
        if isinstance(req, BrokerRequest):
            self.force_all = True  # a console arrived: everything is published again
            self.send_schema = True
            return [BrokerResponse(dialect=d, opcode="b", seq=seq, broker_id=self.uuid)]
        if isinstance(req, ConsoleAdded):
            self.force_all = True
            self.send_schema = True
            return []
        if isinstance(req, PackageQuery):
            out: list[Record] = [
                PackageIndication(dialect=d, opcode="p", seq=seq, package=p)
                for p in self.schema.packages
            ]
            return [*out, self.complete(seq)]
        if isinstance(req, ClassQuery):
            out = [self.class_indication(c, seq) for c in self.schema if c.package == req.package]
            return [*out, self.complete(seq)]
        if isinstance(req, SchemaRequest):
            for c in self.schema:
                if (c.package, c.name, c.key.hash) == (
                    req.package,
                    req.class_name,
                    req.schema_hash,
                ):
                    return [self.schema_response(c.schema, seq)]
            return [self.complete(seq, 1, "Unknown class")]
        if isinstance(req, GetQuery):
            return [
                *(self.query_sample(o, now_ns, seq) for o in self.get_matches(req.query)),
                self.complete(seq),
            ]
        if isinstance(req, MethodRequest):
            return [self.method(req)]
        return [self.complete(seq, 3, f"Not implemented: {type(req).__name__}")]

    def get_matches(self, query: dict[str, Any]) -> list[SimObject]:
        """Objects a get query selects: ``_objectid`` (text or id), else ``_class``/``_package``."""
        objs = [o for o in self.model.objects.values() if not o.deleted]
        oid = query.get("_objectid")
        if oid is not None:
            text = oid.decode() if isinstance(oid, bytes) else str(oid)
            return [o for o in objs if str(self.oid(o.object_num)) == text]
        cls = query.get("_class")
        pkg = query.get("_package")
        if isinstance(cls, bytes):
            cls = cls.decode()
        if isinstance(pkg, bytes):
            pkg = pkg.decode()
        return [
            o
            for o in objs
            if (cls is None or o.cls.name == cls) and (pkg is None or o.cls.package == pkg)
        ]

    def method(self, req: MethodRequest) -> MethodResponse:
        d = self.codec_dialect
        obj = self.find_object(req.object_id)
        if obj is None:
            return self._mresp(req.seq, STATUS_UNKNOWN_OBJECT, f"UnknownObject: {req.object_id}")
        meth = next((m for m in obj.cls.schema.methods if m.name == req.method_name), None)
        if meth is None:
            return self._mresp(req.seq, STATUS_UNKNOWN_METHOD, f"UnknownMethod: {req.method_name}")
        try:
            args = (
                req.arguments
                if req.arguments is not None
                else self.decode_args(meth.arguments, req.raw_arguments)
            )
        except CodecError as exc:
            return self._mresp(req.seq, STATUS_PARAMETER_INVALID, f"InvalidParameter: {exc}")
        outs = self.call(obj, meth.name, args)
        if isinstance(outs, int):
            return self._mresp(req.seq, outs, f"{STATUS_TEXT[outs]}: {meth.name}")
        out_elems = [a for a in meth.arguments if a.extra.get("dir") in ("O", "IO")]
        from pipeline.sim.wire import encode_arguments

        raw = encode_arguments(self.codec_dialect, out_elems, outs)
        return MethodResponse(
            dialect=d,
            opcode="m",
            seq=req.seq,
            status=STATUS_OK,
            text="OK",
            arguments=outs,
            raw_arguments=raw,
        )

    def call(self, obj: SimObject, method: str, args: dict[str, Any]) -> dict[str, Any] | int:
        """Run a method: its output arguments, or an error status."""
        if not any(m.name == method for m in obj.cls.schema.methods):
            return STATUS_UNKNOWN_METHOD
        if obj.cls.name == "broker" and method == "echo":
            return {"sequence": args.get("sequence", 0), "body": args.get("body", "")}
        if obj.cls.name == "queue" and method == "purge":
            self.model.purge(obj, int(args.get("request", 0) or 0))
            return {}
        if obj.cls.name == "broker" and method == "getLogLevel":
            return {"level": "notice+"}
        return STATUS_NOT_IMPLEMENTED

    def _mresp(self, seq: int, status: int, text: str) -> MethodResponse:
        if self.dialect == "am1":
            # AM1's status text is a str8 (spec figure "Method Response"): at most 255 bytes
            text = text.encode("utf-8")[:255].decode("utf-8", "ignore")
        return MethodResponse(
            dialect=self.codec_dialect, opcode="m", seq=seq, status=status, text=text
        )

    def decode_args(self, elems: tuple[Element, ...], raw: bytes) -> dict[str, Any]:
        from pipeline.sim.wire import decode_arguments

        ins = [a for a in elems if a.extra.get("dir") in ("I", "IO")]
        return decode_arguments(self.codec_dialect, ins, raw)


# ---------------------------------------------------------------------- QMF v2 requests


def _text(v: Any) -> str | None:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v if isinstance(v, str) else None


class V2Requests:
    """A v2 agent's answers: agent locate, object/schema-id queries and method calls."""

    def __init__(self, agent: SimAgent) -> None:
        self.agent = agent

    def _exception(self, code: int, text: str) -> QmfException:
        return QmfException(
            dialect="V2",
            opcode="_exception",
            code=code,
            text=text,
            values={},
            agent=self.agent.v2_name,
        )

    def handle(self, req: Record, now_ns: int) -> list[Record]:
        """The replies to one v2 request (nothing for what is not a request)."""
        a = self.agent
        if not isinstance(req, V2Message):
            return []
        body = req.body if isinstance(req.body, dict) else {}
        if req.opcode == "_agent_locate_request":
            values = {
                "_epoch": a.boot_seq,
                "_heartbeat_interval": 1,
                "_instance": str(a.uuid),
                "_name": a.v2_name,
                "_product": "qpidd",
                "_timestamp": now_ns,
                "_vendor": "apache.org",
            }
            return [
                V2Message(
                    dialect="V2",
                    opcode="_agent_locate_response",
                    content=None,
                    body={"_values": values},
                    agent=a.v2_name,
                )
            ]
        if req.opcode == "_query_request":
            what = _text(body.get("_what"))
            if what == "OBJECT":
                return self._objects(body, now_ns)
            if what == "SCHEMA_ID":
                return [
                    ClassIndication(
                        dialect="V2",
                        opcode="_query_response",
                        class_kind=c.schema.kind,
                        package=c.package,
                        class_name=c.name,
                        schema_hash=c.key.hash,
                    )
                    for c in a.schema
                ]
            return [self._exception(1, f"Query for _what => '{what}' not supported")]
        if req.opcode == "_method_request":
            return [self._method(body)]
        return []

    def _objects(self, body: dict[str, Any], now_ns: int) -> list[Record]:
        a = self.agent
        objs = [o for o in a.model.objects.values() if not o.deleted]
        oid = body.get("_object_id")
        sid = body.get("_schema_id")
        if isinstance(oid, dict):
            name = _text(oid.get("_object_name"))
            objs = [o for o in objs if a.object_name(o) == name]
        elif isinstance(sid, dict):
            cls = _text(sid.get("_class_name"))
            pkg = _text(sid.get("_package_name"))
            objs = [o for o in objs if o.cls.name == cls and pkg in (None, o.cls.package)]
        out: list[Record] = []
        for o in objs:
            rec = a.query_sample(o, now_ns)
            rec.opcode = "_query_response"
            out.append(rec)
        return out

    def _method(self, body: dict[str, Any]) -> Record:
        a = self.agent
        oid = body.get("_object_id")
        name = _text(oid.get("_object_name")) if isinstance(oid, dict) else None
        obj = next((o for o in a.model.objects.values() if a.object_name(o) == name), None)
        method = _text(body.get("_method_name")) or ""
        if obj is None:
            return self._exception(STATUS_UNKNOWN_OBJECT, f"UnknownObject: {name}")
        raw_args = body.get("_arguments")
        args = {
            k: _text(v) if isinstance(v, bytes) else v
            for k, v in (raw_args.items() if isinstance(raw_args, dict) else [])
        }
        outs = a.call(obj, method, args)
        if isinstance(outs, int):
            return self._exception(outs, f"{STATUS_TEXT[outs]}: {method}")
        return MethodResponse(dialect="V2", opcode="_method_response", status=0, arguments=outs)


def table_classes(schema: ManagementSchema) -> list[XmlClass]:
    return [c for c in schema if c.schema.kind == KIND_TABLE]


def event_classes(schema: ManagementSchema) -> list[XmlClass]:
    return [c for c in schema if c.schema.kind == KIND_EVENT]


__all__ = ["PKG", "Published", "SimAgent"]
