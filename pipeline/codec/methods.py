"""Typing v1 method arguments with context: the class of each object, the pending requests.

A v1 'M' names an object and a method; AM1's carries no class key, so its
input arguments can only be typed by someone who saw the object's class
('c'/'i'/'g' records). A v1 'm' names nothing but the sequence number of its
request, so its output arguments can only be typed with that request.
``MethodContext`` holds exactly that context and nothing else; it is pure
(no I/O) and works the same inside the decoder and over a batch of records
decoded earlier:

- ``decode_message(..., methods=ctx)`` / ``decode_v1(..., methods=ctx)`` type the
  arguments while decoding (a typed record then ends where its arguments end,
  so records after it in the same message decode too);
- ``type_method_arguments(records, registry, ctx)`` types records that were
  decoded without context (their ``raw_arguments`` must hold exactly the
  arguments);
- ``method_calls(records, registry, ctx)`` pairs requests with their responses
  (one ``MethodCall`` per response, and one per request left unanswered).

Raw argument bytes always stay in ``raw_arguments`` (the audit copy).
Pending requests are keyed by (dialect, sequence number): the latest request
with a number wins, and a response does not remove it (a re-sent response is
typed again). AM1 object ids are unique per management broker only, so a
context should see one broker's traffic.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from pipeline.codec.errors import ArgumentMismatch, CodecError, Problem
from pipeline.codec.records import MethodRequest, MethodResponse, ObjectSample, Record
from pipeline.codec.schema import SchemaKey, SchemaRegistry
from pipeline.codec.types import ObjectId

__all__ = [
    "MethodCall",
    "MethodContext",
    "PendingCall",
    "method_calls",
    "type_method_arguments",
]


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A request whose response may still come: what typing the response needs."""

    dialect: str
    seq: int
    object_id: ObjectId
    schema_key: SchemaKey
    method_name: str


class MethodContext:
    """Objects seen so far (id -> class key) and pending requests ((dialect, seq) -> call).

    Feed it every record in order with ``observe`` (the decoder does so when
    given the context). Both maps are bounded: the oldest entries go first.
    """

    def __init__(self, *, max_objects: int = 1_000_000, max_pending: int = 65_536) -> None:
        self.objects: dict[ObjectId, tuple[str, str, bytes]] = {}
        self.pending: dict[tuple[str, int], PendingCall] = {}
        self.max_objects = max_objects
        self.max_pending = max_pending

    # ---------------------------------------------------------------- context

    def observe(self, rec: Record) -> None:
        """Learn from one record: an object's class, or a request now pending."""
        t = type(rec)
        if t is ObjectSample:
            assert isinstance(rec, ObjectSample)
            if rec.dialect != "V2" and rec.object_id is not None:
                objs = self.objects
                if rec.object_id not in objs and len(objs) >= self.max_objects:
                    del objs[next(iter(objs))]
                objs[rec.object_id] = (rec.package, rec.class_name, rec.schema_hash)
        elif t is MethodRequest:
            assert isinstance(rec, MethodRequest)
            key = self._class_key(rec)
            if key is not None:
                pend = self.pending
                k = (rec.dialect, rec.seq)
                pend.pop(k, None)
                if len(pend) >= self.max_pending:
                    del pend[next(iter(pend))]
                pend[k] = PendingCall(rec.dialect, rec.seq, rec.object_id, key, rec.method_name)

    def class_of(self, object_id: ObjectId) -> SchemaKey | None:
        """The class key of an object seen in a 'c'/'i'/'g' record, if any."""
        hit = self.objects.get(object_id)
        return SchemaKey(*hit) if hit is not None else None

    def request_for(self, response: MethodResponse) -> PendingCall | None:
        """The pending request a v1 response answers (same dialect and sequence number)."""
        return self.pending.get((response.dialect, response.seq))

    def _class_key(self, req: MethodRequest) -> SchemaKey | None:
        if req.package is not None and req.class_name is not None and req.schema_hash is not None:
            return SchemaKey(req.package, req.class_name, req.schema_hash)
        return self.class_of(req.object_id)

    def target_of(self, rec: Record) -> tuple[SchemaKey, str] | None:
        """(class key, method name) whose arguments ``rec`` carries, if the context knows it.

        A response with a non-zero status has no output arguments: None.
        """
        if type(rec) is MethodRequest:
            assert isinstance(rec, MethodRequest)
            key = self._class_key(rec)
            return (key, rec.method_name) if key is not None else None
        if type(rec) is MethodResponse:
            assert isinstance(rec, MethodResponse)
            if rec.status != 0 or rec.dialect == "V2":
                return None
            call = self.request_for(rec)
            return (call.schema_key, call.method_name) if call is not None else None
        return None

    def typed(
        self,
        rec: MethodRequest | MethodResponse,
        arguments: dict[str, Any],
        raw: bytes,
    ) -> Record:
        """``rec`` with typed ``arguments``, its exact ``raw`` bytes and the call it belongs to."""
        target = self.target_of(rec)
        assert target is not None
        key, method = target
        common: dict[str, Any] = {
            "arguments": arguments,
            "raw_arguments": raw,
            "package": key.package,
            "class_name": key.name,
            "schema_hash": key.hash,
        }
        if type(rec) is MethodResponse:
            assert isinstance(rec, MethodResponse)
            call = self.request_for(rec)
            assert call is not None
            return replace(rec, object_id=call.object_id, method_name=method, **common)
        return replace(rec, **common)

    # ------------------------------------------------------------ after decoding

    def type_record(
        self, rec: Record, registry: SchemaRegistry
    ) -> tuple[Record, CodecError | None]:
        """Type one record decoded without context (its raw tail must be exactly the arguments).

        Returns the record (typed, or unchanged) and the mismatch, if the
        arguments do not fit the method the context names. Does not observe.
        """
        from pipeline.codec.v1 import has_method, method_arguments

        if type(rec) not in (MethodRequest, MethodResponse):
            return rec, None
        assert isinstance(rec, MethodRequest | MethodResponse)
        if rec.arguments is not None:
            return rec, None
        target = self.target_of(rec)
        if target is None:
            return rec, None
        key, method = target
        schema = registry.get(key)
        if schema is None or not has_method(schema, method):
            return rec, None  # an unknown method is data: raw arguments kept, untyped
        raw = rec.raw_arguments
        direction = "I" if type(rec) is MethodRequest else "O"
        try:
            args, end = method_arguments(rec.dialect, schema, method, direction, registry, raw, 0)
        except CodecError as exc:
            return rec, ArgumentMismatch(exc.offset, f"{method} of {key}: {exc.reason}")
        if end != len(raw):
            return rec, ArgumentMismatch(
                end, f"{method} of {key}: {len(raw) - end} bytes left after them"
            )
        return self.typed(rec, args, raw), None


def type_method_arguments(
    records: Iterable[Record], registry: SchemaRegistry, context: MethodContext | None = None
) -> tuple[list[Record], list[Problem]]:
    """Type the 'M'/'m' arguments of records decoded without context, in order.

    Every record is observed (objects, requests) after it is typed, so a batch
    holding the objects' samples, the requests and the responses in order is
    typed in one pass; pass a ``context`` to carry knowledge across batches.
    Problems are non-fatal ``ArgumentMismatch`` es, ``record`` = index in the list.
    """
    ctx = context if context is not None else MethodContext()
    out: list[Record] = []
    problems: list[Problem] = []
    for rec in records:
        typed, err = ctx.type_record(rec, registry)
        if err is not None:
            problems.append(Problem.from_error(err, rec.opcode, record=len(out)))
        ctx.observe(typed)
        out.append(typed)
    return out, problems


@dataclass(frozen=True, slots=True)
class MethodCall:
    """One v1 method call: the request and its response joined by (dialect, seq).

    ``arguments_in`` are the request's typed input (and bidirectional) arguments,
    ``arguments_out`` the response's output (and bidirectional) ones; None when
    they could not be typed (then only the raw bytes are known), or when that
    half of the call was not seen. ``request``/``response`` are the indexes of
    the two records in the batch (None: not in the batch).
    """

    dialect: str
    seq: int
    object_id: ObjectId | None
    package: str | None
    class_name: str | None
    schema_hash: bytes | None
    method_name: str | None
    status: int | None
    text: str | bytes | None
    arguments_in: dict[str, Any] | None
    arguments_out: dict[str, Any] | None
    raw_in: bytes | None
    raw_out: bytes | None
    request: int | None
    response: int | None


def method_calls(
    records: Iterable[Record], registry: SchemaRegistry, context: MethodContext | None = None
) -> list[MethodCall]:
    """Pair every v1 'm' with the latest earlier 'M' of the same (dialect, seq), typing both.

    Requests never answered in the batch come last, in request order. V2 method
    calls are left out: their arguments are typed maps already, and v2 pairs a
    response with its request by the AMQP correlation id, not by the codec.
    """
    recs, _ = type_method_arguments(records, registry, context)
    open_requests: dict[tuple[str, int], int] = {}
    answered: set[int] = set()
    calls: list[MethodCall] = []
    for i, r in enumerate(recs):
        if r.dialect == "V2":
            continue
        if isinstance(r, MethodRequest):
            open_requests[(r.dialect, r.seq)] = i
        elif isinstance(r, MethodResponse):
            j = open_requests.get((r.dialect, r.seq))
            req = recs[j] if j is not None else None
            assert req is None or isinstance(req, MethodRequest)
            if j is not None:
                answered.add(j)
            calls.append(_call(r.dialect, r.seq, req, j, r, i))
    for j in sorted(set(open_requests.values()) - answered):
        req = recs[j]
        assert isinstance(req, MethodRequest)
        calls.append(_call(req.dialect, req.seq, req, j, None, None))
    return calls


def _call(
    dialect: str,
    seq: int,
    req: MethodRequest | None,
    req_at: int | None,
    resp: MethodResponse | None,
    resp_at: int | None,
) -> MethodCall:
    src: MethodRequest | MethodResponse | None = req if req is not None else resp
    return MethodCall(
        dialect=dialect,
        seq=seq,
        object_id=src.object_id if src is not None else None,
        package=src.package if src is not None else None,
        class_name=src.class_name if src is not None else None,
        schema_hash=src.schema_hash if src is not None else None,
        method_name=src.method_name if src is not None else None,
        status=resp.status if resp is not None else None,
        text=resp.text if resp is not None else None,
        arguments_in=req.arguments if req is not None else None,
        arguments_out=resp.arguments if resp is not None else None,
        raw_in=req.raw_arguments if req is not None else None,
        raw_out=resp.raw_arguments if resp is not None else None,
        request=req_at,
        response=resp_at,
    )
