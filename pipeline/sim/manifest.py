"""The ground-truth manifest: one JSON line per thing the simulator published.

Tests compare what the pipeline decoded against this file exactly, so it is
written from the very records that were encoded, only after their message was
handed to the sink (a run cut short by ``max_messages`` lists only what went
out). ``jsonable`` is the one canonical JSON form of record values; apply it to
decoded values too before comparing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from typing import IO, Any

from pipeline.codec.records import (
    BrokerResponse,
    ClassIndication,
    CommandComplete,
    Event,
    Heartbeat,
    MethodResponse,
    ObjectSample,
    PackageIndication,
    Record,
    SchemaResponse,
)
from pipeline.codec.types import Am1ObjectId, Am2ObjectId, V2ObjectId


def jsonable(v: Any) -> Any:
    """Canonical JSON form of a QMF value (object ids by their parts, bytes as hex)."""
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    if isinstance(v, Am1ObjectId | Am2ObjectId):
        return {"oid": str(v)}
    if isinstance(v, V2ObjectId):
        return {"oid": v.object_name}
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, bytes | bytearray | memoryview):
        b = bytes(v)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return {"hex": b.hex()}
    if isinstance(v, Mapping):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    return {"repr": repr(v)}


def record_row(rec: Record) -> dict[str, Any]:
    """The manifest fields of one record (kind, opcode, seq and its payload)."""
    row: dict[str, Any] = {
        "kind": rec.kind,
        "dialect": rec.dialect,
        "opcode": rec.opcode,
        "seq": rec.seq,
    }
    if isinstance(rec, ObjectSample):
        row.update(
            agent=rec.agent,
            package=rec.package,
            class_name=rec.class_name,
            schema_hash=rec.schema_hash.hex(),
            update_ns=rec.update_ns,
            create_ns=rec.create_ns,
            delete_ns=rec.delete_ns,
            object_id=jsonable(rec.object_id),
            values=jsonable(rec.values),
        )
    elif isinstance(rec, Event):
        row.update(
            agent=rec.agent,
            package=rec.package,
            class_name=rec.event_name,
            schema_hash=rec.schema_hash.hex(),
            timestamp_ns=rec.timestamp_ns,
            severity=rec.severity,
            values=jsonable(rec.arguments),
        )
    elif isinstance(rec, Heartbeat):
        row.update(agent=rec.agent, timestamp_ns=rec.timestamp_ns)
    elif isinstance(rec, SchemaResponse | ClassIndication):
        row.update(
            package=rec.package, class_name=rec.class_name, schema_hash=rec.schema_hash.hex()
        )
    elif isinstance(rec, PackageIndication):
        row.update(package=rec.package)
    elif isinstance(rec, BrokerResponse):
        row.update(broker_id=str(rec.broker_id))
    elif isinstance(rec, CommandComplete):
        row.update(code=rec.code, text=jsonable(rec.text))
    elif isinstance(rec, MethodResponse):
        row.update(status=rec.status, text=jsonable(rec.text), values=jsonable(rec.arguments or {}))
    return row


class Manifest:
    """Writes manifest lines to a file (or keeps them in memory when ``path`` is None)."""

    def __init__(self, path: str | None = None, keep: bool | None = None) -> None:
        self.path = path
        self.keep = path is None if keep is None else keep  # big runs: file only
        self.count = 0
        self.rows: list[dict[str, Any]] = []
        self._fh: IO[str] | None = open(path, "w", encoding="utf-8") if path else None

    def write(self, row: dict[str, Any]) -> None:
        self.count += 1
        if self.keep:
            self.rows.append(row)
        if self._fh is not None:
            self._fh.write(json.dumps(row, sort_keys=True) + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_manifest(path: str) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)
