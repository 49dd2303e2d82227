"""Method calls: v1 'M' requests paired with their 'm' responses across micro-batches.

The decode (``pipeline.silver.decode``) emits each half as an untyped
``method_calls`` row; ``MethodCallTable`` pairs and types them on the driver
(docs/DESIGN.md, Method calls). Its state is the table's request-only rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import delta
from pipeline.codec.schema import SchemaRegistry
from schemas.silver import METHOD_CALLS

# This batch's object samples, or a function that reads them when needed.
Samples: TypeAlias = pa.Table | Callable[[], pa.Table]

def _call_order(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """Arrival order of a call half: received_at, then bronze identity and record index."""
    if row.get("request_partition") is not None and row.get("response_partition") is None:
        side = "request"
    else:
        side = "response"
    return tuple(row[f"{side}_{c}"] for c in ("at", "partition", "offset", "index"))


def _object_id(dialect: str, raw: bytes | None) -> Any:
    from pipeline.codec.types import Am1ObjectId, Am2ObjectId

    if raw is None:
        return None
    if dialect == "AM1":
        return Am1ObjectId.from_int(int.from_bytes(raw, "big"))
    return Am2ObjectId.from_ints(int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:], "big"))


def _am1_classes(samples: pa.Table, wanted: set[Any]) -> dict[Any, tuple[str, str, bytes]]:
    """(package, class, hash) of the wanted AM1 object ids among object samples (latest wins)."""
    from pipeline.codec.types import Am1ObjectId

    if samples.num_rows == 0 or not wanted:
        return {}
    nums = pa.array(sorted({o.object_num for o in wanted}), pa.int64())
    am1 = pc.equal(samples.column("dialect"), "AM1")
    t = samples.filter(pc.and_(am1, pc.is_in(samples.column("object_num"), nums)))
    t = t.sort_by([("batch_id", "ascending"), ("partition", "ascending"),
                   ("offset", "ascending"), ("record_index", "ascending")])  # fmt: skip
    out: dict[Any, tuple[str, str, bytes]] = {}
    cols = ("boot_seq", "bank", "object_num", "package", "class_name", "schema_hash")
    for b, k, n, pkg, cls, h in zip(*(t.column(c).to_pylist() for c in cols), strict=True):
        oid = Am1ObjectId(b, k, n)
        if oid in wanted:
            out[oid] = (pkg, cls, h)
    return out


class MethodCallTable:
    """Pairs v1 'M' requests with 'm' responses across micro-batches into ``method_calls``.

    Pending state: the latest unanswered request of each (dialect, seq), i.e. the
    table's request-only rows (an older request with the same number can no
    longer be answered). A response completes it (one upsert per batch on
    ``call_id``, with the app transaction); a response without a pending request
    gets a response-only row. Arguments are typed with the codec's
    ``MethodContext``: AM1 requests name only an object, whose class comes from
    its object samples (this batch's, else the latest in ``object_samples`` as of
    before the batch); a response is typed with its request's class and method.
    Every input is read as of before the batch, so a replay builds the same rows.
    """

    def __init__(self, path: str, samples_path: str) -> None:
        self.path = path
        self.samples_path = samples_path
        self._after: tuple[int, dict[tuple[str, int], dict[str, Any]]] | None = None

    def pending_before(self, app_id: str, batch_id: int) -> dict[tuple[str, int], dict[str, Any]]:
        if self._after is not None and self._after[0] == batch_id - 1:
            return dict(self._after[1])
        t = delta.read_before_batch(self.path, app_id, batch_id)
        waiting = [
            r
            for r in t.to_pylist()
            if r["request_partition"] is not None and r["response_partition"] is None
        ]
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for r in sorted(waiting, key=_call_order):
            out[(r["dialect"], r["seq"])] = r
        return out

    def _classes(
        self, wanted: set[Any], samples: Samples, app_id: str, batch_id: int
    ) -> dict[Any, tuple[str, str, bytes]]:
        """Class key of each wanted AM1 object id: this batch's samples, else the table's
        as of before the batch (read only when this batch's samples do not say)."""
        found = _am1_classes(samples if isinstance(samples, pa.Table) else samples(), wanted)
        missing = wanted - set(found)
        if missing:
            found |= _am1_classes(delta.read_before_batch(self.samples_path, app_id, batch_id), missing)
        return found

    def build(
        self,
        parts: pa.Table,
        samples: Samples,
        registry: SchemaRegistry,
        app_id: str,
        batch_id: int,
    ) -> pa.Table:
        """This batch's rows to upsert: new requests, completed calls, lone responses.

        ``samples``: this batch's object samples, or a function reading them (the
        task path reads them back only for an AM1 request)."""
        from pipeline.codec.layout import to_json
        from pipeline.codec.methods import MethodContext, PendingCall
        from pipeline.codec.records import MethodRequest, MethodResponse
        from pipeline.codec.schema import SchemaKey

        pending = self.pending_before(app_id, batch_id)
        rows = sorted(parts.to_pylist(), key=_call_order)
        if not rows:
            self._after = (batch_id, pending)
            return METHOD_CALLS.empty_table()
        ctx = MethodContext()
        wanted = {
            _object_id("AM1", r["object_id_raw"])
            for r in rows
            if r["dialect"] == "AM1" and r["request_partition"] is not None
        }
        if wanted:
            ctx.objects.update(self._classes(wanted, samples, app_id, batch_id))
        out: dict[str, dict[str, Any]] = {}
        for part in rows:
            d, seq = part["dialect"], part["seq"]
            if part["request_partition"] is not None:
                req = MethodRequest(
                    dialect=d, opcode="M", seq=seq,
                    object_id=_object_id(d, part["object_id_raw"]),
                    method_name=part["method_name"], package=part["package"],
                    class_name=part["class_name"], schema_hash=part["schema_hash"],
                    raw_arguments=part["raw_in"] or b"",
                )  # fmt: skip
                typed, _err = ctx.type_record(req, registry)
                assert isinstance(typed, MethodRequest)
                if typed.arguments is not None:
                    part |= {
                        "package": typed.package, "class_name": typed.class_name,
                        "schema_hash": typed.schema_hash,
                        "arguments_in": to_json(typed.arguments),
                    }  # fmt: skip
                pending[(d, seq)] = part
                out[part["call_id"]] = part
                continue
            call = pending.pop((d, seq), None)
            if call is None:
                out[part["call_id"]] = part  # no request seen: a response-only row
                continue
            call = dict(call)
            for c in ("response_partition", "response_offset", "response_index", "response_at",
                      "agent", "status", "text", "raw_out"):  # fmt: skip
                call[c] = part[c]
            call["batch_id"] = batch_id
            if call["package"] is not None and call["schema_hash"] is not None:
                key = SchemaKey(call["package"], call["class_name"], call["schema_hash"])
                ctx.pending[(d, seq)] = PendingCall(
                    d, seq, _object_id(d, call["object_id_raw"]), key, call["method_name"]
                )
                resp = MethodResponse(
                    dialect=d, opcode="m", seq=seq, status=part["status"],
                    text=part["text"] or "", raw_arguments=part["raw_out"] or b"",
                )  # fmt: skip
                typed_r, _err = ctx.type_record(resp, registry)
                assert isinstance(typed_r, MethodResponse)
                if typed_r.arguments is not None:
                    call["arguments_out"] = to_json(typed_r.arguments)
                del ctx.pending[(d, seq)]
            out[call["call_id"]] = call
        self._after = (batch_id, pending)
        return pa.Table.from_pylist(list(out.values()), schema=METHOD_CALLS)


