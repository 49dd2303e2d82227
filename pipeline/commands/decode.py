"""``qmf decode``: decode a capture file; print a summary and/or write the records.

    qmf decode --input CAPTURE.jsonl --summary
    qmf decode --input CAPTURE.jsonl --output records.jsonl   (or .parquet)

The summary is one JSON object keyed like ``qpidd-capture-20s.summary.json``
so a decode can be checked against the independent decoder's counts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import IO, Any

from pipeline.codec.capture import CaptureError, read_capture
from pipeline.codec.records import Record, id_columns, jsonable
from pipeline.codec.schema import SchemaRegistry
from pipeline.codec.summary import Summary

# Typed columns of the Parquet output; everything else of a record goes to ``fields_json``.
_INT_COLS = (
    "seq",
    "update_ns",
    "create_ns",
    "delete_ns",
    "timestamp_ns",
    "boot_seq",
    "bank",
    "flags",
    "epoch",
    "broker_bank",
    "agent_bank",
    "object_num",
)
_STR_COLS = (
    "kind",
    "dialect",
    "opcode",
    "agent",
    "package",
    "class_name",
    "agent_name",
    "object_name",
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("decode", help="decode a capture file (JSON lines) of QMF messages")
    p.add_argument("--input", required=True, help="capture file, one JSON object per AMQP message")
    p.add_argument(
        "--summary", action="store_true", help="print decode statistics as one JSON object"
    )
    p.add_argument(
        "--output", help="write decoded records: JSON lines, or Parquet if it ends .parquet"
    )
    p.set_defaults(func=run)


def record_row(message: int, rec: Record) -> dict[str, Any]:
    """One output row: message index, the record's flat fields (JSON-safe)."""
    row = rec.row()
    if "object_id" in row:
        oid = row.pop("object_id")
        if rec.kind == "method_request":
            row["object_id"] = jsonable(oid)
        else:
            row.update(id_columns(oid))
    out: dict[str, Any] = {"message": message}
    out.update({k: jsonable(v) for k, v in row.items()})
    return out


def _decoded(path: str, summary: Summary | None) -> Iterator[tuple[int, Record]]:
    registry = SchemaRegistry()
    for i, msg in enumerate(read_capture(path)):
        result = msg.decode(registry)
        if summary is not None:
            summary.add(msg, result)
        for rec in result.records:
            yield i, rec


def _write_jsonl(f: IO[str], rows: Iterator[tuple[int, Record]]) -> int:
    n = 0
    for i, rec in rows:
        f.write(json.dumps(record_row(i, rec), sort_keys=True) + "\n")
        n += 1
    return n


def _write_parquet(path: str, rows: Iterator[tuple[int, Record]], batch_rows: int = 50_000) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    fields = [pa.field("message", pa.int64())]
    fields += [pa.field(c, pa.string()) for c in _STR_COLS]
    fields += [pa.field(c, pa.uint64() if c == "object_num" else pa.int64()) for c in _INT_COLS]
    fields += [pa.field("schema_hash", pa.string()), pa.field("fields_json", pa.string())]
    schema = pa.schema(fields)
    typed = {"message", "schema_hash", *_STR_COLS, *_INT_COLS}
    n = 0
    with pq.ParquetWriter(path, schema) as writer:
        buf: list[dict[str, Any]] = []
        for i, rec in rows:
            row = record_row(i, rec)
            if "timestamp_ns" not in row and "update_ns" in row:
                row["timestamp_ns"] = row["update_ns"]
            out = {k: row.get(k) for k in typed}
            for c in _INT_COLS:
                v = out[c]
                hi = 1 << (64 if c == "object_num" else 63)
                if not isinstance(v, int) or not (-hi if c != "object_num" else 0) <= v < hi:
                    out[c] = None
            rest = {k: v for k, v in row.items() if k not in typed}
            out["fields_json"] = json.dumps(rest, sort_keys=True)
            buf.append(out)
            n += 1
            if len(buf) >= batch_rows:
                writer.write_table(pa.Table.from_pylist(buf, schema))
                buf = []
        if buf or n == 0:
            writer.write_table(pa.Table.from_pylist(buf, schema))
    return n


def run(args: argparse.Namespace) -> int:
    summary = Summary() if args.summary else None
    try:
        rows = _decoded(args.input, summary)
        if args.output:
            if args.output.endswith(".parquet"):
                n = _write_parquet(args.output, rows)
            else:
                with open(args.output, "w", encoding="utf-8") as f:
                    n = _write_jsonl(f, rows)
            print(f"wrote {n} records to {args.output}", file=sys.stderr)
        else:
            for _ in rows:
                pass
    except (OSError, CaptureError) as exc:
        print(f"qmf decode: {exc}", file=sys.stderr)
        return 2
    if summary is not None:
        print(json.dumps(summary.as_dict(), indent=1, sort_keys=True))
    return 0
