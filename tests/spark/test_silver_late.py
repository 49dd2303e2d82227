"""Late and changing schemas: content before its schema is parked, then decoded; versions side by side.

A class the XML seed does not know (``org.test:widget``) is encoded with the
codec; bronze batches are written one by one and the silver job runs in
batch mode once per bronze batch, as the stream would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import pipeline.silver as silver_mod
import pipeline.silver.writer as silver_writer
from pipeline.codec.capture import CapturedMessage
from pipeline.codec.records import Am2ObjectId, Heartbeat, ObjectSample
from pipeline.codec.schema import ClassSchema, Element, SchemaKey, SchemaRegistry
from pipeline.codec.v1 import encode_records, schema_response_for
from pipeline.lake import delta
from pipeline.silver import (
    SilverBatchWriter,
    SilverSettings,
    bronze_rows,
    run_silver_batch,
    write_bronze,
)
from pipeline.silver.transforms import wide_view
from receivers.schema_wants import SchemaWants

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

PKG = "org.test"
V1 = ClassSchema(
    key=SchemaKey(PKG, "widget", b"\x01" * 16),
    properties=(Element("name", 6, access=1, index=True), Element("size", 3, access=3)),
    statistics=(Element("count", 4), Element("temp", 13)),
)
V2 = ClassSchema(
    key=SchemaKey(PKG, "widget", b"\x02" * 16),
    properties=V1.properties,
    statistics=(*V1.statistics, Element("errors", 3)),
)
T0 = 1_795_338_000_000_000_000  # ns


def rec(schema: ClassSchema, op: str, i: int) -> ObjectSample:
    values: dict[str, Any] = {}
    if op in "cg":
        values |= {"name": f"w{i}", "size": 10 * i}
    if op in "ig":
        values |= {"count": 100 + i, "temp": i + 0.5}
        if schema is V2:
            values["errors"] = i
    return ObjectSample(
        dialect="AM2", opcode=op, seq=i, package=PKG, class_name="widget",
        schema_hash=schema.key.hash, update_ns=T0 + i * 1000, create_ns=T0, delete_ns=0,
        object_id=Am2ObjectId(0, 1, 1, 0, i), values=values, agent="1.0",
    )  # fmt: skip


def msg(body: bytes) -> CapturedMessage:
    return CapturedMessage(
        body=body, routing_key="console.obj.1.0.org.test.widget", received_at="2026-11-22T09:00:00Z"
    )


def content(schema: ClassSchema, *recs: tuple[str, int]) -> CapturedMessage:
    return msg(encode_records([rec(schema, op, i) for op, i in recs], SchemaRegistry([schema])))


def announce(schema: ClassSchema) -> CapturedMessage:
    return msg(encode_records([schema_response_for(schema, "AM2")], SchemaRegistry()))


def heartbeat() -> CapturedMessage:
    return msg(encode_records([Heartbeat(dialect="AM2", opcode="h", timestamp_ns=T0)], None))


class Run:
    """Bronze batches appended one at a time, each decoded as the same-numbered silver batch."""

    def __init__(self, spark: SparkSession, tmp: Any, **kw: Any) -> None:
        self.spark = spark
        self.s = SilverSettings(bronze=str(tmp / "bronze"), root=str(tmp / "silver"), **kw)
        self.offset = 0
        self.writer = SilverBatchWriter(self.s, app_id="test-silver")

    def batch(self, k: int, msgs: Sequence[CapturedMessage]) -> silver_mod.BatchReport:
        write_bronze(self.s.bronze, [bronze_rows(msgs, first_offset=self.offset, batch_id=k)])
        self.offset += len(msgs)
        return self.decode(k)

    def decode(self, k: int) -> silver_mod.BatchReport:
        return run_silver_batch(self.spark, self.s, k, batch_ids=(k, k), writer=self.writer)

    def table(self, name: str) -> pa.Table:
        return delta.read_arrow(self.s.path(name))

    def wide(self, schema: ClassSchema) -> list[dict[str, Any]]:
        reg = self.table("schema_registry")
        (row,) = [r for r in reg.to_pylist() if r["schema_hash"] == schema.key.hash]
        samples = delta.read_table(self.spark, self.s.path("object_samples"))
        cols = ["offset", "record_index", "opcode", "index_key", "name", "size", "count", "temp"]
        cols += ["errors"] if schema is V2 else []
        df = wide_view(samples, row).select(*cols).orderBy("offset", "record_index")
        return [r.asDict() for r in df.collect()]


def test_content_before_its_schema_is_parked_then_decoded(spark: SparkSession, tmp_path: Any) -> None:
    run = Run(spark, tmp_path, parked_max_age_s=0.0)
    # Batch 0: widget content, no schema anywhere yet -> parked whole; the heartbeat decodes.
    r0 = run.batch(0, [content(V1, ("c", 1), ("i", 1)), heartbeat(), content(V1, ("i", 2))])
    assert r0.rows == {"heartbeats": 1, "parked": 2}  # an AM2 heartbeat names no agent
    assert r0.stale_parked == 2  # older than parked_max_age_s=0: reported
    parked = run.table("parked").sort_by("offset")
    assert parked.column("offset").to_pylist() == [0, 2]
    assert set(parked.column("missing").to_pylist()) == {f"{PKG}:widget({'01' * 16})"}
    assert run.table("object_samples").num_rows == 0

    # Batch 1: content before its schema *in the same batch*, then the schema:
    # everything decodes, including the two messages parked by batch 0.
    r1 = run.batch(1, [content(V1, ("g", 3)), announce(V1)])
    assert r1.new_schemas == 1 and r1.resolved == 2 and r1.stale_parked == 0
    assert "parked" not in r1.rows
    assert run.table("parked_resolved").sort_by("offset").to_pylist() == [
        {"partition": "p0", "offset": 0, "batch_id": 1, "parked_batch": 0},
        {"partition": "p0", "offset": 2, "batch_id": 1, "parked_batch": 0},
    ]
    assert run.wide(V1) == [
        {"offset": 0, "record_index": 0, "opcode": "c", "index_key": '["w1"]', "name": "w1",
         "size": 10, "count": None, "temp": None},
        {"offset": 0, "record_index": 1, "opcode": "i", "index_key": None, "name": None,
         "size": None, "count": 101, "temp": 1.5},
        {"offset": 2, "record_index": 0, "opcode": "i", "index_key": None, "name": None,
         "size": None, "count": 102, "temp": 2.5},
        {"offset": 3, "record_index": 0, "opcode": "g", "index_key": '["w3"]', "name": "w3",
         "size": 30, "count": 103, "temp": 3.5},
    ]  # fmt: skip
    samples = run.table("object_samples")
    assert sorted(zip(samples.column("offset").to_pylist(), samples.column("batch_id").to_pylist(), strict=True)) == [
        (0, 1), (0, 1), (2, 1), (3, 1)]  # fmt: skip
    reg = run.table("schema_registry").to_pylist()
    (w,) = [r for r in reg if r["package"] == PKG]
    assert (w["origin"], w["first_app"], w["first_batch"], w["source_agent"]) == (
        "wire", "test-silver", 1, None)  # fmt: skip
    # Unknown package: statistic kinds are the documented default (gauge for numbers).
    assert [(e["name"], e["statistic_kind"], e["slot_kind"], e["slot"]) for e in w["statistics"]] == [
        ("count", "gauge", "ints", 1), ("temp", "gauge", "floats", 0)]  # fmt: skip

    # Batch 2: nothing pending any more; replaying batch 1 writes nothing.
    r2 = run.batch(2, [heartbeat()])
    assert r2.resolved == 0 and r2.stale_parked == 0
    n = {name: run.table(name).num_rows for name in ("object_samples", "parked_resolved", "heartbeats")}
    assert run.decode(1).committed == []
    assert {name: run.table(name).num_rows for name in n} == n


def test_parked_schemas_are_listed_for_the_console_until_decoded(
    spark: SparkSession, tmp_path: Any
) -> None:
    """The job triggers the receiver's console: what parked messages wait for is listed
    in ``schema_wants`` (receivers.schema_wants), and withdrawn once decoded."""
    wants = SchemaWants(tmp_path / "wants")
    run = Run(spark, tmp_path, schema_wants=str(wants.folder))
    run.batch(0, [content(V1, ("i", 1)), heartbeat()])
    assert wants.pending() == [V1.key]
    run.batch(1, [content(V2, ("i", 2))])  # another version, also unknown: both wanted
    assert sorted(wants.pending(), key=lambda k: k.hash) == [V1.key, V2.key]
    run.batch(2, [announce(V1)])  # V1's parked message decodes: its want is withdrawn
    assert wants.pending() == [V2.key]
    run.batch(3, [announce(V2)])
    assert wants.pending() == []
    assert run.table("object_samples").num_rows == 2


def test_crash_before_the_resolved_marks_replays_without_duplicates(
    spark: SparkSession, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run(spark, tmp_path)
    run.batch(0, [content(V1, ("i", 1))])
    # Batch 1's first attempt dies after the samples but before parked_resolved.
    monkeypatch.setattr(silver_writer, "WRITE_ORDER", ("object_samples",))
    first = run.batch(1, [announce(V1)])
    assert first.committed == ["object_samples", "schema_registry"]
    assert run.table("parked_resolved").num_rows == 0
    monkeypatch.undo()
    # The restart replays batch 1 with a fresh writer (state from the tables only).
    run.writer = SilverBatchWriter(run.s, app_id="test-silver")
    again = run.decode(1)
    assert again.committed == ["agents", "parked_resolved"]  # what the crash left undone
    assert run.table("object_samples").num_rows == 1
    assert run.table("parked_resolved").column("offset").to_pylist() == [0]
    assert run.decode(2).resolved == 0


def test_schema_change_mid_run_keeps_both_versions(spark: SparkSession, tmp_path: Any) -> None:
    run = Run(spark, tmp_path)
    run.batch(0, [announce(V1), content(V1, ("g", 1))])
    # The agent restarts with a new class version (new hash) mid-run.
    run.batch(1, [announce(V2), content(V2, ("g", 2)), content(V1, ("i", 1))])
    reg = [r for r in run.table("schema_registry").to_pylist() if r["package"] == PKG]
    assert sorted((r["schema_hash"], r["first_batch"], len(r["statistics"])) for r in reg) == [
        (V1.key.hash, 0, 2), (V2.key.hash, 1, 3)]  # fmt: skip
    assert run.wide(V1) == [
        {"offset": 1, "record_index": 0, "opcode": "g", "index_key": '["w1"]', "name": "w1",
         "size": 10, "count": 101, "temp": 1.5},
        {"offset": 4, "record_index": 0, "opcode": "i", "index_key": None, "name": None,
         "size": None, "count": 101, "temp": 1.5},
    ]  # fmt: skip
    assert run.wide(V2) == [
        {"offset": 3, "record_index": 0, "opcode": "g", "index_key": '["w2"]', "name": "w2",
         "size": 20, "count": 102, "temp": 2.5, "errors": 2},
    ]  # fmt: skip
    assert run.table("parked").num_rows == 0
