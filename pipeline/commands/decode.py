"""``qmf decode``: decode a capture file; print a summary and/or write the records.

    qmf decode --input CAPTURE.jsonl --summary
    qmf decode --input CAPTURE.jsonl --output records.jsonl   (or .parquet)
    qmf decode --input sim.jsonl --summary --schemas none --check-manifest truth.jsonl

The summary is one JSON object keyed like ``qpidd-capture-20s.summary.json``
so a decode can be checked against the independent decoder's counts; two keys
are ours: ``v1_schema_origin_by_class`` (per class, records decoded with a
schema from the wire or from the seed) and ``schemas`` (the seed used).

Decoding starts from a registry seeded with qpid's management schema XML
(``--schemas xml``, the default), so captures without schema responses (real
qpidd sends them only on request) decode offline; ``--schemas none`` starts
empty, ``--schemas A.xml,B.xml`` seeds from those files. A ``MethodContext``
follows the capture, so v1 method arguments are typed where the object's class
and the request are in the capture.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import IO, Any
from xml.parsers.expat import ExpatError

from pipeline.codec.capture import CaptureError, read_capture
from pipeline.codec.methods import MethodContext
from pipeline.codec.records import Record, id_columns, jsonable
from pipeline.codec.schema import ORIGIN_SEED, SchemaRegistry
from pipeline.codec.seed import SEED_XML, seeded_registry
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
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output file (without it one is refused)",
    )
    p.add_argument(
        "--schemas",
        default=SEED_XML,
        metavar="xml|none|FILE[,FILE]",
        help="seed the schema registry: qpid's management XML (default), nothing, or XML files",
    )
    p.add_argument(
        "--check-manifest",
        metavar="FILE",
        help="compare the decoded records with a `qmf sim` manifest (result in the summary)",
    )
    p.set_defaults(func=run)


def record_row(message: int, rec: Record) -> dict[str, Any]:
    """One output row: message index, the record's flat fields (JSON-safe)."""
    row = rec.row()
    if "object_id" in row:
        oid = row.pop("object_id")
        if rec.kind in ("method_request", "method_response"):
            row["object_id"] = jsonable(oid)
        else:
            row.update(id_columns(oid))
    out: dict[str, Any] = {"message": message}
    out.update({k: jsonable(v) for k, v in row.items()})
    return out


def _decoded(
    path: str, summary: Summary | None, registry: SchemaRegistry
) -> Iterator[tuple[int, Record]]:
    methods = MethodContext()
    for i, msg in enumerate(read_capture(path)):
        result = msg.decode(registry, methods)
        if summary is not None:
            summary.add(msg, result)
        for rec in result.records:
            yield i, rec


class ManifestCheck:
    """Decoded records against a ``qmf sim`` manifest, in order (streamed, any size).

    The manifest's record lines (``source`` publish or reply) must equal the
    decoded records one for one, compared through ``pipeline.sim.manifest.record_row``.
    """

    def __init__(self, path: str) -> None:
        from pipeline.sim.manifest import read_manifest

        self._rows = (r for r in read_manifest(path) if r.get("source") in ("publish", "reply"))
        self.decoded = 0
        self.manifest = 0
        self.mismatches = 0
        self.first_mismatch: dict[str, Any] | None = None

    def add(self, message: int, rec: Record) -> None:
        from pipeline.sim.manifest import record_row

        self.decoded += 1
        row = next(self._rows, None)
        got = record_row(rec)
        if row is not None:
            self.manifest += 1
        if row is None or got != {k: row.get(k) for k in got}:
            self.mismatches += 1
            if self.first_mismatch is None:
                self.first_mismatch = {"message": message, "decoded": got, "manifest": row}

    def result(self) -> dict[str, Any]:
        self.manifest += sum(1 for _ in self._rows)
        return {
            "decoded_records": self.decoded,
            "manifest_records": self.manifest,
            "mismatches": self.mismatches,
            "equal": self.mismatches == 0 and self.decoded == self.manifest,
            "first_mismatch": self.first_mismatch,
        }


def _checked(
    rows: Iterator[tuple[int, Record]], check: ManifestCheck | None
) -> Iterator[tuple[int, Record]]:
    for i, rec in rows:
        if check is not None:
            check.add(i, rec)
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


def _schemas_info(spec: str, registry: SchemaRegistry) -> dict[str, Any]:
    """What the registry was seeded with and what the wire added or changed."""
    origins = [registry.origin(s.key) for s in registry]
    return {
        "seed": spec,
        "seeded_classes_used_as_is": sum(1 for o in origins if o == ORIGIN_SEED),
        "classes_from_wire": sum(1 for o in origins if o != ORIGIN_SEED),
        "wire_differs_from_seed": sorted(str(k) for k in registry.differs_from_seed),
    }


def run(args: argparse.Namespace) -> int:
    from pipeline.outputs import refusal

    refused = refusal(args.output, "--overwrite", args.overwrite, "replace it")
    if refused:
        print(f"qmf decode: {refused}", file=sys.stderr)
        return 2
    summary = Summary() if args.summary else None
    try:
        registry = seeded_registry(args.schemas)
    except (OSError, ValueError, ExpatError) as exc:
        print(f"qmf decode: --schemas {args.schemas}: {exc}", file=sys.stderr)
        return 2
    check = None
    try:
        if args.check_manifest:
            check = ManifestCheck(args.check_manifest)
        rows = _checked(_decoded(args.input, summary, registry), check)
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
    out: dict[str, Any] = summary.as_dict() if summary is not None else {}
    if summary is not None:
        out["schemas"] = _schemas_info(args.schemas, registry)
    if check is not None:
        out["manifest_check"] = check.result()
    if out:
        print(json.dumps(out, indent=1, sort_keys=True))
    if check is not None and not out["manifest_check"]["equal"]:
        return 1
    return 0
